//! `wirl train`: GRPO on tasks from an environment plugin (or a JSONL dataset), scored by
//! reward plugins, with the engine generating through its batching actor and the trainer
//! updating the same weights in place (the inference model shares the trainer's variables:
//! no copy between steps).
//!
//! A step: P tasks from the environment → G completions each (one prefill per prompt) →
//! every reward plugin scores each group (a failure gets `failure_reward` and is counted by
//! kind) → group advantages, zero-variance groups dropped → for each kept group a forward and
//! backward pass of the policy (the group's prompt once, its completions attending to it),
//! gradients summed → one AdamW update. A run directory keeps the config, `metrics.jsonl`
//! (one line per step) and `rollouts.jsonl` (every completion with its score and the plugins'
//! sha256), checkpoints (`checkpoint.rs`) and `summary.json`.

pub mod checkpoint;
pub mod config;
mod eval;

use crate::model;
use anyhow::{Context, bail};
use candle_core::backprop::GradStore;
use candle_core::{DType, Device, Tensor};
use config::{DEFAULT_DIR, DEFAULT_TOML, PluginSection, TrainConfig};
use serde_json::json;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;
use wirl_engine::{ChatMessage, EngineHandle, GenerateRequest, LoadOptions, Sampling, Tokenizer};
use wirl_grpo::{LossSettings, Net, Optimizer, Policy};
use wirl_sandbox::{EnvironmentPlugin, RewardPlugin, Sandbox, SandboxSettings, Task, printable};

#[derive(clap::Args)]
pub struct Args {
    /// A training config (TOML); without one, the embedded default (examples/train/default.toml).
    #[arg(conflicts_with = "resume")]
    config: Option<PathBuf>,
    /// Continue the run in this directory from its newest complete checkpoint.
    #[arg(long, value_name = "RUN_DIR")]
    resume: Option<PathBuf>,
    /// Where the run's files go (default: runs/train-<unix time>).
    #[arg(long)]
    run_dir: Option<PathBuf>,
    /// Override `grpo.steps`.
    #[arg(long)]
    steps: Option<usize>,
    /// Override `eval.tasks` (0 skips the held-out evaluation).
    #[arg(long)]
    eval_tasks: Option<usize>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    install_interrupt_handler();
    if let Some(run_dir) = &args.resume {
        return resume(run_dir, &args);
    }
    let (mut config, config_text) = match &args.config {
        Some(path) => (TrainConfig::load(path)?, std::fs::read_to_string(path)?),
        None => {
            build_default_plugins()?;
            let origin = "the embedded default config (examples/train/default.toml)";
            (TrainConfig::parse(DEFAULT_TOML, origin, Path::new(DEFAULT_DIR))?, DEFAULT_TOML.to_string())
        }
    };
    apply_overrides(&mut config, &args)?;
    let run_dir = match &args.run_dir {
        Some(dir) => dir.clone(),
        None => {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
            PathBuf::from(format!("runs/train-{now}"))
        }
    };
    if run_dir.join(RESOLVED).exists() {
        bail!(
            "{} already holds a run; continue it with `wirl train --resume {0}`, or choose another --run-dir",
            run_dir.display()
        );
    }
    std::fs::create_dir_all(&run_dir).with_context(|| format!("creating run directory {}", run_dir.display()))?;
    std::fs::write(run_dir.join("config.toml"), &config_text)?;
    // What `--resume` reads: the config as resolved (absolute plugin paths, overrides applied).
    std::fs::write(run_dir.join(RESOLVED), toml::to_string(&config)?)?;
    let mut trainer = Trainer::new(config, &run_dir, None)?;
    trainer.train(0, None)
}

const RESOLVED: &str = "config.resolved.toml";

#[derive(clap::Args)]
pub struct EvalArgs {
    /// A training config (TOML) whose environment, rewards and `[eval]` section define the
    /// held-out set; without one, the embedded default.
    config: Option<PathBuf>,
    /// The model to evaluate: a checkpoint's `model/` directory, any GGUF file or HF
    /// directory (default: the config's model).
    #[arg(long)]
    model: Option<String>,
    /// Override `eval.tasks`.
    #[arg(long)]
    tasks: Option<usize>,
    /// Override `eval.samples` (completions per task for pass@k; 0: greedy only).
    #[arg(long)]
    samples: Option<usize>,
    /// Where the per-task results go, one JSON line per task (default: eval.jsonl).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
}

/// `wirl eval`: greedy pass rate on the config's held-out tasks (indices from
/// `eval.first_index`, disjoint from training's), for the base model or a checkpoint.
pub fn eval(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let mut config = match &args.config {
        Some(path) => TrainConfig::load(path)?,
        None => {
            build_default_plugins()?;
            let origin = "the embedded default config (examples/train/default.toml)";
            TrainConfig::parse(DEFAULT_TOML, origin, Path::new(DEFAULT_DIR))?
        }
    };
    if let Some(model) = &args.model {
        config.model.path = model.clone();
    }
    if let Some(tasks) = args.tasks {
        config.eval.tasks = tasks;
    }
    if let Some(samples) = args.samples {
        config.eval.samples = samples;
    }
    let output = args.output.clone().unwrap_or_else(|| PathBuf::from("eval.jsonl"));
    let summary = eval::run(&config, &output)?;
    println!("{summary}");
    Ok(ExitCode::SUCCESS)
}

fn apply_overrides(config: &mut TrainConfig, args: &Args) -> anyhow::Result<()> {
    if let Some(steps) = args.steps {
        config.grpo.steps = steps;
    }
    if let Some(tasks) = args.eval_tasks {
        config.eval.tasks = tasks;
    }
    config.check_numbers("the command line (--steps, --eval-tasks)")
}

fn resume(run_dir: &Path, args: &Args) -> anyhow::Result<ExitCode> {
    let path = run_dir.join(RESOLVED);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} is not a wirl run directory (no {RESOLVED})", run_dir.display()))?;
    let mut config = TrainConfig::parse(&text, &path.display().to_string(), Path::new(""))?;
    apply_overrides(&mut config, args)?;
    let Some(checkpoint) = checkpoint::latest(run_dir)? else {
        bail!("{}: no complete checkpoint to resume from (checkpoints/step-*)", run_dir.display());
    };
    eprintln!("resuming {} from step {}", run_dir.display(), checkpoint.state.step);
    checkpoint::truncate_jsonl(&run_dir.join("metrics.jsonl"), checkpoint.state.step)?;
    checkpoint::truncate_jsonl(&run_dir.join("rollouts.jsonl"), checkpoint.state.step)?;
    let mut trainer = Trainer::new(config, run_dir, Some(&checkpoint))?;
    let current: Vec<(String, String)> = trainer.plugin_hashes();
    if current != checkpoint.state.plugins {
        eprintln!("warning: the plugins changed since the checkpoint (by sha256): {current:?}");
    }
    trainer.train(checkpoint.state.step, checkpoint.state.held_out_before)
}

/// Set by SIGINT: the loop finishes its step, writes a checkpoint and stops.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Forward SIGINT to the sandbox: its plugins' calls end within milliseconds (a plugin or
/// model code that sleeps does not hold the run), and the step in progress is abandoned.
fn forward_interrupts(interrupter: wirl_sandbox::Interrupter) {
    let spawned = std::thread::Builder::new().name("wirl-sigint".into()).spawn(move || {
        while !interrupted() {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        interrupter.interrupt();
    });
    if let Err(error) = spawned {
        tracing::warn!("Ctrl-C will wait for plugin calls to end: cannot start its thread ({error})");
    }
}

fn interrupted() -> bool {
    INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst)
}

fn install_interrupt_handler() {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t);
    }
}

/// The embedded default names the plugins built in this repository: build them on first use
/// (from the repository's root, where the default's relative paths point).
fn build_default_plugins() -> anyhow::Result<()> {
    let built = ["arithmetic", "math_answer"]
        .iter()
        .all(|name| Path::new(&format!("plugins/target/wasm32-wasip2/release/{name}.wasm")).is_file());
    if built {
        return Ok(());
    }
    if !Path::new("scripts/build-plugins").is_file() {
        bail!("the default run needs wirl's repository: run `wirl train` from its root, or pass a config file");
    }
    eprintln!("building the default plugins (scripts/build-plugins)");
    let status = std::process::Command::new("bash").arg("scripts/build-plugins").status()?;
    if !status.success() {
        bail!("scripts/build-plugins failed ({status})");
    }
    Ok(())
}

/// The reward plugins of a run, with their weights.
struct Rewards {
    plugins: Vec<(RewardPlugin, f32)>,
    /// Each plugin's name in notes and namespaced parts: its file's name, with `#2`, `#3`
    /// for further entries of one file, so that no two coincide.
    labels: Vec<String>,
}

/// One scored completion.
#[derive(Default)]
struct Scored {
    reward: f32,
    /// Parts by name; a name that two plugins both give is kept as `plugin/part` for each.
    parts: BTreeMap<String, f32>,
    /// Failure kinds (`deadline`, `non_finite`, …), one per failed plugin call.
    failures: Vec<String>,
    /// Each plugin's note, or its failure (`kind: message`), by plugin name.
    notes: BTreeMap<String, String>,
}

/// Merge the parts that each plugin gave one completion: names given by one plugin stay
/// as they are, names given by several are namespaced by plugin, so none overwrites another.
fn merge_parts(given: Vec<(String, String, f32)>) -> BTreeMap<String, f32> {
    let mut givers: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
    for (plugin, part, _) in &given {
        givers.entry(part.as_str()).or_default().insert(plugin.as_str());
    }
    let shared: std::collections::BTreeSet<String> =
        givers.into_iter().filter(|(_, plugins)| plugins.len() > 1).map(|(part, _)| part.to_string()).collect();
    given
        .into_iter()
        .map(
            |(plugin, part, value)| {
                if shared.contains(&part) { (format!("{plugin}/{part}"), value) } else { (part, value) }
            },
        )
        .collect()
}

impl Rewards {
    /// Load the `[[rewards]]` plugins (a grader with its code runner).
    fn load(sandbox: &Sandbox, sections: &[config::RewardSection]) -> anyhow::Result<Self> {
        let mut plugins = Vec::new();
        for reward in sections {
            let mut spec = plugin_spec(&reward.plugin, &reward.config, reward.deadline_ms, reward.memory_mib);
            if let Some(runner) = &reward.code_runner {
                let mut limits = wirl_sandbox::Limits::code_runner();
                limits.deadline_ms = runner.deadline_ms.unwrap_or(limits.deadline_ms);
                limits.memory_bytes = runner.memory_mib.map_or(limits.memory_bytes, |mib| mib << 20);
                spec.code_runner = Some(Box::new(wirl_sandbox::PluginSpec {
                    limits,
                    ..wirl_sandbox::PluginSpec::new(&runner.plugin)
                }));
            }
            plugins.push((RewardPlugin::new(sandbox.load(spec)?)?, reward.weight));
        }
        let mut labels: Vec<String> = Vec::new();
        for (plugin, _) in &plugins {
            let name = plugin.plugin().name();
            let taken = labels.iter().filter(|l| *l == name || l.starts_with(&format!("{name}#"))).count();
            labels.push(if taken == 0 { name.to_string() } else { format!("{name}#{}", taken + 1) });
        }
        Ok(Rewards { plugins, labels })
    }

    /// Score one group: every plugin's weighted reward summed; a failing call scores
    /// `failure_reward` for that plugin and is recorded.
    fn score_group(&mut self, task: &Task, completions: &[String], failure_reward: f32) -> Vec<Scored> {
        let mut scored: Vec<Scored> = completions.iter().map(|_| Scored::default()).collect();
        let mut given: Vec<Vec<(String, String, f32)>> = completions.iter().map(|_| Vec::new()).collect();
        for ((plugin, weight), name) in self.plugins.iter_mut().zip(&self.labels) {
            let verdicts = plugin.score_group(task, completions);
            for ((out, parts), verdict) in scored.iter_mut().zip(&mut given).zip(verdicts) {
                match verdict {
                    Ok(score) => {
                        out.reward += *weight * score.reward;
                        parts.extend(score.parts.into_iter().map(|(part, value)| (name.clone(), part, value)));
                        if let Some(note) = score.note {
                            out.notes.insert(name.clone(), note);
                        }
                    }
                    Err(failure) => {
                        out.reward += *weight * failure_reward;
                        out.failures.push(failure.kind.name().to_string());
                        tracing::warn!("reward plugin {name}: {}", wirl_sandbox::printable(&failure.to_string()));
                        out.notes.insert(name.clone(), failure.to_string());
                    }
                }
            }
        }
        for (out, parts) in scored.iter_mut().zip(given) {
            out.parts = merge_parts(parts);
        }
        scored
    }
}

struct Trainer {
    config: TrainConfig,
    run_dir: PathBuf,
    tokenizer: Arc<Tokenizer>,
    policy: Policy,
    reference: Option<Net>,
    inference: Arc<wirl_engine::Model>,
    engine: EngineHandle,
    tasks: TaskSource,
    rewards: Rewards,
    optimizer: Optimizer,
    model_config: wirl_engine::Config,
    /// Kept alive for the plugins' lifetime (its epoch ticker).
    _sandbox: Sandbox,
}

fn plugin_spec(
    section_plugin: &Path,
    config: &toml::Table,
    deadline: Option<u64>,
    memory: Option<u64>,
) -> wirl_sandbox::PluginSpec {
    let mut spec = wirl_sandbox::PluginSpec::new(section_plugin);
    for (key, value) in config {
        spec.config.insert(key.clone(), serde_json::to_value(value).unwrap_or(serde_json::Value::Null));
    }
    if let Some(ms) = deadline {
        spec.limits.deadline_ms = ms;
    }
    if let Some(mib) = memory {
        spec.limits.memory_bytes = mib << 20;
    }
    spec
}

fn environment_spec(section: &PluginSection) -> wirl_sandbox::PluginSpec {
    plugin_spec(&section.plugin, &section.config, section.deadline_ms, section.memory_mib)
}

/// A task's conversation, rendered with the model's chat template and tokenized.
fn prompt_ids(tokenizer: &Tokenizer, task: &Task) -> anyhow::Result<Vec<u32>> {
    let messages: Vec<ChatMessage> =
        task.messages.iter().map(|m| ChatMessage { role: m.role.clone(), content: m.content.clone() }).collect();
    Ok(tokenizer.encode(&tokenizer.render_chat(&messages, true)?)?)
}

/// Where a run's tasks come from.
enum TaskSource {
    /// `task_at(seed, index)` of an environment plugin; held-out tasks from `eval.first_index`.
    Environment { plugin: EnvironmentPlugin, seed: u64 },
    /// JSONL files: training tasks cycled in order, held-out tasks from their own file.
    Dataset { train: Vec<Task>, eval: Vec<Task> },
}

impl TaskSource {
    fn load(sandbox: &Sandbox, config: &TrainConfig) -> anyhow::Result<Self> {
        let read = |path: &Option<PathBuf>| match path {
            Some(path) => read_tasks(path),
            None => Ok(Vec::new()),
        };
        Ok(match (&config.environment, &config.dataset) {
            (Some(section), _) => TaskSource::Environment {
                plugin: EnvironmentPlugin::new(sandbox.load(environment_spec(section))?)?,
                seed: section.seed,
            },
            (None, Some(dataset)) => TaskSource::Dataset { train: read(&dataset.train)?, eval: read(&dataset.eval)? },
            (None, None) => bail!("the config has no task source"),
        })
    }

    fn training(&mut self, index: u64) -> anyhow::Result<Task> {
        match self {
            TaskSource::Environment { plugin, seed } => {
                let seed = *seed;
                plugin.task_at(seed, index).map_err(|f| anyhow::anyhow!("environment task {index} (seed {seed}): {f}"))
            }
            TaskSource::Dataset { train, .. } if train.is_empty() => {
                bail!("the [dataset] has no `train` file: name one to train (evaluation needs only `eval`)")
            }
            TaskSource::Dataset { train, .. } => Ok(train[(index % train.len() as u64) as usize].clone()),
        }
    }

    fn held_out(&mut self, first_index: u64, count: usize) -> anyhow::Result<Vec<Task>> {
        match self {
            // A held-out task the environment cannot give is left out, with a warning.
            TaskSource::Environment { .. } => Ok((0..count as u64)
                .filter_map(|i| {
                    let index = first_index.saturating_add(i);
                    self.training(index)
                        .inspect_err(|e| {
                            tracing::warn!("held-out task {index} skipped: {}", printable(&format!("{e:#}")))
                        })
                        .ok()
                })
                .collect()),
            TaskSource::Dataset { eval, .. } => Ok(eval.iter().take(count).cloned().collect()),
        }
    }
}

/// Tasks of a JSONL file: `{"task": {...}}` or the task itself per line. An error names the
/// file, the line and what is wrong.
fn read_tasks(path: &Path) -> anyhow::Result<Vec<Task>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut tasks = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let value: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        let task = value.get("task").cloned().unwrap_or(value);
        let task: Task = serde_json::from_value(task).with_context(|| {
            format!("{} line {}: not a task (fields id, messages, answer?, metadata?)", path.display(), i + 1)
        })?;
        tasks.push(task);
    }
    if tasks.is_empty() {
        bail!("{}: no tasks", path.display());
    }
    Ok(tasks)
}

impl Trainer {
    fn new(config: TrainConfig, run_dir: &Path, resume: Option<&checkpoint::Checkpoint>) -> anyhow::Result<Self> {
        let device = Device::Cpu;
        let base_path = model::resolve(Some(&config.model.path))?;
        let options = LoadOptions { dtype: Some(DType::F32), ..Default::default() };
        let policy_path = resume.map_or(base_path.clone(), |c| c.model_dir());
        eprintln!("loading {}", policy_path.display());
        let (model_config, tokenizer, tensors) = wirl_engine::load::load_tensors(&policy_path, &options)?;
        let policy = Policy::new(&model_config, &tensors, &device)?;
        drop(tensors);
        // The KL reference is the base model, also when resuming.
        let reference = match (config.grpo.beta > 0.0, resume) {
            (false, _) => None,
            (true, None) => Some(policy.frozen_copy(&device)?),
            (true, Some(_)) => {
                let (base_config, _, base) = wirl_engine::load::load_tensors(&base_path, &options)?;
                Some(Net::new(&base_config, base, &device)?)
            }
        };
        // The inference model shares the policy's storage: updates are seen without a copy.
        let mut source = wirl_engine::load::TensorSource(policy.shared_tensors());
        let inference = Arc::new(wirl_engine::Model::load(&model_config, &mut source, &device)?);
        let tokenizer = Arc::new(tokenizer);
        let (engine, _thread) = EngineHandle::spawn(inference.clone(), tokenizer.clone())?;

        let sandbox = Sandbox::new(SandboxSettings::default())?;
        forward_interrupts(sandbox.interrupter());
        let tasks = TaskSource::load(&sandbox, &config)?;
        if let TaskSource::Dataset { train, .. } = &tasks
            && train.is_empty()
        {
            bail!("the [dataset] has no `train` file: name one to train (evaluation needs only `eval`)");
        }
        let rewards = Rewards::load(&sandbox, &config.rewards)?;
        let vars = policy.vars().iter().map(|(_, v)| v.clone()).collect();
        let mut optimizer = Optimizer::new(vars, config.grpo.weight_decay)?;
        if let Some(checkpoint) = resume {
            checkpoint::restore_optimizer(checkpoint, &policy, &mut optimizer)?;
        }
        Ok(Trainer {
            model_config,
            config,
            run_dir: run_dir.to_path_buf(),
            tokenizer,
            policy,
            reference,
            inference,
            engine,
            tasks,
            rewards,
            optimizer,
            _sandbox: sandbox,
        })
    }

    fn task(&mut self, index: u64) -> Result<Task, TaskFailure> {
        self.tasks.training(index).map_err(|e| TaskFailure { id: None, reason: format!("{e:#}") })
    }

    /// Greedy pass rate on the held-out tasks.
    fn evaluate(&mut self) -> anyhow::Result<Option<f32>> {
        let count = self.config.eval.tasks;
        if count == 0 {
            return Ok(None);
        }
        let first = self.config.eval.first_index;
        let tasks = self.tasks.held_out(first, count)?;
        if tasks.is_empty() {
            tracing::warn!("no held-out tasks (a [dataset] without `eval`): evaluation skipped");
            return Ok(None);
        }
        // A held-out task whose prompt does not fit is left out, as in training.
        let mut fitting = Vec::new();
        let mut requests = Vec::new();
        for task in tasks {
            match self.fitting_prompt(&task) {
                Ok(prompt) => {
                    let sampling = Sampling::greedy(self.config.sampling.max_tokens);
                    requests.push(GenerateRequest { prompt, n: 1, sampling });
                    fitting.push(task);
                }
                Err(failure) => tracing::warn!("held-out task `{}` skipped: {}", task.id, printable(&failure.reason)),
            }
        }
        let tasks = fitting;
        let count = tasks.len();
        if count == 0 {
            tracing::warn!("no held-out task could be used: evaluation skipped");
            return Ok(None);
        }
        let outputs = wirl_engine::generate(&self.inference, &self.tokenizer, &requests, |_, _, _| {})?;
        let mut passed = 0;
        for (task, out) in tasks.iter().zip(outputs) {
            let scored = self.rewards.score_group(task, &[out[0].text.clone()], self.config.grpo.failure_reward);
            passed += usize::from(scored[0].reward >= self.config.grpo.pass_reward);
        }
        Ok(Some(passed as f32 / count as f32))
    }

    /// `(name, sha256)` of the environment and reward plugins.
    fn plugin_hashes(&self) -> Vec<(String, String)> {
        let environment = match &self.tasks {
            TaskSource::Environment { plugin, .. } => Some(plugin.plugin()),
            TaskSource::Dataset { .. } => None,
        };
        environment
            .into_iter()
            .chain(self.rewards.plugins.iter().map(|(p, _)| p.plugin()))
            .map(|p| (p.name().to_string(), p.sha256().to_string()))
            .collect()
    }

    fn checkpoint(&self, step: usize, held_out_before: Option<f32>) -> anyhow::Result<()> {
        let state = checkpoint::State {
            step,
            optimizer_steps: self.optimizer.steps,
            held_out_before,
            plugins: self.plugin_hashes(),
        };
        let dir = checkpoint::write(
            &self.run_dir,
            &state,
            &self.policy,
            &self.optimizer,
            &self.model_config,
            &self.tokenizer,
        )?;
        eprintln!("checkpoint {}", dir.display());
        Ok(())
    }

    /// Run steps `start + 1 ..= grpo.steps`.
    fn train(&mut self, start: usize, held_out_before: Option<f32>) -> anyhow::Result<ExitCode> {
        let started = Instant::now();
        let before = if start == 0 { self.evaluate()? } else { held_out_before };
        if let (0, Some(accuracy)) = (start, before) {
            eprintln!("held-out greedy pass rate before training: {accuracy:.3} ({} tasks)", self.config.eval.tasks);
        }
        let append = |name: &str| -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(self.run_dir.join(name))?;
            Ok(std::io::BufWriter::new(file))
        };
        let (mut metrics, mut rollouts) = (append("metrics.jsonl")?, append("rollouts.jsonl")?);
        let hashes = self.plugin_hashes();
        let steps = self.config.grpo.steps;
        let every = self.config.grpo.checkpoint_every;
        let mut step_times = Vec::new();
        let mut skipped_in_a_row = 0;
        for step in start..steps {
            let Some(line) = self.step(step, &mut rollouts, &hashes)? else {
                // Interrupted before the step's first update: the step is abandoned, the
                // weights are those of the last completed step.
                status("");
                rollouts.flush()?;
                self.checkpoint(step, before)?;
                eprintln!(
                    "interrupted during step {}: resume with `wirl train --resume {}`",
                    step + 1,
                    self.run_dir.display()
                );
                return Ok(ExitCode::from(130));
            };
            step_times.push(line["time_s"]["total"].as_f64().unwrap_or(0.0));
            writeln!(metrics, "{line}")?;
            metrics.flush()?;
            rollouts.flush()?;
            let mean_step = step_times.iter().sum::<f64>() / step_times.len() as f64;
            let eta = mean_step * (steps - step - 1) as f64;
            status("");
            eprintln!(
                "step {:>3}/{steps}  reward {:.3}  pass {:.3}  loss {:+.4}  kl {:.5}  len {:.1}  | gen {:.1}s score {:.2}s train {:.1}s | ETA {:.0}s",
                step + 1,
                line["reward_mean"].as_f64().unwrap_or(0.0),
                line["pass_rate"].as_f64().unwrap_or(0.0),
                line["loss"].as_f64().unwrap_or(0.0),
                line["kl"].as_f64().unwrap_or(0.0),
                line["completion_tokens_mean"].as_f64().unwrap_or(0.0),
                line["time_s"]["generate"].as_f64().unwrap_or(0.0),
                line["time_s"]["score"].as_f64().unwrap_or(0.0),
                line["time_s"]["train"].as_f64().unwrap_or(0.0),
                eta,
            );
            let skipped = line["updates_skipped"].as_u64().unwrap_or(0) as usize;
            skipped_in_a_row = if skipped > 0 { skipped_in_a_row + skipped } else { 0 };
            if skipped_in_a_row >= self.config.grpo.max_skipped_updates {
                // The weights are still the last good ones: skipped updates leave them alone.
                self.checkpoint(step + 1, before)?;
                bail!(
                    "stopping: {skipped_in_a_row} updates in a row had a non-finite gradient (the last at step {}; \
                     grpo.max_skipped_updates = {}); the last good weights are checkpointed. Look at the step's \
                     rewards in {} and lower grpo.learning_rate, then `wirl train --resume {}`",
                    step + 1,
                    self.config.grpo.max_skipped_updates,
                    self.run_dir.join("rollouts.jsonl").display(),
                    self.run_dir.display()
                );
            }
            let interrupted = interrupted();
            if step + 1 == steps || (every > 0 && (step + 1) % every == 0) || interrupted {
                self.checkpoint(step + 1, before)?;
            }
            if interrupted {
                eprintln!("interrupted: resume with `wirl train --resume {}`", self.run_dir.display());
                return Ok(ExitCode::from(130));
            }
        }
        let after = self.evaluate()?;
        let summary = json!({
            "steps": steps,
            "held_out_pass_rate_before": before,
            "held_out_pass_rate_after": after,
            "held_out_tasks": self.config.eval.tasks,
            "seconds_this_session": started.elapsed().as_secs_f64(),
        });
        std::fs::write(self.run_dir.join("summary.json"), format!("{summary}\n"))?;
        if let (Some(b), Some(a)) = (before, after) {
            eprintln!("held-out greedy pass rate: {b:.3} before, {a:.3} after");
        }
        eprintln!("run written to {}", self.run_dir.display());
        Ok(ExitCode::SUCCESS)
    }

    /// One GRPO step: its metrics line, or `None` when Ctrl-C came before its first update
    /// (generating, scoring, or training its first epoch), which abandons it unrecorded.
    fn step(
        &mut self,
        step: usize,
        rollouts: &mut impl Write,
        hashes: &[(String, String)],
    ) -> anyhow::Result<Option<serde_json::Value>> {
        let g = self.config.grpo.clone();
        let step_started = Instant::now();

        // Tasks and rollouts.
        let StepTasks { tasks, prompts, skipped } = self.step_tasks(step)?;
        for skip in &skipped {
            tracing::warn!("step {}: {}", step + 1, printable(&skip.to_string()));
        }
        let steps = g.steps;
        status(&format!("step {}/{steps}: generating {} x {}", step + 1, g.prompts_per_step, g.group_size));
        let generate_started = Instant::now();
        let requests: Vec<GenerateRequest> = prompts
            .iter()
            .enumerate()
            .map(|(i, prompt)| GenerateRequest {
                prompt: prompt.clone(),
                n: g.group_size,
                sampling: Sampling {
                    max_tokens: self.config.sampling.max_tokens,
                    temperature: self.config.sampling.temperature,
                    top_p: self.config.sampling.top_p,
                    top_k: self.config.sampling.top_k,
                    seed: Some(mix(g.seed, (step * g.prompts_per_step + i) as u64)),
                    ..Default::default()
                },
            })
            .collect();
        // Through the batching actor, all of the step's requests in one admission, so that the
        // batch (and so every sample) does not depend on thread timing.
        let Some(generated) = self.engine.generate_all_until(requests, interrupted) else {
            return Ok(None);
        };
        let groups: Vec<Vec<wirl_engine::Completion>> = generated.into_iter().collect::<Result<_, _>>()?;
        let generate_s = generate_started.elapsed().as_secs_f64();

        // Scores.
        status(&format!("step {}/{steps}: scoring", step + 1));
        let score_started = Instant::now();
        let mut scored = Vec::with_capacity(groups.len());
        for (task, group) in tasks.iter().zip(&groups) {
            let texts: Vec<String> = group.iter().map(|c| c.text.clone()).collect();
            scored.push(self.rewards.score_group(task, &texts, g.failure_reward));
        }
        let score_s = score_started.elapsed().as_secs_f64();
        if interrupted() {
            // The calls were cut short: their verdicts are not the plugins', so nothing of
            // this step is learned from or recorded.
            return Ok(None);
        }

        // Advantages; groups whose rewards are all equal carry no signal.
        let mut kept = Vec::new();
        for (i, group) in scored.iter().enumerate() {
            let rewards: Vec<f32> = group.iter().map(|s| s.reward).collect();
            if let Some(advantages) = wirl_grpo::group_advantages(&rewards, g.advantage) {
                kept.push((i, advantages));
            }
        }

        // Update.
        let train_started = Instant::now();
        let (mut reference_s, mut forward_s, mut backward_s, mut optimizer_s) = (0f64, 0f64, 0f64, 0f64);
        let lr = wirl_grpo::optim::learning_rate(g.learning_rate, step, g.warmup_steps, g.steps, g.schedule);
        let settings = LossSettings { clip_low: g.clip_low, clip_high: g.clip_high, beta: g.beta, entropy: g.entropy };
        let step_tokens: usize = kept.iter().flat_map(|(i, _)| groups[*i].iter().map(|c| c.tokens.len())).sum();
        let step_sequences = kept.len() * g.group_size;
        let (mut loss_sum, mut kl_sum, mut entropy_sum, mut clip_sum, mut grad_norm) = (0f32, 0f32, 0f32, 0f32, 0f64);
        let mut updates_skipped = 0usize;
        let mut groups_recomputed = 0usize;
        // The default job's groups keep about 0.5 GiB and stay on the whole-graph path.
        let recompute_above = g.recompute_above_mib.saturating_mul(1 << 20);
        if !kept.is_empty() {
            // Old log-probs (μ > 1) and the reference's, before any update of this step.
            let mut old = Vec::new();
            let mut reference = Vec::new();
            let timer = Instant::now();
            for (i, _) in &kept {
                if interrupted() {
                    return Ok(None);
                }
                let completions: Vec<Vec<u32>> = groups[*i].iter().map(|c| c.tokens.clone()).collect();
                if g.inner_epochs > 1 {
                    // Read-only: the detached net builds no graph.
                    old.push(Some(self.policy.net().detached().completion_stats(&prompts[*i], &completions)?.logp));
                } else {
                    old.push(None);
                }
                reference.push(match &self.reference {
                    Some(net) => Some(net.completion_stats(&prompts[*i], &completions)?.logp.detach()),
                    None => None,
                });
            }
            reference_s += timer.elapsed().as_secs_f64();
            for epoch in 0..g.inner_epochs {
                let mut grads: Option<GradStore> = None;
                for (k, (i, advantages)) in kept.iter().enumerate() {
                    // Until the first update the step can still be abandoned whole.
                    if epoch == 0 && interrupted() {
                        return Ok(None);
                    }
                    status(&format!("step {}/{steps}: training on group {}/{}", step + 1, k + 1, kept.len()));
                    let completions: Vec<Vec<u32>> = groups[*i].iter().map(|c| c.tokens.clone()).collect();
                    let lengths: Vec<usize> = completions.iter().map(Vec::len).collect();
                    let timer = Instant::now();
                    let loss_of = |stats: &wirl_grpo::TokenStats| {
                        // The forward ends where the loss begins (when recomputing, that
                        // is the graph-free pass and the head).
                        let forward_time = timer.elapsed();
                        let width = stats.logp.dim(1)?;
                        let weights = wirl_grpo::token_weights(
                            &lengths,
                            width,
                            g.aggregation,
                            step_tokens,
                            step_sequences,
                            self.config.sampling.max_tokens,
                        );
                        let device = stats.logp.device();
                        let weights = Tensor::from_vec(weights, (lengths.len(), width), device)?;
                        let advantages = Tensor::from_vec(advantages.clone(), lengths.len(), device)?;
                        let old_logp = match &old[k] {
                            Some(old) => old.clone(),
                            None => stats.logp.detach(),
                        };
                        let parts = wirl_grpo::grpo_loss(
                            &stats.logp,
                            &old_logp,
                            reference[k].as_ref(),
                            Some(&stats.entropy),
                            &advantages,
                            &weights,
                            &settings,
                        )?;
                        Ok((parts.loss.clone(), (parts, forward_time)))
                    };
                    let ((parts, forward_time), new, recomputed) =
                        self.policy.loss_and_grads(&prompts[*i], &completions, recompute_above, loss_of)?;
                    groups_recomputed += usize::from(recomputed);
                    loss_sum += parts.loss.to_scalar::<f32>()?;
                    kl_sum += parts.kl;
                    entropy_sum += parts.entropy;
                    clip_sum += parts.clip_fraction / kept.len() as f32;
                    grads = Some(accumulate(grads, new, &self.policy)?);
                    forward_s += forward_time.as_secs_f64();
                    backward_s += (timer.elapsed() - forward_time).as_secs_f64();
                }
                let timer = Instant::now();
                if let Some(grads) = grads {
                    let update = self.optimizer.step(&grads, lr, g.max_grad_norm)?;
                    grad_norm = update.grad_norm;
                    if !update.applied {
                        updates_skipped += 1;
                        tracing::warn!(
                            "step {}: the gradient norm is {}; the update is skipped (weights unchanged)",
                            step + 1,
                            update.grad_norm
                        );
                    }
                }
                optimizer_s += timer.elapsed().as_secs_f64();
            }
            let epochs = g.inner_epochs as f32;
            (loss_sum, kl_sum, entropy_sum, clip_sum) =
                (loss_sum / epochs, kl_sum / epochs, entropy_sum / epochs, clip_sum / epochs);
        }
        let train_s = train_started.elapsed().as_secs_f64();

        // Records.
        let all: Vec<&Scored> = scored.iter().flatten().collect();
        let rewards: Vec<f32> = all.iter().map(|s| s.reward).collect();
        let n = rewards.len().max(1) as f32;
        let mean = rewards.iter().sum::<f32>() / n;
        let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f32>() / n).sqrt();
        let mut parts: BTreeMap<String, f32> = BTreeMap::new();
        for s in &all {
            for (name, value) in &s.parts {
                *parts.entry(name.clone()).or_default() += value / n;
            }
        }
        let mut failures: BTreeMap<String, usize> = BTreeMap::new();
        for s in &all {
            for kind in &s.failures {
                *failures.entry(kind.clone()).or_default() += 1;
            }
        }
        let lengths: Vec<usize> = groups.iter().flatten().map(|c| c.tokens.len()).collect();
        let generated: usize = lengths.iter().sum();
        for skip in &skipped {
            let record = json!({"step": step + 1, "skipped_task": skip.index, "task": skip.id, "reason": skip.reason});
            writeln!(rollouts, "{record}")?;
        }
        for ((task, group), scores) in tasks.iter().zip(&groups).zip(&scored) {
            for (sample, (completion, score)) in group.iter().zip(scores).enumerate() {
                let record = json!({
                    "step": step + 1, "task": task.id, "sample": sample, "completion": completion.text,
                    "tokens": completion.tokens.len(), "reward": score.reward, "parts": score.parts,
                    "failures": score.failures, "notes": score.notes, "plugins": hashes.iter().map(|(n, h)| json!({"name": n, "sha256": h})).collect::<Vec<_>>(),
                });
                writeln!(rollouts, "{record}")?;
            }
        }
        let total_s = step_started.elapsed().as_secs_f64();
        Ok(Some(json!({
            "step": step + 1,
            "learning_rate": lr,
            "reward_mean": mean,
            "reward_std": std,
            "parts": parts,
            "pass_rate": rewards.iter().filter(|&&r| r >= g.pass_reward).count() as f32 / n,
            "groups_kept": kept.len(),
            "loss": loss_sum,
            "kl": if step_tokens > 0 && g.beta > 0.0 { kl_sum } else { 0.0 },
            "entropy": entropy_sum,
            "clip_fraction": clip_sum,
            "grad_norm": if grad_norm.is_finite() { json!(grad_norm) } else { json!(grad_norm.to_string()) },
            "updates_skipped": updates_skipped,
            "groups_recomputed": groups_recomputed,
            "peak_rss_mib": peak_rss_mib(),
            "tasks_skipped": skipped.iter().map(|s| json!({"index": s.index, "task": s.id, "reason": s.reason})).collect::<Vec<_>>(),
            "completion_tokens_mean": generated as f32 / lengths.len().max(1) as f32,
            "completion_tokens_max": lengths.iter().max().copied().unwrap_or(0),
            "failures": failures,
            "generate_tokens_per_s": generated as f64 / generate_s.max(1e-9),
            "time_s": {
                "generate": generate_s, "score": score_s, "train": train_s, "total": total_s,
                "reference_forward": reference_s, "policy_forward": forward_s, "backward": backward_s,
                "optimizer": optimizer_s,
            },
        })))
    }

    /// The step's tasks and their prompts. A task the source cannot give — its `task-at`
    /// fails, or its prompt leaves no room for a completion in the model's context — is
    /// skipped (returned, to be recorded) and replaced by another index; a slot that finds
    /// no task in `MAX_TASK_TRIES` tries stops the run, since the source is then broken.
    fn step_tasks(&mut self, step: usize) -> anyhow::Result<StepTasks> {
        let per_step = self.config.grpo.prompts_per_step as u64;
        let first = step as u64 * per_step;
        let (mut tasks, mut prompts, mut skipped) = (Vec::new(), Vec::new(), Vec::new());
        for index in first..first + per_step {
            let mut found = false;
            for attempt in 0..MAX_TASK_TRIES {
                // Replacements come from a range of their own, the same on every resume.
                let index = if attempt == 0 { index } else { REPLACEMENT_INDICES + index * MAX_TASK_TRIES + attempt };
                match self.task(index).and_then(|task| Ok((self.fitting_prompt(&task)?, task))) {
                    Ok((prompt, task)) => {
                        tasks.push(task);
                        prompts.push(prompt);
                        found = true;
                        break;
                    }
                    Err(failure) => skipped.push(failure.at(index)),
                }
            }
            if !found {
                let last = skipped.last().map(|s| s.reason.clone()).unwrap_or_default();
                bail!(
                    "the task source failed {MAX_TASK_TRIES} tasks in a row (index {index} and its replacements); \
                     the last: {last}. Fix the environment or dataset, then `wirl train --resume`"
                );
            }
        }
        Ok(StepTasks { tasks, prompts, skipped })
    }

    /// `task`'s prompt, if it leaves room for `sampling.max_tokens` in the model's context.
    fn fitting_prompt(&self, task: &Task) -> Result<Vec<u32>, TaskFailure> {
        let context = self.model_config.max_position_embeddings;
        fitting_prompt(&self.tokenizer, task, self.config.sampling.max_tokens, context)
    }
}

/// This process's peak resident memory so far, from the kernel (Linux), in MiB.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib / 1024)
}

/// `task`'s prompt, if it leaves room for `room` new tokens in a context of `context`; else
/// why not, naming the sizes.
fn fitting_prompt(tokenizer: &Tokenizer, task: &Task, room: usize, context: usize) -> Result<Vec<u32>, TaskFailure> {
    let prompt = prompt_ids(tokenizer, task).map_err(|e| TaskFailure::of(task, format!("{e:#}")))?;
    if prompt.is_empty() || prompt.len().saturating_add(room) > context {
        return Err(TaskFailure::of(
            task,
            format!(
                "its prompt is {} tokens; with sampling.max_tokens = {room} it does not fit the model's context of \
                 {context}",
                prompt.len()
            ),
        ));
    }
    Ok(prompt)
}

/// Tries per task slot of a step before the source counts as broken.
const MAX_TASK_TRIES: u64 = 8;
/// Where replacement tasks' indices start: far above training's and the default held-out
/// range (`eval.first_index` = 2^40).
const REPLACEMENT_INDICES: u64 = 1 << 50;

/// Why a task could not be used.
struct TaskFailure {
    id: Option<String>,
    reason: String,
}

impl TaskFailure {
    fn of(task: &Task, reason: String) -> Self {
        TaskFailure { id: Some(task.id.clone()), reason }
    }

    fn at(self, index: u64) -> SkippedTask {
        SkippedTask { index, id: self.id, reason: self.reason }
    }
}

/// A step's tasks, their prompts, and the tasks skipped on the way.
struct StepTasks {
    tasks: Vec<Task>,
    prompts: Vec<Vec<u32>>,
    skipped: Vec<SkippedTask>,
}

/// A task skipped in a step, as recorded in rollouts and metrics.
struct SkippedTask {
    index: u64,
    id: Option<String>,
    reason: String,
}

impl std::fmt::Display for SkippedTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.id {
            Some(id) => write!(f, "task {} (`{id}`) skipped: {}", self.index, self.reason),
            None => write!(f, "task {} skipped: {}", self.index, self.reason),
        }
    }
}

/// A transient status line on a terminal (what the step is doing now), cleared by `""`.
fn status(text: &str) {
    use std::io::IsTerminal;
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K{text}");
    }
}

/// Sum `new`'s gradients of the policy's variables into `total` (dropping the intermediate
/// tensors' gradients that a backward pass also returns).
fn accumulate(total: Option<GradStore>, mut new: GradStore, policy: &Policy) -> anyhow::Result<GradStore> {
    let mut sum = total.unwrap_or_default();
    let mut any = false;
    for (_, var) in policy.vars() {
        let Some(grad) = new.remove(var.as_tensor()) else { continue };
        any = true;
        let grad = match sum.remove(var.as_tensor()) {
            Some(previous) => (previous + grad)?,
            None => grad,
        };
        sum.insert(var.as_tensor(), grad);
    }
    if !any {
        bail!("the loss has no gradient with respect to the policy's weights");
    }
    Ok(sum)
}

/// A seed for the `index`-th request of a run seeded `seed` (SplitMix64 finaliser).
fn mix(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
