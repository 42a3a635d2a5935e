//! The request log's writer: rows of the request log ([`crate::request_log`]) written without
//! making anyone wait for the store. Rows go through a bounded queue to one writer, on a thread
//! of its own, that commits what gathered in 10 ms at once (a busy gateway commits a hundred
//! times a second, not once per request); when the queue is full (the store slow or gone) rows
//! are dropped and counted in `osprey_request_log_dropped_total`, so logging never holds up
//! serving. A server that stops [`RequestLog::flush`]es it after its last answer.

use tokio::sync::{mpsc, oneshot};

use crate::{RequestLogEntry, Store};

/// Rows waiting to be written at most.
const QUEUE: usize = 4096;
/// Rows written in one transaction at most.
const BATCH: usize = 256;
/// How long rows gather after the first of a batch arrives: each commit costs more than a
/// row, and rows need not show up in the log sooner.
const GATHER: std::time::Duration = std::time::Duration::from_millis(10);

/// Hands rows to the writer.
#[derive(Clone, Debug)]
pub struct RequestLog {
    tx: mpsc::Sender<Message>,
}

/// What the writer is sent.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "rows are most of what is sent; boxing them would cost an allocation per request"
)]
enum Message {
    Row(RequestLogEntry),
    /// Write every row sent before now, then answer.
    Flush(oneshot::Sender<()>),
}

impl RequestLog {
    /// Starts the writer on `store`, on a thread of its own that first runs `on_thread` (the
    /// server lowers the thread's priority there, so that binding a batch's values and
    /// SQLite's work, on the worker thread the log's connection starts from there, never hold
    /// up a request). Rows go nowhere (counted as dropped) if the thread cannot start.
    pub fn spawn(store: Store, on_thread: fn()) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        let writer = move || {
            on_thread();
            match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime.block_on(write_task(store, rx)),
                Err(e) => tracing::error!(error = %e, "the request log has no writer"),
            }
        };
        let thread = std::thread::Builder::new().name("osprey-request-log".into());
        if let Err(e) = thread.spawn(writer) {
            tracing::error!(error = %e, "the request log has no writer");
        }
        Self { tx }
    }

    /// Queues `entry`; drops it if the queue is full.
    pub fn record(&self, entry: RequestLogEntry) {
        if self.tx.try_send(Message::Row(entry)).is_err() {
            metrics::counter!(osprey_core::metrics::REQUEST_LOG_DROPPED).increment(1);
        }
    }

    /// Completes when every row recorded before the call is in the store (or was dropped
    /// because it could not be written), without waiting out the gathering window: for a
    /// server that stops, and for whoever reads the log right after a request.
    pub async fn flush(&self) {
        let (done, written) = oneshot::channel();
        if self.tx.send(Message::Flush(done)).await.is_ok() {
            let _ = written.await;
        }
    }
}

async fn write_task(store: Store, mut rx: mpsc::Receiver<Message>) {
    let mut messages = Vec::with_capacity(BATCH);
    let mut rows = Vec::with_capacity(BATCH);
    let flush = |m: &Message| matches!(m, Message::Flush(_));
    while rx.recv_many(&mut messages, BATCH).await > 0 {
        if !messages.iter().any(flush) {
            tokio::time::sleep(GATHER).await;
            while messages.len() < BATCH
                && let Ok(message) = rx.try_recv()
            {
                messages.push(message);
            }
        }
        for message in messages.drain(..) {
            match message {
                Message::Row(row) => rows.push(row),
                Message::Flush(done) => {
                    write(&store, &mut rows).await;
                    let _ = done.send(());
                }
            }
        }
        write(&store, &mut rows).await;
    }
}

/// Writes `rows` in one go and empties it; counts them as dropped if that fails.
async fn write(store: &Store, rows: &mut Vec<RequestLogEntry>) {
    if rows.is_empty() {
        return;
    }
    if let Err(e) = store.log_requests(rows).await {
        metrics::counter!(osprey_core::metrics::REQUEST_LOG_DROPPED).increment(rows.len() as u64);
        tracing::warn!(error = %e, rows = rows.len(), "request log rows were not written");
    }
    rows.clear();
}
