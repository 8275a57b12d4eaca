//! `wirl train` and `wirl eval` on the terminal: arguments, the embedded default, Ctrl-C,
//! the status line and a line per step, exit codes. The loop itself is `wirl-trainer`'s.

use crate::model;
use anyhow::Context;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use wirl_engine::Comm;
use wirl_trainer::config::DEFAULT_TOML;
use wirl_trainer::config::DeviceSpec;
use wirl_trainer::{Control, Event, Observer, Outcome, Phase, TrainConfig, Trainer, run_dir};

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
    /// Override `model.path`: a GGUF file, an HF directory or the default model's name.
    #[arg(long, conflicts_with = "resume")]
    model: Option<String>,
    /// Override `model.device`: `cpu`, `cuda` or `cuda:N` (a build made by scripts/build-cuda).
    #[arg(long)]
    device: Option<String>,
    /// Watch the plugin files of the run's tasks: when one changes on disk (rebuilt), apply
    /// the task set again with its new bytes (checked, then switched in between steps).
    #[arg(long)]
    watch: bool,
    /// Serve the policy while it trains (OpenAI-compatible, on its live weights), the run's
    /// control (`/control/status`, `apply`, `pause`, `resume`, `rollback`, `stop`) and
    /// `/metrics`, at HOST:PORT (loopback; another address needs --api-key or WIRL_API_KEY).
    #[arg(long, value_name = "HOST:PORT")]
    serve: Option<String>,
    /// The key `--serve` requires as `Authorization: Bearer KEY`.
    #[arg(long, requires = "serve")]
    api_key: Option<String>,
    /// Set any key of the config: `--set grpo.group_size=4 --set sampling.max_tokens=16`
    /// (`tasks.1.weight=0` for a task; VALUE is TOML, a bare word a string).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Data-parallel ranks, as threads of this process: each loads the model and rolls its
    /// share of every step's groups; their gradients are summed and every rank takes the
    /// same optimizer step; rank 0 writes the run (1: one trainer).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    dp: u16,
    /// Validate the config (with its overrides) and print what the run would take — the
    /// lowered objective, the tasks, the scale — then exit, loading no model or plugin.
    #[arg(long)]
    check: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if args.check {
        let origin = match (&args.resume, &args.config) {
            (Some(run_dir), _) => format!("{} (the run's config)", run_dir.display()),
            (None, Some(path)) => path.display().to_string(),
            (None, None) => "the embedded default".to_string(),
        };
        let config = wanted_config(&args)?.run_config()?;
        println!("{}", crate::check::describe(&origin, &config));
        return Ok(ExitCode::SUCCESS);
    }
    // A resume that would train nothing says so, before anything loads or is cut back.
    if let Some(run_dir) = &args.resume
        && let Some(done) = run_dir::finished(run_dir, wanted_config(&args)?.grpo.steps)?
    {
        eprintln!(
            "{}: finished: all {done} steps trained and the run summarized (summary.json); nothing to train. To \
             train further: wirl train --resume {} --steps N, with N more than {done}",
            run_dir.display(),
            run_dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if launched_by_mpirun() {
        #[cfg(feature = "mpi")]
        return run_mpi(args);
        #[cfg(not(feature = "mpi"))]
        anyhow::bail!(
            "mpirun started this wirl as one of several processes, but it was built without MPI: build it with \
             `cargo build --release -p wirl-cli --features mpi` (Open MPI's libopenmpi-dev installed)"
        );
    }
    let control = Control::new();
    forward_interrupts(control.clone());
    let mut terminal = Terminal;
    let dp = usize::from(args.dp);
    if dp > 1 && (args.serve.is_some() || args.watch) {
        anyhow::bail!("--dp {dp}: --serve and --watch are not supported with several ranks yet");
    }
    let device = if dp > 1 { wanted_device(&args)? } else { DeviceSpec::Cpu };
    if dp > 1 && matches!(device, DeviceSpec::Cpu) {
        // Before any rank loads: copies of the model the machine cannot hold are refused.
        crate::ranks::check_copies_fit(&wanted_model(&args)?, dp, "--dp")?;
    }
    let mut comms = crate::ranks::threads(dp, device)?;
    let rank0 = comms.remove(0);
    let Started { mut trainer, checkpoint, run_dir, config, model } = start(&args, &control, rank0, &mut terminal)?;
    let _served = crate::ctl::serve(&run_dir, control.clone())?;
    let _serving = match &args.serve {
        Some(address) => Some(crate::serve::serve_training(address, args.api_key.clone(), &trainer, control.clone())?),
        None => None,
    };
    if args.watch {
        watch_plugins(control.clone());
    }
    let start = checkpoint.as_ref().map_or(0, |c| c.state.step);
    // The other ranks, each a thread that loads its own trainer (after rank 0 wrote the
    // run's start) and trains in step with rank 0; they write nothing.
    let outcome = std::thread::scope(|scope| {
        let followers: Vec<_> = comms
            .into_iter()
            .enumerate()
            .map(|(i, comm)| {
                let (config, model, run_dir, control, checkpoint) =
                    (config.clone(), model.clone(), run_dir.clone(), control.clone(), checkpoint.clone());
                scope.spawn(move || -> anyhow::Result<()> {
                    let mut quiet = wirl_trainer::Quiet;
                    let mut trainer =
                        Trainer::new(config, &model, &run_dir, checkpoint.as_ref(), control, &mut quiet, comm)
                            .with_context(|| format!("rank {}", i + 1))?;
                    trainer.train(start, checkpoint.as_ref(), &mut quiet).with_context(|| format!("rank {}", i + 1))?;
                    Ok(())
                })
            })
            .collect();
        let outcome = trainer.train(start, checkpoint.as_ref(), &mut terminal);
        // A rank's own failure says more than the others' "rank k left the group".
        let mut failure = None;
        for follower in followers {
            let result = follower.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
            if let Err(error) = result
                && failure.is_none()
            {
                failure = Some(error);
            }
        }
        match (outcome, failure) {
            (Err(error), Some(first)) if wirl_engine::error_chain(&error).contains("left the group") => Err(first),
            (Ok(_), Some(first)) => Err(first),
            (outcome, _) => Ok(outcome?),
        }
    });
    Ok(report(outcome?, &run_dir))
}

/// A run started (or its resume prepared) by its first rank, as one trainer alone starts it.
struct Started {
    trainer: Trainer,
    checkpoint: Option<wirl_trainer::checkpoint::Checkpoint>,
    run_dir: PathBuf,
    config: TrainConfig,
    model: PathBuf,
}

/// Rank 0's start (or a trainer alone's): a resume's config and checkpoint, refusing
/// plugins other than the checkpoint's; or a new run directory, removed again if loading
/// fails. `ranks`: the data-parallel group this trainer is rank 0 of.
fn start(args: &Args, control: &Control, ranks: Arc<dyn Comm>, observer: &mut dyn Observer) -> anyhow::Result<Started> {
    Ok(match &args.resume {
        Some(run_dir) => {
            let mut config = run_dir::config(run_dir)?;
            apply_overrides(&mut config, args)?;
            let checkpoint = run_dir::prepare_resume(run_dir)?;
            observer.event(Event::Resuming { run_dir, step: checkpoint.state.step });
            let model = model::resolve(Some(&config.model.path))?;
            let trainer =
                Trainer::new(config.clone(), &model, run_dir, Some(&checkpoint), control.clone(), observer, ranks)?;
            let current = trainer.plugin_hashes();
            if current != checkpoint.state.plugins && checkpoint.state.manifest_generation.is_none() {
                tracing::warn!("the plugins changed since the checkpoint (by sha256): {current:?}");
            } else if current != checkpoint.state.plugins {
                // The manifest in force names other bytes than those the checkpoint was
                // trained with: the manifests were rewritten after it.
                anyhow::bail!(
                    "{}: the plugins of manifest generation {} are not those its checkpoint of step {} was trained \
                     with (by sha256: checkpoint {:?}, manifest {:?}); the run directory's manifests changed after \
                     the checkpoint. Refusing to resume on other bytes: restore the run directory, or start a new run",
                    run_dir.display(),
                    checkpoint.state.manifest_generation.map_or("?".into(), |g| g.to_string()),
                    checkpoint.state.step,
                    checkpoint.state.plugins,
                    current
                );
            }
            Started { trainer, checkpoint: Some(checkpoint), run_dir: run_dir.clone(), config, model }
        }
        None => {
            let (mut config, text) = match &args.config {
                Some(path) => TrainConfig::load_with_text(path)?,
                None => (TrainConfig::embedded_default()?, DEFAULT_TOML.into()),
            };
            apply_overrides(&mut config, args)?;
            let run_dir = match &args.run_dir {
                Some(dir) => dir.clone(),
                None => run_dir::default_run_dir()?,
            };
            let existed = run_dir.exists();
            run_dir::create(&run_dir, &text, &config)?;
            let started = model::resolve(Some(&config.model.path)).and_then(|model| {
                let trainer = Trainer::new(config.clone(), &model, &run_dir, None, control.clone(), observer, ranks)?;
                Ok((trainer, model))
            });
            let (trainer, model) = match started {
                Ok(started) => started,
                Err(error) => {
                    // Nothing trained: the directory must not refuse the corrected retry.
                    run_dir::abandon(&run_dir, existed);
                    return Err(error);
                }
            };
            Started { trainer, checkpoint: None, run_dir, config, model }
        }
    })
}

/// What a run's end says on the terminal, and its exit code.
fn report(outcome: Outcome, run_dir: &Path) -> ExitCode {
    match outcome {
        Outcome::Finished(summary) => {
            if let (Some(b), Some(a)) = (summary.held_out_pass_rate_before, summary.held_out_pass_rate_after) {
                eprintln!("held-out greedy pass rate: {b:.3} before, {a:.3} after");
            }
            eprintln!("run written to {}", run_dir.display());
            ExitCode::SUCCESS
        }
        Outcome::Stopped { steps_done, abandoned } => {
            let when =
                if abandoned { format!("during step {}", steps_done + 1) } else { format!("after step {steps_done}") };
            eprintln!("interrupted {when}: resume with `wirl train --resume {}`", run_dir.display());
            ExitCode::from(130)
        }
    }
}

/// Whether Open MPI's `mpirun` started this process as one of several.
fn launched_by_mpirun() -> bool {
    std::env::var("OMPI_COMM_WORLD_SIZE").ok().and_then(|n| n.parse::<usize>().ok()).is_some_and(|n| n > 1)
}

/// `mpirun -n N wirl train --dp N …`: this process is one rank. Rank 0 starts (or prepares
/// the resume of) the run directory and loads first; then the others read what it wrote —
/// the run directory's path, its resolved config, its newest checkpoint — and load. A rank
/// that fails ends the whole job (`MPI_Abort`), naming itself, rather than leaving the
/// others waiting in a collective.
#[cfg(feature = "mpi")]
fn run_mpi(args: Args) -> anyhow::Result<ExitCode> {
    let comm = Arc::new(wirl_engine::MpiComm::world()?);
    let rank = comm.rank();
    let result = run_mpi_rank(&args, comm.clone());
    drop(comm);
    match result {
        Ok(code) => {
            wirl_engine::MpiComm::finalize();
            Ok(code)
        }
        Err(error) => {
            eprintln!("error: rank {rank}: {error:#}");
            wirl_engine::MpiComm::abort(1)
        }
    }
}

#[cfg(feature = "mpi")]
fn run_mpi_rank(args: &Args, comm: Arc<wirl_engine::MpiComm>) -> anyhow::Result<ExitCode> {
    let (rank, size) = (comm.rank(), comm.size());
    let dp = usize::from(args.dp);
    if dp != size {
        anyhow::bail!("mpirun started {size} processes but --dp is {dp}: pass --dp {size}");
    }
    if args.serve.is_some() || args.watch {
        anyhow::bail!("--dp {dp}: --serve and --watch are not supported with several ranks yet");
    }
    let control = Control::new();
    forward_interrupts(control.clone());
    let ranks = crate::ranks::over_mpi(comm.clone(), wanted_device(args)?)?;
    let mut terminal = Terminal;
    let mut quiet = wirl_trainer::Quiet;
    let observer: &mut dyn Observer = if rank == 0 { &mut terminal } else { &mut quiet };
    // Rank 0 first: the run directory and its start exist before the others read them.
    let started = if rank == 0 { Some(start(args, &control, ranks.clone(), observer)) } else { None };
    let path = match &started {
        Some(Ok(started)) => started.run_dir.display().to_string(),
        // Rank 0 failed: it aborts the job (the others are waiting here).
        Some(Err(_)) | None => String::new(),
    };
    let started = started.transpose()?;
    let paths = wirl_engine::all_gather_bytes(ranks.as_ref(), path.as_bytes())?;
    let run_dir = PathBuf::from(String::from_utf8_lossy(&paths[0]).into_owned());
    // Rank 0 answers `wirl ctl`, as a trainer alone does.
    let _served = if rank == 0 { Some(crate::ctl::serve(&run_dir, control.clone())?) } else { None };
    let (mut trainer, checkpoint) = match started {
        Some(started) => (started.trainer, started.checkpoint),
        None => {
            // The config rank 0 resolved, with this rank's own overrides (the same
            // command line: a resume's `--steps`); any difference is refused at start.
            let mut config = run_dir::config(&run_dir)?;
            apply_overrides(&mut config, args)?;
            let checkpoint = match &args.resume {
                Some(_) => wirl_trainer::checkpoint::latest(&run_dir)?,
                None => None,
            };
            let model = model::resolve(Some(&config.model.path))?;
            let trainer = Trainer::new(config, &model, &run_dir, checkpoint.as_ref(), control, observer, ranks)?;
            (trainer, checkpoint)
        }
    };
    let start = checkpoint.as_ref().map_or(0, |c| c.state.step);
    let outcome = trainer.train(start, checkpoint.as_ref(), observer)?;
    if rank > 0 {
        return Ok(match outcome {
            Outcome::Finished(_) => ExitCode::SUCCESS,
            Outcome::Stopped { .. } => ExitCode::from(130),
        });
    }
    Ok(report(outcome, &run_dir))
}

#[derive(clap::Args)]
pub struct EvalArgs {
    /// A training config (TOML) whose environment, rewards and `[eval]` section define the
    /// held-out set; without one, the embedded default.
    config: Option<PathBuf>,
    /// The model to evaluate: a checkpoint's `model/` directory, any GGUF file or HF
    /// directory (default: the config's model).
    #[arg(long)]
    model: Option<String>,
    /// A LoRA adapter directory (PEFT's format; a LoRA run's `checkpoints/step-N/adapter`)
    /// merged into the model as it loads: evaluates base + adapter without `wirl model merge`.
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Override `eval.tasks`.
    #[arg(long)]
    tasks: Option<usize>,
    /// Override `eval.samples` (completions per task for pass@k; 0: greedy only).
    #[arg(long)]
    samples: Option<usize>,
    /// Where the per-task results go, one JSON line per task (default: under `runs/eval/`,
    /// named after the model or the run and step of a checkpoint).
    #[arg(long, value_name = "FILE")]
    output: Option<PathBuf>,
    /// Override `model.device`: `cpu`, `cuda` or `cuda:N` (a build made by scripts/build-cuda).
    #[arg(long)]
    device: Option<String>,
}

/// `runs/eval/NAME.jsonl`: a checkpoint's `RUN/checkpoints/step-N/model` is named
/// `RUN-step-N`, any other model by its file or directory name. Beside the runs, never
/// loose in the current folder.
fn default_eval_output(model: &std::path::Path) -> PathBuf {
    let name = |p: &std::path::Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let step = model.parent().filter(|step| step.parent().and_then(name).as_deref() == Some("checkpoints"));
    let label = match step.and_then(|step| Some((name(step)?, name(step.parent()?.parent()?)?))) {
        Some((step, run)) => format!("{run}-{step}"),
        None => model.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    };
    PathBuf::from("runs").join("eval").join(format!("{label}.jsonl"))
}

/// `wirl eval`: greedy pass rate on the config's held-out tasks (indices from
/// `eval.first_index`, disjoint from training's), for the base model or a checkpoint.
pub fn eval(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let mut config = match &args.config {
        Some(path) => TrainConfig::load(path)?,
        None => TrainConfig::embedded_default()?,
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
    if let Some(device) = &args.device {
        config.model.device = Some(device.clone());
    }
    config.check_numbers("the command line (--tasks, --samples, --device)")?;
    let model = model::resolve(Some(&config.model.path))?;
    // An adapter names the results as a checkpoint's model would (`RUN-step-N`).
    let output = args.output.clone().unwrap_or_else(|| default_eval_output(args.adapter.as_deref().unwrap_or(&model)));
    let started = std::time::Instant::now();
    let adapter = args.adapter.as_deref();
    let summary =
        wirl_trainer::eval::evaluate(&config.run_config()?, &model, adapter, &output, &mut EvalTerminal { started })?;
    println!("{summary}");
    Ok(ExitCode::SUCCESS)
}

/// The device a run's ranks compute on, as its config with the command line's overrides
/// says: read before any rank loads, since CUDA ranks are joined (one GPU each) first.
fn wanted_config(args: &Args) -> anyhow::Result<TrainConfig> {
    let mut config = match (&args.resume, &args.config) {
        (Some(run_dir), _) => run_dir::config(run_dir)?,
        (None, Some(path)) => TrainConfig::load(path)?,
        (None, None) => TrainConfig::embedded_default()?,
    };
    apply_overrides(&mut config, args)?;
    Ok(config)
}

fn wanted_device(args: &Args) -> anyhow::Result<DeviceSpec> {
    Ok(wanted_config(args)?.model.device.as_deref().and_then(DeviceSpec::parse).unwrap_or_default())
}

/// The model the run would load (the default one fetched if it is not cached yet).
fn wanted_model(args: &Args) -> anyhow::Result<std::path::PathBuf> {
    crate::model::resolve(Some(wanted_config(args)?.model.path.as_str()))
}

fn apply_overrides(config: &mut TrainConfig, args: &Args) -> anyhow::Result<()> {
    if let Some(model) = &args.model {
        config.model.path = model.clone();
    }
    if let Some(device) = &args.device {
        config.model.device = Some(device.clone());
    }
    if let Some(steps) = args.steps {
        config.grpo.steps = steps;
    }
    if let Some(tasks) = args.eval_tasks {
        config.eval.tasks = tasks;
    }
    config.set_all(&args.set)?;
    Ok(config.check_numbers("the command line (--steps, --eval-tasks, --device, --set)")?)
}

/// Set by SIGINT.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// Turn SIGINT into `control.stop()`: plugin calls end within milliseconds (a plugin or
/// model code that sleeps does not hold the run), generation is given up, and the step in
/// progress is abandoned or finished; the trainer checkpoints and returns.
fn forward_interrupts(control: Control) {
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t);
    }
    let spawned = std::thread::Builder::new().name("wirl-sigint".into()).spawn(move || {
        while !INTERRUPTED.load(std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        control.stop();
    });
    if let Err(error) = spawned {
        tracing::warn!("Ctrl-C will wait for plugin calls to end: cannot start its thread ({error})");
    }
}

/// `--watch`: every second, compare each plugin file of the manifest in force with the
/// bytes the run keeps; a file that changed (and has not changed again for a second) makes
/// an apply of the same task set, which reads the new bytes. Each new content is tried once.
fn watch_plugins(control: Control) {
    let spawned = std::thread::Builder::new().name("wirl-watch".into()).spawn(move || {
        let mut tried: std::collections::BTreeMap<String, String> = Default::default();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            if control.is_stopped() {
                return;
            }
            let Ok(status) = control.status() else { continue };
            let Some(manifest) = status.manifest else { continue };
            let mut changed = Vec::new();
            for (reference, sha256) in &manifest.plugins {
                let path = Path::new(reference);
                if wirl_builtins::is_builtin(path) {
                    continue;
                }
                let settled = std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs_f64() >= 1.0));
                // Read as the apply reads it: a FIFO or a device put in a plugin's place is
                // not read (it would block this thread or never end); it counts as a change,
                // so the apply it makes is refused naming the file.
                let now = match wirl_trainer::manifest::PluginStore::read(path) {
                    Ok(bytes) => sha256_hex(&bytes),
                    Err(error) => format!("unreadable: {error}"),
                };
                if settled && &now != sha256 && tried.get(reference) != Some(&now) {
                    tried.insert(reference.clone(), now);
                    changed.push(reference.clone());
                }
            }
            if changed.is_empty() {
                continue;
            }
            let options = wirl_trainer::ApplyOptions {
                origin: format!("--watch ({} changed)", changed.join(", ")),
                reason: "watch".into(),
                ..Default::default()
            };
            match control.apply(manifest.tasks.clone(), &options) {
                Ok(report) => eprintln!(
                    "watch: {} changed: staged as generation {} (checks failed {:.1}%), switched in at the next step",
                    changed.join(", "),
                    report.generation,
                    report.failure_rate * 100.0
                ),
                Err(refusal) => eprintln!("watch: refused: {}", refusal.message),
            }
        }
    });
    if let Err(error) = spawned {
        tracing::warn!("--watch: cannot start its thread ({error})");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// `wirl train` on stderr: a line per step and, on a terminal, a status line saying what
/// the step is doing now.
struct Terminal;

impl Observer for Terminal {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Loading { path } => eprintln!("loading {}", path.display()),
            Event::Resuming { run_dir, step } => eprintln!("resuming {} from step {step}", run_dir.display()),
            Event::Phase { step, steps, phase } => status(&match phase {
                Phase::Generating { prompts, group_size } => {
                    format!("step {step}/{steps}: generating {prompts} x {group_size}")
                }
                Phase::Agent { task } => format!("step {step}/{steps}: agent of task {}", task + 1),
                Phase::Episodes { groups } => format!("step {step}/{steps}: episodes of {groups} groups"),
                Phase::Scoring => format!("step {step}/{steps}: scoring"),
                Phase::Training { group, groups } => {
                    format!("step {step}/{steps}: training on group {}/{groups}", group + 1)
                }
            }),
            Event::Step { metrics: m, steps, eta_s } => {
                status("");
                // Under `grpo.kl_in_reward` the loss has no KL term: the KL shown is the
                // rewards', with the β they were shaped with.
                let kl = match (m.reward_kl, m.kl_coef) {
                    (Some(kl), Some(beta)) => format!("kl(reward) {kl:.5} β {beta:.4}"),
                    _ => format!("kl {:.5}", m.kl),
                };
                // Under `[distill]`: the student's reverse KL to its teacher.
                let kl = match m.distill_kl {
                    Some(teacher) => format!("{kl}  kl(teacher) {teacher:.4}"),
                    None => kl,
                };
                // Under dynamic sampling a step that drew again generated that many times the
                // groups: say so, and how many of them trained.
                let draws = match m.draws {
                    1 => String::new(),
                    draws => format!("  draws {draws} (kept {})", m.groups_kept),
                };
                // A step whose every reward call failed has no reward to show: `reward 0.000`
                // would read as a model that scored nothing.
                let figures = if m.trajectories_scored == 0 {
                    "no scored trajectory".to_string()
                } else {
                    format!("reward {:.3}  pass {:.3}", m.reward_mean, m.pass_rate)
                };
                // LLM judges' calls to the engine: their wait, its share of the step, their tokens.
                let judge = match m.judge_calls {
                    0 => String::new(),
                    calls => format!(
                        " (judge {:.2}s, {:.0}% of the step, {calls} calls, {} tokens)",
                        m.time_s.judge,
                        100.0 * m.time_s.judge / m.time_s.total.max(1e-9),
                        m.judge_tokens
                    ),
                };
                eprintln!(
                    "step {:>3}/{steps}  {figures}  loss {:+.4}  {kl}  len {:.1}{draws}  | gen {:.1}s score {:.2}s{judge} train {:.1}s | ETA {eta_s:.0}s",
                    m.step, m.loss, m.completion_tokens_mean, m.time_s.generate, m.time_s.score, m.time_s.train,
                );
                if m.trajectories_scored == 0 {
                    let failures: Vec<String> = m.failures.iter().map(|(kind, n)| format!("{n} {kind}")).collect();
                    eprintln!(
                        "          no update: every completion's reward call failed ({}); the step trained nothing \
                         (metrics.jsonl's `failures`, and the plugin's messages above, say why)",
                        failures.join(", ")
                    );
                } else if m.groups_kept == 0 {
                    // A loss and KL of zero read as a bug without this: nothing was trained.
                    eprintln!(
                        "          no update: every group's samples scored alike (no signal to learn from), so this \
                         step trained nothing"
                    );
                }
            }
            Event::HeldOut { after: false, pass_rate, problems } => {
                eprintln!("held-out greedy pass rate before training: {pass_rate:.3} ({problems} tasks)")
            }
            Event::HeldOut { after: true, .. } => {}
            Event::Checkpoint { dir } => {
                status("");
                eprintln!("checkpoint {}", dir.display())
            }
            Event::Swap { step, kind, generation, changes, reason, switch_ms } => {
                status("");
                let reason = reason.map_or(String::new(), |r| format!(" ({r})"));
                eprintln!(
                    "after step {step}: task set {kind}: generation {generation}{reason}, switch {switch_ms:.2} ms"
                );
                for change in changes {
                    eprintln!("  {change}");
                }
            }
            Event::EvalTask { .. } => {}
        }
    }
}

/// `wirl eval` on stderr: a line per task.
struct EvalTerminal {
    started: std::time::Instant,
}

impl Observer for EvalTerminal {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Loading { path } => eprintln!("loading {}", path.display()),
            Event::EvalTask { done, total, task, greedy_passed, samples } => {
                let samples = samples.map_or(String::new(), |(c, n)| format!(", samples {c}/{n}"));
                eprintln!(
                    "[{done}/{total}] {task}: greedy {}{samples}  ({:.0} s)",
                    if greedy_passed { "pass" } else { "fail" },
                    self.started.elapsed().as_secs_f64()
                );
            }
            _ => {}
        }
    }
}

/// A transient status line on a terminal (what the step is doing now), cleared by `""`.
fn status(text: &str) {
    if std::io::stderr().is_terminal() {
        eprint!("\r\x1b[2K{text}");
    }
}
