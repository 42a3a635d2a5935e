//! Waiting for a condition instead of sleeping a fixed time before an assertion.

use std::future::Future;
use std::time::{Duration, Instant};

/// Polls `condition` until it yields `Some`, and returns that value; panics if it has not
/// within `timeout`. Polls often at first, then every 100 ms.
///
/// ```no_run
/// # async fn demo(count: impl Fn() -> usize) {
/// use std::time::Duration;
/// let rows = osprey_testkit::eventually(
///     || async { (count() > 0).then(|| count()) },
///     Duration::from_secs(10),
/// )
/// .await;
/// # }
/// ```
pub async fn eventually<T, F, Fut>(mut condition: F, timeout: Duration) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(value) = condition().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "the condition did not hold within {timeout:?}"
        );
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// [`eventually`] for tests without an async runtime: polls `condition` on this thread.
pub fn eventually_blocking<T>(mut condition: impl FnMut() -> Option<T>, timeout: Duration) -> T {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "the condition did not hold within {timeout:?}"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_value_that_holds() {
        let mut polls = 0;
        let value = eventually(
            || {
                polls += 1;
                let now = polls;
                async move { (now >= 3).then_some(now) }
            },
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(value, 3);
    }

    #[test]
    #[should_panic(expected = "did not hold within")]
    fn gives_up_after_the_timeout() {
        eventually_blocking(|| None::<()>, Duration::from_millis(30));
    }
}
