//! One plugin call under limits: the store's state, the guards that watch memory and
//! prints, how a call is bounded in time, and the verdict when a call fails.
//!
//! Time: every export is called asynchronously (`bounded`) on the sandbox's own runtime,
//! raced against a timer at the call's deadline and the sandbox's [`Interrupter`]. When
//! either fires, the call's future is dropped, which unwinds the guest wherever it is —
//! running its own code, or waiting inside a WASI import (a clock pollable, a sleep, a
//! stream). Guest code that never yields is stopped by the epoch callback, which checks the
//! same deadline and interrupt every few milliseconds of guest execution.

use crate::bindings::reward_world::wirl::rl::config;
use crate::limits::Limits;
use bytes::Bytes;
use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap, UpdateDeadline};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

/// Why a call produced no result. The guest's own `err` is [`FailureKind::GuestError`];
/// every other kind is the host's verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Failure {
    pub kind: FailureKind,
    pub message: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The plugin returned `err` (it judged the input unscorable).
    GuestError,
    /// The call ran past its wall-clock deadline.
    Deadline,
    /// The call used up its fuel.
    Fuel,
    /// The plugin tried to grow its memory past the limit.
    Memory,
    /// The plugin overflowed its stack.
    StackOverflow,
    /// The plugin trapped: a panic, `unreachable`, an out-of-bounds access.
    Trap,
    /// The plugin returned more bytes than allowed.
    OutputTooLarge,
    /// The plugin printed more than allowed.
    PrintLimit,
    /// The instance could not be created.
    Instantiate,
    /// The plugin returned a reward or part that is NaN or infinite.
    NonFinite,
    /// The host was asked to stop (Ctrl-C) while the call ran.
    Interrupted,
    /// The host could not do what the plugin asked of it (a grader's code runner lost its
    /// worker, or had no instance to give): not the plugin's failure, nor the completion's.
    Infrastructure,
}

impl FailureKind {
    pub fn name(self) -> &'static str {
        match self {
            FailureKind::GuestError => "guest_error",
            FailureKind::Deadline => "deadline",
            FailureKind::Fuel => "fuel",
            FailureKind::Memory => "memory",
            FailureKind::StackOverflow => "stack_overflow",
            FailureKind::Trap => "trap",
            FailureKind::OutputTooLarge => "output_too_large",
            FailureKind::PrintLimit => "print_limit",
            FailureKind::Instantiate => "instantiate",
            FailureKind::NonFinite => "non_finite",
            FailureKind::Interrupted => "interrupted",
            FailureKind::Infrastructure => "infrastructure",
        }
    }
}

impl Failure {
    pub fn guest(message: String) -> Self {
        Failure { kind: FailureKind::GuestError, message }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind.name(), self.message)
    }
}

/// Time spent in the last call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CallStats {
    /// Creating the instance (zero when an instance was reused).
    pub instantiate: Duration,
    /// The call itself.
    pub call: Duration,
}

/// Everything a plugin's store holds.
pub(crate) struct HostState {
    wasi: WasiCtx,
    /// WASI 0.1 for a core-module runner (CRuby); none for components.
    pub(crate) wasi_p1: Option<wasmtime_wasi::p1::WasiP1Ctx>,
    table: ResourceTable,
    pub(crate) limiter: MemoryGuard,
    config: Arc<serde_json::Map<String, serde_json::Value>>,
    pub(crate) stdout: BoundedOutput,
    pub(crate) stderr: BoundedOutput,
    /// Where a grader's `code-runner` import sends programs; none for other worlds.
    pub(crate) runner: Option<Arc<crate::CodeRunnerPlugin>>,
    /// When the current call must end (set by `arm`), not counting time paused.
    pub(crate) deadline_at: Instant,
    /// Time the deadline does not count: an agent's waits for the engine.
    pub(crate) paused: Arc<PausedClock>,
    /// Where an agent's `inference` import generates; none for other worlds.
    pub(crate) inference: Option<Arc<dyn crate::inference::InferenceHost>>,
    pub(crate) interrupt: Interrupter,
    /// A code run's working directory, measured as the program runs; none for others.
    pub(crate) workdir: Option<crate::workdir::WorkdirWatch>,
}

/// Time a call spends waiting for the host on the guest's behalf (an agent's generation),
/// which its deadline does not count: the deadline limits the plugin's own work.
#[derive(Debug, Default)]
pub(crate) struct PausedClock(Mutex<(Duration, Option<Instant>)>);

impl PausedClock {
    /// Stop counting until the returned guard is dropped.
    pub(crate) fn pause(self: &Arc<Self>) -> PauseGuard {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).1 = Some(Instant::now());
        PauseGuard(self.clone())
    }

    /// Time paused so far, a pause in progress included.
    pub(crate) fn paused(&self, now: Instant) -> Duration {
        let (total, since) = *self.0.lock().unwrap_or_else(|e| e.into_inner());
        total + since.map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    fn reset(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = (Duration::ZERO, None);
    }
}

/// Ends a pause of a [`PausedClock`].
pub(crate) struct PauseGuard(Arc<PausedClock>);

impl Drop for PauseGuard {
    fn drop(&mut self) {
        let mut clock = self.0.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(since) = clock.1.take() {
            clock.0 += since.elapsed();
        }
    }
}

impl HostState {
    pub(crate) fn new(
        wasi: WasiCtx,
        limits: &Limits,
        config: Arc<serde_json::Map<String, serde_json::Value>>,
        stdout: BoundedOutput,
        stderr: BoundedOutput,
        runner: Option<Arc<crate::CodeRunnerPlugin>>,
        interrupt: Interrupter,
    ) -> Self {
        HostState {
            deadline_at: Instant::now() + limits.deadline(),
            paused: Arc::default(),
            inference: None,
            interrupt,
            wasi,
            wasi_p1: None,
            table: ResourceTable::new(),
            limiter: MemoryGuard { limit: limits.memory_bytes as usize, denied: None },
            config,
            stdout,
            stderr,
            runner,
            workdir: None,
        }
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView { ctx: &mut self.wasi, table: &mut self.table }
    }
}

impl config::Host for HostState {
    fn get(&mut self, key: String) -> Option<String> {
        self.config.get(&key).map(|value| value.to_string())
    }
}

/// 0.2.0's `config`: the same settings under its own interface name.
impl crate::bindings::reward_world_v0_2::wirl::rl::config::Host for HostState {
    fn get(&mut self, key: String) -> Option<String> {
        config::Host::get(self, key)
    }
}

/// Denies memory growth past the plugin's limit and remembers that it did, so that the
/// trap that usually follows (an allocation failure aborts) is reported as `memory`.
pub(crate) struct MemoryGuard {
    limit: usize,
    pub(crate) denied: Option<usize>,
}

impl ResourceLimiter for MemoryGuard {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            self.denied = Some(desired);
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Tables hold function references; a million entries is far past any real plugin.
        Ok(desired <= 1_000_000)
    }
}

/// A guest's stdout or stderr: keeps what was printed up to a limit; one byte more and the
/// call traps with `print_limit`, so printing without end fails fast.
#[derive(Clone)]
pub(crate) struct BoundedOutput(Arc<Mutex<Printed>>);

struct Printed {
    bytes: Vec<u8>,
    limit: usize,
    exceeded: bool,
}

impl BoundedOutput {
    pub(crate) fn new(limit: u64) -> Self {
        BoundedOutput(Arc::new(Mutex::new(Printed { bytes: Vec::new(), limit: limit as usize, exceeded: false })))
    }

    /// Take what was printed so far, and clear the exceeded flag for the next call.
    pub(crate) fn take(&self) -> (String, bool) {
        let mut printed = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let text = String::from_utf8_lossy(&printed.bytes).into_owned();
        printed.bytes.clear();
        (text, std::mem::take(&mut printed.exceeded))
    }

    pub(crate) fn exceeded(&self) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).exceeded
    }

    /// Append what fits; say whether everything did.
    fn append(&self, data: &[u8]) -> bool {
        let mut printed = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let room = printed.limit.saturating_sub(printed.bytes.len());
        let kept = data.len().min(room);
        printed.bytes.extend_from_slice(&data[..kept]);
        if kept < data.len() {
            printed.exceeded = true;
        }
        kept == data.len()
    }

    fn limit(&self) -> usize {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).limit
    }

    /// Bytes that may still be printed.
    fn room(&self) -> usize {
        let printed = self.0.lock().unwrap_or_else(|e| e.into_inner());
        printed.limit.saturating_sub(printed.bytes.len())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for BoundedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for BoundedOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        if self.append(&bytes) {
            Ok(())
        } else {
            Err(StreamError::Trap(wasmtime::format_err!("printed more than {} bytes", self.limit())))
        }
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        // Permit one byte past what is left: a write that fits goes whole, one that does not
        // traps in `write` (`print_limit`). A guest writes at most the permit and some never
        // retry the rest (CPython's unbuffered stdout drops it), so a fixed permit of 64 KiB
        // cut one large print silently and the program "exited(0)" with half its output. A
        // zero permit would make the guest wait for readiness until its deadline instead.
        Ok(self.room().saturating_add(1))
    }
}

impl tokio::io::AsyncWrite for BoundedOutput {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.append(buf) {
            std::task::Poll::Ready(Ok(buf.len()))
        } else {
            std::task::Poll::Ready(Err(std::io::Error::other("print limit exceeded")))
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

impl IsTerminal for BoundedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for BoundedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

/// How often, in epoch ticks of guest execution, the epoch callback checks the deadline and
/// the interrupt: the latency of stopping guest code that never yields.
const CHECK_TICKS: u64 = 10;

/// Install the epoch callback of a new store: it ends guest code past the store's deadline
/// (`Trap::Interrupt`, named `deadline`) or when the sandbox is interrupted.
pub(crate) fn install_deadline_check(store: &mut Store<HostState>, epoch_tick_ms: u64) {
    let tick = epoch_tick_ms.max(1);
    store.epoch_deadline_callback(move |mut context| {
        let now = Instant::now();
        let state = context.data_mut();
        if state.interrupt.is_interrupted() {
            return Err(Cut::Interrupted.into());
        }
        if state.workdir.as_mut().is_some_and(|watch| watch.check(now)) {
            return Err(Cut::Files.into());
        }
        let deadline_at = state.deadline_at.checked_add(state.paused.paused(now)).unwrap_or_else(far_future);
        if now >= deadline_at {
            return Ok(UpdateDeadline::Interrupt);
        }
        let left_ms = u64::try_from((deadline_at - now).as_millis()).unwrap_or(u64::MAX);
        Ok(UpdateDeadline::Continue(left_ms.div_ceil(tick).clamp(1, CHECK_TICKS)))
    });
}

/// Arm a store for the next call: a fresh deadline and fuel, cleared guards.
pub(crate) fn arm(store: &mut Store<HostState>, limits: &Limits, epoch_tick_ms: u64, fuel_enabled: bool) {
    let ticks = limits.deadline_ms.div_ceil(epoch_tick_ms.max(1)).saturating_add(1);
    store.set_epoch_deadline(ticks.min(CHECK_TICKS));
    // A deadline too far to represent is no deadline: it stays at the far future.
    store.data_mut().deadline_at = Instant::now().checked_add(limits.deadline()).unwrap_or_else(far_future);
    store.data().paused.reset();
    if fuel_enabled {
        // Without a fuel limit the budget is effectively unlimited; the deadline still holds.
        let _ = store.set_fuel(limits.fuel.unwrap_or(u64::MAX));
    }
    store.data_mut().limiter.denied = None;
}

fn far_future() -> Instant {
    Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600)
}

/// Why the host cut a call short (the error a bounded call ends with).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Cut {
    #[error("the call ran past its deadline")]
    Deadline,
    #[error("the host was interrupted")]
    Interrupted,
    #[error("the program's files went past their bounds")]
    Files,
}

/// Stops every call of a sandbox's plugins within milliseconds, wherever the guests are
/// (running, or blocked in a host call), for as long as it is set. Cheap to clone; a
/// signal handler's flag can be forwarded to it from a thread.
#[derive(Clone, Debug, Default)]
pub struct Interrupter(Arc<AtomicBool>);

impl Interrupter {
    /// Cut every running call (`interrupted`) and fail every new one until [`clear`]ed.
    ///
    /// [`clear`]: Interrupter::clear
    pub fn interrupt(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn clear(&self) {
        self.0.store(false, Ordering::SeqCst);
    }

    pub fn is_interrupted(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Resolves once interrupted (checked every few milliseconds).
    async fn interrupted(&self) {
        while !self.is_interrupted() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// The runtime that plugin calls (and the WASI imports they wait in) run on, with the process
/// that started it. Its one worker drives timers and I/O; a call itself runs on the calling
/// thread (`block_on`). A forked child (Python's `multiprocessing`) does not inherit the
/// worker thread, so a runtime is per process: the child starts its own, and leaves the
/// parent's alone (dropping it would wait for a thread the child does not have).
static RUNTIME: Mutex<Option<(u32, &'static tokio::runtime::Runtime)>> = Mutex::new(None);

fn runtime() -> &'static tokio::runtime::Runtime {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|e| e.into_inner());
    match *slot {
        Some((owner, runtime)) if owner == pid => runtime,
        _ => {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("wirl-sandbox-io")
                .enable_all()
                .build()
                .expect("starting the sandbox's tokio runtime");
            let runtime: &'static tokio::runtime::Runtime = Box::leak(Box::new(runtime));
            *slot = Some((pid, runtime));
            runtime
        }
    }
}

/// Run a plugin call to completion from synchronous code. Not to be called from inside an
/// async runtime (use `spawn_blocking` there).
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    runtime().block_on(future)
}

/// Run `call` on `store` until it returns, its deadline passes or the sandbox is
/// interrupted, whichever comes first; the two last end it with a [`Cut`] error.
pub(crate) async fn bounded<R>(
    store: &mut Store<HostState>,
    call: impl AsyncFnOnce(&mut Store<HostState>) -> wasmtime::Result<R>,
) -> wasmtime::Result<R> {
    let deadline_at = store.data().deadline_at;
    let paused = store.data().paused.clone();
    let interrupt = store.data().interrupt.clone();
    if interrupt.is_interrupted() {
        return Err(Cut::Interrupted.into());
    }
    // The deadline moves on by the time paused (an agent waiting for the engine).
    let deadline = async move {
        loop {
            let now = Instant::now();
            let at = deadline_at.checked_add(paused.paused(now)).unwrap_or_else(far_future);
            if now >= at {
                break;
            }
            tokio::time::sleep_until(at.into()).await;
        }
    };
    tokio::select! {
        biased;
        result = call(store) => result,
        () = deadline => Err(Cut::Deadline.into()),
        () = interrupt.interrupted() => Err(Cut::Interrupted.into()),
    }
}

/// Name what went wrong in a call that failed with `error`.
pub(crate) fn classify(store: &Store<HostState>, error: &wasmtime::Error, limits: &Limits) -> Failure {
    let state = store.data();
    let trap = error.downcast_ref::<Trap>().copied();
    let cut = error.downcast_ref::<Cut>().copied();
    let runner = error.downcast_ref::<crate::code_runner::RunnerFailure>();
    let (kind, message) = if cut == Some(Cut::Interrupted) {
        (FailureKind::Interrupted, "the host was interrupted during the call".to_string())
    } else if let Some(failure) = runner {
        (FailureKind::Infrastructure, failure.to_string())
    } else if trap == Some(Trap::Interrupt) || cut == Some(Cut::Deadline) {
        (FailureKind::Deadline, format!("ran past its deadline of {} ms", limits.deadline_ms))
    } else if trap == Some(Trap::OutOfFuel) {
        (FailureKind::Fuel, format!("used up its fuel of {}", limits.fuel.unwrap_or(u64::MAX)))
    } else if let Some(wanted) = state.limiter.denied {
        (
            FailureKind::Memory,
            format!(
                "tried to grow its memory to {} MiB, past the limit of {} MiB",
                wanted >> 20,
                limits.memory_bytes >> 20
            ),
        )
    } else if let (Some(Cut::Files), Some(why)) = (cut, state.workdir.as_ref().and_then(|w| w.over.as_ref())) {
        (FailureKind::PrintLimit, why.clone())
    } else if state.stdout.exceeded() || state.stderr.exceeded() {
        (FailureKind::PrintLimit, format!("printed more than {} bytes", limits.max_print_bytes))
    } else if trap == Some(Trap::StackOverflow) {
        (FailureKind::StackOverflow, "overflowed its stack".to_string())
    } else {
        let what = match trap {
            // Rust and C keep their stack in linear memory below the data; overflowing it
            // runs off the start of memory.
            Some(Trap::MemoryOutOfBounds) => {
                format!("{} (also how a Rust or C guest's overflowing shadow stack ends)", Trap::MemoryOutOfBounds)
            }
            Some(trap) => trap.to_string(),
            None => first_line(&format!("{error:#}")),
        };
        (FailureKind::Trap, what)
    };
    Failure { kind, message }
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}

/// The last few lines of what a guest printed to stderr: where a Rust panic message goes.
pub(crate) fn stderr_tail(stderr: &str) -> Option<String> {
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    if lines.is_empty() {
        return None;
    }
    let tail = &lines[lines.len().saturating_sub(3)..];
    Some(tail.join(" | ").chars().take(500).collect())
}
