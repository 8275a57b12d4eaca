//! Task sources: an environment plugin's deterministic `task-at(seed, index)`, tasks read
//! from dataset files, an agent, another `wirl serve`'s task, or an OpenEnv server.

use crate::dataset::Dataset;
use crate::error::bail;
use crate::spec::SourceSpec;
use std::sync::Arc;
use wirl_sandbox::{EnvironmentPlugin, Plugin, Sandbox, Task};

/// Where a run's tasks come from, loaded.
pub enum TaskSource {
    /// `task_at(seed, index)` of an environment plugin; held-out tasks from `eval.first_index`.
    Environment { plugin: EnvironmentPlugin, seed: u64 },
    /// Datasets: training tasks by index (cycled over epochs, shuffled if asked), held-out
    /// tasks the first of their own file.
    Dataset { train: Option<Box<Dataset>>, eval: Option<Box<Dataset>> },
    /// An agent plugin, which makes its own tasks and rollouts (`crate::agent`).
    Agent { agent: wirl_sandbox::AgentPlugin, limits: crate::spec::AgentLimits },
    /// Another `wirl serve`'s task (`crate::remote`).
    Remote(Box<crate::remote::RemoteTasks>),
    /// An OpenEnv server's environment (`crate::openenv`): tasks by reset seed, episodes in
    /// sessions of their own; held-out tasks from `eval.first_index`.
    OpenEnv(Box<crate::openenv::OpenEnvTasks>),
}

impl TaskSource {
    /// Load the plugin or read the files of `spec`.
    pub fn load(sandbox: &Sandbox, spec: &SourceSpec) -> crate::error::Result<Self> {
        let open = |spec: &Option<Box<crate::dataset::DatasetSpec>>| {
            spec.as_ref().map(|s| Dataset::open(s).map(Box::new)).transpose()
        };
        Ok(match spec {
            SourceSpec::Environment { plugin, seed } => {
                TaskSource::Environment { plugin: EnvironmentPlugin::new(sandbox.load(plugin.spec())?)?, seed: *seed }
            }
            SourceSpec::Dataset { train, eval } => TaskSource::Dataset { train: open(train)?, eval: open(eval)? },
            SourceSpec::Agent { plugin, limits } => TaskSource::Agent {
                agent: wirl_sandbox::AgentPlugin::new(sandbox.load(plugin.spec())?)?,
                limits: *limits,
            },
            SourceSpec::Remote(spec) => TaskSource::Remote(Box::new(crate::remote::RemoteTasks::connect(spec)?)),
            SourceSpec::OpenEnv { spec, seed } => TaskSource::OpenEnv(Box::new(crate::openenv::OpenEnvTasks::connect(
                spec,
                *seed,
                sandbox.interrupter(),
            )?)),
        })
    }

    /// Whether training tasks can be drawn (a dataset may hold only held-out tasks).
    pub fn can_train(&self) -> bool {
        !matches!(self, TaskSource::Dataset { train: None, .. })
    }

    /// The environment plugin, if the tasks come from one (its sha256 goes into records).
    pub fn plugin(&self) -> Option<&Arc<Plugin>> {
        match self {
            TaskSource::Environment { plugin, .. } => Some(plugin.plugin()),
            TaskSource::Agent { agent, .. } => Some(agent.plugin()),
            TaskSource::Dataset { .. } | TaskSource::Remote(_) | TaskSource::OpenEnv(_) => None,
        }
    }

    /// What runs this source's episodes, where it has them (an environment plugin, an
    /// OpenEnv server).
    pub fn episodes(&self) -> Option<&dyn crate::EpisodeSource> {
        match self {
            TaskSource::Environment { plugin, .. } => Some(plugin),
            TaskSource::OpenEnv(server) => Some(server.as_ref()),
            TaskSource::Dataset { .. } | TaskSource::Agent { .. } | TaskSource::Remote(_) => None,
        }
    }

    /// The training task at `index`.
    pub fn training(&mut self, index: u64) -> crate::error::Result<Task> {
        match self {
            TaskSource::Environment { plugin, seed } => {
                let seed = *seed;
                plugin
                    .task_at(seed, index)
                    .map_err(|f| crate::error::invalid!("environment task {index} (seed {seed}): {f}"))
            }
            TaskSource::Dataset { train: None, .. } => {
                bail!("the [dataset] has no `train` file: name one to train (evaluation needs only `eval`)")
            }
            TaskSource::Dataset { train: Some(train), .. } => train.training(index),
            TaskSource::Agent { agent, .. } => {
                bail!("agent {} makes its own tasks: it is asked for rollouts, not tasks", agent.plugin().name())
            }
            TaskSource::Remote(remote) => remote.training(index),
            TaskSource::OpenEnv(server) => {
                server.task_at(index).map_err(|e| e.context(format!("OpenEnv task {index}")))
            }
        }
    }

    /// Held-out tasks `offset .. offset + count`, slot by slot: each one's index (an
    /// environment's from `first_index` (`eval.first_index`) plus `offset`, a dataset's row of
    /// its `eval` file, a remote task's place in its held-out range) with its task or why there
    /// is none (a line of an `eval` file that is no task says so). The one held-out selection:
    /// training's evaluation, `wirl eval` and a server's validation rollouts all draw through it.
    pub fn held_out(&mut self, first_index: u64, offset: u64, count: usize) -> Vec<(u64, Result<Task, String>)> {
        let chain = |e: &crate::Error| wirl_engine::error_chain(e);
        match self {
            TaskSource::Environment { .. } => (0..count as u64)
                .map(|i| {
                    let index = first_index.saturating_add(offset).saturating_add(i);
                    (index, self.training(index).map_err(|e| chain(&e)))
                })
                .collect(),
            // Row by row: a bad line is that task's failure, not the whole held-out set's.
            TaskSource::Dataset { eval: Some(eval), .. } => (offset..offset.saturating_add(count as u64))
                .map_while(|i| eval.row(i).map(|task| (i, task.map_err(|e| chain(&e)))))
                .collect(),
            TaskSource::Dataset { eval: None, .. } => Vec::new(),
            // Evaluated through its own rollouts instead.
            TaskSource::Agent { .. } => Vec::new(),
            // The server's own held-out range.
            TaskSource::Remote(remote) => remote.held_out(offset, count),
            TaskSource::OpenEnv(server) => server.held_out(first_index, offset, count),
        }
    }
}
