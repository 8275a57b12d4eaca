//! A run's tasks, loaded through the one task runtime (`wirl_rollout::LoadedTask`, which
//! `wirl eval` and `wirl serve --config` use too). Made when a run starts and again for every
//! task set swapped in (the previous set stays loaded, warm, for a rollback).

use crate::config::RunConfig;
use crate::metrics::PluginHash;
use wirl_engine::Tokenizer;
pub(crate) use wirl_rollout::LoadedTask;
use wirl_sandbox::Sandbox;

/// Load every task of `run`; `groups[t]` is task t's share of a step (a task that trains
/// needs training tasks).
pub(crate) fn load_tasks(
    sandbox: &Sandbox,
    run: &RunConfig,
    groups: &[usize],
    tokenizer: &Tokenizer,
) -> crate::error::Result<Vec<LoadedTask>> {
    run.tasks
        .iter()
        .zip(groups)
        .map(|(spec, &groups)| {
            let task = LoadedTask::load(sandbox, spec, tokenizer)?;
            task.check_trains(groups)?;
            Ok(task)
        })
        .collect()
}

/// A task's plugins (environment or agent, rewards), as its rollouts record them.
pub(crate) fn plugin_hashes(task: &LoadedTask) -> Vec<PluginHash> {
    task.plugins().map(|p| PluginHash { name: p.name().to_string(), sha256: p.sha256().to_string() }).collect()
}
