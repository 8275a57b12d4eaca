//! SandboxFusion's `/run_code`, served from wirl's code runners: the request and response
//! SandboxFusion's clients send and read (verl's `sandbox_fusion` reward and tool, its PyPI
//! client `sandbox-fusion`, SkyRL, ...), each program run in a fresh instance of a language's
//! runner component under the request's limits lowered to the server's.
//!
//! A request becomes one run: its `files` are written into a directory made for that run
//! only, which the program sees as `/` (and may write into, bounded); `fetch_files` are read
//! back from it; the directory is removed after. Runs are admitted through a bounded queue:
//! at most `max_in_flight` run at once, at most `max_queued` wait, and a request that would
//! wait longer than `queue_timeout` is answered 504 (which verl's client retries), one past
//! the queue 503 with `Retry-After` — never an unbounded backlog.
//!
//! It must not know models, tasks or the command line: the caller gives it loaded runners.

use crate::ApiError;
use crate::request::object;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::Semaphore;
use wirl_sandbox::{CodeRunnerPlugin, Outcome, Program, RunLimits, Termination, Workdir, inside_workdir};

/// Every language SandboxFusion names (its `Language` type and its docs' list): a request
/// for one of these that this server does not run is refused naming the ones it does,
/// instead of being taken for a malformed request.
const SANDBOX_FUSION_LANGUAGES: &[&str] = &[
    "python",
    "python2",
    "pytest",
    "cpp",
    "go",
    "go_test",
    "java",
    "junit",
    "nodejs",
    "js",
    "ts",
    "typescript",
    "jest",
    "csharp",
    "rust",
    "php",
    "bash",
    "lua",
    "R",
    "perl",
    "D_ut",
    "ruby",
    "scala",
    "julia",
    "kotlin_script",
    "verilog",
    "lean",
    "swift",
    "racket",
    "cuda",
    "python_gpu",
    "sql",
    "gtest",
    "react",
];

/// SandboxFusion's routes that wirl does not serve, and why: answered 501 by name.
const NOT_SERVED: &[(&str, &str)] = &[
    ("/run_jupyter", "wirl runs whole programs (`/run_code`), not notebook cells"),
    ("/submit", "SandboxFusion's dataset routes are not served: score with wirl's rewards or your own harness"),
    ("/get_prompts", "SandboxFusion's dataset routes are not served"),
    ("/get_prompt_by_id", "SandboxFusion's dataset routes are not served"),
    ("/list_datasets", "SandboxFusion's dataset routes are not served"),
    ("/list_ids", "SandboxFusion's dataset routes are not served"),
];

/// The bounds of the code service: every request's own limits are lowered to these.
#[derive(Clone, Debug)]
pub struct CodeLimits {
    /// Runs at once; more wait in the queue.
    pub max_in_flight: usize,
    /// Requests waiting for a run; one more is answered 503 with `Retry-After`.
    pub max_queued: usize,
    /// A request that waited this long for a run is answered 504.
    pub queue_timeout: Duration,
    /// The longest `run_timeout` a request may ask for (longer asks are lowered to it).
    pub max_run_timeout: Duration,
    /// The most memory a run may have, in MiB (`memory_limit_MB` is lowered to it; -1 or
    /// absent asks for it).
    pub max_memory_mib: u64,
    /// Most bytes kept of stdout and of stderr each.
    pub max_output_bytes: u64,
    /// Most bytes of files a run's directory may hold: what the request sends and what the
    /// program writes, together.
    pub max_files_bytes: u64,
    /// Most files and directories a run's directory may hold.
    pub max_files: u64,
}

impl Default for CodeLimits {
    fn default() -> Self {
        CodeLimits {
            max_in_flight: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_queued: 256,
            queue_timeout: Duration::from_secs(60),
            max_run_timeout: Duration::from_secs(60),
            max_memory_mib: 1024,
            max_output_bytes: 1 << 20,
            max_files_bytes: 32 << 20,
            max_files: 1000,
        }
    }
}

/// One language this server runs: the runner component and the language name it speaks.
pub struct CodeLanguage {
    /// What a request's `language` says (`python`).
    pub name: String,
    /// The runner, loaded with limits at least as large as [`CodeLimits`]' maxima.
    pub runner: Arc<CodeRunnerPlugin>,
}

/// The code service: languages, bounds, and the queue runs are admitted through.
pub struct CodeService {
    languages: BTreeMap<String, Arc<CodeRunnerPlugin>>,
    limits: CodeLimits,
    running: Arc<Semaphore>,
    waiting: AtomicUsize,
    /// Where each run's directory is made (removed with the service).
    scratch: tempfile::TempDir,
    runs: AtomicU64,
    refused: AtomicU64,
}

impl std::fmt::Debug for CodeService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeService")
            .field("languages", &self.languages.keys().collect::<Vec<_>>())
            .field("limits", &self.limits)
            .finish()
    }
}

impl CodeService {
    /// A service running `languages` under `limits`; its runs' directories are made under
    /// the system's temporary directory.
    pub fn new(languages: Vec<CodeLanguage>, limits: CodeLimits) -> std::io::Result<Self> {
        let scratch = tempfile::Builder::new().prefix("wirl-run-code-").tempdir()?;
        let running = Arc::new(Semaphore::new(limits.max_in_flight.max(1)));
        let mut by_name = BTreeMap::new();
        for language in languages {
            by_name.insert(canonical_language(&language.name).to_string(), language.runner);
        }
        // SandboxFusion's `pytest` language (the program is a test file, pytest runs it) is
        // the Python runner's second mode, unless a runner is given for it by name.
        if let Some(python) = by_name.get("python").cloned() {
            by_name.entry("pytest".to_string()).or_insert(python);
        }
        Ok(CodeService {
            languages: by_name,
            limits,
            running,
            waiting: AtomicUsize::new(0),
            scratch,
            runs: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// The languages served, by name.
    pub fn languages(&self) -> Vec<String> {
        self.languages.keys().cloned().collect()
    }

    /// What `GET /v1/status` answers: the languages, programs running and waiting now, and
    /// programs run and requests refused (bad, or past the queue) so far.
    fn status(&self) -> Value {
        let running = self.limits.max_in_flight.max(1) - self.running.available_permits();
        json!({
            "languages": self.languages(),
            "running": running,
            "waiting": self.waiting.load(Ordering::SeqCst),
            "max_in_flight": self.limits.max_in_flight.max(1),
            "max_queued": self.limits.max_queued,
            "runs": self.runs.load(Ordering::Relaxed),
            "refused": self.refused.load(Ordering::Relaxed),
        })
    }

    /// Wait for a run's turn, within the queue's bounds.
    async fn admit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        let waiting = WaitingGuard::enter(&self.waiting, self.limits.max_queued).ok_or_else(|| {
            ApiError::with_status(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("{} programs are already waiting to run; try again shortly", self.limits.max_queued),
            )
            .retry_after(1)
        })?;
        let permit = tokio::time::timeout(self.limits.queue_timeout, self.running.clone().acquire_owned()).await;
        drop(waiting);
        match permit {
            Ok(Ok(permit)) => Ok(permit),
            Ok(Err(_)) => Err(ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, "the service is stopping".into())),
            Err(_) => Err(ApiError::with_status(
                StatusCode::GATEWAY_TIMEOUT,
                format!("no run was free within {} s; try again", self.limits.queue_timeout.as_secs()),
            )
            .retry_after(1)),
        }
    }

    /// Run one request's program in its own directory, and answer as SandboxFusion does.
    fn run(&self, request: RunCodeRequest) -> Result<Value, ApiError> {
        let dir = tempfile::Builder::new().prefix("run-").tempdir_in(self.scratch.path()).map_err(|e| {
            ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("cannot make the run's directory: {e}"))
        })?;
        let workdir = Workdir {
            path: dir.path().to_path_buf(),
            max_bytes: self.limits.max_files_bytes,
            max_entries: self.limits.max_files,
        };
        for (name, bytes) in &request.files {
            let path = workdir.resolve(name).expect("checked when the request was read");
            let written =
                path.parent().map_or(Ok(()), std::fs::create_dir_all).and_then(|()| std::fs::write(&path, bytes));
            if let Err(e) = written {
                return Err(ApiError::bad(Some(&format!("files.{name}")), &format!("could not be written: {e}")));
            }
        }
        let runner = &self.languages[&request.language];
        let limits = RunLimits {
            wall_ms: u32::try_from(request.run_timeout.as_millis()).unwrap_or(u32::MAX),
            memory_bytes: request.memory_mib << 20,
            fuel: None,
            max_output_bytes: u32::try_from(self.limits.max_output_bytes).unwrap_or(u32::MAX),
        };
        let program = Program {
            language: request.language.clone(),
            source: request.code,
            stdin: request.stdin,
            args: Vec::new(),
        };
        self.runs.fetch_add(1, Ordering::Relaxed);
        let outcome = runner.try_run_in(&program, &limits, &workdir);
        let fetched = fetch(&workdir, &request.fetch_files, self.limits.max_files_bytes);
        Ok(match outcome {
            Ok(outcome) => {
                // Which bound an output-limit was (the runner says only that one was hit).
                let files_over = (outcome.termination == Termination::OutputLimit).then(|| workdir.over()).flatten();
                answer(&outcome, files_over, request.memory_mib, fetched)
            }
            Err(failure) => json!({
                "status": "SandboxError",
                "message": failure.to_string(),
                "compile_result": null,
                "run_result": null,
                "executor_pod_name": null,
                "files": {},
            }),
        })
    }
}

/// Counts requests waiting for a run, refusing one past the bound.
struct WaitingGuard<'a>(&'a AtomicUsize);

impl<'a> WaitingGuard<'a> {
    fn enter(waiting: &'a AtomicUsize, max: usize) -> Option<Self> {
        waiting.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1)).ok()?;
        Some(WaitingGuard(waiting))
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The one name of a language and its aliases (SandboxFusion's `js` and `nodejs` are the
/// same runner).
pub fn canonical_language(language: &str) -> &str {
    match language {
        "js" | "javascript" | "node" => "nodejs",
        "python3" | "py" => "python",
        other => other,
    }
}

/// A `/run_code` request, read and checked before it waits for a run.
#[derive(Debug)]
struct RunCodeRequest {
    code: String,
    language: String,
    stdin: String,
    run_timeout: Duration,
    memory_mib: u64,
    files: Vec<(String, Vec<u8>)>,
    fetch_files: Vec<String>,
}

impl RunCodeRequest {
    /// Over ~80 lines on purpose: one reader per field of SandboxFusion's request, each error
    /// naming the field as a client wrote it, in the request's order.
    fn read(body: &[u8], service: &CodeService) -> Result<Self, ApiError> {
        let body = object(body)?;
        let string = |key: &str| -> Result<Option<String>, ApiError> {
            match body.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(text)) => Ok(Some(text.clone())),
                Some(_) => Err(ApiError::bad(Some(key), "must be a string")),
            }
        };
        let code = string("code")?.ok_or_else(|| ApiError::bad(Some("code"), "is required: the program to run"))?;
        let asked = string("language")?
            .ok_or_else(|| ApiError::bad(Some("language"), "is required (for example \"python\")"))?;
        let language = canonical_language(&asked).to_string();
        if !service.languages.contains_key(&language) {
            let language = asked;
            let served = service.languages().join(", ");
            let what = if SANDBOX_FUSION_LANGUAGES.contains(&language.as_str()) {
                format!("{language:?} is not run by this server (it runs: {served})")
            } else {
                format!("{language:?} is not a language this server knows (it runs: {served})")
            };
            return Err(ApiError::bad(Some("language"), &what));
        }
        let seconds = |key: &str, default: f64| -> Result<f64, ApiError> {
            match body.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(Value::Number(n)) => n
                    .as_f64()
                    .filter(|s| s.is_finite() && *s >= 0.0)
                    .ok_or_else(|| ApiError::bad(Some(key), "must be a finite number of seconds, at least 0")),
                Some(_) => Err(ApiError::bad(Some(key), "must be a number of seconds")),
            }
        };
        // Interpreted languages compile nothing; the field is read so that a bad one is
        // still a bad request.
        seconds("compile_timeout", 10.0)?;
        let asked = seconds("run_timeout", 10.0)?;
        let max = service.limits.max_run_timeout;
        // A timeout of 0 is SandboxFusion's "no limit": the server's maximum.
        let run_timeout = if asked == 0.0 { max } else { Duration::from_secs_f64(asked.min(max.as_secs_f64())) };
        let memory_mib = match body.get("memory_limit_MB") {
            None | Some(Value::Null) => service.limits.max_memory_mib,
            Some(Value::Number(n)) => match n.as_f64().filter(|m| m.is_finite()) {
                Some(m) if m <= 0.0 => service.limits.max_memory_mib,
                Some(m) => (m.ceil() as u64).min(service.limits.max_memory_mib),
                None => return Err(ApiError::bad(Some("memory_limit_MB"), "must be a finite number")),
            },
            Some(_) => {
                return Err(ApiError::bad(Some("memory_limit_MB"), "must be a number of MiB (-1: the server's)"));
            }
        };
        let mut files = Vec::new();
        let mut total = 0u64;
        match body.get("files") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                if map.len() as u64 > service.limits.max_files {
                    return Err(ApiError::bad(
                        Some("files"),
                        &format!("may name at most {} files", service.limits.max_files),
                    ));
                }
                for (name, content) in map {
                    let field = format!("files.{name}");
                    if inside_workdir(name).is_none() {
                        return Err(ApiError::bad(
                            Some(&field),
                            "must be a relative path inside the run's directory (no `..`)",
                        ));
                    }
                    let bytes = match content {
                        // SandboxFusion's `Optional[str]`: nothing to write.
                        Value::Null => continue,
                        Value::String(text) => BASE64
                            .decode(text.as_bytes())
                            .map_err(|e| ApiError::bad(Some(&field), &format!("must be base64: {e}")))?,
                        _ => return Err(ApiError::bad(Some(&field), "must be a base64 string")),
                    };
                    total += bytes.len() as u64;
                    if total > service.limits.max_files_bytes {
                        return Err(ApiError::bad(
                            Some("files"),
                            &format!("hold more than {} bytes together", service.limits.max_files_bytes),
                        ));
                    }
                    files.push((name.clone(), bytes));
                }
            }
            Some(_) => return Err(ApiError::bad(Some("files"), "must be an object: path -> base64 content")),
        }
        let fetch_files = match body.get("fetch_files") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(items)) => {
                if items.len() as u64 > service.limits.max_files {
                    return Err(ApiError::bad(
                        Some("fetch_files"),
                        &format!("may name at most {} files", service.limits.max_files),
                    ));
                }
                let mut names = Vec::with_capacity(items.len());
                for (index, item) in items.iter().enumerate() {
                    match item.as_str().filter(|name| inside_workdir(name).is_some()) {
                        Some(name) => names.push(name.to_string()),
                        None => {
                            return Err(ApiError::bad(
                                Some(&format!("fetch_files[{index}]")),
                                "must be a relative path inside the run's directory (no `..`)",
                            ));
                        }
                    }
                }
                names
            }
            Some(_) => return Err(ApiError::bad(Some("fetch_files"), "must be a list of paths")),
        };
        Ok(RunCodeRequest {
            code,
            language,
            stdin: string("stdin")?.unwrap_or_default(),
            run_timeout,
            memory_mib,
            files,
            fetch_files,
        })
    }
}

/// The files a request fetches, base64, read without following links; what is missing, not
/// a plain file, or past `max_bytes` in all is left out (SandboxFusion leaves out what it
/// cannot read).
fn fetch(workdir: &Workdir, names: &[String], max_bytes: u64) -> Map<String, Value> {
    let mut files = Map::new();
    let mut total = 0u64;
    for name in names {
        let Some(path) = workdir.resolve(name) else { continue };
        let Ok(meta) = path.symlink_metadata() else { continue };
        if !meta.is_file() || total + meta.len() > max_bytes || has_link_above(workdir, &path) {
            continue;
        }
        if let Ok(bytes) = std::fs::read(&path) {
            total += bytes.len() as u64;
            files.insert(name.clone(), Value::String(BASE64.encode(bytes)));
        }
    }
    files
}

/// Whether a directory between the run's directory and `path` is a link (a program could
/// link `out` to `/etc` and ask the host to read `out/passwd` for it).
fn has_link_above(workdir: &Workdir, path: &std::path::Path) -> bool {
    let mut dir = path.parent();
    while let Some(current) = dir {
        if current == workdir.path {
            return false;
        }
        if current.symlink_metadata().map_or(true, |meta| !meta.is_dir()) {
            return true;
        }
        dir = current.parent();
    }
    true
}

/// SandboxFusion's answer for a program that ran.
fn answer(outcome: &Outcome, files_over: Option<String>, memory_mib: u64, files: Map<String, Value>) -> Value {
    // SandboxFusion's command statuses: Finished (it ended by itself, whatever its code),
    // TimeLimitExceeded, Error (it could not run or was stopped). A stopped program gets the
    // code a killed process would: 137 (SIGKILL, as an OOM kill reports it).
    let (status, code, why) = match &outcome.termination {
        Termination::Exited(code) => ("Finished", *code, None),
        Termination::TimedOut => ("TimeLimitExceeded", -1, Some("ran past its run_timeout".to_string())),
        Termination::OutOfFuel => ("TimeLimitExceeded", -1, Some("used up its instruction budget".to_string())),
        Termination::OutOfMemory => ("Finished", 137, Some(format!("ran out of memory (limit {memory_mib} MiB)"))),
        Termination::OutputLimit => (
            "Error",
            137,
            Some(files_over.unwrap_or_else(|| "printed more than the output limit; it was stopped".to_string())),
        ),
        Termination::Crashed(how) => ("Error", 1, Some(format!("the interpreter crashed: {how}"))),
    };
    let timed_out = status == "TimeLimitExceeded";
    let success = status == "Finished" && code == 0;
    json!({
        "status": if success { "Success" } else { "Failed" },
        "message": why.unwrap_or_default(),
        "compile_result": null,
        "run_result": {
            "status": status,
            "execution_time": f64::from(outcome.duration_ms) / 1000.0,
            "return_code": if timed_out { Value::Null } else { json!(code) },
            "stdout": outcome.stdout,
            "stderr": outcome.stderr,
        },
        "executor_pod_name": null,
        "files": files,
    })
}

async fn run_code(State(service): State<Arc<CodeService>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let refused = |error: ApiError| {
        service.refused.fetch_add(1, Ordering::Relaxed);
        error
    };
    let request = RunCodeRequest::read(&body, &service).map_err(refused)?;
    let permit = service.admit().await.map_err(refused)?;
    let runs = service.clone();
    let answered = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        runs.run(request)
    })
    .await
    .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("the run failed: {e}")))?;
    answered.map(Json)
}

/// `/run_code` and SandboxFusion's other routes (refused by name), over `service`, to merge
/// into a router of any state.
pub fn routes<S: Clone + Send + Sync + 'static>(service: Arc<CodeService>) -> Router<S> {
    let mut router = Router::new()
        .route("/run_code", post(run_code))
        .route("/v1/ping", get(|| async { "pong" }))
        .route("/v1/status", get(|State(service): State<Arc<CodeService>>| async move { Json(service.status()) }));
    for (route, why) in NOT_SERVED {
        let message = format!("{route} is not served by wirl: {why}");
        router = router.route(
            route,
            axum::routing::any(move || {
                let message = message.clone();
                async move { ApiError::with_status(StatusCode::NOT_IMPLEMENTED, message) }
            }),
        );
    }
    router.with_state(service)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_that_could_not_start_is_a_sandbox_error_and_a_timeout_has_no_code() {
        let outcome = Outcome {
            termination: Termination::TimedOut,
            stdout: "partial".into(),
            stderr: String::new(),
            truncated: false,
            duration_ms: 1500,
        };
        let value = answer(&outcome, None, 512, Map::new());
        assert_eq!(value["status"], "Failed");
        assert_eq!(value["run_result"]["status"], "TimeLimitExceeded");
        assert_eq!(value["run_result"]["return_code"], Value::Null);
        assert_eq!(value["run_result"]["stdout"], "partial");
        assert_eq!(value["run_result"]["execution_time"], 1.5);
        let exited = Outcome { termination: Termination::Exited(3), ..outcome };
        let value = answer(&exited, None, 512, Map::new());
        assert_eq!((value["status"].as_str(), value["run_result"]["return_code"].as_i64()), (Some("Failed"), Some(3)));
    }

    #[test]
    fn the_waiting_bound_holds() {
        let waiting = AtomicUsize::new(0);
        let first = WaitingGuard::enter(&waiting, 2).unwrap();
        let _second = WaitingGuard::enter(&waiting, 2).unwrap();
        assert!(WaitingGuard::enter(&waiting, 2).is_none());
        drop(first);
        assert!(WaitingGuard::enter(&waiting, 2).is_some());
    }
}
