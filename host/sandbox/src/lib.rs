//! wirl's WebAssembly component host.
//!
//! Loads task-specific code — rewards, environments, agents, code runners — as sandboxed
//! components of the WIT package `wirl:rl@0.1.0` and calls it under limits. Whatever a
//! plugin does (loop, allocate, overflow its stack, print without end, return 100 MB,
//! reach for files, environment or sockets), the call ends with a [`Failure`] that names
//! what happened, and the next call works.
//!
//! - [`Limits`] and [`SandboxSettings`]: every default in one place, each with its reason.
//! - [`Sandbox`]: one wasmtime engine (pooling allocator, epoch ticker, on-disk cache of
//!   compiled components) that loads [`Plugin`]s.
//! - [`Plugin`]: a loaded component, known by the sha256 of its bytes, of a known [`World`].
//! - [`RewardPlugin`], [`EnvironmentPlugin`], [`CodeRunnerPlugin`]: typed handles that call
//!   one world. A grader is a reward plugin whose `code-runner` import the host wires to a
//!   code-runner plugin of its own, a separate store per program, in this process or in
//!   worker processes ([`CodeRunnerPlugin::in_workers`], [`serve_code_worker`]).

mod agent;
mod bindings;
mod cache;
mod call;
mod code_runner;
mod environment;
mod inference;
mod limits;
mod plugin;
mod reward;
mod ruby;
mod sandbox;
mod slots;
mod workdir;
mod workers;
mod world;

pub use agent::AgentPlugin;
pub use bindings::{
    AgentRolloutGroup, Completion, Description, FinishReason, Message, Outcome, Program, Progress, ReplyLogprobs,
    ReplyToScore, Rollout, RolloutRequest, RunLimits, Sampling, Score, StepResult, Task, Termination,
};
pub use call::{CallStats, Failure, FailureKind, Interrupter};
pub use code_runner::{CodeRunnerPlugin, RunnerFailure};
pub use environment::{EnvironmentPlugin, Episode};
pub use inference::InferenceHost;
pub use limits::{Grants, Limits, MAX_DEADLINE_MS, MAX_MEMORY_MIB, SandboxSettings};
pub use plugin::{Plugin, PluginSpec};
pub use reward::RewardPlugin;
pub use sandbox::Sandbox;
pub use workdir::{Usage as WorkdirUsage, Workdir, inside as inside_workdir};
pub use workers::{MAX_WORKERS, register_worker_command, serve_code_worker};
pub use world::{WIT_PACKAGE, WIT_VERSION, WIT_VERSIONS, World};

use std::path::PathBuf;

/// Why a plugin could not be loaded or used. Each names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read plugin file {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("plugin {path} refused: {reason}")]
    Refused { path: PathBuf, reason: String },
    #[error("plugin `{name}` ({path}) implements the {found} world, but {wanted} is needed here")]
    WrongWorld { name: String, path: PathBuf, found: World, wanted: String },
    #[error("plugin `{name}`: {message}")]
    Config { name: String, message: String },
    /// A code worker process lost its pipe to the host (`what` it was doing).
    #[error("code worker: {what}")]
    WorkerPipe {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// A code worker process was sent a first line that is not its hello.
    #[error("code worker: a malformed hello")]
    WorkerHello(#[source] serde_json::Error),
    /// wasmtime could not be set up (its error, and the causes under it, kept as the source).
    #[error("sandbox engine: {0}")]
    Engine(#[source] Box<dyn std::error::Error + Send + Sync>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `text` safe for a terminal or log line: control characters (a `\r` that would overwrite
/// the line, escape sequences, newlines) shown escaped. What plugins say passes through this
/// before it is logged.
pub fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    std::borrow::Cow::Owned(
        text.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect(),
    )
}
