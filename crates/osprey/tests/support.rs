//! What the test modules share: waiting for a server to come up, and the slots that bound how
//! many tests run model-serving `osprey` processes at once.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How long a server may take to come up: loading the model on a slow, shared machine.
pub const STARTUP: Duration = Duration::from_secs(180);

/// Waits until `GET {base}{path}` answers with a success status.
pub async fn up(client: &reqwest::Client, base: &str, path: &str) {
    let url = &format!("{base}{path}");
    osprey_testkit::eventually(
        || async move {
            let r = client.get(url).send().await.ok()?;
            r.status().is_success().then_some(())
        },
        STARTUP,
    )
    .await;
}

/// Waits until the server at `base` is ready to serve (`/ready`).
pub async fn ready(client: &reqwest::Client, base: &str) {
    up(client, base, "/ready").await;
}

/// A slot to run model-serving `osprey` processes in, held for a test's whole length: declare
/// it first, so that it is released after the processes are stopped.
///
/// The tests of all the modules run at once as threads of one process (as many as
/// `--test-threads`, one per CPU by default). Each of the tests that start model-serving
/// processes (a fleet of three, a gateway and a worker, a server under a browser or the
/// `openai` client) keeps several threads busy for tens of seconds, and their waits (streams
/// still answering when a worker is killed, the browser's timeouts) assume the machine is not
/// running every other such test meanwhile, as it was not when each file was a binary of its
/// own. So at most half as many of them as there are CPUs (at least one) run at once; other
/// tests run beside them freely.
pub struct ServerSlot(());

static SLOTS_IN_USE: Mutex<usize> = Mutex::new(0);
static SLOT_FREED: Condvar = Condvar::new();

impl ServerSlot {
    /// Waits for a free slot (blocking this thread).
    pub fn take() -> Self {
        let slots = std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1));
        let mut in_use = SLOTS_IN_USE.lock().unwrap_or_else(PoisonError::into_inner);
        while *in_use >= slots {
            in_use = SLOT_FREED
                .wait(in_use)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *in_use += 1;
        Self(())
    }

    /// [`Self::take`] off the runtime's threads.
    pub async fn take_async() -> Self {
        tokio::task::spawn_blocking(Self::take)
            .await
            .expect("waiting for a server slot")
    }
}

impl Drop for ServerSlot {
    fn drop(&mut self) {
        *SLOTS_IN_USE.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        SLOT_FREED.notify_one();
    }
}
