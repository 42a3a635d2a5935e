//! The degradation ladder in service ([`Ladder`] decides the level). The load observed every [`SAMPLE_EVERY`] is the larger of two shares of a budget: requests in
//! flight over `--max-in-flight` (queue depth), and, when `--ttft-slo` is set, the recent time
//! to first token over it: of the local engine's requests, or the slowest a worker of the pool
//! reports of its own (each a moving average, fading while nothing is measured). A
//! request admitted while the ladder is up is degraded as its level says (premium tenants two
//! levels less) and its response carries `x-osprey-degraded: LEVEL`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use super::{Ladder, LadderConfig};
use osprey_core::{Error, ErrorKind};

/// The header saying a response was degraded, and to which level.
pub const DEGRADED: &str = "x-osprey-degraded";
/// At level 1 and above, the largest `max_tokens` a request keeps.
pub const DEGRADED_MAX_TOKENS: u64 = 256;
/// At level 5, the largest `max_tokens` of a request not answered before: a partial answer.
pub const DEGRADED_PARTIAL_MAX_TOKENS: u64 = 64;
/// How often the load is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Weight of a new measurement in the moving average of TTFT.
const TTFT_WEIGHT: f64 = 0.2;
/// Per sample without a measurement, the average fades by this factor.
const TTFT_FADE: f64 = 0.8;

/// The ladder, its current level, and the TTFT it watches.
#[derive(Debug)]
pub struct Degradation {
    ladder: Mutex<Ladder>,
    level: AtomicU8,
    ttft_slo: Option<Duration>,
    /// Moving average of TTFT (seconds), and whether a token came since the last sample.
    ttft: Mutex<(f64, bool)>,
}

impl Default for Degradation {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Degradation {
    /// A ladder at level 0, holding TTFT to `ttft_slo` if given.
    pub fn new(ttft_slo: Option<Duration>) -> Self {
        Self {
            ladder: Mutex::new(Ladder::new(LadderConfig::default())),
            level: AtomicU8::new(0),
            ttft_slo: ttft_slo.map(|s| s.max(Duration::from_millis(1))),
            ttft: Mutex::new((0.0, false)),
        }
    }

    /// Records a request's time to first token.
    pub fn record_ttft(&self, ttft: Duration) {
        let mut t = self.ttft.lock().expect("ttft lock");
        t.0 += TTFT_WEIGHT * (ttft.as_secs_f64() - t.0);
        t.1 = true;
    }

    /// The recent time to first token here (a moving average).
    pub fn recent_ttft(&self) -> Duration {
        Duration::from_secs_f64(self.ttft.lock().expect("ttft lock").0)
    }

    /// The load to observe: the larger of `in_flight_share` and the recent TTFT's share of the
    /// SLO, if one is set: this server's, or `elsewhere` (the slowest its workers report) if
    /// that is longer. Called once per sample: the TTFT average fades while no request
    /// measures it.
    pub fn load(&self, in_flight_share: f64, elsewhere: Duration) -> f64 {
        let mut t = self.ttft.lock().expect("ttft lock");
        if !std::mem::take(&mut t.1) {
            t.0 *= TTFT_FADE;
        }
        let ttft = t.0.max(elsewhere.as_secs_f64());
        let ttft_share = self.ttft_slo.map_or(0.0, |slo| ttft / slo.as_secs_f64());
        in_flight_share.max(ttft_share)
    }

    /// Observes `load` (0..=1); returns the level, and exports it when it changed.
    pub fn observe(&self, load: f64) -> u8 {
        let level = self.ladder.lock().expect("ladder lock").observe(load);
        if self.level.swap(level, Ordering::Relaxed) != level {
            tracing::info!(level, load, "degradation level changed");
            metrics::gauge!(osprey_core::metrics::DEGRADATION_LEVEL).set(f64::from(level));
        }
        level
    }

    /// The current level (0: not degraded).
    pub fn level(&self) -> u8 {
        self.level.load(Ordering::Relaxed)
    }
}

/// The refusal of batch work at level 4.
pub fn deferred() -> Error {
    Error::new(
        ErrorKind::Unavailable,
        "The service is degraded under load and defers batch work; retry later.",
    )
    .with_code("degraded_batch_deferred")
    .with_retry_after(30)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_first_tokens_raise_the_load_and_fade_when_they_stop() {
        let unwatched = Degradation::default();
        unwatched.record_ttft(Duration::from_secs(30));
        assert_eq!(
            unwatched.load(0.1, Duration::ZERO),
            0.1,
            "no SLO: TTFT is not a load"
        );
        let d = Degradation::new(Some(Duration::from_secs(1)));
        assert_eq!(d.load(0.1, Duration::ZERO), 0.1);
        let slow_worker = d.load(0.1, Duration::from_millis(850));
        assert!(
            (slow_worker - 0.85).abs() < 1e-9,
            "a worker's TTFT counts: {slow_worker}"
        );
        for _ in 0..20 {
            d.record_ttft(Duration::from_millis(950));
        }
        let load = d.load(0.1, Duration::ZERO);
        assert!(load > 0.9, "TTFT near the SLO is a full load: {load}");
        assert_eq!(d.observe(load), 4);
        let mut faded = load;
        for _ in 0..10 {
            faded = d.load(0.1, Duration::ZERO);
        }
        assert!(faded < 0.2, "no requests, no TTFT pressure: {faded}");
        assert_eq!(d.observe(faded), 0);
    }
}
