//! The statistics comparisons rest on: quantiles and a paired bootstrap.

use rand::{Rng, SeedableRng};

/// The `q` quantile of `xs` (linear interpolation); 0 for none.
pub fn quantile(xs: &[f64], q: f64) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q.clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// A mean difference with its confidence interval.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interval {
    /// Mean of the paired differences.
    pub mean: f64,
    /// Lower bound.
    pub low: f64,
    /// Upper bound.
    pub high: f64,
}

/// The mean of `diffs` (candidate − baseline per case) and its percentile bootstrap interval
/// at `level` (e.g. 0.95), from `resamples` resamples of the cases. Seeded: the same inputs
/// give the same interval.
pub fn paired_bootstrap(diffs: &[f64], level: f64, resamples: usize) -> Interval {
    let n = diffs.len();
    if n == 0 {
        return Interval {
            mean: 0.0,
            low: 0.0,
            high: 0.0,
        };
    }
    let mean = diffs.iter().sum::<f64>() / n as f64;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x05b7e7);
    let means: Vec<f64> = (0..resamples)
        .map(|_| (0..n).map(|_| diffs[rng.random_range(0..n)]).sum::<f64>() / n as f64)
        .collect();
    let tail = (1.0 - level) / 2.0;
    Interval {
        mean,
        low: quantile(&means, tail),
        high: quantile(&means, 1.0 - tail),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate() {
        assert_eq!(quantile(&[3.0, 1.0, 2.0], 0.5), 2.0);
        assert_eq!(quantile(&[1.0, 2.0], 0.5), 1.5);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }

    #[test]
    fn bootstrap_interval_covers_the_mean_and_separates_real_differences() {
        // 20 cases, the candidate loses 12 and wins none: clearly worse.
        let worse: Vec<f64> = (0..20).map(|i| if i < 12 { -1.0 } else { 0.0 }).collect();
        let i = paired_bootstrap(&worse, 0.95, 2000);
        assert!((i.mean + 0.6).abs() < 1e-9);
        assert!(i.low <= i.mean && i.mean <= i.high);
        assert!(i.high < -0.3, "{i:?}");
        // Two flips each way: no difference, and the interval says so.
        let even: Vec<f64> = (0..20).map(|i| [1.0, -1.0, 0.0, 0.0, 0.0][i % 5]).collect();
        let i = paired_bootstrap(&even, 0.95, 2000);
        assert!(i.low < 0.0 && i.high > 0.0, "{i:?}");
        assert_eq!(i, paired_bootstrap(&even, 0.95, 2000), "seeded");
    }
}
