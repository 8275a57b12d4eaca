//! The one place that generates host bindings of the `wirl:rl` worlds. Exports are called
//! asynchronously: a call is a future that the host can drop at its deadline, also while
//! the guest waits inside a blocking WASI import (`call::bounded`).

pub(crate) mod reward_world {
    wasmtime::component::bindgen!({
        world: "reward-plugin",
        path: "../../wit",
        exports: { default: async },
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
    });
}

pub(crate) mod environment_world {
    wasmtime::component::bindgen!({
        world: "environment-plugin",
        path: "../../wit",
        exports: { default: async },
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
        with: {
            "wirl:rl/types": super::reward_world::wirl::rl::types,
            "wirl:rl/config": super::reward_world::wirl::rl::config,
        },
    });
}

pub(crate) mod grader_world {
    wasmtime::component::bindgen!({
        world: "grader-plugin",
        path: "../../wit",
        exports: { default: async },
        // A program's run is awaited, so that the grader's own deadline can cut it; a run
        // the host could not make traps the grader's call (`RunnerFailure`).
        imports: { "wirl:rl/code-runner.run": async | trappable },
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
        with: {
            "wirl:rl/types": super::reward_world::wirl::rl::types,
            "wirl:rl/config": super::reward_world::wirl::rl::config,
        },
    });
}

pub(crate) mod agent_world {
    wasmtime::component::bindgen!({
        world: "agent-plugin",
        path: "../../wit",
        exports: { default: async },
        // Generation is awaited: the agent's deadline pauses while the engine works.
        imports: { "wirl:rl/inference.generate": async },
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
        with: {
            "wirl:rl/types": super::reward_world::wirl::rl::types,
            "wirl:rl/config": super::reward_world::wirl::rl::config,
        },
    });
}

/// `wirl:rl@0.2.0`'s reward world (`wit/0.2.0/`): a group at a time, with the run's
/// progress. Its `types` are 0.1.0's, unchanged, so they are the same Rust types: a 0.2.0
/// plugin reads and returns the values a 0.1.0 one does. Its `config` is its own interface
/// (0.2.0's name), linked beside 0.1.0's.
pub(crate) mod reward_world_v0_2 {
    wasmtime::component::bindgen!({
        world: "reward-plugin",
        path: "../../wit/0.2.0",
        exports: { default: async },
        // A judge's calls are awaited: the reward's deadline pauses while the engine works.
        imports: { "wirl:rl/inference.generate": async, "wirl:rl/inference.logprobs": async },
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
        with: {
            "wirl:rl/types": super::reward_world::wirl::rl::types,
        },
    });
}

/// `wirl:rl@0.2.0`'s environment world: 0.1.0's, with a reward per turn the episode goes on
/// from. Types as 0.1.0's, `config` as 0.2.0's reward world's.
pub(crate) mod environment_world_v0_2 {
    wasmtime::component::bindgen!({
        world: "environment-plugin",
        path: "../../wit/0.2.0",
        exports: { default: async },
        additional_derives: [serde::Serialize, serde::Deserialize, PartialEq],
        with: {
            "wirl:rl/types": super::reward_world::wirl::rl::types,
            "wirl:rl/config": super::reward_world_v0_2::wirl::rl::config,
        },
    });
}

pub(crate) mod code_runner_world {
    wasmtime::component::bindgen!({
        world: "code-runner-plugin",
        path: "../../wit",
        exports: { default: async },
    });
}

pub use agent_world::exports::wirl::rl::agent::{Rollout, RolloutGroup as AgentRolloutGroup, RolloutRequest};
pub use environment_world::exports::wirl::rl::environment::Description;
pub use grader_world::wirl::rl::code_runner::{Limits as RunLimits, Outcome, Program, Termination};
pub use reward_world::wirl::rl::types::{Completion, FinishReason, Message, Sampling, Score, Task};
pub use reward_world_v0_2::wirl::rl::inference::{ReplyLogprobs, ReplyToScore};
pub use reward_world_v0_2::wirl::rl::run::Progress;

/// What follows a model turn in an episode, whichever version the environment speaks.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum StepResult {
    /// The episode goes on: `messages` are appended and the model replies again. `reward`:
    /// the turn's own reward (0.2.0 environments; 0.1.0's and OpenEnv's give none).
    Continue { messages: Vec<Message>, reward: Option<f32> },
    /// The episode is over, with its outcome's score.
    Done(Score),
}

impl From<environment_world::exports::wirl::rl::environment::StepResult> for StepResult {
    fn from(step: environment_world::exports::wirl::rl::environment::StepResult) -> Self {
        use environment_world::exports::wirl::rl::environment::StepResult as V0_1;
        match step {
            V0_1::Continue(messages) => StepResult::Continue { messages, reward: None },
            V0_1::Done(score) => StepResult::Done(score),
        }
    }
}

impl From<environment_world_v0_2::exports::wirl::rl::environment::StepResult> for StepResult {
    fn from(step: environment_world_v0_2::exports::wirl::rl::environment::StepResult) -> Self {
        use environment_world_v0_2::exports::wirl::rl::environment::StepResult as V0_2;
        match step {
            V0_2::Continue(turn) => StepResult::Continue { messages: turn.messages, reward: turn.reward },
            V0_2::Done(score) => StepResult::Done(score),
        }
    }
}

impl Progress {
    /// Outside training: step 0 of 0.
    pub const OUTSIDE_TRAINING: Progress = Progress { step: 0, steps: 0 };
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Self {
        Message { role: role.to_string(), content: content.into() }
    }
}

impl Task {
    /// Bytes of text in this task, for the return-size limit.
    pub(crate) fn text_bytes(&self) -> usize {
        self.id.len()
            + self.messages.iter().map(|m| m.role.len() + m.content.len()).sum::<usize>()
            + self.answer.as_ref().map_or(0, String::len)
            + self.metadata.as_ref().map_or(0, String::len)
    }
}

impl Score {
    /// Bytes of text in this score, for the return-size limit.
    pub(crate) fn text_bytes(&self) -> usize {
        self.parts.iter().map(|(name, _)| name.len() + 4).sum::<usize>() + self.note.as_ref().map_or(0, String::len) + 4
    }
}
