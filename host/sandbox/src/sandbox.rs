//! The engine that loads and runs plugins: wasmtime configured for isolation and speed.

use crate::bindings::agent_world::wirl::rl::inference;
use crate::bindings::grader_world::wirl::rl::code_runner;
use crate::bindings::reward_world::wirl::rl::config;
use crate::bindings::reward_world_v0_2::wirl::rl::config as config_v0_2;
use crate::bindings::reward_world_v0_2::wirl::rl::inference as inference_v0_2;
use crate::call::{HostState, Interrupter};
use crate::limits::SandboxSettings;
use crate::plugin::{Plugin, PluginSpec, Prepared};
use crate::world::{self, WIT_PACKAGE, World};
use crate::{Error, Result, cache};
use sha2::{Digest, Sha256};
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::{HasSelf, Linker, types::ComponentItem};
use wasmtime::{Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

const KEEP_RESIDENT: usize = 256 << 10;

/// Loads plugins and runs them. One per process is enough; plugins share its engine. A
/// clone shares everything (engine, epoch ticker, interrupt).
#[derive(Clone)]
pub struct Sandbox {
    engine: Engine,
    linker: Linker<HostState>,
    /// WASI 0.1 for the one core module wirl runs (CRuby, module `ruby`).
    module_linker: wasmtime::Linker<HostState>,
    settings: SandboxSettings,
    interrupt: Interrupter,
    /// The pool's instance slots, taken by every store (a queue when all are in use).
    slots: Arc<crate::slots::Slots>,
}

impl Sandbox {
    pub fn new(settings: SandboxSettings) -> Result<Self> {
        let mut config = Config::new();
        config.wasm_component_model(true);
        // Deadlines: guest code checks an epoch counter that a ticker thread advances.
        config.epoch_interruption(true);
        config.consume_fuel(settings.fuel);
        // Exceptions, for interpreters written in C whose errors unwind with setjmp/longjmp
        // (Lua): the compiler lowers them to wasm's `throw`/`try_table`. The exception
        // objects live in a small GC heap that reference counting frees; the GC proposal
        // itself (structs, arrays) stays off: no plugin needs it.
        config.wasm_exceptions(true);
        config.wasm_gc(false);
        config.collector(wasmtime::Collector::DeferredReferenceCounting);
        // A fresh instance per call must be cheap: the pooling allocator reuses
        // pre-reserved slots and resets memory with copy-on-write instead of mmap churn.
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(settings.max_instances);
        pool.total_core_instances(settings.max_instances * 8);
        pool.total_memories(settings.max_instances * 2);
        pool.total_tables(settings.max_instances * 8);
        pool.max_memory_size(settings.max_memory_bytes as usize);
        pool.max_memories_per_component(4);
        pool.max_tables_per_component(16);
        pool.linear_memory_keep_resident(KEEP_RESIDENT);
        pool.table_keep_resident(KEEP_RESIDENT);
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&config).map_err(|e| Error::Engine(e.into()))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(|e| Error::Engine(e.into()))?;
        config::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| Error::Engine(e.into()))?;
        config_v0_2::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| Error::Engine(e.into()))?;
        inference_v0_2::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| Error::Engine(e.into()))?;
        code_runner::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| Error::Engine(e.into()))?;
        inference::add_to_linker::<HostState, HasSelf<HostState>>(&mut linker, |state| state)
            .map_err(|e| Error::Engine(e.into()))?;

        let mut module_linker = wasmtime::Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_async(&mut module_linker, |state: &mut HostState| {
            state.wasi_p1.as_mut().expect("a core module's store is made with a WASI 0.1 context")
        })
        .map_err(|e| Error::Engine(e.into()))?;
        // WASI 0.1's `proc_exit` refuses statuses from 126 up (wasmtime makes them a trap);
        // a program's `exit 200` is its status, as a process's would be.
        module_linker.allow_shadowing(true);
        module_linker
            .func_wrap("wasi_snapshot_preview1", "proc_exit", |status: i32| -> wasmtime::Result<()> {
                Err(wasmtime_wasi::I32Exit(status & 0xff).into())
            })
            .map_err(|e| Error::Engine(e.into()))?;
        module_linker.allow_shadowing(false);

        start_epoch_ticker(&engine, Duration::from_millis(settings.epoch_tick_ms.max(1)));
        let slots = crate::slots::Slots::new(settings.max_instances);
        Ok(Sandbox { engine, linker, module_linker, settings, interrupt: Interrupter::default(), slots })
    }

    pub fn settings(&self) -> &SandboxSettings {
        &self.settings
    }

    /// The handle that cuts every call of this sandbox's plugins short (Ctrl-C).
    pub fn interrupter(&self) -> Interrupter {
        self.interrupt.clone()
    }

    /// Read, validate, compile (or take from the cache) and prepare a plugin.
    pub fn load(&self, spec: PluginSpec) -> Result<Arc<Plugin>> {
        let path = spec.path.clone();
        let refused = |reason: String| Error::Refused { path: path.clone(), reason };
        let bytes: Arc<[u8]> = match &spec.bytes {
            Some(bytes) => {
                sniff(bytes).map_err(refused)?;
                bytes.clone()
            }
            None => read_plugin_file(&path)?.into(),
        };
        if spec.limits.memory_bytes > self.settings.max_memory_bytes {
            return Err(Error::Config {
                name: spec.name.clone(),
                message: format!(
                    "limits.memory_bytes = {} is above this sandbox's maximum of {}; lower it",
                    spec.limits.memory_bytes, self.settings.max_memory_bytes
                ),
            });
        }
        let sha256 = hex::encode(Sha256::digest(&bytes));
        if bytes.get(4..8) == Some(&[1, 0, 0, 0]) {
            return self.load_ruby(spec, bytes, sha256);
        }
        let component = cache::load(&self.engine, self.settings.cache_dir.as_deref(), &bytes, &sha256)
            .map_err(|e| refused(format!("it is not a valid component: {}", one_line(&e))))?;

        let ty = component.component_type();
        let exports: Vec<String> = ty.exports(&self.engine).map(|(name, _)| name.to_string()).collect();
        let imports: Vec<String> = ty.imports(&self.engine).map(|(name, _)| name.to_string()).collect();
        let world = world::detect_world(&exports, &imports).map_err(refused)?;
        let wit_version = exports
            .iter()
            .filter_map(|name| world::parse_interface_name(name))
            .find(|name| name.package == WIT_PACKAGE)
            .and_then(|name| name.version)
            .unwrap_or("unversioned")
            .to_string();
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            refused(match missing_imports(&imports, &ty, &self.engine, world) {
                Some(message) => message,
                None => format!("it cannot be linked: {}", one_line(&e)),
            })
        })?;
        let runner = match (world, &spec.code_runner) {
            (World::GraderPlugin, Some(runner_spec)) => {
                let runner = crate::CodeRunnerPlugin::new(self.load((**runner_spec).clone())?)?;
                Some(Arc::new(match runner_spec.workers {
                    0 => runner,
                    workers => runner.in_workers(self, workers)?,
                }))
            }
            // Loadable (to inspect it, say); scoring with it needs a runner (`RewardPlugin::new`).
            (World::GraderPlugin, None) => None,
            (_, Some(_)) => {
                return Err(Error::Config {
                    name: spec.name.clone(),
                    message: format!("a code runner was given, but it is a {world}, not a grader-plugin; remove it"),
                });
            }
            (_, None) => None,
        };
        tracing::debug!(plugin = %spec.name, %world, sha256 = %sha256, "loaded");
        Ok(Arc::new(Plugin {
            config: Arc::new(spec.config.clone()),
            size: bytes.len() as u64,
            spec,
            sha256,
            world,
            wit_version,
            imports,
            exports,
            engine: self.engine.clone(),
            prepared: Prepared::Component(pre),
            epoch_tick_ms: self.settings.epoch_tick_ms.max(1),
            fuel_enabled: self.settings.fuel,
            runner,
            interrupt: self.interrupt.clone(),
            slots: self.slots.clone(),
        }))
    }
}

impl Sandbox {
    /// Load a core module: CRuby's ruby.wasm as a code runner (module `ruby`), the one core
    /// module wirl runs; any other is refused saying what to build instead.
    fn load_ruby(&self, spec: PluginSpec, bytes: Arc<[u8]>, sha256: String) -> Result<Arc<Plugin>> {
        if spec.code_runner.is_some() {
            return Err(Error::Config {
                name: spec.name.clone(),
                message: "a code runner was given, but it is CRuby's code runner, not a grader-plugin; remove it"
                    .into(),
            });
        }
        let refused = |reason: String| Error::Refused { path: spec.path.clone(), reason };
        // Its globals exported, for the snapshot of its boot (module `ruby`); the cache keys
        // what is compiled.
        let exported = crate::ruby::export_globals(&bytes)
            .map_err(|e| refused(format!("it is not a WebAssembly module wirl can run: {e}")))?;
        let compiled_sha256 = hex::encode(Sha256::digest(&exported));
        let module = cache::load_module(&self.engine, self.settings.cache_dir.as_deref(), &exported, &compiled_sha256)
            .map_err(|e| refused(format!("it is not a valid WebAssembly module: {}", one_line(&e))))?;
        crate::ruby::check(&module).map_err(refused)?;
        let empty_root = tempfile::Builder::new()
            .prefix("wirl-ruby-root-")
            .tempdir()
            .map_err(|e| refused(format!("cannot make an empty directory for its runs: {e}")))?;
        // Its JavaScript bridge (`require "js"`) is all it imports besides WASI: each traps.
        let mut linker = self.module_linker.clone();
        linker.define_unknown_imports_as_traps(&module).map_err(|e| refused(one_line(&e)))?;
        let pre =
            linker.instantiate_pre(&module).map_err(|e| refused(format!("it cannot be linked: {}", one_line(&e))))?;
        let imports = module.imports().map(|import| format!("{}::{}", import.module(), import.name())).collect();
        let exports = module.exports().map(|export| export.name().to_string()).collect();
        tracing::debug!(plugin = %spec.name, sha256 = %sha256, "loaded CRuby's core module");
        Ok(Arc::new(Plugin {
            config: Arc::new(spec.config.clone()),
            size: bytes.len() as u64,
            spec,
            sha256,
            world: World::CodeRunnerPlugin,
            wit_version: "ruby.wasm".into(),
            imports,
            exports,
            engine: self.engine.clone(),
            prepared: Prepared::Ruby { pre, empty_root: Arc::new(empty_root) },
            epoch_tick_ms: self.settings.epoch_tick_ms.max(1),
            fuel_enabled: self.settings.fuel,
            runner: None,
            interrupt: self.interrupt.clone(),
            slots: self.slots.clone(),
        }))
    }
}

/// The largest plugin file wirl loads. CPython as a component is ~20 MB; anything near this
/// is not a plugin, and reading it whole would only cost memory.
const MAX_PLUGIN_BYTES: u64 = 512 << 20;

/// A plugin file's bytes, after checking that it is a regular file of a sane size whose first
/// bytes look like a component, so that a device (`/dev/zero`), a FIFO or a huge file is
/// refused by name before it is read.
fn read_plugin_file(path: &std::path::Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let refused = |reason: String| Error::Refused { path: path.to_path_buf(), reason };
    let read_error = |error| Error::Read { path: path.to_path_buf(), error };
    let metadata = std::fs::metadata(path).map_err(read_error)?;
    if !metadata.is_file() {
        let what = if metadata.is_dir() { "a directory" } else { "not a regular file (a device, FIFO or socket)" };
        return Err(refused(format!("it is {what}; a plugin is a .wasm component file")));
    }
    if metadata.len() > MAX_PLUGIN_BYTES {
        return Err(refused(format!(
            "it is {} MiB, more than the largest plugin wirl loads ({} MiB)",
            metadata.len() >> 20,
            MAX_PLUGIN_BYTES >> 20
        )));
    }
    let mut file = std::fs::File::open(path).map_err(read_error)?;
    let mut header = Vec::with_capacity(HEADER_BYTES);
    (&mut file).take(HEADER_BYTES as u64).read_to_end(&mut header).map_err(read_error)?;
    sniff(&header).map_err(refused)?;
    let mut bytes = header;
    // Bounded even if the file grows while it is read.
    file.take(MAX_PLUGIN_BYTES + 1 - bytes.len() as u64).read_to_end(&mut bytes).map_err(read_error)?;
    if bytes.len() as u64 > MAX_PLUGIN_BYTES {
        return Err(refused(format!("it grew past {} MiB while it was read", MAX_PLUGIN_BYTES >> 20)));
    }
    Ok(bytes)
}

/// How much of a file `sniff` looks at.
const HEADER_BYTES: usize = 4096;

/// Refuse what is plainly not a component before handing bytes to the compiler, with a
/// message that says what the file is instead. `bytes` is the file's start.
fn sniff(bytes: &[u8]) -> std::result::Result<(), String> {
    if bytes.is_empty() {
        return Err("the file is empty".into());
    }
    if bytes.starts_with(b"\0asm") {
        return match bytes.get(4..8) {
            // A core module: loaded only if it is CRuby's (`Sandbox::load_ruby` says so).
            Some([1, 0, 0, 0]) | Some([_, _, 1, 0]) => Ok(()),
            _ => Err("it has a WebAssembly header of an unknown version or layer".into()),
        };
    }
    // Components may also be given as WebAssembly text.
    let text_start = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if text_start == Some(&b'(') || bytes.starts_with(b";;") {
        return Ok(());
    }
    Err("it is not a WebAssembly file (no `\\0asm` header)".into())
}

/// Name imports that the host does not provide. `None` when every import is one we know,
/// so the linker's own error is shown.
fn missing_imports(
    imports: &[String],
    ty: &wasmtime::component::types::Component,
    engine: &Engine,
    world: World,
) -> Option<String> {
    let provided = |name: &str| {
        name.starts_with("wasi:")
            || world::parse_interface_name(name).is_some_and(|p| {
                p.package == WIT_PACKAGE && matches!(p.interface, "config" | "types" | "code-runner" | "inference")
            })
    };
    let missing: Vec<&String> = imports.iter().filter(|name| !provided(name)).collect();
    if missing.is_empty() {
        return None;
    }
    let shown: Vec<String> = missing
        .iter()
        .map(|name| match ty.imports(engine).find(|(n, _)| n == name) {
            Some((_, item)) if matches!(item.ty, ComponentItem::ComponentFunc(_)) => format!("function `{name}`"),
            _ => format!("`{name}`"),
        })
        .collect();
    Some(format!(
        "it imports {}, which this host does not provide; a {world} may import only WASI 0.2 \
         and {WIT_PACKAGE}/config (a grader also {WIT_PACKAGE}/code-runner, an agent {WIT_PACKAGE}/inference)",
        shown.join(", ")
    ))
}

fn one_line(error: &wasmtime::Error) -> String {
    format!("{error:#}").replace('\n', " ")
}

/// Advance the engine's epoch every tick (a deadline is a number of ticks) for as long as
/// the engine lives: plugins keep it alive after the `Sandbox` is gone, and their deadlines
/// must still hold.
fn start_epoch_ticker(engine: &Engine, tick: Duration) {
    let weak = engine.weak();
    std::thread::Builder::new()
        .name("wirl-epoch".into())
        .spawn(move || {
            loop {
                std::thread::sleep(tick);
                match weak.upgrade() {
                    Some(engine) => engine.increment_epoch(),
                    None => break,
                }
            }
        })
        .expect("spawning the epoch ticker thread");
}
