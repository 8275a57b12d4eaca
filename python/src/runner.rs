//! `NativeCodeRunner`: model-written programs, each in a fresh interpreter instance of a
//! code-runner plugin (CPython in a component), in this process or in worker processes.

use crate::reward::limits_from;
use crate::{Loaded, default_threads, parallel, plugin_error, spec_of};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use wirl_sandbox::{CodeRunnerPlugin, Limits, Outcome, Program, RunLimits, RunnerFailure, Termination};

/// One program as Python sends it: (language, source, stdin, args).
type ProgramArgs = (String, String, String, Vec<String>);

/// How a program ended, as Python receives it: (termination, exit status when it exited,
/// the interpreter's crash message, stdout, stderr, truncated, milliseconds).
type Ran = (&'static str, Option<i32>, Option<String>, String, String, bool, u32);

#[pyclass(frozen, module = "wirl._native")]
pub struct NativeCodeRunner {
    spec: wirl_sandbox::PluginSpec,
    workers: usize,
    threads: usize,
    state: Mutex<(Loaded, Arc<CodeRunnerPlugin>)>,
}

#[pymethods]
impl NativeCodeRunner {
    #[new]
    #[pyo3(signature = (runner, deadline_ms=None, memory_mib=None, fuel=None, max_output_bytes=None, workers=0, threads=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        runner: &str,
        deadline_ms: Option<u64>,
        memory_mib: Option<u64>,
        fuel: Option<u64>,
        max_output_bytes: Option<u64>,
        workers: usize,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let mut spec = spec_of(runner)?;
        spec.limits = limits_from(Limits::code_runner(), deadline_ms, memory_mib, fuel)?;
        if let Some(bytes) = max_output_bytes {
            if bytes == 0 || bytes > u64::from(u32::MAX) {
                return Err(PyValueError::new_err(format!(
                    "max_output_bytes must be between 1 and 2^32-1, not {bytes}"
                )));
            }
            spec.limits.max_print_bytes = bytes;
        }
        if workers > wirl_sandbox::MAX_WORKERS {
            return Err(PyValueError::new_err(format!(
                "workers must be at most {}, not {workers}",
                wirl_sandbox::MAX_WORKERS
            )));
        }
        let threads = match threads {
            Some(0) => return Err(PyValueError::new_err("threads must be at least 1")),
            Some(n) => n,
            None => default_threads().max(workers),
        };
        let state = py.detach(|| load(&spec, workers))?;
        Ok(NativeCodeRunner { spec, workers, threads, state: Mutex::new(state) })
    }

    #[getter]
    fn sha256(&self) -> PyResult<String> {
        Ok(self.current()?.plugin().sha256().to_string())
    }

    /// Worker processes running the programs (0: in this process).
    #[getter]
    fn workers(&self) -> usize {
        self.workers
    }

    /// Their process ids, alive now.
    fn worker_pids(&self) -> PyResult<Vec<u32>> {
        Ok(self.current()?.worker_pids())
    }

    /// Run each program to its end or its first exhausted limit, on the runner's threads
    /// without the GIL. `wall_ms`, `memory_bytes`, `max_output_bytes` of 0 ask for the
    /// runner's configured maximum.
    #[pyo3(signature = (programs, wall_ms=0, memory_bytes=0, fuel=None, max_output_bytes=0))]
    fn run(
        &self,
        py: Python<'_>,
        programs: Vec<ProgramArgs>,
        wall_ms: u32,
        memory_bytes: u64,
        fuel: Option<u64>,
        max_output_bytes: u32,
    ) -> PyResult<Vec<Ran>> {
        let runner = self.current()?;
        let limits = RunLimits { wall_ms, memory_bytes, fuel, max_output_bytes };
        let programs: Vec<Program> = programs
            .into_iter()
            .map(|(language, source, stdin, args)| Program { language, source, stdin, args })
            .collect();
        let interrupter = self.state.lock().unwrap_or_else(|e| e.into_inner()).0.sandbox.interrupter();
        parallel(
            py,
            &interrupter,
            &programs,
            self.threads,
            || Ok(()),
            |()| {},
            |(), program| shown(runner.try_run(program, &limits)),
        )
    }
}

impl NativeCodeRunner {
    /// The runner as loaded in this process: loaded again after a fork (with its own workers).
    fn current(&self) -> PyResult<Arc<CodeRunnerPlugin>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.0.is_ours() {
            crate::inherited(std::mem::replace(&mut *state, load(&self.spec, self.workers)?));
        }
        Ok(state.1.clone())
    }
}

fn load(spec: &wirl_sandbox::PluginSpec, workers: usize) -> PyResult<(Loaded, Arc<CodeRunnerPlugin>)> {
    let loaded = Loaded::load(spec)?;
    let mut runner = CodeRunnerPlugin::new(loaded.plugin.clone()).map_err(plugin_error)?;
    if workers > 0 {
        runner = runner.in_workers(&loaded.sandbox, workers).map_err(plugin_error)?;
    }
    Ok((loaded, Arc::new(runner)))
}

/// A run as Python sees it; the runner's own failure (a lost worker, no instance) is the
/// verdict `infrastructure` with what happened, never one of the program's endings.
fn shown(run: Result<Outcome, RunnerFailure>) -> Ran {
    let outcome = match run {
        Ok(outcome) => outcome,
        Err(RunnerFailure(why)) => return ("infrastructure", None, Some(why), String::new(), String::new(), false, 0),
    };
    let (termination, status, crash) = match outcome.termination {
        Termination::Exited(status) => ("exited", Some(status), None),
        Termination::TimedOut => ("timed_out", None, None),
        Termination::OutOfFuel => ("out_of_fuel", None, None),
        Termination::OutOfMemory => ("out_of_memory", None, None),
        Termination::OutputLimit => ("output_limit", None, None),
        Termination::Crashed(how) => ("crashed", None, Some(how)),
    };
    (termination, status, crash, outcome.stdout, outcome.stderr, outcome.truncated, outcome.duration_ms)
}

/// Say how this process starts a code worker (`python -c …` that calls
/// [`serve_code_worker`]); the Python package does this once, on import.
#[pyfunction]
pub fn set_worker_command(program: std::path::PathBuf, args: Vec<String>) {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    wirl_sandbox::register_worker_command(program, &args);
}

/// Serve the parent that started this process (a code worker) on stdin and stdout until
/// it closes stdin.
#[pyfunction]
pub fn serve_code_worker(py: Python<'_>) -> PyResult<()> {
    py.detach(|| wirl_sandbox::serve_code_worker(std::io::stdin().lock(), std::io::stdout().lock()))
        .map_err(plugin_error)
}
