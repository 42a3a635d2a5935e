//! The engine loop's side of the KV tiers ([`crate::tiers`]): evicted blocks go down, and a
//! waiting request whose prefix is partly below the hot pool is parked while its blocks come
//! up, then holds them until it is scheduled; none is scheduled before its prefix has been
//! looked up, so nothing is recomputed that a tier holds. So does a preempted sequence: its
//! full blocks stayed cached when it gave them up, and those evicted since come back from the
//! tiers instead of being recomputed (swap rather than recompute).
//!
//! Order matters around the pool: a block evicted by an allocation still holds its old
//! contents until the next forward pass (or a fetched block) writes there, so every allocation
//! is followed by [`Tiering::demote`] before anything is written.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use osprey_core::metrics as names;
use osprey_models::{BLOCK_SIZE, KvCache};

use crate::kv::{BlockHash, KvCacheManager, SharedKvCacheManager, chain_from, group_key};
use crate::sequence::Sequence;
use crate::tiers::{FetchedBlock, KvTiers};

/// Hashes of a prompt's full blocks with their tokens, in chain order.
type Chain = Vec<(BlockHash, [u32; BLOCK_SIZE])>;

/// A sequence waiting on the tiers for the part of its prefix below the pool.
struct Parked {
    seq: Sequence,
    /// The pages of its prefix that were in the pool when it was parked (by key).
    hot: HashSet<BlockHash>,
    /// The KV group and block hash of each page asked of the tiers, by key.
    asked: HashMap<BlockHash, (usize, BlockHash)>,
    /// Pages brought up once the fetch is done.
    blocks: Vec<FetchedBlock>,
}

/// The tiers' handle and the sequences waiting on them.
pub struct Tiering {
    tiers: KvTiers,
    /// Sequences whose prefix blocks are being fetched, by ticket.
    parked: HashMap<u64, Parked>,
    /// Sequences whose blocks have come up, waiting for room in the pool, in arrival order.
    fetched: VecDeque<Parked>,
    /// Sequences still to be looked up, in arrival order, while a pool's worth of blocks is
    /// in flight already.
    deferred: VecDeque<Sequence>,
    /// Blocks brought back into the pool so far, per tier (warm, cold, shared).
    pub promoted: [u64; 3],
}

impl Tiering {
    pub fn new(tiers: KvTiers) -> Self {
        Self {
            tiers,
            parked: HashMap::new(),
            fetched: VecDeque::new(),
            deferred: VecDeque::new(),
            promoted: [0; 3],
        }
    }

    /// Sequences parked here.
    pub fn num_parked(&self) -> usize {
        self.parked.len() + self.fetched.len() + self.deferred.len()
    }

    /// Blocks asked for or brought up and not yet in the pool.
    fn blocks_in_flight(&self) -> usize {
        let asked: usize = self.parked.values().map(|p| p.asked.len()).sum();
        asked + self.fetched.iter().map(|p| p.blocks.len()).sum::<usize>()
    }

    /// Looks for the prefixes of `seqs` (after those deferred before) below the pool: parks
    /// each sequence whose prefix is partly missing from the pool, asking the tiers for it, and
    /// gives back the others to be scheduled, holding their prefix so that nothing evicts it
    /// while they wait. While a pool's worth of blocks (`pool`) is in flight, the rest wait
    /// their turn here: that bounds the host memory fetched blocks take while they wait for
    /// room, and none is scheduled (and recomputed) before it is looked up.
    pub fn look_below(
        &mut self,
        seqs: Vec<Sequence>,
        manager: &SharedKvCacheManager,
        pool: usize,
    ) -> Vec<Sequence> {
        self.deferred.extend(seqs);
        let mut ready = Vec::new();
        while self.blocks_in_flight() < pool {
            let Some(seq) = self.deferred.pop_front() else {
                break;
            };
            if seq.is_cancelled() {
                continue;
            }
            ready.extend(self.park(seq, manager));
        }
        ready
    }

    /// Parks `seq` if part of its prefix is missing from the pool, or gives it back holding
    /// its prefix.
    fn park(&mut self, mut seq: Sequence, manager: &SharedKvCacheManager) -> Option<Sequence> {
        seq.look_below = false;
        if !seq.prefix_cacheable {
            return Some(seq);
        }
        let chain = chain(&seq);
        let m = manager.borrow();
        if m.cached_prefix_len(&chain) == chain.len() {
            drop(m);
            seq.num_computed = seq.block_table.match_prefix(&seq.tokens);
            return Some(seq);
        }
        let missing = m.missing(&chain);
        let hot = hot_keys(&m, &chain);
        drop(m);
        // What is in the pool is evicted last while the rest comes up.
        manager.borrow_mut().touch(&chain);
        tracing::debug!(
            seq = seq.id,
            hot = hot.len(),
            asked = missing.len(),
            "looking below the pool"
        );
        let wanted = (missing.iter())
            .map(|&(g, hash, tokens)| (group_key(hash, g), tokens))
            .collect();
        let ticket = self.tiers.fetch(wanted);
        let parked = Parked {
            seq,
            hot,
            asked: (missing.iter())
                .map(|&(g, hash, _)| (group_key(hash, g), (g, hash)))
                .collect(),
            blocks: Vec::new(),
        };
        self.parked.insert(ticket, parked);
        None
    }

    /// Sends the blocks the pool evicted since the last call down the tiers (reading their
    /// contents, which are still in place).
    pub fn demote(&self, manager: &mut KvCacheManager, kv: &KvCache) {
        let evicted = manager.take_evicted();
        if evicted.is_empty() {
            return;
        }
        metrics::counter!(names::KV_TIER_DEMOTED, "model" => self.tiers.label().clone())
            .increment(evicted.len() as u64);
        for e in evicted {
            let mut data = Vec::with_capacity(kv.block_len());
            kv.read_block(e.block, &mut data);
            self.tiers.store(e.hash, e.tokens, data, e.heat);
        }
    }

    /// Puts the blocks of finished fetches into the pool's prefix cache and returns their
    /// sequences holding them, ready to go back in line (by arrival).
    ///
    /// A fetch's blocks go in only when the pool has room for them beyond a free block for each
    /// of the `running` sequences' next token (and one more): taking in more than there is room
    /// for would evict the first blocks taken in for the last. Until then its sequence waits
    /// here, first come first served; with nothing running (so nothing will be freed) the first
    /// takes what fits. Waits up to `wait` for a fetch when none is done.
    pub fn collect(
        &mut self,
        manager: &SharedKvCacheManager,
        kv: &mut KvCache,
        wait: Duration,
        running: usize,
    ) -> Vec<Sequence> {
        for fetched in self.tiers.poll(wait) {
            if let Some(mut p) = self.parked.remove(&fetched.ticket) {
                let found = fetched.blocks.len();
                tracing::debug!(
                    seq = p.seq.id,
                    asked = p.asked.len(),
                    found,
                    "fetched from below"
                );
                p.blocks = fetched.blocks;
                self.fetched.push_back(p);
            }
        }
        let idle = running == 0;
        let mut ready = Vec::new();
        while let Some(mut p) = self.fetched.pop_front() {
            if p.seq.is_cancelled() {
                continue;
            }
            // Hold what is still in the pool of its prefix first: taking in the rest must not
            // evict it.
            p.seq.num_computed = p.seq.block_table.match_prefix(&p.seq.tokens);
            let room = manager
                .borrow()
                .num_free_blocks()
                .saturating_sub(running + 1);
            if room < p.blocks.len() && !(idle && ready.is_empty()) {
                p.seq.block_table.release();
                p.seq.num_computed = 0;
                self.fetched.push_front(p);
                break;
            }
            let Parked {
                mut seq,
                hot,
                asked,
                mut blocks,
            } = p;
            blocks.truncate(room);
            let mut m = manager.borrow_mut();
            // Last blocks first: a prefix's first blocks are then the last of it evicted.
            for block in blocks.into_iter().rev() {
                let (group, hash) = asked[&block.hash];
                let Some(b) = m.adopt(group, hash, &block.tokens) else {
                    continue;
                };
                self.demote(&mut m, kv);
                kv.write_block(b, &block.data);
                metrics::counter!(names::KV_TIER_PROMOTED, "model" => self.tiers.label().clone(), "tier" => block.tier.as_str())
                    .increment(1);
                self.promoted[block.tier as usize] += 1;
            }
            // What it would hold had nothing it found in the pool gone down meanwhile.
            let chain = chain(&seq);
            let expected = m.hit_len(chain.len(), |g, i| {
                let (hash, tokens) = &chain[i];
                hot.contains(&group_key(*hash, g)) || m.lookup(g, *hash, tokens).is_some()
            });
            drop(m);
            // The sequence holds all its prefix from now on: until it is scheduled, nothing
            // else (the next fetch, another sequence's growth) can evict it.
            seq.block_table.release();
            seq.num_computed = seq.block_table.match_prefix(&seq.tokens);
            let held = seq.num_computed / BLOCK_SIZE;
            if held < expected {
                // Part of what was in the pool when it was parked has gone down since: look
                // again rather than recompute it.
                tracing::debug!(
                    seq = seq.id,
                    held,
                    expected,
                    "prefix left the pool meanwhile"
                );
                seq.block_table.release();
                seq.num_computed = 0;
                self.deferred.push_front(seq);
                continue;
            }
            ready.push(seq);
        }
        ready
    }
}

/// The hashes of `seq`'s prompt blocks a prefix hit can cover, with their tokens: whole blocks
/// only, and at least one token left to compute (as the prefix cache).
fn chain(seq: &Sequence) -> Chain {
    chain_from(seq.block_table.root(), &seq.tokens)
        .into_iter()
        .zip(seq.tokens.chunks_exact(BLOCK_SIZE))
        .map(|(h, t)| (h, t.try_into().expect("a full block")))
        .collect()
}

/// The keys of every group's pages of `chain` the pool holds.
fn hot_keys(m: &KvCacheManager, chain: &Chain) -> HashSet<BlockHash> {
    let groups = m.windows().len();
    (chain.iter())
        .flat_map(|(hash, tokens)| {
            (0..groups).filter_map(move |g| m.lookup(g, *hash, tokens).map(|_| group_key(*hash, g)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use osprey_core::Priority;
    use osprey_models::{Arch, ModelConfig, RopeConfig, RopeStyle};

    use super::*;
    use crate::tiers::{BlockLayout, TierConfig};

    /// A pool of `blocks` blocks of a one-layer, one-head model, 4 values a position.
    fn pool(blocks: usize) -> (SharedKvCacheManager, KvCache) {
        pool_of_groups(blocks, vec![None])
    }

    /// [`pool`], its pages shared by KV groups with these windows (the pages' layout does not
    /// change what the tiers do).
    fn pool_of_groups(
        blocks: usize,
        windows: Vec<Option<usize>>,
    ) -> (SharedKvCacheManager, KvCache) {
        let config = ModelConfig {
            arch: Arch::Llama,
            name: None,
            n_layers: 1,
            d_model: 4,
            n_heads: 1,
            n_kv_heads: 1,
            head_dim: 4,
            ffn_dim: 1,
            vocab_size: 1,
            context_length: 4096,
            rms_eps: 1e-5,
            rope: RopeConfig {
                base: 10_000.0,
                dims: 4,
                style: RopeStyle::Interleaved,
                linear_factor: 1.0,
                freq_factors: None,
            },
            family: Default::default(),
        };
        let manager = KvCacheManager::grouped(blocks, true, windows);
        manager.borrow_mut().set_tiering(true);
        (manager, KvCache::new(&config, blocks))
    }

    fn tiering(kv: &KvCache) -> Tiering {
        let layout = BlockLayout {
            len: kv.block_len(),
            group: BLOCK_SIZE * 4,
        };
        let config = TierConfig {
            warm_bytes: 1 << 20,
            ..TierConfig::default()
        };
        Tiering::new(KvTiers::start(config, "test", layout, "test".into()).unwrap())
    }

    /// With a windowed KV group, a prefix comes up as every group needs it: the full group's
    /// pages all, the windowed group's only those the first position after it sees.
    #[test]
    fn a_windowed_group_brings_up_only_its_window() {
        let (manager, mut kv) = pool_of_groups(16, vec![None, Some(32)]);
        let mut tiering = tiering(&kv);
        let prompt: Vec<u32> = (0..70).collect();
        let seq = Sequence::for_test(&manager, 1, prompt, Priority::Interactive);
        let chain = chain(&seq);
        for (hash, tokens) in &chain {
            for g in 0..2 {
                let data = vec![g as u16; kv.block_len()];
                tiering.tiers.store(group_key(*hash, g), *tokens, data, 0.0);
            }
        }
        assert!(tiering.look_below(vec![seq], &manager, 16).is_empty());
        let mut ready = Vec::new();
        while ready.is_empty() {
            ready.extend(tiering.collect(&manager, &mut kv, Duration::from_secs(5), 0));
        }
        // 4 blocks of the full group; of the windowed group, blocks 2 and 3 (position 64
        // sees 33 to 64).
        assert_eq!(tiering.promoted[0], 6);
        let seq = &ready[0];
        assert_eq!(seq.num_computed, 64);
        let tables = seq.block_table.tables();
        assert!(tables[0].iter().all(|&b| b != osprey_models::NO_BLOCK));
        assert_eq!(&tables[1][..2], &[osprey_models::NO_BLOCK; 2]);
        let mut data = Vec::new();
        kv.read_block(tables[1][2], &mut data);
        assert_eq!(data[0], 1, "the windowed group's page came up in its place");
    }

    #[test]
    fn fetched_prefixes_enter_the_pool_only_as_far_as_there_is_room_for_all_of_them() {
        // 7 blocks, one sequence running (2 kept spare): room for one 4-block prefix, not two.
        let (manager, mut kv) = pool(7);
        let mut tiering = tiering(&kv);
        let prompt = |user: u32| (0..70).map(|i| 1000 * user + i).collect();
        let a = Sequence::for_test(&manager, 1, prompt(1), Priority::Interactive);
        let b = Sequence::for_test(&manager, 2, prompt(2), Priority::Interactive);
        for (hash, tokens) in chain(&a).into_iter().chain(chain(&b)) {
            let data = vec![tokens[0] as u16; kv.block_len()];
            tiering.tiers.store(hash, tokens, data, 0.0);
        }
        let (chain_a, chain_b) = (chain(&a), chain(&b));
        let none_hot = tiering.look_below(vec![a, b], &manager, 7);
        assert!(none_hot.is_empty(), "both are parked");
        assert_eq!(tiering.parked.len(), 2);

        let mut ready = Vec::new();
        while !tiering.parked.is_empty() {
            ready.extend(tiering.collect(&manager, &mut kv, Duration::from_secs(5), 1));
        }
        let ids: Vec<u64> = ready.iter().map(|s| s.id).collect();
        assert_eq!(ids, [1], "b waits for room");
        assert_eq!(
            manager.borrow().cached_prefix_len(&chain_a),
            4,
            "all of a's prefix is in"
        );
        let a = &ready[0];
        assert_eq!(a.num_computed, 64, "and a holds it");
        let mut data = Vec::new();
        kv.read_block(a.block_table.tables()[0][0], &mut data);
        assert_eq!(data[0], 1000, "the block's contents came up with it");
        let again = tiering.collect(&manager, &mut kv, Duration::ZERO, 1);
        assert!(
            again.is_empty(),
            "b still waits: a's blocks are held, not free"
        );

        // Once a is gone and nothing runs, the next in line takes what fits.
        drop(ready);
        let late = tiering.collect(&manager, &mut kv, Duration::ZERO, 0);
        assert_eq!(late.len(), 1);
        assert_eq!(late[0].num_computed, 64);
        assert_eq!(manager.borrow().cached_prefix_len(&chain_b), 4);

        // A prefix all in the pool is not fetched; its sequence comes back holding it.
        drop(late);
        let c = Sequence::for_test(&manager, 3, prompt(2), Priority::Interactive);
        let hot = tiering.look_below(vec![c], &manager, 7);
        assert_eq!(hot.len(), 1, "nothing to fetch");
        let c = &hot[0];
        assert_eq!(c.num_computed, 64);
        assert!(!c.look_below);
    }
}
