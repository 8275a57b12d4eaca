//! What a training step optimises, as one typed value: the policy term with its own
//! parameters, the advantage estimator, how tokens are weighted, the KL term and where it
//! applies, the entropy bonus, the reward's shaping and the importance correction.
//!
//! The trainer's config is lowered into an [`Objective`] once; the trainer and the learner
//! read it and nothing else for these choices. A variant carries only the parameters it
//! uses, so a combination that means nothing (SAPO's temperatures on a clipped loss, a KL
//! target with the KL in the loss) cannot be built.

use crate::correction::RolloutCorrection;
use crate::loss::{AdaptiveKl, AdvantageMode, Aggregation, KlEstimator, LossKind, LossSettings, SAPO_TEMPERATURES};

/// The policy term of the loss, with its parameters (docs/ALGORITHMS.md).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PolicyTerm {
    /// PPO's clipped ratio per token (GRPO, DAPO's clip-higher).
    Grpo { clip_low: f64, clip_high: f64 },
    /// The same clip on the sequence's ratio (GSPO).
    Gspo { clip_low: f64, clip_high: f64 },
    /// The importance weight clipped above and detached, times log π (CISPO).
    Cispo { clip_high: f64 },
    /// A soft gate on the ratio, one temperature for positive advantages and one for the
    /// rest (SAPO).
    Sapo { temperature_pos: f64, temperature_neg: f64 },
}

impl PolicyTerm {
    pub fn kind(&self) -> LossKind {
        match self {
            PolicyTerm::Grpo { .. } => LossKind::Grpo,
            PolicyTerm::Gspo { .. } => LossKind::Gspo,
            PolicyTerm::Cispo { .. } => LossKind::Cispo,
            PolicyTerm::Sapo { .. } => LossKind::Sapo,
        }
    }
}

/// Where the KL to the reference model applies, and how strongly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KlTerm {
    /// No KL term: no reference model is kept.
    Off,
    /// `β × estimate` per token in the loss (GRPO's, TRL's).
    InLoss { beta: f64, estimator: KlEstimator },
    /// Each completion's reward less `β ×` its summed estimate, before the advantages
    /// (verl's `use_kl_in_reward`); β adapts towards `target` where one is given.
    InReward { beta: f64, estimator: KlEstimator, target: Option<KlTarget> },
}

/// verl's adaptive KL controller: β moves towards a mean KL per token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlTarget {
    /// The mean KL per token β steers towards.
    pub kl: f64,
    /// How many completions β takes to move by the clipped relative error.
    pub horizon: usize,
}

impl KlTerm {
    /// β as configured (0 without a KL term).
    pub fn beta(&self) -> f64 {
        match *self {
            KlTerm::Off => 0.0,
            KlTerm::InLoss { beta, .. } | KlTerm::InReward { beta, .. } => beta,
        }
    }

    /// Whether a reference model is kept (any KL term).
    pub fn needs_reference(&self) -> bool {
        self.beta() > 0.0
    }

    /// The estimator, where there is a KL term (k3 otherwise: what the loss names when off).
    pub fn estimator(&self) -> KlEstimator {
        match *self {
            KlTerm::Off => KlEstimator::default(),
            KlTerm::InLoss { estimator, .. } | KlTerm::InReward { estimator, .. } => estimator,
        }
    }

    /// The adaptive controller of a KL in the reward with a target, starting at `start` (the
    /// configured β, or where a resumed run's steps took it).
    pub fn controller(&self, start: Option<f64>) -> Option<AdaptiveKl> {
        match *self {
            KlTerm::InReward { beta, target: Some(target), .. } => {
                Some(AdaptiveKl { value: start.unwrap_or(beta), target: target.kl, horizon: target.horizon as f64 })
            }
            _ => None,
        }
    }
}

/// DAPO's overlong shaping: the last `buffer` tokens before a task's `max_tokens` cost a
/// completion's reward up to `penalty`, linearly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Overlong {
    pub buffer: usize,
    pub penalty: f64,
}

/// The importance weights of groups whose sampler's log-probs differ from the learner's.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Correction {
    /// TRL's modes over every group whose sampler's log-probs are known.
    pub rollout: RolloutCorrection,
    /// The truncation of lagged groups' weights when `rollout` is off.
    pub tis_cap: f64,
}

/// What a step optimises.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Objective {
    pub policy: PolicyTerm,
    pub advantage: AdvantageMode,
    pub aggregation: Aggregation,
    pub kl: KlTerm,
    /// The entropy bonus's coefficient (0: none).
    pub entropy: f64,
    /// DAPO's overlong shaping of the reward; none: off.
    pub overlong: Option<Overlong>,
    /// Completions cut at `max_tokens` carry no loss (they still count in their group's
    /// advantages): TRL's `mask_truncated_completions`.
    pub mask_truncated: bool,
    pub correction: Correction,
}

impl Objective {
    /// The loss's settings: the policy term's parameters, and β where the KL is in the loss
    /// (a KL in the reward was taken before the advantages: none in the loss).
    pub fn loss_settings(&self) -> LossSettings {
        let (clip_low, clip_high, sapo_temperatures) = match self.policy {
            PolicyTerm::Grpo { clip_low, clip_high } | PolicyTerm::Gspo { clip_low, clip_high } => {
                (clip_low, clip_high, SAPO_TEMPERATURES)
            }
            // CISPO has no lower bound; SAPO no clip.
            PolicyTerm::Cispo { clip_high } => (0.0, clip_high, SAPO_TEMPERATURES),
            PolicyTerm::Sapo { temperature_pos, temperature_neg } => (0.0, 0.0, [temperature_pos, temperature_neg]),
        };
        let beta = match self.kl {
            KlTerm::InLoss { beta, .. } => beta,
            KlTerm::Off | KlTerm::InReward { .. } => 0.0,
        };
        LossSettings {
            clip_low,
            clip_high,
            beta,
            entropy: self.entropy,
            kind: self.policy.kind(),
            kl: self.kl.estimator(),
            sapo_temperatures,
        }
    }

    /// The KL in the reward's β and estimator, where it is there.
    pub fn kl_in_reward(&self) -> Option<(f64, KlEstimator)> {
        match self.kl {
            KlTerm::InReward { beta, estimator, .. } => Some((beta, estimator)),
            _ => None,
        }
    }
}

/// A choice's name as a config writes it (its serde name).
fn named<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_else(|| "?".into())
}

/// The objective as `wirl train --check` shows it: a line per choice, with its parameters.
impl std::fmt::Display for Objective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let policy = match self.policy {
            PolicyTerm::Grpo { clip_low, clip_high } => {
                format!("grpo, the ratio clipped to [1 - {clip_low}, 1 + {clip_high}]")
            }
            PolicyTerm::Gspo { clip_low, clip_high } => {
                format!("gspo, the sequence's ratio clipped to [1 - {clip_low}, 1 + {clip_high}]")
            }
            PolicyTerm::Cispo { clip_high } => format!("cispo, the importance weight capped at 1 + {clip_high}"),
            PolicyTerm::Sapo { temperature_pos, temperature_neg } => {
                format!("sapo, gate temperatures {temperature_pos} (positive advantages) and {temperature_neg}")
            }
        };
        writeln!(f, "  policy term:  {policy}")?;
        writeln!(f, "  advantage:    {}", named(&self.advantage))?;
        writeln!(f, "  aggregation:  {}", named(&self.aggregation))?;
        let kl = match self.kl {
            KlTerm::Off => "none (no reference model)".to_string(),
            KlTerm::InLoss { beta, estimator } => format!("in the loss, beta {beta}, estimator {}", named(&estimator)),
            KlTerm::InReward { beta, estimator, target } => {
                let adapts = target.map_or(String::from(", fixed"), |t| {
                    format!(", adapting towards {} per token over {} completions", t.kl, t.horizon)
                });
                format!("in the reward, beta {beta}{adapts}, estimator {}", named(&estimator))
            }
        };
        writeln!(f, "  kl:           {kl}")?;
        writeln!(f, "  entropy:      {}", self.entropy)?;
        match self.overlong {
            Some(o) => writeln!(f, "  overlong:     the last {} tokens cost up to {}", o.buffer, o.penalty)?,
            None => writeln!(f, "  overlong:     off")?,
        }
        let truncated = if self.mask_truncated { "masked (no loss)" } else { "trained" };
        writeln!(f, "  truncated:    {truncated}")?;
        let c = self.correction;
        match c.rollout.mode {
            crate::CorrectionMode::Off => {
                write!(f, "  correction:   off (lagged groups' weights cut at {})", c.tis_cap)
            }
            mode => write!(
                f,
                "  correction:   {}, bounds [{}, {}]",
                named(&mode),
                c.rollout.min.map_or("none".to_string(), |m| m.to_string()),
                c.rollout.max.map_or("none".to_string(), |m| m.to_string())
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objective(policy: PolicyTerm, kl: KlTerm) -> Objective {
        Objective {
            policy,
            advantage: AdvantageMode::Grpo,
            aggregation: Aggregation::TokenMean,
            kl,
            entropy: 0.01,
            overlong: None,
            mask_truncated: false,
            correction: Correction { rollout: RolloutCorrection::default(), tis_cap: 2.0 },
        }
    }

    #[test]
    fn each_term_gives_the_loss_only_its_own_parameters() {
        let kl = KlTerm::InLoss { beta: 0.04, estimator: KlEstimator::K2 };
        let grpo = objective(PolicyTerm::Grpo { clip_low: 0.2, clip_high: 0.28 }, kl).loss_settings();
        assert_eq!(
            (grpo.kind, grpo.clip_low, grpo.clip_high, grpo.beta, grpo.kl),
            (LossKind::Grpo, 0.2, 0.28, 0.04, KlEstimator::K2)
        );
        assert_eq!(grpo.entropy, 0.01);
        let sapo = objective(PolicyTerm::Sapo { temperature_pos: 1.0, temperature_neg: 2.0 }, kl).loss_settings();
        assert_eq!((sapo.kind, sapo.sapo_temperatures), (LossKind::Sapo, [1.0, 2.0]));
        let cispo = objective(PolicyTerm::Cispo { clip_high: 4.0 }, KlTerm::Off).loss_settings();
        assert_eq!((cispo.kind, cispo.clip_high, cispo.beta), (LossKind::Cispo, 4.0, 0.0));
    }

    #[test]
    fn a_kl_in_the_reward_is_not_in_the_loss_and_adapts_only_with_a_target() {
        let target = KlTarget { kl: 0.1, horizon: 100 };
        let shaped = KlTerm::InReward { beta: 0.05, estimator: KlEstimator::K1, target: Some(target) };
        let o = objective(PolicyTerm::Grpo { clip_low: 0.2, clip_high: 0.2 }, shaped);
        assert_eq!(o.loss_settings().beta, 0.0);
        assert_eq!(o.kl_in_reward(), Some((0.05, KlEstimator::K1)));
        assert!(o.kl.needs_reference());
        let controller = o.kl.controller(None).unwrap();
        assert_eq!((controller.value, controller.target, controller.horizon), (0.05, 0.1, 100.0));
        assert_eq!(o.kl.controller(Some(0.07)).unwrap().value, 0.07, "a resumed run's β");
        let fixed = KlTerm::InReward { beta: 0.05, estimator: KlEstimator::K1, target: None };
        assert_eq!(fixed.controller(None), None);
        assert_eq!(KlTerm::InLoss { beta: 0.05, estimator: KlEstimator::K3 }.controller(None), None);
        assert!(!KlTerm::Off.needs_reference());
    }

    #[test]
    fn it_reads_as_the_config_names_its_choices() {
        let shown = objective(
            PolicyTerm::Gspo { clip_low: 3e-4, clip_high: 4e-4 },
            KlTerm::InReward {
                beta: 0.05,
                estimator: KlEstimator::K2,
                target: Some(KlTarget { kl: 0.1, horizon: 100 }),
            },
        )
        .to_string();
        assert!(shown.contains("gspo, the sequence's ratio clipped to [1 - 0.0003, 1 + 0.0004]"), "{shown}");
        assert!(shown.contains("advantage:    grpo") && shown.contains("aggregation:  token-mean"), "{shown}");
        assert!(
            shown.contains(
                "in the reward, beta 0.05, adapting towards 0.1 per token over 100 completions, estimator k2"
            ),
            "{shown}"
        );
        assert!(shown.contains("correction:   off"), "{shown}");
    }
}
