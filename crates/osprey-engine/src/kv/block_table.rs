//! One sequence's pages: a table per KV group, in position order, that reuses cached prefixes,
//! grows on demand, gives back what a windowed group has left behind, and frees itself on drop.

use osprey_models::{BLOCK_SIZE, NO_BLOCK};

use super::manager::{SharedKvCacheManager, first_seen_block};
use super::prefix_cache::{BlockHash, block_hash, root_hash};

/// The pages holding one sequence's KV, per KV group, and the hashes of its full blocks.
/// Returns its pages to the pool when dropped.
pub struct BlockTable {
    /// Per KV group, its pages in position order; a windowed group's entries behind its window
    /// are [`NO_BLOCK`] (given back: cached if they held a full block, reused otherwise).
    tables: Vec<Vec<u32>>,
    /// Per KV group, how many leading entries are [`NO_BLOCK`].
    given_back: Vec<usize>,
    /// Chained hashes of the leading full blocks whose content is known (`hashes.len() <=`
    /// every table's length).
    hashes: Vec<BlockHash>,
    root: BlockHash,
    manager: SharedKvCacheManager,
}

impl BlockTable {
    /// An empty table; `salt` separates this sequence's cache entries from other tenants'.
    pub fn new(manager: SharedKvCacheManager, salt: &str) -> Self {
        let groups = manager.borrow().windows().len();
        Self {
            tables: vec![Vec::new(); groups],
            given_back: vec![0; groups],
            hashes: Vec::new(),
            root: root_hash(salt),
            manager,
        }
    }

    /// The hash the table's chain starts from (its salt's).
    pub fn root(&self) -> BlockHash {
        self.root
    }

    /// Per KV group, page ids in position order ([`NO_BLOCK`] behind a window).
    pub fn tables(&self) -> &[Vec<u32>] {
        &self.tables
    }

    /// Whether the table holds no positions.
    pub fn is_empty(&self) -> bool {
        self.tables[0].is_empty()
    }

    /// Every page held, over all groups.
    pub fn held(&self) -> impl Iterator<Item = u32> + '_ {
        self.tables
            .iter()
            .flatten()
            .copied()
            .filter(|&b| b != NO_BLOCK)
    }

    /// Takes the longest cached prefix of `tokens` — whole blocks, always leaving at least one
    /// token to compute, and in each windowed group only the blocks its window still sees —
    /// into this (empty) table. Returns the number of tokens covered.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> usize {
        assert!(
            self.is_empty(),
            "prefix matching starts from an empty table"
        );
        let mut m = self.manager.borrow_mut();
        let max_blocks = tokens.len().saturating_sub(1) / BLOCK_SIZE;
        let chunks: Vec<&[u32]> = tokens.chunks_exact(BLOCK_SIZE).take(max_blocks).collect();
        let hit = if m.prefix_caching {
            // Hashes up to the first block the first group lacks: no hit goes past it.
            let mut chain = Vec::with_capacity(chunks.len());
            let mut parent = self.root;
            for chunk in &chunks {
                let hash = block_hash(parent, chunk);
                if m.lookup(0, hash, chunk).is_none() {
                    break;
                }
                chain.push(hash);
                parent = hash;
            }
            let hit = m.hit_len(chain.len(), |g, i| {
                m.lookup(g, chain[i], chunks[i]).is_some()
            });
            for (g, table) in self.tables.iter_mut().enumerate() {
                let from = m.windows()[g].map_or(0, |w| first_seen_block(hit * BLOCK_SIZE, w));
                table.resize(from, NO_BLOCK);
                self.given_back[g] = from;
                for i in from..hit {
                    let block = m
                        .lookup(g, chain[i], chunks[i])
                        .expect("counted in the hit");
                    m.allocator.acquire(block);
                    table.push(block);
                }
            }
            chain.truncate(hit);
            self.hashes = chain;
            hit * BLOCK_SIZE
        } else {
            0
        };
        m.counters.queried_tokens += tokens.len() as u64;
        m.counters.hit_tokens += hit as u64;
        hit
    }

    /// Pages every group lacks to hold `tokens` positions.
    fn missing(&self, tokens: usize) -> usize {
        let blocks = tokens.div_ceil(BLOCK_SIZE);
        (self.tables.iter())
            .map(|t| blocks.saturating_sub(t.len()))
            .sum()
    }

    /// Grows the tables to hold `tokens` positions. Returns `false`, taking nothing, if the
    /// pool has too few free pages.
    pub fn reserve(&mut self, tokens: usize) -> bool {
        let needed = self.missing(tokens);
        if needed == 0 {
            return true;
        }
        let Some(mut pages) = self.manager.borrow_mut().allocate(needed) else {
            return false;
        };
        let blocks = tokens.div_ceil(BLOCK_SIZE);
        for table in &mut self.tables {
            let grow = blocks.saturating_sub(table.len());
            table.extend(pages.drain(..grow));
        }
        true
    }

    /// Free pages a reservation of `tokens` positions would take.
    pub fn blocks_needed(&self, tokens: usize) -> usize {
        self.missing(tokens)
    }

    /// Free pages computing up to `tokens` positions holds at most at once, in chunks of at
    /// most `chunk` positions: a windowed group gives back what falls behind its window after
    /// each chunk, so it never holds more than the window's blocks and a chunk's.
    pub fn blocks_to_reach(&self, tokens: usize, chunk: usize) -> usize {
        let blocks = tokens.div_ceil(BLOCK_SIZE);
        let m = self.manager.borrow();
        (self.tables.iter().zip(m.windows()))
            .map(|(t, w)| {
                let new = blocks.saturating_sub(t.len());
                match w {
                    None => new,
                    Some(w) => new.min(w.div_ceil(BLOCK_SIZE) + 1 + chunk.div_ceil(BLOCK_SIZE)),
                }
            })
            .sum()
    }

    /// Registers the blocks that `computed` leading positions of `tokens` have filled, so later
    /// requests can reuse them, and gives back the pages of windowed groups that the next
    /// position no longer sees.
    pub fn commit(&mut self, tokens: &[u32], computed: usize) {
        let full = (computed / BLOCK_SIZE).min(self.tables[0].len());
        let mut m = self.manager.borrow_mut();
        if self.hashes.len() < full {
            let caching = m.prefix_caching;
            for i in self.hashes.len()..full {
                let parent = self.hashes.last().copied().unwrap_or(self.root);
                let chunk = &tokens[i * BLOCK_SIZE..(i + 1) * BLOCK_SIZE];
                let hash = block_hash(parent, chunk);
                // Another sequence may hold the same content already: then this copy stays
                // private.
                for (g, table) in self.tables.iter().enumerate() {
                    if caching && table[i] != NO_BLOCK {
                        m.cache_block(g, hash, table[i], chunk);
                    }
                }
                self.hashes.push(hash);
            }
        }
        for g in 0..self.tables.len() {
            let Some(w) = m.windows()[g] else { continue };
            let behind = first_seen_block(computed, w).min(self.tables[g].len());
            let from = self.given_back[g];
            if behind > from {
                m.release(&self.tables[g][from..behind]);
                self.tables[g][from..behind].fill(NO_BLOCK);
                self.given_back[g] = behind;
            }
        }
    }

    /// Gives back the pages that lie wholly past the first `tokens` positions: a verified draft
    /// rolled back to its accepted part. Blocks already hashed (inside what was committed) are
    /// never cut.
    pub fn shrink(&mut self, tokens: usize) {
        let blocks = tokens.div_ceil(BLOCK_SIZE);
        assert!(self.hashes.len() <= blocks, "cutting committed blocks");
        let mut m = self.manager.borrow_mut();
        for (table, given_back) in self.tables.iter_mut().zip(&mut self.given_back) {
            if table.len() > blocks {
                m.release(&table[blocks..]);
                table.truncate(blocks);
                *given_back = (*given_back).min(blocks);
            }
        }
    }

    /// Returns every page to the pool.
    pub fn release(&mut self) {
        if !self.is_empty() {
            let mut m = self.manager.borrow_mut();
            for table in &self.tables {
                m.release(table);
            }
        }
        for table in &mut self.tables {
            table.clear();
        }
        self.given_back.fill(0);
        self.hashes.clear();
    }
}

impl Drop for BlockTable {
    fn drop(&mut self) {
        self.release();
    }
}
