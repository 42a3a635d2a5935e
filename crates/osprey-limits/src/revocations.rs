//! Revocations as they happen: a replica follows the Redis channel on which every revocation
//! is announced, and keeps the set of revoked key ids in memory, so requests answered from a
//! lease (no Redis round trip) still refuse a revoked key.
//!
//! The feed is *live* once it is subscribed and has read the whole revoked set; only then may
//! the limiter skip Redis. The revoker waits for each live feed's acknowledgement, so once
//! `revoke` returns no replica admits the key. If the subscription drops, the feed is not live
//! (every request asks Redis again, which checks the set itself) until it has resubscribed and
//! reread the set; a once-a-second count of the set catches a silently dead subscription.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use futures_util::StreamExt;

use super::redis::{REVOCATIONS, RedisLimiter};

/// Revoked key ids as the Redis channel announces them.
#[derive(Debug, Default)]
pub struct RevocationFeed {
    live: AtomicBool,
    revoked: RwLock<HashSet<String>>,
}

/// How often the feed checks that it has missed nothing.
const RESYNC: Duration = Duration::from_secs(1);

impl RevocationFeed {
    /// A feed following `redis`'s channel from a background task, which ends when the feed is
    /// dropped.
    pub fn follow(redis: RedisLimiter) -> Arc<Self> {
        let feed = Arc::new(Self::default());
        tokio::spawn(run(Arc::downgrade(&feed), redis));
        feed
    }

    /// Whether every revocation so far is known here.
    pub fn is_live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Whether `key_id` is revoked (meaningful while the feed is live).
    pub fn is_revoked(&self, key_id: &str) -> bool {
        self.revoked.read().expect("revoked lock").contains(key_id)
    }

    fn replace(&self, ids: HashSet<String>) {
        *self.revoked.write().expect("revoked lock") = ids;
    }

    fn insert(&self, id: &str) {
        self.revoked
            .write()
            .expect("revoked lock")
            .insert(id.to_owned());
    }

    fn len(&self) -> usize {
        self.revoked.read().expect("revoked lock").len()
    }
}

async fn run(feed: Weak<RevocationFeed>, redis: RedisLimiter) {
    loop {
        match subscribe(&feed, &redis).await {
            Ok(()) => return,
            Err(e) => {
                let Some(f) = feed.upgrade() else { return };
                if f.live.swap(false, Ordering::AcqRel) {
                    tracing::warn!(error = %e, "lost the Redis revocation channel: every request asks Redis until it is back");
                }
            }
        }
        tokio::time::sleep(RESYNC).await;
    }
}

/// Follows the channel until the feed is dropped (`Ok`) or Redis fails (`Err`).
async fn subscribe(feed: &Weak<RevocationFeed>, redis: &RedisLimiter) -> redis::RedisResult<()> {
    let (mut sink, mut messages) = redis.pubsub().await?.split();
    sink.subscribe(REVOCATIONS).await?;
    // Subscribed first, read second: a revocation in between is in the set or on its way.
    let ids = redis.revoked_keys().await?;
    {
        let Some(f) = feed.upgrade() else {
            return Ok(());
        };
        f.replace(ids);
        f.live.store(true, Ordering::Release);
    }
    tracing::info!("following revocations through Redis: leased limits are on");
    let mut resync = tokio::time::interval(RESYNC);
    loop {
        tokio::select! {
            msg = messages.next() => {
                let Some(msg) = msg else {
                    return Err(closed());
                };
                let Some(f) = feed.upgrade() else { return Ok(()) };
                let payload: String = msg.get_payload()?;
                if let Some((nonce, id)) = payload.split_once(' ') {
                    f.insert(id);
                    redis.acknowledge_revocation(nonce).await?;
                }
            }
            _ = resync.tick() => {
                let Some(f) = feed.upgrade() else { return Ok(()) };
                let _: redis::Value = tokio::time::timeout(Duration::from_millis(250), sink.ping())
                    .await
                    .map_err(|_| closed())??;
                if redis.revoked_count().await? != f.len() {
                    f.replace(redis.revoked_keys().await?);
                }
            }
        }
    }
}

fn closed() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the Redis subscription ended",
    ))
}
