//! Which worker of a pool takes a request.
//!
//! - [`Policy::CacheAware`]: the worker where the request costs least: the prompt blocks it
//!   would have to compute (those not already cached there) plus a charge per request it
//!   already has in flight. A prompt whose prefix is cached somewhere goes there unless that
//!   worker is so much busier that recomputing elsewhere is cheaper.
//! - [`Policy::LeastLoaded`]: the worker with the fewest requests in flight.
//! - [`Policy::RoundRobin`]: each worker in turn.
//!
//! Ties go to the less loaded worker, then to the next in turn, so equal workers share work.

/// How a pool picks a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// Longest cached prefix, weighed against load.
    CacheAware,
    /// Fewest requests in flight.
    LeastLoaded,
    /// In turn.
    RoundRobin,
}

impl Policy {
    /// The policy named `name` (`cache_aware`, `least_loaded`, `round_robin`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "cache_aware" => Some(Self::CacheAware),
            "least_loaded" => Some(Self::LeastLoaded),
            "round_robin" => Some(Self::RoundRobin),
            _ => None,
        }
    }

    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::CacheAware => "cache_aware",
            Self::LeastLoaded => "least_loaded",
            Self::RoundRobin => "round_robin",
        }
    }
}

/// A worker that can take the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// Requests in flight there.
    pub load: usize,
    /// Leading blocks of the request's prompt cached there.
    pub cached_blocks: usize,
}

/// The cost of one request in flight, in prompt blocks to compute: 8 blocks of 16 tokens.
pub const LOAD_COST_BLOCKS: usize = 8;

/// The index of the worker to use among `workers` (`None`: not available), for a prompt of
/// `prompt_blocks` blocks; `turn` is a counter the caller increments per request.
pub fn choose(
    policy: Policy,
    workers: &[Option<Candidate>],
    prompt_blocks: usize,
    turn: usize,
) -> Option<usize> {
    let n = workers.len();
    let in_turn = (0..n).map(|i| (turn + i) % n);
    let available = in_turn.filter_map(|i| workers[i].map(|c| (i, c)));
    let cost = |c: &Candidate| match policy {
        Policy::CacheAware => (
            prompt_blocks.saturating_sub(c.cached_blocks) + c.load * LOAD_COST_BLOCKS,
            c.load,
        ),
        Policy::LeastLoaded => (c.load, 0),
        Policy::RoundRobin => (0, 0),
    };
    // `min_by_key` keeps the first of equals: the next in turn.
    available.min_by_key(|(_, c)| cost(c)).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(load: usize, cached_blocks: usize) -> Option<Candidate> {
        Some(Candidate {
            load,
            cached_blocks,
        })
    }

    #[test]
    fn cache_aware_prefers_the_cached_prefix_until_load_outweighs_it() {
        let p = Policy::CacheAware;
        assert_eq!(choose(p, &[c(0, 0), c(1, 60)], 62, 0), Some(1));
        assert_eq!(choose(p, &[c(0, 0), c(8, 60)], 62, 0), Some(0), "too busy");
        assert_eq!(
            choose(p, &[c(2, 0), c(1, 0)], 62, 0),
            Some(1),
            "no cache: load"
        );
    }

    #[test]
    fn equals_take_turns_and_unavailable_workers_are_skipped() {
        let all = [c(0, 0), c(0, 0), c(0, 0)];
        for p in [Policy::CacheAware, Policy::LeastLoaded, Policy::RoundRobin] {
            let picks: Vec<_> = (0..3).map(|t| choose(p, &all, 4, t)).collect();
            assert_eq!(picks, [Some(0), Some(1), Some(2)], "{p:?}");
        }
        assert_eq!(
            choose(Policy::RoundRobin, &[c(5, 0), None, c(9, 0)], 4, 1),
            Some(2)
        );
        assert_eq!(
            choose(Policy::LeastLoaded, &[c(5, 0), None, c(9, 0)], 4, 1),
            Some(0)
        );
        assert_eq!(choose(Policy::CacheAware, &[None, None], 4, 0), None);
    }

    #[test]
    fn policies_parse_by_name() {
        for p in [Policy::CacheAware, Policy::LeastLoaded, Policy::RoundRobin] {
            assert_eq!(Policy::parse(p.as_str()), Some(p));
        }
        assert_eq!(Policy::parse("random"), None);
    }
}
