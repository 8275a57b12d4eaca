//! Typed calls into an environment plugin: tasks, and multi-turn episodes.

use crate::bindings::environment_world::{EnvironmentPlugin as Bindings, EnvironmentPluginPre};
use crate::call::{self, CallStats, Failure, HostState};
use crate::plugin::{Instances, Plugin};
use crate::{Description, Error, Result, StepResult, Task, World};
use std::sync::Arc;
use wasmtime::component::ResourceAny;

/// An environment plugin ready to produce tasks and run episodes.
pub struct EnvironmentPlugin {
    pre: EnvironmentPluginPre<HostState>,
    instances: Instances<Bindings>,
}

impl EnvironmentPlugin {
    pub fn new(plugin: Arc<Plugin>) -> Result<Self> {
        if plugin.world() != World::EnvironmentPlugin {
            return Err(Error::WrongWorld {
                name: plugin.name().to_string(),
                path: plugin.path().to_path_buf(),
                found: plugin.world(),
                wanted: "an environment-plugin".to_string(),
            });
        }
        let pre = EnvironmentPluginPre::new(plugin.component()?)
            .map_err(|e| Error::Refused { path: plugin.path().to_path_buf(), reason: format!("{e:#}") })?;
        Ok(EnvironmentPlugin { pre, instances: Instances::new(plugin) })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.instances.plugin
    }

    pub fn last_call(&self) -> CallStats {
        self.instances.last
    }

    pub fn describe(&mut self) -> Result<Description, Failure> {
        let pre = &self.pre;
        let description = self.instances.call(
            async |store| pre.instantiate_async(store).await,
            async |store, bindings| bindings.wirl_rl_environment().call_describe(store).await,
        )?;
        self.instances.plugin.check_return_size(description.name.len())?;
        Ok(description)
    }

    /// The task at `index` for `seed`.
    pub fn task_at(&mut self, seed: u64, index: u64) -> Result<Task, Failure> {
        let pre = &self.pre;
        let verdict = self.instances.call(
            async |store| pre.instantiate_async(store).await,
            async |store, bindings| bindings.wirl_rl_environment().call_task_at(store, seed, index).await,
        )?;
        let plugin = &self.instances.plugin;
        match verdict {
            Ok(task) => {
                plugin.check_return_size(task.text_bytes())?;
                Ok(task)
            }
            Err(reason) => {
                plugin.check_return_size(reason.len())?;
                Err(Failure::guest(reason))
            }
        }
    }

    /// Begin an episode of `task` in an instance of its own, kept until the episode ends.
    pub fn start_episode(&self, task: &Task) -> Result<Episode, Failure> {
        let plugin = self.instances.plugin.clone();
        let mut store = plugin.new_store()?;
        let pre = &self.pre;
        let started = call::block_on(call::bounded(&mut store, async |store| {
            let bindings = pre.instantiate_async(&mut *store).await?;
            let episode = bindings.wirl_rl_environment().episode().call_constructor(&mut *store, task).await?;
            Ok((bindings, episode))
        }));
        let (bindings, episode) = started.map_err(|e| plugin.failure(&store, &e))?;
        plugin.drain_prints(&store);
        Ok(Episode { plugin, store, bindings, episode })
    }
}

/// One running episode, with its own instance.
pub struct Episode {
    plugin: Arc<Plugin>,
    store: crate::plugin::SlottedStore,
    bindings: Bindings,
    episode: ResourceAny,
}

impl Episode {
    /// Give the model's reply; learn whether the episode goes on or is done.
    pub fn step(&mut self, reply: &str) -> Result<StepResult, Failure> {
        self.plugin.arm(&mut self.store);
        let (bindings, episode) = (&self.bindings, self.episode);
        let verdict = call::block_on(call::bounded(&mut self.store, async |store| {
            bindings.wirl_rl_environment().episode().call_step(store, episode, reply).await
        }))
        .map_err(|e| self.plugin.failure(&self.store, &e))?;
        self.plugin.drain_prints(&self.store);
        verdict.map_err(Failure::guest)
    }
}
