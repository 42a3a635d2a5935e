//! The generic cell rate algorithm (GCRA) with weighted cells: the arithmetic of one rate
//! limit, shared by the in-memory limiter and the Redis script (which repeats it in Lua).
//!
//! A bucket allows `limit` units per minute and bursts of up to a minute's worth. Its whole
//! state is one number, the theoretical arrival time (TAT): when the bucket would be full
//! again if nothing more came. Charging `cost` units moves the TAT `cost × T` later
//! (`T = 60 s / limit`); a charge is allowed while the TAT stays within a minute of now.

/// The window every limit is expressed over, in microseconds.
pub const PERIOD_US: i64 = 60_000_000;

/// What a client may still do against one bucket, as the rate-limit headers report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketState {
    /// Units per minute.
    pub limit: u64,
    /// Units that could be spent right now.
    pub remaining: u64,
    /// Microseconds until the bucket is full again.
    pub reset_us: i64,
}

/// The result of charging a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Charge {
    /// Whether the charge fits.
    pub allowed: bool,
    /// The TAT after the charge (unchanged when refused).
    pub tat: i64,
    /// What is left afterwards.
    pub state: BucketState,
    /// When refused: microseconds until it would fit; `None` if it never can (cost > limit).
    pub retry_after_us: Option<i64>,
}

/// Microseconds one unit occupies in a bucket of `limit` per minute.
pub fn unit_us(limit: u64) -> f64 {
    PERIOD_US as f64 / limit.max(1) as f64
}

/// Charges `cost` units at `now` to a bucket of `limit` per minute whose TAT is `tat` (0 for a
/// fresh bucket). All times are microseconds.
pub fn charge(tat: i64, now: i64, limit: u64, cost: u64) -> Charge {
    let t = unit_us(limit);
    let start = tat.max(now);
    let after = start + (cost as f64 * t).ceil() as i64;
    let allowed = after - now <= PERIOD_US;
    let tat = if allowed { after } else { start };
    let remaining = ((PERIOD_US - (tat - now)) as f64 / t).floor().max(0.0) as u64;
    let retry_after_us = match (allowed, cost > limit) {
        (true, _) => Some(0),
        (false, true) => None,
        (false, false) => Some(after - now - PERIOD_US),
    };
    Charge {
        allowed,
        tat,
        state: BucketState {
            limit,
            remaining: remaining.min(limit),
            reset_us: tat - now,
        },
        retry_after_us,
    }
}

/// The TAT after correcting an earlier charge by `delta` units at `now`: a refund (negative)
/// gives back time already reserved, an extra charge (positive) is added from now on if the
/// bucket has meanwhile refilled.
pub fn adjust(tat: i64, now: i64, limit: u64, delta: i64) -> i64 {
    let shift = (delta as f64 * unit_us(limit)).round() as i64;
    if delta > 0 {
        tat.max(now) + shift
    } else {
        tat + shift
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_bucket_allows_a_minute_of_burst_then_refuses() {
        let (mut tat, now) = (0, 1_000_000_000);
        for i in 0..60 {
            let c = charge(tat, now, 60, 1);
            assert!(c.allowed, "request {i}");
            assert_eq!(c.state.remaining, 59 - i);
            tat = c.tat;
        }
        let refused = charge(tat, now, 60, 1);
        assert!(!refused.allowed);
        assert_eq!(refused.tat, tat, "a refusal charges nothing");
        assert_eq!(
            refused.retry_after_us,
            Some(1_000_000),
            "one unit per second"
        );
        assert_eq!(refused.state.reset_us, PERIOD_US);
        // A second later one more fits.
        assert!(charge(tat, now + 1_000_000, 60, 1).allowed);
    }

    #[test]
    fn weighted_charges_and_refunds() {
        let now = 5_000_000;
        let c = charge(0, now, 1000, 800);
        assert!(c.allowed);
        assert_eq!(c.state.remaining, 200);
        assert!(!charge(c.tat, now, 1000, 300).allowed);
        // The request used 100 of the 800 charged: 700 come back.
        let tat = adjust(c.tat, now, 1000, -700);
        assert_eq!(charge(tat, now, 1000, 0).state.remaining, 900);
        assert_eq!(
            charge(0, now, 1000, 1001).retry_after_us,
            None,
            "never fits"
        );
        // Charging more to a bucket that has refilled starts from now.
        assert_eq!(adjust(0, now, 1000, 10), now + 600_000);
    }

    #[test]
    fn an_idle_bucket_refills() {
        let c = charge(0, 0, 10, 10);
        assert_eq!(c.state.remaining, 0);
        let later = charge(c.tat, PERIOD_US, 10, 0);
        assert_eq!(later.state.remaining, 10);
        assert_eq!(later.state.reset_us, 0);
    }
}
