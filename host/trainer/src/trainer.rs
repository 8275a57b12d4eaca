//! The training loop: collect → update → record → checkpoint, step after step.
//!
//! A step: P tasks from the source → G completions each through the engine's batching actor
//! (one admission, so runs are reproducible) → every reward plugin scores each group (a
//! failure gets `failure_reward` and is counted by kind) → group advantages, zero-variance
//! groups dropped → the learner's update (the optimizer writing through the engine's weights
//! barrier; the inference model shares the policy's storage, so no copy between steps) →
//! one line of `metrics.jsonl`, the step's completions in `rollouts.jsonl`, and checkpoints.

use crate::checkpoint::{self, Checkpoint};
use crate::config::RunConfig;
use crate::control::Control;
use crate::metrics::{PluginHash, RolloutRecord, SkippedTaskEntry, SkippedTaskRecord, StepMetrics, StepTimes};
use crate::observer::{Event, Observer, Phase};
use anyhow::bail;
use candle_core::{DType, Device};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use wirl_engine::{EngineHandle, GenerateRequest, LoadOptions, Sampling, Tokenizer};
use wirl_grpo::{GroupBatch, Learner, LossSettings, Net, Optimizer, Policy, UpdateSettings};
use wirl_rollout::{RolloutGroup, Scorers, StepTasks, TaskFailure, TaskSource, sample_groups, seed_for};
use wirl_sandbox::{Sandbox, SandboxSettings, Task, printable};

/// How a run ended, when it did not fail.
#[derive(Debug)]
pub enum Outcome {
    /// Every step ran; the summary was written.
    Finished(Summary),
    /// Stopped through [`Control`] after `steps_done` steps, which are checkpointed;
    /// `abandoned`: the step after them had begun and was given up before its update.
    Stopped { steps_done: usize, abandoned: bool },
}

/// `summary.json`.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Summary {
    pub steps: usize,
    pub held_out_pass_rate_before: Option<f32>,
    pub held_out_pass_rate_after: Option<f32>,
    pub held_out_tasks: usize,
    pub seconds_this_session: f64,
}

pub struct Trainer {
    config: RunConfig,
    run_dir: PathBuf,
    tokenizer: Arc<Tokenizer>,
    learner: Learner,
    inference: Arc<wirl_engine::Model>,
    engine: EngineHandle,
    tasks: TaskSource,
    rewards: Scorers,
    model_config: wirl_engine::Config,
    control: Control,
    /// Kept alive for the plugins' lifetime (its epoch ticker).
    _sandbox: Sandbox,
}

impl Trainer {
    /// Load the policy (the base model at `model`, or `resume`'s weights and optimizer
    /// moments), the engine sharing its storage, the task source and the reward plugins.
    pub fn new(
        config: RunConfig,
        model: &Path,
        run_dir: &Path,
        resume: Option<&Checkpoint>,
        control: Control,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Self> {
        let device = Device::Cpu;
        let options = LoadOptions { dtype: Some(DType::F32), ..Default::default() };
        let policy_path = resume.map_or(model.to_path_buf(), Checkpoint::model_dir);
        observer.event(Event::Loading { path: &policy_path });
        let (model_config, tokenizer, tensors) = wirl_engine::load::load_tensors(&policy_path, &options)?;
        let policy = Policy::new(&model_config, &tensors, &device)?;
        drop(tensors);
        // The KL reference is the base model, also when resuming.
        let reference = match (config.grpo.beta > 0.0, resume) {
            (false, _) => None,
            (true, None) => Some(policy.frozen_copy(&device)?),
            (true, Some(_)) => {
                let (base_config, _, base) = wirl_engine::load::load_tensors(model, &options)?;
                Some(Net::new(&base_config, base, &device)?)
            }
        };
        // The inference model shares the policy's storage: updates are seen without a copy.
        let mut source = wirl_engine::load::TensorSource(policy.shared_tensors());
        let inference = Arc::new(wirl_engine::Model::load(&model_config, &mut source, &device)?);
        let tokenizer = Arc::new(tokenizer);
        let (engine, _thread) = EngineHandle::spawn(inference.clone(), tokenizer.clone())?;

        let sandbox = Sandbox::new(SandboxSettings::default())?;
        control.watch(sandbox.interrupter());
        let tasks = TaskSource::load(&sandbox, &config.source)?;
        if !tasks.can_train() {
            bail!("the [dataset] has no `train` file: name one to train (evaluation needs only `eval`)");
        }
        let rewards = Scorers::load(&sandbox, &config.rewards)?;
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
            learner: Learner { policy, reference, optimizer },
            inference,
            engine,
            tasks,
            rewards,
            control,
            _sandbox: sandbox,
        })
    }

    /// The engine that samples from the policy (shared: a server may generate with it too).
    pub fn engine(&self) -> &EngineHandle {
        &self.engine
    }

    /// `(name, sha256)` of the environment and reward plugins.
    pub fn plugin_hashes(&self) -> Vec<(String, String)> {
        self.tasks
            .plugin()
            .into_iter()
            .chain(self.rewards.plugins())
            .map(|p| (p.name().to_string(), p.sha256().to_string()))
            .collect()
    }

    /// Greedy pass rate on the held-out tasks.
    fn evaluate(&mut self) -> anyhow::Result<Option<f32>> {
        let count = self.config.eval.tasks;
        if count == 0 {
            return Ok(None);
        }
        let tasks = self.tasks.held_out(self.config.eval.first_index, count);
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

    fn checkpoint(&self, step: usize, held_out_before: Option<f32>, observer: &mut dyn Observer) -> anyhow::Result<()> {
        let state = checkpoint::State {
            step,
            optimizer_steps: self.learner.optimizer.steps,
            held_out_before,
            plugins: self.plugin_hashes(),
        };
        let dir = checkpoint::write(
            &self.run_dir,
            &state,
            &self.learner.policy,
            &self.learner.optimizer,
            &self.model_config,
            &self.tokenizer,
        )?;
        observer.event(Event::Checkpoint { dir: &dir });
        Ok(())
    }

    /// Run steps `start + 1 ..= grpo.steps` (`held_out_before`: the score a resumed run had
    /// before its first step).
    pub fn train(
        &mut self,
        start: usize,
        held_out_before: Option<f32>,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Outcome> {
        let started = Instant::now();
        let tasks = self.config.eval.tasks;
        let before = if start == 0 { self.evaluate()? } else { held_out_before };
        if let (0, Some(pass_rate)) = (start, before) {
            observer.event(Event::HeldOut { after: false, pass_rate, tasks });
        }
        let append = |name: &str| -> anyhow::Result<std::io::BufWriter<std::fs::File>> {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(self.run_dir.join(name))?;
            Ok(std::io::BufWriter::new(file))
        };
        let (mut metrics, mut rollouts) = (append("metrics.jsonl")?, append("rollouts.jsonl")?);
        let hashes: Vec<PluginHash> =
            self.plugin_hashes().into_iter().map(|(name, sha256)| PluginHash { name, sha256 }).collect();
        let steps = self.config.grpo.steps;
        let every = self.config.grpo.checkpoint_every;
        let mut step_times = Vec::new();
        let mut skipped_in_a_row = 0;
        for step in start..steps {
            let Some(line) = self.step(step, &mut rollouts, &hashes, observer)? else {
                // Stopped before the step's first update: the step is abandoned, the weights
                // are those of the last completed step.
                rollouts.flush()?;
                self.checkpoint(step, before, observer)?;
                return Ok(Outcome::Stopped { steps_done: step, abandoned: true });
            };
            step_times.push(line.time_s.total);
            serde_json::to_writer(&mut metrics, &line)?;
            writeln!(metrics)?;
            metrics.flush()?;
            rollouts.flush()?;
            let mean_step = step_times.iter().sum::<f64>() / step_times.len() as f64;
            let eta_s = mean_step * (steps - step - 1) as f64;
            observer.event(Event::Step { metrics: &line, steps, eta_s });
            if line.updates_skipped > 0 {
                tracing::warn!(
                    "step {}: the gradient norm is {}; the update is skipped (weights unchanged)",
                    step + 1,
                    line.grad_norm
                );
            }
            skipped_in_a_row = if line.updates_skipped > 0 { skipped_in_a_row + line.updates_skipped } else { 0 };
            if skipped_in_a_row >= self.config.grpo.max_skipped_updates {
                // The weights are still the last good ones: skipped updates leave them alone.
                self.checkpoint(step + 1, before, observer)?;
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
            let stopped = self.control.is_stopped();
            if step + 1 == steps || (every > 0 && (step + 1) % every == 0) || stopped {
                self.checkpoint(step + 1, before, observer)?;
            }
            if stopped {
                return Ok(Outcome::Stopped { steps_done: step + 1, abandoned: false });
            }
        }
        let after = self.evaluate()?;
        if let Some(pass_rate) = after {
            observer.event(Event::HeldOut { after: true, pass_rate, tasks });
        }
        let summary = Summary {
            steps,
            held_out_pass_rate_before: before,
            held_out_pass_rate_after: after,
            held_out_tasks: tasks,
            seconds_this_session: started.elapsed().as_secs_f64(),
        };
        std::fs::write(self.run_dir.join("summary.json"), serde_json::to_string(&summary)? + "\n")?;
        Ok(Outcome::Finished(summary))
    }

    /// One GRPO step: its metrics, or `None` when a stop came before its first update
    /// (generating, scoring, or training its first epoch), which abandons it unrecorded.
    fn step(
        &mut self,
        step: usize,
        rollouts: &mut impl Write,
        hashes: &[PluginHash],
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Option<StepMetrics>> {
        let g = self.config.grpo.clone();
        let steps = g.steps;
        let step_started = Instant::now();
        let stop = self.control.clone();
        let stopped = move || stop.is_stopped();

        // Tasks and rollouts.
        let per_step = g.prompts_per_step as u64;
        let first = step as u64 * per_step;
        let (tokenizer, room) = (self.tokenizer.clone(), self.config.sampling.max_tokens);
        let context = self.model_config.max_position_embeddings;
        let StepTasks { tasks, prompts, skipped } =
            wirl_rollout::step_tasks(&mut self.tasks, first..first + per_step, |task| {
                wirl_rollout::fitting_prompt(&tokenizer, task, room, context)
            })?;
        for skip in &skipped {
            tracing::warn!("step {}: {}", step + 1, printable(&skip.to_string()));
        }
        let phase = |phase| Event::Phase { step: step + 1, steps, phase };
        observer.event(phase(Phase::Generating { prompts: g.prompts_per_step, group_size: g.group_size }));
        let generate_started = Instant::now();
        let seeds = |i: usize| seed_for(g.seed, (step * g.prompts_per_step + i) as u64);
        let Some(generated) =
            sample_groups(&self.engine, &prompts, g.group_size, &self.config.sampling, seeds, &stopped)
        else {
            return Ok(None);
        };
        let generated = generated?;
        let generate_s = generate_started.elapsed().as_secs_f64();

        // Scores.
        observer.event(phase(Phase::Scoring));
        let score_started = Instant::now();
        let mut groups = Vec::with_capacity(generated.len());
        for ((task, prompt), trajectories) in tasks.into_iter().zip(prompts).zip(generated) {
            let texts: Vec<String> = trajectories.iter().map(|t| t.text.clone()).collect();
            let scores = self.rewards.score_group(&task, &texts, g.failure_reward);
            groups.push(RolloutGroup { task, prompt, trajectories, scores });
        }
        let score_s = score_started.elapsed().as_secs_f64();
        if stopped() {
            // The calls were cut short: their verdicts are not the plugins', so nothing of
            // this step is learned from or recorded.
            return Ok(None);
        }

        // Advantages; groups whose rewards are all equal carry no signal.
        let batches: Vec<GroupBatch> = groups
            .iter()
            .filter_map(|group| {
                let advantages = wirl_grpo::group_advantages(&group.rewards(), g.advantage)?;
                Some(GroupBatch {
                    prompt: group.prompt.clone(),
                    completions: group.trajectories.iter().map(|t| t.tokens.clone()).collect(),
                    advantages,
                })
            })
            .collect();

        // Update.
        let train_started = Instant::now();
        let learning_rate = wirl_grpo::optim::learning_rate(g.learning_rate, step, g.warmup_steps, g.steps, g.schedule);
        let settings = UpdateSettings {
            learning_rate,
            loss: LossSettings { clip_low: g.clip_low, clip_high: g.clip_high, beta: g.beta, entropy: g.entropy },
            inner_epochs: g.inner_epochs,
            aggregation: g.aggregation,
            max_grad_norm: g.max_grad_norm,
            max_tokens: self.config.sampling.max_tokens,
            // The default job's groups keep about 0.5 GiB and stay on the whole-graph path.
            recompute_above_bytes: g.recompute_above_mib.saturating_mul(1 << 20),
        };
        let mut progress = |group, groups| {
            observer.event(Event::Phase { step: step + 1, steps, phase: Phase::Training { group, groups } })
        };
        let Some(update) = self.learner.update(&batches, &settings, Some(&self.engine), &stopped, &mut progress)?
        else {
            return Ok(None);
        };
        let train_s = train_started.elapsed().as_secs_f64();

        // Records.
        let all: Vec<&wirl_rollout::Scored> = groups.iter().flat_map(|g| &g.scores).collect();
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
        let lengths: Vec<usize> = groups.iter().flat_map(|g| g.trajectories.iter().map(|t| t.tokens.len())).collect();
        let generated: usize = lengths.iter().sum();
        for skip in &skipped {
            let record = SkippedTaskRecord {
                step: step + 1,
                skipped_task: skip.index,
                task: skip.id.clone(),
                reason: skip.reason.clone(),
            };
            serde_json::to_writer(&mut *rollouts, &record)?;
            writeln!(rollouts)?;
        }
        for group in &groups {
            for (sample, (trajectory, score)) in group.trajectories.iter().zip(&group.scores).enumerate() {
                let record = RolloutRecord {
                    step: step + 1,
                    task: group.task.id.clone(),
                    sample,
                    completion: trajectory.text.clone(),
                    tokens: trajectory.tokens.len(),
                    reward: score.reward,
                    parts: score.parts.clone(),
                    failures: score.failures.clone(),
                    notes: score.notes.clone(),
                    plugins: hashes.to_vec(),
                };
                serde_json::to_writer(&mut *rollouts, &record)?;
                writeln!(rollouts)?;
            }
        }
        let kept = batches.len();
        let step_tokens: usize = batches.iter().flat_map(|b| b.completions.iter().map(Vec::len)).sum();
        Ok(Some(StepMetrics {
            step: step + 1,
            learning_rate,
            reward_mean: mean,
            reward_std: std,
            parts,
            pass_rate: rewards.iter().filter(|&&r| r >= g.pass_reward).count() as f32 / n,
            groups_kept: kept,
            loss: update.loss,
            kl: if step_tokens > 0 && g.beta > 0.0 { update.kl } else { 0.0 },
            entropy: update.entropy,
            clip_fraction: update.clip_fraction,
            grad_norm: update.grad_norm,
            updates_skipped: update.updates_skipped,
            groups_recomputed: update.groups_recomputed,
            peak_rss_mib: peak_rss_mib(),
            tasks_skipped: skipped
                .iter()
                .map(|s| SkippedTaskEntry { index: s.index, task: s.id.clone(), reason: s.reason.clone() })
                .collect(),
            completion_tokens_mean: generated as f32 / lengths.len().max(1) as f32,
            completion_tokens_max: lengths.iter().max().copied().unwrap_or(0),
            failures,
            generate_tokens_per_s: generated as f64 / generate_s.max(1e-9),
            time_s: StepTimes {
                generate: generate_s,
                score: score_s,
                train: train_s,
                total: step_started.elapsed().as_secs_f64(),
                reference_forward: update.time.reference_forward,
                policy_forward: update.time.policy_forward,
                backward: update.time.backward,
                optimizer: update.time.optimizer,
            },
        }))
    }

    /// `task`'s prompt, if it leaves room for `sampling.max_tokens` in the model's context.
    fn fitting_prompt(&self, task: &Task) -> Result<Vec<u32>, TaskFailure> {
        let context = self.model_config.max_position_embeddings;
        wirl_rollout::fitting_prompt(&self.tokenizer, task, self.config.sampling.max_tokens, context)
    }
}

/// This process's peak resident memory so far, from the kernel (Linux), in MiB.
fn peak_rss_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib / 1024)
}
