//! Model tiers for `"model": "auto"`: an ordered list, smallest first, each naming a served model
//! (the local engine, a worker pool, an upstream: the tier does not care).
//!
//! A request starts at the tier its task needs (rewrite, extraction and simple QA at the
//! smallest, code halfway up, reasoning at the top) and goes one tier up when the classifier is
//! less sure than the threshold or the request asks for reasoning (`reasoning_effort` medium or
//! high); a request asking for premium quality goes to the top. Tiers whose model the tenant may
//! not use are skipped (upwards first).
//!
//! Answer-level escalation (opt-in, [`Tiers::with_answer_floor`]): a non-streamed answer whose
//! mean token logprob is below the floor is asked again of the next tier up, before anything
//! reaches the client.

use crate::classifier::Task;

/// One tier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tier {
    /// Its name (`small`, `large`, ...), in `x-osprey-tier`.
    pub name: String,
    /// The served model it sends requests to.
    pub model: String,
}

/// What a request asks of the router besides its text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Asks {
    /// It asks for more reasoning than the default.
    pub reasoning: bool,
    /// It asks for premium quality.
    pub premium: bool,
}

/// The tiers, smallest first, and the confidence below which a request escalates.
#[derive(Clone, Debug)]
pub struct Tiers {
    tiers: Vec<Tier>,
    threshold: f64,
    answer_floor: Option<f64>,
}

/// Where a request goes, and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice<'a> {
    /// The tier.
    pub tier: &'a Tier,
    /// Why, for `x-osprey-route-reason`: `auto: code 0.93`, `auto: simple_qa 0.41 < 0.60,
    /// escalated`, ...
    pub reason: String,
}

impl Tiers {
    /// Tiers in order, smallest first; names must be distinct and the threshold within 0..=1.
    pub fn new(tiers: Vec<Tier>, threshold: f64) -> Result<Self, String> {
        if tiers.is_empty() {
            return Err("at least one tier is needed".into());
        }
        for (i, t) in tiers.iter().enumerate() {
            if tiers[..i].iter().any(|o| o.name == t.name) {
                return Err(format!("tier `{}` is listed twice", t.name));
            }
        }
        if !(0.0..=1.0).contains(&threshold) {
            return Err(format!(
                "the confidence threshold {threshold} is not within 0 and 1"
            ));
        }
        Ok(Self {
            tiers,
            threshold,
            answer_floor: None,
        })
    }

    /// The same tiers, escalating an answer whose mean token logprob is below `floor` (a
    /// negative number: -1.0 is a token probability of 0.37 on average).
    pub fn with_answer_floor(mut self, floor: f64) -> Result<Self, String> {
        if !(floor.is_finite() && floor < 0.0) {
            return Err(format!("the answer logprob floor {floor} is not below 0"));
        }
        self.answer_floor = Some(floor);
        Ok(self)
    }

    /// The mean token logprob below which an answer escalates, if answers are checked.
    pub fn answer_floor(&self) -> Option<f64> {
        self.answer_floor
    }

    /// The first tier above `tier` whose model `allowed` accepts.
    pub fn above(&self, tier: &Tier, allowed: impl Fn(&str) -> bool) -> Option<&Tier> {
        let at = self.tiers.iter().position(|t| t == tier)?;
        self.tiers[at + 1..].iter().find(|t| allowed(&t.model))
    }

    /// The tiers, smallest first.
    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    /// The tier for a request of `task` classified with `confidence`, among those whose model
    /// `allowed` accepts; `None` if it accepts none.
    pub fn choose(
        &self,
        task: Task,
        confidence: f64,
        asks: Asks,
        allowed: impl Fn(&str) -> bool,
    ) -> Option<Choice<'_>> {
        let top = self.tiers.len() - 1;
        let need = match task {
            Task::Rewrite | Task::Extraction | Task::SimpleQa => 0.0,
            Task::Code => 0.5,
            Task::Reasoning => 1.0,
        };
        let mut at = (need * top as f64).round() as usize;
        let mut reason = format!("auto: {} {confidence:.2}", task.as_str());
        if asks.premium {
            at = top;
            reason.push_str(", premium");
        } else {
            let mut why = Vec::new();
            if confidence < self.threshold {
                why.push(format!("< {:.2}", self.threshold));
            }
            if asks.reasoning {
                why.push("reasoning asked".to_owned());
            }
            if !why.is_empty() && at < top {
                at += 1;
                reason.push_str(&format!(" {}, escalated", why.join(", ")));
            }
        }
        let usable = |i: &usize| allowed(&self.tiers[*i].model);
        let found = (at..=top)
            .find(usable)
            .or_else(|| (0..at).rev().find(usable))?;
        Some(Choice {
            tier: &self.tiers[found],
            reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiers(names: &[&str]) -> Tiers {
        let tiers = names
            .iter()
            .map(|n| Tier {
                name: (*n).into(),
                model: format!("{n}-model"),
            })
            .collect();
        Tiers::new(tiers, 0.6).unwrap()
    }

    fn name(c: Option<Choice<'_>>) -> String {
        c.unwrap().tier.name.clone()
    }

    #[test]
    fn the_tier_above_skips_models_not_allowed() {
        let t = tiers(&["small", "medium", "large"]);
        let [small, _, large] = t.tiers() else {
            unreachable!()
        };
        assert_eq!(t.above(small, |_| true).unwrap().name, "medium");
        assert_eq!(
            t.above(small, |m| m != "medium-model").unwrap().name,
            "large"
        );
        assert!(t.above(large, |_| true).is_none());
        assert!(t.clone().with_answer_floor(0.5).is_err());
        assert_eq!(
            t.with_answer_floor(-1.0).unwrap().answer_floor(),
            Some(-1.0)
        );
    }

    #[test]
    fn tasks_start_at_their_tier_and_escalate_when_unsure_or_asked() {
        let t = tiers(&["small", "medium", "large"]);
        let any = |_: &str| true;
        let no = Asks::default();
        assert_eq!(name(t.choose(Task::SimpleQa, 0.9, no, any)), "small");
        assert_eq!(name(t.choose(Task::Code, 0.9, no, any)), "medium");
        assert_eq!(name(t.choose(Task::Reasoning, 0.9, no, any)), "large");
        let unsure = t.choose(Task::Rewrite, 0.4, no, any).unwrap();
        assert_eq!(unsure.tier.name, "medium");
        assert_eq!(unsure.reason, "auto: rewrite 0.40 < 0.60, escalated");
        let reasoning = Asks {
            reasoning: true,
            ..no
        };
        assert_eq!(name(t.choose(Task::Code, 0.9, reasoning, any)), "large");
        let premium = Asks {
            premium: true,
            ..no
        };
        assert_eq!(
            name(t.choose(Task::Extraction, 0.99, premium, any)),
            "large"
        );
    }

    #[test]
    fn tiers_the_tenant_may_not_use_are_skipped() {
        let t = tiers(&["small", "large"]);
        let no_large = |m: &str| m != "large-model";
        assert_eq!(
            name(t.choose(Task::Reasoning, 0.9, Asks::default(), no_large)),
            "small"
        );
        let no_small = |m: &str| m != "small-model";
        assert_eq!(
            name(t.choose(Task::SimpleQa, 0.9, Asks::default(), no_small)),
            "large"
        );
        assert!(
            t.choose(Task::Code, 0.9, Asks::default(), |_| false)
                .is_none()
        );
    }

    #[test]
    fn bad_tier_lists_are_refused() {
        assert!(Tiers::new(Vec::new(), 0.5).is_err());
        let a = Tier {
            name: "a".into(),
            model: "m".into(),
        };
        assert!(Tiers::new(vec![a.clone(), a.clone()], 0.5).is_err());
        assert!(Tiers::new(vec![a], 1.5).is_err());
    }
}
