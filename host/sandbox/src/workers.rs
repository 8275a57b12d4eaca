//! Code programs in worker processes: a pool of children of the host's own binary, each
//! loading the code-runner component from the compiled cache and running one program at a
//! time in a fresh instance, exactly as [`CodeRunnerPlugin`] does in process.
//!
//! Why processes: instances created and dropped by several threads of one process contend in
//! the kernel (page faults and `madvise` on one address space), so two threads ran programs
//! only 1.2× as fast as one; separate processes scale as `python3` subprocesses do. A child
//! is also one more wall between model-written code and the trainer: a wasmtime bug that
//! escaped an instance would land in a process that holds nothing but the interpreter.
//!
//! The protocol is JSON lines over the child's stdin and stdout: a hello (the runner's file,
//! its configured limits, the sandbox settings and the component's sha256) answered by
//! `ready` or `refused`, then one request (program and requested limits) per line, each
//! answered by one outcome. The parent bounds every answer by the program's deadline plus a
//! margin; a child that overruns it, dies or answers nonsense is killed, the run fails with
//! a [`RunnerFailure`] saying what happened (the host's failure: a grader's call fails with
//! it rather than judging the program by it), and the next program gets a fresh child. A
//! dropped wait (the grader's own deadline) kills its child too, so no late answer can reach
//! the next program.
//!
//! The host binary must answer the command registered with [`register_worker_command`] by
//! calling [`serve_code_worker`] (wirl's is the hidden `wirl code-worker`).

use crate::code_runner::RunnerFailure;
use crate::limits::{Limits, SandboxSettings};
use crate::{CodeRunnerPlugin, Error, Outcome, Program, RunLimits, Sandbox, Workdir};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The most worker processes one code runner may have.
pub const MAX_WORKERS: usize = 64;

/// How long a child may take to start and load the runner (from the compiled cache, a few
/// tens of milliseconds; compiling it afresh where there is no cache takes seconds, and
/// minutes in a debug build).
const START_TIMEOUT: Duration = Duration::from_secs(300);

static WORKER_COMMAND: OnceLock<Vec<OsString>> = OnceLock::new();

/// How often a wait for a child looks at the interrupter.
const INTERRUPT_POLL: Duration = Duration::from_millis(20);

/// Say how this process starts a code worker: `program` and the arguments that make it call
/// [`serve_code_worker`] on its stdin and stdout. Called once, by the host binary's `main`;
/// later calls are ignored.
pub fn register_worker_command(program: impl Into<OsString>, args: &[&str]) {
    let mut command = vec![program.into()];
    command.extend(args.iter().map(OsString::from));
    let _ = WORKER_COMMAND.set(command);
}

/// The first line a child reads.
#[derive(Serialize, Deserialize)]
struct Hello {
    runner: PathBuf,
    sha256: String,
    limits: Limits,
    settings: SandboxSettings,
}

/// The child's answer to the hello.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Greeting {
    Ready { sha256: String },
    Refused { message: String },
}

#[derive(Serialize, Deserialize)]
struct Request {
    program: Program,
    limits: RunLimits,
    /// The run's directory (the child opens it: parent and child share the filesystem).
    #[serde(default)]
    workdir: Option<Workdir>,
}

/// Answer a parent on `input` and `output` until `input` ends: the worker side of the
/// protocol. A runner that cannot be loaded is answered `refused` (the parent says why);
/// an error (for the child to print, exiting non-zero) means the hello could not be read or
/// the parent's pipe broke.
pub fn serve_code_worker(input: impl BufRead, mut output: impl Write) -> crate::Result<()> {
    let mut lines = input.lines();
    let hello = match lines.next() {
        Some(line) => line.map_err(|source| Error::WorkerPipe { what: "reading the hello", source })?,
        None => return Ok(()),
    };
    let hello: Hello = serde_json::from_str(&hello).map_err(Error::WorkerHello)?;
    let runner = match load_runner(&hello) {
        Ok(runner) => runner,
        // The parent reports it (it started this child to use the runner).
        Err(message) => return send(&mut output, &Greeting::Refused { message }),
    };
    send(&mut output, &Greeting::Ready { sha256: runner.plugin().sha256().to_string() })?;
    for line in lines {
        let line = line.map_err(|source| Error::WorkerPipe { what: "reading a request", source })?;
        // The answer is the run or the runner's failure, which the parent passes on as such.
        let answer: Result<Outcome, RunnerFailure> = match serde_json::from_str::<Request>(&line) {
            Ok(request) => runner.run_here(&request.program, &request.limits, request.workdir.as_ref()),
            Err(e) => Err(RunnerFailure(format!("the code worker got a malformed request: {e}"))),
        };
        send(&mut output, &answer)?;
    }
    Ok(())
}

fn load_runner(hello: &Hello) -> Result<CodeRunnerPlugin, String> {
    let sandbox = Sandbox::new(hello.settings.clone()).map_err(|e| e.to_string())?;
    let spec = crate::PluginSpec { limits: hello.limits.clone(), ..crate::PluginSpec::new(&hello.runner) };
    let runner = CodeRunnerPlugin::new(sandbox.load(spec).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    if runner.plugin().sha256() != hello.sha256 {
        return Err(format!(
            "{} changed since the host loaded it (sha256 {} now, {} then)",
            hello.runner.display(),
            runner.plugin().sha256(),
            hello.sha256
        ));
    }
    Ok(runner)
}

fn send(output: &mut impl Write, message: &impl Serialize) -> crate::Result<()> {
    let mut line = serde_json::to_vec(message).expect("the worker's messages serialize");
    line.push(b'\n');
    output
        .write_all(&line)
        .and_then(|()| output.flush())
        .map_err(|source| Error::WorkerPipe { what: "writing to the host", source })
}

/// The process ids of a pool's live children.
type Live = Arc<Mutex<Vec<u32>>>;

/// The worker processes of one code runner.
pub(crate) struct WorkerPool {
    command: Vec<OsString>,
    hello: String,
    /// Children waiting for a program.
    idle: Mutex<Vec<Worker>>,
    /// One permit per child that may exist.
    slots: tokio::sync::Semaphore,
    workers: usize,
    /// The longest answer line a child may write.
    reply_limit: u64,
    /// The process ids of the children alive now, idle or busy.
    live: Live,
    /// The sandbox's: set (Ctrl-C), it ends every wait for a child at once, and the child.
    interrupter: crate::Interrupter,
    /// Where the runner's bytes were written when it was not loaded from a file; removed
    /// with the pool.
    _component: Option<tempfile::TempPath>,
}

impl WorkerPool {
    /// Start `workers` children for the runner loaded as `runner`; an error says why the
    /// first one that failed could not start.
    pub(crate) fn start(
        runner: &crate::Plugin,
        settings: &SandboxSettings,
        interrupter: crate::Interrupter,
        workers: usize,
    ) -> Result<Self, String> {
        let command = WORKER_COMMAND.get().cloned().ok_or_else(|| {
            "this program cannot start code workers (it registered no worker command); set `workers = 0` \
             to run programs in process"
                .to_string()
        })?;
        if workers == 0 || workers > MAX_WORKERS {
            return Err(format!("workers = {workers}: give 1 to {MAX_WORKERS} (0 runs programs in process)"));
        }
        let (path, component) = match &runner.spec.bytes {
            None => (runner.path().to_path_buf(), None),
            Some(bytes) => {
                let mut file = tempfile::NamedTempFile::new().map_err(|e| format!("a file for the runner: {e}"))?;
                file.write_all(bytes).map_err(|e| format!("writing the runner for its workers: {e}"))?;
                let path = file.into_temp_path();
                (path.to_path_buf(), Some(path))
            }
        };
        let hello = serde_json::to_string(&Hello {
            runner: path,
            sha256: runner.sha256().to_string(),
            limits: runner.limits().clone(),
            settings: settings.clone(),
        })
        .map_err(|e| e.to_string())?;
        // An outcome holds stdout and stderr, each at most `max_print_bytes`, escaped as JSON
        // (at most six bytes per byte).
        let reply_limit = 12 * runner.limits().max_print_bytes + (1 << 20);
        let live = Live::default();
        let started: Vec<Result<Worker, String>> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                (0..workers).map(|_| scope.spawn(|| Worker::start(&command, &hello, reply_limit, &live))).collect();
            handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a starter thread panicked".into()))).collect()
        });
        let idle = started.into_iter().collect::<Result<Vec<_>, _>>()?;
        Ok(WorkerPool {
            command,
            hello,
            idle: Mutex::new(idle),
            slots: tokio::sync::Semaphore::new(workers),
            workers,
            reply_limit,
            live,
            interrupter,
            _component: component,
        })
    }

    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    pub(crate) fn pids(&self) -> Vec<u32> {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Run `program` in a child; `limits` are the effective ones (what bounds the wait). An
    /// error is the pool's failure (a child that died, overran or answered nonsense), never
    /// something the program did.
    pub(crate) async fn run(
        self: &Arc<Self>,
        program: &Program,
        requested: &RunLimits,
        limits: &Limits,
        workdir: Option<&Workdir>,
    ) -> Result<Outcome, RunnerFailure> {
        let started = Instant::now();
        let Ok(_slot) = self.slots.acquire().await else {
            return Err(RunnerFailure("the code workers were shut down".into()));
        };
        let request =
            serde_json::to_string(&Request { program: program.clone(), limits: *requested, workdir: workdir.cloned() })
                .map_err(|e| RunnerFailure(format!("the program could not be sent to a code worker: {e}")))?;
        // Time to start an instance and pass the answer back, beyond the program's own.
        let bound = limits.deadline() + Duration::from_secs(2) + limits.deadline() / 4;
        let pool = self.clone();
        let waited = tokio::task::spawn_blocking(move || {
            let waiting = pool.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
            // A child that died while idle (killed from outside, the OOM killer) is replaced
            // before it is handed a program.
            let waiting = waiting.and_then(|mut worker| worker.alive().then_some(worker));
            let mut worker = match waiting {
                Some(worker) => worker,
                None => Worker::start(&pool.command, &pool.hello, pool.reply_limit, &pool.live)?,
            };
            let reply = worker.ask_unless(request, bound, &pool.interrupter)?;
            Ok::<_, String>((worker, reply))
        })
        .await;
        let (worker, reply) = match waited {
            Ok(Ok(answered)) => answered,
            Ok(Err(lost)) => return Err(RunnerFailure(lost)),
            Err(e) => return Err(RunnerFailure(format!("waiting for a code worker: {e}"))),
        };
        match serde_json::from_str::<Result<Outcome, RunnerFailure>>(&reply) {
            Ok(answer) => {
                self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(worker);
                let mut outcome = answer?;
                outcome.duration_ms = u32::try_from(started.elapsed().as_millis()).unwrap_or(u32::MAX);
                Ok(outcome)
            }
            // The child is dropped (killed): it no longer speaks the protocol.
            Err(e) => Err(RunnerFailure(format!("code worker (pid {}) answered nonsense: {e}", worker.pid))),
        }
    }
}

/// One child, with a thread writing its requests and one reading its answers, so that a
/// child that stops reading or writing can never block the host past a deadline.
struct Worker {
    child: Child,
    pid: u32,
    live: Live,
    requests: Option<mpsc::Sender<String>>,
    replies: mpsc::Receiver<Result<String, String>>,
}

impl Worker {
    /// Spawn a child and wait for its greeting.
    fn start(command: &[OsString], hello: &str, reply_limit: u64, live: &Live) -> Result<Worker, String> {
        let (program, args) = command.split_first().ok_or("an empty worker command")?;
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start a code worker ({}): {e}", program.to_string_lossy()))?;
        let pid = child.id();
        live.lock().unwrap_or_else(|e| e.into_inner()).push(pid);
        let live = live.clone();
        let stdin = child.stdin.take().expect("piped");
        let stdout = child.stdout.take().expect("piped");
        let (requests, to_write) = mpsc::channel::<String>();
        let (answered, replies) = mpsc::channel();
        std::thread::Builder::new()
            .name(format!("code-worker-{pid}-in"))
            .spawn(move || write_requests(stdin, to_write))
            .map_err(|e| format!("a thread for a code worker: {e}"))?;
        std::thread::Builder::new()
            .name(format!("code-worker-{pid}-out"))
            .spawn(move || read_replies(stdout, reply_limit, answered))
            .map_err(|e| format!("a thread for a code worker: {e}"))?;
        let mut worker = Worker { child, pid, live, requests: Some(requests), replies };
        let greeting = worker.ask(hello.to_string(), START_TIMEOUT)?;
        match serde_json::from_str::<Greeting>(&greeting) {
            Ok(Greeting::Ready { .. }) => Ok(worker),
            Ok(Greeting::Refused { message }) => Err(format!("a code worker could not load the runner: {message}")),
            Err(e) => Err(format!("a code worker (pid {pid}) greeted with nonsense: {e}")),
        }
    }

    /// Send one line and wait up to `timeout` for one answer. An error says what became of
    /// the child; the caller drops (kills) it.
    fn ask(&mut self, line: String, timeout: Duration) -> Result<String, String> {
        self.ask_unless(line, timeout, &crate::Interrupter::default())
    }

    /// [`Worker::ask`], given up as soon as `interrupter` is set (looked at every
    /// [`INTERRUPT_POLL`]): Ctrl-C does not wait for a program's whole timeout.
    fn ask_unless(
        &mut self,
        line: String,
        timeout: Duration,
        interrupter: &crate::Interrupter,
    ) -> Result<String, String> {
        let sent = self.requests.as_ref().is_some_and(|requests| requests.send(line).is_ok());
        let until = Instant::now() + timeout;
        let reply = loop {
            if !sent {
                break Err(mpsc::RecvTimeoutError::Disconnected);
            }
            if interrupter.is_interrupted() {
                return Err(format!("interrupted; code worker (pid {}) was stopped", self.pid));
            }
            let left = until.saturating_duration_since(Instant::now());
            match self.replies.recv_timeout(left.min(INTERRUPT_POLL)) {
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => continue,
                other => break other,
            }
        };
        match reply {
            Ok(Ok(reply)) => Ok(reply),
            Err(mpsc::RecvTimeoutError::Timeout) => Err(format!(
                "code worker (pid {}) did not answer within {} ms; it was stopped and will be replaced",
                self.pid,
                timeout.as_millis()
            )),
            Ok(Err(why)) => {
                let status = self.stop();
                Err(format!("code worker (pid {}) failed mid-program: {why} ({status}); it will be replaced", self.pid))
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = self.stop();
                Err(format!("code worker (pid {}) is gone ({status}); it will be replaced", self.pid))
            }
        }
    }

    /// Whether the child still runs (an idle one may have been killed from outside).
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Kill the child (if it still runs) and say how it ended.
    fn stop(&mut self) -> String {
        self.requests = None;
        if let Ok(Some(status)) = self.child.try_wait() {
            return status.to_string();
        }
        let _ = self.child.kill();
        match self.child.wait() {
            Ok(status) => status.to_string(),
            Err(e) => format!("its status is unknown: {e}"),
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop();
        self.live.lock().unwrap_or_else(|e| e.into_inner()).retain(|&pid| pid != self.pid);
    }
}

fn write_requests(mut stdin: ChildStdin, requests: mpsc::Receiver<String>) {
    for mut line in requests {
        line.push('\n');
        if stdin.write_all(line.as_bytes()).and_then(|()| stdin.flush()).is_err() {
            return;
        }
    }
}

/// Forward each line the child writes; end with an error when its stdout closes or a line
/// is longer than `limit` bytes (what the runner's output limits allow, escaped as JSON), so
/// that a child gone wrong cannot exhaust the host's memory.
fn read_replies(stdout: impl Read, limit: u64, replies: mpsc::Sender<Result<String, String>>) {
    let mut stdout = BufReader::new(stdout);
    let why = loop {
        let mut line = String::new();
        match (&mut stdout).take(limit + 1).read_line(&mut line) {
            Ok(0) => break "its output ended".to_string(),
            Ok(_) if line.ends_with('\n') => {
                line.pop();
                if replies.send(Ok(line)).is_err() {
                    return;
                }
            }
            Ok(_) => break format!("it wrote an answer longer than {limit} bytes"),
            Err(e) => break format!("its answer could not be read: {e}"),
        }
    };
    let _ = replies.send(Err(why));
}
