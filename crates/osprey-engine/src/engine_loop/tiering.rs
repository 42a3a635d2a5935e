//! The engine loop's side of the KV tiers ([`crate::tiers`]): evicted blocks go down, and a new
//! request whose prefix is below the hot pool waits, parked, while its blocks come up. So does
//! a preempted sequence: its full blocks stayed cached when it gave them up, and those evicted
//! since come back from the tiers instead of being recomputed (swap rather than recompute).
//!
//! Order matters around the pool: a block evicted by an allocation still holds its old
//! contents until the next forward pass (or a fetched block) writes there, so every allocation
//! is followed by [`Tiering::demote`] before anything is written.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use osprey_core::metrics as names;
use osprey_models::{BLOCK_SIZE, KvCache};

use crate::kv::{BlockHash, KvCacheManager, chain_from};
use crate::sequence::Sequence;
use crate::tiers::{FetchedBlock, KvTiers};

/// Hashes of a prompt's full blocks with their tokens, in chain order.
type Chain = Vec<(BlockHash, [u32; BLOCK_SIZE])>;

/// The tiers' handle and the sequences waiting on them.
pub struct Tiering {
    tiers: KvTiers,
    /// Sequences whose prefix blocks are being fetched, by ticket.
    parked: HashMap<u64, Sequence>,
    /// Sequences whose blocks have come up, waiting for room in the pool, in arrival order.
    fetched: VecDeque<(Sequence, Vec<FetchedBlock>)>,
    /// Blocks brought back into the pool so far, per tier (warm, cold, shared).
    pub promoted: [u64; 3],
}

impl Tiering {
    pub fn new(tiers: KvTiers) -> Self {
        Self {
            tiers,
            parked: HashMap::new(),
            fetched: VecDeque::new(),
            promoted: [0; 3],
        }
    }

    /// Whether sequences wait on fetches or for room.
    pub fn waiting(&self) -> bool {
        self.num_parked() > 0
    }

    /// Sequences parked here.
    pub fn num_parked(&self) -> usize {
        self.parked.len() + self.fetched.len()
    }

    /// Parks `seq` if part of its tokens' prefix is missing from the pool, asking the tiers
    /// for it; otherwise gives it back to be scheduled at once.
    pub fn park(&mut self, seq: Sequence, kv: &KvCacheManager) -> Option<Sequence> {
        if !seq.prefix_cacheable {
            return Some(seq);
        }
        let chain: Chain = chain_from(seq.block_table.root(), &seq.tokens)
            .into_iter()
            .zip(seq.tokens.chunks_exact(BLOCK_SIZE))
            .map(|(h, t)| (h, t.try_into().expect("a full block")))
            .collect();
        let hot = kv.cached_prefix_len(&chain);
        if hot == chain.len() {
            return Some(seq);
        }
        let ticket = self.tiers.fetch(chain[hot..].to_vec());
        let mut seq = seq;
        seq.preempted = false;
        self.parked.insert(ticket, seq);
        None
    }

    /// Sends the blocks the pool evicted since the last call down the tiers (reading their
    /// contents, which are still in place).
    pub fn demote(&self, manager: &mut KvCacheManager, kv: &KvCache) {
        let evicted = manager.take_evicted();
        if evicted.is_empty() {
            return;
        }
        metrics::counter!(names::KV_TIER_DEMOTED).increment(evicted.len() as u64);
        for e in evicted {
            let mut data = Vec::with_capacity(kv.block_len());
            kv.read_block(e.block, &mut data);
            self.tiers.store(e.hash, e.tokens, data, e.heat);
        }
    }

    /// Puts the blocks of finished fetches into the pool's prefix cache and returns their
    /// sequences, ready to be scheduled (at the front of their queue: their blocks are in the
    /// pool now, and would be the next evicted if others went first).
    ///
    /// A fetch's blocks go in only when the pool has that many free blocks: adopting more than
    /// there is room for would evict the first ones taken in for the last. Until then its
    /// sequence waits here, first come first served; with nothing running (so nothing will be
    /// freed) it takes what fits. Waits up to `wait` for a fetch when none is done.
    pub fn collect(
        &mut self,
        manager: &mut KvCacheManager,
        kv: &mut KvCache,
        wait: Duration,
        idle: bool,
    ) -> Vec<Sequence> {
        for fetched in self.tiers.poll(wait) {
            if let Some(seq) = self.parked.remove(&fetched.ticket) {
                self.fetched.push_back((seq, fetched.blocks));
            }
        }
        let mut ready = Vec::new();
        while let Some((seq, blocks)) = self.fetched.front() {
            if seq.is_cancelled() {
                self.fetched.pop_front();
                continue;
            }
            // One block spare for the sequence's first new token.
            let room = manager.num_free_blocks().saturating_sub(1);
            if room < blocks.len() && !idle {
                break;
            }
            let (seq, blocks) = self.fetched.pop_front().expect("a front");
            for block in blocks.into_iter().take(room) {
                let Some(b) = manager.adopt(block.hash, &block.tokens) else {
                    continue;
                };
                self.demote(manager, kv);
                kv.write_block(b, &block.data);
                metrics::counter!(names::KV_TIER_PROMOTED, "tier" => block.tier.as_str())
                    .increment(1);
                self.promoted[block.tier as usize] += 1;
            }
            ready.push(seq);
        }
        ready
    }
}
