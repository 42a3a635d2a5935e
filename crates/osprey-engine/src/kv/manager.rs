//! The scheduler's view of KV memory: one pool of pages shared by every KV group, the prefix
//! cache over them, and what the sequences' block tables ([`super::BlockTable`]) draw on.

use std::cell::RefCell;
use std::rc::Rc;

use osprey_models::{BLOCK_SIZE, NO_BLOCK};

use super::block_allocator::BlockAllocator;
pub use super::block_table::BlockTable;
use super::prefix_cache::{BlockHash, PrefixCache, group_key};
#[cfg(test)]
use super::prefix_cache::{prefix_hashes, root_hash};

/// Counters of the KV cache, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvCacheCounters {
    /// Prompt tokens looked up in the prefix cache.
    pub queried_tokens: u64,
    /// Of those, tokens found cached.
    pub hit_tokens: u64,
    /// Cached blocks reused for other content.
    pub evicted_blocks: u64,
}

/// Owns the block pool and the prefix cache. Shared (on the engine thread) by the scheduler and
/// every [`BlockTable`].
#[derive(Debug)]
pub struct KvCacheManager {
    pub(super) allocator: BlockAllocator,
    pub(super) cache: PrefixCache,
    pub(super) prefix_caching: bool,
    /// Per KV group, the positions its layers see (`None`: all), as `osprey_models::KvLayout`.
    windows: Vec<Option<usize>>,
    pub(super) counters: KvCacheCounters,
    /// Changes to the prefix cache since they were last taken.
    pub(super) changes: KvChanges,
    /// Per block, the attention its content has drawn: a decaying sum of sampled attention
    /// mass (0 for a block holding nothing worth keeping).
    heat: Vec<f32>,
    /// Whether evicted cached blocks are kept for lower tiers ([`Self::take_evicted`]).
    tiering: bool,
    /// Cached blocks evicted since last taken, whose contents are still in the pool.
    evicted: Vec<EvictedBlock>,
}

/// A cached page reused for other content: what lower tiers need to keep it. Its contents
/// stay in the pool until the next forward pass writes there.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictedBlock {
    /// The page it occupied.
    pub block: u32,
    /// Its key: the chained hash of its tokens, made distinct per KV group ([`group_key`]).
    pub hash: BlockHash,
    /// Its tokens.
    pub tokens: [u32; BLOCK_SIZE],
    /// The attention it had drawn.
    pub heat: f32,
}

/// How many blocks at the front of the free queue eviction weighs by heat: the coldest of them
/// is reused first, so the order is least recently freed, adjusted by attention.
const EVICTION_WINDOW: usize = 8;

/// Blocks that entered and left the prefix cache (the first KV group's): what a router needs
/// to know which prompts a worker holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KvChanges {
    /// Hashes of blocks newly cached.
    pub stored: Vec<BlockHash>,
    /// Hashes of cached blocks reused for other content.
    pub evicted: Vec<BlockHash>,
}

impl KvChanges {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.stored.is_empty() && self.evicted.is_empty()
    }
}

/// A shared handle to the manager.
pub type SharedKvCacheManager = Rc<RefCell<KvCacheManager>>;

impl KvCacheManager {
    /// A manager over `blocks` blocks of one full-attention group; `prefix_caching` enables
    /// reuse across requests.
    pub fn new(blocks: usize, prefix_caching: bool) -> SharedKvCacheManager {
        Self::grouped(blocks, prefix_caching, vec![None])
    }

    /// A manager over `blocks` pages shared by KV groups with these windows (see
    /// `osprey_models::KvLayout::windows`).
    pub fn grouped(
        blocks: usize,
        prefix_caching: bool,
        windows: Vec<Option<usize>>,
    ) -> SharedKvCacheManager {
        assert!(!windows.is_empty(), "at least one KV group");
        Rc::new(RefCell::new(Self {
            allocator: BlockAllocator::new(blocks),
            cache: PrefixCache::default(),
            prefix_caching,
            windows,
            counters: KvCacheCounters::default(),
            changes: KvChanges::default(),
            heat: vec![0.0; blocks],
            tiering: false,
            evicted: Vec::new(),
        }))
    }

    /// Per KV group, the positions its layers see (`None`: all).
    pub fn windows(&self) -> &[Option<usize>] {
        &self.windows
    }

    /// Blocks not held by any sequence.
    pub fn num_free_blocks(&self) -> usize {
        self.allocator.num_free()
    }

    /// All blocks.
    pub fn num_total_blocks(&self) -> usize {
        self.allocator.num_total()
    }

    /// Blocks holding a cached prefix (held or free).
    pub fn num_cached_blocks(&self) -> usize {
        self.cache.len()
    }

    /// Counters so far.
    pub fn counters(&self) -> KvCacheCounters {
        self.counters
    }

    /// Takes the prefix-cache changes since the last call.
    pub fn take_changes(&mut self) -> KvChanges {
        std::mem::take(&mut self.changes)
    }

    /// The allocator, for invariant checks.
    pub fn allocator(&self) -> &BlockAllocator {
        &self.allocator
    }

    /// The prefix cache, for invariant checks.
    pub fn prefix_cache(&self) -> &PrefixCache {
        &self.cache
    }

    /// Keeps evicted cached blocks for lower tiers from now on ([`Self::take_evicted`]).
    pub fn set_tiering(&mut self, on: bool) {
        self.tiering = on;
    }

    /// The cached blocks evicted since the last call: their contents must be read out of the
    /// pool before the next forward pass overwrites them.
    pub fn take_evicted(&mut self) -> Vec<EvictedBlock> {
        std::mem::take(&mut self.evicted)
    }

    /// The page of group `group` caching the block hashed `hash` with `tokens`.
    pub fn lookup(&self, group: usize, hash: BlockHash, tokens: &[u32]) -> Option<u32> {
        self.cache.get(group_key(hash, group), tokens)
    }

    /// The longest prefix, in blocks, of a chain of `n` blocks that every KV group can serve,
    /// where `has(group, i)` says whether group `group` has block `i`: a full group needs every
    /// block before the hit, a windowed group only those the first position after it sees.
    pub fn hit_len(&self, n: usize, has: impl Fn(usize, usize) -> bool) -> usize {
        let full = || (0..self.windows.len()).filter(|&g| self.windows[g].is_none());
        let mut hit = (0..n).take_while(|&i| full().all(|g| has(g, i))).count();
        // Lowering the hit for one windowed group moves the others' windows: until none moves.
        loop {
            let before = hit;
            for (g, w) in self.windows.iter().enumerate() {
                let Some(w) = *w else { continue };
                if let Some(miss) = (first_seen_block(hit * BLOCK_SIZE, w)..hit)
                    .rev()
                    .find(|&i| !has(g, i))
                {
                    // Every hit past the miss sees it.
                    hit = miss;
                }
            }
            if hit == before {
                return hit;
            }
        }
    }

    /// How many leading blocks of `chain` (hashes with their tokens) a request can take from
    /// the pool: every group's part of them is cached.
    pub fn cached_prefix_len(&self, chain: &[(BlockHash, [u32; BLOCK_SIZE])]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        self.hit_len(chain.len(), |g, i| {
            self.lookup(g, chain[i].0, &chain[i].1).is_some()
        })
    }

    /// The pages (group, block hash, tokens) a request for all of `chain` needs and the pool
    /// lacks, block by block: what to ask lower tiers for.
    pub fn missing(
        &self,
        chain: &[(BlockHash, [u32; BLOCK_SIZE])],
    ) -> Vec<(usize, BlockHash, [u32; BLOCK_SIZE])> {
        let n = chain.len();
        let mut out = Vec::new();
        for (i, (hash, tokens)) in chain.iter().enumerate() {
            for (g, w) in self.windows.iter().enumerate() {
                let needed = w.is_none_or(|w| i >= first_seen_block(n * BLOCK_SIZE, w));
                if needed && self.lookup(g, *hash, tokens).is_none() {
                    out.push((g, *hash, *tokens));
                }
            }
        }
        out
    }

    /// Moves the free pages caching blocks of `chain` to the back of the eviction queue,
    /// without holding them: the last of the pool to be evicted, a chain's first blocks last of
    /// all (as when a sequence releases its blocks).
    pub fn touch(&mut self, chain: &[(BlockHash, [u32; BLOCK_SIZE])]) {
        for g in 0..self.windows.len() {
            let cached: Vec<u32> = (chain.iter())
                .filter_map(|(hash, tokens)| self.lookup(g, *hash, tokens))
                .collect();
            for &block in cached.iter().rev() {
                if self.allocator.ref_count(block) == 0 {
                    self.allocator.acquire(block);
                    self.allocator.release(block, true);
                }
            }
        }
    }

    /// Takes in a page brought up from a lower tier: a free page now caches group `group`'s
    /// part of the block hashed `hash` (`tokens`), evicted last among the free. Returns the
    /// page to write its contents into, or `None` if it is cached already, caching is off or
    /// no page is free.
    pub fn adopt(
        &mut self,
        group: usize,
        hash: BlockHash,
        tokens: &[u32; BLOCK_SIZE],
    ) -> Option<u32> {
        if !self.prefix_caching || self.lookup(group, hash, tokens).is_some() {
            return None;
        }
        let block = self.allocate(1)?[0];
        self.cache_block(group, hash, block, tokens);
        self.allocator.release(block, true);
        Some(block)
    }

    /// Registers page `block` as group `group`'s part of the block hashed `hash`. Returns
    /// `false`, changing nothing, if another page holds it already.
    pub(super) fn cache_block(
        &mut self,
        group: usize,
        hash: BlockHash,
        block: u32,
        tokens: &[u32],
    ) -> bool {
        let stored = self.cache.insert(hash, group, block, tokens);
        if stored && group == 0 {
            self.changes.stored.push(hash);
        }
        stored
    }

    /// Adds a sample of attention mass to `blocks` (`mass[i]` on `blocks[i]`; entries a
    /// windowed group gave back are skipped).
    pub fn record_heat(&mut self, blocks: &[u32], mass: &[f32]) {
        for (&b, &m) in blocks.iter().zip(mass) {
            if b == NO_BLOCK {
                continue;
            }
            let h = &mut self.heat[b as usize];
            *h = h.mul_add(0.5, m);
        }
    }

    /// The attention block `block`'s content has drawn (see [`Self::record_heat`]).
    pub fn block_heat(&self, block: u32) -> f32 {
        self.heat[block as usize]
    }

    /// `n` fresh blocks, all or none, evicting the least recently freed cached prefixes, the
    /// coldest first among the next few.
    pub(super) fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
        if self.allocator.num_free() < n {
            return None;
        }
        let blocks: Vec<u32> = (0..n)
            .map(|_| {
                let b = (self.allocator.free_front(EVICTION_WINDOW))
                    .min_by(|a, b| self.heat[*a as usize].total_cmp(&self.heat[*b as usize]))
                    .expect("counted");
                self.allocator.acquire(b);
                let heat = std::mem::take(&mut self.heat[b as usize]);
                if let Some((hash, group, tokens)) = self.cache.remove_block(b) {
                    self.counters.evicted_blocks += 1;
                    if group == 0 {
                        self.changes.evicted.push(hash);
                    }
                    if self.tiering {
                        let (block, hash, tokens) = (b, hash, tokens);
                        self.evicted.push(EvictedBlock {
                            block,
                            hash,
                            tokens,
                            heat,
                        });
                    }
                }
                b
            })
            .collect();
        Some(blocks)
    }

    /// Drops a reference to each of `blocks` (skipping entries given back already).
    pub(super) fn release(&mut self, blocks: &[u32]) {
        // In reverse, so a sequence's first blocks end up freed last (evicted last).
        for &b in blocks.iter().rev().filter(|&&b| b != NO_BLOCK) {
            let cached = self.cache.contains_block(b);
            if !cached {
                self.heat[b as usize] = 0.0;
            }
            self.allocator.release(b, cached);
        }
    }
}

/// The first block position `pos` sees through a window of `w` positions.
pub(super) fn first_seen_block(pos: usize, w: usize) -> usize {
    (pos + 1).saturating_sub(w) / BLOCK_SIZE
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: usize, seed: u32) -> Vec<u32> {
        (0..n as u32).map(|i| i * 31 + seed).collect()
    }

    #[test]
    fn a_shared_prefix_is_reused_and_survives_its_first_owner() {
        let m = KvCacheManager::new(16, true);
        let prompt = tokens(40, 1); // 2 full blocks + 8
        let mut a = BlockTable::new(m.clone(), "");
        assert_eq!(a.match_prefix(&prompt), 0);
        assert!(a.reserve(41));
        a.commit(&prompt, 40);
        let a_blocks = a.tables()[0].clone();
        drop(a);
        assert_eq!(m.borrow().num_free_blocks(), 16);
        assert_eq!(m.borrow().num_cached_blocks(), 2);

        let mut b = BlockTable::new(m.clone(), "");
        let mut other = prompt.clone();
        other.extend(tokens(10, 9));
        assert_eq!(b.match_prefix(&other), 32);
        assert_eq!(&b.tables()[0][..2], &a_blocks[..2]);
        let mut c = BlockTable::new(m.clone(), "tenant-2");
        assert_eq!(c.match_prefix(&other), 0, "another salt sees nothing");
        let counters = m.borrow().counters();
        assert_eq!(
            (counters.queried_tokens, counters.hit_tokens),
            (40 + 50 + 50, 32)
        );
    }

    #[test]
    fn a_fully_cached_prompt_still_computes_its_last_block() {
        let m = KvCacheManager::new(8, true);
        let prompt = tokens(32, 3);
        let mut a = BlockTable::new(m.clone(), "");
        assert!(a.reserve(33));
        a.commit(&prompt, 32);
        drop(a);
        let mut b = BlockTable::new(m.clone(), "");
        assert_eq!(b.match_prefix(&prompt), 16);
    }

    #[test]
    fn allocation_evicts_cached_blocks_when_needed() {
        let m = KvCacheManager::new(4, true);
        let prompt = tokens(64, 5);
        let mut a = BlockTable::new(m.clone(), "");
        assert!(a.reserve(64));
        a.commit(&prompt, 64);
        drop(a);
        assert_eq!(m.borrow().num_cached_blocks(), 4);
        let mut b = BlockTable::new(m.clone(), "");
        assert!(b.reserve(48));
        assert_eq!(m.borrow().num_cached_blocks(), 1);
        assert_eq!(m.borrow().counters().evicted_blocks, 3);
        assert!(!b.reserve(80), "only one block left");
    }

    #[test]
    fn changes_name_the_blocks_stored_and_evicted_as_a_router_would_hash_them() {
        let m = KvCacheManager::new(4, true);
        let prompt = tokens(65, 5);
        let hashes = prefix_hashes("t", &prompt);
        assert_eq!(
            hashes.len(),
            4,
            "the blocks a request with this prompt looks up"
        );
        let mut a = BlockTable::new(m.clone(), "t");
        assert!(a.reserve(64));
        a.commit(&prompt, 64);
        drop(a);
        let stored = m.borrow_mut().take_changes();
        assert_eq!(stored.stored, hashes);
        assert!(stored.evicted.is_empty());
        assert!(m.borrow_mut().take_changes().is_empty(), "taken once");
        let mut b = BlockTable::new(m.clone(), "");
        assert!(b.reserve(32));
        let mut evicted = m.borrow_mut().take_changes().evicted;
        evicted.sort_unstable();
        let mut last_two = hashes[2..].to_vec();
        last_two.sort_unstable();
        assert_eq!(
            evicted, last_two,
            "a sequence's last blocks are evicted first"
        );
    }

    #[test]
    fn touched_blocks_are_evicted_last() {
        let m = KvCacheManager::new(4, true);
        let chain = |prompt: &[u32]| -> Vec<(BlockHash, [u32; BLOCK_SIZE])> {
            (crate::kv::chain_from(root_hash(""), prompt).into_iter())
                .zip(prompt.chunks_exact(BLOCK_SIZE))
                .map(|(h, t)| (h, t.try_into().unwrap()))
                .collect()
        };
        // Two full blocks each, and a token more to compute.
        let (old, new) = (tokens(33, 1), tokens(33, 7));
        for prompt in [&old, &new] {
            let mut t = BlockTable::new(m.clone(), "");
            assert!(t.reserve(32));
            t.commit(prompt, 32);
        }
        m.borrow_mut().touch(&chain(&old));
        let mut b = BlockTable::new(m.clone(), "");
        assert!(b.reserve(32));
        assert_eq!(m.borrow().cached_prefix_len(&chain(&old)), 2, "kept");
        assert_eq!(
            m.borrow().cached_prefix_len(&chain(&new)),
            0,
            "evicted instead"
        );
    }

    #[test]
    fn disabled_caching_never_hits() {
        let m = KvCacheManager::new(8, false);
        let prompt = tokens(40, 1);
        let mut a = BlockTable::new(m.clone(), "");
        assert!(a.reserve(40));
        a.commit(&prompt, 40);
        drop(a);
        let mut b = BlockTable::new(m.clone(), "");
        assert_eq!(b.match_prefix(&prompt), 0);
    }

    #[test]
    fn eviction_spares_blocks_that_draw_attention() {
        let m = KvCacheManager::new(4, true);
        let prompt = tokens(64, 5);
        let mut a = BlockTable::new(m.clone(), "");
        assert!(a.reserve(64));
        a.commit(&prompt, 64);
        let blocks = a.tables()[0].clone();
        // Attention went to the last block: without it, that block would go first.
        m.borrow_mut().record_heat(&blocks, &[0.1, 0.0, 0.0, 0.9]);
        drop(a);
        let mut b = BlockTable::new(m.clone(), "");
        assert!(b.reserve(16));
        assert_eq!(
            &b.tables()[0][..],
            &blocks[2..3],
            "the coldest recently freed block is reused"
        );
        assert!(m.borrow().block_heat(blocks[3]) > 0.0);
        assert_eq!(
            m.borrow().block_heat(blocks[2]),
            0.0,
            "reused blocks start cold"
        );
    }
}
