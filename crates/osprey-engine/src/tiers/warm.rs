//! The warm tier: encoded blocks in host RAM, within a byte cap.
//!
//! Eviction is least recently used, adjusted by value: among the `EVICTION_WINDOW` least
//! recently used blocks, the one with the least heat (attention its content drew in the hot
//! pool) plus reuse (times it was fetched back) goes first, and is handed back to the caller
//! to move down a tier.

use std::collections::{BTreeMap, HashMap};

use super::StoredBlock;
use crate::kv::BlockHash;

/// How many of the least recently used blocks eviction weighs by value.
const EVICTION_WINDOW: usize = 8;

struct Entry {
    block: StoredBlock,
    /// When it was last stored or fetched (a counter).
    used: u64,
    /// Times it was fetched back up.
    reuse: u32,
}

/// Encoded blocks by hash.
#[derive(Default)]
pub struct WarmStore {
    cap_bytes: usize,
    bytes: usize,
    entries: HashMap<BlockHash, Entry>,
    /// Blocks by last use, oldest first.
    by_use: BTreeMap<u64, BlockHash>,
    clock: u64,
}

impl WarmStore {
    /// An empty store holding at most `cap_bytes` of blocks.
    pub fn new(cap_bytes: usize) -> Self {
        Self {
            cap_bytes,
            ..Self::default()
        }
    }

    /// The byte cap (0: the tier is off).
    pub fn cap(&self) -> usize {
        self.cap_bytes
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `hash` is held.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.entries.contains_key(&hash)
    }

    /// Stores `block` (replacing an older copy) and returns what had to leave to make room.
    /// A block larger than the whole cap is not kept (it is returned at once).
    pub fn insert(&mut self, block: StoredBlock) -> Vec<StoredBlock> {
        let hash = block.hash;
        if let Some(old) = self.remove(hash) {
            drop(old);
        }
        let size = block.size();
        if size > self.cap_bytes {
            return vec![block];
        }
        let mut evicted = Vec::new();
        while self.bytes + size > self.cap_bytes {
            match self.victim().and_then(|h| self.remove(h)) {
                Some(v) => evicted.push(v),
                None => break,
            }
        }
        self.clock += 1;
        self.by_use.insert(self.clock, hash);
        self.bytes += size;
        self.entries.insert(
            hash,
            Entry {
                block,
                used: self.clock,
                reuse: 0,
            },
        );
        evicted
    }

    /// The block stored as `hash`, counted as used again.
    pub fn get(&mut self, hash: BlockHash) -> Option<&StoredBlock> {
        let e = self.entries.get_mut(&hash)?;
        self.by_use.remove(&e.used);
        self.clock += 1;
        e.used = self.clock;
        e.reuse += 1;
        self.by_use.insert(self.clock, hash);
        Some(&e.block)
    }

    /// Takes `hash` out.
    pub fn remove(&mut self, hash: BlockHash) -> Option<StoredBlock> {
        let e = self.entries.remove(&hash)?;
        self.by_use.remove(&e.used);
        self.bytes -= e.block.size();
        Some(e.block)
    }

    /// The block to evict next: the least valuable of the least recently used few.
    fn victim(&self) -> Option<BlockHash> {
        let value = |h: &BlockHash| {
            let e = &self.entries[h];
            e.block.heat + e.reuse as f32
        };
        (self.by_use.values().take(EVICTION_WINDOW))
            .min_by(|a, b| value(a).total_cmp(&value(b)))
            .copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiers::codec::Codec;

    fn block(hash: BlockHash, heat: f32) -> StoredBlock {
        StoredBlock {
            hash,
            tokens: [hash as u32; 16],
            codec: Codec::Int8,
            bytes: vec![0; 100],
            heat,
        }
    }

    #[test]
    fn the_cap_holds_and_the_least_valuable_old_block_leaves_first() {
        let size = block(0, 0.0).size();
        let mut w = WarmStore::new(3 * size);
        assert!(w.insert(block(1, 0.9)).is_empty());
        assert!(w.insert(block(2, 0.0)).is_empty());
        assert!(w.insert(block(3, 0.5)).is_empty());
        let out = w.insert(block(4, 0.0));
        assert_eq!(
            out.iter().map(|b| b.hash).collect::<Vec<_>>(),
            [2],
            "cold 2 before hot 1"
        );
        assert_eq!((w.len(), w.bytes()), (3, 3 * size));
        // Fetching 1 twice makes it the most valuable and the most recent.
        w.get(1);
        w.get(1);
        let out = w.insert(block(5, 0.0));
        assert_eq!(out[0].hash, 4);
        assert!(w.contains(1) && w.contains(3) && w.contains(5));
    }

    #[test]
    fn a_block_larger_than_the_cap_is_not_kept() {
        let mut w = WarmStore::new(10);
        assert_eq!(w.insert(block(1, 0.0)).len(), 1);
        assert!(w.is_empty());
    }
}
