//! One plugin call under limits: the store's state, the guards that watch memory and
//! prints, and the verdict when a call fails.

use crate::bindings::reward_world::wirl::rl::config;
use crate::limits::Limits;
use bytes::Bytes;
use serde::Serialize;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use wasmtime::component::ResourceTable;
use wasmtime::{ResourceLimiter, Store, Trap};
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
    table: ResourceTable,
    pub(crate) limiter: MemoryGuard,
    config: Arc<serde_json::Map<String, serde_json::Value>>,
    pub(crate) stdout: BoundedOutput,
    pub(crate) stderr: BoundedOutput,
    /// Where a grader's `code-runner` import sends programs; none for other worlds.
    pub(crate) runner: Option<Arc<crate::CodeRunnerPlugin>>,
}

impl HostState {
    pub(crate) fn new(
        wasi: WasiCtx,
        limits: &Limits,
        config: Arc<serde_json::Map<String, serde_json::Value>>,
        stdout: BoundedOutput,
        stderr: BoundedOutput,
        runner: Option<Arc<crate::CodeRunnerPlugin>>,
    ) -> Self {
        HostState {
            wasi,
            table: ResourceTable::new(),
            limiter: MemoryGuard { limit: limits.memory_bytes as usize, denied: None },
            config,
            stdout,
            stderr,
            runner,
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
        // Always permit a write: the limit is enforced in `write`, which traps. A zero
        // permit would make the guest wait for readiness until its deadline instead.
        Ok(64 << 10)
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

/// Arm a store for the next call: a fresh deadline and fuel, cleared guards.
pub(crate) fn arm(store: &mut Store<HostState>, limits: &Limits, epoch_tick_ms: u64, fuel_enabled: bool) {
    let ticks = limits.deadline_ms.div_ceil(epoch_tick_ms.max(1)) + 1;
    store.set_epoch_deadline(ticks);
    if fuel_enabled {
        // Without a fuel limit the budget is effectively unlimited; the deadline still holds.
        let _ = store.set_fuel(limits.fuel.unwrap_or(u64::MAX));
    }
    store.data_mut().limiter.denied = None;
}

/// Name what went wrong in a call that failed with `error`.
pub(crate) fn classify(store: &Store<HostState>, error: &wasmtime::Error, limits: &Limits) -> Failure {
    let state = store.data();
    let trap = error.downcast_ref::<Trap>().copied();
    let (kind, message) = if trap == Some(Trap::Interrupt) {
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
