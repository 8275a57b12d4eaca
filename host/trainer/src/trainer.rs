//! The training loop: collect → update → record → checkpoint, step after step.
//!
//! A step: P tasks from the source → G completions each through the engine's batching actor
//! (one admission, so runs are reproducible) → every reward plugin scores each group (a
//! failure gets `failure_reward` and is counted by kind) → group advantages, zero-variance
//! groups dropped → the learner's update (the optimizer writing through the engine's weights
//! barrier; the inference model shares the policy's storage, so no copy between steps) →
//! one line of `metrics.jsonl`, the step's completions in `rollouts.jsonl`, and checkpoints.
//! The step's stages are in `step.rs`; this file holds the run around them (start, swaps,
//! held-out evaluation, checkpoints).

mod boundary;
mod stages;
mod step;

use boundary::AtBoundary;

use crate::checkpoint::{self, Checkpoint};
use crate::config::{BaseDtype, GrpoSection, RunConfig, TaskSpec, TrainConfig};
use crate::control::Control;
use crate::error::{Context, bail};
use crate::manifest::{self, Manifest, PluginStore};
use crate::metrics::StepMetrics;
use crate::observer::{Event, Observer};
use crate::swap::Swapper;
use crate::tasks::{LoadedTask, load_tasks};
use candle_core::{DType, Device};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use wirl_engine::{Comm, EngineHandle, InFlight, LoadOptions, Tokenizer};
use wirl_grpo::{Learner, Net, Optimizer, Policy};
use wirl_rollout::{GroupAsk, RolloutGroup, SkippedTask, StepTasks, TaskSource};
use wirl_sandbox::{Sandbox, SandboxSettings, printable};

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
    /// Over all tasks' held-out problems together.
    pub held_out_pass_rate_before: Option<f32>,
    pub held_out_pass_rate_after: Option<f32>,
    /// Held-out problems per task (`eval.tasks`).
    pub held_out_tasks: usize,
    /// Each task's before and after.
    #[serde(default)]
    pub held_out_by_task: BTreeMap<String, (Option<f32>, Option<f32>)>,
    pub seconds_this_session: f64,
}

/// Held-out greedy pass rates: over all tasks' problems together, and per task.
#[derive(Clone, Debug, Default)]
struct HeldOut {
    overall: Option<f32>,
    /// How many problems `overall` is over.
    problems: usize,
    by_task: BTreeMap<String, f32>,
}

pub struct Trainer {
    config: RunConfig,
    run_dir: PathBuf,
    control: Control,
    /// The data-parallel group this trainer is a rank of ([`Solo`]: alone). Every rank draws
    /// the step's tasks and rolls its share; rank 0 alone writes the run's files.
    ranks: Arc<dyn Comm>,
    policy: PolicyModel,
    side: SideModels,
    live: LiveTasks,
    state: RunState,
}

/// The model being trained: the learner (its weights, the reference, the optimizer), the
/// engine that samples from the same weights, their tokenizer and the model's config.
struct PolicyModel {
    tokenizer: Arc<Tokenizer>,
    learner: Learner,
    engine: EngineHandle,
    model_config: wirl_engine::Config,
}

/// The models a run consults beside the policy, and what rewards ask of them.
struct SideModels {
    /// What rewards (LLM judges) asked of the engine since it was last taken.
    reward_inference: Arc<wirl_rollout::InferenceUsage>,
    /// The engines of the rewards' judge models other than the policy (`judge_model`).
    judges: std::collections::BTreeMap<wirl_rollout::JudgeModel, wirl_rollout::RewardEngine>,
    /// On-policy distillation's teacher (`[distill]`).
    teacher: Option<crate::distill::Teacher>,
}

/// The task set in force and what hot swap keeps beside it.
struct LiveTasks {
    tasks: Vec<LoadedTask>,
    /// Groups per step for each task.
    allocation: Vec<usize>,
    /// The task set in force, its plugins by sha256.
    manifest: Manifest,
    /// The task set before the last switch, loaded (warm), for a rollback.
    previous: Option<Previous>,
    /// A resumed run's later generations, switched in again at their steps.
    scheduled: std::collections::VecDeque<Manifest>,
    swapper: Arc<Swapper>,
    /// Kept alive for the plugins' lifetime (its epoch ticker).
    sandbox: Sandbox,
}

/// What carries from one step to the next besides the weights and the tasks.
struct RunState {
    /// The weights version this session started from (a resumed run's at its checkpoint):
    /// the engine counts from 0, records add this.
    weights_base: u64,
    /// Weight writes this session.
    weights_written: u64,
    /// The process's peak resident memory so far, through the steps' phase resets.
    peak_rss: Option<u64>,
    /// The engine's prompt positions (from its prefix cache, computed) at the last record.
    prompt_positions_seen: (u64, u64),
    /// The next step, begun during this one's update.
    ahead: Option<Ahead>,
    /// The KL in the reward's β where it adapts (`grpo.kl_target`), a resumed run's as its
    /// checkpoint left it.
    reward_kl: Option<wirl_grpo::AdaptiveKl>,
}

/// A step's tasks, drawn and their prompts fitted to the model, before any sampling.
#[derive(Default)]
struct Drawn {
    /// The step's groups to roll, seeded by their place in the step.
    picked: Vec<wirl_rollout::GroupAsk>,
    skipped: Vec<(usize, SkippedTask)>,
    /// Groups that cannot be sampled: a remote task whose server failed.
    placeholders: Vec<(usize, RolloutGroup)>,
    /// Already this rank's share (a lagged step's, sampled during the previous update).
    shared: bool,
}

/// A step begun during the previous one's update.
struct Ahead {
    step: usize,
    /// The manifest generation it was drawn under: a swap in between makes it stale.
    generation: u64,
    drawn: Drawn,
    /// With a generation lag: its groups being sampled, and since when.
    sampling: Option<(InFlight, Instant)>,
}

/// A task set switched away from, still loaded.
struct Previous {
    manifest: Manifest,
    specs: Vec<TaskSpec>,
    tasks: Vec<LoadedTask>,
    allocation: Vec<usize>,
}

impl Trainer {
    /// Load the policy (the base model at `model`, or `resume`'s weights and optimizer
    /// moments), the engine sharing its storage, and the tasks of the run manifest: a new
    /// run's from `config` (its plugins' bytes kept in the run directory), a resumed run's
    /// as in force at its checkpoint (the later generations are switched in again at their
    /// steps). `config` is the run's resolved config.
    ///
    /// As a rank of the data-parallel group `ranks` (`wirl_engine::Solo`: alone). Rank 0 is made first
    /// and writes the run's start (its manifest, its plugins' bytes); the others read it,
    /// write nothing, and leave the control (`wirl ctl`) to rank 0. All share one `control`.
    ///
    /// Over ~80 lines on purpose: it is the run's start in the order it must happen (the
    /// manifest in force, the device, the policy, the inference model sharing its storage, the
    /// engine, the sandbox, the tasks, the optimizer restored), and a third of it is the
    /// struct those parts make.
    pub fn new(
        base: TrainConfig,
        model: &Path,
        run_dir: &Path,
        resume: Option<&Checkpoint>,
        control: Control,
        observer: &mut dyn Observer,
        ranks: Arc<dyn Comm>,
    ) -> crate::error::Result<Self> {
        let store = PluginStore::new(run_dir);
        let follower = ranks.rank() > 0;
        let (manifest, scheduled, next_generation) = manifest_in_force(&base, run_dir, resume, &store, follower)?;
        let mut config = base.with_manifest_tasks(&manifest.tasks)?.run_config()?;
        manifest.pin(&mut config, &store)?;

        // A rank of an NCCL group computes on its group's GPU; otherwise `model.device`.
        let device = match ranks.device() {
            Some(device) => device,
            None => config.device.open()?,
        };
        if device.is_cuda() {
            // candle keeps this switch per process (cuBLAS's compute type for f32 products);
            // one run trains per process, so its config sets it.
            candle_core::cuda::set_gemm_reduced_precision_f32(config.tf32);
        }
        let (model_config, tokenizer, policy, reference) = load_policy(model, resume, &config, &device, observer)?;
        // The inference model shares the policy's storage, updates seen without a copy; or
        // (`model.inference_dtype`, bf16 on a GPU) keeps its own copy, which the learner
        // refreshes on the device after each update (a LoRA policy's adapters are applied
        // beside the base, unmerged).
        let mut source = wirl_engine::load::TensorSource::new(policy.shared_tensors())
            .with_lora_scale(policy.lora_scale())
            .copied_as(config.inference_dtype_on(&device));
        let inference = Arc::new(wirl_engine::Model::load(&model_config, &mut source, &device)?);
        let trained: std::collections::HashSet<&str> = policy.vars().iter().map(|(name, _)| name.as_str()).collect();
        let mirror = source.mirror(|name| trained.contains(name));
        let mut tokenizer = tokenizer;
        tokenizer.set_template_vars(config.chat_template_kwargs.clone())?;
        let tokenizer = Arc::new(tokenizer);
        let (engine, _thread) = EngineHandle::spawn_with(inference, tokenizer.clone(), config.engine_options())?;

        let sandbox = Sandbox::new(SandboxSettings::default())?;
        control.watch(sandbox.interrupter());
        let allocation = config.allocation()?;
        if allocation.moved {
            warn_moved_allocation(&config, &allocation.groups);
        }
        let tasks = load_tasks(&sandbox, &config, &allocation.groups, &tokenizer)?;
        let teacher = match &config.distill {
            Some(section) => Some(crate::distill::Teacher::load(section, &tokenizer, &device, observer)?),
            None => None,
        };
        let reward_inference = Arc::new(wirl_rollout::InferenceUsage::default());
        let judges = crate::judges::load_judges(
            &tasks,
            model,
            &device,
            config.engine_options(),
            config.grpo.seed,
            &reward_inference,
            observer,
        )?;
        let swapper = Arc::new(Swapper::new(
            base,
            run_dir,
            sandbox.clone(),
            tokenizer.clone(),
            manifest.clone(),
            next_generation.max(manifest.generation + 1),
            &tasks,
        ));
        if !follower {
            control.attach(swapper.clone());
        }
        if let (Some(checkpoint), false) = (resume, follower)
            && let Some(generation) = swapper.discard_lost(checkpoint.state.step)?
        {
            tracing::warn!(
                "{}: task set generation {generation} was staged before the run stopped, but never switched in (the \
                 run was killed first): it is not in force; apply it again (events.jsonl records it as discarded)",
                run_dir.display()
            );
        }
        let vars = policy.vars().iter().map(|(_, v)| v.clone()).collect();
        let mut optimizer = Optimizer::new(vars, config.grpo.weight_decay)?;
        if let Some(checkpoint) = resume {
            checkpoint::restore_optimizer(checkpoint, &policy, &mut optimizer)?;
        }
        let reward_kl = config.objective.kl.controller(resume.and_then(|c| c.state.reward_kl_coef));
        let learner = Learner {
            ranks: ranks.clone(),
            mirror: (!mirror.is_empty()).then_some(mirror),
            ..Learner::new(policy, reference, optimizer)
        };
        Ok(Trainer {
            config,
            run_dir: run_dir.to_path_buf(),
            control,
            ranks,
            policy: PolicyModel { tokenizer, learner, engine, model_config },
            side: SideModels { reward_inference, judges, teacher },
            live: LiveTasks {
                tasks,
                allocation: allocation.groups,
                manifest,
                previous: None,
                scheduled: scheduled.into(),
                swapper,
                sandbox,
            },
            state: RunState {
                weights_base: resume.map_or(0, |c| c.state.weights_version.unwrap_or(c.state.optimizer_steps as u64)),
                weights_written: 0,
                peak_rss: None,
                prompt_positions_seen: (0, 0),
                ahead: None,
                reward_kl,
            },
        })
    }

    /// Every rank starts from the same config, plugins (by sha256), weights version and
    /// step as rank 0, or all refuse to start, naming what differs on which rank.
    fn check_ranks_agree(&self, start: usize) -> crate::error::Result<()> {
        if self.ranks.size() == 1 {
            return Ok(());
        }
        let fingerprint = serde_json::json!({
            "config": serde_json::to_value(&self.live.swapper.base)?,
            "plugins (sha256)": self.plugin_hashes(),
            "weights version": self.state.weights_base,
            "step": start,
            "model": serde_json::to_value(&self.policy.model_config)?,
        });
        let all = wirl_engine::all_gather_bytes(self.ranks.as_ref(), &serde_json::to_vec(&fingerprint)?)?;
        let theirs = all.iter().map(|b| serde_json::from_slice(b)).collect::<Result<Vec<serde_json::Value>, _>>()?;
        for (rank, other) in theirs.iter().enumerate().skip(1) {
            for (key, value) in theirs[0].as_object().into_iter().flatten() {
                if other.get(key) != Some(value) {
                    bail!(
                        "rank {rank} disagrees with rank 0 on its {key}: the ranks of a run must start from the same \
                         config, plugins, weights and step"
                    );
                }
            }
        }
        Ok(())
    }

    /// Whether this rank writes the run's files (rank 0, or a trainer alone).
    fn writes(&self) -> bool {
        self.ranks.rank() == 0
    }

    /// Whether any rank says `flag` (alone: `flag`). Every rank calls it at the same points.
    fn agree(&self, flag: bool) -> crate::error::Result<bool> {
        let mut any = [f32::from(u8::from(flag))];
        self.ranks.all_reduce_sum_in_place(&mut any)?;
        Ok(any[0] > 0.0)
    }

    /// The engine that samples from the policy (shared: a server may generate with it too).
    pub fn engine(&self) -> &EngineHandle {
        &self.policy.engine
    }

    /// The policy's tokenizer.
    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.policy.tokenizer
    }

    /// The model's context length in tokens.
    pub fn context(&self) -> usize {
        self.policy.model_config.context()
    }

    /// `(name, sha256)` of every task's environment and reward plugins, each once.
    pub fn plugin_hashes(&self) -> Vec<(String, String)> {
        self.live.plugin_hashes()
    }

    /// The step boundary, for hot swap to act on: a resumed run's later generations, a
    /// staged set or a rollback switched in, a pause waited out, rank 0's set followed on
    /// the other ranks. Whether the run was stopped meanwhile.
    fn at_boundary(&mut self, step: usize, observer: &mut dyn Observer) -> crate::error::Result<bool> {
        let mut at = AtBoundary {
            specs: &mut self.config.tasks,
            run_dir: &self.run_dir,
            writes: self.ranks.rank() == 0,
            tokenizer: &self.policy.tokenizer,
            observer,
        };
        let stopped = self.live.boundary(step, &self.control, &mut at)?;
        self.live.follow(step, self.ranks.as_ref(), &mut at)?;
        Ok(stopped)
    }

    /// Greedy pass rates on every task's held-out problems (`eval.tasks` each), all
    /// generated together; a multi-turn task's as greedy episodes.
    /// The held-out pass rate before training: measured now on a new run, kept in a resumed
    /// run's checkpoint, unknown when a run starts past step 0 otherwise.
    fn held_out_before(&mut self, start: usize, resumed: Option<&Checkpoint>) -> crate::error::Result<HeldOut> {
        Ok(match resumed {
            Some(checkpoint) => HeldOut {
                overall: checkpoint.state.held_out_before,
                problems: 0,
                by_task: checkpoint.state.held_out_before_by_task.clone(),
            },
            None if start == 0 => self.evaluate()?,
            None => HeldOut::default(),
        })
    }

    /// A finished step's metrics: into the status `wirl ctl` reads, `metrics.jsonl` and
    /// TensorBoard's events.
    fn publish(
        &self,
        line: &StepMetrics,
        metrics: &mut impl Write,
        tensorboard: &mut crate::tensorboard::EventWriter,
    ) -> crate::error::Result<()> {
        {
            let mut state = self.live.swapper.state();
            state.status.step = line.step;
            state.status.tasks = line.tasks.clone();
            state.status.reward_mean = line.reward_mean;
            state.status.pass_rate = line.pass_rate;
        }
        serde_json::to_writer(&mut *metrics, line)?;
        writeln!(metrics)?;
        metrics.flush()?;
        tensorboard.step(line)?;
        Ok(())
    }

    /// The end of a finished run: the held-out pass rate after training, before and after by
    /// task, written to `summary.json`.
    fn summarize(
        &mut self,
        before: &HeldOut,
        started: Instant,
        observer: &mut dyn Observer,
    ) -> crate::error::Result<Summary> {
        let after = self.evaluate()?;
        if let Some(pass_rate) = after.overall {
            observer.event(Event::HeldOut { after: true, pass_rate, problems: after.problems });
        }
        let held_out_by_task = self
            .live
            .tasks
            .iter()
            .map(|t| &t.spec.name)
            .filter(|name| before.by_task.contains_key(*name) || after.by_task.contains_key(*name))
            .map(|name| (name.clone(), (before.by_task.get(name).copied(), after.by_task.get(name).copied())))
            .collect();
        let summary = Summary {
            steps: self.config.grpo.steps,
            held_out_pass_rate_before: before.overall,
            held_out_pass_rate_after: after.overall,
            held_out_tasks: self.config.eval.tasks,
            held_out_by_task,
            seconds_this_session: started.elapsed().as_secs_f64(),
        };
        std::fs::write(self.run_dir.join("summary.json"), serde_json::to_string(&summary)? + "\n")?;
        Ok(summary)
    }

    fn evaluate(&mut self) -> crate::error::Result<HeldOut> {
        let count = self.config.eval.tasks;
        if count == 0 {
            return Ok(HeldOut::default());
        }
        let context = self.policy.model_config.context();
        let first = self.config.eval.first_index;
        // Before the first step too: a judge scores the held-out answers with the model.
        self.give_rewards_the_engine();
        // Those left out were logged; the summary's figures are over the rest.
        let (asks, _left_out) = wirl_rollout::collect::held_out_asks(
            &mut self.live.tasks,
            first,
            count,
            &self.policy.tokenizer,
            context,
            self.config.grpo.seed,
        );
        let agents = self.live.tasks.iter().any(|t| matches!(t.source, TaskSource::Agent { .. }));
        if asks.is_empty() && !agents {
            tracing::warn!("no held-out task could be used: evaluation skipped");
            return Ok(HeldOut::default());
        }
        let owners: Vec<usize> = asks.iter().map(|ask| ask.task).collect();
        let engine = wirl_rollout::Engine { handle: &self.policy.engine, tokenizer: &self.policy.tokenizer, context };
        let never = || false;
        let groups =
            wirl_rollout::collect_groups(engine, &mut self.live.tasks, asks, &never).expect("never stopped")?;
        let mut passed = vec![(0usize, 0usize); self.live.tasks.len()];
        for (t, task) in self.live.tasks.iter().enumerate() {
            if let TaskSource::Agent { agent, limits } = &task.source {
                let indices = first..first.saturating_add(count as u64);
                let (p, n) = crate::eval::agent_held_out(
                    &task.spec,
                    agent,
                    *limits,
                    &self.policy.engine,
                    &self.policy.tokenizer,
                    context,
                    indices,
                );
                passed[t] = (p, n);
            }
        }
        for (group, t) in groups.iter().zip(owners) {
            let pass_reward = self.live.tasks[t].spec.pass_reward;
            // A masked verdict (a plugin failed) is not a pass.
            passed[t].0 += group.scores.iter().filter(|s| s.status.usable() && s.reward >= pass_reward).count();
            passed[t].1 += group.scores.len();
        }
        let (all_passed, all) = passed.iter().fold((0, 0), |(p, n), (tp, tn)| (p + tp, n + tn));
        let by_task = self
            .live
            .tasks
            .iter()
            .zip(&passed)
            .filter(|(_, (_, n))| *n > 0)
            .map(|(task, (p, n))| (task.spec.name.clone(), *p as f32 / *n as f32))
            .collect();
        let overall = (all > 0).then(|| all_passed as f32 / all as f32);
        Ok(HeldOut { overall, problems: all, by_task })
    }

    fn checkpoint(&self, step: usize, before: &HeldOut, observer: &mut dyn Observer) -> crate::error::Result<()> {
        if !self.writes() {
            return Ok(());
        }
        let state = checkpoint::State {
            step,
            optimizer_steps: self.policy.learner.optimizer.steps,
            held_out_before: before.overall,
            held_out_before_by_task: before.by_task.clone(),
            plugins: self.plugin_hashes(),
            manifest_generation: Some(self.live.manifest.generation),
            weights_version: Some(self.state.weights_base + self.state.weights_written),
            reward_kl_coef: self.state.reward_kl.map(|adaptive| adaptive.value),
        };
        let dir = checkpoint::write(
            &self.run_dir,
            &state,
            &self.policy.learner.policy,
            &self.policy.learner.optimizer,
            &self.policy.model_config,
            &self.policy.tokenizer,
            &self.config.model,
        )?;
        observer.event(Event::Checkpoint { dir: &dir });
        checkpoint::prune(&self.run_dir, self.config.grpo.keep_checkpoints, step);
        Ok(())
    }

    /// The updates skipped in a row after `step` (a non-finite gradient leaves the weights
    /// alone); past `grpo.max_skipped_updates` the last good weights are checkpointed and the
    /// run stops, saying what to do.
    fn count_skipped(
        &mut self,
        step: usize,
        line: &StepMetrics,
        in_a_row: usize,
        before: &HeldOut,
        observer: &mut dyn Observer,
    ) -> crate::error::Result<usize> {
        if line.updates_skipped == 0 {
            return Ok(0);
        }
        tracing::warn!(
            "step {}: the gradient norm is {}; the update is skipped (weights unchanged)",
            step + 1,
            line.grad_norm
        );
        let in_a_row = in_a_row + line.updates_skipped;
        if in_a_row >= self.config.grpo.max_skipped_updates {
            // The weights are still the last good ones: skipped updates leave them alone.
            self.checkpoint(step + 1, before, observer)?;
            bail!(
                "stopping: {in_a_row} updates in a row had a non-finite gradient (the last at step {}; \
                 grpo.max_skipped_updates = {}); the last good weights are checkpointed. Look at the step's \
                 rewards in {} and lower grpo.learning_rate, then `wirl train --resume {}`",
                step + 1,
                self.config.grpo.max_skipped_updates,
                self.run_dir.join("rollouts.jsonl").display(),
                self.run_dir.display()
            );
        }
        Ok(in_a_row)
    }

    /// Run steps `start + 1 ..= grpo.steps`; a resumed run passes its checkpoint, whose
    /// held-out scores before training it keeps.
    ///
    /// Over ~80 lines on purpose: the loop's four ways to end (stopped between steps, stopped
    /// inside one, too many skipped updates, the last step) each checkpoint and discard a
    /// staged swap differently, and reading them side by side is what keeps them consistent.
    pub fn train(
        &mut self,
        start: usize,
        resumed: Option<&Checkpoint>,
        observer: &mut dyn Observer,
    ) -> crate::error::Result<Outcome> {
        let started = Instant::now();
        self.check_ranks_agree(start)?;
        // The held-out evaluation, the files and the checkpoints are rank 0's.
        let writes = self.writes();
        let before = if writes { self.held_out_before(start, resumed)? } else { HeldOut::default() };
        if let (0, Some(pass_rate)) = (start, before.overall) {
            observer.event(Event::HeldOut { after: false, pass_rate, problems: before.problems });
        }
        let append = |name: &str| -> crate::error::Result<Box<dyn Write>> {
            if !writes {
                return Ok(Box::new(std::io::sink()));
            }
            let file = std::fs::OpenOptions::new().create(true).append(true).open(self.run_dir.join(name))?;
            Ok(Box::new(std::io::BufWriter::new(file)))
        };
        let (mut metrics, mut rollouts) = (append("metrics.jsonl")?, append("rollouts.jsonl")?);
        let mut tensorboard = writes.then(|| crate::tensorboard::EventWriter::create(&self.run_dir)).transpose()?;
        let steps = self.config.grpo.steps;
        let every = self.config.grpo.checkpoint_every;
        let mut step_times = Vec::new();
        let mut skipped_in_a_row = 0;
        let alone = self.ranks.size() == 1;
        for step in start..steps {
            // Every rank stops at the same boundary (a stop seen by any of them), and runs
            // the task set rank 0 has in force from it (a swap or rollback applied there).
            let stop_here = self.at_boundary(step, observer)?;
            if self.agree(stop_here)? {
                // Stopped while paused between steps: nothing of the next step began.
                rollouts.flush()?;
                self.checkpoint(step, &before, observer)?;
                self.live.swapper.discard_staged(step, "the run stopped before its next step boundary");
                return Ok(Outcome::Stopped { steps_done: step, abandoned: false });
            }
            let Some(line) = self.step(step, &mut rollouts, observer)? else {
                // Stopped before the step's first update: the step is abandoned, the weights
                // are those of the last completed step.
                rollouts.flush()?;
                self.checkpoint(step, &before, observer)?;
                self.live.swapper.discard_staged(step, "the run stopped before its next step boundary");
                return Ok(Outcome::Stopped { steps_done: step, abandoned: true });
            };
            step_times.push(line.time_s.total);
            if let Some(tensorboard) = &mut tensorboard {
                self.publish(&line, &mut metrics, tensorboard)?;
            }
            rollouts.flush()?;
            let mean_step = step_times.iter().sum::<f64>() / step_times.len() as f64;
            let eta_s = mean_step * (steps - step - 1) as f64;
            observer.event(Event::Step { metrics: &line, steps, eta_s });
            skipped_in_a_row = self.count_skipped(step, &line, skipped_in_a_row, &before, observer)?;
            // With ranks, a stop is agreed at the next boundary instead (a rank may see it later).
            let stopped = alone && self.control.is_stopped();
            if step + 1 == steps || (every > 0 && (step + 1) % every == 0) || stopped {
                self.checkpoint(step + 1, &before, observer)?;
            }
            if stopped {
                self.live.swapper.discard_staged(step + 1, "the run stopped before its next step boundary");
                return Ok(Outcome::Stopped { steps_done: step + 1, abandoned: false });
            }
        }
        self.live.swapper.discard_staged(steps, "the run ended (its last step done) before another step boundary");
        if !writes {
            let seconds_this_session = started.elapsed().as_secs_f64();
            let summary = Summary {
                steps,
                held_out_pass_rate_before: None,
                held_out_pass_rate_after: None,
                held_out_tasks: 0,
                held_out_by_task: BTreeMap::new(),
                seconds_this_session,
            };
            return Ok(Outcome::Finished(summary));
        }
        let summary = self.summarize(&before, started, observer)?;
        Ok(Outcome::Finished(summary))
    }
}

/// The manifest in force: a new run's (written now, its plugins' bytes kept), or the one a
/// resumed checkpoint names; with the later generations to switch in again at their steps,
/// and the next generation number.
fn manifest_in_force(
    base: &TrainConfig,
    run_dir: &Path,
    resume: Option<&Checkpoint>,
    store: &PluginStore,
    follower: bool,
) -> crate::error::Result<(Manifest, Vec<Manifest>, u64)> {
    let history = manifest::history(run_dir)?;
    let next_generation = history.last().map_or(0, |m| m.generation + 1);
    if follower && resume.and_then(|c| c.state.manifest_generation).is_none() {
        // Rank 0 wrote the new run's manifest just before: the same task set, read back.
        let Some(manifest) = history.last().cloned() else {
            bail!("{}: rank 0 wrote no manifest for the ranks to start from", run_dir.display());
        };
        if manifest.tasks != base.task_set() {
            bail!("{}: the ranks disagree on the task set (rank 0 wrote another)", run_dir.display());
        }
        return Ok((manifest, Vec::new(), next_generation));
    }
    let Some(generation) = resume.and_then(|c| c.state.manifest_generation) else {
        let manifest = Manifest::keep(next_generation, 0, "start", base.task_set(), store)?;
        manifest.write(run_dir)?;
        return Ok((manifest, Vec::new(), next_generation));
    };
    let Some(manifest) = history.iter().find(|m| m.generation == generation).cloned() else {
        bail!(
            "{}: the checkpoint names manifest generation {generation}, which is not in {}",
            run_dir.display(),
            run_dir.join("manifests").display()
        );
    };
    manifest.check_inputs()?;
    let later = history.into_iter().filter(|m| m.generation > generation).collect();
    Ok((manifest, later, next_generation))
}

/// The policy (the base model at `model`, or a checkpoint's weights), its config and
/// tokenizer, and with a KL term (`beta` > 0) the reference: the base model, also when
/// resuming. With `[lora]`, the base frozen and adapters trained (new, or the checkpoint's);
/// the reference is then the base itself, without a copy.
fn load_policy(
    model: &Path,
    resume: Option<&Checkpoint>,
    config: &RunConfig,
    device: &Device,
    observer: &mut dyn Observer,
) -> crate::error::Result<(wirl_engine::Config, Tokenizer, Policy, Option<Net>)> {
    // f32 on every device: the master weights and what the optimizer updates.
    let options = LoadOptions { dtype: Some(DType::F32), device: device.clone(), ..Default::default() };
    let keeps_reference = config.objective.kl.needs_reference();
    if let Some(lora) = &config.lora {
        observer.event(Event::Loading { path: model });
        // A bf16 base is converted matrix by matrix as it is read: never all of it in f32.
        let matrix_dtype = (lora.base_dtype == BaseDtype::Bf16).then_some(DType::BF16);
        let options = LoadOptions { matrix_dtype, ..options };
        let (model_config, tokenizer, tensors) = wirl_engine::load::load_tensors(model, &options)?;
        let adapter = match resume {
            Some(checkpoint) => checkpoint::read_adapter(checkpoint, &model_config, lora)?,
            None => wirl_engine::lora::Adapter::init(&lora.spec(), &model_config, lora.seed, device)?,
        };
        let mut policy = Policy::with_adapter(&model_config, tensors, &adapter, device)?;
        policy.set_compute_dtype(config.train_dtype);
        let reference = if keeps_reference { Some(policy.reference(device)?) } else { None };
        return Ok((model_config, tokenizer, policy, reference));
    }
    if let Some(checkpoint) = resume
        && checkpoint.adapter_dir().is_dir()
    {
        bail!(
            "{}: the checkpoint holds LoRA adapters, but the config has no [lora] section; resume with the run's \
             own config",
            checkpoint.dir.display()
        );
    }
    let policy_path = resume.map_or(model.to_path_buf(), Checkpoint::model_dir);
    observer.event(Event::Loading { path: &policy_path });
    let (model_config, tokenizer, tensors) = wirl_engine::load::load_tensors(&policy_path, &options)?;
    let mut policy = Policy::new(&model_config, &tensors, device)?;
    policy.set_compute_dtype(config.train_dtype);
    drop(tensors);
    let reference = match (keeps_reference, resume) {
        (false, _) => None,
        (true, None) => Some(policy.reference(device)?),
        (true, Some(_)) => {
            let (base_config, _, base) = wirl_engine::load::load_tensors(model, &options)?;
            let mut reference = Net::new(&base_config, base, device)?;
            reference.set_compute_dtype(config.train_dtype);
            Some(reference)
        }
    };
    Ok((model_config, tokenizer, policy, reference))
}

/// The groups per step differ from the task weights (too few prompts per step to follow
/// them): say how they fall.
fn warn_moved_allocation(config: &RunConfig, groups: &[usize]) {
    let shares: Vec<String> =
        config.tasks.iter().zip(groups).map(|(task, groups)| format!("{} {groups}", task.name)).collect();
    tracing::warn!(
        "grpo.prompts_per_step = {} cannot follow the task weights exactly; groups per step: {}",
        config.grpo.prompts_per_step,
        shares.join(", ")
    );
}

/// Where the tasks and seeds of a step's draws after its first (DAPO's dynamic sampling)
/// begin: apart from every first draw's (step × groups, far below) and every replacement's
/// (`wirl_rollout::REPLACEMENT_INDICES`, far above).
const EXTRA_DRAWS: u64 = 1 << 45;

/// Step `step`'s groups of draw `draw` (0: the step's own), in task order: task t's k-th
/// group of step s is its problem s × groups(t) + k, the same on every resume and whenever
/// it is drawn; the i-th group picked is seeded by slot `step × prompts_per_step + i`. Draw
/// d > 0 takes the same places from `EXTRA_DRAWS + (s × max_draws + d) × …`. `None` when a
/// stop cut the sources' calls short (their failures are not their own).
#[allow(clippy::too_many_arguments)]
fn draw_tasks(
    tasks: &mut [LoadedTask],
    allocation: &[usize],
    tokenizer: &Tokenizer,
    context: usize,
    step: usize,
    draw: usize,
    grpo: &GrpoSection,
    stopped: &(dyn Fn() -> bool + Sync),
) -> crate::error::Result<Option<Drawn>> {
    let group_size = grpo.group_size;
    let mut drawn = Drawn::default();
    // The draw's place among every step's: the first index of a task's groups and of the
    // seeds' slots are this place times their count.
    let (place, base) = match draw {
        0 => (step as u64, 0),
        d => ((step * grpo.max_draws + d) as u64, EXTRA_DRAWS),
    };
    for (t, task) in tasks.iter_mut().enumerate() {
        let groups = allocation[t] as u64;
        // An agent makes its own tasks (after the others' generation).
        if groups == 0 || matches!(task.source, TaskSource::Agent { .. }) {
            continue;
        }
        let first = base + place * groups;
        if let TaskSource::Remote(remote) = &mut task.source
            && let Err(error) = remote.prefetch(first, groups as usize)
        {
            // Its server failed: nothing to sample this step; the groups are recorded as
            // failed (masked), never scored 0.
            let name = &task.spec.name;
            tracing::warn!("step {}, task `{name}`: {}", step + 1, printable(&error.to_string()));
            let message = format!("the task server failed, nothing to train on: {error}");
            drawn.placeholders.extend((first..first + groups).map(|index| {
                let id = format!("{name}/{index}");
                (t, RolloutGroup::placeholder(name, id, group_size, "remote", "remote", &message))
            }));
            continue;
        }
        let max_tokens = task.spec.sampling.max_tokens;
        let fitted = wirl_rollout::step_tasks(&mut task.source, first..first + groups, |problem| {
            wirl_rollout::fitting_prompt(tokenizer, problem, max_tokens, context)
        });
        if stopped() {
            return Ok(None);
        }
        let StepTasks { tasks, prompts, skipped } = fitted.with_context(|| format!("task `{}`", task.spec.name))?;
        for (problem, prompt) in tasks.into_iter().zip(prompts) {
            let slot = base + place * grpo.prompts_per_step as u64 + drawn.picked.len() as u64;
            let sampling = task.spec.sampling;
            let progress = wirl_sandbox::Progress { step: step as u64 + 1, steps: grpo.steps as u64 };
            drawn.picked.push(GroupAsk::new(t, problem, prompt, group_size, sampling, grpo.seed, slot).at(progress));
        }
        drawn.skipped.extend(skipped.into_iter().map(|skip| (t, skip)));
    }
    Ok(Some(drawn))
}

/// This process's peak resident memory so far, from the kernel (Linux), in MiB (its
/// high-water mark, VmHWM).
fn rss_high_water_mib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kib| kib / 1024)
}

/// The memory resident now (Linux), in bytes: `/proc/self/statm`'s second field, in pages.
/// Sampled every 10 ms while a step runs; `statm` is one line of counters, where `status`
/// (read before) is forty lines the kernel formats, the affinity and cgroup ones included.
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages = statm.split_whitespace().nth(1)?.parse::<u64>().ok()?;
    Some(pages * page_size())
}

fn page_size() -> u64 {
    static PAGE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: sysconf has no preconditions.
    *PAGE.get_or_init(|| u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096))
}

/// A step's peak resident memory phase by phase: a thread samples the resident memory every
/// 10 ms (Linux) and keeps the highest. (Resetting the kernel's high-water mark instead
/// would also reset what `getrusage` — and so `/usr/bin/time` — reports for the process.)
struct PhaseMemory {
    run_peak: Option<u64>,
    phase_peak: std::sync::Arc<std::sync::atomic::AtomicU64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    sampler: Option<std::thread::JoinHandle<()>>,
}

impl PhaseMemory {
    /// Begin a step: the peak before it (held-out evaluation, earlier steps) is kept.
    fn start(run_peak: Option<u64>) -> Self {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let phase_peak = std::sync::Arc::new(AtomicU64::new(rss_bytes().unwrap_or(0)));
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let sampler = rss_bytes().is_some().then(|| {
            let (peak, stop) = (phase_peak.clone(), stop.clone());
            std::thread::Builder::new()
                .name("wirl-rss".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        peak.fetch_max(rss_bytes().unwrap_or(0), Ordering::Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                })
                .ok()
        });
        PhaseMemory { run_peak: run_peak.max(rss_high_water_mib()), phase_peak, stop, sampler: sampler.flatten() }
    }

    /// The peak of the phase that ends now, in MiB; the next phase is measured from here.
    fn phase_end(&mut self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        self.sampler.as_ref()?;
        let now = rss_bytes().unwrap_or(0);
        let peak = self.phase_peak.swap(now, Ordering::Relaxed).max(now) >> 20;
        self.run_peak = self.run_peak.max(rss_high_water_mib());
        Some(peak)
    }
}

impl Drop for PhaseMemory {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(sampler) = self.sampler.take() {
            let _ = sampler.join();
        }
    }
}
