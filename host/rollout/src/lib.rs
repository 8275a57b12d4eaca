//! wirl's rollout layer: where a step's data comes from and how it is judged, before any
//! tensor. Task sources (`source`: environment plugins, JSONL datasets), prompts that fit the
//! model (`prompt`), tasks served by another `wirl serve` (`remote`) or by an OpenEnv server
//! (`openenv`, a client of its WebSocket), the reward plugins
//! that score them (`scorer`), a task loaded and checked (`task`), and the one rolling path
//! that samples, runs and scores groups of them through the engine's batching actor
//! (`collect`), which training, evaluation and the server share.
//!
//! It must not know tensors, the loss, run directories or HTTP routes (it is a client of
//! `wirl serve`'s, never a server): `wirl-trainer` turns
//! its `RolloutGroup`s into the learner's batches, and a server can drive the same pieces.

pub mod agent;
pub mod collect;
pub mod dataset;
pub mod episode;
pub mod error;
pub mod group;
pub mod mixture;
pub mod openenv;
pub mod prompt;
pub mod remote;
pub mod score;
pub mod scorer;
pub mod seed;
pub mod source;
pub mod spec;
pub mod task;

pub use agent::{AgentCall, AgentLimits, EngineInference, InferenceFigures, InferenceUsage, agent_groups};
pub use collect::{Engine, GroupAsk, RollError, collect_groups};
pub use dataset::{Columns, Dataset, DatasetSpec};
pub use episode::{
    EpisodeGroup, EpisodeOutcome, EpisodeRun, EpisodeSource, EpisodeSteps, EpisodeTimes, TemplateDrift, check_template,
    run_episodes,
};
pub use error::{Error, Result};
pub use group::{RolloutGroup, SamplingSpec, Trajectory, seed_for};
pub use mixture::{Allocation, MixtureError, allocate};
pub use openenv::{OpenEnvEpisode, OpenEnvSpec, OpenEnvTasks};
pub use prompt::{SkippedTask, StepTasks, TaskFailure, fitting_prompt, held_out_prompts, prompt_ids, step_tasks};
pub use remote::{RemoteError, RemoteSpec, RemoteTasks};
pub use score::{FailurePolicy, OnFailure, Scored, Status};
pub use scorer::{RewardEngine, Scorers, shared_reward_model};
pub use source::TaskSource;
pub use spec::{
    CodeRunnerRef, InferenceBudget, JudgeModel, PluginRef, RewardModelRef, RewardSource, RewardSpec, SourceSpec,
};
pub use task::{LoadedTask, TaskSpec};
