//! wirl's integration tests: the real host, real guest components (built by
//! `wirl-test-artifacts`), and the real `wirl` binary.

// The CLI's `clippy.toml` refuses `eprintln!` for the binary's shared terminal; a test's
// output is captured by the harness, one test at a time.
#![allow(clippy::disallowed_macros)]

mod agents;
mod algorithms;
mod cli;
mod code;
mod code_tests;
mod datasets;
mod devices;
mod distill;
mod engine;
mod escape;
mod families;
mod grpo;
mod hardening;
mod hostile;
mod hotswap;
mod install;
mod judge;
mod languages;
mod likelihood;
mod lora;
mod mpi;
mod multiturn;
mod on_policy;
mod openenv;
mod plugins;
mod precision;
mod ranks;
mod reference;
mod reward_models;
mod ruby;
mod runtime;
mod sandbox;
mod sandbox_serve;
mod serve;
mod serve_tasks;
mod trainer;
mod untrusted;
mod wit_versions;

use std::sync::Arc;

/// As `wirl` does: chat templates rendered in these tests run under a memory budget.
#[global_allocator]
static ALLOCATOR: wirl_engine::memory_budget::BudgetAllocator = wirl_engine::memory_budget::BudgetAllocator;
use wirl_sandbox::{Plugin, PluginSpec, Sandbox, SandboxSettings, Task};

/// A sandbox whose compiled-component cache is private to the test.
pub fn sandbox() -> (Sandbox, tempfile::TempDir) {
    sandbox_with(SandboxSettings::default())
}

pub fn sandbox_with(settings: SandboxSettings) -> (Sandbox, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let settings = SandboxSettings { cache_dir: Some(cache.path().to_path_buf()), ..settings };
    (Sandbox::new(settings).unwrap(), cache)
}

pub fn load(sandbox: &Sandbox, path: &str) -> Arc<Plugin> {
    sandbox.load(PluginSpec::new(path)).unwrap()
}

pub fn task(id: &str, answer: Option<&str>) -> Task {
    Task { id: id.to_string(), messages: Vec::new(), answer: answer.map(str::to_string), metadata: None }
}
