//! A training run as the application starts it: the config it is read from and the command
//! line's overrides over it, a new run directory or a resume (refusing plugins other than the
//! checkpoint's), the data-parallel ranks (threads, or an `mpirun` job's processes), the
//! control socket, `--watch` and `--serve` beside it. What it has to say goes to the caller's
//! `Observer`; Ctrl-C is the caller's to turn into `Control::stop`.

use crate::serve::ServeTraining;
use crate::{control_socket, models, ranks};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wirl_engine::Comm;
use wirl_trainer::config::{DEFAULT_TOML, DeviceSpec};
use wirl_trainer::{Control, Observer, Outcome, TrainConfig, Trainer, run_dir};

/// Where a run's config comes from.
#[derive(Clone, Debug)]
pub enum ConfigSource {
    /// A run directory's own config: the run continues from its newest complete checkpoint.
    Resume(PathBuf),
    /// A training config file.
    File(PathBuf),
    /// The embedded default job (examples/train/default.toml).
    Default,
}

/// The command line's settings over the config (`--model`, `--device`, `--steps`,
/// `--eval-tasks`, `--set KEY=VALUE`).
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub model: Option<String>,
    pub device: Option<String>,
    pub steps: Option<usize>,
    pub eval_tasks: Option<usize>,
    pub set: Vec<String>,
}

/// Everything a run is started with.
#[derive(Clone, Debug)]
pub struct TrainLaunch {
    pub source: ConfigSource,
    pub overrides: Overrides,
    /// Where a new run's files go (None: runs/train-<unix time>).
    pub run_dir: Option<PathBuf>,
    /// Data-parallel ranks (1: one trainer).
    pub ranks: usize,
    pub watch: bool,
    pub serve: Option<ServeTraining>,
}

/// How a run ended, and where it was written.
pub struct Trained {
    pub outcome: Outcome,
    pub run_dir: PathBuf,
}

impl TrainLaunch {
    /// Where the config came from, as a message names it.
    pub fn origin(&self) -> String {
        match &self.source {
            ConfigSource::Resume(run_dir) => format!("{} (the run's config)", run_dir.display()),
            ConfigSource::File(path) => path.display().to_string(),
            ConfigSource::Default => "the embedded default".to_string(),
        }
    }

    /// The config the run would train with: its source with the overrides over it, checked.
    pub fn config(&self) -> anyhow::Result<TrainConfig> {
        let mut config = match &self.source {
            ConfigSource::Resume(run_dir) => run_dir::config(run_dir)?,
            ConfigSource::File(path) => TrainConfig::load(path)?,
            ConfigSource::Default => TrainConfig::embedded_default()?,
        };
        self.apply_overrides(&mut config)?;
        Ok(config)
    }

    /// A resume that would train nothing: the steps its run already trained and summarized.
    pub fn already_finished(&self) -> anyhow::Result<Option<usize>> {
        match &self.source {
            ConfigSource::Resume(dir) => Ok(run_dir::finished(dir, self.config()?.grpo.steps)?),
            _ => Ok(None),
        }
    }

    fn apply_overrides(&self, config: &mut TrainConfig) -> anyhow::Result<()> {
        let o = &self.overrides;
        if let Some(model) = &o.model {
            config.model.path = model.clone();
        }
        if let Some(device) = &o.device {
            config.model.device = Some(device.clone());
        }
        if let Some(steps) = o.steps {
            config.grpo.steps = steps;
        }
        if let Some(tasks) = o.eval_tasks {
            config.eval.tasks = tasks;
        }
        config.set_all(&o.set)?;
        Ok(config.check_numbers("the command line (--steps, --eval-tasks, --device, --set)")?)
    }

    /// The device a run's ranks compute on, as its config with the overrides says: read
    /// before any rank loads, since CUDA ranks are joined (one GPU each) first.
    fn device(&self) -> anyhow::Result<DeviceSpec> {
        Ok(self.config()?.model.device.as_deref().and_then(DeviceSpec::parse).unwrap_or_default())
    }

    fn refuse_beside_ranks(&self) -> anyhow::Result<()> {
        if self.ranks > 1 && (self.serve.is_some() || self.watch) {
            anyhow::bail!("--dp {}: --serve and --watch are not supported with several ranks yet", self.ranks);
        }
        Ok(())
    }

    /// Train in this process: rank 0 reports to `observer` and writes the run; the other
    /// ranks are threads that train in step with it and write nothing.
    pub fn run(&self, control: &Control, observer: &mut dyn Observer) -> anyhow::Result<Trained> {
        self.refuse_beside_ranks()?;
        let device = if self.ranks > 1 { self.device()? } else { DeviceSpec::Cpu };
        if self.ranks > 1 && matches!(device, DeviceSpec::Cpu) {
            // Before any rank loads: copies of the model the machine cannot hold are refused.
            let model = models::resolve(Some(self.config()?.model.path.as_str()))?;
            ranks::check_copies_fit(&model, self.ranks, "--dp")?;
        }
        let mut comms = ranks::threads(self.ranks, device)?;
        let rank0 = comms.remove(0);
        let Started { mut trainer, checkpoint, run_dir, config, model } = self.start(control, rank0, observer)?;
        let _answering = control_socket::serve(&run_dir, control.clone())?;
        let _serving = match &self.serve {
            Some(serve) => Some(crate::serve::serve_training(serve, &trainer, control.clone())?),
            None => None,
        };
        if self.watch {
            crate::watch::watch_plugins(control.clone());
        }
        let start = checkpoint.as_ref().map_or(0, |c| c.state.step);
        let outcome = std::thread::scope(|scope| {
            let followers: Vec<_> = comms
                .into_iter()
                .enumerate()
                .map(|(i, comm)| {
                    let (config, model, run_dir, control, checkpoint) =
                        (config.clone(), model.clone(), run_dir.clone(), control.clone(), checkpoint.clone());
                    scope.spawn(move || -> anyhow::Result<()> {
                        let mut quiet = wirl_trainer::Quiet;
                        let rank = || format!("rank {}", i + 1);
                        let mut trainer =
                            Trainer::new(config, &model, &run_dir, checkpoint.as_ref(), control, &mut quiet, comm)
                                .with_context(rank)?;
                        trainer.train(start, checkpoint.as_ref(), &mut quiet).with_context(rank)?;
                        Ok(())
                    })
                })
                .collect();
            let outcome = trainer.train(start, checkpoint.as_ref(), observer);
            let followed = followers.into_iter().map(|f| f.join().unwrap_or_else(|p| std::panic::resume_unwind(p)));
            first_failure(outcome, followed)
        });
        Ok(Trained { outcome: outcome?, run_dir })
    }

    /// Rank 0's start (or a trainer alone's): a resume's config and checkpoint, refusing
    /// plugins other than the checkpoint's; or a new run directory, removed again if loading
    /// fails. `ranks`: the data-parallel group this trainer is rank 0 of.
    fn start(&self, control: &Control, ranks: Arc<dyn Comm>, observer: &mut dyn Observer) -> anyhow::Result<Started> {
        match &self.source {
            ConfigSource::Resume(run_dir) => self.resume(run_dir, control, ranks, observer),
            ConfigSource::File(_) | ConfigSource::Default => self.begin(control, ranks, observer),
        }
    }

    fn resume(
        &self,
        run_dir: &Path,
        control: &Control,
        ranks: Arc<dyn Comm>,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Started> {
        let mut config = run_dir::config(run_dir)?;
        self.apply_overrides(&mut config)?;
        let checkpoint = run_dir::prepare_resume(run_dir)?;
        observer.event(wirl_trainer::Event::Resuming { run_dir, step: checkpoint.state.step });
        let model = models::resolve(Some(&config.model.path))?;
        let trainer =
            Trainer::new(config.clone(), &model, run_dir, Some(&checkpoint), control.clone(), observer, ranks)?;
        let current = trainer.plugin_hashes();
        if current != checkpoint.state.plugins && checkpoint.state.manifest_generation.is_none() {
            tracing::warn!("the plugins changed since the checkpoint (by sha256): {current:?}");
        } else if current != checkpoint.state.plugins {
            // The manifest in force names other bytes than those the checkpoint was trained
            // with: the manifests were rewritten after it.
            anyhow::bail!(
                "{}: the plugins of manifest generation {} are not those its checkpoint of step {} was trained with \
                 (by sha256: checkpoint {:?}, manifest {:?}); the run directory's manifests changed after the \
                 checkpoint. Refusing to resume on other bytes: restore the run directory, or start a new run",
                run_dir.display(),
                checkpoint.state.manifest_generation.map_or("?".into(), |g| g.to_string()),
                checkpoint.state.step,
                checkpoint.state.plugins,
                current
            );
        }
        Ok(Started { trainer, checkpoint: Some(checkpoint), run_dir: run_dir.to_path_buf(), config, model })
    }

    fn begin(&self, control: &Control, ranks: Arc<dyn Comm>, observer: &mut dyn Observer) -> anyhow::Result<Started> {
        let (mut config, text) = match &self.source {
            ConfigSource::File(path) => TrainConfig::load_with_text(path)?,
            _ => (TrainConfig::embedded_default()?, DEFAULT_TOML.into()),
        };
        self.apply_overrides(&mut config)?;
        let run_dir = match &self.run_dir {
            Some(dir) => dir.clone(),
            None => run_dir::default_run_dir()?,
        };
        let existed = run_dir.exists();
        run_dir::create(&run_dir, &text, &config)?;
        let started = models::resolve(Some(&config.model.path)).and_then(|model| {
            let trainer = Trainer::new(config.clone(), &model, &run_dir, None, control.clone(), observer, ranks)?;
            Ok((trainer, model))
        });
        match started {
            Ok((trainer, model)) => Ok(Started { trainer, checkpoint: None, run_dir, config, model }),
            Err(error) => {
                // Nothing trained: the directory must not refuse the corrected retry.
                run_dir::abandon(&run_dir, existed);
                Err(error)
            }
        }
    }

    /// `mpirun -n N wirl train --dp N …`: this process is one rank of `comm`. Rank 0 starts
    /// (or prepares the resume of) the run directory and loads first, reporting to
    /// `observer`; then the others read what it wrote — the run directory's path, its
    /// resolved config, its newest checkpoint — and load. The caller ends the job if this fails.
    #[cfg(feature = "mpi")]
    pub fn run_mpi_rank(
        &self,
        comm: Arc<wirl_engine::MpiComm>,
        control: &Control,
        observer: &mut dyn Observer,
    ) -> anyhow::Result<Trained> {
        let size = comm.size();
        if self.ranks != size {
            anyhow::bail!("mpirun started {size} processes but --dp is {}: pass --dp {size}", self.ranks);
        }
        self.refuse_beside_ranks()?;
        let ranks = ranks::over_mpi(comm.clone(), self.device()?)?;
        let rank0 = comm.rank() == 0;
        // Rank 0 first: the run directory and its start exist before the others read them.
        let started = if rank0 { Some(self.start(control, ranks.clone(), observer)) } else { None };
        let path = match &started {
            Some(Ok(started)) => started.run_dir.display().to_string(),
            // Rank 0 failed: it ends the job (the others are waiting here).
            Some(Err(_)) | None => String::new(),
        };
        let started = started.transpose()?;
        let paths = wirl_engine::all_gather_bytes(ranks.as_ref(), path.as_bytes())?;
        let run_dir = PathBuf::from(String::from_utf8_lossy(&paths[0]).into_owned());
        // Rank 0 answers `wirl ctl`, as a trainer alone does.
        let _answering = if rank0 { control_socket::serve(&run_dir, control.clone())? } else { None };
        let (mut trainer, checkpoint) = match started {
            Some(started) => (started.trainer, started.checkpoint),
            None => {
                // The config rank 0 resolved, with this rank's own overrides (the same
                // command line: a resume's `--steps`); any difference is refused at start.
                let mut config = run_dir::config(&run_dir)?;
                self.apply_overrides(&mut config)?;
                let checkpoint = match &self.source {
                    ConfigSource::Resume(_) => wirl_trainer::checkpoint::latest(&run_dir)?,
                    _ => None,
                };
                let model = models::resolve(Some(&config.model.path))?;
                let trainer =
                    Trainer::new(config, &model, &run_dir, checkpoint.as_ref(), control.clone(), observer, ranks)?;
                (trainer, checkpoint)
            }
        };
        let start = checkpoint.as_ref().map_or(0, |c| c.state.step);
        let outcome = trainer.train(start, checkpoint.as_ref(), observer)?;
        Ok(Trained { outcome, run_dir })
    }
}

/// A run started (or its resume prepared) by its first rank, as one trainer alone starts it.
struct Started {
    trainer: Trainer,
    checkpoint: Option<wirl_trainer::checkpoint::Checkpoint>,
    run_dir: PathBuf,
    config: TrainConfig,
    model: PathBuf,
}

/// Rank 0's outcome, unless another rank failed: a rank's own failure says more than the
/// others' "rank k left the group".
fn first_failure(
    outcome: Result<Outcome, wirl_trainer::Error>,
    followers: impl Iterator<Item = anyhow::Result<()>>,
) -> anyhow::Result<Outcome> {
    // Every rank joined before any is reported.
    let followers: Vec<_> = followers.collect();
    let failure = followers.into_iter().find_map(Result::err);
    match (outcome, failure) {
        (Err(error), Some(first)) if wirl_engine::error_chain(&error).contains("left the group") => Err(first),
        (Ok(_), Some(first)) => Err(first),
        (outcome, _) => Ok(outcome?),
    }
}

/// Whether Open MPI's `mpirun` started this process as one of several.
pub fn launched_by_mpirun() -> bool {
    std::env::var("OMPI_COMM_WORLD_SIZE").ok().and_then(|n| n.parse::<usize>().ok()).is_some_and(|n| n > 1)
}

/// `wirl eval`: what a held-out evaluation is run with.
#[derive(Clone, Debug, Default)]
pub struct EvalLaunch {
    /// A training config whose tasks and `[eval]` define the held-out set (None: the
    /// embedded default).
    pub config: Option<PathBuf>,
    /// The model to evaluate (None: the config's).
    pub model: Option<String>,
    /// A LoRA adapter merged into the model as it loads.
    pub adapter: Option<PathBuf>,
    pub tasks: Option<usize>,
    pub samples: Option<usize>,
    /// Where the per-task results go (None: under `runs/eval/`, named after the model).
    pub output: Option<PathBuf>,
    pub device: Option<String>,
}

/// Greedy pass rate (and pass@k) on the config's held-out tasks, for the base model or a
/// checkpoint; each task's progress to `observer`.
pub fn evaluate(launch: &EvalLaunch, observer: &mut dyn Observer) -> anyhow::Result<serde_json::Value> {
    let mut config = match &launch.config {
        Some(path) => TrainConfig::load(path)?,
        None => TrainConfig::embedded_default()?,
    };
    if let Some(model) = &launch.model {
        config.model.path = model.clone();
    }
    if let Some(tasks) = launch.tasks {
        config.eval.tasks = tasks;
    }
    if let Some(samples) = launch.samples {
        config.eval.samples = samples;
    }
    if let Some(device) = &launch.device {
        config.model.device = Some(device.clone());
    }
    config.check_numbers("the command line (--tasks, --samples, --device)")?;
    let model = models::resolve(Some(&config.model.path))?;
    // An adapter names the results as a checkpoint's model would (`RUN-step-N`).
    let named = launch.adapter.as_deref().unwrap_or(&model);
    let output = launch.output.clone().unwrap_or_else(|| default_eval_output(named));
    let adapter = launch.adapter.as_deref();
    Ok(wirl_trainer::eval::evaluate(&config.run_config()?, &model, adapter, &output, observer)?)
}

/// `runs/eval/NAME.jsonl`: a checkpoint's `RUN/checkpoints/step-N/model` is named
/// `RUN-step-N`, any other model by its file or directory name. Beside the runs, never
/// loose in the current folder.
fn default_eval_output(model: &Path) -> PathBuf {
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let step = model.parent().filter(|step| step.parent().and_then(name).as_deref() == Some("checkpoints"));
    let label = match step.and_then(|step| Some((name(step)?, name(step.parent()?.parent()?)?))) {
        Some((step, run)) => format!("{run}-{step}"),
        None => model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    };
    PathBuf::from("runs").join("eval").join(format!("{label}.jsonl"))
}
