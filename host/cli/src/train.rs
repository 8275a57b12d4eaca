//! `wirl train` and `wirl eval` on the terminal: arguments, `--check`, Ctrl-C, exit codes.
//! The run itself is started by `wirl_app::train`; its progress is drawn by `terminal`.

use crate::terminal::{EvalTerminal, Terminal};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use wirl_app::serve::ServeTraining;
use wirl_app::train::{ConfigSource, EvalLaunch, Overrides, TrainLaunch};
#[cfg(feature = "mpi")]
use wirl_engine::Comm;
use wirl_trainer::{Control, Outcome};

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

impl Args {
    fn launch(&self) -> TrainLaunch {
        let source = match (&self.resume, &self.config) {
            (Some(run_dir), _) => ConfigSource::Resume(run_dir.clone()),
            (None, Some(path)) => ConfigSource::File(path.clone()),
            (None, None) => ConfigSource::Default,
        };
        TrainLaunch {
            source,
            overrides: Overrides {
                model: self.model.clone(),
                device: self.device.clone(),
                steps: self.steps,
                eval_tasks: self.eval_tasks,
                set: self.set.clone(),
            },
            run_dir: self.run_dir.clone(),
            ranks: usize::from(self.dp),
            watch: self.watch,
            serve: self.serve.clone().map(|address| ServeTraining { address, api_key: self.api_key.clone() }),
        }
    }
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let launch = args.launch();
    if args.check {
        println!("{}", wirl_app::check::describe(&launch.origin(), &launch.config()?.run_config()?));
        return Ok(ExitCode::SUCCESS);
    }
    // A resume that would train nothing says so, before anything loads or is cut back.
    if let (Some(run_dir), Some(done)) = (&args.resume, launch.already_finished()?) {
        say!(
            "{}: finished: all {done} steps trained and the run summarized (summary.json); nothing to train. To \
             train further: wirl train --resume {} --steps N, with N more than {done}",
            run_dir.display(),
            run_dir.display()
        );
        return Ok(ExitCode::SUCCESS);
    }
    if wirl_app::train::launched_by_mpirun() {
        #[cfg(feature = "mpi")]
        return run_mpi(&launch);
        #[cfg(not(feature = "mpi"))]
        anyhow::bail!(
            "mpirun started this wirl as one of several processes, but it was built without MPI: build it with \
             `cargo build --release -p wirl-cli --features mpi` (Open MPI's libopenmpi-dev installed)"
        );
    }
    let control = Control::new();
    forward_interrupts(control.clone());
    let trained = launch.run(&control, &mut Terminal)?;
    Ok(report(trained.outcome, &trained.run_dir))
}

/// What a run's end says on the terminal, and its exit code.
fn report(outcome: Outcome, run_dir: &Path) -> ExitCode {
    match outcome {
        Outcome::Finished(summary) => {
            if let (Some(b), Some(a)) = (summary.held_out_pass_rate_before, summary.held_out_pass_rate_after) {
                say!("held-out greedy pass rate: {b:.3} before, {a:.3} after");
            }
            say!("run written to {}", run_dir.display());
            ExitCode::SUCCESS
        }
        Outcome::Stopped { steps_done, abandoned } => {
            let when =
                if abandoned { format!("during step {}", steps_done + 1) } else { format!("after step {steps_done}") };
            say!("interrupted {when}: resume with `wirl train --resume {}`", run_dir.display());
            ExitCode::from(130)
        }
    }
}

/// `mpirun -n N wirl train --dp N …`: this process is one rank; rank 0 reports on the
/// terminal. A rank that fails ends the whole job (`MPI_Abort`), naming itself, rather than
/// leaving the others waiting in a collective.
#[cfg(feature = "mpi")]
fn run_mpi(launch: &TrainLaunch) -> anyhow::Result<ExitCode> {
    let comm = std::sync::Arc::new(wirl_engine::MpiComm::world()?);
    let rank = comm.rank();
    let control = Control::new();
    forward_interrupts(control.clone());
    let mut terminal = Terminal;
    let mut quiet = wirl_trainer::Quiet;
    let observer: &mut dyn wirl_trainer::Observer = if rank == 0 { &mut terminal } else { &mut quiet };
    let result = launch.run_mpi_rank(comm.clone(), &control, observer);
    drop(comm);
    match result {
        Ok(trained) if rank > 0 => {
            wirl_engine::MpiComm::finalize();
            Ok(match trained.outcome {
                Outcome::Finished(_) => ExitCode::SUCCESS,
                Outcome::Stopped { .. } => ExitCode::from(130),
            })
        }
        Ok(trained) => {
            wirl_engine::MpiComm::finalize();
            Ok(report(trained.outcome, &trained.run_dir))
        }
        Err(error) => {
            say!("error: rank {rank}: {error:#}");
            wirl_engine::MpiComm::abort(1)
        }
    }
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

/// `wirl eval`: greedy pass rate on the config's held-out tasks (indices from
/// `eval.first_index`, disjoint from training's), for the base model or a checkpoint.
pub fn eval(args: EvalArgs) -> anyhow::Result<ExitCode> {
    let EvalArgs { config, model, adapter, tasks, samples, output, device } = args;
    let launch = EvalLaunch { config, model, adapter, tasks, samples, output, device };
    let summary = wirl_app::train::evaluate(&launch, &mut EvalTerminal::new())?;
    println!("{summary}");
    Ok(ExitCode::SUCCESS)
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
