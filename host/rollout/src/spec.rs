//! The validated descriptions of a run's plugins and task source, as the trainer's config
//! hands them over: illegal combinations cannot be written (a source is one of its kinds).

use std::path::PathBuf;
use wirl_sandbox::{Limits, PluginSpec};

/// A plugin file with its settings and, where given, its own limits.
#[derive(Clone, Debug, PartialEq)]
pub struct PluginRef {
    /// The file (or `builtin:NAME`) as the config names it.
    pub path: PathBuf,
    /// Where its bytes in force are kept, when a run pinned them (the run directory's
    /// `plugins/SHA256.wasm`): loaded from there, so that rebuilding the file changes nothing.
    pub stored: Option<PathBuf>,
    /// The plugin's own settings, readable through `wirl:rl/config`.
    pub config: serde_json::Map<String, serde_json::Value>,
    pub deadline_ms: Option<u64>,
    pub memory_mib: Option<u64>,
}

impl PluginRef {
    /// The sandbox's spec: default limits, overridden where this names them.
    pub fn spec(&self) -> PluginSpec {
        let mut spec = plugin_spec(&self.path, self.stored.as_deref());
        spec.config = self.config.clone();
        if let Some(ms) = self.deadline_ms {
            spec.limits.deadline_ms = ms;
        }
        if let Some(mib) = self.memory_mib {
            spec.limits.memory_bytes = mib << 20;
        }
        spec
    }
}

/// A plugin file, or a built-in (`builtin:NAME`); with the bytes of its pinned copy where
/// there is one, still named and shown as the reference (so that errors name the user's
/// file). Configs check their built-in names when they are read; an unknown one left here
/// fails to load, with its name in the error.
fn plugin_spec(path: &std::path::Path, stored: Option<&std::path::Path>) -> PluginSpec {
    let named = wirl_builtins::spec(path).unwrap_or_else(|_| PluginSpec::new(path));
    match stored.map(|stored| (stored, std::fs::read(stored))) {
        Some((_, Ok(bytes))) => PluginSpec { bytes: Some(bytes.into()), ..named },
        // The sandbox says what is wrong with the kept copy.
        Some((stored, Err(_))) => PluginSpec { name: named.name, ..PluginSpec::new(stored) },
        None => named,
    }
}

/// The interpreter a grader's programs run in, with the most one program may use.
#[derive(Clone, Debug, PartialEq)]
pub struct CodeRunnerRef {
    pub path: PathBuf,
    /// Its pinned copy, as [`PluginRef::stored`].
    pub stored: Option<PathBuf>,
    pub deadline_ms: Option<u64>,
    pub memory_mib: Option<u64>,
    /// Worker processes its programs run in (0: in this process).
    pub workers: usize,
}

/// What gives a reward, and its weight in the sum.
#[derive(Clone, Debug, PartialEq)]
pub struct RewardSpec {
    pub source: RewardSource,
    pub weight: f32,
}

/// A reward plugin (a grader with its code runner; a 0.2.0 plugin with what it may ask the
/// model), or a reward model.
#[derive(Clone, Debug, PartialEq)]
pub enum RewardSource {
    Plugin { plugin: PluginRef, code_runner: Option<CodeRunnerRef>, inference: InferenceBudget, judge: JudgeModel },
    Model(RewardModelRef),
}

/// Which model a 0.2.0 reward plugin's `inference` reaches (an LLM judge's).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JudgeModel {
    /// The model being trained, as it is at each step.
    #[default]
    Policy,
    /// The model the run started from, frozen: a judge that does not drift with the policy.
    Initial,
    /// Another model (an HF directory or a GGUF file), loaded once for the run.
    Path(PathBuf),
}

impl std::fmt::Display for JudgeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JudgeModel::Policy => f.write_str("policy"),
            JudgeModel::Initial => f.write_str("initial"),
            JudgeModel::Path(path) => write!(f, "{}", path.display()),
        }
    }
}

/// What one scoring call of a 0.2.0 reward plugin may ask of the model through its
/// `inference` import (an LLM judge): `generate` calls, and tokens generated in all. Each
/// conversation of a call gets at most its share of the tokens left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InferenceBudget {
    pub calls: u64,
    pub tokens: u64,
}

impl Default for InferenceBudget {
    /// A group judged in a call or two: 8 calls, 8,192 tokens.
    fn default() -> Self {
        InferenceBudget { calls: 8, tokens: 8192 }
    }
}

/// A reward model (a sequence classifier's directory: `wirl_engine::RewardModel`), and which
/// of its scores is the reward.
#[derive(Clone, Debug, PartialEq)]
pub struct RewardModelRef {
    pub path: PathBuf,
    pub label: usize,
}

impl RewardSource {
    /// The sandbox's spec of a plugin (with its code runner's); `None` for a reward model.
    pub fn plugin_spec(&self) -> Option<PluginSpec> {
        let RewardSource::Plugin { plugin, code_runner, .. } = self else { return None };
        let mut spec = plugin.spec();
        if let Some(runner) = code_runner {
            let mut limits = Limits::code_runner();
            limits.deadline_ms = runner.deadline_ms.unwrap_or(limits.deadline_ms);
            limits.memory_bytes = runner.memory_mib.map_or(limits.memory_bytes, |mib| mib << 20);
            spec.code_runner = Some(Box::new(PluginSpec {
                limits,
                workers: runner.workers,
                ..plugin_spec(&runner.path, runner.stored.as_deref())
            }));
        }
        Some(spec)
    }
}

/// Where a task comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceSpec {
    /// `task-at(seed, index)` of an environment plugin.
    Environment { plugin: PluginRef, seed: u64 },
    /// Dataset files (JSONL, Parquet, Arrow IPC, a `save_to_disk` directory): training tasks
    /// and held-out tasks; at least one.
    Dataset { train: Option<Box<crate::dataset::DatasetSpec>>, eval: Option<Box<crate::dataset::DatasetSpec>> },
    /// An agent plugin: it produces scored rollout groups itself, calling the model.
    Agent { plugin: PluginRef, limits: AgentLimits },
    /// A task served by another `wirl serve`: tasks and scores over HTTP, sampled here.
    Remote(crate::remote::RemoteSpec),
    /// An OpenEnv server's environment: episodes over its WebSocket, sampled here.
    OpenEnv { spec: crate::openenv::OpenEnvSpec, seed: u64 },
}

/// Limits on an agent's use of the engine, per rollout it is asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AgentLimits {
    /// `generate` calls (each may hold several conversations).
    pub generate_calls: u64,
    /// Tokens generated.
    pub tokens: u64,
}
