//! Rate limits kept in this process's memory: the default, and the fallback when Redis is
//! down.

use std::collections::HashMap;
use std::sync::Mutex;

use super::gcra::{self, BucketState};
use super::{Bucket, Decision};

/// TATs by bucket name, behind one lock (a check touches up to four buckets and must charge
/// all or none).
#[derive(Debug, Default)]
pub struct LocalLimiter {
    tats: Mutex<HashMap<String, i64>>,
}

/// Past this many buckets, full ones (TAT in the past) are dropped.
const PRUNE_AT: usize = 100_000;

impl LocalLimiter {
    /// Charges every bucket or none, at `now` (µs); each limit is divided by `share`.
    pub fn check(&self, buckets: &[Bucket], now: i64, share: u64) -> Decision {
        let mut tats = self.tats.lock().expect("limiter lock");
        if tats.len() > PRUNE_AT {
            tats.retain(|_, tat| *tat > now);
        }
        let before: Vec<i64> = buckets
            .iter()
            .map(|b| tats.get(&b.name).copied().unwrap_or(0))
            .collect();
        let charges: Vec<gcra::Charge> = buckets
            .iter()
            .zip(&before)
            .map(|(b, &tat)| gcra::charge(tat, now, local_limit(b.limit, share), b.cost))
            .collect();
        let allowed = charges.iter().all(|c| c.allowed);
        if allowed {
            for (b, c) in buckets.iter().zip(&charges) {
                tats.insert(b.name.clone(), c.tat);
            }
        }
        let states: Vec<BucketState> = charges
            .iter()
            .zip(&before)
            .map(|(c, &tat)| match allowed {
                true => c.state,
                // Refused: nothing was charged, so report the state as it was.
                false => gcra::charge(tat, now, c.state.limit, 0).state,
            })
            .collect();
        Decision::new(allowed, states, charges.iter().map(|c| c.retry_after_us))
    }

    /// Corrects earlier charges: `(bucket, delta)` pairs.
    pub fn settle(&self, corrections: &[(Bucket, i64)], now: i64, share: u64) {
        let mut tats = self.tats.lock().expect("limiter lock");
        for (b, delta) in corrections {
            let tat = tats.entry(b.name.clone()).or_insert(0);
            *tat = gcra::adjust(*tat, now, local_limit(b.limit, share), *delta);
        }
    }
}

/// This replica's share of a limit.
fn local_limit(limit: u64, share: u64) -> u64 {
    (limit / share.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(name: &str, limit: u64, cost: u64) -> Bucket {
        Bucket {
            name: name.into(),
            unit: crate::Unit::Requests,
            limit,
            cost,
        }
    }

    #[test]
    fn charges_all_buckets_or_none() {
        let l = LocalLimiter::default();
        let both = [bucket("key", 10, 1), bucket("tenant", 2, 1)];
        assert!(l.check(&both, 0, 1).allowed);
        assert!(l.check(&both, 0, 1).allowed);
        let refused = l.check(&both, 0, 1);
        assert!(!refused.allowed);
        assert_eq!(
            refused.states[0].remaining, 8,
            "the key bucket was not charged"
        );
        assert_eq!(refused.retry_after_us, Some(30_000_000));
        // Another tenant's bucket is untouched.
        let other = l.check(&[bucket("other", 2, 1)], 0, 1);
        assert_eq!(other.states[0].remaining, 1);
    }

    #[test]
    fn a_share_divides_the_limit() {
        let l = LocalLimiter::default();
        let b = [bucket("t", 10, 1)];
        let d = l.check(&b, 0, 2);
        assert_eq!((d.states[0].limit, d.states[0].remaining), (5, 4));
    }

    #[test]
    fn settling_refunds_unused_tokens() {
        let l = LocalLimiter::default();
        let b = bucket("tokens", 1000, 900);
        assert!(l.check(std::slice::from_ref(&b), 0, 1).allowed);
        l.settle(&[(b.clone(), -850)], 0, 1);
        let d = l.check(&[bucket("tokens", 1000, 0)], 0, 1);
        assert_eq!(d.states[0].remaining, 950);
    }
}
