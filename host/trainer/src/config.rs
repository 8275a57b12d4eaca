//! A run's configuration: a TOML file parsed raw ([`TrainConfig`], what the run directory
//! keeps), checked once on load — an unknown key, a wrong type, a number out of range or a
//! missing plugin file is an error naming the file, the key and what to do — and converted
//! into the validated [`RunConfig`] that the trainer runs on, where a task source is an enum.

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use wirl_grpo::{AdvantageMode, Aggregation, Schedule};
use wirl_rollout::{CodeRunnerRef, PluginRef, RewardSpec, SamplingSpec, SourceSpec};

/// The default run, embedded so that `wirl train` needs no file.
pub const DEFAULT_TOML: &str = include_str!("../../../examples/train/default.toml");
/// Where the embedded default's relative paths are resolved from (it lives there in the repo).
pub const DEFAULT_DIR: &str = "examples/train";

/// A float setting: its key, value, what it must be, and the test of that.
type FloatRule = (&'static str, f64, &'static str, fn(f64) -> bool);

/// The largest plugin memory a config may ask for: the sandbox's `max_memory_bytes`.
const MAX_MEMORY_MIB: u64 = 4 << 10;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    pub model: ModelSection,
    /// Where tasks come from: an environment plugin, or (instead) a JSONL dataset.
    #[serde(default)]
    pub environment: Option<PluginSection>,
    #[serde(default)]
    pub dataset: Option<DatasetSection>,
    pub rewards: Vec<RewardSection>,
    #[serde(default)]
    pub sampling: SamplingSection,
    #[serde(default)]
    pub grpo: GrpoSection,
    #[serde(default)]
    pub eval: EvalSection,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub path: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
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

/// Tasks from JSONL files: one task per line, as `{"task": {...}}` (what `wirl tasks`
/// writes) or the task object itself.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct DatasetSection {
    /// Training tasks, taken in order and cycled (needed to train, not to evaluate).
    #[serde(default)]
    pub train: Option<PathBuf>,
    /// Held-out tasks for the evaluation (the first `eval.tasks` of them).
    #[serde(default)]
    pub eval: Option<PathBuf>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
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
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct CodeRunnerSection {
    pub plugin: PathBuf,
    /// Wall-clock limit per program (default 10 s).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Memory limit per program (default 512 MiB).
    #[serde(default)]
    pub memory_mib: Option<u64>,
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
    /// The reward a completion gets when a reward plugin fails on it.
    pub failure_reward: f32,
    /// A completion passes when its reward is at least this.
    pub pass_reward: f32,
    pub seed: u64,
    /// Write a checkpoint every this many steps (0: only at the end and on Ctrl-C).
    pub checkpoint_every: usize,
    /// Updates in a row whose gradient is not finite (each skipped with a warning) after
    /// which the run stops, with a checkpoint of the last good weights.
    pub max_skipped_updates: usize,
    /// Above this many MiB of attention intermediates a group's backward would keep, the
    /// layers are recomputed one at a time instead (peak memory of one layer, about one
    /// more forward of time). The default job stays below it.
    pub recompute_above_mib: u64,
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
            failure_reward: 0.0,
            pass_reward: 1.0,
            seed: 0,
            checkpoint_every: 10,
            max_skipped_updates: 3,
            recompute_above_mib: 1024,
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
    pub source: SourceSpec,
    pub rewards: Vec<RewardSpec>,
    pub sampling: SamplingSpec,
    pub grpo: GrpoSection,
    pub eval: EvalSection,
}

/// A TOML table as the plugin's JSON config.
fn json_config(table: &toml::Table) -> serde_json::Map<String, serde_json::Value> {
    table.iter().map(|(key, value)| (key.clone(), serde_json::to_value(value).unwrap_or_default())).collect()
}

impl TrainConfig {
    /// The validated form. Only for a config that `parse` (or `check_numbers`, after an
    /// override) accepted: one without a task source is refused here too.
    pub fn run_config(&self) -> anyhow::Result<RunConfig> {
        let source = match (&self.environment, &self.dataset) {
            (Some(environment), None) => SourceSpec::Environment {
                plugin: PluginRef {
                    path: environment.plugin.clone(),
                    config: json_config(&environment.config),
                    deadline_ms: environment.deadline_ms,
                    memory_mib: environment.memory_mib,
                },
                seed: environment.seed,
            },
            (None, Some(dataset)) => SourceSpec::Dataset { train: dataset.train.clone(), eval: dataset.eval.clone() },
            _ => bail!("the config needs exactly one task source: [environment] or [dataset]"),
        };
        let rewards = self
            .rewards
            .iter()
            .map(|reward| RewardSpec {
                plugin: PluginRef {
                    path: reward.plugin.clone(),
                    config: json_config(&reward.config),
                    deadline_ms: reward.deadline_ms,
                    memory_mib: reward.memory_mib,
                },
                weight: reward.weight,
                code_runner: reward.code_runner.as_ref().map(|runner| CodeRunnerRef {
                    path: runner.plugin.clone(),
                    deadline_ms: runner.deadline_ms,
                    memory_mib: runner.memory_mib,
                }),
            })
            .collect();
        let s = &self.sampling;
        Ok(RunConfig {
            model: self.model.path.clone(),
            source,
            rewards,
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

    /// Parse `text` (from `origin`), resolve plugin paths against `base`, and check it.
    pub fn parse(text: &str, origin: &str, base: &Path) -> anyhow::Result<Self> {
        let mut config: TrainConfig = toml::from_str(text).map_err(|e| {
            anyhow::anyhow!("{origin}: {}", e.to_string().trim_end())
                .context("the training config is not valid; see examples/train/default.toml for every key")
        })?;
        for path in config.paths() {
            *path = base.join(&*path);
        }
        config.check(origin)?;
        // Absolute from here on: the run directory keeps this config for `--resume`.
        for path in config.paths() {
            *path = std::fs::canonicalize(&*path)?;
        }
        Ok(config)
    }

    /// Every file the config names.
    fn paths(&mut self) -> Vec<&mut PathBuf> {
        let mut paths: Vec<&mut PathBuf> = Vec::new();
        for reward in &mut self.rewards {
            paths.push(&mut reward.plugin);
            paths.extend(reward.code_runner.as_mut().map(|r| &mut r.plugin));
        }
        paths.extend(self.environment.as_mut().map(|e| &mut e.plugin));
        if let Some(dataset) = self.dataset.as_mut() {
            paths.extend(dataset.train.as_mut());
            paths.extend(dataset.eval.as_mut());
        }
        paths
    }

    /// Load from a TOML file.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        Self::parse(&text, &path.display().to_string(), base)
    }

    fn check(&self, origin: &str) -> anyhow::Result<()> {
        let plugin_missing = |key: &str, path: &Path| {
            anyhow::anyhow!(
                "{origin}: `{key}`: plugin file {} does not exist (build the plugins with scripts/build-plugins, or fix the path; relative paths are from the config's directory)",
                path.display()
            )
        };
        match (&self.environment, &self.dataset) {
            (Some(environment), None) => {
                if !environment.plugin.is_file() {
                    return Err(plugin_missing("environment.plugin", &environment.plugin));
                }
            }
            (None, Some(dataset)) => {
                if dataset.train.is_none() && dataset.eval.is_none() {
                    bail!("{origin}: [dataset] names no file: set `train` (to train) and/or `eval` (held-out tasks)");
                }
                for (key, path) in dataset
                    .train
                    .iter()
                    .map(|p| ("dataset.train", p))
                    .chain(dataset.eval.iter().map(|p| ("dataset.eval", p)))
                {
                    if !path.is_file() {
                        bail!(
                            "{origin}: `{key}`: {} does not exist (relative paths are from the config's directory)",
                            path.display()
                        );
                    }
                }
            }
            (Some(_), Some(_)) => bail!("{origin}: give either [environment] or [dataset], not both"),
            (None, None) => {
                bail!("{origin}: no task source: add an [environment] table (a plugin) or a [dataset] table (JSONL)")
            }
        }
        if self.rewards.is_empty() {
            bail!("{origin}: `rewards`: at least one [[rewards]] table is needed");
        }
        for (i, reward) in self.rewards.iter().enumerate() {
            if !reward.plugin.is_file() {
                return Err(plugin_missing(&format!("rewards[{i}].plugin"), &reward.plugin));
            }
            if let Some(runner) = &reward.code_runner
                && !runner.plugin.is_file()
            {
                return Err(plugin_missing(&format!("rewards[{i}].code_runner.plugin"), &runner.plugin));
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
            ("sampling.top_p", f64::from(self.sampling.top_p), "in (0, 1]", |x| x > 0.0 && x <= 1.0),
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
        let temperature = self.sampling.temperature;
        if !(temperature.is_finite() && temperature > 0.0) {
            bail!(
                "{origin}: `sampling.temperature` = {temperature}: training needs a positive temperature (at 0 every \
                 sample of a group is the same, so no group carries a signal)"
            );
        }
        for (i, reward) in self.rewards.iter().enumerate() {
            if !reward.weight.is_finite() {
                bail!("{origin}: `rewards[{i}].weight` = {}: it must be a finite number", reward.weight);
            }
        }
        // Memory in MiB becomes bytes: a value that cannot is refused, not wrapped.
        let mut memories: Vec<(String, Option<u64>)> = Vec::new();
        if let Some(environment) = &self.environment {
            memories.push(("environment.memory_mib".into(), environment.memory_mib));
        }
        for (i, reward) in self.rewards.iter().enumerate() {
            memories.push((format!("rewards[{i}].memory_mib"), reward.memory_mib));
            if let Some(runner) = &reward.code_runner {
                memories.push((format!("rewards[{i}].code_runner.memory_mib"), runner.memory_mib));
            }
        }
        for (key, mib) in memories {
            if let Some(mib) = mib
                && !(1..=MAX_MEMORY_MIB).contains(&mib)
            {
                bail!("{origin}: `{key}` = {mib}: it must be between 1 and {MAX_MEMORY_MIB} (the sandbox's maximum)");
            }
        }
        let training_tasks = (g.steps as u64).checked_mul(g.prompts_per_step as u64);
        let Some(training_tasks) = training_tasks.filter(|&n| n < 1 << 40) else {
            bail!("{origin}: `grpo.steps` x `grpo.prompts_per_step` is too large (at most 2^40 tasks)");
        };
        if self.environment.is_some() && self.eval.first_index < training_tasks {
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
