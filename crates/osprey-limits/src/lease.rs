//! Leases on shared limits: units of a Redis bucket that Redis has already charged to this
//! replica, handed out here without a round trip.
//!
//! A request whose buckets all hold enough leased units is admitted from memory; when a lease
//! runs low it is topped up in the background, so a busy bucket costs Redis a call every few
//! hundred milliseconds instead of one per request. Nothing is ever admitted that Redis did
//! not charge, so replicas together never exceed a limit; the price is that units leased to
//! one replica are unavailable to the others. Two bounds keep that small:
//! - a lease holds at most `limit / (MAX_SHARE × replicas)` units, so all replicas together
//!   strand at most `limit / MAX_SHARE` (a sixteenth of a minute's burst);
//! - it is sized to the bucket's recent demand over [`HORIZON_US`], and what lies unused for
//!   [`IDLE_US`] goes back to Redis.
//!
//! A bucket whose cap is below one request's cost (a small limit shared by many replicas) is
//! never leased: every request is charged in Redis, exactly as without leases.

use std::collections::HashMap;
use std::sync::Mutex;

use super::Bucket;
use super::gcra::{BucketState, PERIOD_US, unit_us};

/// A lease is sized to cover this much of the bucket's recent demand.
pub const HORIZON_US: i64 = 250_000;
/// All replicas together hold at most `1 / MAX_SHARE` of a limit in leases.
pub const MAX_SHARE: u64 = 16;
/// Units unused for this long go back to Redis.
pub const IDLE_US: i64 = 1_000_000;
/// A lease covers at least this many of the request's costs.
const MIN_COSTS: u64 = 4;

/// The leases this replica holds, by bucket name.
#[derive(Debug)]
pub struct Leases {
    replicas: u64,
    by_bucket: Mutex<HashMap<String, Lease>>,
}

#[derive(Debug)]
struct Lease {
    bucket: Bucket,
    /// Units charged in Redis and not yet handed out.
    units: u64,
    /// When the bucket in Redis would be full again (µs since the epoch), as of the last
    /// grant; it includes this lease and other replicas' charges up to then.
    full_at: i64,
    /// Units handed out since `since`: the demand estimate.
    used: u64,
    since: i64,
    last_used: i64,
    /// The size the last top-up aimed for; a lease below half of it is topped up.
    target: u64,
    refilling: bool,
}

impl Leases {
    /// Leases for a limit shared by `replicas` gateways.
    pub fn new(replicas: u64) -> Self {
        Self {
            replicas: replicas.max(1),
            by_bucket: Mutex::default(),
        }
    }

    /// The most units of a `limit` this replica may hold.
    pub fn cap(&self, limit: u64) -> u64 {
        limit / (MAX_SHARE * self.replicas)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Lease>> {
        self.by_bucket.lock().expect("lease lock")
    }

    /// Hands out every bucket's cost from its lease and returns the buckets' states, or does
    /// nothing and returns `None` when any lease is short.
    pub fn take(&self, buckets: &[Bucket], now: i64) -> Option<Vec<BucketState>> {
        let mut leases = self.lock();
        let enough = |b: &Bucket| {
            leases
                .get(&b.name)
                .is_some_and(|l| l.bucket.limit == b.limit && l.units >= b.cost)
        };
        if !buckets.iter().all(enough) {
            return None;
        }
        let states = buckets
            .iter()
            .map(|b| {
                let l = leases.get_mut(&b.name).expect("checked above");
                l.units -= b.cost;
                l.used += b.cost;
                l.last_used = now;
                l.state(now)
            })
            .collect();
        Some(states)
    }

    /// How many units to lease for each bucket beyond what it holds: the bucket's recent
    /// demand over [`HORIZON_US`], at least a few of this request's costs, at most the cap;
    /// 0 where the cap is below one cost.
    pub fn wants(&self, buckets: &[Bucket], now: i64) -> Vec<u64> {
        let leases = self.lock();
        buckets
            .iter()
            .map(|b| self.want(b, leases.get(&b.name), now))
            .collect()
    }

    fn want(&self, b: &Bucket, lease: Option<&Lease>, now: i64) -> u64 {
        let cap = self.cap(b.limit);
        let cost = b.cost.max(1);
        if cap < cost {
            return 0;
        }
        let (demand, held) = match lease {
            Some(l) => {
                let elapsed = (now - l.since).max(1_000) as u128;
                let demand = l.used as u128 * HORIZON_US as u128 / elapsed;
                (u64::try_from(demand).unwrap_or(u64::MAX), l.units)
            }
            None => (0, 0),
        };
        demand.max(MIN_COSTS * cost).min(cap).saturating_sub(held)
    }

    /// The leases among `buckets` that have run below half their target and are not being
    /// topped up already, with how much to ask for; they are marked as being topped up.
    pub fn claim_top_ups(&self, buckets: &[Bucket], now: i64) -> Vec<(Bucket, u64)> {
        let mut leases = self.lock();
        let mut out = Vec::new();
        for b in buckets {
            let Some(l) = leases.get(&b.name) else {
                continue;
            };
            if l.refilling || l.units * 2 >= l.target {
                continue;
            }
            let want = self.want(b, Some(l), now);
            if want > 0 {
                leases.get_mut(&b.name).expect("present").refilling = true;
                out.push((
                    Bucket {
                        cost: 0,
                        ..b.clone()
                    },
                    want,
                ));
            }
        }
        out
    }

    /// Records that Redis charged `units` more to this replica for `bucket`, leaving the
    /// bucket in `state` at `now` (the state's `remaining` excludes every lease).
    pub fn grant(&self, bucket: &Bucket, units: u64, state: BucketState, now: i64) {
        let mut leases = self.lock();
        let l = leases.entry(bucket.name.clone()).or_insert_with(|| Lease {
            bucket: Bucket {
                cost: 0,
                ..bucket.clone()
            },
            units: 0,
            full_at: now,
            used: 0,
            since: now,
            last_used: now,
            target: 0,
            refilling: false,
        });
        if l.bucket.limit != bucket.limit {
            // The limit changed (a config reload): what was leased under the old one is
            // simply forgotten; Redis recovers it as the bucket refills.
            l.bucket.limit = bucket.limit;
            l.units = 0;
        }
        l.units += units;
        l.target = l.units;
        l.full_at = now + state.reset_us;
        l.used = 0;
        l.since = now;
        l.refilling = false;
    }

    /// A top-up that failed: the leases can be topped up again.
    pub fn top_up_failed(&self, buckets: &[(Bucket, u64)]) {
        let mut leases = self.lock();
        for (b, _) in buckets {
            if let Some(l) = leases.get_mut(&b.name) {
                l.refilling = false;
            }
        }
    }

    /// This replica's remaining units of `bucket` as the headers should show them: what Redis
    /// had left at the last grant (refilled since) plus what is leased here.
    pub fn with_leased(&self, bucket: &Bucket, state: BucketState) -> BucketState {
        let held = self.lock().get(&bucket.name).map_or(0, |l| l.units);
        BucketState {
            remaining: (state.remaining + held).min(state.limit),
            ..state
        }
    }

    /// Ends the leases unused for [`IDLE_US`]: their buckets and the units to give back.
    pub fn reclaim_idle(&self, now: i64) -> Vec<(Bucket, i64)> {
        let mut leases = self.lock();
        let mut back = Vec::new();
        leases.retain(|_, l| {
            if l.refilling || now - l.last_used < IDLE_US {
                return true;
            }
            if l.units > 0 {
                back.push((l.bucket.clone(), -(l.units as i64)));
            }
            false
        });
        back
    }

    /// Forgets every lease (Redis failed: whether it still holds them is unknown). The units
    /// stay charged in Redis until the buckets refill.
    pub fn clear(&self) {
        self.lock().clear();
    }

    /// Units leased here, over every bucket.
    pub fn held(&self) -> u64 {
        self.lock().values().map(|l| l.units).sum()
    }
}

impl Lease {
    fn state(&self, now: i64) -> BucketState {
        let limit = self.bucket.limit;
        let reset_us = (self.full_at - now).max(0);
        let in_redis = ((PERIOD_US - reset_us) as f64 / unit_us(limit))
            .floor()
            .max(0.0) as u64;
        BucketState {
            limit,
            remaining: (in_redis + self.units).min(limit),
            reset_us,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Unit;

    fn bucket(name: &str, limit: u64, cost: u64) -> Bucket {
        Bucket {
            name: name.into(),
            unit: Unit::Requests,
            limit,
            cost,
        }
    }

    fn full(limit: u64) -> BucketState {
        BucketState {
            limit,
            remaining: limit,
            reset_us: 0,
        }
    }

    #[test]
    fn hands_out_all_costs_or_none() {
        let leases = Leases::new(1);
        let (key, tenant) = (bucket("k", 1600, 1), bucket("t", 1600, 1));
        assert_eq!(
            leases.take(std::slice::from_ref(&key), 0),
            None,
            "nothing leased yet"
        );
        leases.grant(&key, 3, full(1600), 0);
        leases.grant(&tenant, 1, full(1600), 0);
        let both = [key.clone(), tenant.clone()];
        assert!(leases.take(&both, 10).is_some());
        assert_eq!(leases.take(&both, 20), None, "the tenant's lease is spent");
        assert_eq!(
            leases.held(),
            2,
            "a refusal takes nothing from the key's lease"
        );
        assert!(leases.take(&[key], 30).is_some());
    }

    #[test]
    fn leases_follow_demand_within_the_cap() {
        let leases = Leases::new(2);
        let b = bucket("b", 3200, 1);
        assert_eq!(leases.cap(3200), 100);
        assert_eq!(leases.wants(std::slice::from_ref(&b), 0), vec![MIN_COSTS]);
        leases.grant(&b, 4, full(3200), 0);
        // 4 requests in 1 ms is 1000 a second: a 250 ms lease would be 250, capped at 100.
        for t in 0..4 {
            assert!(leases.take(std::slice::from_ref(&b), t * 250).is_some());
        }
        assert_eq!(
            leases.claim_top_ups(std::slice::from_ref(&b), 1_000),
            vec![(bucket("b", 3200, 0), 100)]
        );
        assert!(
            leases
                .claim_top_ups(std::slice::from_ref(&b), 1_000)
                .is_empty(),
            "one top-up at a time"
        );
        leases.grant(&b, 100, full(3200), 1_000);
        // 1 request in 100 ms asks for little more than the minimum.
        assert!(leases.take(std::slice::from_ref(&b), 101_000).is_some());
        assert_eq!(
            leases.wants(std::slice::from_ref(&b), 101_000),
            vec![0],
            "99 held, 4 wanted"
        );
    }

    #[test]
    fn a_cap_below_one_cost_never_leases() {
        let leases = Leases::new(2);
        assert_eq!(leases.wants(&[bucket("small", 20, 1)], 0), vec![0]);
        let tokens = bucket("tokens", 160_000, 6_000);
        assert_eq!(leases.cap(160_000), 5_000);
        assert_eq!(leases.wants(&[tokens], 0), vec![0]);
    }

    #[test]
    fn idle_leases_go_back() {
        let leases = Leases::new(1);
        let (busy, idle) = (bucket("busy", 1600, 1), bucket("idle", 1600, 1));
        leases.grant(&busy, 10, full(1600), 0);
        leases.grant(&idle, 10, full(1600), 0);
        assert!(
            leases
                .take(std::slice::from_ref(&busy), IDLE_US / 2)
                .is_some()
        );
        let back = leases.reclaim_idle(IDLE_US);
        assert_eq!(back, vec![(bucket("idle", 1600, 0), -10)]);
        assert_eq!(leases.held(), 9);
    }

    #[test]
    fn states_count_the_lease_as_remaining() {
        let leases = Leases::new(1);
        let b = bucket("b", 600, 1);
        // Redis: 100 used of 600 (10 s to refill), 50 of them leased here.
        let state = BucketState {
            limit: 600,
            remaining: 500,
            reset_us: 10_000_000,
        };
        leases.grant(&b, 50, state, 0);
        let s = leases.take(std::slice::from_ref(&b), 0).unwrap()[0];
        assert_eq!((s.remaining, s.reset_us), (549, 10_000_000));
        // Five seconds on, half of the used units have refilled in Redis.
        let s = leases.take(&[b], 5_000_000).unwrap()[0];
        assert_eq!((s.remaining, s.reset_us), (598, 5_000_000));
    }
}
