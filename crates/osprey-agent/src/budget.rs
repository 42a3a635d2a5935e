//! What a run may spend ([`Budget`]), what it has spent ([`Spent`]), and the reason it stops
//! when one runs out ([`StopReason`]).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Limits of one run. Every field is a ceiling; the defaults suit an interactive request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Budget {
    /// Decisions the model may take (each one a model call).
    pub steps: u32,
    /// Model tokens, prompt and output, over all steps.
    pub tokens: u64,
    /// Seconds the run may be working (time paused for approval does not count).
    pub wall_seconds: f64,
    /// Tool calls the run may make (retries not counted; see `retries`).
    pub tool_calls: u32,
    /// Retries of failed tool calls, over the whole run.
    pub retries: u32,
    /// Cost in the config's currency: model tokens at their price plus each tool's cost
    /// (unlimited when absent, written `null`).
    #[serde(with = "unbounded")]
    pub cost: f64,
}

/// An `f64` limit where `null` (or absence) means no limit.
mod unbounded {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        match v.is_finite() {
            true => s.serialize_f64(*v),
            false => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            steps: 8,
            tokens: 16_384,
            wall_seconds: 120.0,
            tool_calls: 16,
            retries: 2,
            cost: f64::INFINITY,
        }
    }
}

impl Budget {
    /// This budget, each limit capped by `ceiling`'s (a request cannot raise the operator's).
    pub fn capped_by(&self, ceiling: &Budget) -> Budget {
        Budget {
            steps: self.steps.min(ceiling.steps),
            tokens: self.tokens.min(ceiling.tokens),
            wall_seconds: self.wall_seconds.min(ceiling.wall_seconds),
            tool_calls: self.tool_calls.min(ceiling.tool_calls),
            retries: self.retries.min(ceiling.retries),
            cost: self.cost.min(ceiling.cost),
        }
    }

    /// The first limit `spent` has reached, if any.
    pub fn exhausted(&self, spent: &Spent) -> Option<StopReason> {
        if spent.steps >= self.steps {
            Some(StopReason::MaxSteps)
        } else if spent.tokens >= self.tokens {
            Some(StopReason::MaxTokens)
        } else if spent.working >= self.wall_time() {
            Some(StopReason::MaxWallTime)
        } else if spent.cost >= self.cost {
            Some(StopReason::MaxCost)
        } else {
            None
        }
    }

    /// The wall-time limit.
    pub fn wall_time(&self) -> Duration {
        Duration::try_from_secs_f64(self.wall_seconds.max(0.0)).unwrap_or(Duration::MAX)
    }

    /// Checks the limits are usable; the message names the bad field.
    pub fn validate(&self) -> Result<(), String> {
        if self.wall_seconds.is_nan() || self.wall_seconds <= 0.0 {
            return Err("budget.wall_seconds must be positive".into());
        }
        if self.cost.is_nan() || self.cost < 0.0 {
            return Err("budget.cost must be zero or more".into());
        }
        if self.steps == 0 {
            return Err("budget.steps must be at least 1".into());
        }
        Ok(())
    }
}

/// What a run has used so far.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Spent {
    /// Decisions taken.
    pub steps: u32,
    /// Model tokens (prompt and output).
    pub tokens: u64,
    /// Of those, output tokens.
    pub output_tokens: u64,
    /// Time spent working.
    #[serde(with = "millis")]
    pub working: Duration,
    /// Tool calls made.
    pub tool_calls: u32,
    /// Retries made.
    pub retries: u32,
    /// Cost so far.
    pub cost: f64,
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(d.as_millis() as u64)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        Ok(Duration::from_millis(u64::deserialize(d)?))
    }
}

/// Why a run ended without finishing on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The step budget ran out.
    MaxSteps,
    /// The token budget ran out.
    MaxTokens,
    /// The wall-time budget ran out.
    MaxWallTime,
    /// The tool-call budget ran out.
    MaxToolCalls,
    /// The cost budget ran out.
    MaxCost,
}

impl StopReason {
    /// Its name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxSteps => "max_steps",
            Self::MaxTokens => "max_tokens",
            Self::MaxWallTime => "max_wall_time",
            Self::MaxToolCalls => "max_tool_calls",
            Self::MaxCost => "max_cost",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_stops_the_run_with_its_reason() {
        let b = Budget {
            steps: 3,
            tokens: 100,
            wall_seconds: 1.0,
            tool_calls: 2,
            retries: 1,
            cost: 0.5,
        };
        assert_eq!(b.exhausted(&Spent::default()), None);
        let cases = [
            (
                Spent {
                    steps: 3,
                    ..Spent::default()
                },
                StopReason::MaxSteps,
            ),
            (
                Spent {
                    tokens: 100,
                    ..Spent::default()
                },
                StopReason::MaxTokens,
            ),
            (
                Spent {
                    working: Duration::from_secs(2),
                    ..Spent::default()
                },
                StopReason::MaxWallTime,
            ),
            (
                Spent {
                    cost: 0.5,
                    ..Spent::default()
                },
                StopReason::MaxCost,
            ),
        ];
        for (spent, reason) in cases {
            assert_eq!(b.exhausted(&spent), Some(reason));
        }
        let json = serde_json::to_string(&Budget::default()).unwrap();
        assert_eq!(
            serde_json::from_str::<Budget>(&json).unwrap(),
            Budget::default(),
            "{json}"
        );
        let asked = Budget {
            steps: 100,
            ..b.clone()
        };
        assert_eq!(
            asked.capped_by(&b).steps,
            3,
            "a request cannot raise the ceiling"
        );
        assert!(Budget { steps: 0, ..b }.validate().is_err());
    }
}
