//! A run's configuration: a TOML file parsed raw ([`TrainConfig`], what the run directory
//! keeps), checked once on load — an unknown key, a wrong type, a number out of range or a
//! missing plugin file is an error naming the file, the key and what to do — and converted
//! into the validated [`RunConfig`] that the trainer runs on, where a task source is an enum.
//!
//! By concern: this file is the schema (the TOML's sections and their defaults, and the
//! validated form); `files` reads a config or task set and resolves its paths; `validate`
//! holds every rule a config must meet; `lower` turns a checked config into a
//! [`RunConfig`]; `set` is the `--set KEY=VALUE` editor.

mod files;
pub use files::{MAX_CONFIG_BYTES, read_config_text};
mod lower;
pub mod preset;
mod set;
mod spelling;
mod validate;

use crate::error::{Context, bail};
use serde::{Deserialize, Serialize};
pub use spelling::{CorrectionSpec, KlSpec, LossSpec, OverlongSpec};
use std::path::{Path, PathBuf};
use wirl_grpo::{AdvantageMode, Aggregation, Schedule};
use wirl_rollout::{
    AgentLimits, CodeRunnerRef, Columns, DatasetSpec, FailurePolicy, InferenceBudget, JudgeModel, OnFailure, PluginRef,
    RewardModelRef, RewardSource, RewardSpec, SamplingSpec, SourceSpec,
};

/// The default run, embedded so that `wirl train` needs no file.
pub const DEFAULT_TOML: &str = include_str!("../../../../examples/train/default.toml");

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
    /// Train LoRA adapters on a frozen base instead of every weight (absent: every weight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<LoraSection>,
    /// On-policy distillation from a teacher model (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<DistillSection>,
}

/// `[distill]`: on-policy distillation. The teacher reads each sampled completion; each
/// token's advantage gains `weight × (log π_teacher − log π_student)` (the per-token reverse
/// KL's negative: tokens the teacher finds likelier than the student are reinforced), alone
/// (`rewards = false`) or added to the rewards' advantages.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct DistillSection {
    /// The teacher: an HF model directory or a GGUF file whose tokenizer is the student's.
    pub teacher: PathBuf,
    /// The KL term's weight (default 1).
    #[serde(default = "one_f64")]
    pub weight: f64,
    /// Whether the rewards' advantages are kept beside the KL term (default true); false:
    /// distillation alone, every group trained whatever its rewards.
    #[serde(default = "yes")]
    pub rewards: bool,
}

fn yes() -> bool {
    true
}

/// `[lora]`: the adapters a run trains, in PEFT's terms (its checkpoints are PEFT adapter
/// directories). The base stays frozen as loaded; the KL reference is the base itself.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LoraSection {
    pub rank: usize,
    pub alpha: f64,
    /// Dropout on the adapters' input. Only 0 is supported: the layer-by-layer backward
    /// rebuilds layers, and a rebuilt layer would draw another mask than its forward.
    pub dropout: f64,
    /// Which projections get adapters, by PEFT's module names (a name the model's family
    /// lacks is refused at load). The default: every projection the model has.
    pub target_modules: Vec<String>,
    /// Seeds the adapters' initial A matrices.
    pub seed: u64,
    /// How the frozen base's projection matrices are kept in memory: `f32`, or `bf16` (half
    /// the bytes; products widen them to f32 per use, so the arithmetic stays f32, and the
    /// sampler reads the same bf16 values). Embeddings, head and norms stay f32.
    pub base_dtype: BaseDtype,
}

/// `lora.base_dtype`.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BaseDtype {
    #[default]
    F32,
    Bf16,
}

impl Default for LoraSection {
    fn default() -> Self {
        LoraSection {
            rank: 16,
            alpha: 32.0,
            dropout: 0.0,
            target_modules: wirl_engine::lora::targets().into_iter().map(String::from).collect(),
            seed: 0,
            base_dtype: BaseDtype::F32,
        }
    }
}

impl LoraSection {
    pub fn spec(&self) -> wirl_engine::lora::LoraSpec {
        wirl_engine::lora::LoraSpec { rank: self.rank, alpha: self.alpha, target_modules: self.target_modules.clone() }
    }
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
    /// An OpenEnv server's environment: episodes over its WebSocket, scored by it.
    #[serde(default)]
    pub openenv: Option<OpenEnvSection>,
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

/// An environment served by an OpenEnv server (`openenv-core`): each episode a WebSocket
/// session reset with a seed derived from (`seed`, the task's index); the model's reply
/// sent as `action_field` of the action, the observation (its `observation_field`, or all
/// of it as JSON) shown as the next user message; the episode's return is its score.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OpenEnvSection {
    /// The server, `http://HOST:PORT`.
    pub url: String,
    /// The action's field that carries the model's reply.
    #[serde(default = "default_action_field")]
    pub action_field: String,
    /// The observation's field shown to the model (default: the whole observation, JSON).
    #[serde(default)]
    pub observation_field: Option<String>,
    /// A system message before the first observation.
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub seed: u64,
    /// Seconds per call (default 30).
    #[serde(default = "default_remote_timeout")]
    pub timeout_s: f64,
    /// Further tries to open a session (default 2).
    #[serde(default = "default_remote_retries")]
    pub retries: u32,
}

fn default_action_field() -> String {
    "message".into()
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
    /// Where the policy trains and samples: `cpu` (absent), `cuda` or `cuda:N` (a build made
    /// by scripts/build-cuda). Off the CPU the step takes candle's composed ops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// MiB of keys and values the sampler keeps for later requests that start the same way
    /// (an episode's next turn, an agent's next call compute only their new tokens); 0: none.
    /// Absent: 256 when a task is multi-turn or an agent, else 0 (single-turn groups share
    /// nothing across requests: a group's samples already share their prompt's computation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix_cache_mib: Option<u64>,
    /// The dtype of the sampler's weights while training: `f32` shares the trainer's (no
    /// copy: every update is seen in place); `bf16` or `f16` keeps a copy on the device,
    /// refreshed from the trainer's f32 weights after every update inside the weights
    /// barrier (half the bytes each decoding step reads; the sampler's log-probs are then
    /// not the trainer's, so μ > 1 computes old log-probs by a pass). Absent: `bf16` on a
    /// GPU, `f32` on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inference_dtype: Option<String>,
    /// The dtype of the trainer's products (projections, attention, the head): `f32`, or
    /// `bf16` — mixed precision: the weights the optimizer updates, its moments, norms,
    /// softmax, log-probs and the loss stay f32; only the products' operands are rounded
    /// (PyTorch autocast's rule). Absent: `f32` on every device (the GPU's default is to be
    /// chosen by a measurement there).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_dtype: Option<String>,
    /// Draw the sampler's tokens where the logits are (`wirl_engine::device_sampling`):
    /// only a token and a log-prob per row come back to the host each decoding step.
    /// Absent: off (its gain on a GPU is still to be measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_sampling: Option<bool>,
    /// Let a GPU's f32 products use TF32 tensor cores (10-bit mantissas in, f32 sums out:
    /// PyTorch's `allow_tf32`). Absent: off; no effect on the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tf32: Option<bool>,
    /// Variables the chat template sees beside the conversation in every render — training
    /// prompts, episodes, the held-out pass — as TRL's `chat_template_kwargs` and
    /// transformers' `apply_chat_template(**kwargs)`: `{ enable_thinking = false }` turns
    /// Qwen3's reasoning off. Absent: none.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub chat_template_kwargs: wirl_engine::TemplateVars,
}

/// `model.inference_dtype`, parsed.
pub fn parse_inference_dtype(text: &str) -> Option<candle_core::DType> {
    match text {
        "f32" => Some(candle_core::DType::F32),
        "bf16" => Some(candle_core::DType::BF16),
        "f16" => Some(candle_core::DType::F16),
        _ => None,
    }
}

/// `model.train_dtype`, parsed.
pub fn parse_train_dtype(text: &str) -> Option<candle_core::DType> {
    match text {
        "f32" => Some(candle_core::DType::F32),
        "bf16" => Some(candle_core::DType::BF16),
        _ => None,
    }
}

/// `model.prefix_cache_mib` when the config does not say (for multi-turn tasks and agents).
pub const DEFAULT_PREFIX_CACHE_MIB: u64 = 256;

/// `model.device`, parsed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    #[default]
    Cpu,
    Cuda(usize),
}

impl DeviceSpec {
    /// `cpu`, `cuda` or `cuda:N`.
    pub fn parse(text: &str) -> Option<DeviceSpec> {
        match text {
            "cpu" => Some(DeviceSpec::Cpu),
            "cuda" => Some(DeviceSpec::Cuda(0)),
            other => other.strip_prefix("cuda:")?.parse().ok().map(DeviceSpec::Cuda),
        }
    }

    /// The device (an error where this build has no CUDA, or the GPU is missing).
    pub fn open(self) -> crate::error::Result<candle_core::Device> {
        match self {
            DeviceSpec::Cpu => Ok(candle_core::Device::Cpu),
            DeviceSpec::Cuda(n) => candle_core::Device::new_cuda(n).map_err(|e| {
                crate::error::invalid!(
                    "`model.device` = \"cuda:{n}\": {e} (a CUDA build comes from scripts/build-cuda)"
                )
            }),
        }
    }
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
    /// A reward plugin: a component file or `builtin:NAME` (or `model` instead).
    #[serde(default)]
    pub plugin: Option<PathBuf>,
    /// A reward model: the directory of a sequence classifier (`...ForSequenceClassification`,
    /// as transformers saves it) that the engine runs over each completion (or `plugin`).
    #[serde(default)]
    pub model: Option<PathBuf>,
    /// Which of a reward model's scores is the reward (default 0: reward models have one).
    #[serde(default)]
    pub label: Option<usize>,
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
    /// For a `wirl:rl@0.2.0` plugin that calls the model (an LLM judge): `generate` calls per
    /// scoring call (default 8).
    #[serde(default)]
    pub inference_calls: Option<u64>,
    /// Tokens it may generate per scoring call, all its conversations together (default
    /// 8,192): a judge that rambles is cut there.
    #[serde(default)]
    pub inference_tokens: Option<u64>,
    /// The model its calls reach: `"policy"` (default: the model being trained), `"initial"`
    /// (the model the run started from, frozen), or another model's path (an HF directory
    /// or a GGUF file), loaded once for the run.
    #[serde(default)]
    pub judge_model: Option<PathBuf>,
}

/// `judge_model`'s words: not paths.
pub const JUDGE_WORDS: [&str; 2] = ["policy", "initial"];

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
    pub entropy: f64,
    /// μ: updates per batch of rollouts (old log-probs from before the first).
    pub inner_epochs: usize,
    /// `grpo` (a group's rewards normalised by its std), `mean-only` (Dr. GRPO), `rloo` (the
    /// leave-one-out baseline), `reinforce++`, `reinforce++-baseline` (whitened over the
    /// step) or `pass@k` (only a group's best completion, by its margin); docs/ALGORITHMS.md.
    pub advantage: AdvantageMode,
    pub aggregation: Aggregation,
    /// Completions cut at `max_tokens` carry no loss (they still count in their group's
    /// advantages): TRL's `mask_truncated_completions`.
    pub mask_truncated: bool,
    /// DAPO's dynamic sampling: a step whose groups with signal (rewards that differ) are
    /// fewer than `prompts_per_step` draws, rolls and scores `prompts_per_step` more tasks,
    /// until it has them or has drawn `max_draws` times; it trains on the first
    /// `prompts_per_step` with signal (verl's `filter_groups`). Agents' groups are not drawn
    /// again.
    pub dynamic_sampling: bool,
    /// The most draws a step makes under `dynamic_sampling`, its first included.
    pub max_draws: usize,
    /// A paper's combination of the keys above (`dr_grpo`, `dapo`; `config::preset`):
    /// filled in where the config does not set a key itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
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
    /// Completions of different groups trained side by side in one forward and backward, at
    /// most this many rows a pass (sorted by length; each row with its own prompt, the part
    /// the pass's prompts share run once): a GPU's pass costs about as much for 8 rows as for
    /// 64. 0: group by group, each group's prompt run once (what the CPU wants). Unset: 64 on
    /// a GPU, 0 on the CPU. The loss and gradients are the same either way.
    pub rows_per_pass: Option<usize>,
    /// Overlap a step's phases where the result cannot change: a group is scored as soon
    /// as its samples finish (while others still generate) and the next step's tasks are
    /// drawn while this step trains. `false` runs them one after another (same metrics).
    pub overlap: bool,
    /// 1: the next step's groups are sampled while this step trains, by the weights before
    /// its update (one update stale, corrected by the truncated importance weight); 0: each
    /// step samples with its own weights (the default: on the CPU both phases use every
    /// core, docs/BENCHMARKS.md).
    pub generation_lag: usize,
    /// Where the sampler computes the learner's log-probs to the bit (the CPU in f32 on
    /// shared weights: `wirl_grpo::Learner::sampler_is_exact`), stop the run at a step whose
    /// `sampler_logp_diff_max` is above 0, naming the token that differs. `false`: report it
    /// only.
    pub stop_on_sampler_gap: bool,
    /// The policy term and its parameters: `{ kind = "grpo" | "gspo", clip_low, clip_high }`,
    /// `{ kind = "cispo", clip_high }` or `{ kind = "sapo", temperature_pos, temperature_neg }`
    /// (docs/ALGORITHMS.md). Older configs' `loss = "NAME"`, `clip_low`, `clip_high`,
    /// `sapo_temperature_*` read into it (`spelling::lift`). Last with the other tables: a
    /// TOML table follows the plain keys.
    pub loss: LossSpec,
    /// The KL penalty to the reference: `{ where = "off" }` (no reference kept), `{ where =
    /// "loss", beta, estimator }` or `{ where = "reward", beta, estimator, target, horizon }`
    /// (verl's `use_kl_in_reward`, β adapting towards `target` where one is set). Older
    /// configs' `beta`, `kl_estimator`, `kl_in_reward`, `kl_target`, `kl_horizon` read into it.
    pub kl: KlSpec,
    /// DAPO's overlong shaping, `{ buffer, penalty }`: the last `buffer` tokens before a task's
    /// `max_tokens` cost a completion's reward up to `penalty`, linearly (none: no shaping).
    /// Older configs' `overlong_buffer`, `overlong_penalty` read into it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overlong: Option<OverlongSpec>,
    /// Importance weights where the sampler's log-probs differ from the learner's (a bf16
    /// sampler copy, `model.inference_dtype`; a generation lag): `{ mode = "off", tis_cap }`
    /// (only a group sampled a step behind is weighted, min(π_old / π_sampler, tis_cap)) or
    /// TRL's `vllm_importance_sampling_mode` — `{ mode = "token_truncate" | "token_mask" |
    /// "sequence_truncate" | "sequence_mask", max = 3.0, min }` (`wirl_grpo::correction`). On
    /// the CPU in f32 the sampler is the learner to the bit and every weight is 1. Older
    /// configs' `rollout_correction`, `rollout_correction_max`/`_min` and `tis_cap` read into it.
    pub correction: CorrectionSpec,
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
            entropy: 0.0,
            inner_epochs: 1,
            advantage: AdvantageMode::Grpo,
            aggregation: Aggregation::TokenMean,
            mask_truncated: false,
            dynamic_sampling: false,
            max_draws: 4,
            preset: None,
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
            rows_per_pass: None,
            overlap: true,
            generation_lag: 0,
            stop_on_sampler_gap: true,
            loss: LossSpec::default(),
            kl: KlSpec::default(),
            overlong: None,
            correction: CorrectionSpec::default(),
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
    /// Where the policy trains and samples.
    pub device: DeviceSpec,
    /// Bytes of the sampler's prefix cache (`model.prefix_cache_mib`, resolved).
    pub prefix_cache_bytes: u64,
    /// `model.inference_dtype` (`None`: by the device, [`RunConfig::inference_dtype_on`]).
    pub inference_dtype: Option<candle_core::DType>,
    /// `model.train_dtype`: the dtype of the trainer's products (f32 when absent).
    pub train_dtype: candle_core::DType,
    /// `model.device_sampling`: the sampler draws where the logits are.
    pub device_sampling: bool,
    /// `model.tf32`: a GPU's f32 products on TF32 tensor cores.
    pub tf32: bool,
    /// `model.chat_template_kwargs`: what every render of the chat template sees.
    pub chat_template_kwargs: wirl_engine::TemplateVars,
    /// At least one; the trained ones' weights allocate at least one group each.
    pub tasks: Vec<TaskSpec>,
    /// The run's `[sampling]`; each task's own is in its spec. `max_tokens` here is the
    /// `constant` aggregation's divisor.
    pub sampling: SamplingSpec,
    /// What each step optimises, lowered from `[grpo]` once: the trainer and the learner read
    /// the objective's choices here, never from `grpo`.
    pub objective: wirl_grpo::Objective,
    pub grpo: GrpoSection,
    pub eval: EvalSection,
    /// LoRA adapters to train instead of every weight.
    pub lora: Option<LoraSection>,
    /// On-policy distillation's teacher and weights.
    pub distill: Option<DistillSection>,
}

/// A task of the run, validated (the task runtime's own type: train, eval and serve load it alike).
pub use wirl_rollout::TaskSpec;

impl RunConfig {
    /// `grpo.rows_per_pass` on `device`: as configured, else 64 on a GPU (the big job's 512
    /// rows in 8 passes, not 64 groups' own) and 0 (group by group) on the CPU.
    pub fn rows_per_pass_on(&self, device: &candle_core::Device) -> usize {
        self.grpo.rows_per_pass.unwrap_or(if device.is_cpu() { 0 } else { 64 })
    }

    /// The dtype of the sampler's weights on `device`: as configured, else bf16 on a GPU
    /// (a copy) and the trainer's f32 on the CPU (shared).
    pub fn inference_dtype_on(&self, device: &candle_core::Device) -> candle_core::DType {
        self.inference_dtype.unwrap_or(if device.is_cpu() { candle_core::DType::F32 } else { candle_core::DType::BF16 })
    }

    /// How the run's sampler batches (training and the held-out pass alike).
    pub fn engine_options(&self) -> wirl_engine::EngineOptions {
        wirl_engine::EngineOptions {
            prefix_cache_bytes: self.prefix_cache_bytes,
            device_sampling: self.device_sampling,
            ..Default::default()
        }
    }

    /// Groups per step for each task, by Megatron's rule (checked on load).
    pub fn allocation(&self) -> crate::error::Result<wirl_rollout::Allocation> {
        let weights: Vec<f64> = self.tasks.iter().map(|t| t.weight).collect();
        Ok(wirl_rollout::allocate(&weights, self.grpo.prompts_per_step)?)
    }
}
