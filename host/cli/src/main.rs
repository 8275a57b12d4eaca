//! The `wirl` command.

/// Writes one line to stderr in one `write`. Under `mpirun` the ranks share one terminal,
/// and `eprintln!` writes a line in pieces (each literal and argument on its own), so one
/// rank's line could be split by another's: CI once read "error: rank " and then rank 0's
/// warning before "1: mpirun started …". (`clippy.toml` refuses `eprintln!` in this crate.)
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut line = format!($($arg)*);
        line.push('\n');
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }};
}

mod ctl;
mod generate;
mod inspect;
mod model;
mod plot;
mod sandbox;
mod scaffold;
mod score;
mod serve;
mod tasks;
mod terminal;
mod train;

use clap::{Parser, Subcommand};

/// The system allocator, counting what the threads that run a model's chat template hold:
/// a template that would take more than its budget stops there instead of taking the
/// machine's memory (`wirl_engine::memory_budget`).
#[global_allocator]
static ALLOCATOR: wirl_engine::memory_budget::BudgetAllocator = wirl_engine::memory_budget::BudgetAllocator;
use std::process::ExitCode;

/// The tunable that makes glibc's allocator ask for transparent huge pages for its heap.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const HUGE_PAGE_TUNABLE: &str = "glibc.malloc.hugetlb=1";

/// The tunables that keep the allocator's memory in one heap it does not give back: one
/// arena for every thread (a tensor freed by one thread is reused by the next that asks),
/// no separate mapping for large blocks (glibc maps each block over 32 MiB on its own and
/// unmaps it when freed, so the next step's tensors were fresh, zeroed pages again), no
/// trimming of the heap's free top. A process keeps the memory of its peak until it ends.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const ONE_HEAP_TUNABLES: &str =
    "glibc.malloc.arena_max=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=1099511627776";

/// Run this process again with glibc's allocator tuned for training (tunables are read
/// only when a process starts): the heap kept whole ([`ONE_HEAP_TUNABLES`]) and, where the
/// kernel gives them on request, backed by transparent huge pages (`glibc.malloc.hugetlb`).
/// Training allocates and frees gigabytes of tensors a step; each first touch of a page is
/// a fault (~8 µs on a virtual machine: 2.5 M faults and 16 s of system time in four steps
/// of the default job), with 2 MiB pages 512 times fewer, with a heap kept whole almost
/// none after the first step (docs/BENCHMARKS.md). Nothing changes where `GLIBC_TUNABLES`
/// is already set (the user's tunables win; an empty value opts out) or where the exec
/// fails (the process goes on as it is). Called first in `main`, while there is one
/// thread; the process keeps its id, arguments and the rest of its environment.
fn start_with_allocator_tunables() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt;
        if std::env::var_os("GLIBC_TUNABLES").is_some() {
            return;
        }
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        let huge_pages = !thp.is_empty() && !thp.contains("[never]");
        let tunables =
            if huge_pages { format!("{ONE_HEAP_TUNABLES}:{HUGE_PAGE_TUNABLE}") } else { ONE_HEAP_TUNABLES.to_string() };
        let Ok(exe) = std::env::current_exe() else { return };
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_else(|| exe.clone().into_os_string());
        // Returns only when the exec failed; then this process goes on unchanged.
        let _ = std::process::Command::new(&exe).arg0(arg0).args(args).env("GLIBC_TUNABLES", tunables).exec();
    }
}

#[derive(Parser)]
#[command(
    name = "wirl",
    version,
    long_version = LONG_VERSION,
    about = "Reinforcement-learning post-training with sandboxed WebAssembly plugins"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model with GRPO: the embedded default, or a config file.
    Train(train::Args),
    /// A model or checkpoint on a config's held-out tasks: greedy pass rate, pass@k with
    /// `eval.samples`, per-task results as JSONL.
    Eval(train::EvalArgs),
    /// PNG charts of a training run (reward, KL, loss, lengths, time split).
    Plot(plot::Args),
    /// Score completions with a reward plugin: JSONL in, JSONL out, a summary on stderr.
    Score(score::Args),
    /// Print tasks of an environment plugin as JSONL.
    Tasks(tasks::Args),
    /// Work with plugin files.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Sample from a model, streaming the text.
    Generate(generate::Args),
    /// Work with models.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Serve a model over HTTP: OpenAI-compatible inference with exact token ids.
    Serve(Box<serve::Args>),
    /// Run model-written code for trainers over HTTP: SandboxFusion's /run_code.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
    /// Control a running training: status, apply a new task set (hot swap), rollback,
    /// pause, resume, stop.
    Ctl(ctl::Args),
    /// Print a shell's completion script for wirl (bash, zsh, fish, elvish, powershell).
    Completions { shell: clap_complete::Shell },
    /// A code worker: runs model-written programs for the process that started it (JSON
    /// lines on stdin and stdout). Started by wirl itself, never by hand.
    #[command(hide = true)]
    CodeWorker,
}

/// `wirl --version`: the version, the WIT package versions wirl hosts (plugins built against
/// others are refused) and the engine's devices in this build.
const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\nwit: wirl:rl@",
    // wirl_sandbox::WIT_VERSIONS, spelled out because `concat!` takes literals; a test checks
    // the two agree.
    "0.1.0 wirl:rl@0.2.0",
    "\nfeatures: cpu",
    cuda_feature!(),
    mpi_feature!(),
);

#[cfg(feature = "cuda")]
macro_rules! cuda_feature {
    () => {
        ", cuda"
    };
}
#[cfg(not(feature = "cuda"))]
macro_rules! cuda_feature {
    () => {
        ""
    };
}
use cuda_feature;

#[cfg(feature = "mpi")]
macro_rules! mpi_feature {
    () => {
        ", mpi"
    };
}
#[cfg(not(feature = "mpi"))]
macro_rules! mpi_feature {
    () => {
        ""
    };
}
use mpi_feature;

#[derive(Subcommand)]
enum ModelCommand {
    /// Put the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) in the cache.
    Fetch(model::FetchArgs),
    /// Write a GGUF model as a Hugging Face directory (f32 safetensors, tokenizer, chat
    /// template) that transformers and wirl load.
    Export(model::ExportArgs),
    /// What a model is (family, shapes, parameters, training memory) and whether wirl runs
    /// it, from its config alone.
    Inspect(model::InspectArgs),
    /// Merge a LoRA adapter (PEFT's format, as LoRA runs checkpoint it) into its base model
    /// and write a plain Hugging Face directory.
    Merge(model::MergeArgs),
    /// Does a device train as the CPU does: one fixed batch's loss and gradients on the CPU
    /// and on `--device` (the device-generic step), compared; JSON out, exit 1 past the
    /// tolerance. On `cpu` it compares the CPU's composed ops with its hand-written ones.
    CheckDevice(model::CheckDeviceArgs),
}

#[derive(Subcommand)]
enum PluginCommand {
    /// Show a plugin's world, WIT version, sha256, imports and size.
    Inspect(inspect::Args),
    /// Start a reward plugin in Rust, Python, JavaScript or C that builds and scores as is.
    New(scaffold::Args),
    /// The plugins built into wirl (`builtin:NAME` in a config or after --plugin): world,
    /// WIT version, sha256.
    List(inspect::ListArgs),
}

fn main() -> ExitCode {
    start_with_allocator_tunables();
    wirl_engine::pin_thread_count();
    start_logging();
    let cli = Cli::parse();
    // The application layer's notices (a model fetched, a plugin compiling, a watched plugin
    // applied) are lines on stderr.
    wirl_app::notices::install(|line| say!("{line}"));
    if let Err(error) = wirl_engine::invariant::check_kernels_variable() {
        say!("error: {error}");
        return ExitCode::from(2);
    }
    // Code runners with `workers` start children of this binary (`wirl code-worker`).
    if let Ok(exe) = std::env::current_exe() {
        wirl_sandbox::register_worker_command(exe, &["code-worker"]);
    }
    if !matches!(cli.command, Command::Train(_) | Command::Eval(_) | Command::Serve(_)) {
        // A reader that goes away (`wirl plugin inspect … | head`) ends the command quietly,
        // as with any Unix tool. Training keeps SIGPIPE ignored: a closed log pipe must not
        // kill a run before its checkpoint. So does the server: a write to a client that
        // reset its connection raised SIGPIPE (most likely a vectored `writev`, which has no
        // MSG_NOSIGNAL) and killed `wirl serve`, every other client's requests with it.
        // SAFETY: restoring the default disposition of one signal, before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    match run(cli.command) {
        Ok(code) => code,
        Err(error) => {
            say!("error: {}", shown(&error));
            ExitCode::from(2)
        }
    }
}

/// Log lines on stderr (`WIRL_LOG` filters them; warnings and plugins' own by default), and
/// at debug level how the process was set up.
fn start_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WIRL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,wirl::plugin=info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if let Ok(tunables) = std::env::var("GLIBC_TUNABLES") {
        if tunables.split(':').any(|t| t == HUGE_PAGE_TUNABLE) {
            tracing::debug!(
                "the allocator's heap asks for transparent huge pages (GLIBC_TUNABLES has {HUGE_PAGE_TUNABLE})"
            );
        }
        if tunables.contains(ONE_HEAP_TUNABLES) {
            tracing::debug!("the allocator keeps its memory in one heap (GLIBC_TUNABLES has {ONE_HEAP_TUNABLES})");
        }
    }
    if let Ok(threads) = std::env::var("RAYON_NUM_THREADS") {
        tracing::debug!("candle computes on {threads} threads (RAYON_NUM_THREADS)");
    }
}

/// The command's own function.
fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Train(args) => train::run(args),
        Command::Eval(args) => train::eval(args),
        Command::Plot(args) => plot::run(args),
        Command::Score(args) => score::run(args),
        Command::Tasks(args) => tasks::run(args),
        Command::Plugin(PluginCommand::Inspect(args)) => inspect::run(args),
        Command::Plugin(PluginCommand::New(args)) => scaffold::run(args),
        Command::Plugin(PluginCommand::List(args)) => inspect::list(args),
        Command::Generate(args) => generate::run(args),
        Command::Model(ModelCommand::Fetch(args)) => model::fetch(args),
        Command::Model(ModelCommand::Export(args)) => model::export(args),
        Command::Model(ModelCommand::Inspect(args)) => model::inspect(args),
        Command::Model(ModelCommand::Merge(args)) => model::merge(args),
        Command::Model(ModelCommand::CheckDevice(args)) => model::check_device(args),
        Command::Ctl(args) => ctl::run(args),
        Command::Sandbox(command) => sandbox::run(command),
        Command::Serve(args) => serve::run(*args),
        Command::CodeWorker => code_worker(),
        Command::Completions { shell } => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut command, "wirl", &mut std::io::stdout());
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// An error and its causes as anyhow's `{:#}` joins them, without candle's backtraces.
fn shown(error: &anyhow::Error) -> String {
    wirl_engine::error_chain(error.as_ref())
}

/// `wirl code-worker`: serve the parent that started this process until it closes stdin.
fn code_worker() -> anyhow::Result<ExitCode> {
    // Ctrl-C in a terminal reaches the whole process group: the parent decides what it
    // means (a training stops at its next boundary), and ends this worker by closing stdin
    // or killing it; a worker that died of the signal would fail the programs in flight.
    // SAFETY: setting the disposition of one signal, before any thread starts.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
    }
    wirl_sandbox::serve_code_worker(std::io::stdin().lock(), std::io::stdout().lock())?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::shown;

    #[test]
    fn a_tensor_error_is_shown_without_its_backtrace() {
        let tensor = candle_core::Error::WithBacktrace {
            inner: Box::new(candle_core::Error::Msg("device mismatch in add".into())),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        let error = anyhow::Error::from(tensor).context("step 151").context("training");
        assert_eq!(shown(&error), "training: step 151: device mismatch in add");
        // Other errors read as anyhow's alternate form does.
        let plain = anyhow::anyhow!("no such file").context("reading config.toml");
        assert_eq!(shown(&plain), format!("{plain:#}"));
    }
}
