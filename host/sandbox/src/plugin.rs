//! A loaded plugin: its component, identity, world, and how to make a store for it.

use crate::call::{self, BoundedOutput, Failure, FailureKind, HostState, Interrupter};
use crate::limits::{Grants, Limits};
use crate::world::World;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wasmtime::component::InstancePre;
use wasmtime::{Engine, Store};
use wasmtime_wasi::{FsPerms, WasiCtxBuilder};

/// What to load and how to run it: one plugin entry of the wirl config.
#[derive(Clone, Debug)]
pub struct PluginSpec {
    /// The name in logs, metrics and errors.
    pub name: String,
    /// The `.wasm` component; for a spec with [`PluginSpec::bytes`], only its name in
    /// messages (`builtin:math-answer`).
    pub path: PathBuf,
    /// The component itself, when it is not read from `path` (a plugin built into the
    /// binary).
    pub bytes: Option<Arc<[u8]>>,
    pub limits: Limits,
    pub grants: Grants,
    /// The plugin's own settings, readable through `wirl:rl/config`.
    pub config: serde_json::Map<String, serde_json::Value>,
    /// For a grader: the interpreter component its `code-runner` import runs programs in,
    /// each in a fresh instance under the runner's own limits.
    pub code_runner: Option<Box<PluginSpec>>,
    /// For a code runner: the worker processes its programs run in (0: in this process).
    pub workers: usize,
}

impl PluginSpec {
    /// A spec with default limits, no grants and no config, named after the file.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        let path = path.into();
        let name = path.file_stem().map_or_else(|| "plugin".to_string(), |s| s.to_string_lossy().into_owned());
        PluginSpec {
            name,
            path,
            bytes: None,
            limits: Limits::default(),
            grants: Grants::default(),
            config: Default::default(),
            code_runner: None,
            workers: 0,
        }
    }

    /// A spec for a component held in memory, called `name` and shown as `label`.
    pub fn from_bytes(name: &str, label: &str, bytes: Arc<[u8]>) -> Self {
        PluginSpec { name: name.to_string(), bytes: Some(bytes), ..PluginSpec::new(label) }
    }
}

/// A loaded, validated plugin. Cheap to share: instances are made from it per call.
pub struct Plugin {
    pub(crate) spec: PluginSpec,
    pub(crate) config: Arc<serde_json::Map<String, serde_json::Value>>,
    pub(crate) sha256: String,
    pub(crate) size: u64,
    pub(crate) world: World,
    pub(crate) wit_version: String,
    pub(crate) imports: Vec<String>,
    pub(crate) exports: Vec<String>,
    pub(crate) engine: Engine,
    pub(crate) prepared: Prepared,
    pub(crate) epoch_tick_ms: u64,
    pub(crate) fuel_enabled: bool,
    /// A grader's code runner, loaded with it.
    pub(crate) runner: Option<Arc<crate::CodeRunnerPlugin>>,
    /// The sandbox's interrupt, which ends this plugin's calls.
    pub(crate) interrupt: Interrupter,
    /// The sandbox's instance slots: each store holds one.
    pub(crate) slots: Arc<crate::slots::Slots>,
}

/// What a plugin's file was prepared as.
pub(crate) enum Prepared {
    /// A component of a `wirl:rl` world: every plugin but one kind.
    Component(InstancePre<HostState>),
    /// CRuby's ruby.wasm, a WASI-p1 core module that the host drives as a code runner
    /// (module `ruby`); `empty_root` is the `/` of a run that has no directory of its own
    /// (CRuby always gets one preopened: its snapshot remembers the preopens).
    Ruby { pre: wasmtime::InstancePre<HostState>, empty_root: Arc<tempfile::TempDir> },
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("name", &self.spec.name)
            .field("world", &self.world)
            .field("sha256", &self.sha256)
            .finish()
    }
}

/// A store with the pool's instance slot it was made under. The slot is given back only
/// after the store is gone: wasmtime drops a store's data before it frees the store's
/// instances, so a slot kept in the data came free while the pooling allocator still
/// counted the instance, and a call that took it failed "maximum concurrent limit"
/// (4 of 300 threads on 8 slots, `plugins::three_hundred_threads_...`). Fields drop in
/// order: the store, then the slot.
pub(crate) struct SlottedStore {
    store: Store<HostState>,
    _slot: crate::slots::Slot,
}

impl std::ops::Deref for SlottedStore {
    type Target = Store<HostState>;
    fn deref(&self) -> &Store<HostState> {
        &self.store
    }
}

impl std::ops::DerefMut for SlottedStore {
    fn deref_mut(&mut self) -> &mut Store<HostState> {
        &mut self.store
    }
}

impl Plugin {
    pub fn name(&self) -> &str {
        &self.spec.name
    }
    pub fn path(&self) -> &Path {
        &self.spec.path
    }
    /// The sha256 of the component's bytes, in hex: the plugin's identity in rollouts and
    /// checkpoints.
    pub fn sha256(&self) -> &str {
        &self.sha256
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn world(&self) -> World {
        self.world
    }
    /// The `wirl:rl` version the component was built against.
    pub fn wit_version(&self) -> &str {
        &self.wit_version
    }
    /// Every import of the component, as interface names.
    pub fn imports(&self) -> &[String] {
        &self.imports
    }
    pub fn exports(&self) -> &[String] {
        &self.exports
    }
    pub fn limits(&self) -> &Limits {
        &self.spec.limits
    }
    pub fn spec(&self) -> &PluginSpec {
        &self.spec
    }
    /// A grader's code runner.
    pub fn code_runner(&self) -> Option<&Arc<crate::CodeRunnerPlugin>> {
        self.runner.as_ref()
    }

    /// The component, prepared to instantiate; an error for a plugin that is not one.
    pub(crate) fn component(&self) -> crate::Result<InstancePre<HostState>> {
        match &self.prepared {
            Prepared::Component(pre) => Ok(pre.clone()),
            Prepared::Ruby { .. } => Err(crate::Error::Refused {
                path: self.path().to_path_buf(),
                reason: "it is CRuby's core module, which runs only as a code runner".into(),
            }),
        }
    }

    /// A fresh store with this plugin's capabilities, limits and guards; armed for a call.
    pub(crate) fn new_store(&self) -> Result<SlottedStore, Failure> {
        self.new_store_with(&self.spec.limits, None)
    }

    /// A fresh store as [`Plugin::new_store`], under `limits` instead of the plugin's own.
    /// A store under `limits`; with `workdir`, that directory is the guest's `/`, read and
    /// written by it for this store only, and measured as it runs (module `workdir`).
    pub(crate) fn new_store_with(
        &self,
        limits: &Limits,
        workdir: Option<&crate::Workdir>,
    ) -> Result<SlottedStore, Failure> {
        self.new_store_reading(limits, workdir, "")
    }

    /// [`Plugin::new_store_with`] whose WASI stdin holds `stdin`: for a runner that reads a
    /// program's input from WASI (a component runner is handed it in the call instead).
    pub(crate) fn new_store_reading(
        &self,
        limits: &Limits,
        workdir: Option<&crate::Workdir>,
        stdin: &str,
    ) -> Result<SlottedStore, Failure> {
        // Waited for as part of the call: a full pool slows calls down, it does not fail them.
        let slot = self.slots.take(limits.deadline(), &self.interrupt).map_err(|no| match no {
            crate::slots::NoSlot::Interrupted => Failure {
                kind: FailureKind::Interrupted,
                message: "the host was interrupted while the call waited for an instance slot".into(),
            },
            crate::slots::NoSlot::Busy(message) => Failure { kind: FailureKind::Instantiate, message },
        })?;
        let stdout = BoundedOutput::new(limits.max_print_bytes);
        let stderr = BoundedOutput::new(limits.max_print_bytes);
        let mut wasi = WasiCtxBuilder::new();
        // No inherited environment, arguments, stdin, preopens or network: the builder's
        // defaults deny them all. Only grants open something.
        wasi.stdout(stdout.clone()).stderr(stderr.clone());
        if !stdin.is_empty() {
            wasi.stdin(wasmtime_wasi::p2::pipe::MemoryInputPipe::new(stdin.to_owned()));
        }
        if let Some(dir) = &self.spec.grants.read_only_dir {
            wasi.preopened_dir(dir, "/data", FsPerms::ReadOnly).map_err(|e| Failure {
                kind: FailureKind::Instantiate,
                message: format!("cannot grant read-only directory {}: {e}", dir.display()),
            })?;
        }
        if let Some(workdir) = workdir {
            wasi.preopened_dir(&workdir.path, "/", FsPerms::ReadWrite).map_err(|e| Failure {
                kind: FailureKind::Instantiate,
                message: format!("cannot open the run's directory {}: {e}", workdir.path.display()),
            })?;
        } else if let Prepared::Ruby { empty_root, .. } = &self.prepared {
            wasi.preopened_dir(empty_root.path(), "/", FsPerms::ReadOnly).map_err(|e| Failure {
                kind: FailureKind::Instantiate,
                message: format!("cannot open an empty directory {}: {e}", empty_root.path().display()),
            })?;
        }
        // A core module speaks WASI 0.1, whose context wraps the same capabilities.
        let (wasi, wasi_p1) = match self.prepared {
            Prepared::Component(_) => (wasi.build(), None),
            Prepared::Ruby { .. } => (WasiCtxBuilder::new().build(), Some(wasi.build_p1())),
        };
        let mut state = HostState::new(
            wasi,
            limits,
            self.config.clone(),
            stdout,
            stderr,
            self.runner.clone(),
            self.interrupt.clone(),
        );
        state.workdir = workdir.cloned().map(crate::workdir::WorkdirWatch::new);
        state.wasi_p1 = wasi_p1;
        let mut store = Store::new(&self.engine, state);
        store.limiter(|state| &mut state.limiter);
        call::install_deadline_check(&mut store, self.epoch_tick_ms);
        call::arm(&mut store, limits, self.epoch_tick_ms, self.fuel_enabled);
        Ok(SlottedStore { store, _slot: slot })
    }

    /// Arm a store for the next call.
    pub(crate) fn arm(&self, store: &mut Store<HostState>) {
        call::arm(store, &self.spec.limits, self.epoch_tick_ms, self.fuel_enabled);
    }

    /// Log what the guest printed during a call (tagged with the plugin) and return stderr's
    /// tail, which holds a panic's message.
    pub(crate) fn drain_prints(&self, store: &Store<HostState>) -> Option<String> {
        let (stdout, _) = store.data().stdout.take();
        let (stderr, _) = store.data().stderr.take();
        log_prints(&self.spec.name, "stdout", &stdout);
        log_prints(&self.spec.name, "stderr", &stderr);
        call::stderr_tail(&stderr)
    }

    /// The verdict on a failed call, with the guest's last stderr lines when it trapped.
    pub(crate) fn failure(&self, store: &Store<HostState>, error: &wasmtime::Error) -> Failure {
        let mut failure = call::classify(store, error, &self.spec.limits);
        if let Some(tail) = self.drain_prints(store)
            && matches!(failure.kind, FailureKind::Trap)
        {
            failure.message = format!("{} (stderr: {tail})", failure.message);
        }
        failure
    }

    /// Check the byte size of a result against `max_return_bytes`.
    pub(crate) fn check_return_size(&self, bytes: usize) -> Result<(), Failure> {
        let limit = self.spec.limits.max_return_bytes;
        if bytes as u64 > limit {
            return Err(Failure {
                kind: FailureKind::OutputTooLarge,
                message: format!("returned {bytes} bytes, more than the limit of {limit}"),
            });
        }
        Ok(())
    }
}

/// Log a call's prints, tagged with the plugin: the first lines and a count of the rest, so
/// that a chatty plugin cannot drown the trainer's own log.
fn log_prints(plugin: &str, stream: &str, text: &str) {
    const MAX_LINES: usize = 20;
    let mut lines = text.lines();
    for line in lines.by_ref().take(MAX_LINES) {
        tracing::info!(target: "wirl::plugin", plugin, "{stream}: {}", crate::printable(line));
    }
    let rest = lines.count();
    if rest > 0 {
        tracing::info!(target: "wirl::plugin", plugin, "{stream}: … {rest} more lines not shown");
    }
}

/// Instances of one plugin for one world's bindings `B`: a fresh one per call, or one kept
/// across calls when the plugin opts in. An instance that failed is always dropped, since a
/// trap leaves it in an unknown state.
pub(crate) struct Instances<B> {
    pub(crate) plugin: Arc<Plugin>,
    reused: Option<(SlottedStore, B)>,
    pub(crate) last: crate::CallStats,
}

impl<B> Instances<B> {
    pub(crate) fn new(plugin: Arc<Plugin>) -> Self {
        Instances { plugin, reused: None, last: Default::default() }
    }

    /// Run `call` on an instance made by `instantiate` (or the kept one), under the limits:
    /// instantiation and the call share one deadline.
    pub(crate) fn call<R>(
        &mut self,
        instantiate: impl AsyncFnOnce(&mut Store<HostState>) -> wasmtime::Result<B>,
        call: impl AsyncFnOnce(&mut Store<HostState>, &B) -> wasmtime::Result<R>,
    ) -> Result<R, Failure> {
        let started = std::time::Instant::now();
        let (mut store, bindings) = match self.reused.take() {
            Some((mut store, bindings)) => {
                self.plugin.arm(&mut store);
                (store, bindings)
            }
            None => {
                let mut store = self.plugin.new_store()?;
                match call::block_on(call::bounded(&mut store, instantiate)) {
                    Ok(bindings) => (store, bindings),
                    Err(error) => {
                        let mut failure = self.plugin.failure(&store, &error);
                        failure.message = format!("while instantiating: {}", failure.message);
                        if failure.kind == FailureKind::Trap {
                            failure.kind = FailureKind::Instantiate;
                        }
                        return Err(failure);
                    }
                }
            }
        };
        let instantiated = std::time::Instant::now();
        let result = call::block_on(call::bounded(&mut store, async |store| call(store, &bindings).await));
        self.last = crate::CallStats { instantiate: instantiated - started, call: instantiated.elapsed() };
        match result {
            Ok(value) => {
                self.plugin.drain_prints(&store);
                if self.plugin.spec.limits.reuse_instance {
                    self.reused = Some((store, bindings));
                }
                Ok(value)
            }
            Err(error) => Err(self.plugin.failure(&store, &error)),
        }
    }
}
