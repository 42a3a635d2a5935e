//! Retries with a budget, not blind retries.
//!
//! A [`RetryBudget`] lets retries be at most `ratio` of a pool's requests plus a floor of
//! `min_per_sec`, so when a backend fails outright the retries add a tenth to its load rather
//! than multiplying it (Finagle's retry budget). [`backoff`] spaces the attempts: exponential,
//! with full jitter so that clients which failed together do not retry together.
//!
//! Whether a request may be retried at all is the caller's business: never after bytes were
//! streamed to the client.

use std::time::{Duration, Instant};

/// How many retries a pool allows.
#[derive(Clone, Debug, PartialEq)]
pub struct RetryBudgetConfig {
    /// Retries per request, over the long run.
    pub ratio: f64,
    /// Retries per second allowed whatever the traffic (so a quiet pool can still retry).
    pub min_per_sec: f64,
    /// The most retries that can be saved up, so a quiet hour does not buy a storm.
    pub max_saved: f64,
}

impl Default for RetryBudgetConfig {
    fn default() -> Self {
        Self {
            ratio: 0.1,
            min_per_sec: 1.0,
            max_saved: 20.0,
        }
    }
}

/// A pool's retry budget: a balance that each request adds `ratio` to, time adds
/// `min_per_sec` to, and each retry takes one from.
#[derive(Clone, Debug)]
pub struct RetryBudget {
    config: RetryBudgetConfig,
    balance: f64,
    refilled_at: Instant,
}

impl RetryBudget {
    /// A budget that starts with the floor's worth of a second.
    pub fn new(config: RetryBudgetConfig, now: Instant) -> Self {
        Self {
            balance: config.min_per_sec.min(config.max_saved),
            config,
            refilled_at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let secs = now
            .saturating_duration_since(self.refilled_at)
            .as_secs_f64();
        self.refilled_at = now;
        self.balance = (self.balance + secs * self.config.min_per_sec).min(self.config.max_saved);
    }

    /// Counts a first attempt (not a retry).
    pub fn on_request(&mut self, now: Instant) {
        self.refill(now);
        self.balance = (self.balance + self.config.ratio).min(self.config.max_saved);
    }

    /// Takes a retry from the budget; `false` (and nothing taken) when it is spent.
    pub fn try_retry(&mut self, now: Instant) -> bool {
        self.refill(now);
        if self.balance >= 1.0 {
            self.balance -= 1.0;
            true
        } else {
            false
        }
    }
}

/// The pause before retry number `attempt` (1 for the first retry): uniform between zero and
/// `base × 2^(attempt - 1)`, at most `max`.
pub fn backoff(attempt: u32, base: Duration, max: Duration, rng: &mut impl rand::Rng) -> Duration {
    let ceiling = base
        .saturating_mul(1u32 << attempt.saturating_sub(1).min(31))
        .min(max);
    ceiling.mul_f64(rng.random::<f64>())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_failing_backend_gets_a_tenth_more_not_a_storm() {
        let t0 = Instant::now();
        let mut budget = RetryBudget::new(RetryBudgetConfig::default(), t0);
        // 1,000 requests over 10 s, every one failing and asking for a retry.
        let mut retries = 0;
        for i in 0..1000u32 {
            let now = t0 + Duration::from_millis(u64::from(i) * 10);
            budget.on_request(now);
            retries += u32::from(budget.try_retry(now));
        }
        // 10% of 1,000, plus 1/s over 10 s, plus the starting second.
        assert!((105..=111).contains(&retries), "{retries} retries");
    }

    #[test]
    fn a_quiet_pool_saves_up_to_the_cap() {
        let t0 = Instant::now();
        let mut budget = RetryBudget::new(RetryBudgetConfig::default(), t0);
        let hour = t0 + Duration::from_secs(3600);
        let allowed = (0..100).filter(|_| budget.try_retry(hour)).count();
        assert_eq!(allowed, 20);
    }

    #[test]
    fn backoff_grows_and_stays_within_its_ceiling() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let (base, max) = (Duration::from_millis(50), Duration::from_secs(2));
        for attempt in 1..40 {
            let ceiling = (base * 2u32.pow(attempt.min(20) - 1)).min(max);
            for _ in 0..100 {
                assert!(backoff(attempt, base, max, &mut rng) <= ceiling);
            }
        }
        // Jittered: not every pause is the ceiling.
        let pauses: Vec<_> = (0..10).map(|_| backoff(3, base, max, &mut rng)).collect();
        assert!(pauses.iter().any(|p| *p < Duration::from_millis(150)));
    }
}
