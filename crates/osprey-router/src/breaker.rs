//! A circuit breaker per backend.
//!
//! **Closed**: requests pass; outcomes are counted over a tumbling window. The breaker opens
//! after `consecutive_failures` failures in a row, or when at least `min_requests` outcomes in
//! the window show an error rate of `error_rate` or more.
//! **Open**: requests are refused at once for `open_for`.
//! **Half-open**: then up to `probes` requests are let through at a time; `probes` successes
//! close the breaker, one failure opens it again.

use std::time::{Duration, Instant};

/// When a breaker opens and how it recovers.
#[derive(Clone, Debug, PartialEq)]
pub struct BreakerConfig {
    /// Failures in a row that open the breaker.
    pub consecutive_failures: u32,
    /// Error rate over the window that opens it...
    pub error_rate: f64,
    /// ...once the window holds at least this many outcomes.
    pub min_requests: u32,
    /// The window the error rate is measured over.
    pub window: Duration,
    /// How long an open breaker refuses before probing.
    pub open_for: Duration,
    /// Probes let through at a time while half-open, and successes needed to close.
    pub probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            error_rate: 0.5,
            min_requests: 20,
            window: Duration::from_secs(10),
            open_for: Duration::from_secs(5),
            probes: 1,
        }
    }
}

/// Where a breaker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Requests pass.
    Closed,
    /// Requests are refused.
    Open,
    /// A few probes pass.
    HalfOpen,
}

impl BreakerState {
    /// The state as a gauge value: 0 closed, 1 half-open, 2 open.
    pub fn as_gauge(self) -> f64 {
        match self {
            Self::Closed => 0.0,
            Self::HalfOpen => 1.0,
            Self::Open => 2.0,
        }
    }
}

/// What happened to a request a breaker let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The backend answered.
    Success,
    /// An error, a timeout, or overload.
    Failure,
}

/// One backend's breaker. Not shared across threads by itself: hold it behind a lock.
#[derive(Clone, Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    state: State,
}

#[derive(Clone, Debug)]
enum State {
    Closed {
        in_a_row: u32,
        window_start: Instant,
        ok: u32,
        failed: u32,
    },
    Open {
        until: Instant,
    },
    HalfOpen {
        in_flight: u32,
        succeeded: u32,
    },
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig, now: Instant) -> Self {
        Self {
            config,
            state: closed(now),
        }
    }

    /// The state at `now` (an open breaker whose time is up reads half-open).
    pub fn state(&self, now: Instant) -> BreakerState {
        match self.state {
            State::Closed { .. } => BreakerState::Closed,
            State::Open { until } if now < until => BreakerState::Open,
            State::Open { .. } | State::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Whether a request may go to the backend now; if so, its outcome must be recorded.
    pub fn try_acquire(&mut self, now: Instant) -> bool {
        if let State::Open { until } = self.state {
            if now < until {
                return false;
            }
            self.state = State::HalfOpen {
                in_flight: 0,
                succeeded: 0,
            };
        }
        match &mut self.state {
            State::Closed { .. } => true,
            State::HalfOpen { in_flight, .. } if *in_flight < self.config.probes => {
                *in_flight += 1;
                true
            }
            _ => false,
        }
    }

    /// Records the outcome of a request [`try_acquire`](Self::try_acquire) let through.
    pub fn record(&mut self, outcome: Outcome, now: Instant) {
        let c = &self.config;
        match &mut self.state {
            State::Closed {
                in_a_row,
                window_start,
                ok,
                failed,
            } => {
                if now.duration_since(*window_start) >= c.window {
                    (*window_start, *ok, *failed) = (now, 0, 0);
                }
                match outcome {
                    Outcome::Success => (*in_a_row, *ok) = (0, *ok + 1),
                    Outcome::Failure => (*in_a_row, *failed) = (*in_a_row + 1, *failed + 1),
                }
                let seen = *ok + *failed;
                let too_many_in_a_row = *in_a_row >= c.consecutive_failures;
                let rate_too_high =
                    seen >= c.min_requests && f64::from(*failed) >= c.error_rate * f64::from(seen);
                if too_many_in_a_row || rate_too_high {
                    self.state = State::Open {
                        until: now + c.open_for,
                    };
                }
            }
            State::HalfOpen {
                in_flight,
                succeeded,
            } => match outcome {
                Outcome::Success => {
                    *in_flight = in_flight.saturating_sub(1);
                    *succeeded += 1;
                    if *succeeded >= c.probes {
                        self.state = closed(now);
                    }
                }
                Outcome::Failure => {
                    self.state = State::Open {
                        until: now + c.open_for,
                    };
                }
            },
            // A request let through before the breaker opened: the breaker already decided.
            State::Open { .. } => {}
        }
    }
}

fn closed(now: Instant) -> State {
    State::Closed {
        in_a_row: 0,
        window_start: now,
        ok: 0,
        failed: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: 3,
            error_rate: 0.5,
            min_requests: 10,
            window: Duration::from_secs(10),
            open_for: Duration::from_secs(5),
            probes: 2,
        }
    }

    fn run(b: &mut CircuitBreaker, outcome: Outcome, now: Instant) -> bool {
        let passed = b.try_acquire(now);
        if passed {
            b.record(outcome, now);
        }
        passed
    }

    /// `n` requests, succeeding and failing by turns (never two failures in a row).
    fn alternate(b: &mut CircuitBreaker, n: usize, now: Instant) {
        for i in 0..n {
            let outcome = if i % 2 == 0 {
                Outcome::Success
            } else {
                Outcome::Failure
            };
            assert!(run(b, outcome, now));
        }
    }

    #[test]
    fn opens_on_failures_in_a_row_then_half_opens_and_closes() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(config(), t0);
        assert!(run(&mut b, Outcome::Failure, t0));
        assert!(
            run(&mut b, Outcome::Success, t0),
            "a success resets the run"
        );
        for _ in 0..3 {
            assert!(run(&mut b, Outcome::Failure, t0));
        }
        assert_eq!(b.state(t0), BreakerState::Open);
        assert!(!b.try_acquire(t0 + Duration::from_secs(4)), "open: refused");
        let t5 = t0 + Duration::from_secs(5);
        assert_eq!(b.state(t5), BreakerState::HalfOpen);
        // Two probes at a time, no third.
        assert!(b.try_acquire(t5) && b.try_acquire(t5));
        assert!(!b.try_acquire(t5));
        b.record(Outcome::Success, t5);
        assert_eq!(b.state(t5), BreakerState::HalfOpen, "one of two probes");
        b.record(Outcome::Success, t5);
        assert_eq!(b.state(t5), BreakerState::Closed);
        assert!(run(&mut b, Outcome::Success, t5));
    }

    #[test]
    fn a_failed_probe_opens_it_again() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(config(), t0);
        for _ in 0..3 {
            run(&mut b, Outcome::Failure, t0);
        }
        let t5 = t0 + Duration::from_secs(5);
        assert!(run(&mut b, Outcome::Failure, t5));
        assert_eq!(b.state(t5), BreakerState::Open);
        assert_eq!(
            b.state(t5 + Duration::from_secs(5)),
            BreakerState::HalfOpen,
            "open for another open_for"
        );
    }

    #[test]
    fn opens_on_the_error_rate_once_the_window_has_enough() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(config(), t0);
        // Alternating: never three failures in a row, but half of them fail.
        alternate(&mut b, 9, t0);
        assert_eq!(
            b.state(t0),
            BreakerState::Closed,
            "9 outcomes: below min_requests"
        );
        run(&mut b, Outcome::Failure, t0);
        assert_eq!(b.state(t0), BreakerState::Open, "5 of 10 failed");
    }

    #[test]
    fn the_window_forgets_old_outcomes() {
        let t0 = Instant::now();
        let mut b = CircuitBreaker::new(config(), t0);
        alternate(&mut b, 9, t0);
        let later = t0 + Duration::from_secs(11);
        for _ in 0..9 {
            run(&mut b, Outcome::Success, later);
        }
        run(&mut b, Outcome::Failure, later);
        assert_eq!(
            b.state(later),
            BreakerState::Closed,
            "1 of 10 in this window"
        );
    }
}
