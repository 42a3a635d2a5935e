//! Following one worker's event stream (`GET /worker/events`): its prefix cache into the
//! pool's index, its load, and whether it is live. A stream that breaks, or stays silent for
//! [`STALL`] (the worker sends its load at least every second), ejects the worker and forgets what it
//! held; the feed reconnects with a growing pause, and the worker's next snapshot brings it
//! back. A worker without the protocol (404 on its events) is a plain upstream: the feed
//! follows its `/ready` (or `/health`) instead.

use std::sync::Weak;
use std::sync::atomic::Ordering;
use std::time::Duration;

use eventsource_stream::{Event, Eventsource};
use futures_util::StreamExt;
use osprey_core::metrics as names;

use super::protocol::{KvBatch, Load, Snapshot};
use super::{Worker, WorkerPool};

/// Silence after which a worker counts as gone.
const STALL: Duration = Duration::from_secs(3);
const FIRST_PAUSE: Duration = Duration::from_millis(100);
const MAX_PAUSE: Duration = Duration::from_secs(2);
/// How often a plain upstream's `/health` is asked.
const HEALTH_EVERY: Duration = Duration::from_secs(1);

/// Follows worker `w` of `pool` until the pool is dropped.
pub(super) async fn follow(pool: Weak<WorkerPool>, w: usize, client: reqwest::Client) {
    let mut pause = FIRST_PAUSE;
    loop {
        let Some(url) = pool.upgrade().map(|p| p.workers[w].url.clone()) else {
            return;
        };
        let response = client.get(format!("{url}/worker/events")).send().await;
        if let Ok(r) = &response
            && r.status() == reqwest::StatusCode::NOT_FOUND
        {
            tracing::info!(worker = %url, "no worker protocol: a plain upstream, followed by its readiness");
            return follow_health(pool, w, client, url).await;
        }
        if let Ok(response) = response.and_then(|r| r.error_for_status()) {
            let mut events = response.bytes_stream().eventsource();
            let mut seq = 0;
            while let Ok(Some(Ok(event))) = tokio::time::timeout(STALL, events.next()).await {
                let Some(pool) = pool.upgrade() else { return };
                match pool.apply(w, &event, &mut seq) {
                    Ok(()) => pause = FIRST_PAUSE,
                    Err(e) => {
                        tracing::warn!(worker = %url, error = %e, "a worker sent a bad event");
                        break;
                    }
                }
            }
        }
        let Some(p) = pool.upgrade() else { return };
        eject(&p.workers[w], "its event stream ended");
        p.index.lock().expect("prefix index lock").clear(w);
        drop(p);
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// Follows plain upstream `w` (at `url`) by its `/ready` (or, where it has none, `/health`)
/// every [`HEALTH_EVERY`], until the pool is dropped.
async fn follow_health(pool: Weak<WorkerPool>, w: usize, client: reqwest::Client, url: String) {
    if let Some(p) = pool.upgrade() {
        p.workers[w].plain.store(true, Ordering::Relaxed);
    }
    let mut tick = tokio::time::interval(HEALTH_EVERY);
    let mut probe = "ready";
    loop {
        tick.tick().await;
        let answer = client
            .get(format!("{url}/{probe}"))
            .timeout(STALL)
            .send()
            .await;
        if probe == "ready"
            && let Ok(r) = &answer
            && r.status() == reqwest::StatusCode::NOT_FOUND
        {
            probe = "health";
            continue;
        }
        let healthy = answer.is_ok_and(|r| r.status().is_success());
        let Some(p) = pool.upgrade() else { return };
        let worker = &p.workers[w];
        if healthy {
            went_live(worker);
        } else if worker.live.load(Ordering::Relaxed) {
            eject(worker, "it is not ready");
            p.index.lock().expect("prefix index lock").clear(w);
            worker.sent.lock().expect("sent blocks lock").clear();
        }
    }
}

/// Takes requests to `worker` again.
fn went_live(worker: &Worker) {
    if !worker.live.swap(true, Ordering::Relaxed) {
        tracing::info!(worker = %worker.url, "worker live");
        metrics::gauge!(names::WORKER_LIVE, "worker" => worker.url.clone()).set(1.0);
    }
}

/// Stops sending requests to `worker`, until its events say it is back.
pub(super) fn eject(worker: &Worker, why: &str) {
    if worker.live.swap(false, Ordering::Relaxed) {
        tracing::warn!(worker = %worker.url, "worker ejected: {why}");
        metrics::gauge!(names::WORKER_LIVE, "worker" => worker.url.clone()).set(0.0);
    }
}

impl WorkerPool {
    /// Applies one event of worker `w`'s stream; `seq` is the last KV batch applied.
    fn apply(&self, w: usize, event: &Event, seq: &mut u64) -> Result<(), serde_json::Error> {
        let worker = &self.workers[w];
        let load = match event.event.as_str() {
            "snapshot" => {
                let s: Snapshot = serde_json::from_str(&event.data)?;
                let mut index = self.index.lock().expect("prefix index lock");
                index.clear(w);
                index.store(w, &s.blocks);
                *seq = s.seq;
                Some(s.load)
            }
            "kv" => {
                let b: KvBatch = serde_json::from_str(&event.data)?;
                if b.seq > *seq {
                    let mut index = self.index.lock().expect("prefix index lock");
                    index.evict(w, &b.evicted);
                    index.store(w, &b.stored);
                    *seq = b.seq;
                }
                None
            }
            "load" => Some(serde_json::from_str::<Load>(&event.data)?),
            _ => None,
        };
        if let Some(load) = load {
            worker
                .reported
                .store(load.running + load.waiting, Ordering::Relaxed);
            worker.ttft_ms.store(load.ttft_ms, Ordering::Relaxed);
            went_live(worker);
        }
        Ok(())
    }
}
