//! Running untrusted programs: a code-runner plugin (an interpreter component, CPython
//! inside for example) called with a fresh instance per program, and the host side of the
//! `code-runner` import of graders, which reaches such a plugin in its own store.
//!
//! Everything that bounds a program is enforced here, outside the interpreter: the wall
//! clock (epoch deadline), fuel, memory growth, and the bytes it may write to stdout and
//! stderr. The interpreter only runs the program and says how it exited; what it printed is
//! captured from its WASI streams, so output written before a time-out or a trap is kept.

use crate::bindings::code_runner_world::exports::wirl::rl::code_runner as guest;
use crate::bindings::code_runner_world::{CodeRunnerPlugin as Bindings, CodeRunnerPluginPre};
use crate::bindings::grader_world::wirl::rl::code_runner as import;
use crate::call::{self, CallStats, FailureKind, HostState};
use crate::limits::Limits;
use crate::plugin::{Plugin, Prepared};
use crate::workers::WorkerPool;
use crate::{Error, Outcome, Program, Result, RunLimits, Termination, Workdir, World};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Why a runner could not run a program at all: the host's failure, not the program's (a
/// worker process that died or stopped answering, no instance to be had, an interpreter
/// that could not be instantiated). A grader's call fails with it (verdict
/// `infrastructure`) instead of judging the program by it: a killed worker once scored a
/// correct solution 0.
#[derive(Clone, Debug, PartialEq, thiserror::Error, serde::Serialize, serde::Deserialize)]
#[error("the code runner could not run the program: {0}")]
pub struct RunnerFailure(pub String);

/// A code-runner plugin ready to run programs. Shareable between threads: every program
/// gets its own store and instance.
pub struct CodeRunnerPlugin {
    interpreter: Interpreter,
    plugin: Arc<Plugin>,
    last: Mutex<CallStats>,
    /// Worker processes that run the programs instead of this process, when started.
    workers: Option<Arc<WorkerPool>>,
}

/// What runs the programs: a component of the code-runner world, or CRuby's core module.
enum Interpreter {
    Component(CodeRunnerPluginPre<HostState>),
    /// CRuby, and its instance after booting once (made by the first run).
    Ruby {
        pre: wasmtime::InstancePre<HostState>,
        booted: Mutex<Option<Arc<crate::ruby::Snapshot>>>,
    },
}

/// An interpreter instantiated for one program.
enum Instance {
    Component(Bindings),
    Ruby(wasmtime::Instance),
}

impl CodeRunnerPlugin {
    pub fn new(plugin: Arc<Plugin>) -> Result<Self> {
        if plugin.world() != World::CodeRunnerPlugin {
            return Err(Error::WrongWorld {
                name: plugin.name().to_string(),
                path: plugin.path().to_path_buf(),
                found: plugin.world(),
                wanted: "a code-runner-plugin".to_string(),
            });
        }
        let interpreter = match &plugin.prepared {
            Prepared::Ruby { pre, .. } => Interpreter::Ruby { pre: pre.clone(), booted: Mutex::new(None) },
            Prepared::Component(pre) => Interpreter::Component(
                CodeRunnerPluginPre::new(pre.clone())
                    .map_err(|e| Error::Refused { path: plugin.path().to_path_buf(), reason: format!("{e:#}") })?,
            ),
        };
        Ok(CodeRunnerPlugin { interpreter, plugin, last: Mutex::new(CallStats::default()), workers: None })
    }

    /// Run programs in `workers` child processes instead of this one (module `workers`):
    /// they scale with cores as subprocesses do. The children start now, so that a runner
    /// they cannot load is an error here, not a crashed program later.
    pub fn in_workers(mut self, sandbox: &crate::Sandbox, workers: usize) -> Result<Self> {
        let pool = WorkerPool::start(&self.plugin, sandbox.settings(), sandbox.interrupter(), workers)
            .map_err(|message| Error::Config { name: self.plugin.name().to_string(), message })?;
        self.workers = Some(Arc::new(pool));
        Ok(self)
    }

    /// How many worker processes run the programs; 0 when they run in this process.
    pub fn workers(&self) -> usize {
        self.workers.as_ref().map_or(0, |pool| pool.workers())
    }

    /// The process ids of the worker processes alive now (for monitoring); none in process.
    pub fn worker_pids(&self) -> Vec<u32> {
        self.workers.as_ref().map_or_else(Vec::new, |pool| pool.pids())
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// Time spent instantiating and running in the last run in this process (of any thread).
    pub fn last_call(&self) -> CallStats {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The limits a run gets: each requested limit lowered to this plugin's configured one
    /// (a zero request means "the configured maximum").
    pub fn effective_limits(&self, requested: &RunLimits) -> Limits {
        let configured = self.plugin.limits();
        let lower =
            |configured: u64, requested: u64| if requested == 0 { configured } else { configured.min(requested) };
        Limits {
            deadline_ms: lower(configured.deadline_ms, u64::from(requested.wall_ms)),
            memory_bytes: lower(configured.memory_bytes, requested.memory_bytes),
            fuel: match (configured.fuel, requested.fuel) {
                (Some(ours), Some(theirs)) => Some(ours.min(theirs)),
                (ours, theirs) => ours.or(theirs),
            },
            max_print_bytes: lower(configured.max_print_bytes, u64::from(requested.max_output_bytes)),
            max_return_bytes: configured.max_return_bytes,
            // A program never sees another program's instance.
            reuse_instance: false,
        }
    }

    /// Run `program` in a fresh instance, to its end or its first exhausted limit: whatever
    /// the program did is in the outcome's `termination`; an error is the host's failure to
    /// run it at all ([`RunnerFailure`]).
    pub fn try_run(&self, program: &Program, requested: &RunLimits) -> std::result::Result<Outcome, RunnerFailure> {
        call::block_on(self.run_async(program, requested, None))
    }

    /// [`CodeRunnerPlugin::try_run`] with `workdir` as the program's `/`: the files it reads
    /// and writes, for this run only, bounded in bytes and entries (a program past them ends
    /// `output-limit`). The caller fills the directory before and reads it after.
    pub fn try_run_in(
        &self,
        program: &Program,
        requested: &RunLimits,
        workdir: &Workdir,
    ) -> std::result::Result<Outcome, RunnerFailure> {
        call::block_on(self.run_async(program, requested, Some(workdir)))
    }

    /// [`CodeRunnerPlugin::try_run`] with the host's failure as a `crashed` outcome that says
    /// so: for callers that show outcomes and judge nothing by them.
    pub fn run(&self, program: &Program, requested: &RunLimits) -> Outcome {
        self.try_run(program, requested).unwrap_or_else(|failure| crashed(failure.to_string(), Instant::now()))
    }

    /// [`CodeRunnerPlugin::try_run`], awaited: how a grader's `code-runner` import runs a
    /// program inside the grader's own (bounded) call.
    pub(crate) async fn run_async(
        &self,
        program: &Program,
        requested: &RunLimits,
        workdir: Option<&Workdir>,
    ) -> std::result::Result<Outcome, RunnerFailure> {
        match &self.workers {
            Some(pool) => pool.run(program, requested, &self.effective_limits(requested), workdir).await,
            None => self.run_in_process(program, requested, workdir).await,
        }
    }

    /// [`CodeRunnerPlugin::try_run`] in this process, whatever the runner's workers: what a
    /// worker process does with each program it is sent.
    pub(crate) fn run_here(
        &self,
        program: &Program,
        requested: &RunLimits,
        workdir: Option<&Workdir>,
    ) -> std::result::Result<Outcome, RunnerFailure> {
        call::block_on(self.run_in_process(program, requested, workdir))
    }

    /// Over ~80 lines on purpose: one program's run in the order its limits apply — the store,
    /// the instance, the call, the output read back and classified — with the store and the
    /// limits threading through every part.
    async fn run_in_process(
        &self,
        program: &Program,
        requested: &RunLimits,
        workdir: Option<&Workdir>,
    ) -> std::result::Result<Outcome, RunnerFailure> {
        let limits = self.effective_limits(requested);
        let started = Instant::now();
        // CRuby reads stdin from WASI; a component is handed it with the program.
        let stdin = if matches!(self.interpreter, Interpreter::Ruby { .. }) { program.stdin.as_str() } else { "" };
        let snapshot = match &self.interpreter {
            Interpreter::Ruby { pre, booted } => Some(self.ruby_booted(pre, booted).await?),
            Interpreter::Component(_) => None,
        };
        let mut store = match self.plugin.new_store_reading(&limits, workdir, stdin) {
            Ok(store) => store,
            Err(failure) => return Err(RunnerFailure(failure.message)),
        };
        let instance = match &self.interpreter {
            Interpreter::Component(pre) => call::bounded(&mut store, async |store| pre.instantiate_async(store).await)
                .await
                .map(Instance::Component),
            Interpreter::Ruby { pre, .. } => {
                call::bounded(&mut store, async |store| pre.instantiate_async(store).await).await.map(Instance::Ruby)
            }
        };
        let instance = match instance {
            Ok(instance) => instance,
            Err(error) => {
                let failure = call::classify(&store, &error, &limits);
                if failure.kind == FailureKind::Deadline {
                    return Ok(timed_out(&mut store, started));
                }
                return Err(RunnerFailure(format!("the interpreter could not be instantiated: {failure}")));
            }
        };
        let instantiated = Instant::now();
        let result = match instance {
            Instance::Component(bindings) => {
                let program = guest::Program {
                    language: program.language.clone(),
                    source: program.source.clone(),
                    stdin: program.stdin.clone(),
                    args: program.args.clone(),
                };
                let asked = guest::Limits {
                    wall_ms: u32::try_from(limits.deadline_ms).unwrap_or(u32::MAX),
                    memory_bytes: limits.memory_bytes,
                    fuel: limits.fuel,
                    max_output_bytes: u32::try_from(limits.max_print_bytes).unwrap_or(u32::MAX),
                };
                call::bounded(&mut store, async |store| {
                    bindings.wirl_rl_code_runner().call_run(store, &program, asked).await
                })
                .await
            }
            // CRuby always ends in an exit (an `I32Exit` error) or a trap.
            Instance::Ruby(instance) => call::bounded(&mut store, async |store| {
                let snapshot = snapshot.as_deref().expect("booted above");
                crate::ruby::run(store, instance, snapshot, &program.source, &program.args).await
            })
            .await
            .map(|never| match never {}),
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) =
            CallStats { instantiate: instantiated - started, call: instantiated.elapsed() };

        // Classify a failure before the output is taken: taking clears the print-limit flag.
        let failure = result.as_ref().err().map(|error| call::classify(&store, error, &limits));
        // A last write between two measures of the directory counts too.
        let files_over = store.data_mut().workdir.as_mut().and_then(|watch| watch.finish());
        let state = store.data();
        let (mut stdout, stdout_cut) = state.stdout.take();
        let (mut stderr, stderr_cut) = state.stderr.take();
        // Out of memory: the host denied growth, or CPython refused an allocation that could
        // never fit (a MemoryError as the program's last word).
        let memory_denied = state.limiter.denied.is_some() || last_line(&stderr).starts_with("MemoryError");
        let (termination, guest_cut) = match result {
            Ok(outcome) => {
                // A runner may also return output in the record; it follows what it printed.
                stdout.push_str(&outcome.stdout);
                stderr.push_str(&outcome.stderr);
                (ended(outcome.termination, memory_denied), outcome.truncated)
            }
            Err(error) => (failed(&error, failure.expect("classified above"), memory_denied), false),
        };
        let termination = match (termination, files_over) {
            (Termination::Exited(_), Some(_)) => Termination::OutputLimit,
            (termination, _) => termination,
        };
        let limit = usize::try_from(limits.max_print_bytes).unwrap_or(usize::MAX);
        let cut = stdout_cut || stderr_cut || guest_cut || stdout.len() > limit || stderr.len() > limit;
        truncate_at_char(&mut stdout, limit);
        truncate_at_char(&mut stderr, limit);
        Ok(Outcome { termination, stdout, stderr, truncated: cut, duration_ms: elapsed_ms(started) })
    }
}

impl CodeRunnerPlugin {
    /// CRuby booted once, under this runner's configured limits (the first run boots it; a
    /// boot that fails is this run's failure and the next run tries again).
    async fn ruby_booted(
        &self,
        pre: &wasmtime::InstancePre<HostState>,
        booted: &Mutex<Option<Arc<crate::ruby::Snapshot>>>,
    ) -> std::result::Result<Arc<crate::ruby::Snapshot>, RunnerFailure> {
        if let Some(snapshot) = booted.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(snapshot);
        }
        let limits = self.plugin.limits().clone();
        let mut store = self.plugin.new_store_with(&limits, None).map_err(|failure| RunnerFailure(failure.message))?;
        let snapshot = call::bounded(&mut store, async |store| {
            let instance = pre.instantiate_async(&mut *store).await?;
            crate::ruby::Snapshot::boot(store, instance).await
        })
        .await
        .map_err(|error| {
            let failure = call::classify(&store, &error, &limits);
            let (stderr, _) = store.data().stderr.take();
            RunnerFailure(format!("CRuby could not boot: {failure} {}", stderr.trim()))
        })?;
        let snapshot = Arc::new(snapshot);
        *booted.lock().unwrap_or_else(|e| e.into_inner()) = Some(snapshot.clone());
        Ok(snapshot)
    }
}

impl std::fmt::Debug for CodeRunnerPlugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeRunnerPlugin").field("plugin", &self.plugin).finish()
    }
}

/// How a program the runner ran ended. An interpreter reports the MemoryError of a program
/// whose growth the host denied as an ordinary failure; the limit is named instead.
fn ended(termination: guest::Termination, memory_denied: bool) -> Termination {
    match termination {
        guest::Termination::Exited(status) if status != 0 && memory_denied => Termination::OutOfMemory,
        other => from_guest(other),
    }
}

/// How a program ended whose run failed in the host (`failure`, classified before the output
/// was taken).
fn failed(error: &wasmtime::Error, failure: call::Failure, memory_denied: bool) -> Termination {
    match error.downcast_ref::<wasmtime_wasi::I32Exit>() {
        // `os._exit(n)` and friends end the instance through WASI's exit.
        Some(exit) if memory_denied && exit.0 != 0 => Termination::OutOfMemory,
        Some(exit) => Termination::Exited(exit.0),
        None => match failure.kind {
            FailureKind::Deadline => Termination::TimedOut,
            FailureKind::Fuel => Termination::OutOfFuel,
            FailureKind::Memory => Termination::OutOfMemory,
            FailureKind::PrintLimit => Termination::OutputLimit,
            _ => Termination::Crashed(failure.message),
        },
    }
}

fn from_guest(termination: guest::Termination) -> Termination {
    match termination {
        guest::Termination::Exited(status) => Termination::Exited(status),
        guest::Termination::TimedOut => Termination::TimedOut,
        guest::Termination::OutOfFuel => Termination::OutOfFuel,
        guest::Termination::OutOfMemory => Termination::OutOfMemory,
        guest::Termination::OutputLimit => Termination::OutputLimit,
        guest::Termination::Crashed(how) => Termination::Crashed(how),
    }
}

fn last_line(text: &str) -> &str {
    text.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("")
}

/// A run cut at its deadline before the program started: what it printed is kept.
fn timed_out(store: &mut wasmtime::Store<HostState>, started: Instant) -> Outcome {
    let (stdout, stdout_cut) = store.data().stdout.take();
    let (stderr, stderr_cut) = store.data().stderr.take();
    Outcome {
        termination: Termination::TimedOut,
        stdout,
        stderr,
        truncated: stdout_cut || stderr_cut,
        duration_ms: elapsed_ms(started),
    }
}

fn crashed(message: String, started: Instant) -> Outcome {
    Outcome {
        termination: Termination::Crashed(message),
        stdout: String::new(),
        stderr: String::new(),
        truncated: false,
        duration_ms: elapsed_ms(started),
    }
}

fn elapsed_ms(started: Instant) -> u32 {
    u32::try_from(started.elapsed().as_millis()).unwrap_or(u32::MAX)
}

fn truncate_at_char(text: &mut String, limit: usize) {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
}

impl Termination {
    /// A short name for logs and verdicts: `exited(0)`, `timed-out`, `crashed`.
    pub fn describe(&self) -> String {
        match self {
            Termination::Exited(status) => format!("exited({status})"),
            Termination::TimedOut => "timed-out".into(),
            Termination::OutOfFuel => "out-of-fuel".into(),
            Termination::OutOfMemory => "out-of-memory".into(),
            Termination::OutputLimit => "output-limit".into(),
            Termination::Crashed(how) => format!("crashed: {how}"),
        }
    }
}

impl Program {
    /// A Python program with no input and no arguments.
    pub fn python(source: impl Into<String>) -> Self {
        Program { language: "python".into(), source: source.into(), stdin: String::new(), args: Vec::new() }
    }
}

impl RunLimits {
    /// Ask for nothing: every limit is the runner's configured maximum.
    pub fn configured() -> Self {
        RunLimits { wall_ms: 0, memory_bytes: 0, fuel: None, max_output_bytes: 0 }
    }
}

/// A grader's `code-runner` import: each program goes to the grader's own runner plugin, in
/// a store of its own, so nothing the program does reaches the grader's memory.
/// A run the host could not make traps the grader's call ([`RunnerFailure`], verdict
/// `infrastructure`): the grader would otherwise judge the program by the host's failure.
impl import::Host for HostState {
    async fn run(&mut self, program: Program, limits: RunLimits) -> wasmtime::Result<Outcome> {
        match self.runner.clone() {
            Some(runner) => Ok(runner.run_async(&program, &limits, None).await?),
            None => Err(RunnerFailure(
                "this grader was loaded without a code runner; give it one (`code_runner` in its config)".into(),
            )
            .into()),
        }
    }
}
