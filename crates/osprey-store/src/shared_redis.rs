//! The server's one connection to Redis (`--redis`), shared by the rate limiter and the
//! response cache: multiplexed, made on first use (a Redis that is down at start-up only means
//! local limits and no shared answers until it comes up), and dropped after a failure so the
//! next call connects afresh.
//!
//! The KV tier (`--kv-redis`) keeps its own, in the engine: it runs on the tier thread's
//! runtime, and a connection's driver task lives on the runtime that made it.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

/// How long connecting, and any one command, may take.
const TIMEOUT: Duration = Duration::from_millis(250);

/// A handle on one Redis, cheap to clone: every clone shares its connection.
#[derive(Clone)]
pub struct SharedRedis {
    client: redis::Client,
    conn: Arc<tokio::sync::Mutex<Option<ConnectionManager>>>,
}

impl SharedRedis {
    /// A handle on the Redis at `url` (nothing is contacted yet).
    pub fn open(url: &str) -> redis::RedisResult<Self> {
        Ok(Self {
            client: redis::Client::open(url)?,
            conn: Arc::default(),
        })
    }

    /// The client, for a connection of its own (a subscription).
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    /// The shared connection, made first if need be.
    pub async fn connection(&self) -> redis::RedisResult<ConnectionManager> {
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref() {
            return Ok(c.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(TIMEOUT))
            .set_response_timeout(Some(TIMEOUT))
            .set_number_of_retries(1);
        let c = ConnectionManager::new_with_config(self.client.clone(), config).await?;
        *conn = Some(c.clone());
        Ok(c)
    }

    /// Drops the connection after a failure: the next call connects afresh.
    pub async fn reset(&self) {
        *self.conn.lock().await = None;
    }
}
