//! The shared tier: blocks in Redis, so workers and replicas of the same model reuse each
//! other's prefixes.
//!
//! A block is the value of `osprey:kv:{model}:{hash}`, where `model` fingerprints the weights
//! (so no model reads another's KV) and `hash` is the chained block hash, which starts from the
//! tenant's salt (so no tenant reads another's). Each key expires after a TTL; a sorted set of
//! keys by time keeps the count under a cap, oldest out first. Every call is bounded by a short
//! timeout; after a failure Redis is left alone for a second, and meanwhile every lookup is a
//! miss and every store is dropped: Redis down costs recomputation, never an error.

use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;

use super::StoredBlock;
use crate::kv::BlockHash;

/// How long one Redis call may take.
const TIMEOUT: Duration = Duration::from_millis(250);
/// How long Redis is left alone after a failure.
const BACKOFF: Duration = Duration::from_secs(1);

/// Trims the key index to `ARGV[1]` entries, deleting the oldest keys.
const TRIM: &str = r"
local excess = redis.call('ZCARD', KEYS[1]) - tonumber(ARGV[1])
if excess > 0 then
  local old = redis.call('ZPOPMIN', KEYS[1], excess)
  for i = 1, #old, 2 do redis.call('DEL', old[i]) end
end
return excess";

/// Settings of the shared tier.
#[derive(Clone, Debug)]
pub struct SharedConfig {
    /// `redis://host:port`.
    pub url: String,
    /// Seconds a block lives.
    pub ttl: Duration,
    /// Most bytes of blocks kept for this model (counted in whole blocks).
    pub max_bytes: usize,
}

/// A connection to the shared tier, used from the tier thread's runtime.
pub struct SharedStore {
    client: redis::Client,
    config: SharedConfig,
    prefix: String,
    /// Most blocks kept, from the byte cap.
    max_blocks: usize,
    conn: Option<ConnectionManager>,
    down_until: Option<Instant>,
    trim: redis::Script,
    writes: u64,
}

impl SharedStore {
    /// A store for the model fingerprinted `model`, whose stored blocks take `block_bytes`
    /// each (nothing is contacted yet).
    pub fn new(config: SharedConfig, model: &str, block_bytes: usize) -> redis::RedisResult<Self> {
        Ok(Self {
            client: redis::Client::open(config.url.as_str())?,
            prefix: format!("osprey:kv:{model}:"),
            max_blocks: (config.max_bytes / block_bytes.max(1)).max(1),
            config,
            conn: None,
            down_until: None,
            trim: redis::Script::new(TRIM),
            writes: 0,
        })
    }

    fn key(&self, hash: BlockHash) -> String {
        format!("{}{hash:032x}", self.prefix)
    }

    /// Whether calls are being skipped after a failure.
    pub fn is_down(&self) -> bool {
        self.down_until.is_some_and(|t| Instant::now() < t)
    }

    async fn connection(&mut self) -> Option<ConnectionManager> {
        if self.is_down() {
            return None;
        }
        if self.conn.is_none() {
            let config = redis::aio::ConnectionManagerConfig::new()
                .set_connection_timeout(Some(TIMEOUT))
                .set_response_timeout(Some(TIMEOUT))
                .set_number_of_retries(0);
            match ConnectionManager::new_with_config(self.client.clone(), config).await {
                Ok(c) => self.conn = Some(c),
                Err(e) => {
                    self.failed(&e);
                    return None;
                }
            }
        }
        self.conn.clone()
    }

    fn failed(&mut self, e: &dyn std::fmt::Display) {
        if !self.is_down() {
            tracing::warn!(error = %e, "the shared KV tier (Redis) failed; its lookups are misses for a second");
        }
        self.conn = None;
        self.down_until = Some(Instant::now() + BACKOFF);
    }

    /// The block stored as `hash`, if Redis has it and answers in time.
    pub async fn get(&mut self, hash: BlockHash) -> Option<StoredBlock> {
        let mut conn = self.connection().await?;
        let mut get = redis::cmd("GET");
        get.arg(self.key(hash));
        let call = get.query_async::<Option<Vec<u8>>>(&mut conn);
        match tokio::time::timeout(TIMEOUT, call).await {
            Ok(Ok(Some(bytes))) => StoredBlock::from_record(&bytes)
                .map(|(b, _)| b)
                .filter(|b| b.hash == hash),
            Ok(Ok(None)) => None,
            Ok(Err(e)) => {
                self.failed(&e);
                None
            }
            Err(_) => {
                self.failed(&"timed out");
                None
            }
        }
    }

    /// Stores `block` (best effort).
    pub async fn put(&mut self, block: &StoredBlock) {
        let Some(mut conn) = self.connection().await else {
            return;
        };
        let key = self.key(block.hash);
        let index = format!("{}index", self.prefix);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut pipe = redis::pipe();
        pipe.cmd("SET")
            .arg(&key)
            .arg(block.to_record())
            .arg("EX")
            .arg(self.config.ttl.as_secs().max(1))
            .ignore()
            .cmd("ZADD")
            .arg(&index)
            .arg(now)
            .arg(&key)
            .ignore();
        self.writes += 1;
        let call = pipe.query_async::<()>(&mut conn);
        let result = match tokio::time::timeout(TIMEOUT, call).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(_) => Err("timed out".to_owned()),
        };
        if let Err(e) = result {
            self.failed(&e);
            return;
        }
        // Trim now and then rather than on every write.
        if self.writes.is_multiple_of(64) {
            let mut trim = self.trim.key(&index);
            trim.arg(self.max_blocks);
            let trim = trim.invoke_async::<i64>(&mut conn);
            if let Ok(Err(e)) = tokio::time::timeout(TIMEOUT, trim).await {
                self.failed(&e);
            }
        }
    }
}
