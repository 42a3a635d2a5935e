//! Global admission control: how many requests, and how many tokens of work (the charged
//! prompt plus `max_tokens`), the gateway holds at once. Batch-priority work is shed once
//! either passes `batch_share` of its limit, so interactive requests keep the rest; beyond the
//! limit every request is shed. Shedding is an immediate 503 with `retry-after`, never a wait.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use osprey_core::metrics as names;
use osprey_core::{Error, ErrorKind, Priority};

/// Global admission control: how much work the gateway takes on before it sheds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// Requests in flight at once; beyond it, 503 with `retry-after`.
    pub max_in_flight: u64,
    /// Tokens (charged prompt + `max_tokens`) of the requests in flight.
    pub max_queued_tokens: u64,
    /// Batch-priority requests are shed once in-flight requests or tokens pass this share of
    /// the limits, keeping the rest for interactive work.
    pub batch_share: f64,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        Self {
            max_in_flight: 1024,
            max_queued_tokens: 4_000_000,
            batch_share: 0.75,
        }
    }
}

/// In-flight counters against [`AdmissionConfig`].
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: AdmissionConfig,
    requests: AtomicU64,
    tokens: AtomicU64,
}

/// An admitted request's share of the counters, given back on drop.
#[derive(Debug)]
pub struct Place {
    inner: Arc<Inner>,
    tokens: u64,
}

impl Admission {
    /// Counters for `config`.
    pub fn new(config: AdmissionConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                config,
                requests: AtomicU64::new(0),
                tokens: AtomicU64::new(0),
            }),
        }
    }

    /// Admits a request of `priority` that may cost `tokens`, or sheds it.
    pub fn enter(&self, priority: Priority, tokens: u64) -> Result<Place, Error> {
        let c = &self.inner.config;
        let share = match priority {
            Priority::Interactive => 1.0,
            Priority::Batch => c.batch_share.clamp(0.0, 1.0),
        };
        let max_requests = (c.max_in_flight as f64 * share) as u64;
        let max_tokens = (c.max_queued_tokens as f64 * share) as u64;
        let requests = self.inner.requests.fetch_add(1, Ordering::AcqRel) + 1;
        let queued = self.inner.tokens.fetch_add(tokens, Ordering::AcqRel) + tokens;
        let place = Place {
            inner: self.inner.clone(),
            tokens,
        };
        metrics::gauge!(names::IN_FLIGHT).set(requests as f64);
        // A lone request is always let in, however large: there is nothing to shed it for.
        if requests > 1 && (requests > max_requests || queued > max_tokens) {
            drop(place);
            metrics::counter!(names::ADMISSION_SHED, "priority" => priority.as_str()).increment(1);
            let message = match priority {
                Priority::Batch => {
                    "The server is busy and is keeping its capacity for interactive requests; retry this batch request later."
                }
                Priority::Interactive => "The server is at capacity; retry shortly.",
            };
            return Err(Error::new(ErrorKind::Unavailable, message)
                .with_code("server_overloaded")
                .with_retry_after(1));
        }
        Ok(place)
    }

    /// Requests in flight now.
    pub fn in_flight(&self) -> u64 {
        self.inner.requests.load(Ordering::Acquire)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let left = self.inner.requests.fetch_sub(1, Ordering::AcqRel) - 1;
        self.inner.tokens.fetch_sub(self.tokens, Ordering::AcqRel);
        metrics::gauge!(names::IN_FLIGHT).set(left as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_is_shed_before_interactive() {
        let a = Admission::new(AdmissionConfig {
            max_in_flight: 4,
            max_queued_tokens: 1_000,
            batch_share: 0.5,
        });
        let held: Vec<Place> = (0..2)
            .map(|_| a.enter(Priority::Batch, 10).unwrap())
            .collect();
        let shed = a.enter(Priority::Batch, 10).unwrap_err();
        assert_eq!(shed.kind, ErrorKind::Unavailable);
        assert_eq!(shed.retry_after, Some(1));
        let i: Vec<Place> = (0..2)
            .map(|_| a.enter(Priority::Interactive, 10).unwrap())
            .collect();
        assert!(a.enter(Priority::Interactive, 10).is_err(), "full");
        assert_eq!(a.in_flight(), 4);
        drop((held, i));
        assert_eq!(a.in_flight(), 0);
        assert!(
            a.enter(Priority::Batch, 400).is_ok(),
            "tokens were given back"
        );
    }

    #[test]
    fn queued_tokens_are_limited_too() {
        let a = Admission::new(AdmissionConfig {
            max_in_flight: 100,
            max_queued_tokens: 1_000,
            batch_share: 0.5,
        });
        let _big = a.enter(Priority::Interactive, 900).unwrap();
        assert!(a.enter(Priority::Batch, 10).is_err());
        assert!(a.enter(Priority::Interactive, 200).is_err());
        assert!(a.enter(Priority::Interactive, 50).is_ok());
    }
}
