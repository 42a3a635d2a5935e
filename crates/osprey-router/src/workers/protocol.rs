//! The worker protocol: what an `osprey worker` tells the gateways in front of it, and the
//! headers a gateway sends it.
//!
//! - `GET /worker/load` answers [`Load`] as JSON.
//! - `GET /worker/events` is a server-sent event stream: first `snapshot` ([`Snapshot`]: every
//!   block cached, and the load), then `kv` ([`KvBatch`]: blocks stored and evicted, numbered
//!   without gaps) as the engine's prefix cache changes, and `load` ([`Load`]) when it changes
//!   (looked at every [`LOAD_INTERVAL`]) and at least every [`HEARTBEAT`]. A subscriber that
//!   falls behind gets a fresh `snapshot`.
//! - Block hashes are 32 hex digits; a gateway computes the same ones from a prompt with
//!   [`osprey_engine::kv::prefix_hashes`] and the tenant's cache salt, which it sends in
//!   [`CACHE_SALT`] (with the tenant's default priority in [`PRIORITY`]): a worker trusts these
//!   headers, so it belongs on a network only gateways reach.

use std::time::Duration;

use crate::prefix_index::BlockHash;
use osprey_engine::EngineStats;
use serde::{Deserialize, Serialize};

/// The header carrying the tenant's cache salt to a worker.
pub const CACHE_SALT: &str = "x-osprey-cache-salt";
/// The header carrying the tenant's default priority (`interactive`, `batch`) to a worker.
pub const PRIORITY: &str = "x-osprey-priority";
/// How often a worker looks at its load, and sends it if it changed.
pub const LOAD_INTERVAL: Duration = Duration::from_millis(200);
/// The longest a worker stays silent: it sends its load at least this often.
pub const HEARTBEAT: Duration = Duration::from_secs(1);

/// How busy a worker is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Load {
    /// Sequences in the running batch.
    pub running: usize,
    /// Sequences waiting for admission.
    pub waiting: usize,
    /// KV blocks not held by any sequence.
    pub free_blocks: usize,
    /// KV blocks in the pool.
    pub total_blocks: usize,
    /// Recent time to first token, in milliseconds (a moving average that fades while idle).
    #[serde(default)]
    pub ttft_ms: u64,
}

impl Load {
    /// The engine's load now, with its recent time to first token `ttft`.
    pub fn of(stats: &EngineStats, ttft: Duration) -> Self {
        Self {
            running: stats.running(),
            waiting: stats.waiting(),
            free_blocks: stats.free_blocks(),
            total_blocks: stats.total_blocks(),
            ttft_ms: ttft.as_millis() as u64,
        }
    }
}

/// Every block a worker caches, as of batch `seq`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The last batch included.
    pub seq: u64,
    /// The cached blocks.
    #[serde(with = "hex_hashes")]
    pub blocks: Vec<BlockHash>,
    /// The load.
    pub load: Load,
}

/// One engine step's changes to a worker's prefix cache; `evicted` applies first.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvBatch {
    /// Numbered from 1, without gaps.
    pub seq: u64,
    /// Blocks newly cached.
    #[serde(with = "hex_hashes")]
    pub stored: Vec<BlockHash>,
    /// Blocks no longer cached.
    #[serde(with = "hex_hashes")]
    pub evicted: Vec<BlockHash>,
}

/// Block hashes as 32-digit hex strings (JSON numbers cannot hold 128 bits).
mod hex_hashes {
    use serde::de::Error as _;
    use serde::{Deserialize, Deserializer, Serializer};

    use super::BlockHash;

    pub fn serialize<S: Serializer>(hashes: &[BlockHash], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(hashes.iter().map(|h| format!("{h:032x}")))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<BlockHash>, D::Error> {
        Vec::<String>::deserialize(d)?
            .iter()
            .map(|h| BlockHash::from_str_radix(h, 16).map_err(D::Error::custom))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip_as_hex() {
        let batch = KvBatch {
            seq: 3,
            stored: vec![u128::MAX, 1],
            evicted: vec![0xabc],
        };
        let json = serde_json::to_string(&batch).unwrap();
        assert!(json.contains(&"f".repeat(32)), "{json}");
        assert_eq!(serde_json::from_str::<KvBatch>(&json).unwrap(), batch);
        let bad = r#"{"seq":1,"stored":["xyz"],"evicted":[]}"#;
        assert!(serde_json::from_str::<KvBatch>(bad).is_err());
    }
}
