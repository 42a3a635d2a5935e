//! Rate limits shared by every gateway replica through Redis: one script per check (one round
//! trip) charges all of a request's buckets atomically, on Redis's clock, and also answers
//! whether the caller's key has been revoked.

use std::time::Duration;

use redis::aio::ConnectionManager;

use super::gcra::BucketState;
use super::{Bucket, Decision};

/// The set of revoked key ids, checked by every replica on every request.
pub const REVOKED_KEYS: &str = "osprey:revoked-keys";
const PREFIX: &str = "osprey:rl:";

/// `KEYS[1]` the revoked set, `KEYS[2..]` the buckets; `ARGV[1]` the key id or '', then a
/// limit and a cost per bucket. Returns `{-1}` for a revoked key, else `{ok, then per bucket:
/// remaining, reset µs, overflow µs}`. The arithmetic is `gcra.rs`'s.
const CHECK: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] ~= '' and redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return {-1}
end
local period = 60000000
local n = #KEYS - 1
local ok = 1
local before, starts, afters, units = {}, {}, {}, {}
for i = 1, n do
  local limit = tonumber(ARGV[2 * i])
  local cost = tonumber(ARGV[2 * i + 1])
  local unit = period / math.max(limit, 1)
  local tat = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  local start = math.max(tat, now)
  local after = start + math.ceil(cost * unit)
  if after - now > period then ok = 0 end
  starts[i], afters[i], units[i] = start, after, unit
end
local out = {ok}
for i = 1, n do
  local tat = starts[i]
  if ok == 1 then
    tat = afters[i]
    redis.call('SET', KEYS[i + 1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  end
  local remaining = math.floor((period - (tat - now)) / units[i])
  if remaining < 0 then remaining = 0 end
  out[#out + 1] = remaining
  out[#out + 1] = tat - now
  out[#out + 1] = afters[i] - now - period
end
return out
";

/// `KEYS` the buckets; `ARGV` a limit and a delta per bucket (`gcra::adjust`).
const SETTLE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
for i = 1, #KEYS do
  local unit = 60000000 / math.max(tonumber(ARGV[2 * i - 1]), 1)
  local delta = tonumber(ARGV[2 * i])
  local tat = tonumber(redis.call('GET', KEYS[i]) or '0')
  if delta > 0 and tat < now then tat = now end
  local new = tat + math.floor(delta * unit + 0.5)
  if new > now then
    redis.call('SET', KEYS[i], string.format('%d', new), 'PX', math.ceil((new - now) / 1000) + 1000)
  else
    redis.call('DEL', KEYS[i])
  end
end
return 1
";

/// A Redis-backed limiter. Every call is bounded by a timeout, so a Redis that hangs costs at
/// most that long before the caller falls back.
#[derive(Clone)]
pub struct RedisLimiter {
    client: redis::Client,
    conn: std::sync::Arc<tokio::sync::Mutex<Option<ConnectionManager>>>,
    check: redis::Script,
    settle: redis::Script,
    timeout: Duration,
}

impl RedisLimiter {
    /// A limiter on `url` (connected on first use, so a Redis that is down at start-up only
    /// means local limits until it comes up).
    pub fn new(url: &str) -> redis::RedisResult<Self> {
        Ok(Self {
            client: redis::Client::open(url)?,
            conn: Default::default(),
            check: redis::Script::new(CHECK),
            settle: redis::Script::new(SETTLE),
            timeout: Duration::from_millis(250),
        })
    }

    async fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        let c = ConnectionManager::new_with_config(self.client.clone(), config).await?;
        *conn = Some(c.clone());
        Ok(c)
    }

    /// Runs `f` within the timeout; on any failure the connection is dropped, so the next
    /// call (a second later, see `RateLimiter`) connects afresh.
    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> redis::RedisResult<T> {
        let result = match tokio::time::timeout(self.timeout, f).await {
            Ok(r) => r,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "Redis did not answer in time",
            ))),
        };
        if result.is_err() {
            *self.conn.lock().await = None;
        }
        result
    }

    /// Charges every bucket or none; `None` when `key_id` has been revoked.
    pub async fn check(
        &self,
        buckets: &[Bucket],
        key_id: Option<&str>,
    ) -> redis::RedisResult<Option<Decision>> {
        let mut conn = self.bounded(self.connection()).await?;
        let mut call = self.check.key(REVOKED_KEYS);
        call.arg(key_id.unwrap_or(""));
        for b in buckets {
            call.key(format!("{PREFIX}{}", b.name))
                .arg(b.limit)
                .arg(b.cost);
        }
        let out: Vec<i64> = self.bounded(call.invoke_async(&mut conn)).await?;
        if out.first() == Some(&-1) {
            return Ok(None);
        }
        let allowed = out.first() == Some(&1);
        let mut states = Vec::with_capacity(buckets.len());
        let mut retries = Vec::with_capacity(buckets.len());
        for (b, v) in buckets.iter().zip(out[1..].chunks_exact(3)) {
            states.push(BucketState {
                limit: b.limit,
                remaining: (v[0].max(0) as u64).min(b.limit),
                reset_us: v[1].max(0),
            });
            retries.push(match (v[2] > 0, b.cost > b.limit) {
                (false, _) => Some(0),
                (true, true) => None,
                (true, false) => Some(v[2]),
            });
        }
        Ok(Some(Decision::new(allowed, states, retries)))
    }

    /// Corrects earlier charges by `(bucket, delta)`.
    pub async fn settle(&self, corrections: &[(Bucket, i64)]) -> redis::RedisResult<()> {
        let mut conn = self.bounded(self.connection()).await?;
        let mut call = self.settle.prepare_invoke();
        for (b, delta) in corrections {
            call.key(format!("{PREFIX}{}", b.name))
                .arg(b.limit)
                .arg(*delta);
        }
        let _: i64 = self.bounded(call.invoke_async(&mut conn)).await?;
        Ok(())
    }

    /// Marks `key_id` revoked for every replica.
    pub async fn revoke(&self, key_id: &str) -> redis::RedisResult<()> {
        let mut conn = self.bounded(self.connection()).await?;
        let cmd = redis::cmd("SADD").arg(REVOKED_KEYS).arg(key_id).to_owned();
        let _: i64 = self.bounded(cmd.query_async(&mut conn)).await?;
        Ok(())
    }
}
