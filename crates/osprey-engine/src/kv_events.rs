//! KV events: which prompt blocks the engine's prefix cache holds, as a snapshot and then as
//! numbered batches of changes (blocks stored, blocks evicted), one batch per engine step that
//! changed anything. A router subscribed to a worker's events knows which worker holds the
//! longest prefix of a prompt (hashed with [`crate::kv::prefix_hashes`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::kv::{BlockHash, KvChanges};

/// Batches a subscriber may fall behind by before it must start again from a snapshot.
const BACKLOG: usize = 1024;

/// One step's changes to the prefix cache; apply `evicted` before `stored`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvEventBatch {
    /// Numbered from 1, without gaps.
    pub seq: u64,
    /// Blocks newly cached.
    pub stored: Vec<BlockHash>,
    /// Blocks no longer cached.
    pub evicted: Vec<BlockHash>,
}

/// Every block cached as of batch `seq`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvSnapshot {
    /// The last batch this snapshot includes.
    pub seq: u64,
    /// Hashes of the cached blocks.
    pub blocks: Vec<BlockHash>,
}

/// The engine's record of its prefix cache, shared between the engine thread (which publishes)
/// and subscribers.
#[derive(Debug)]
pub struct KvEventLog {
    state: Mutex<LogState>,
}

#[derive(Debug)]
struct LogState {
    seq: u64,
    cached: HashSet<BlockHash>,
    tx: broadcast::Sender<Arc<KvEventBatch>>,
}

impl Default for KvEventLog {
    fn default() -> Self {
        Self {
            state: Mutex::new(LogState {
                seq: 0,
                cached: HashSet::new(),
                tx: broadcast::channel(BACKLOG).0,
            }),
        }
    }
}

impl KvEventLog {
    /// Records one step's changes and sends them to subscribers.
    pub(crate) fn publish(&self, changes: KvChanges) {
        if changes.is_empty() {
            return;
        }
        let mut s = self.state.lock().expect("kv event log lock");
        for h in &changes.evicted {
            s.cached.remove(h);
        }
        s.cached.extend(changes.stored.iter().copied());
        s.seq += 1;
        let batch = KvEventBatch {
            seq: s.seq,
            stored: changes.stored,
            evicted: changes.evicted,
        };
        // No subscriber is not an error.
        let _ = s.tx.send(Arc::new(batch));
    }

    /// What is cached now, and every batch after it. A receiver that lags by more than the
    /// backlog gets `Lagged` and should subscribe again.
    pub fn subscribe(&self) -> (KvSnapshot, broadcast::Receiver<Arc<KvEventBatch>>) {
        let s = self.state.lock().expect("kv event log lock");
        let snapshot = KvSnapshot {
            seq: s.seq,
            blocks: s.cached.iter().copied().collect(),
        };
        (snapshot, s.tx.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_and_the_batches_after_it_add_up_to_the_cache() {
        let log = KvEventLog::default();
        log.publish(KvChanges {
            stored: vec![1, 2, 3],
            evicted: vec![],
        });
        let (snap, mut rx) = log.subscribe();
        assert_eq!(snap.seq, 1);
        let mut blocks: Vec<_> = snap.blocks.clone();
        blocks.sort_unstable();
        assert_eq!(blocks, [1, 2, 3]);
        log.publish(KvChanges::default());
        log.publish(KvChanges {
            stored: vec![4],
            evicted: vec![2],
        });
        let batch = rx.try_recv().expect("a batch");
        assert_eq!(
            (batch.seq, &batch.stored[..], &batch.evicted[..]),
            (2, &[4][..], &[2][..])
        );
        assert!(rx.try_recv().is_err(), "empty changes send nothing");
        let mut now = log.subscribe().0.blocks;
        now.sort_unstable();
        assert_eq!(now, [1, 3, 4]);
    }
}
