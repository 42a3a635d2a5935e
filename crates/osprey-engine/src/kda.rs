//! The signals of KDA (key-dependency-aware) scheduling, and the arithmetic on them.
//!
//! The `kda` policy of the [`Scheduler`](crate::scheduler::Scheduler) composes each step from
//! three signals the engine loop gathers from the forward pass:
//!
//! - **Expert forecast** ([`ExpertForecast`]): per sequence, an exponential average of the experts
//!   its recent tokens were routed to, one value per expert slot (`moe_layer · experts +
//!   expert`). Its next decode step will most likely use the same ones (consecutive tokens of a
//!   text route alike), so the sum of the forecasts of a candidate batch predicts each expert's
//!   load in that step ([`ExpertLoad`]).
//! - **Attention heat** ([`BlockHeat`]): per sequence, the attention mass its newest token puts on
//!   each of its KV blocks, sampled every `heat_interval` steps and averaged over samples. The KV
//!   manager keeps it per physical block, so cached blocks nobody attends to are evicted first.
//! - **Deadlines**: interactive requests are the critical path and run first, earliest deadline
//!   first; batch requests are demoted to a lower class until their own deadline passes, when
//!   they are promoted, so nothing starves.
//!
//! With the forecast, the scheduler fills the step's batch with the demoted sequences whose
//! experts are already in use by the sequences scheduled before them ([`ExpertLoad::overlap`]),
//! and keeps every expert under its capacity, `expert_capacity` times its fair share
//! `top_k · tokens / experts` ([`ExpertLoad::fitting`]): a prompt chunk is cut to what fits, a
//! decode that does not fit waits a step. A sequence is deferred at most `max_deferrals` steps
//! in a row. A demoted prompt whose routing is not known yet starts with a short chunk, so that
//! its forecast is known before it takes a large share of a step.
//!
//! What a step really routed is measured after it ([`RoutedLoad`]): expert-load imbalance (the
//! busiest expert's tokens over the mean, per MoE layer) and the experts each layer ran.

use std::time::Duration;

/// Settings of the `kda` policy.
#[derive(Clone, Debug, PartialEq)]
pub struct KdaConfig {
    /// The most tokens one expert may be forecast to take in a step, as a multiple of its fair
    /// share (`top_k · tokens / experts`). Demoted sequences that would push an expert past it
    /// wait a step.
    pub expert_capacity: f32,
    /// Steps a sequence may be deferred in a row before it runs regardless.
    pub max_deferrals: u32,
    /// Steps between attention-heat samples (0: never sample).
    pub heat_interval: usize,
    /// The first-token deadline of an interactive request that names none (`osprey.deadline_ms`).
    pub interactive_deadline: Duration,
}

impl Default for KdaConfig {
    fn default() -> Self {
        Self {
            expert_capacity: 2.0,
            max_deferrals: 4,
            heat_interval: 16,
            interactive_deadline: Duration::from_secs(2),
        }
    }
}

/// How a model's MoE layers are laid out: `(experts, top_k)` per MoE layer, in order. Expert
/// slot `s` of layer `m` is `m · experts + s`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExpertLayout {
    /// Experts per MoE layer (every layer the same).
    pub experts: usize,
    /// Experts each token is routed to, per layer.
    pub top_k: usize,
    /// MoE layers.
    pub layers: usize,
}

impl ExpertLayout {
    /// The layout of `(experts, top_k)` per layer, if the model has MoE layers and they agree.
    pub fn from_layers(layers: &[(usize, usize)]) -> Option<Self> {
        let &(experts, top_k) = layers.first()?;
        if experts == 0 || layers.iter().any(|&l| l != (experts, top_k)) {
            return None;
        }
        Some(Self {
            experts,
            top_k,
            layers: layers.len(),
        })
    }

    /// Expert slots over all MoE layers.
    pub fn slots(&self) -> usize {
        self.experts * self.layers
    }

    /// One token's expected load on each slot when nothing is known of it: `top_k / experts`.
    fn uniform(&self) -> f32 {
        self.top_k as f32 / self.experts as f32
    }
}

/// A sequence's expected use of each expert slot in its next step: an exponential average of
/// how many of each of its recent tokens went to the slot (so each layer's entries sum to
/// `top_k`). Empty until the sequence has run a step on an MoE model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ExpertForecast {
    load: Vec<f32>,
}

impl ExpertForecast {
    /// Weight of the newest step in the average.
    const NEWEST: f32 = 0.5;

    /// Folds in the slots of `rows` tokens that ran this step (`slots` holds `rows · layers ·
    /// top_k` entries, row-major).
    pub fn observe(&mut self, layout: &ExpertLayout, slots: &[u32], rows: usize) {
        if rows == 0 {
            return;
        }
        let mut step = vec![0f32; layout.slots()];
        for &s in slots {
            if let Some(v) = step.get_mut(s as usize) {
                *v += 1.0 / rows as f32;
            }
        }
        if self.load.len() != step.len() {
            self.load = step;
            return;
        }
        for (l, s) in self.load.iter_mut().zip(step) {
            *l = (1.0 - Self::NEWEST).mul_add(*l, Self::NEWEST * s);
        }
    }

    /// The forecast, once something has been observed.
    pub fn load(&self) -> Option<&[f32]> {
        (!self.load.is_empty()).then_some(&self.load[..])
    }
}

/// The forecast load of each expert slot in a step being planned.
#[derive(Clone, Debug)]
pub struct ExpertLoad {
    layout: ExpertLayout,
    load: Vec<f32>,
    /// The most tokens one slot may take.
    capacity: f32,
}

impl ExpertLoad {
    /// An empty step whose candidates bring `tokens` tokens in all, each slot capped at
    /// `capacity` times its fair share of them.
    pub fn new(layout: ExpertLayout, tokens: usize, capacity: f32) -> Self {
        let fair = tokens as f32 * layout.uniform();
        Self {
            load: vec![0.0; layout.slots()],
            capacity: (capacity * fair).max(1.0),
            layout,
        }
    }

    /// Whether `n` tokens of a sequence forecast as `f` keep every slot within capacity.
    pub fn fits(&self, f: Option<&[f32]>, n: usize) -> bool {
        self.fitting(f, n) == n
    }

    /// The most of `n` tokens forecast as `f` that keep every slot within capacity (`n` when
    /// all fit, 0 when none does).
    pub fn fitting(&self, f: Option<&[f32]>, n: usize) -> usize {
        let u = [self.layout.uniform()];
        let per_token: Box<dyn Iterator<Item = (&f32, &f32)>> = match f {
            Some(f) => Box::new(self.load.iter().zip(f)),
            None => Box::new(self.load.iter().zip(u.iter().cycle())),
        };
        let room = per_token
            .filter(|(_, x)| **x > 0.0)
            .map(|(l, x)| ((self.capacity - l).max(0.0) / x).floor())
            .fold(f32::INFINITY, f32::min);
        if room.is_finite() {
            (room as usize).min(n)
        } else {
            n
        }
    }

    /// Adds `n` tokens forecast as `f` (uniform when unknown).
    pub fn add(&mut self, f: Option<&[f32]>, n: usize) {
        let n = n as f32;
        match f {
            Some(f) => {
                for (l, x) in self.load.iter_mut().zip(f) {
                    *l = x.mul_add(n, *l);
                }
            }
            None => {
                let u = self.layout.uniform() * n;
                self.load.iter_mut().for_each(|l| *l += u);
            }
        }
    }

    /// The share of a sequence's forecast expert use that falls on slots this step already
    /// uses: 1 when it needs no expert the step would not read anyway. Unknown forecasts
    /// score 0.
    pub fn overlap(&self, f: Option<&[f32]>) -> f32 {
        let Some(f) = f else { return 0.0 };
        let total: f32 = f.iter().sum();
        if total <= 0.0 {
            return 0.0;
        }
        let shared: f32 = (self.load.iter().zip(f))
            .filter(|(l, _)| **l > 0.0)
            .map(|(_, x)| x)
            .sum();
        shared / total
    }
}

/// Orders demoted candidates for a step greedily: each next one is the candidate (among those
/// not yet taken) whose forecast overlaps most with `load` plus the candidates before it,
/// ties to the earlier index. Returns indexes into `forecasts`.
pub fn share_experts_order(
    mut load: ExpertLoad,
    forecasts: &[(Option<&[f32]>, usize)],
) -> Vec<usize> {
    let mut left: Vec<usize> = (0..forecasts.len()).collect();
    let mut order = Vec::with_capacity(left.len());
    while !left.is_empty() {
        let (pos, _) = left
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |best, (pos, &i)| {
                let o = load.overlap(forecasts[i].0);
                if o > best.1 { (pos, o) } else { best }
            });
        let i = left.remove(pos);
        load.add(forecasts[i].0, forecasts[i].1);
        order.push(i);
    }
    order
}

/// What one step's tokens were really routed to.
#[derive(Clone, Debug, PartialEq)]
pub struct RoutedLoad {
    /// Mean over MoE layers of the busiest expert's tokens over the mean expert's.
    pub imbalance: f32,
    /// Mean over MoE layers of the experts that received at least one token.
    pub active_experts: f32,
}

impl RoutedLoad {
    /// Measures a step from every token's slots (`layout.layers · top_k` per token).
    pub fn measure(layout: &ExpertLayout, slots: &[u32]) -> Option<Self> {
        if slots.is_empty() {
            return None;
        }
        let mut counts = vec![0u32; layout.slots()];
        for &s in slots {
            if let Some(c) = counts.get_mut(s as usize) {
                *c += 1;
            }
        }
        let (mut imbalance, mut active) = (0f32, 0f32);
        for layer in counts.chunks_exact(layout.experts) {
            let total: u32 = layer.iter().sum();
            let max = layer.iter().copied().max().unwrap_or(0);
            if total > 0 {
                imbalance += max as f32 * layout.experts as f32 / total as f32;
            }
            active += layer.iter().filter(|&&c| c > 0).count() as f32;
        }
        let layers = layout.layers.max(1) as f32;
        Some(Self {
            imbalance: imbalance / layers,
            active_experts: active / layers,
        })
    }
}

/// A sequence's attention heat per logical KV block: an exponential average of the attention
/// mass its newest token put on each block, over the samples taken.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BlockHeat {
    heat: Vec<f32>,
}

impl BlockHeat {
    /// Weight of the newest sample in the average.
    const NEWEST: f32 = 0.5;

    /// Folds in a sample: `mass[b]` for each logical block `b` (summing to 1). Blocks new
    /// since the last sample start from their first sample.
    pub fn observe(&mut self, mass: &[f32]) {
        let old = self.heat.len().min(mass.len());
        self.heat.truncate(mass.len());
        for (h, &m) in self.heat.iter_mut().zip(mass) {
            *h = (1.0 - Self::NEWEST).mul_add(*h, Self::NEWEST * m);
        }
        self.heat.extend_from_slice(&mass[old..]);
    }

    /// Heat per logical block (empty before the first sample).
    pub fn per_block(&self) -> &[f32] {
        &self.heat
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> ExpertLayout {
        ExpertLayout {
            experts: 4,
            top_k: 1,
            layers: 2,
        }
    }

    #[test]
    fn layouts_need_agreeing_moe_layers() {
        assert_eq!(ExpertLayout::from_layers(&[]), None);
        assert_eq!(ExpertLayout::from_layers(&[(8, 2), (4, 2)]), None);
        assert_eq!(
            ExpertLayout::from_layers(&[(8, 2), (8, 2)]).map(|l| l.slots()),
            Some(16)
        );
    }

    #[test]
    fn a_forecast_follows_recent_routing() {
        let l = layout();
        let mut f = ExpertForecast::default();
        assert_eq!(f.load(), None);
        // Layer 0 → expert 1, layer 1 → expert 2 (slot 4 + 2).
        f.observe(&l, &[1, 6], 1);
        assert_eq!(f.load().unwrap(), &[0., 1., 0., 0., 0., 0., 1., 0.]);
        f.observe(&l, &[3, 6], 1);
        assert_eq!(f.load().unwrap(), &[0., 0.5, 0., 0.5, 0., 0., 1., 0.]);
        // A prefill chunk of two rows counts each row half.
        let mut g = ExpertForecast::default();
        g.observe(&l, &[0, 4, 1, 4], 2);
        assert_eq!(g.load().unwrap(), &[0.5, 0.5, 0., 0., 1., 0., 0., 0.]);
    }

    #[test]
    fn capacity_refuses_a_sequence_that_overloads_a_hot_expert() {
        // 8 tokens, 4 experts, top-1: fair share 2 per slot; capacity 1.5× → 3.
        let mut load = ExpertLoad::new(layout(), 8, 1.5);
        let hot = [1., 0., 0., 0., 1., 0., 0., 0.];
        let cold = [0., 0., 0., 1., 0., 0., 0., 1.];
        for _ in 0..3 {
            assert!(load.fits(Some(&hot), 1));
            load.add(Some(&hot), 1);
        }
        assert!(
            !load.fits(Some(&hot), 1),
            "a fourth token on expert 0 exceeds 3"
        );
        assert!(load.fits(Some(&cold), 1));
        assert!(
            !load.fits(None, 4),
            "unknown tokens land on the hot expert too"
        );
        let empty = ExpertLoad::new(layout(), 8, 1.5);
        assert!(empty.fits(None, 12), "twelve unknown tokens add 3 per slot");
        assert!(!empty.fits(None, 16), "sixteen add 4");
        assert_eq!(empty.fitting(None, 16), 12);
        assert_eq!(load.fitting(Some(&hot), 5), 0);
        assert_eq!(load.fitting(Some(&cold), 5), 3);
        assert_eq!(load.fitting(Some(&cold), 2), 2);
    }

    #[test]
    fn overlap_prefers_experts_already_in_use() {
        let mut load = ExpertLoad::new(layout(), 4, 2.0);
        let a = [1., 0., 0., 0., 1., 0., 0., 0.];
        let b = [0., 1., 0., 0., 1., 0., 0., 0.];
        let c = [0., 0., 1., 0., 0., 0., 1., 0.];
        load.add(Some(&a), 1);
        assert_eq!(load.overlap(Some(&a)), 1.0);
        assert_eq!(load.overlap(Some(&b)), 0.5);
        assert_eq!(load.overlap(Some(&c)), 0.0);
        assert_eq!(load.overlap(None), 0.0);
        let order = share_experts_order(load, &[(Some(&c), 1), (Some(&b), 1), (Some(&a), 1)]);
        assert_eq!(order, [2, 1, 0]);
    }

    #[test]
    fn routed_load_measures_imbalance_and_active_experts() {
        let l = layout();
        // Four tokens: layer 0 all on expert 0 (imbalance 4, 1 active); layer 1 spread evenly
        // (imbalance 1, 4 active).
        let slots = [0, 4, 0, 5, 0, 6, 0, 7];
        let r = RoutedLoad::measure(&l, &slots).unwrap();
        assert_eq!(r.imbalance, 2.5);
        assert_eq!(r.active_experts, 2.5);
        assert_eq!(RoutedLoad::measure(&l, &[]), None);
    }

    #[test]
    fn heat_averages_samples_and_takes_new_blocks_as_they_come() {
        let mut h = BlockHeat::default();
        h.observe(&[0.5, 0.5]);
        h.observe(&[0.0, 0.5, 0.5]);
        assert_eq!(h.per_block(), &[0.25, 0.5, 0.5]);
        h.observe(&[1.0]);
        assert_eq!(
            h.per_block(),
            &[0.625],
            "a recomputed, shorter sequence drops its tail"
        );
    }
}
