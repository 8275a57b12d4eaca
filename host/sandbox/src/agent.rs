//! Agent plugins (`agent-plugin` world): the agent turns tasks into scored rollout groups,
//! calling the model through its `inference` import, which the host provides through an
//! [`InferenceHost`]. The agent's deadline counts its own work only: time waiting for the
//! engine is paused.

use crate::bindings::agent_world::wirl::rl::inference;
use crate::bindings::agent_world::{AgentPlugin as Bindings, AgentPluginPre};
use crate::call::{self, Failure, HostState};
pub use crate::inference::InferenceHost;
use crate::plugin::Plugin;
use crate::{AgentRolloutGroup, Completion, Error, Message, Result, RolloutRequest, Sampling, World};
use std::sync::Arc;

impl inference::Host for HostState {
    async fn generate(
        &mut self,
        conversations: Vec<Vec<Message>>,
        sampling: Sampling,
    ) -> Result<Vec<Completion>, String> {
        generate_for_plugin(self, conversations, sampling).await
    }
}

/// 0.2.0's `inference` (a judge's): the same call.
impl crate::bindings::reward_world_v0_2::wirl::rl::inference::Host for HostState {
    async fn generate(
        &mut self,
        conversations: Vec<Vec<Message>>,
        sampling: Sampling,
    ) -> Result<Vec<Completion>, String> {
        generate_for_plugin(self, conversations, sampling).await
    }

    async fn logprobs(&mut self, replies: Vec<crate::ReplyToScore>) -> Result<Vec<crate::ReplyLogprobs>, String> {
        let host = inference_of(self)?;
        let _paused = self.paused.pause();
        host.logprobs(replies).await
    }
}

/// The host a plugin's inference calls reach, or why there is none.
fn inference_of(state: &HostState) -> Result<Arc<dyn InferenceHost>, String> {
    state.inference.clone().ok_or_else(|| {
        "no model to call here: inference is given to agents, and to rewards in a training run (`wirl train`), \
         not to `wirl score` or a reward without an engine"
            .into()
    })
}

/// A plugin's `inference.generate`: through the host this call was given (an agent's, a
/// judge's budget), the plugin's deadline paused while the engine works.
async fn generate_for_plugin(
    state: &mut HostState,
    conversations: Vec<Vec<Message>>,
    sampling: Sampling,
) -> Result<Vec<Completion>, String> {
    let host = inference_of(state)?;
    // The engine's time is not the plugin's: its deadline waits.
    let _paused = state.paused.pause();
    host.generate(conversations, sampling).await
}

/// An agent plugin ready to produce rollouts.
pub struct AgentPlugin {
    plugin: Arc<Plugin>,
    pre: AgentPluginPre<HostState>,
}

impl AgentPlugin {
    pub fn new(plugin: Arc<Plugin>) -> Result<Self> {
        if plugin.world() != World::AgentPlugin {
            return Err(Error::WrongWorld {
                name: plugin.name().to_string(),
                path: plugin.path().to_path_buf(),
                found: plugin.world(),
                wanted: World::AgentPlugin.to_string(),
            });
        }
        let pre = AgentPluginPre::new(plugin.component()?).map_err(|e| Error::Refused {
            path: plugin.path().to_path_buf(),
            reason: format!("not an agent-plugin: {e:#}"),
        })?;
        Ok(AgentPlugin { plugin, pre })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.plugin
    }

    /// Ask for `request.groups` groups, in a fresh instance whose `inference.generate`
    /// reaches `host`. The plugin's deadline, fuel and memory hold for its own work.
    pub fn rollouts(
        &self,
        request: &RolloutRequest,
        host: Arc<dyn InferenceHost>,
    ) -> Result<Vec<AgentRolloutGroup>, Failure> {
        let plugin = &self.plugin;
        let mut store = plugin.new_store()?;
        store.data_mut().inference = Some(host);
        plugin.arm(&mut store);
        let pre = &self.pre;
        let produced = call::block_on(call::bounded(&mut store, async |store| {
            let bindings: Bindings = pre.instantiate_async(&mut *store).await?;
            bindings.wirl_rl_agent().call_rollouts(store, request).await
        }))
        .map_err(|e| plugin.failure(&store, &e))?;
        plugin.drain_prints(&store);
        let groups = produced.map_err(Failure::guest)?;
        let bytes: usize = groups
            .iter()
            .map(|g| {
                g.task.text_bytes()
                    + g.rollouts
                        .iter()
                        .map(|r| {
                            r.messages.iter().map(|m| m.role.len() + m.content.len()).sum::<usize>()
                                + r.generations.len() * 8
                                + r.outcome.as_ref().map_or_else(String::len, |s| s.text_bytes())
                        })
                        .sum::<usize>()
            })
            .sum();
        plugin.check_return_size(bytes)?;
        Ok(groups)
    }
}
