//! The run's records as types: one [`StepMetrics`] per line of `metrics.jsonl`, one
//! [`RolloutRecord`] (or [`SkippedTaskRecord`]) per line of `rollouts.jsonl`. Written, read
//! back (`wirl plot`, resume) and tested from these structs, never from string keys.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One training step, as written to `metrics.jsonl`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct StepMetrics {
    /// 1-based.
    pub step: usize,
    /// The run manifest's generation the step ran with (0 until a task set is swapped in).
    #[serde(default)]
    pub manifest_generation: u64,
    pub learning_rate: f64,
    pub reward_mean: f32,
    pub reward_std: f32,
    /// Each reward part's mean over the step's completions.
    pub parts: BTreeMap<String, f32>,
    /// The share of completions whose reward reached `grpo.pass_reward`.
    pub pass_rate: f32,
    /// Groups with a signal (not all rewards equal), trained on.
    pub groups_kept: usize,
    /// Draws of `prompts_per_step` tasks the step made: more than 1 under
    /// `grpo.dynamic_sampling` when its first draw had too few groups with signal.
    #[serde(default = "one")]
    pub draws: usize,
    /// Groups left with fewer than two usable trajectories (the rest masked), skipped.
    pub groups_unusable: usize,
    /// Trajectories masked for a failed plugin call (`on_failure = "mask"`): no gradient,
    /// not in the reward figures.
    pub trajectories_masked: usize,
    /// Trajectories with a usable reward: the ones the reward figures are over. 0 means the
    /// step's `reward_mean` and `pass_rate` describe nothing (every call failed).
    pub trajectories_scored: usize,
    pub loss: f32,
    pub kl: f32,
    pub entropy: f32,
    pub clip_fraction: f32,
    /// Under `grpo.kl_in_reward`: the β the step's rewards were shaped with (it moves
    /// between steps with `grpo.kl_target`) and the mean, over the shaped completions, of
    /// each one's mean KL estimate per token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_coef: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_kl: Option<f64>,
    /// Under `[distill]`: the student's reverse KL to the teacher, log π_student − log
    /// π_teacher of each sampled token, the mean over this rank's trained tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill_kl: Option<f64>,
    /// Written as a string when not finite (JSON has no NaN).
    #[serde(with = "finite_or_string")]
    pub grad_norm: f64,
    pub updates_skipped: usize,
    /// Groups trained layer by layer (`grpo.recompute_above_mib`), whatever of their layers
    /// kept their graphs from the forward (`grpo.keep_activations_mib`).
    pub groups_recomputed: usize,
    /// Updates between the weights that sampled this step's groups and the ones its
    /// update started from (`grpo.generation_lag`; 0 for a run's first step, and for one
    /// after a resume or a swap, which sample afresh).
    pub sampler_lag: u64,
    /// Of the tokens given an importance weight (lagged groups; under
    /// `grpo.rollout_correction` every group), the share whose weight the bounds changed:
    /// cut to `grpo.tis_cap`, or truncated or masked by the correction's bounds.
    pub tis_truncated: f32,
    /// |log π_trainer − log π_sampler| of the sampled tokens on the weights that sampled them
    /// (groups without a lag), the mean and the largest: the same policy in the sampler's
    /// and the trainer's code paths, so on the CPU in f32 it is 0 — the same bits
    /// (`wirl_engine::invariant`) — and anything above is a sampler that does not run the
    /// policy's numbers: a converted copy's precision (`model.inference_dtype`), weights not
    /// synced, another device. Absent when no group had the sampler's log-probs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_logp_diff_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampler_logp_diff_max: Option<f64>,
    /// This process's peak resident memory so far (Linux), in MiB.
    pub peak_rss_mib: Option<u64>,
    /// This step's peak resident memory in each phase (Linux), in MiB.
    #[serde(default, skip_serializing_if = "PhasePeaks::is_empty")]
    pub peak_rss_mib_by_phase: PhasePeaks,
    pub tasks_skipped: Vec<SkippedTaskEntry>,
    pub completion_tokens_mean: f32,
    pub completion_tokens_max: usize,
    /// Failed plugin calls by kind.
    pub failures: BTreeMap<String, usize>,
    pub generate_tokens_per_s: f64,
    /// Model turns after the first, over the step's episodes.
    pub episode_turns: usize,
    /// Tokens the model generated in the step's trajectories, every turn (`episode_tokens`
    /// of them in turns after the first): per generated token, first turns took
    /// `time_s.generate / (completion_tokens - episode_tokens)`, later ones
    /// `time_s.episodes / episode_tokens`.
    #[serde(default)]
    pub completion_tokens: usize,
    #[serde(default)]
    pub episode_tokens: usize,
    /// Prompt positions the sampler took from its prefix cache (`model.prefix_cache_mib`)
    /// and computed, since the previous step's record (this rank's engine: rank 0's).
    #[serde(default)]
    pub prompt_positions_cached: u64,
    #[serde(default)]
    pub prompt_positions_computed: u64,
    /// Calls 0.2.0 rewards (LLM judges) made to the engine in the step, and the tokens it
    /// generated for them; their wait is `time_s.judge`.
    #[serde(default)]
    pub judge_calls: u64,
    #[serde(default)]
    pub judge_tokens: u64,
    pub time_s: StepTimes,
    /// The same figures per task of the mixture, by task name.
    pub tasks: BTreeMap<String, TaskMetrics>,
}

/// One task's share of a step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TaskMetrics {
    /// Groups allocated to it in each draw: a step of `draws` draws rolled `draws` times as
    /// many (an agent's excepted: they are not drawn again). The other figures count every
    /// group the step rolled, so under dynamic sampling `groups_kept` may exceed `groups`.
    pub groups: usize,
    pub groups_kept: usize,
    pub reward_mean: f32,
    pub pass_rate: f32,
    pub completion_tokens_mean: f32,
    pub tasks_skipped: usize,
    pub trajectories_masked: usize,
    pub groups_unusable: usize,
}

/// A task skipped in a step (its source failed it, or its prompt did not fit).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SkippedTaskEntry {
    /// The run's task (`[[tasks]]` name) whose source skipped it.
    pub task_name: String,
    pub index: u64,
    pub task: Option<String>,
    pub reason: String,
}

/// Peak resident memory in each phase of a step, in MiB (None where it was not measured).
/// Resident memory includes what the allocator keeps for reuse, and the `wirl` binary's
/// allocator keeps all it ever held (one heap, never trimmed: see `main`), so a phase
/// reads at least the process's high-water mark so far; the first phase to rise above it
/// is the one that needed more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PhasePeaks {
    /// Sampling: the first turns, episodes' later turns.
    pub generate: Option<u64>,
    /// Reward plugins and agents.
    pub score: Option<u64>,
    /// The update: old and reference passes, forwards, backwards, the optimizer.
    pub train: Option<u64>,
}

impl PhasePeaks {
    pub fn is_empty(&self) -> bool {
        self.generate.is_none() && self.score.is_none() && self.train.is_none()
    }
}

/// Seconds per phase of a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StepTimes {
    /// Waiting for the first (or only) turn of every group (with `grpo.overlap`, the
    /// groups that finished first were scored meanwhile; with a generation lag they were
    /// sampled during the previous step's update, and this is what was left).
    pub generate: f64,
    /// Episodes' later turns: generation, the environment's calls, template and ledger.
    pub episodes: f64,
    /// Of `episodes`, the host's own part (all but waiting for the engine).
    pub episodes_host: f64,
    /// Agent plugins producing their groups (their generation included).
    pub agents: f64,
    /// Reward plugins' calls, overlapped with generation or not.
    pub score: f64,
    /// Of the rewards' calls, the time their calls to the engine (LLM judges) waited for it,
    /// summed over the calls (calls made side by side each count their own wait).
    pub judge: f64,
    /// Drawing the step's tasks (0 when they were drawn during the previous update).
    pub draw: f64,
    /// Under `[distill]`: the teacher's forward over the trained groups (before the update,
    /// outside `train`).
    pub teacher: f64,
    pub train: f64,
    pub total: f64,
    pub reference_forward: f64,
    pub policy_forward: f64,
    pub backward: f64,
    pub optimizer: f64,
}

/// One completion of a step, as written to `rollouts.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    pub step: usize,
    /// `ok`, `failed` (trained on with `failure_reward`) or `masked` (no gradient).
    pub status: wirl_rollout::Status,
    /// The run's task (`[[tasks]]` name).
    pub task_name: String,
    /// The problem's id.
    pub task: String,
    /// Model turns (1 for a single-turn task).
    pub turns: usize,
    /// An episode's messages after the prompt (model turns, the environment's answers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversation: Vec<ConversationMessage>,
    pub sample: usize,
    pub completion: String,
    pub tokens: usize,
    pub reward: f32,
    /// An episode's turn rewards, one per model turn (a `wirl:rl@0.2.0` environment's; 0 for
    /// a turn given none), credited to their turns' tokens; absent when no turn had one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_rewards: Vec<f32>,
    pub parts: BTreeMap<String, f32>,
    pub failures: Vec<String>,
    pub notes: BTreeMap<String, String>,
    /// The plugins that produced it (environment, rewards), by sha256.
    pub plugins: Vec<PluginHash>,
    /// The version of the weights that sampled it (the engine's count of weight updates).
    #[serde(default)]
    pub weights_version: u64,
    /// The run manifest's generation that produced it.
    #[serde(default)]
    pub manifest_generation: u64,
}

/// A message of an episode's conversation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConversationMessage {
    pub role: String,
    pub content: String,
}

/// A task skipped in a step, as written to `rollouts.jsonl`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SkippedTaskRecord {
    pub step: usize,
    pub task_name: String,
    pub skipped_task: u64,
    pub task: Option<String>,
    pub reason: String,
}

/// A plugin by name and the sha256 of its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginHash {
    pub name: String,
    pub sha256: String,
}

/// Read `metrics.jsonl`; an undecodable line is an error naming the file and the line.
pub fn read_metrics(path: &std::path::Path) -> crate::error::Result<Vec<StepMetrics>> {
    use crate::error::Context;
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(i, line)| {
            serde_json::from_str(line)
                .with_context(|| format!("{} line {}: not a step's metrics", path.display(), i + 1))
        })
        .collect()
}

mod finite_or_string {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        if value.is_finite() { serializer.serialize_f64(*value) } else { serializer.serialize_str(&value.to_string()) }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Either {
            Number(f64),
            Text(String),
        }
        Ok(match Either::deserialize(deserializer)? {
            Either::Number(x) => x,
            Either::Text(text) => text.parse().unwrap_or(f64::NAN),
        })
    }
}

/// What a record written before `draws` existed made: one draw.
fn one() -> usize {
    1
}

#[cfg(test)]
mod tests {
    use super::StepMetrics;

    #[test]
    fn a_non_finite_gradient_norm_round_trips_as_text() {
        for norm in [f64::NAN, f64::INFINITY, 2.5] {
            let metrics = StepMetrics { step: 3, grad_norm: norm, ..Default::default() };
            let line = serde_json::to_string(&metrics).unwrap();
            let back: StepMetrics = serde_json::from_str(&line).unwrap();
            assert_eq!(back.step, 3);
            assert!(back.grad_norm == norm || (norm.is_nan() && back.grad_norm.is_nan()), "{line}");
        }
    }

    #[test]
    fn older_lines_without_newer_fields_still_read() {
        let back: StepMetrics = serde_json::from_str(r#"{"step": 1, "reward_mean": 0.5}"#).unwrap();
        assert_eq!((back.step, back.reward_mean, back.peak_rss_mib), (1, 0.5, None));
    }
}
