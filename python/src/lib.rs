//! `wirl._native`: the sandbox's handles as Python objects. The Python package around it
//! (`wirl/`) speaks each trainer's calling convention; this module only loads plugins, calls
//! them on threads of its own with the GIL released, and turns verdicts into Python values.
//!
//! What it must not know: trainers, datasets, columns or chat formats (the Python side maps
//! those onto tasks), and nothing of the engine or the trainer crates.
//!
//! Two rules hold for every handle here:
//! - **Fork**: a sandbox's deadlines are kept by a ticker thread, which a forked child does
//!   not have. Every handle remembers the process that loaded it and loads again, from its
//!   spec, when called in another one (`multiprocessing`'s fork, a data loader's workers).
//! - **Interrupts**: a batch waits for its threads in slices and asks Python for pending
//!   signals between them; a `KeyboardInterrupt` interrupts the calls in flight (the
//!   sandbox's [`Interrupter`]) and is raised once every thread has stopped.

mod environment;
mod inference;
mod reward;
mod runner;

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;
use wirl_sandbox::{Interrupter, Plugin, PluginSpec, Sandbox, SandboxSettings};

pyo3::create_exception!(
    _native,
    PluginError,
    PyException,
    "A plugin could not be loaded or used: its file, world or configuration."
);

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("PluginError", m.py().get_type::<PluginError>())?;
    m.add("WIT_PACKAGE", wirl_sandbox::WIT_PACKAGE)?;
    m.add("WIT_VERSION", wirl_sandbox::WIT_VERSION)?;
    m.add("WIT_VERSIONS", wirl_sandbox::WIT_VERSIONS.to_vec())?;
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<reward::NativeReward>()?;
    m.add_class::<runner::NativeCodeRunner>()?;
    m.add_class::<environment::NativeEnvironment>()?;
    m.add_class::<environment::NativeEpisode>()?;
    m.add_function(wrap_pyfunction!(builtins, m)?)?;
    m.add_function(wrap_pyfunction!(interrupt_all, m)?)?;
    m.add_function(wrap_pyfunction!(runner::serve_code_worker, m)?)?;
    m.add_function(wrap_pyfunction!(runner::set_worker_command, m)?)?;
    Ok(())
}

/// The built-in plugins: (reference, what it is, sha256).
#[pyfunction]
fn builtins() -> Vec<(String, &'static str, String)> {
    wirl_builtins::all().iter().map(|b| (b.reference(), b.about, b.sha256())).collect()
}

/// A plugin error as Python's exception, its causes kept in the message.
pub(crate) fn plugin_error(error: impl std::fmt::Display) -> PyErr {
    PluginError::new_err(error.to_string())
}

/// The spec of a plugin reference: `builtin:NAME` or a file.
pub(crate) fn spec_of(reference: &str) -> PyResult<PluginSpec> {
    wirl_builtins::spec(std::path::Path::new(reference)).map_err(plugin_error)
}

/// The sandbox of this process for these settings: one per (process, fuel on or off), so that
/// every handle of a process shares one engine, one epoch ticker and one pool of instance
/// slots (each sandbox reserves address space for its slots).
/// This process's sandboxes (and those a fork inherited): (process, fuel, sandbox).
static SANDBOXES: Mutex<Vec<(u32, bool, Sandbox)>> = Mutex::new(Vec::new());

pub(crate) fn sandbox(fuel: bool) -> PyResult<Sandbox> {
    let pid = std::process::id();
    let mut sandboxes = SANDBOXES.lock().unwrap_or_else(|e| e.into_inner());
    // A forked child inherits its parent's entries, whose tickers did not follow it.
    let (ours, theirs): (Vec<_>, Vec<_>) =
        std::mem::take(&mut *sandboxes).into_iter().partition(|(owner, _, _)| *owner == pid);
    theirs.into_iter().for_each(inherited);
    *sandboxes = ours;
    if let Some((_, _, sandbox)) = sandboxes.iter().find(|(_, with_fuel, _)| *with_fuel == fuel) {
        return Ok(sandbox.clone());
    }
    let sandbox = Sandbox::new(SandboxSettings { fuel, ..SandboxSettings::default() }).map_err(plugin_error)?;
    sandboxes.push((pid, fuel, sandbox.clone()));
    Ok(sandbox)
}

/// A plugin loaded in this process, and what it was loaded with.
pub(crate) struct Loaded {
    pid: u32,
    pub sandbox: Sandbox,
    pub plugin: Arc<Plugin>,
}

impl Loaded {
    /// Load `spec` in this process's sandbox.
    pub fn load(spec: &PluginSpec) -> PyResult<Self> {
        let sandbox =
            sandbox(spec.limits.fuel.is_some() || spec.code_runner.as_ref().is_some_and(|r| r.limits.fuel.is_some()))?;
        let plugin = sandbox.load(spec.clone()).map_err(plugin_error)?;
        Ok(Loaded { pid: std::process::id(), sandbox, plugin })
    }

    /// Whether this was loaded by the calling process (not inherited through a fork).
    pub fn is_ours(&self) -> bool {
        self.pid == std::process::id()
    }
}

/// What a forked child inherited of its parent's handles: never dropped. Dropping a code
/// runner's worker pool kills its worker processes, which are the parent's (a fork once killed
/// the parent's worker); the rest holds threads the child does not have.
pub(crate) fn inherited<T>(state: T) {
    std::mem::forget(state);
}

/// Interrupt every call in flight of this process's sandboxes (and their code workers), for
/// good: the interpreter is exiting and must not wait for programs nobody will read.
#[pyfunction]
pub fn interrupt_all() {
    let pid = std::process::id();
    for (owner, _, sandbox) in SANDBOXES.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        if *owner == pid {
            sandbox.interrupter().interrupt();
        }
    }
}

/// How often a waiting batch asks Python whether a signal (Ctrl-C) arrived.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

/// Run `work` over `items` on up to `threads` threads with the GIL released, each thread
/// with a worker state made by `worker` (a reward handle, say); results in the items' order.
/// A pending `KeyboardInterrupt` (or any exception a signal handler raises) interrupts the
/// calls in flight, waits for every thread, and is returned.
pub(crate) fn parallel<T: Sync, R: Send, W>(
    py: Python<'_>,
    interrupter: &Interrupter,
    items: &[T],
    threads: usize,
    worker: impl Fn() -> Result<W, String> + Sync,
    finish: impl Fn(W) + Sync,
    work: impl Fn(&mut W, &T) -> R + Sync,
) -> PyResult<Vec<R>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let threads = threads.clamp(1, items.len());
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let results: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let (worker, finish, work, results_ref) = (&worker, &finish, &work, &results);
    let (next_ref, stop_ref) = (&next, &stop);
    let (failures, signal) = py.detach(|| {
        std::thread::scope(|scope| {
            let (done, finished) = mpsc::channel::<Result<(), String>>();
            for _ in 0..threads {
                let done = done.clone();
                scope.spawn(move || {
                    let ran = worker().map(|mut state| {
                        while !stop_ref.load(Ordering::SeqCst) {
                            let index = next_ref.fetch_add(1, Ordering::SeqCst);
                            let Some(item) = items.get(index) else { break };
                            let result = work(&mut state, item);
                            *results_ref[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                        }
                        finish(state);
                    });
                    let _ = done.send(ran);
                });
            }
            drop(done);
            let mut failures = Vec::new();
            let mut signal = None;
            loop {
                match finished.recv_timeout(SIGNAL_POLL) {
                    Ok(Ok(())) => {}
                    Ok(Err(failure)) => {
                        // A worker that cannot start (a plugin that no longer loads) stops
                        // the batch: the others would fail the same way.
                        stop_ref.store(true, Ordering::SeqCst);
                        failures.push(failure);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if signal.is_none()
                            && let Err(raised) = Python::attach(|py| py.check_signals())
                        {
                            stop_ref.store(true, Ordering::SeqCst);
                            interrupter.interrupt();
                            signal = Some(raised);
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            (failures, signal)
        })
    });
    if let Some(raised) = signal {
        // Every thread has stopped: new calls of this process's plugins may run again.
        interrupter.clear();
        return Err(raised);
    }
    if let Some(failure) = failures.into_iter().next() {
        return Err(plugin_error(failure));
    }
    results
        .into_iter()
        .map(|slot| slot.into_inner().unwrap_or_else(|e| e.into_inner()))
        .collect::<Option<Vec<R>>>()
        .ok_or_else(|| plugin_error("a batch ended with items left unscored (a bug in wirl: please report it)"))
}

/// The number of threads a batch uses when the caller does not say: the machine's cores.
pub(crate) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}
