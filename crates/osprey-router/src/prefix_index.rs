//! Which worker holds which prompt blocks: the router's copy of every worker's prefix cache.
//!
//! Blocks are named by chained hashes (a block's hash covers everything before it), so the
//! blocks of a prompt that a worker can reuse are the leading run of its hashes found in that
//! worker's set. The index maps each hash to the set of workers holding it, as a bit mask (at
//! most [`MAX_WORKERS`] workers), and answers for all workers at once in one walk of the
//! prompt's hashes.
//!
//! Entries come from two sources: each worker's KV events (a snapshot, then blocks stored and
//! evicted), and what the router itself sent where (a prompt sent to a worker will be cached
//! there a moment later; its events confirm or correct that).

use std::collections::HashMap;

/// The identity of a block and everything before it.
pub type BlockHash = u128;

/// Workers one index can track.
pub const MAX_WORKERS: usize = 64;

/// Per block hash, the workers holding it.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    holders: HashMap<BlockHash, u64>,
}

impl PrefixIndex {
    /// Records that `worker` holds `hashes`.
    pub fn store(&mut self, worker: usize, hashes: &[BlockHash]) {
        let bit = bit(worker);
        for &h in hashes {
            *self.holders.entry(h).or_default() |= bit;
        }
    }

    /// Records that `worker` no longer holds `hashes`.
    pub fn evict(&mut self, worker: usize, hashes: &[BlockHash]) {
        let bit = bit(worker);
        for h in hashes {
            if let Some(mask) = self.holders.get_mut(h) {
                *mask &= !bit;
                if *mask == 0 {
                    self.holders.remove(h);
                }
            }
        }
    }

    /// Forgets everything `worker` held (it went away, or is about to send a snapshot).
    pub fn clear(&mut self, worker: usize) {
        let bit = bit(worker);
        self.holders.retain(|_, mask| {
            *mask &= !bit;
            *mask != 0
        });
    }

    /// For each of `workers` workers, how many leading blocks of a prompt hashed `hashes` it
    /// holds.
    pub fn matched(&self, workers: usize, hashes: &[BlockHash]) -> Vec<usize> {
        let mut matched = vec![hashes.len(); workers];
        let mut still: u64 = if workers >= MAX_WORKERS {
            u64::MAX
        } else {
            (1 << workers) - 1
        };
        for (i, h) in hashes.iter().enumerate() {
            let holders = self.holders.get(h).copied().unwrap_or(0);
            let lost = still & !holders;
            for (w, m) in matched.iter_mut().enumerate() {
                if lost & bit(w) != 0 {
                    *m = i;
                }
            }
            still &= holders;
            if still == 0 {
                break;
            }
        }
        matched
    }

    /// Blocks `worker` is recorded as holding.
    pub fn blocks_of(&self, worker: usize) -> usize {
        let bit = bit(worker);
        self.holders.values().filter(|m| *m & bit != 0).count()
    }
}

fn bit(worker: usize) -> u64 {
    assert!(worker < MAX_WORKERS, "at most {MAX_WORKERS} workers");
    1 << worker
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_matches_its_leading_run() {
        let mut index = PrefixIndex::default();
        index.store(0, &[1, 2, 3]);
        index.store(1, &[1, 2]);
        index.store(2, &[2, 3]); // not a prefix: block 1 is missing
        assert_eq!(index.matched(3, &[1, 2, 3, 4]), [3, 2, 0]);
        assert_eq!(index.matched(3, &[]), [0, 0, 0]);
        index.evict(0, &[2]);
        assert_eq!(index.matched(3, &[1, 2, 3]), [1, 2, 0]);
        index.clear(1);
        assert_eq!(index.matched(3, &[1, 2, 3]), [1, 0, 0]);
        assert_eq!(index.blocks_of(0), 2);
        assert_eq!(index.blocks_of(1), 0);
    }

    #[test]
    fn a_fully_held_prompt_matches_in_full() {
        let mut index = PrefixIndex::default();
        index.store(1, &[7, 8]);
        assert_eq!(index.matched(2, &[7, 8]), [0, 2]);
    }
}
