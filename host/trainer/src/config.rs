//! A run's configuration: a TOML file parsed raw ([`TrainConfig`], what the run directory
//! keeps), checked once on load — an unknown key, a wrong type, a number out of range or a
//! missing plugin file is an error naming the file, the key and what to do — and converted
//! into the validated [`RunConfig`] that the trainer runs on, where a task source is an enum.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use wirl_grpo::{AdvantageMode, Aggregation, Schedule};
use wirl_rollout::{
    AgentLimits, CodeRunnerRef, Columns, DatasetSpec, FailurePolicy, OnFailure, PluginRef, RewardSpec, SamplingSpec,
    SourceSpec,
};

/// The default run, embedded so that `wirl train` needs no file.
pub const DEFAULT_TOML: &str = include_str!("../../../examples/train/default.toml");

/// A float setting: its key, value, what it must be, and the test of that.
type FloatRule = (&'static str, f64, &'static str, fn(f64) -> bool);

/// The largest plugin memory a config may ask for: the sandbox's `max_memory_bytes`.
const MAX_MEMORY_MIB: u64 = 4 << 10;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub model: ModelSection,
    /// Several tasks mixed by weight, each with its source, rewards and sampling. Without
    /// them, the one task of `environment` or `dataset` with `rewards`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<TaskSection>,
    /// Where tasks come from: an environment plugin, or (instead) a JSONL dataset.
    #[serde(default)]
    pub environment: Option<PluginSection>,
    #[serde(default)]
    pub dataset: Option<DatasetSection>,
    /// The reward plugins of the task; with `[[tasks]]`, those of every task that names none.
    #[serde(default)]
    pub rewards: Vec<RewardSection>,
    #[serde(default)]
    pub sampling: SamplingSection,
    #[serde(default)]
    pub grpo: GrpoSection,
    #[serde(default)]
    pub eval: EvalSection,
    /// Hot swap: how a new task set is validated and when it is rolled back.
    #[serde(default)]
    pub swap: SwapSection,
}

/// A running training's tasks, as `wirl ctl RUN_DIR apply TASKS.toml` gives them: `[[tasks]]`
/// and the `[[rewards]]` that tasks naming none share. Also the task set of a run manifest.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSet {
    #[serde(default)]
    pub tasks: Vec<TaskSection>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rewards: Vec<RewardSection>,
}

/// `[swap]`: the checks a task set passes before it replaces the running one, and the
/// automatic rollback after.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SwapSection {
    /// Validation refuses a swap when more than this share of its checks fail (plugin calls
    /// re-scoring recent rollouts, tasks asked of an environment).
    pub max_failure_rate: f64,
    /// A swapped-in plugin's first `rollback_window` trajectories: when more than this share
    /// of them fail, the previous task set comes back.
    pub rollback_failure_rate: f64,
    pub rollback_window: usize,
    /// Seconds a rolled-back version must wait before it may be applied again; doubled on
    /// each further rollback of the same bytes.
    pub backoff_s: f64,
    /// Recent steps whose rollouts a new reward re-scores.
    pub rescore_steps: usize,
    /// Let a replaced plugin import interfaces its previous version did not.
    pub allow_new_capabilities: bool,
}

impl Default for SwapSection {
    fn default() -> Self {
        SwapSection {
            max_failure_rate: 0.25,
            rollback_failure_rate: 0.5,
            rollback_window: 16,
            backoff_s: 60.0,
            rescore_steps: 2,
            allow_new_capabilities: false,
        }
    }
}

/// One task of a weighted mixture.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TaskSection {
    /// Unique; names the task in metrics, rollouts and plots (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// Its share of each step's groups, relative to the other tasks' (0: never trained on).
    #[serde(default = "one_f64")]
    pub weight: f64,
    /// Only in the held-out evaluation, never trained on.
    #[serde(default)]
    pub eval_only: bool,
    #[serde(default)]
    pub environment: Option<PluginSection>,
    #[serde(default)]
    pub dataset: Option<DatasetSection>,
    /// An agent plugin that produces the task's scored rollouts itself, calling the model.
    #[serde(default)]
    pub agent: Option<AgentSection>,
    /// A task served by another `wirl serve --config`: its tasks and scores over HTTP.
    #[serde(default)]
    pub remote: Option<RemoteSection>,
    /// Its reward plugins (default: the top-level `[[rewards]]`).
    #[serde(default)]
    pub rewards: Vec<RewardSection>,
    /// Its sampling, where it differs from `[sampling]`.
    #[serde(default)]
    pub sampling: SamplingOverrides,
    /// What a trajectory whose scoring fails becomes (default: `grpo.on_failure`).
    #[serde(default)]
    pub on_failure: Option<OnFailure>,
    /// Above 1: the environment's episodes, up to this many model turns each, scored by the
    /// environment (its rewards are not used). 1: single-turn tasks scored by its rewards.
    #[serde(default = "one_usize")]
    pub max_turns: usize,
    /// A trajectory of this task passes when its reward is at least this (default:
    /// `grpo.pass_reward`).
    #[serde(default)]
    pub pass_reward: Option<f32>,
}

fn one_usize() -> usize {
    1
}

/// The most model turns an episode may be given.
pub const MAX_TURNS: usize = 64;

/// An agent plugin and what it may use.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AgentSection {
    pub plugin: PathBuf,
    #[serde(default)]
    pub config: toml::Table,
    /// The agent's own compute per `rollouts` call (time waiting for the engine not counted).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// `generate` calls per rollout asked for (default 8).
    #[serde(default = "default_generate_calls")]
    pub max_generate_calls: u64,
    /// Tokens generated per rollout asked for (default 2048).
    #[serde(default = "default_agent_tokens")]
    pub max_tokens: u64,
}

/// A task served by another `wirl serve --config` process: its tasks drawn and its
/// completions scored there; sampled here, by the policy.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RemoteSection {
    /// The server, `http://HOST:PORT`.
    pub url: String,
    /// The task's name there (default: the only one it serves).
    #[serde(default)]
    pub task: Option<String>,
    /// Seconds per call (default 30).
    #[serde(default = "default_remote_timeout")]
    pub timeout_s: f64,
    /// Further tries after a failed call (default 2).
    #[serde(default = "default_remote_retries")]
    pub retries: u32,
    /// The environment variable that holds the server's API key, if it needs one.
    #[serde(default)]
    pub api_key_env: Option<String>,
}

fn default_remote_timeout() -> f64 {
    30.0
}

fn default_remote_retries() -> u32 {
    2
}

fn default_generate_calls() -> u64 {
    8
}

fn default_agent_tokens() -> u64 {
    2048
}

/// `[sampling]` keys that a task sets for itself.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SamplingOverrides {
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
}

fn one_f64() -> f64 {
    1.0
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub path: String,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PluginSection {
    pub plugin: PathBuf,
    /// The environment's task-set seed.
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub config: toml::Table,
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
}

/// Tasks from dataset files: JSONL (one task per line, as `{"task": {...}}` — what `wirl
/// tasks` writes — or the task object itself; or rows, with `columns`), Parquet, Arrow IPC,
/// or a Hugging Face `save_to_disk` directory.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DatasetSection {
    /// Training tasks, by index, cycled over epochs (needed to train, not to evaluate).
    #[serde(default)]
    pub train: Option<PathBuf>,
    /// Held-out tasks for the evaluation (the first `eval.tasks` of them).
    #[serde(default)]
    pub eval: Option<PathBuf>,
    /// Which columns make a task (default: `prompt` / `question` / `problem`, `answer`, `id`;
    /// JSONL lines without it are task objects).
    #[serde(default)]
    pub columns: Option<ColumnsSection>,
    /// Visit the training rows in a seeded order, another each epoch.
    #[serde(default)]
    pub shuffle: bool,
    #[serde(default)]
    pub seed: u64,
}

/// A dataset's column mapping.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ColumnsSection {
    /// A text column: the user's message.
    pub prompt: Option<String>,
    /// A list of `{role, content}` column: the conversation (instead of `prompt`).
    pub messages: Option<String>,
    /// A system message before the prompt (the text itself).
    pub system: Option<String>,
    pub answer: Option<String>,
    pub id: Option<String>,
    /// Columns kept in the task's metadata.
    #[serde(default)]
    pub metadata: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RewardSection {
    pub plugin: PathBuf,
    #[serde(default = "one")]
    pub weight: f32,
    #[serde(default)]
    pub config: toml::Table,
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// For a grader: the interpreter its programs run in.
    #[serde(default)]
    pub code_runner: Option<CodeRunnerSection>,
}

/// The code-runner component of a grader, with the most one program may use.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CodeRunnerSection {
    pub plugin: PathBuf,
    /// Wall-clock limit per program (default 10 s).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Memory limit per program (default 512 MiB).
    #[serde(default)]
    pub memory_mib: Option<u64>,
    /// Worker processes the programs run in (default 0: in the training process). Programs
    /// of groups scored at once then scale with cores as subprocesses do.
    #[serde(default)]
    pub workers: usize,
}

fn one() -> f32 {
    1.0
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingSection {
    pub max_tokens: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: usize,
}

impl Default for SamplingSection {
    fn default() -> Self {
        SamplingSection { max_tokens: 64, temperature: 1.0, top_p: 1.0, top_k: 0 }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpoSection {
    pub steps: usize,
    pub prompts_per_step: usize,
    pub group_size: usize,
    pub learning_rate: f64,
    pub warmup_steps: usize,
    pub schedule: Schedule,
    pub weight_decay: f64,
    pub max_grad_norm: Option<f64>,
    /// KL coefficient; 0 keeps no reference model.
    pub beta: f64,
    pub clip_low: f64,
    pub clip_high: f64,
    pub entropy: f64,
    /// μ: updates per batch of rollouts (old log-probs from before the first).
    pub inner_epochs: usize,
    pub advantage: AdvantageMode,
    pub aggregation: Aggregation,
    /// What a trajectory whose scoring fails becomes: `mask` (no gradient, counted) or
    /// `reward` (trained on, with `failure_reward` for the failed plugin's reward).
    pub on_failure: OnFailure,
    /// The reward that stands for a failed plugin call's under `on_failure = "reward"`.
    pub failure_reward: f32,
    /// A completion passes when its reward is at least this.
    pub pass_reward: f32,
    pub seed: u64,
    /// Write a checkpoint every this many steps (0: only at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// Keep the newest this many checkpoints; older ones are deleted once a newer one is
    /// complete and verified (0: keep every one; each holds the weights and the optimizer's
    /// moments, 1.6 GB for the 135M model).
    pub keep_checkpoints: usize,
    /// Updates in a row whose gradient is not finite (each skipped with a warning) after
    /// which the run stops, with a checkpoint of the last good weights.
    pub max_skipped_updates: usize,
    /// Above this many MiB of attention intermediates a group's backward would keep, the
    /// layers are recomputed one at a time instead (peak memory of one layer's graph, one
    /// more forward of time). The default, 0, always recomputes: on the default job it takes
    /// the training peak from 5.9 to 4.7 GiB for ~7 % more step time (docs/BENCHMARKS.md).
    pub recompute_above_mib: u64,
    /// When the layers go one at a time, the top layers whose graphs fit in this many MiB
    /// keep them from the forward instead of running again in the backward (0: every layer
    /// runs again, one layer's graph alive at a time). Each kept layer saves a layer's
    /// forward; the default job's widest groups need ~1.5 GiB to keep all 30.
    pub keep_activations_mib: u64,
    /// The head's vocabulary-wide tensors are computed a chunk of positions at a time, each
    /// `[rows, positions, vocab]` tensor at most this many MiB (0: the whole group at once).
    pub head_chunk_mib: u64,
    /// Completions per forward and backward: larger groups are split into micro-batches of
    /// this many, their gradients summed (0: a whole group at once).
    pub micro_batch_rows: usize,
    /// Train a group's completions in micro-batches of similar length where that trains
    /// fewer padded positions (one long completion no longer pads every row to its
    /// length); the gradients are the whole group's.
    pub split_by_length: bool,
    /// Overlap a step's phases where the result cannot change: a group is scored as soon
    /// as its samples finish (while others still generate) and the next step's tasks are
    /// drawn while this step trains. `false` runs them one after another (same metrics).
    pub overlap: bool,
    /// 1: the next step's groups are sampled while this step trains, by the weights before
    /// its update (one update stale, corrected by the truncated importance weight); 0: each
    /// step samples with its own weights (the default: on the CPU both phases use every
    /// core, docs/BENCHMARKS.md).
    pub generation_lag: usize,
    /// The cap C of the importance weight min(π_old / π_sampler, C) of lagged groups.
    pub tis_cap: f64,
}

impl Default for GrpoSection {
    fn default() -> Self {
        GrpoSection {
            steps: 20,
            prompts_per_step: 4,
            group_size: 8,
            learning_rate: 1e-5,
            warmup_steps: 0,
            schedule: Schedule::Constant,
            weight_decay: 0.0,
            max_grad_norm: Some(1.0),
            beta: 0.04,
            clip_low: 0.2,
            clip_high: 0.2,
            entropy: 0.0,
            inner_epochs: 1,
            advantage: AdvantageMode::Grpo,
            aggregation: Aggregation::TokenMean,
            on_failure: OnFailure::Mask,
            failure_reward: 0.0,
            pass_reward: 1.0,
            seed: 0,
            checkpoint_every: 10,
            keep_checkpoints: 3,
            max_skipped_updates: 3,
            recompute_above_mib: 0,
            keep_activations_mib: 1024,
            head_chunk_mib: 32,
            micro_batch_rows: 0,
            split_by_length: true,
            overlap: true,
            generation_lag: 0,
            tis_cap: 2.0,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Held-out tasks scored greedily before and after training (0: none).
    pub tasks: usize,
    /// Held-out tasks are taken from this index on; training uses the indices below it.
    pub first_index: u64,
    /// `wirl eval` only: completions sampled per task (at `[sampling]`'s temperature) for
    /// pass@k; 0 for the greedy pass rate alone.
    pub samples: usize,
    /// The k of pass@k (each at most `samples`).
    pub k: Vec<usize>,
    /// Tasks generated together (more is faster, up to memory).
    pub batch_tasks: usize,
}

impl Default for EvalSection {
    fn default() -> Self {
        EvalSection { tasks: 50, first_index: 1 << 40, samples: 0, k: vec![1], batch_tasks: 4 }
    }
}

/// A checked configuration, in the types the trainer runs on.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// A GGUF file, an HF directory or the default model's name (the caller resolves it).
    pub model: String,
    /// At least one; the trained ones' weights allocate at least one group each.
    pub tasks: Vec<TaskSpec>,
    /// The run's `[sampling]`; each task's own is in its spec. `max_tokens` here is the
    /// `constant` aggregation's divisor.
    pub sampling: SamplingSpec,
    pub grpo: GrpoSection,
    pub eval: EvalSection,
}

/// A task of the run, validated (the task runtime's own type: train, eval and serve load it alike).
pub use wirl_rollout::TaskSpec;

impl RunConfig {
    /// Groups per step for each task, by Megatron's rule (checked on load).
    pub fn allocation(&self) -> anyhow::Result<wirl_rollout::Allocation> {
        let weights: Vec<f64> = self.tasks.iter().map(|t| t.weight).collect();
        Ok(wirl_rollout::allocate(&weights, self.grpo.prompts_per_step)?)
    }
}

/// A TOML table as the plugin's JSON config.
fn json_config(table: &toml::Table) -> serde_json::Map<String, serde_json::Value> {
    table.iter().map(|(key, value)| (key.clone(), serde_json::to_value(value).unwrap_or_default())).collect()
}

/// One task as the config gives it, `[[tasks]]` or the single-source keys alike, with the
/// key prefix that its errors name.
struct TaskView<'a> {
    /// `tasks[1].` or empty.
    key: String,
    name: String,
    weight: f64,
    eval_only: bool,
    environment: Option<&'a PluginSection>,
    dataset: Option<&'a DatasetSection>,
    agent: Option<&'a AgentSection>,
    remote: Option<&'a RemoteSection>,
    rewards: &'a [RewardSection],
    /// `tasks[1].rewards` or `rewards`.
    rewards_key: String,
    sampling: &'a SamplingOverrides,
    on_failure: Option<OnFailure>,
    max_turns: usize,
    pass_reward: Option<f32>,
    /// Whether the task named rewards of its own (not the shared ones).
    own_rewards: bool,
}

static NO_OVERRIDES: SamplingOverrides =
    SamplingOverrides { max_tokens: None, temperature: None, top_p: None, top_k: None };

impl TaskView<'_> {
    fn sampling(&self, run: &SamplingSection) -> SamplingSpec {
        let own = self.sampling;
        SamplingSpec {
            max_tokens: own.max_tokens.unwrap_or(run.max_tokens),
            temperature: own.temperature.unwrap_or(run.temperature),
            top_p: own.top_p.unwrap_or(run.top_p),
            top_k: own.top_k.unwrap_or(run.top_k),
        }
    }
}

/// A plugin's name as its file would give it: `arithmetic` for `.../arithmetic.wasm` and for
/// `builtin:arithmetic`.
fn plugin_stem(reference: &Path) -> String {
    match wirl_builtins::lookup(reference) {
        Ok(Some(builtin)) => builtin.spec().name,
        _ => reference.file_stem().map_or("plugin".into(), |s| s.to_string_lossy().into_owned()),
    }
}

/// A plugin entry of any section (environment, reward, agent) as the rollout layer's spec.
fn plugin_ref(path: &Path, config: &toml::Table, deadline_ms: Option<u64>, memory_mib: Option<u64>) -> PluginRef {
    PluginRef { path: path.to_path_buf(), stored: None, config: json_config(config), deadline_ms, memory_mib }
}

impl TrainConfig {
    /// The tasks, `[[tasks]]` or the one of the single-source keys (named after its
    /// environment plugin's file, or `dataset`).
    fn task_views(&self) -> Vec<TaskView<'_>> {
        if self.tasks.is_empty() {
            let name = match &self.environment {
                Some(environment) => plugin_stem(&environment.plugin),
                None => "dataset".to_string(),
            };
            return vec![TaskView {
                key: String::new(),
                name,
                weight: 1.0,
                eval_only: false,
                environment: self.environment.as_ref(),
                dataset: self.dataset.as_ref(),
                agent: None,
                remote: None,
                rewards: &self.rewards,
                rewards_key: "rewards".into(),
                sampling: &NO_OVERRIDES,
                on_failure: None,
                max_turns: 1,
                pass_reward: None,
                own_rewards: true,
            }];
        }
        self.tasks
            .iter()
            .enumerate()
            .map(|(i, task)| {
                let (rewards, rewards_key) = if task.rewards.is_empty() {
                    (&self.rewards[..], "rewards".to_string())
                } else {
                    (&task.rewards[..], format!("tasks[{i}].rewards"))
                };
                TaskView {
                    key: format!("tasks[{i}]."),
                    name: task.name.clone(),
                    weight: task.weight,
                    eval_only: task.eval_only,
                    environment: task.environment.as_ref(),
                    dataset: task.dataset.as_ref(),
                    agent: task.agent.as_ref(),
                    remote: task.remote.as_ref(),
                    rewards,
                    rewards_key,
                    sampling: &task.sampling,
                    on_failure: task.on_failure,
                    max_turns: task.max_turns,
                    pass_reward: task.pass_reward,
                    own_rewards: !task.rewards.is_empty(),
                }
            })
            .collect()
    }

    /// The validated form. Only for a config that `parse` (or `check_numbers`, after an
    /// override) accepted.
    pub fn run_config(&self) -> anyhow::Result<RunConfig> {
        let mut tasks = Vec::new();
        for view in self.task_views() {
            let source = match (view.environment, view.dataset, view.agent) {
                _ if view.remote.is_some() => {
                    let remote = view.remote.expect("checked");
                    let api_key = match &remote.api_key_env {
                        None => None,
                        Some(variable) => Some(std::env::var(variable).map_err(|_| {
                            anyhow::anyhow!(
                                "task `{}`: remote.api_key_env names {variable}, which is not set: export it with the \
                                 server's key",
                                view.name
                            )
                        })?),
                    };
                    SourceSpec::Remote(wirl_rollout::RemoteSpec {
                        url: remote.url.clone(),
                        task: remote.task.clone(),
                        timeout: std::time::Duration::from_secs_f64(remote.timeout_s),
                        retries: remote.retries,
                        api_key,
                    })
                }
                (Some(environment), None, None) => {
                    let e = environment;
                    let plugin = plugin_ref(&e.plugin, &e.config, e.deadline_ms, e.memory_mib);
                    SourceSpec::Environment { plugin, seed: e.seed }
                }
                (None, Some(dataset), None) => {
                    let spec = |path: &Option<PathBuf>| {
                        path.as_ref().map(|path| {
                            Box::new(DatasetSpec {
                                path: path.clone(),
                                columns: dataset.columns.as_ref().map(|c| Columns {
                                    prompt: c.prompt.clone(),
                                    messages: c.messages.clone(),
                                    system: c.system.clone(),
                                    answer: c.answer.clone(),
                                    id: c.id.clone(),
                                    metadata: c.metadata.clone(),
                                }),
                                shuffle: dataset.shuffle,
                                seed: dataset.seed,
                            })
                        })
                    };
                    SourceSpec::Dataset { train: spec(&dataset.train), eval: spec(&dataset.eval) }
                }
                (None, None, Some(agent)) => SourceSpec::Agent {
                    plugin: plugin_ref(&agent.plugin, &agent.config, agent.deadline_ms, agent.memory_mib),
                    limits: AgentLimits { generate_calls: agent.max_generate_calls, tokens: agent.max_tokens },
                },
                _ => bail!("task `{}` needs exactly one source: an environment, a dataset or an agent", view.name),
            };
            let rewards = view
                .rewards
                .iter()
                .map(|reward| RewardSpec {
                    plugin: plugin_ref(&reward.plugin, &reward.config, reward.deadline_ms, reward.memory_mib),
                    weight: reward.weight,
                    code_runner: reward.code_runner.as_ref().map(|runner| CodeRunnerRef {
                        path: runner.plugin.clone(),
                        stored: None,
                        deadline_ms: runner.deadline_ms,
                        memory_mib: runner.memory_mib,
                        workers: runner.workers,
                    }),
                })
                .collect();
            let rewards = if view.max_turns > 1 || view.agent.is_some() { Vec::new() } else { rewards };
            tasks.push(TaskSpec {
                max_turns: view.max_turns,
                pass_reward: view.pass_reward.unwrap_or(self.grpo.pass_reward),
                failures: FailurePolicy {
                    on_failure: view.on_failure.unwrap_or(self.grpo.on_failure),
                    failure_reward: self.grpo.failure_reward,
                },
                weight: if view.eval_only { 0.0 } else { view.weight },
                sampling: view.sampling(&self.sampling),
                name: view.name,
                source,
                rewards,
            });
        }
        let s = &self.sampling;
        Ok(RunConfig {
            model: self.model.path.clone(),
            tasks,
            sampling: SamplingSpec {
                max_tokens: s.max_tokens,
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k,
            },
            grpo: self.grpo.clone(),
            eval: self.eval.clone(),
        })
    }

    /// The embedded default ([`DEFAULT_TOML`]): its plugins are built in, so it runs from any
    /// folder.
    pub fn embedded_default() -> anyhow::Result<Self> {
        Self::parse(DEFAULT_TOML, "the embedded default config (examples/train/default.toml)", Path::new("."))
    }

    /// Parse `text` (from `origin`), resolve plugin paths against `base`, and check it.
    pub fn parse(text: &str, origin: &str, base: &Path) -> anyhow::Result<Self> {
        let config: TrainConfig = toml::from_str(text).map_err(|e| {
            anyhow::anyhow!("{origin}: {}", e.to_string().trim_end())
                .context("the training config is not valid; see examples/train/default.toml for every key")
        })?;
        config.resolved(origin, base)
    }

    /// Files (not built-ins) joined to `base`, checked, then absolute: the run directory
    /// keeps the config for `--resume`.
    fn resolved(mut self, origin: &str, base: &Path) -> anyhow::Result<Self> {
        for path in self.paths() {
            *path = base.join(&*path);
        }
        self.check(origin)?;
        for path in self.paths() {
            *path = std::fs::canonicalize(&*path).with_context(|| format!("{origin}: {}", path.display()))?;
        }
        Ok(self)
    }

    /// The run's tasks as a task set: `[[tasks]]` as given, or the one task of the
    /// single-source keys as a `[[tasks]]` entry (same name, same specs).
    pub fn task_set(&self) -> TaskSet {
        if !self.tasks.is_empty() {
            return TaskSet { tasks: self.tasks.clone(), rewards: self.rewards.clone() };
        }
        let view = &self.task_views()[0];
        let task = TaskSection {
            name: view.name.clone(),
            weight: 1.0,
            eval_only: false,
            environment: self.environment.clone(),
            dataset: self.dataset.clone(),
            agent: None,
            remote: None,
            rewards: Vec::new(),
            sampling: SamplingOverrides::default(),
            on_failure: None,
            max_turns: 1,
            pass_reward: None,
        };
        TaskSet { tasks: vec![task], rewards: self.rewards.clone() }
    }

    /// This config with its tasks replaced by `set` (read from `origin`; its relative paths
    /// from `base`), checked as a whole.
    pub fn with_task_set(&self, set: TaskSet, origin: &str, base: &Path) -> anyhow::Result<Self> {
        if set.tasks.is_empty() {
            bail!("{origin}: no [[tasks]]: a task set names every task of the run as a [[tasks]] table");
        }
        let config =
            TrainConfig { tasks: set.tasks, rewards: set.rewards, environment: None, dataset: None, ..self.clone() };
        config.resolved(origin, base)
    }

    /// A run directory's resolved config (absolute paths): its plugin files need not exist
    /// any more, the run keeps their bytes.
    pub fn parse_resolved(text: &str, origin: &str) -> anyhow::Result<Self> {
        let config: TrainConfig =
            toml::from_str(text).map_err(|e| anyhow::anyhow!("{origin}: {}", e.to_string().trim_end()))?;
        config.check_with(origin, false)?;
        Ok(config)
    }

    /// This config with the task set of a run manifest (absolute paths; its plugins are the
    /// bytes the run keeps, so their files need not exist any more).
    pub fn with_manifest_tasks(&self, set: &TaskSet) -> anyhow::Result<Self> {
        let config = TrainConfig {
            tasks: set.tasks.clone(),
            rewards: set.rewards.clone(),
            environment: None,
            dataset: None,
            ..self.clone()
        };
        config.check_with("the run manifest", false)?;
        Ok(config)
    }

    /// Read a task set file (`[[tasks]]`, shared `[[rewards]]`; paths relative to it).
    pub fn read_task_set(path: &Path) -> anyhow::Result<TaskSet> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        Self::parse_task_set(&text, &path.display().to_string(), parent)
    }

    /// A task set's text (from `origin`), its relative paths from `parent`.
    pub fn parse_task_set(text: &str, origin: &str, parent: &Path) -> anyhow::Result<TaskSet> {
        let mut set: TaskSet = toml::from_str(text).map_err(|e| {
            anyhow::anyhow!("{origin}: {}", e.to_string().trim_end())
                .context("not a task set: [[tasks]] tables (and shared [[rewards]]), as in a training config")
        })?;
        // Relative paths from the file's directory, as in a config; built-ins stay names.
        let base = std::fs::canonicalize(parent).with_context(|| format!("{}", parent.display()))?;
        let mut probe = TrainConfig {
            tasks: std::mem::take(&mut set.tasks),
            rewards: std::mem::take(&mut set.rewards),
            ..Self::minimal()
        };
        for path in probe.paths() {
            *path = base.join(&*path);
        }
        Ok(TaskSet { tasks: probe.tasks, rewards: probe.rewards })
    }

    /// A config with no task, for path handling.
    fn minimal() -> Self {
        TrainConfig {
            model: ModelSection { path: String::new() },
            tasks: Vec::new(),
            environment: None,
            dataset: None,
            rewards: Vec::new(),
            sampling: SamplingSection::default(),
            grpo: GrpoSection::default(),
            eval: EvalSection::default(),
            swap: SwapSection::default(),
        }
    }

    /// Every file the config names (not the built-in plugins it names).
    fn paths(&mut self) -> Vec<&mut PathBuf> {
        fn of<'a>(
            paths: &mut Vec<&'a mut PathBuf>,
            environment: Option<&'a mut PluginSection>,
            dataset: Option<&'a mut DatasetSection>,
            rewards: &'a mut [RewardSection],
        ) {
            for reward in rewards {
                paths.push(&mut reward.plugin);
                paths.extend(reward.code_runner.as_mut().map(|r| &mut r.plugin));
            }
            paths.extend(environment.map(|e| &mut e.plugin));
            if let Some(dataset) = dataset {
                paths.extend(dataset.train.as_mut());
                paths.extend(dataset.eval.as_mut());
            }
        }
        let mut paths: Vec<&mut PathBuf> = Vec::new();
        of(&mut paths, self.environment.as_mut(), self.dataset.as_mut(), &mut self.rewards);
        for task in &mut self.tasks {
            of(&mut paths, task.environment.as_mut(), task.dataset.as_mut(), &mut task.rewards);
            paths.extend(task.agent.as_mut().map(|a| &mut a.plugin));
        }
        paths.retain(|path| !wirl_builtins::is_builtin(path));
        paths
    }

    /// Set one key from the command line: `grpo.group_size=4`, `sampling.max_tokens=16`,
    /// `tasks.1.weight=0` (an array's element by index). VALUE is a TOML value; a bare word
    /// is a string. The whole config is checked again, so a wrong key or value is refused
    /// with its name.
    pub fn set(&mut self, assignment: &str) -> anyhow::Result<()> {
        let origin = format!("--set {assignment}");
        let Some((key, text)) = assignment.split_once('=') else {
            bail!("{origin}: expected KEY=VALUE, for example grpo.group_size=4");
        };
        let value = match toml::from_str::<toml::Table>(&format!("value = {text}")) {
            Ok(mut table) => table.remove("value").expect("the key just parsed"),
            Err(_) => toml::Value::String(text.to_string()),
        };
        let mut tree = toml::Value::try_from(&*self)?;
        let segments: Vec<&str> = key.split('.').collect();
        let (last, parents) = segments.split_last().expect("split yields one segment at least");
        let mut node = &mut tree;
        for (depth, segment) in parents.iter().enumerate() {
            let here = segments[..=depth].join(".");
            node = match node {
                toml::Value::Table(table) => {
                    table.get_mut(*segment).with_context(|| format!("{origin}: the config has no table `{here}`"))?
                }
                toml::Value::Array(items) => {
                    let len = items.len();
                    segment
                        .parse::<usize>()
                        .ok()
                        .and_then(|i| items.get_mut(i))
                        .with_context(|| format!("{origin}: `{here}`: give an index below {len}"))?
                }
                _ => bail!("{origin}: `{}` is a value, not a table", segments[..depth].join(".")),
            };
        }
        match node {
            toml::Value::Table(table) => {
                table.insert(last.to_string(), value);
            }
            toml::Value::Array(items) => {
                let len = items.len();
                let item = last
                    .parse::<usize>()
                    .ok()
                    .and_then(|i| items.get_mut(i))
                    .with_context(|| format!("{origin}: `{key}`: give an index below {len}"))?;
                *item = value;
            }
            _ => bail!("{origin}: `{}` is a value, not a table", parents.join(".")),
        }
        *self = tree.try_into().map_err(|e: toml::de::Error| anyhow::anyhow!("{origin}: {}", e.message()))?;
        // Plugin files are not required: a resumed run loads the bytes it keeps.
        self.check_with(&origin, false)
    }

    /// Load from a TOML file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, &path.display().to_string(), base)
    }

    fn check(&self, origin: &str) -> anyhow::Result<()> {
        self.check_with(origin, true)
    }

    /// [`TrainConfig::check`]; without `plugins_on_disk`, plugin files need not exist (a
    /// manifest's plugins are loaded from the bytes the run keeps).
    fn check_with(&self, origin: &str, plugins_on_disk: bool) -> anyhow::Result<()> {
        // A file's path is read from the config's directory; one given by `--set`, from here.
        let relative_to = if origin.starts_with("--set") { "the current directory" } else { "the config's directory" };
        // A plugin is a file, or a built-in named `builtin:NAME`.
        let check_plugin = |key: &str, path: &Path| -> anyhow::Result<()> {
            match wirl_builtins::lookup(path) {
                Err(message) => bail!("{origin}: `{key}`: {message}"),
                Ok(Some(_)) => Ok(()),
                Ok(None) if path.is_file() || !plugins_on_disk => Ok(()),
                Ok(None) => bail!(
                    "{origin}: `{key}`: plugin file {} does not exist (build the plugins with scripts/build-plugins, \
                     name a built-in such as builtin:math-answer, or fix the path; relative paths are from \
                     {relative_to})",
                    path.display()
                ),
            }
        };
        if !self.tasks.is_empty() && (self.environment.is_some() || self.dataset.is_some()) {
            bail!(
                "{origin}: with [[tasks]], each task names its own source: move [environment] into a task as \
                 [tasks.environment] (or [dataset] as [tasks.dataset])"
            );
        }
        let mut names = std::collections::BTreeSet::new();
        for view in self.task_views() {
            let key = &view.key;
            let where_ = if key.is_empty() { String::new() } else { format!(" of `{key}name` = {:?}", view.name) };
            if !key.is_empty() {
                let fine = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
                if view.name.is_empty() || view.name.len() > 64 || !view.name.chars().all(fine) {
                    bail!(
                        "{origin}: `{key}name` = {:?}: a task's name is 1 to 64 letters, digits, `-`, `_` or `.`",
                        view.name
                    );
                }
                if !names.insert(view.name.clone()) {
                    bail!("{origin}: `{key}name`: two tasks are named {:?}; names must be unique", view.name);
                }
            }
            if let Some(remote) = view.remote {
                if view.agent.is_some() || view.environment.is_some() || view.dataset.is_some() {
                    bail!(
                        "{origin}: give one of [{key}environment], [{key}dataset], [{key}agent] or [{key}remote], not several"
                    );
                }
                if view.own_rewards {
                    bail!(
                        "{origin}: `{key}rewards`: a remote task is scored by its server; remove its [[{key}rewards]]"
                    );
                }
                if view.max_turns > 1 {
                    bail!("{origin}: `{key}max_turns`: remote tasks are single-turn (max_turns = 1)");
                }
                let url = remote.url.trim_end_matches('/');
                let host = url.strip_prefix("http://").unwrap_or_default();
                if host.is_empty() || host.contains(['/', '?', '#', ' ']) {
                    bail!(
                        "{origin}: `{key}remote.url` = {:?}: give the server as http://HOST:PORT (as `wirl serve` prints it)",
                        remote.url
                    );
                }
                if !(remote.timeout_s.is_finite() && remote.timeout_s > 0.0 && remote.timeout_s <= 3600.0) {
                    bail!("{origin}: `{key}remote.timeout_s` must be a number of seconds above 0, at most 3600");
                }
                if remote.retries > 10 {
                    bail!("{origin}: `{key}remote.retries` must be at most 10");
                }
                continue;
            }
            if view.agent.is_some() && (view.environment.is_some() || view.dataset.is_some()) {
                bail!("{origin}: give one of [{key}environment], [{key}dataset] or [{key}agent]{where_}, not several");
            }
            if let Some(agent) = view.agent {
                check_plugin(&format!("{key}agent.plugin"), &agent.plugin)?;
                if view.own_rewards {
                    bail!("{origin}: `{key}rewards`: an agent scores its own rollouts; remove its [[{key}rewards]]");
                }
                if view.max_turns > 1 {
                    bail!("{origin}: `{key}max_turns`: an agent decides its turns itself; leave max_turns out");
                }
                for (name, value) in
                    [("max_generate_calls", agent.max_generate_calls), ("max_tokens", agent.max_tokens)]
                {
                    if value == 0 {
                        bail!("{origin}: `{key}agent.{name}` must be at least 1");
                    }
                }
                continue;
            }
            match (view.environment, view.dataset) {
                (Some(environment), None) => {
                    check_plugin(&format!("{key}environment.plugin"), &environment.plugin)?;
                }
                (None, Some(dataset)) => {
                    if dataset.train.is_none() && dataset.eval.is_none() {
                        bail!(
                            "{origin}: [{key}dataset] names no file: set `train` (to train) and/or `eval` (held-out tasks)"
                        );
                    }
                    if dataset.train.is_none() && !view.eval_only && view.weight > 0.0 && !key.is_empty() {
                        bail!(
                            "{origin}: `{key}dataset` has no `train` file but the task trains (weight {}): name one, \
                             or set `{key}eval_only = true`",
                            view.weight
                        );
                    }
                    for (name, path) in
                        dataset.train.iter().map(|p| ("train", p)).chain(dataset.eval.iter().map(|p| ("eval", p)))
                    {
                        if !path.exists() {
                            bail!(
                                "{origin}: `{key}dataset.{name}`: {} does not exist (relative paths are from \
                                 {relative_to})",
                                path.display()
                            );
                        }
                    }
                }
                (Some(_), Some(_)) => {
                    bail!("{origin}: give either [{key}environment] or [{key}dataset]{where_}, not both")
                }
                (None, None) if key.is_empty() => bail!(
                    "{origin}: no task source: add an [environment] table (a plugin) or a [dataset] table (JSONL), \
                     or [[tasks]]"
                ),
                (None, None) => {
                    bail!(
                        "{origin}: `{key}`: the task {:?} has no source: add [{key}environment], [{key}dataset] or \
                         [{key}agent]",
                        view.name
                    )
                }
            }
            if view.max_turns > 1 {
                if view.environment.is_none() {
                    bail!(
                        "{origin}: `{key}max_turns` = {}: episodes come from an environment plugin; a dataset task is \
                         single-turn (max_turns = 1)",
                        view.max_turns
                    );
                }
                if view.own_rewards && !key.is_empty() {
                    bail!(
                        "{origin}: `{key}rewards`: a multi-turn task (max_turns = {}) is scored by its environment's \
                         episodes; remove its [[{key}rewards]] or set max_turns = 1",
                        view.max_turns
                    );
                }
                continue;
            }
            if view.rewards.is_empty() {
                bail!(
                    "{origin}: `{}`: at least one reward plugin is needed{where_} (a [[rewards]] table{})",
                    view.rewards_key,
                    if key.is_empty() { String::new() } else { format!(", shared, or [[{key}rewards]]") }
                );
            }
            for (i, reward) in view.rewards.iter().enumerate() {
                let rkey = &view.rewards_key;
                check_plugin(&format!("{rkey}[{i}].plugin"), &reward.plugin)?;
                if let Some(runner) = &reward.code_runner {
                    check_plugin(&format!("{rkey}[{i}].code_runner.plugin"), &runner.plugin)?;
                }
            }
        }
        self.check_numbers(origin)
    }

    /// Every number of the config finite and in range, the error naming the key. Run on
    /// load and again after command-line overrides.
    pub fn check_numbers(&self, origin: &str) -> anyhow::Result<()> {
        let g = &self.grpo;
        let positive = [
            ("grpo.steps", g.steps),
            ("grpo.prompts_per_step", g.prompts_per_step),
            ("grpo.inner_epochs", g.inner_epochs),
            ("grpo.max_skipped_updates", g.max_skipped_updates),
            ("sampling.max_tokens", self.sampling.max_tokens),
        ];
        for (key, value) in positive {
            if value == 0 {
                bail!("{origin}: `{key}` must be at least 1");
            }
        }
        if g.group_size < 2 {
            bail!("{origin}: `grpo.group_size` must be at least 2 (advantages compare samples of a group)");
        }
        let w = &self.swap;
        if w.rollback_window == 0 {
            bail!("{origin}: `swap.rollback_window` must be at least 1");
        }
        let swap_floats: [FloatRule; 3] = [
            ("swap.max_failure_rate", w.max_failure_rate, "in [0, 1]", |x| (0.0..=1.0).contains(&x)),
            ("swap.rollback_failure_rate", w.rollback_failure_rate, "in [0, 1]", |x| (0.0..=1.0).contains(&x)),
            ("swap.backoff_s", w.backoff_s, "a number of seconds >= 0", |x| (0.0..=1e7).contains(&x)),
        ];
        for (key, value, wanted, ok) in swap_floats {
            if !(value.is_finite() && ok(value)) {
                bail!("{origin}: `{key}` = {value}: it must be {wanted}");
            }
        }
        // `!(x >= lo)` and friends are true for NaN too: every comparison below refuses NaN.
        let floats: [FloatRule; 9] = [
            ("grpo.learning_rate", g.learning_rate, "a positive number", |x| x > 0.0),
            ("grpo.weight_decay", g.weight_decay, "a number >= 0", |x| x >= 0.0),
            ("grpo.beta", g.beta, "a number >= 0", |x| x >= 0.0),
            ("grpo.clip_low", g.clip_low, "in [0, 1)", |x| (0.0..1.0).contains(&x)),
            ("grpo.clip_high", g.clip_high, "a number >= 0", |x| x >= 0.0),
            ("grpo.entropy", g.entropy, "a finite number", |_| true),
            ("grpo.failure_reward", f64::from(g.failure_reward), "a finite number", |_| true),
            ("grpo.pass_reward", f64::from(g.pass_reward), "a finite number", |_| true),
            ("grpo.tis_cap", g.tis_cap, "a number >= 1", |x| x >= 1.0),
        ];
        for (key, value, wanted, ok) in floats {
            if !(value.is_finite() && ok(value)) {
                bail!("{origin}: `{key}` = {value}: it must be {wanted}");
            }
        }
        if let Some(norm) = g.max_grad_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            bail!(
                "{origin}: `grpo.max_grad_norm` = {norm}: it must be a positive number (leave it out for no clipping)"
            );
        }
        check_sampling(origin, "sampling.", &self.sampling.clone().into())?;
        let views = self.task_views();
        if g.generation_lag > 1 {
            bail!(
                "{origin}: `grpo.generation_lag` = {}: it must be 0 (sample with the step's own weights) or 1 (sample the \
                 next step while this one trains)",
                g.generation_lag
            );
        }
        if g.generation_lag > 0
            && let Some(view) = views.iter().find(|v| !v.eval_only && (v.max_turns > 1 || v.agent.is_some()))
        {
            let what = if view.agent.is_some() { "an agent task" } else { "a multi-turn task" };
            bail!(
                "{origin}: `grpo.generation_lag` = 1 samples single-turn tasks only, and task `{}` ({}) is {what} \
                 (its later turns would be sampled by newer weights than its first): set `grpo.generation_lag = 0`",
                view.name,
                if view.key.is_empty() { "the top-level task" } else { view.key.trim_end_matches('.') }
            );
        }
        for view in &views {
            let key = &view.key;
            if let Some(pass) = view.pass_reward
                && !pass.is_finite()
            {
                bail!("{origin}: `{key}pass_reward` = {pass}: it must be a finite number");
            }
            if !(1..=MAX_TURNS).contains(&view.max_turns) {
                bail!("{origin}: `{key}max_turns` = {}: it must be between 1 and {MAX_TURNS}", view.max_turns);
            }
            if !key.is_empty() {
                check_sampling(origin, &format!("{key}sampling."), view.sampling)?;
                if !(view.weight.is_finite() && view.weight >= 0.0) {
                    bail!("{origin}: `{key}weight` = {}: it must be a finite number >= 0", view.weight);
                }
            }
            for (i, reward) in view.rewards.iter().enumerate() {
                if !reward.weight.is_finite() {
                    bail!(
                        "{origin}: `{}[{i}].weight` = {}: it must be a finite number",
                        view.rewards_key,
                        reward.weight
                    );
                }
                if let Some(runner) = &reward.code_runner
                    && runner.workers > wirl_sandbox::MAX_WORKERS
                {
                    bail!(
                        "{origin}: `{}[{i}].code_runner.workers` = {}: it must be between 0 (programs run in \
                         process) and {}",
                        view.rewards_key,
                        runner.workers,
                        wirl_sandbox::MAX_WORKERS
                    );
                }
            }
            // Memory in MiB becomes bytes: a value that cannot is refused, not wrapped.
            let mut memories: Vec<(String, Option<u64>)> = Vec::new();
            if let Some(environment) = view.environment {
                memories.push((format!("{key}environment.memory_mib"), environment.memory_mib));
            }
            if let Some(agent) = view.agent {
                memories.push((format!("{key}agent.memory_mib"), agent.memory_mib));
            }
            for (i, reward) in view.rewards.iter().enumerate() {
                let rkey = &view.rewards_key;
                memories.push((format!("{rkey}[{i}].memory_mib"), reward.memory_mib));
                if let Some(runner) = &reward.code_runner {
                    memories.push((format!("{rkey}[{i}].code_runner.memory_mib"), runner.memory_mib));
                }
            }
            for (key, mib) in memories {
                if let Some(mib) = mib
                    && !(1..=MAX_MEMORY_MIB).contains(&mib)
                {
                    bail!(
                        "{origin}: `{key}` = {mib}: it must be between 1 and {MAX_MEMORY_MIB} (the sandbox's maximum)"
                    );
                }
            }
        }
        if g.failure_reward != 0.0 && views.iter().all(|v| v.on_failure.unwrap_or(g.on_failure) == OnFailure::Mask) {
            bail!(
                "{origin}: `grpo.failure_reward` = {} is used only where failures are rewarded: set \
                 `grpo.on_failure = \"reward\"` (or a task's `on_failure`), or leave it out (failed trajectories are \
                 masked by default)",
                g.failure_reward
            );
        }
        // Each trained task gets at least one group a step (Megatron's rule).
        let weights: Vec<f64> = views.iter().map(|v| if v.eval_only { 0.0 } else { v.weight }).collect();
        if let Err(error) = wirl_rollout::allocate(&weights, g.prompts_per_step) {
            let error = match error {
                wirl_rollout::MixtureError::NothingToSample => {
                    "no task is trained on: give at least one task a positive weight and no `eval_only`".to_string()
                }
                other => other.to_string(),
            };
            bail!("{origin}: {error}");
        }
        let training_tasks = (g.steps as u64).checked_mul(g.prompts_per_step as u64);
        let Some(training_tasks) = training_tasks.filter(|&n| n < 1 << 40) else {
            bail!("{origin}: `grpo.steps` x `grpo.prompts_per_step` is too large (at most 2^40 tasks)");
        };
        if views.iter().any(|v| v.environment.is_some()) && self.eval.first_index < training_tasks {
            bail!("{origin}: `eval.first_index` overlaps the training tasks; raise it above steps x prompts_per_step");
        }
        if let Some(&k) = self.eval.k.iter().find(|&&k| k == 0 || (self.eval.samples > 0 && k > self.eval.samples)) {
            bail!("{origin}: `eval.k` = {k}: each k must be between 1 and `eval.samples` ({})", self.eval.samples);
        }
        if self.eval.batch_tasks == 0 {
            bail!("{origin}: `eval.batch_tasks` must be at least 1");
        }
        Ok(())
    }
}

impl From<SamplingSection> for SamplingOverrides {
    fn from(s: SamplingSection) -> Self {
        SamplingOverrides {
            max_tokens: Some(s.max_tokens),
            temperature: Some(s.temperature),
            top_p: Some(s.top_p),
            top_k: Some(s.top_k),
        }
    }
}

/// The sampling keys under `prefix` that are set: in the engine's ranges
/// (`wirl_engine::sampling::rules`, as for the HTTP API), named on error; and a temperature
/// above 0, which training needs.
fn check_sampling(origin: &str, prefix: &str, sampling: &SamplingOverrides) -> anyhow::Result<()> {
    use wirl_engine::sampling::rules;
    if let Some(max_tokens) = sampling.max_tokens {
        rules::max_tokens(i64::try_from(max_tokens).unwrap_or(i64::MAX), usize::MAX)
            .map_err(|_| anyhow::anyhow!("{origin}: `{prefix}max_tokens` must be at least 1"))?;
    }
    if let Some(top_p) = sampling.top_p {
        rules::top_p(top_p.into())
            .map_err(|range| anyhow::anyhow!("{origin}: `{prefix}top_p` = {top_p}: it {range}"))?;
    }
    if let Some(temperature) = sampling.temperature {
        rules::temperature(temperature.into())
            .map_err(|range| anyhow::anyhow!("{origin}: `{prefix}temperature` = {temperature}: it {range}"))?;
        if temperature == 0.0 {
            bail!(
                "{origin}: `{prefix}temperature` = {temperature}: training needs a positive temperature (at 0 every \
                 sample of a group is the same, so no group carries a signal)"
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default config with its `[sampling]` keys replaced.
    fn with_sampling(keys: &str) -> anyhow::Result<TrainConfig> {
        let default = "[sampling]\nmax_tokens = 64\ntemperature = 1.0\n";
        assert!(DEFAULT_TOML.contains(default), "the default config's [sampling] changed: update this test");
        let text = DEFAULT_TOML.replace(default, &format!("[sampling]\n{keys}\n"));
        TrainConfig::parse(&text, "test.toml", Path::new("."))
    }

    #[test]
    fn sampling_keys_follow_the_engines_rules_and_training_needs_a_temperature() {
        with_sampling("max_tokens = 64\ntemperature = 2.0\ntop_p = 1.0").unwrap();
        for (keys, says) in [
            ("temperature = 2.5", "`sampling.temperature` = 2.5: it must be from 0 to 2"),
            ("temperature = nan", "`sampling.temperature` = NaN: it must be from 0 to 2"),
            ("temperature = inf", "`sampling.temperature` = inf: it must be from 0 to 2"),
            ("temperature = -1.0", "it must be from 0 to 2"),
            ("temperature = 0.0", "training needs a positive temperature"),
            ("top_p = 0.0", "`sampling.top_p` = 0: it must be in (0, 1]"),
            ("top_p = 1.5", "`sampling.top_p` = 1.5: it must be in (0, 1]"),
            ("max_tokens = 0", "`sampling.max_tokens` must be at least 1"),
        ] {
            let error = format!("{:#}", with_sampling(keys).unwrap_err());
            assert!(error.contains(says) && error.contains("test.toml"), "{keys}: {error}");
        }
    }
}
