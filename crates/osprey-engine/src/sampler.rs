//! Choosing the next token: penalties, biases, temperature, top-k/top-p/min-p, seeded RNG.

use std::collections::{HashMap, HashSet, VecDeque};

use osprey_core::SamplingParams;
use osprey_models::eval::argmax;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::structured::{SimpleVob, apply_mask};

/// A token's log-probability and the most likely alternatives at its position.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its log-probability under the model (before penalties and temperature).
    pub logprob: f32,
    /// The `n` most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// The outcome of one sampling step.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The chosen token.
    pub id: u32,
    /// Its log-probability, when the request asked for them.
    pub logprob: Option<TokenLogprob>,
}

/// Tokens of one repeated cycle that make a loop (see [`Sampler::sample`]'s grammar case).
const LOOP_SPAN: usize = 16;
/// Output tokens the loop guard remembers.
const LOOP_WINDOW: usize = 32;
/// Once a sequence has looped, what each recent use of a token takes off its logit.
const LOOP_PENALTY: f32 = 1.0;
/// The longest cycle looked for.
const LOOP_PERIOD: usize = 4;

/// The token that would continue a loop filling the last [`LOOP_SPAN`] tokens of `recent`,
/// if they are one cycle of at most [`LOOP_PERIOD`] tokens repeated.
fn loop_continuation(recent: &VecDeque<u32>) -> Option<u32> {
    let n = recent.len();
    if n < LOOP_SPAN {
        return None;
    }
    (1..=LOOP_PERIOD)
        .find(|&p| (n - LOOP_SPAN + p..n).all(|i| recent[i] == recent[i - p]))
        .map(|p| recent[n - p])
}

/// The per-sequence sampler: its parameters, random state and token history.
pub struct Sampler {
    params: SamplingParams,
    rng: ChaCha8Rng,
    /// Occurrences of each token in the output (presence and frequency penalties).
    output_counts: HashMap<u32, u32>,
    /// Tokens of prompt and output (repetition penalty).
    seen: HashSet<u32>,
    generated: usize,
    /// The last [`LOOP_WINDOW`] output tokens (the loop guard under a grammar).
    recent: VecDeque<u32>,
    /// Whether the loop guard has had to break a loop.
    looped: bool,
    /// Tokens that may not be chosen before `min_tokens` (EOS, end-of-turn, stop ids).
    enders: Vec<u32>,
}

impl Sampler {
    /// A sampler for one sequence. `seed` decides the random stream; `enders` are the tokens
    /// `min_tokens` holds back.
    pub fn new(params: SamplingParams, seed: u64, prompt: &[u32], enders: Vec<u32>) -> Self {
        let seen = if params.repetition_penalty != 1.0 {
            prompt.iter().copied().collect()
        } else {
            HashSet::new()
        };
        Self {
            params,
            rng: ChaCha8Rng::seed_from_u64(seed),
            output_counts: HashMap::new(),
            seen,
            generated: 0,
            recent: VecDeque::with_capacity(LOOP_WINDOW),
            looped: false,
            enders,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Picks the next token from `logits` (modified in place) and records it. With `allowed`
    /// (a grammar's mask), only those tokens can be chosen, and the grammar, not
    /// `min_tokens`, decides when the end may come.
    pub fn sample(&mut self, logits: &mut [f32], allowed: Option<&SimpleVob>) -> Sampled {
        self.choose(logits, allowed, |s, logits| match s.params.is_greedy() {
            true => argmax(logits),
            false => {
                let (cand, total) = s.candidates(logits);
                s.draw(&cand, total)
            }
        })
    }

    /// Like [`Self::sample`], but a draft proposed `draft` for this position: returns the
    /// token chosen and whether it is the draft. Greedy, the draft is accepted when it is the
    /// best token, so the tokens are those [`Self::sample`] would give. Sampling, it is
    /// accepted with the probability the sampling distribution gives it, and on rejection a
    /// token is drawn from that distribution without it (speculative sampling for a proposal
    /// that is certain of its token), so each token's distribution is unchanged.
    pub fn verify(
        &mut self,
        logits: &mut [f32],
        allowed: Option<&SimpleVob>,
        draft: u32,
    ) -> (Sampled, bool) {
        let sampled = self.choose(logits, allowed, |s, logits| {
            if s.params.is_greedy() {
                return argmax(logits);
            }
            let (mut cand, total) = s.candidates(logits);
            let weight = cand.iter().find(|c| c.0 == draft).map_or(0.0, |c| c.1);
            if s.rng.random::<f32>() * total < weight {
                return draft;
            }
            cand.retain(|c| c.0 != draft);
            let rest = total - weight;
            s.draw(&cand, rest)
        });
        let accepted = sampled.id == draft;
        (sampled, accepted)
    }

    /// The steps every choice shares: log-probabilities of the raw logits when asked for,
    /// penalties, the grammar's mask and loop guard, then `pick`, and the record of the token.
    fn choose(
        &mut self,
        logits: &mut [f32],
        allowed: Option<&SimpleVob>,
        pick: impl FnOnce(&mut Self, &[f32]) -> u32,
    ) -> Sampled {
        let raw_stats = self.params.logprobs.map(|n| {
            let lse = log_sum_exp(logits);
            (lse, top_n(logits, n, lse))
        });
        // Only the chosen token's raw logit is needed afterwards; remember them all cheaply
        // only when asked for log-probabilities.
        let raw = raw_stats.as_ref().map(|_| logits.to_vec());
        self.apply_penalties(logits, allowed.is_none());
        if let Some(allowed) = allowed {
            apply_mask(logits, allowed);
            self.break_loop(logits);
        }
        let id = pick(self, logits);
        self.record(id);
        let logprob = raw_stats.zip(raw).map(|((lse, top), raw)| TokenLogprob {
            id,
            logprob: raw[id as usize] - lse,
            top,
        });
        Sampled { id, logprob }
    }

    /// Under a grammar, a model stuck in a loop (`"status": "champion_champion_…"`, `1.0000…`)
    /// would run to `max_tokens` and leave output that does not parse. When the last
    /// [`LOOP_SPAN`] tokens repeat one cycle of at most [`LOOP_PERIOD`] tokens, the token that
    /// would go round again is ruled out, if the grammar allows anything else; and from then
    /// on each token loses [`LOOP_PENALTY`] per use in the last [`LOOP_WINDOW`], so the model
    /// does not slip into a longer cycle but moves on (a closing quote, a closing brace).
    fn break_loop(&mut self, logits: &mut [f32]) {
        let next = loop_continuation(&self.recent);
        self.looped |= next.is_some();
        if self.looped {
            for &t in &self.recent {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l -= LOOP_PENALTY;
                }
            }
        }
        let Some(next) = next else {
            return;
        };
        let alternatives = logits
            .iter()
            .enumerate()
            .any(|(i, l)| i != next as usize && l.is_finite());
        if alternatives && let Some(l) = logits.get_mut(next as usize) {
            *l = f32::NEG_INFINITY;
        }
    }

    fn record(&mut self, id: u32) {
        if self.recent.len() == LOOP_WINDOW {
            self.recent.pop_front();
        }
        self.recent.push_back(id);
        self.generated += 1;
        *self.output_counts.entry(id).or_default() += 1;
        if self.params.repetition_penalty != 1.0 {
            self.seen.insert(id);
        }
    }

    fn apply_penalties(&self, logits: &mut [f32], hold_enders: bool) {
        let p = &self.params;
        for &(id, bias) in &p.logit_bias {
            if let Some(l) = logits.get_mut(id as usize) {
                *l += bias;
            }
        }
        if hold_enders && self.generated < p.min_tokens {
            for &id in &self.enders {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        if p.repetition_penalty != 1.0 {
            for &id in &self.seen {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        if p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            for (&id, &count) in &self.output_counts {
                if let Some(l) = logits.get_mut(id as usize) {
                    *l -= p.presence_penalty + p.frequency_penalty * count as f32;
                }
            }
        }
    }

    /// The tokens sampling may choose with their (unnormalized) weights, best first when a
    /// truncation needed an order, and the weights' total (0 when nothing can be chosen).
    fn candidates(&self, logits: &[f32]) -> (Vec<(u32, f32)>, f32) {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        // Candidates, best first when any truncation needs an order.
        let mut cand: Vec<(u32, f32)> = if p.top_k > 0 {
            let mut all: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect();
            let k = p.top_k.min(all.len());
            all.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
            all.truncate(k);
            all.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
            all
        } else {
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, l))
                .collect()
        };
        let max = cand.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.1));
        if max == f32::NEG_INFINITY {
            return (Vec::new(), 0.0);
        }
        let mut total = 0f32;
        for c in cand.iter_mut() {
            c.1 = osprey_models::kernels::ops::exp((c.1 - max) * inv_t);
            total += c.1;
        }
        if p.min_p > 0.0 {
            // The best candidate has weight exactly 1 after subtracting the max.
            cand.retain(|c| c.1 >= p.min_p);
            total = cand.iter().map(|c| c.1).sum();
        }
        if p.top_p < 1.0 {
            if p.top_k == 0 {
                cand = best_first_prefix(cand, total * p.top_p);
            }
            let mut cum = 0f32;
            let keep = cand
                .iter()
                .position(|c| {
                    cum += c.1;
                    cum >= total * p.top_p
                })
                .map_or(cand.len(), |i| i + 1);
            cand.truncate(keep);
            total = cand.iter().map(|c| c.1).sum();
        }
        (cand, total)
    }

    /// One token from `cand` in proportion to the weights (summing to `total`); token 0 when
    /// there is none.
    fn draw(&mut self, cand: &[(u32, f32)], total: f32) -> u32 {
        let mut u = self.rng.random::<f32>() * total;
        for &(id, w) in cand {
            if u < w {
                return id;
            }
            u -= w;
        }
        cand.last().map_or(0, |c| c.0)
    }
}

/// The highest-weight candidates, sorted best first, enough to reach `mass` (widening the
/// partial sort geometrically instead of sorting the whole vocabulary).
fn best_first_prefix(mut cand: Vec<(u32, f32)>, mass: f32) -> Vec<(u32, f32)> {
    let mut k = 64.min(cand.len());
    loop {
        if k < cand.len() {
            cand.select_nth_unstable_by(k - 1, |a, b| b.1.total_cmp(&a.1));
        }
        let head = &mut cand[..k];
        head.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if head.iter().map(|c| c.1).sum::<f32>() >= mass || k == cand.len() {
            cand.truncate(k);
            return cand;
        }
        k = (k * 4).min(cand.len());
    }
}

/// `log Σ exp(x)`, stable.
pub fn log_sum_exp(x: &[f32]) -> f32 {
    let max = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    if max == f32::NEG_INFINITY {
        return max;
    }
    let sum: f32 = x
        .iter()
        .map(|&v| osprey_models::kernels::ops::exp(v - max))
        .sum();
    max + sum.ln()
}

/// The `n` best tokens as `(id, logprob)`, best first.
pub fn top_n(logits: &[f32], n: usize, lse: f32) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
    let n = n.min(idx.len());
    idx.select_nth_unstable_by(n - 1, |&a, &b| {
        logits[b as usize].total_cmp(&logits[a as usize])
    });
    idx.truncate(n);
    idx.sort_by(|&a, &b| {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    });
    idx.into_iter()
        .map(|i| (i, logits[i as usize] - lse))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(f: impl FnOnce(&mut SamplingParams)) -> SamplingParams {
        let mut p = SamplingParams::default();
        f(&mut p);
        p
    }

    #[test]
    fn greedy_takes_argmax_and_reports_logprobs() {
        let p = params(|p| {
            p.temperature = 0.0;
            p.logprobs = Some(2);
        });
        let mut s = Sampler::new(p, 0, &[], vec![]);
        let out = s.sample(&mut [0.0, 3.0, 1.0], None);
        assert_eq!(out.id, 1);
        let lp = out.logprob.unwrap();
        let expect = 3.0 - (1f32 + 3f32.exp() + 1f32.exp()).ln();
        assert!((lp.logprob - expect).abs() < 1e-5);
        assert_eq!(lp.top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![1, 2]);
    }

    #[test]
    fn greedy_verification_accepts_exactly_the_best_token() {
        let p = params(|p| {
            p.temperature = 0.0;
            p.logprobs = Some(2);
        });
        let logits = [0.0, 3.0, 1.0];
        let plain = Sampler::new(p.clone(), 0, &[], vec![]).sample(&mut logits.clone(), None);
        for draft in 0..3 {
            let mut s = Sampler::new(p.clone(), 0, &[], vec![]);
            let (sampled, accepted) = s.verify(&mut logits.clone(), None, draft);
            assert_eq!(
                sampled, plain,
                "the token and log-probabilities sampling gives"
            );
            assert_eq!(accepted, draft == 1);
        }
    }

    /// Speculative sampling leaves the distribution alone: over many seeds, the tokens chosen
    /// at a position with a draft (each of three) follow the same distribution as without one.
    /// Chi-square against the sampling distribution, 4 degrees of freedom: the bar, 20.5, is
    /// exceeded by chance once in 2,500 runs.
    #[test]
    fn verification_keeps_the_sampling_distribution() {
        let p = params(|p| {
            p.temperature = 0.8;
            p.top_p = 0.95;
        });
        let logits = [1.0f32, 0.2, 2.0, -0.5, 1.4, -3.0];
        // The distribution sampling draws from: temperature, then the 95% nucleus.
        let s = Sampler::new(p.clone(), 0, &[], vec![]);
        let (cand, total) = s.candidates(&logits);
        let mut want = [0f64; 6];
        for &(id, w) in &cand {
            want[id as usize] = (w / total) as f64;
        }
        let n = 20_000;
        let chi_square = |counts: &[u32; 6]| -> f64 {
            (want.iter().zip(counts))
                .filter(|(p, _)| **p > 0.0)
                .map(|(p, &c)| {
                    let e = p * n as f64;
                    (c as f64 - e).powi(2) / e
                })
                .sum()
        };
        let mut plain = [0u32; 6];
        for seed in 0..n {
            let id = Sampler::new(p.clone(), seed, &[], vec![])
                .sample(&mut logits.clone(), None)
                .id;
            plain[id as usize] += 1;
        }
        assert!(chi_square(&plain) < 20.5, "plain {plain:?}");
        for draft in [2, 0, 5] {
            let (mut counts, mut accepted) = ([0u32; 6], 0);
            for seed in 0..n {
                let mut s = Sampler::new(p.clone(), seed, &[], vec![]);
                let (sampled, ok) = s.verify(&mut logits.clone(), None, draft);
                counts[sampled.id as usize] += 1;
                accepted += u32::from(ok);
            }
            let chi = chi_square(&counts);
            assert!(chi < 20.5, "draft {draft}: {counts:?}, chi-square {chi}");
            let rate = accepted as f64 / n as f64;
            assert!(
                (rate - want[draft as usize]).abs() < 0.02,
                "draft {draft} accepted at {rate}, its probability {}",
                want[draft as usize]
            );
        }
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32 / 20.0).collect();
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams::default(), seed, &[], vec![]);
            (0..50)
                .map(|_| s.sample(&mut logits.clone(), None).id)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_and_bias_and_min_tokens() {
        let mut s = Sampler::new(params(|p| p.top_k = 1), 1, &[], vec![]);
        assert_eq!(s.sample(&mut [0.0, 5.0, 1.0], None).id, 1);
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.logit_bias = vec![(2, 10.0)];
            }),
            1,
            &[],
            vec![],
        );
        assert_eq!(s.sample(&mut [0.0, 5.0, 1.0], None).id, 2);
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.min_tokens = 1;
            }),
            1,
            &[],
            vec![1],
        );
        assert_eq!(s.sample(&mut [0.0, 5.0, 1.0], None).id, 2, "EOS held back");
        assert_eq!(s.sample(&mut [0.0, 5.0, 1.0], None).id, 1, "then allowed");
    }

    #[test]
    fn top_p_keeps_only_the_nucleus() {
        // Token 0 carries ~88% of the mass: top_p 0.5 must always pick it.
        let mut s = Sampler::new(params(|p| p.top_p = 0.5), 3, &[], vec![]);
        for _ in 0..100 {
            assert_eq!(s.sample(&mut [4.0, 1.0, 1.0, 0.0], None).id, 0);
        }
    }

    #[test]
    fn a_loop_under_a_grammar_is_broken_and_only_there() {
        let cycle =
            |p: usize| -> VecDeque<u32> { (0..LOOP_SPAN as u32).map(|i| i % p as u32).collect() };
        assert_eq!(loop_continuation(&cycle(1)), Some(0));
        assert_eq!(loop_continuation(&cycle(3)), Some(16 % 3));
        assert_eq!(
            loop_continuation(&cycle(LOOP_PERIOD + 1)),
            None,
            "a longer cycle is not a loop"
        );
        let mut short = cycle(1);
        short.pop_back();
        assert_eq!(loop_continuation(&short), None, "too short to tell");

        let params = SamplingParams {
            temperature: 0.0,
            ..SamplingParams::default()
        };
        let mut s = Sampler::new(params.clone(), 0, &[], Vec::new());
        let mut all = SimpleVob::alloc(3);
        all.allow_token(0);
        all.allow_token(1);
        let mut only_zero = SimpleVob::alloc(3);
        only_zero.allow_token(0);
        let picks: Vec<u32> = (0..LOOP_SPAN + 2)
            .map(|_| s.sample(&mut [2.0, 1.0, 0.0], Some(&all)).id)
            .collect();
        assert_eq!(picks[..LOOP_SPAN], [0; LOOP_SPAN]);
        assert_eq!(
            picks[LOOP_SPAN], 1,
            "the loop is broken by the grammar's next choice"
        );
        let mut s = Sampler::new(params.clone(), 0, &[], Vec::new());
        for _ in 0..LOOP_SPAN + 2 {
            assert_eq!(
                s.sample(&mut [2.0, 1.0, 0.0], Some(&only_zero)).id,
                0,
                "nothing else is allowed"
            );
        }
        let mut s = Sampler::new(params.clone(), 0, &[], Vec::new());
        for _ in 0..LOOP_SPAN + 2 {
            assert_eq!(
                s.sample(&mut [2.0, 1.0, 0.0], None).id,
                0,
                "free text is left alone"
            );
        }
    }

    #[test]
    fn penalties_push_repeats_down() {
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.frequency_penalty = 2.0;
            }),
            0,
            &[],
            vec![],
        );
        assert_eq!(s.sample(&mut [1.0, 0.5], None).id, 0);
        assert_eq!(
            s.sample(&mut [1.0, 0.5], None).id,
            1,
            "token 0 penalised after use"
        );
        let mut s = Sampler::new(
            params(|p| {
                p.temperature = 0.0;
                p.repetition_penalty = 4.0;
            }),
            0,
            &[0],
            vec![],
        );
        assert_eq!(
            s.sample(&mut [1.0, 0.5], None).id,
            1,
            "prompt token penalised"
        );
    }
}
