//! A step's rollouts: a group's samples (`collect` rolls them), kept as the
//! sampler produced them (token ids, log-probs, the weights version), then scored.

use crate::score::Scored;
use wirl_engine::{Completion, FinishReason, Sampling};
use wirl_sandbox::{Message, Task};

pub use crate::seed::seed_for;

/// One sampled completion of a group, exactly as the sampler produced it: the trainer learns
/// from these ids, never from a re-tokenization of the text. (Serialized: data-parallel
/// ranks send their groups to rank 0, which records them.)
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Trajectory {
    pub tokens: Vec<u32>,
    /// Each token's log-probability under the sampler (temperature 1).
    pub logprobs: Vec<f32>,
    pub text: String,
    pub finish: FinishReason,
    /// The engine's weights version that sampled it (its first turn's).
    pub weights_version: u64,
    /// For a multi-turn ledger, per token of `tokens`: sampled by the model (trained on)
    /// or appended from the template and the environment (no loss). Empty: all sampled.
    pub trainable: Vec<bool>,
    /// Model turns in it.
    pub turns: usize,
    /// For an episode: where each model turn starts in `tokens` (the first at 0), so that a
    /// turn's own reward is credited to its tokens. Empty for a single turn.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub turn_starts: Vec<usize>,
    /// For an episode: the messages after the prompt (each model turn, the environment's
    /// answers), as the template rendered them. Empty for a single turn.
    pub conversation: Vec<Message>,
}

impl From<Completion> for Trajectory {
    fn from(c: Completion) -> Self {
        Trajectory {
            tokens: c.tokens,
            logprobs: c.logprobs,
            text: c.text,
            finish: c.finish,
            weights_version: c.weights_version,
            trainable: Vec::new(),
            turns: 1,
            turn_starts: Vec::new(),
            conversation: Vec::new(),
        }
    }
}

impl Trajectory {
    /// No tokens: what a placeholder holds.
    pub fn empty() -> Self {
        Trajectory {
            tokens: Vec::new(),
            logprobs: Vec::new(),
            text: String::new(),
            finish: FinishReason::Stop,
            weights_version: 0,
            trainable: Vec::new(),
            turns: 0,
            turn_starts: Vec::new(),
            conversation: Vec::new(),
        }
    }

    /// Each model turn's span of `tokens` (a turn's own tokens and the environment's answer
    /// after it, up to the next turn's start), for an episode whose turns are known.
    pub fn turn_spans(&self) -> Vec<std::ops::Range<usize>> {
        let ends = self.turn_starts.iter().skip(1).copied().chain([self.tokens.len()]);
        self.turn_starts.iter().zip(ends).map(|(&start, end)| start.min(end)..end).collect()
    }

    /// Tokens the model sampled (for a multi-turn ledger, not the environment's).
    pub fn model_tokens(&self) -> usize {
        if self.trainable.is_empty() { self.tokens.len() } else { self.trainable.iter().filter(|&&t| t).count() }
    }
}

/// A task, its prompt, its trajectories and their scores (one per trajectory).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct RolloutGroup {
    /// The run's task (its `[[tasks]]` name) that the problem came from.
    pub task_name: String,
    /// The problem.
    pub task: Task,
    pub prompt: Vec<u32>,
    pub trajectories: Vec<Trajectory>,
    pub scores: Vec<Scored>,
}

impl RolloutGroup {
    pub fn rewards(&self) -> Vec<f32> {
        self.scores.iter().map(|s| s.reward).collect()
    }

    /// A group that could not be sampled (its agent or task server failed): no prompt, no
    /// tokens, `size` masked trajectories each naming the failure's `kind` and, under `by`
    /// in its notes, `message`. It carries no gradient and is recorded and counted.
    pub fn placeholder(task_name: &str, task_id: String, size: usize, kind: &str, by: &str, message: &str) -> Self {
        let failed = || Scored::failed(kind, by, message.to_string(), None);
        RolloutGroup {
            task_name: task_name.to_string(),
            task: Task { id: task_id, messages: Vec::new(), answer: None, metadata: None },
            prompt: Vec::new(),
            trajectories: (0..size).map(|_| Trajectory::empty()).collect(),
            scores: (0..size).map(|_| failed()).collect(),
        }
    }
}

/// How a task's completions are sampled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingSpec {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
}

impl SamplingSpec {
    /// The engine's sampling with this seed.
    pub fn seeded(&self, seed: u64) -> Sampling {
        Sampling {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            seed: Some(seed),
            ..Default::default()
        }
    }
}
