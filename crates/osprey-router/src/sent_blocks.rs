//! What a plain upstream (one that sends no KV events: vLLM, SGLang, llama-server) probably
//! caches: the blocks of the prompts the router sent it, most recent first, up to a capacity.
//! Recording a prompt returns the blocks that fell out, for the [`crate::prefix_index`] to
//! forget. A least-recently-used set with lazy deletion: a block sent again moves to the front,
//! and its older place in the queue is skipped when reached.

use std::collections::{HashMap, VecDeque};

use crate::prefix_index::BlockHash;

/// The blocks last sent to one upstream.
#[derive(Debug)]
pub struct SentBlocks {
    capacity: usize,
    /// Per block, when it was last sent.
    last_sent: HashMap<BlockHash, u64>,
    /// Every sending, oldest first (stale entries included).
    order: VecDeque<(u64, BlockHash)>,
    clock: u64,
}

impl SentBlocks {
    /// Remembers at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            last_sent: HashMap::new(),
            order: VecDeque::new(),
            clock: 0,
        }
    }

    /// Records that `hashes` were sent; returns the blocks forgotten to make room.
    pub fn record(&mut self, hashes: &[BlockHash]) -> Vec<BlockHash> {
        for &h in hashes {
            self.clock += 1;
            self.last_sent.insert(h, self.clock);
            self.order.push_back((self.clock, h));
        }
        let mut forgotten = Vec::new();
        while self.last_sent.len() > self.capacity
            && let Some((at, h)) = self.order.pop_front()
        {
            if self.last_sent.get(&h) == Some(&at) {
                self.last_sent.remove(&h);
                forgotten.push(h);
            }
        }
        // Stale entries pile up behind a block never sent again: past twice the capacity, the
        // queue is rebuilt from the live entries (amortised, each entry is moved once).
        if self.order.len() > 2 * self.capacity + 64 {
            let mut live: Vec<(u64, BlockHash)> =
                self.last_sent.iter().map(|(&h, &at)| (at, h)).collect();
            live.sort_unstable();
            self.order = live.into();
        }
        forgotten
    }

    /// Blocks remembered.
    pub fn len(&self) -> usize {
        self.last_sent.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.last_sent.is_empty()
    }

    /// Forgets everything (the upstream went away).
    pub fn clear(&mut self) {
        self.last_sent.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_sent_blocks_fall_out_first() {
        let mut sent = SentBlocks::new(4);
        assert!(sent.record(&[1, 2, 3]).is_empty());
        // 1 is sent again: it is now the most recent.
        assert!(sent.record(&[1]).is_empty());
        assert_eq!(sent.record(&[4, 5]), [2]);
        assert_eq!(sent.record(&[6, 7]), [3, 1]);
        assert_eq!(sent.len(), 4);
        sent.clear();
        assert!(sent.is_empty());
    }

    #[test]
    fn repeats_do_not_grow_the_queue_without_bound() {
        let mut sent = SentBlocks::new(8);
        // An old block at the front keeps the repeats' stale entries behind it.
        sent.record(&[9]);
        for _ in 0..10_000 {
            sent.record(&[1, 2, 3]);
        }
        assert_eq!(sent.len(), 4);
        assert!(sent.order.len() <= 2 * 8 + 64 + 3, "{}", sent.order.len());
        assert_eq!(
            sent.record(&(10..15).collect::<Vec<_>>()),
            [9],
            "oldest first"
        );
    }
}
