//! Typed calls into an environment plugin: tasks, and multi-turn episodes, whichever
//! `wirl:rl` version (0.1.0, or 0.2.0 with per-turn rewards) it was built for.

use crate::bindings::environment_world::{EnvironmentPlugin as BindingsV0_1, EnvironmentPluginPre};
use crate::bindings::environment_world_v0_2::{
    EnvironmentPlugin as BindingsV0_2, EnvironmentPluginPre as EnvironmentPluginPreV0_2,
};
use crate::call::{self, CallStats, Failure, HostState};
use crate::plugin::{Instances, Plugin};
use crate::{Description, Error, Result, StepResult, Task, World};
use std::sync::Arc;
use wasmtime::Store;
use wasmtime::component::ResourceAny;

/// An environment plugin ready to produce tasks and run episodes.
pub struct EnvironmentPlugin {
    pre: Pre,
    instances: Instances<Bindings>,
}

/// The environment worlds: 0.1.0's, and 0.2.0's (a reward per turn).
enum Pre {
    V0_1(EnvironmentPluginPre<HostState>),
    V0_2(EnvironmentPluginPreV0_2<HostState>),
}

enum Bindings {
    V0_1(BindingsV0_1),
    V0_2(BindingsV0_2),
}

impl Pre {
    async fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Bindings> {
        match self {
            Pre::V0_1(pre) => pre.instantiate_async(store).await.map(Bindings::V0_1),
            Pre::V0_2(pre) => pre.instantiate_async(store).await.map(Bindings::V0_2),
        }
    }
}

impl Bindings {
    async fn describe(&self, store: &mut Store<HostState>) -> wasmtime::Result<Description> {
        match self {
            Bindings::V0_1(b) => b.wirl_rl_environment().call_describe(store).await,
            Bindings::V0_2(b) => b.wirl_rl_environment().call_describe(store).await.map(|d| Description {
                name: d.name,
                size: d.size,
                episodes: d.episodes,
            }),
        }
    }

    async fn task_at(
        &self,
        store: &mut Store<HostState>,
        seed: u64,
        index: u64,
    ) -> wasmtime::Result<Result<Task, String>> {
        match self {
            Bindings::V0_1(b) => b.wirl_rl_environment().call_task_at(store, seed, index).await,
            Bindings::V0_2(b) => b.wirl_rl_environment().call_task_at(store, seed, index).await,
        }
    }

    async fn start(&self, store: &mut Store<HostState>, task: &Task) -> wasmtime::Result<ResourceAny> {
        match self {
            Bindings::V0_1(b) => b.wirl_rl_environment().episode().call_constructor(store, task).await,
            Bindings::V0_2(b) => b.wirl_rl_environment().episode().call_constructor(store, task).await,
        }
    }

    async fn step(
        &self,
        store: &mut Store<HostState>,
        episode: ResourceAny,
        reply: &str,
    ) -> wasmtime::Result<Result<StepResult, String>> {
        Ok(match self {
            Bindings::V0_1(b) => {
                b.wirl_rl_environment().episode().call_step(store, episode, reply).await?.map(StepResult::from)
            }
            Bindings::V0_2(b) => {
                b.wirl_rl_environment().episode().call_step(store, episode, reply).await?.map(StepResult::from)
            }
        })
    }
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
        let refused =
            |e: wasmtime::Error| Error::Refused { path: plugin.path().to_path_buf(), reason: format!("{e:#}") };
        let pre = match crate::world::compatible_version(plugin.wit_version()) {
            Some("0.2.0") => Pre::V0_2(EnvironmentPluginPreV0_2::new(plugin.component()?).map_err(refused)?),
            _ => Pre::V0_1(EnvironmentPluginPre::new(plugin.component()?).map_err(refused)?),
        };
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
        let description = self
            .instances
            .call(async |store| pre.instantiate(store).await, async |store, bindings| bindings.describe(store).await)?;
        self.instances.plugin.check_return_size(description.name.len())?;
        Ok(description)
    }

    /// The task at `index` for `seed`.
    pub fn task_at(&mut self, seed: u64, index: u64) -> Result<Task, Failure> {
        let pre = &self.pre;
        let verdict = self.instances.call(
            async |store| pre.instantiate(store).await,
            async |store, bindings| bindings.task_at(store, seed, index).await,
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
            let bindings = pre.instantiate(&mut *store).await?;
            let episode = bindings.start(&mut *store, task).await?;
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
    /// Give the model's reply; learn whether the episode goes on (with the turn's reward, if
    /// any) or is done. A turn's reward that is not finite is the plugin's failure.
    pub fn step(&mut self, reply: &str) -> Result<StepResult, Failure> {
        self.plugin.arm(&mut self.store);
        let (bindings, episode) = (&self.bindings, self.episode);
        let verdict =
            call::block_on(call::bounded(&mut self.store, async |store| bindings.step(store, episode, reply).await))
                .map_err(|e| self.plugin.failure(&self.store, &e))?;
        self.plugin.drain_prints(&self.store);
        match verdict.map_err(Failure::guest)? {
            StepResult::Continue { reward: Some(reward), .. } if !reward.is_finite() => Err(Failure {
                kind: crate::call::FailureKind::NonFinite,
                message: format!("returned a turn reward of {reward}"),
            }),
            step => Ok(step),
        }
    }
}
