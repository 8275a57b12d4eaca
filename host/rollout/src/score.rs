//! A trajectory's score and standing: what reward plugins, a remote task's server, episodes
//! and agents give a trajectory, and how a failure is scored (a task's `on_failure`).

use std::collections::BTreeMap;

/// What a trajectory whose scoring failed becomes (a task's `on_failure`). A failure is
/// never silently a reward unless the task asks for that.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnFailure {
    /// Masked: no gradient, not in the group's advantages or the step's reward figures;
    /// counted.
    #[default]
    Mask,
    /// Trained on, with `failure_reward` standing for each failed plugin's reward.
    Reward,
}

/// How a failed plugin call is scored.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FailurePolicy {
    pub on_failure: OnFailure,
    /// The reward that stands for a failed call's under `OnFailure::Reward`.
    pub failure_reward: f32,
}

/// A trajectory's standing after scoring (after Megatron-RL's rollout status).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Scored by every plugin.
    #[default]
    Ok,
    /// A plugin failed on it; it is trained on with `failure_reward` for that plugin.
    Failed,
    /// A plugin failed on it; it carries no gradient and is counted.
    Masked,
}

impl Status {
    /// Whether it takes part in advantages, the loss and reward figures.
    pub fn usable(self) -> bool {
        self != Status::Masked
    }
}

/// One scored completion.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct Scored {
    pub status: Status,
    /// The weighted sum of the plugins' rewards (a failed call counting `failure_reward`
    /// under `OnFailure::Reward`, 0 under `Mask`, where the total is not used).
    pub reward: f32,
    /// Parts by name; a name that two plugins both give is kept as `plugin/part` for each.
    pub parts: BTreeMap<String, f32>,
    /// Failure kinds (`deadline`, `non_finite`, …), one per failed plugin call.
    pub failures: Vec<String>,
    /// Each plugin's note, or its failure (`kind: message`), by plugin name.
    pub notes: BTreeMap<String, String>,
    /// For an episode of a `wirl:rl@0.2.0` environment that rewards turns: each model turn's
    /// own reward, in order (0 for a turn given none; the last turn's outcome is `reward`).
    /// Empty: no turn had one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_rewards: Vec<f32>,
}

impl Scored {
    /// A trajectory that could not be scored: failure `kind`, `note` under `by` (a plugin's
    /// name, or the kind's), trained on with the policy's `failure_reward` where it asks for
    /// that, masked otherwise (and without a policy).
    pub fn failed(kind: &str, by: &str, note: String, policy: Option<FailurePolicy>) -> Scored {
        let (status, reward) = match policy {
            Some(FailurePolicy { on_failure: OnFailure::Reward, failure_reward }) => (Status::Failed, failure_reward),
            _ => (Status::Masked, 0.0),
        };
        Scored {
            status,
            reward,
            parts: BTreeMap::new(),
            failures: vec![kind.to_string()],
            notes: BTreeMap::from([(by.to_string(), note)]),
            turn_rewards: Vec::new(),
        }
    }
}
