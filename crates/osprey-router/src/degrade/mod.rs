//! The degradation ladder: as load rises, the gateway gives up quality in steps instead of
//! failing, and takes the steps back as load falls.
//!
//! | level | what changes |
//! |---|---|
//! | 1 | `max_tokens` is capped |
//! | 2 | `auto` requests go one tier smaller |
//! | 3 | expensive modes off: `auto` never escalates (reasoning, premium, low confidence) |
//! | 4 | non-urgent (batch) work is turned away with `retry-after`, to come back later |
//! | 5 | a request answered recently is given that answer again; others get a partial answer (a much smaller `max_tokens`) |
//!
//! The load is a utilisation in 0..=1 (requests in flight over the gateway's limit). A level is
//! entered when the load reaches its threshold and left only when the load falls a margin below
//! it, so the level does not flap around a threshold. Premium tenants are degraded last: two
//! levels less.

mod watch;

pub use watch::{
    DEGRADED, DEGRADED_MAX_TOKENS, DEGRADED_PARTIAL_MAX_TOKENS, Degradation, SAMPLE_EVERY, deferred,
};

/// Thresholds of the levels.
#[derive(Clone, Debug, PartialEq)]
pub struct LadderConfig {
    /// The load at which levels 1 to 5 begin.
    pub enter: [f64; MAX_LEVEL as usize],
    /// How far below its threshold the load must fall to leave a level.
    pub margin: f64,
}

impl Default for LadderConfig {
    fn default() -> Self {
        Self {
            enter: [0.6, 0.7, 0.8, 0.9, 0.95],
            margin: 0.05,
        }
    }
}

/// The highest level.
pub const MAX_LEVEL: u8 = 5;

/// The ladder's state: the current level.
#[derive(Clone, Debug)]
pub struct Ladder {
    config: LadderConfig,
    level: u8,
}

impl Ladder {
    /// A ladder at level 0.
    pub fn new(config: LadderConfig) -> Self {
        Self { config, level: 0 }
    }

    /// The level after observing `load`.
    pub fn observe(&mut self, load: f64) -> u8 {
        let reached = self.config.enter.iter().filter(|&&t| load >= t).count() as u8;
        if reached > self.level {
            self.level = reached;
        }
        while self.level > 0
            && load < self.config.enter[self.level as usize - 1] - self.config.margin
        {
            self.level -= 1;
        }
        self.level
    }

    /// The current level.
    pub fn level(&self) -> u8 {
        self.level
    }
}

/// The level a tenant sees: premium tenants are degraded two levels less.
pub fn level_for(level: u8, premium: bool) -> u8 {
    if premium {
        level.saturating_sub(2)
    } else {
        level
    }
}

/// What the ladder does to a request at a level (levels 2 and 3 act in [`crate::auto`]'s
/// choice of tier), for the backend stage to apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Actions {
    /// A request answered recently is given that answer again (level 5).
    pub replay_recent: bool,
    /// Batch work is turned away with `retry-after` (level 4 and above).
    pub defer_batch: bool,
    /// `max_tokens` is capped to this (level 1 and above; much smaller at 5).
    pub max_tokens: Option<u64>,
}

/// The ladder's actions at `level` (the level the request's tenant sees).
pub fn actions(level: u8) -> Actions {
    Actions {
        replay_recent: level >= 5,
        defer_batch: level >= 4,
        max_tokens: match level {
            0 => None,
            1..5 => Some(DEGRADED_MAX_TOKENS),
            _ => Some(DEGRADED_PARTIAL_MAX_TOKENS),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_level_adds_its_action_to_those_below() {
        assert_eq!(
            actions(0),
            Actions {
                replay_recent: false,
                defer_batch: false,
                max_tokens: None
            }
        );
        assert_eq!(actions(1).max_tokens, Some(DEGRADED_MAX_TOKENS));
        assert!(!actions(3).defer_batch);
        assert!(actions(4).defer_batch && !actions(4).replay_recent);
        let top = actions(MAX_LEVEL);
        assert!(top.replay_recent && top.defer_batch);
        assert_eq!(top.max_tokens, Some(DEGRADED_PARTIAL_MAX_TOKENS));
    }

    #[test]
    fn levels_trigger_with_load_and_clear_below_a_margin() {
        let mut l = Ladder::new(LadderConfig::default());
        assert_eq!(l.observe(0.3), 0);
        assert_eq!(l.observe(0.65), 1);
        assert_eq!(l.observe(0.97), 5, "a spike jumps straight up");
        assert_eq!(l.observe(0.92), 5, "within the margin: stays");
        assert_eq!(l.observe(0.89), 4);
        assert_eq!(l.observe(0.88), 4, "within the margin: stays");
        assert_eq!(l.observe(0.84), 3);
        assert_eq!(l.observe(0.76), 3);
        assert_eq!(l.observe(0.5), 0, "a drop clears every level it is below");
        assert_eq!(l.level(), 0);
    }

    #[test]
    fn premium_tenants_are_degraded_last() {
        assert_eq!(level_for(5, true), 3);
        assert_eq!(level_for(4, true), 2);
        assert_eq!(level_for(1, true), 0);
        assert_eq!(level_for(3, false), 3);
    }
}
