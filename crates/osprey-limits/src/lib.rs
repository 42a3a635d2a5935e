//! Rate limits: GCRA buckets for requests and tokens, per key and per tenant, kept in memory
//! or shared across replicas through Redis.
//!
//! [`RateLimiter::check`] charges all of a request's buckets or none. With Redis configured it
//! asks Redis (one script, one round trip), which also leases this replica units ahead of
//! demand (`lease.rs`): while the revocation feed (`revocations.rs`) is live, a request whose
//! buckets all hold leased units is admitted from memory and the lease is topped up in the
//! background. When Redis fails or is slow the limiter falls back to this process's memory
//! with each limit divided by the number of replicas, logs the switch, exports it as
//! `osprey_ratelimit_redis_up`, and tries Redis again a second later. A request is never
//! failed because the limiter's store is down.
//!
//! Beside them, [`admission`]: how much work the gateway holds at once (requests, and tokens of
//! work) before it sheds, batch-priority work first.

#![deny(missing_docs)]

pub mod admission;
pub mod gcra;
pub mod lease;
pub mod local;
pub mod redis;
pub mod revocations;

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use osprey_core::metrics as names;

pub use gcra::BucketState;
use lease::Leases;
use local::LocalLimiter;
use redis::{Checked, RedisLimiter};
use revocations::RevocationFeed;

/// What a bucket counts (the limiter treats every bucket alike; callers report by unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Requests per minute.
    Requests,
    /// Tokens per minute.
    Tokens,
}

impl Unit {
    /// The word OpenAI's headers use (`x-ratelimit-limit-requests`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requests => "requests",
            Self::Tokens => "tokens",
        }
    }
}

/// One limit a request is charged against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bucket {
    /// Unique name, e.g. `tenant:acme:tokens`.
    pub name: String,
    /// What it counts.
    pub unit: Unit,
    /// Units per minute.
    pub limit: u64,
    /// Units this request costs.
    pub cost: u64,
}

/// The verdict on a request's buckets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Whether every bucket had room (and so all were charged).
    pub allowed: bool,
    /// Each bucket's state after the check, in the order given.
    pub states: Vec<BucketState>,
    /// When refused: microseconds until a retry could pass; `None` if it never can (the
    /// request alone costs more than a limit allows per minute).
    pub retry_after_us: Option<i64>,
}

impl Decision {
    /// Combines per-bucket results: `retries` is each bucket's `Charge::retry_after_us`.
    pub fn new(
        allowed: bool,
        states: Vec<BucketState>,
        retries: impl IntoIterator<Item = Option<i64>>,
    ) -> Self {
        let mut retry_after_us = Some(0);
        for r in retries {
            retry_after_us = match (retry_after_us, r) {
                (Some(a), Some(b)) => Some(a.max(b)),
                _ => None,
            };
        }
        Self {
            allowed,
            states,
            retry_after_us: if allowed { Some(0) } else { retry_after_us },
        }
    }
}

/// The answer of [`RateLimiter::check`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Checked (allowed or not).
    Checked(Decision),
    /// The key was revoked (seen through Redis, possibly by another replica).
    Revoked,
}

/// Rate limits, local or shared through Redis with a local fallback.
#[derive(Clone)]
pub struct RateLimiter {
    inner: Arc<Inner>,
}

struct Inner {
    local: LocalLimiter,
    redis: Option<RedisLimiter>,
    /// Replicas sharing the limits: each one's share when it falls back to local limits.
    replicas: u64,
    /// While Redis is considered down: until when (µs) not to try it.
    redis_down_until: AtomicI64,
    redis_down: AtomicBool,
    /// Redis failures seen so far: a call that began before the latest one cannot say that
    /// Redis is back.
    redis_failures: AtomicU64,
    /// Redis settlements not yet sent: bucket name → (bucket, summed delta).
    pending: std::sync::Mutex<std::collections::HashMap<String, (Bucket, i64)>>,
    /// Units Redis has charged to this replica ahead of demand.
    leases: Leases,
    /// The revocation feed and the lease sweeper, started on the first check (inside the
    /// runtime).
    feed: OnceLock<Arc<RevocationFeed>>,
}

impl RateLimiter {
    /// Limits in this process's memory only.
    pub fn local() -> Self {
        Self::build(None, 1)
    }

    /// Limits shared through `redis` by `replicas` gateways.
    pub fn with_redis(redis: osprey_store::SharedRedis, replicas: u64) -> Self {
        Self::build(Some(RedisLimiter::new(redis)), replicas)
    }

    /// Exports whether the limits are shared through Redis now
    /// (`osprey_ratelimit_redis_up`), for a limiter with Redis. Call it once the metrics
    /// recorder is installed: a gauge set before is lost.
    pub fn announce(&self) {
        if self.inner.redis.is_some() {
            let down = self.inner.redis_down.load(Ordering::Relaxed);
            metrics::gauge!(names::RATELIMIT_REDIS_UP).set(if down { 0.0 } else { 1.0 });
        }
    }

    fn build(redis: Option<RedisLimiter>, replicas: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                local: LocalLimiter::default(),
                redis,
                replicas: replicas.max(1),
                redis_down_until: AtomicI64::new(0),
                redis_down: AtomicBool::new(false),
                redis_failures: AtomicU64::new(0),
                pending: Default::default(),
                leases: Leases::new(replicas),
                feed: OnceLock::new(),
            }),
        }
    }

    /// The shared Redis limiter, if configured.
    pub fn redis(&self) -> Option<&RedisLimiter> {
        self.inner.redis.as_ref()
    }

    /// The share of each limit local buckets hold: all of it without Redis, this replica's
    /// share when Redis is down.
    fn local_share(&self) -> u64 {
        if self.inner.redis.is_some() {
            self.inner.replicas
        } else {
            1
        }
    }

    fn shared(&self) -> Option<&RedisLimiter> {
        let redis = self.inner.redis.as_ref()?;
        (now_us() >= self.inner.redis_down_until.load(Ordering::Relaxed)).then_some(redis)
    }

    /// Marks the start of a Redis call, for [`Self::redis_ok`].
    fn redis_call(&self) -> u64 {
        self.inner.redis_failures.load(Ordering::Acquire)
    }

    fn redis_failed(&self, e: &::redis::RedisError) {
        // Limits are local until Redis answers again, and leases start afresh then.
        self.inner.redis_failures.fetch_add(1, Ordering::AcqRel);
        self.inner.leases.clear();
        self.inner
            .redis_down_until
            .store(now_us() + 1_000_000, Ordering::Relaxed);
        metrics::counter!(names::RATELIMIT_REDIS_ERRORS).increment(1);
        if !self.inner.redis_down.swap(true, Ordering::Relaxed) {
            metrics::gauge!(names::RATELIMIT_REDIS_UP).set(0.0);
            tracing::warn!(error = %e, share = self.inner.replicas, "Redis is unreachable: rate limits are local (this replica's share) until it returns");
        }
    }

    /// A Redis call begun at `call` ([`Self::redis_call`]) succeeded. If Redis failed since it
    /// began (its answer was on the way when the connection went), it says nothing of now.
    fn redis_ok(&self, call: u64) {
        if self.inner.redis_failures.load(Ordering::Acquire) != call {
            return;
        }
        if self.inner.redis_down.swap(false, Ordering::Relaxed) {
            metrics::gauge!(names::RATELIMIT_REDIS_UP).set(1.0);
            tracing::info!("Redis is back: rate limits are shared again");
        }
    }

    /// Charges `buckets` (all or none), also learning whether `key_id` was revoked when Redis
    /// is in use.
    pub async fn check(&self, buckets: &[Bucket], key_id: Option<&str>) -> Verdict {
        if let Some(redis) = self.shared() {
            let now = now_us();
            let feed = Some(self.feed(redis)).filter(|f| f.is_live());
            if let Some(feed) = feed {
                if key_id.is_some_and(|id| feed.is_revoked(id)) {
                    return Verdict::Revoked;
                }
                if let Some(states) = self.inner.leases.take(buckets, now) {
                    metrics::counter!(names::RATELIMIT_LEASED).increment(1);
                    self.top_up(redis, buckets, now);
                    return Verdict::Checked(Decision::new(true, states, []));
                }
            }
            // Lease only while revocations are followed: a leased request skips Redis's check.
            let extra = match feed {
                Some(_) => self.inner.leases.wants(buckets, now),
                None => vec![0; buckets.len()],
            };
            metrics::counter!(names::RATELIMIT_REDIS_CALLS, "call" => "check").increment(1);
            let call = self.redis_call();
            match redis.check(buckets, &extra, key_id).await {
                Ok(Some(checked)) => {
                    self.redis_ok(call);
                    return Verdict::Checked(self.lease(buckets, checked, now_us()));
                }
                Ok(None) => {
                    self.redis_ok(call);
                    return Verdict::Revoked;
                }
                Err(e) => self.redis_failed(&e),
            }
        }
        Verdict::Checked(
            self.inner
                .local
                .check(buckets, now_us(), self.local_share()),
        )
    }

    /// The revocation feed, started (with the lease sweeper) on first use.
    fn feed(&self, redis: &RedisLimiter) -> &Arc<RevocationFeed> {
        self.inner.feed.get_or_init(|| {
            tokio::spawn(sweep_idle_leases(Arc::downgrade(&self.inner)));
            RevocationFeed::follow(redis.clone())
        })
    }

    /// Keeps what Redis leased with a check, and reports the buckets with the leases counted
    /// as remaining.
    fn lease(&self, buckets: &[Bucket], checked: Checked, now: i64) -> Decision {
        let Checked {
            mut decision,
            leased,
        } = checked;
        for ((b, state), units) in buckets.iter().zip(&mut decision.states).zip(leased) {
            if units > 0 {
                self.inner.leases.grant(b, units, *state, now);
            }
            *state = self.inner.leases.with_leased(b, *state);
        }
        decision
    }

    /// Tops up, in the background, the leases among `buckets` that have run low.
    fn top_up(&self, redis: &RedisLimiter, buckets: &[Bucket], now: i64) {
        let claimed = self.inner.leases.claim_top_ups(buckets, now);
        if claimed.is_empty() {
            return;
        }
        let (this, redis) = (self.clone(), redis.clone());
        tokio::spawn(async move {
            let (buckets, wants): (Vec<Bucket>, Vec<u64>) = claimed.iter().cloned().unzip();
            metrics::counter!(names::RATELIMIT_REDIS_CALLS, "call" => "top_up").increment(1);
            let call = this.redis_call();
            match redis.check(&buckets, &wants, None).await {
                Ok(Some(checked)) => {
                    this.redis_ok(call);
                    let now = now_us();
                    for ((b, state), units) in buckets
                        .iter()
                        .zip(&checked.decision.states)
                        .zip(checked.leased)
                    {
                        this.inner.leases.grant(b, units, *state, now);
                    }
                }
                Ok(None) => this.inner.leases.top_up_failed(&claimed),
                Err(e) => {
                    this.inner.leases.top_up_failed(&claimed);
                    this.redis_failed(&e);
                }
            }
        });
    }

    /// Corrects earlier charges by `(bucket, delta)`. Locally at once; through Redis the
    /// corrections are summed per bucket and sent in one script call every
    /// [`SETTLE_INTERVAL`], so settling costs Redis a call per interval, not per request.
    pub fn settle(&self, corrections: Vec<(Bucket, i64)>) {
        if corrections.iter().all(|(_, d)| *d == 0) {
            return;
        }
        if self.inner.redis.is_none() {
            return self
                .inner
                .local
                .settle(&corrections, now_us(), self.local_share());
        }
        let mut pending = self.inner.pending.lock().expect("pending lock");
        let start_flusher = pending.is_empty();
        for (b, delta) in corrections {
            pending.entry(b.name.clone()).or_insert((b, 0)).1 += delta;
        }
        drop(pending);
        if start_flusher {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(SETTLE_INTERVAL).await;
                this.flush_settlements().await;
            });
        }
    }

    async fn flush_settlements(&self) {
        let corrections: Vec<(Bucket, i64)> = {
            let mut pending = self.inner.pending.lock().expect("pending lock");
            pending.drain().map(|(_, c)| c).collect()
        };
        if corrections.is_empty() {
            return;
        }
        if let Some(redis) = self.shared() {
            metrics::counter!(names::RATELIMIT_REDIS_CALLS, "call" => "settle").increment(1);
            let call = self.redis_call();
            match redis.settle(&corrections).await {
                Ok(()) => return self.redis_ok(call),
                Err(e) => self.redis_failed(&e),
            }
        }
        self.inner
            .local
            .settle(&corrections, now_us(), self.local_share());
    }
}

/// Gives leases unused for [`lease::IDLE_US`] back to Redis, until the limiter is dropped.
async fn sweep_idle_leases(limiter: Weak<Inner>) {
    let mut tick =
        tokio::time::interval(std::time::Duration::from_micros(lease::IDLE_US as u64 / 4));
    loop {
        tick.tick().await;
        let Some(inner) = limiter.upgrade() else {
            return;
        };
        let back = inner.leases.reclaim_idle(now_us());
        if let (false, Some(redis)) = (back.is_empty(), inner.redis.as_ref()) {
            metrics::counter!(names::RATELIMIT_REDIS_CALLS, "call" => "return").increment(1);
            // Lost on failure: Redis gets the units back anyway as the buckets refill.
            if let Err(e) = redis.settle(&back).await {
                tracing::debug!(error = %e, "could not return idle leases to Redis");
            }
        }
    }
}

/// How long Redis settlements are gathered before they are sent.
pub const SETTLE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(50);

/// Microseconds since the Unix epoch.
pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
