//! A run's tasks, loaded: each task's source and reward plugins, ready to step. Made when a
//! run starts and again for every task set swapped in (the previous set stays loaded, warm,
//! for a rollback).

use crate::config::{RunConfig, TaskSpec};
use crate::metrics::PluginHash;
use anyhow::{Context, bail};
use std::sync::Arc;
use wirl_engine::Tokenizer;
use wirl_rollout::{Scorers, TaskSource};
use wirl_sandbox::Sandbox;

/// A task of the run, loaded: its source and scorers.
pub(crate) struct LoadedTask {
    pub spec: TaskSpec,
    pub source: TaskSource,
    pub scorers: Scorers,
    /// Its plugins (environment or agent, rewards), as its rollouts record them.
    pub hashes: Vec<PluginHash>,
}

impl LoadedTask {
    /// Every plugin of the task, loaded.
    pub fn plugins(&self) -> impl Iterator<Item = &Arc<wirl_sandbox::Plugin>> {
        self.source.plugin().into_iter().chain(self.scorers.plugins())
    }
}

/// Load every task of `run`; `groups[t]` is task t's share of a step (a task that trains
/// needs training tasks).
pub(crate) fn load_tasks(
    sandbox: &Sandbox,
    run: &RunConfig,
    groups: &[usize],
    tokenizer: &Tokenizer,
) -> anyhow::Result<Vec<LoadedTask>> {
    let mut tasks = Vec::new();
    for (spec, &groups) in run.tasks.iter().zip(groups) {
        let name = &spec.name;
        let mut source = TaskSource::load(sandbox, &spec.source).with_context(|| format!("task `{name}`"))?;
        if groups > 0 && !source.can_train() {
            bail!("task `{name}`: its dataset has no `train` file: name one to train (evaluation needs only `eval`)");
        }
        if spec.max_turns > 1 {
            let TaskSource::Environment { plugin, .. } = &mut source else {
                bail!("task `{name}`: max_turns = {} needs an environment plugin", spec.max_turns);
            };
            let description = plugin.describe().map_err(|f| anyhow::anyhow!("task `{name}`: describe: {f}"))?;
            if !description.episodes {
                bail!(
                    "task `{name}`: max_turns = {}, but its environment `{}` has no episodes (describe says so): \
                     set max_turns = 1 and give it reward plugins",
                    spec.max_turns,
                    plugin.plugin().name()
                );
            }
            wirl_rollout::check_template(tokenizer)
                .with_context(|| format!("task `{name}` (max_turns = {})", spec.max_turns))?;
        }
        let scorers = Scorers::for_source(sandbox, &source, &spec.rewards).with_context(|| format!("task `{name}`"))?;
        let hashes = source
            .plugin()
            .into_iter()
            .chain(scorers.plugins())
            .map(|p| PluginHash { name: p.name().to_string(), sha256: p.sha256().to_string() })
            .collect();
        tasks.push(LoadedTask { spec: spec.clone(), source, scorers, hashes });
    }
    Ok(tasks)
}
