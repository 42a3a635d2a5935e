//! The scheduler's view of KV memory: block tables that reuse cached prefixes, grow on
//! demand and free themselves on drop.

use std::cell::RefCell;
use std::rc::Rc;

use osprey_models::BLOCK_SIZE;

use super::block_allocator::BlockAllocator;
#[cfg(test)]
use super::prefix_cache::prefix_hashes;
use super::prefix_cache::{BlockHash, PrefixCache, block_hash, root_hash};

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
    allocator: BlockAllocator,
    cache: PrefixCache,
    prefix_caching: bool,
    counters: KvCacheCounters,
    /// Changes to the prefix cache since they were last taken.
    changes: KvChanges,
    /// Per block, the attention its content has drawn: a decaying sum of sampled attention
    /// mass (0 for a block holding nothing worth keeping).
    heat: Vec<f32>,
    /// Whether evicted cached blocks are kept for lower tiers ([`Self::take_evicted`]).
    tiering: bool,
    /// Cached blocks evicted since last taken, whose contents are still in the pool.
    evicted: Vec<EvictedBlock>,
}

/// A cached block reused for other content: what lower tiers need to keep it. Its contents
/// stay in the pool until the next forward pass writes there.
#[derive(Clone, Debug, PartialEq)]
pub struct EvictedBlock {
    /// The block it occupied.
    pub block: u32,
    /// Its chained hash.
    pub hash: BlockHash,
    /// Its tokens.
    pub tokens: [u32; BLOCK_SIZE],
    /// The attention it had drawn.
    pub heat: f32,
}

/// How many blocks at the front of the free queue eviction weighs by heat: the coldest of them
/// is reused first, so the order is least recently freed, adjusted by attention.
const EVICTION_WINDOW: usize = 8;

/// Blocks that entered and left the prefix cache: what a router needs to know which prompts a
/// worker holds.
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
    /// A manager over `blocks` blocks; `prefix_caching` enables reuse across requests.
    pub fn new(blocks: usize, prefix_caching: bool) -> SharedKvCacheManager {
        Rc::new(RefCell::new(Self {
            allocator: BlockAllocator::new(blocks),
            cache: PrefixCache::default(),
            prefix_caching,
            counters: KvCacheCounters::default(),
            changes: KvChanges::default(),
            heat: vec![0.0; blocks],
            tiering: false,
            evicted: Vec::new(),
        }))
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

    /// How many leading blocks of `chain` (hashes with their tokens) the pool holds.
    pub fn cached_prefix_len(&self, chain: &[(BlockHash, [u32; BLOCK_SIZE])]) -> usize {
        if !self.prefix_caching {
            return 0;
        }
        (chain.iter())
            .take_while(|(h, t)| self.cache.get(*h, t).is_some())
            .count()
    }

    /// Moves the free blocks among the leading cached blocks of `chain` to the back of the
    /// eviction queue, without holding them: the last of the pool to be evicted, the first
    /// block last of all (as when a sequence releases its blocks).
    pub fn touch(&mut self, chain: &[(BlockHash, [u32; BLOCK_SIZE])]) {
        let cached: Vec<u32> = (chain.iter())
            .map_while(|(hash, tokens)| self.cache.get(*hash, tokens))
            .collect();
        for &block in cached.iter().rev() {
            if self.allocator.ref_count(block) == 0 {
                self.allocator.acquire(block);
                self.allocator.release(block, true);
            }
        }
    }

    /// Takes in a block brought up from a lower tier: a free block now caches `hash`
    /// (`tokens`), evicted last among the free. Returns the block to write its contents into,
    /// or `None` if it is cached already, caching is off or no block is free.
    pub fn adopt(&mut self, hash: BlockHash, tokens: &[u32; BLOCK_SIZE]) -> Option<u32> {
        if !self.prefix_caching || self.cache.get(hash, tokens).is_some() {
            return None;
        }
        let block = self.allocate(1)?[0];
        self.cache.insert(hash, block, tokens);
        self.changes.stored.push(hash);
        self.allocator.release(block, true);
        Some(block)
    }

    /// Adds a sample of attention mass to `blocks` (`mass[i]` on `blocks[i]`).
    pub fn record_heat(&mut self, blocks: &[u32], mass: &[f32]) {
        for (&b, &m) in blocks.iter().zip(mass) {
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
    fn allocate(&mut self, n: usize) -> Option<Vec<u32>> {
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
                if let Some((hash, tokens)) = self.cache.remove_block(b) {
                    self.counters.evicted_blocks += 1;
                    self.changes.evicted.push(hash);
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

    fn release(&mut self, blocks: &[u32]) {
        // In reverse, so a sequence's first blocks end up freed last (evicted last).
        for &b in blocks.iter().rev() {
            let cached = self.cache.contains_block(b);
            if !cached {
                self.heat[b as usize] = 0.0;
            }
            self.allocator.release(b, cached);
        }
    }
}

/// The blocks holding one sequence's KV, in position order, and the hashes of its full blocks.
/// Returns its blocks to the pool when dropped.
pub struct BlockTable {
    blocks: Vec<u32>,
    /// Chained hashes of the leading full blocks whose content is known (`hashes.len() <=
    /// blocks.len()`).
    hashes: Vec<BlockHash>,
    root: BlockHash,
    manager: SharedKvCacheManager,
}

impl BlockTable {
    /// An empty table; `salt` separates this sequence's cache entries from other tenants'.
    pub fn new(manager: SharedKvCacheManager, salt: &str) -> Self {
        Self {
            blocks: Vec::new(),
            hashes: Vec::new(),
            root: root_hash(salt),
            manager,
        }
    }

    /// The hash the table's chain starts from (its salt's).
    pub fn root(&self) -> BlockHash {
        self.root
    }

    /// Block ids, in position order.
    pub fn blocks(&self) -> &[u32] {
        &self.blocks
    }

    /// Takes the longest cached prefix of `tokens` — whole blocks, always leaving at least one
    /// token to compute — into this (empty) table. Returns the number of tokens covered.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> usize {
        assert!(
            self.blocks.is_empty(),
            "prefix matching starts from an empty table"
        );
        let mut m = self.manager.borrow_mut();
        let mut parent = self.root;
        let max_blocks = tokens.len().saturating_sub(1) / BLOCK_SIZE;
        if m.prefix_caching {
            for chunk in tokens.chunks_exact(BLOCK_SIZE).take(max_blocks) {
                let hash = block_hash(parent, chunk);
                let Some(block) = m.cache.get(hash, chunk) else {
                    break;
                };
                m.allocator.acquire(block);
                self.blocks.push(block);
                self.hashes.push(hash);
                parent = hash;
            }
        }
        let hit = self.blocks.len() * BLOCK_SIZE;
        m.counters.queried_tokens += tokens.len() as u64;
        m.counters.hit_tokens += hit as u64;
        hit
    }

    /// Grows the table to hold `tokens` positions. Returns `false`, taking nothing, if the
    /// pool has too few free blocks.
    pub fn reserve(&mut self, tokens: usize) -> bool {
        let needed = tokens
            .div_ceil(BLOCK_SIZE)
            .saturating_sub(self.blocks.len());
        if needed == 0 {
            return true;
        }
        match self.manager.borrow_mut().allocate(needed) {
            Some(blocks) => {
                self.blocks.extend(blocks);
                true
            }
            None => false,
        }
    }

    /// Free blocks a reservation of `tokens` positions would take.
    pub fn blocks_needed(&self, tokens: usize) -> usize {
        tokens
            .div_ceil(BLOCK_SIZE)
            .saturating_sub(self.blocks.len())
    }

    /// Registers the blocks that `computed` leading positions of `tokens` have filled, so later
    /// requests can reuse them.
    pub fn commit(&mut self, tokens: &[u32], computed: usize) {
        let full = (computed / BLOCK_SIZE).min(self.blocks.len());
        if self.hashes.len() >= full {
            return;
        }
        let mut m = self.manager.borrow_mut();
        let caching = m.prefix_caching;
        for i in self.hashes.len()..full {
            let parent = self.hashes.last().copied().unwrap_or(self.root);
            let chunk = &tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
            let hash = block_hash(parent, chunk);
            // Another sequence may hold the same content already: then this copy stays private.
            if caching && m.cache.insert(hash, self.blocks[i], chunk) {
                m.changes.stored.push(hash);
            }
            self.hashes.push(hash);
        }
    }

    /// Returns every block to the pool.
    pub fn release(&mut self) {
        if !self.blocks.is_empty() {
            self.manager.borrow_mut().release(&self.blocks);
        }
        self.blocks.clear();
        self.hashes.clear();
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.release();
    }
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
        let a_blocks = a.blocks().to_vec();
        drop(a);
        assert_eq!(m.borrow().num_free_blocks(), 16);
        assert_eq!(m.borrow().num_cached_blocks(), 2);

        let mut b = BlockTable::new(m.clone(), "");
        let mut other = prompt.clone();
        other.extend(tokens(10, 9));
        assert_eq!(b.match_prefix(&other), 32);
        assert_eq!(&b.blocks()[..2], &a_blocks[..2]);
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
        let blocks = a.blocks().to_vec();
        // Attention went to the last block: without it, that block would go first.
        m.borrow_mut().record_heat(&blocks, &[0.1, 0.0, 0.0, 0.9]);
        drop(a);
        let mut b = BlockTable::new(m.clone(), "");
        assert!(b.reserve(16));
        assert_eq!(
            b.blocks(),
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
