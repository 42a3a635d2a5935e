//! Rate limits shared by every gateway replica through Redis: one script per check (one round
//! trip) charges all of a request's buckets atomically, on Redis's clock, leases units ahead
//! (`lease.rs`), and also answers whether the caller's key has been revoked. Revocations are
//! also announced on a channel, which `revocations.rs` follows.

use std::time::Duration;

use redis::aio::ConnectionManager;

use super::gcra::BucketState;
use super::{Bucket, Decision};
use osprey_store::SharedRedis;

/// The set of revoked key ids, checked by every replica on every request.
pub const REVOKED_KEYS: &str = "osprey:revoked-keys";
/// The channel a revocation is announced on: `"{nonce} {key id}"`.
pub const REVOCATIONS: &str = "osprey:revocations";
const PREFIX: &str = "osprey:rl:";

/// `KEYS[1]` the revoked set, `KEYS[2..]` the buckets; `ARGV[1]` the key id or '', then per
/// bucket a limit, a cost and how many units more to lease. Returns `{-1}` for a revoked key,
/// else `{ok, then per bucket: remaining, reset µs, overflow µs, units leased}`. A lease takes
/// only what fits after the cost, and nothing when the request is refused. The arithmetic is
/// `gcra.rs`'s.
const CHECK: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
if ARGV[1] ~= '' and redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  return {-1}
end
local period = 60000000
local n = #KEYS - 1
local ok = 1
local starts, afters, units = {}, {}, {}
for i = 1, n do
  local limit = tonumber(ARGV[3 * i - 1])
  local cost = tonumber(ARGV[3 * i])
  local unit = period / math.max(limit, 1)
  local tat = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  local start = math.max(tat, now)
  local after = start + math.ceil(cost * unit)
  if after - now > period then ok = 0 end
  starts[i], afters[i], units[i] = start, after, unit
end
local out = {ok}
for i = 1, n do
  local tat, leased = starts[i], 0
  if ok == 1 then
    leased = math.floor((period - (afters[i] - now)) / units[i])
    leased = math.max(0, math.min(tonumber(ARGV[3 * i + 1]), leased))
    tat = afters[i] + math.floor(leased * units[i])
    redis.call('SET', KEYS[i + 1], string.format('%d', tat), 'PX', math.ceil((tat - now) / 1000) + 1000)
  end
  local remaining = math.floor((period - (tat - now)) / units[i])
  if remaining < 0 then remaining = 0 end
  out[#out + 1] = remaining
  out[#out + 1] = tat - now
  out[#out + 1] = afters[i] - now - period
  out[#out + 1] = leased
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
    redis: SharedRedis,
    check: redis::Script,
    settle: redis::Script,
    timeout: Duration,
}

impl RedisLimiter {
    /// A limiter on `redis` (connected on first use, so a Redis that is down at start-up only
    /// means local limits until it comes up).
    pub fn new(redis: SharedRedis) -> Self {
        Self {
            redis,
            check: redis::Script::new(CHECK),
            settle: redis::Script::new(SETTLE),
            timeout: Duration::from_millis(250),
        }
    }

    async fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        self.redis.connection().await
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
            self.redis.reset().await;
        }
        result
    }

    /// Charges every bucket or none, leasing `extra[i]` more units of bucket `i` where they
    /// fit; `None` when `key_id` has been revoked.
    pub async fn check(
        &self,
        buckets: &[Bucket],
        extra: &[u64],
        key_id: Option<&str>,
    ) -> redis::RedisResult<Option<Checked>> {
        let mut conn = self.bounded(self.connection()).await?;
        let mut call = self.check.key(REVOKED_KEYS);
        call.arg(key_id.unwrap_or(""));
        for (i, b) in buckets.iter().enumerate() {
            call.key(format!("{PREFIX}{}", b.name))
                .arg(b.limit)
                .arg(b.cost)
                .arg(extra.get(i).copied().unwrap_or(0));
        }
        let out: Vec<i64> = self.bounded(call.invoke_async(&mut conn)).await?;
        if out.first() == Some(&-1) {
            return Ok(None);
        }
        let allowed = out.first() == Some(&1);
        let mut states = Vec::with_capacity(buckets.len());
        let mut retries = Vec::with_capacity(buckets.len());
        let mut leased = Vec::with_capacity(buckets.len());
        for (b, v) in buckets.iter().zip(out[1..].chunks_exact(4)) {
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
            leased.push(v[3].max(0) as u64);
        }
        Ok(Some(Checked {
            decision: Decision::new(allowed, states, retries),
            leased,
        }))
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

    /// Marks `key_id` revoked for every replica and waits (up to a second) until every
    /// replica following [`REVOCATIONS`] has taken it in, so that none admits the key again
    /// once this returns.
    pub async fn revoke(&self, key_id: &str) -> redis::RedisResult<()> {
        let mut conn = self.bounded(self.connection()).await?;
        let nonce = format!("{:016x}", rand::random::<u64>());
        let (_, followers): (i64, i64) = self
            .bounded(
                redis::pipe()
                    .atomic()
                    .sadd(REVOKED_KEYS, key_id)
                    .publish(REVOCATIONS, format!("{nonce} {key_id}"))
                    .query_async(&mut conn),
            )
            .await?;
        let acks = ack_key(&nonce);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(1);
        loop {
            let seen: Option<i64> = self
                .bounded(redis::cmd("GET").arg(&acks).query_async(&mut conn))
                .await?;
            if seen.unwrap_or(0) >= followers {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(key = %key_id, followers, acknowledged = seen.unwrap_or(0), "not every replica acknowledged the revocation within a second; the rest learn of it when they resynchronise");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// Tells the revoker that this replica has taken in the revocation `nonce`.
    pub async fn acknowledge_revocation(&self, nonce: &str) -> redis::RedisResult<()> {
        let mut conn = self.bounded(self.connection()).await?;
        let acks = ack_key(nonce);
        let _: () = self
            .bounded(
                redis::pipe()
                    .incr(&acks, 1)
                    .ignore()
                    .expire(&acks, 60)
                    .ignore()
                    .query_async(&mut conn),
            )
            .await?;
        Ok(())
    }

    /// Every revoked key id.
    pub async fn revoked_keys(&self) -> redis::RedisResult<std::collections::HashSet<String>> {
        let mut conn = self.bounded(self.connection()).await?;
        self.bounded(
            redis::cmd("SMEMBERS")
                .arg(REVOKED_KEYS)
                .query_async(&mut conn),
        )
        .await
    }

    /// How many key ids are revoked.
    pub async fn revoked_count(&self) -> redis::RedisResult<usize> {
        let mut conn = self.bounded(self.connection()).await?;
        self.bounded(redis::cmd("SCARD").arg(REVOKED_KEYS).query_async(&mut conn))
            .await
    }

    /// A subscription of its own (a subscribed connection can send nothing else).
    pub async fn pubsub(&self) -> redis::RedisResult<redis::aio::PubSub> {
        self.bounded(self.redis.client().get_async_pubsub()).await
    }
}

/// What a check answered: the decision and the units leased beyond it, per bucket.
#[derive(Clone, Debug)]
pub struct Checked {
    /// Allowed or not, and each bucket's state (leases counted as used).
    pub decision: Decision,
    /// Units leased to this replica beyond the request's cost, per bucket.
    pub leased: Vec<u64>,
}

fn ack_key(nonce: &str) -> String {
    format!("osprey:revocation-acks:{nonce}")
}
