//! Typed calls into a reward plugin.

use crate::bindings::Progress;
use crate::bindings::grader_world::{GraderPlugin, GraderPluginPre};
use crate::bindings::reward_world::{RewardPlugin as Bindings, RewardPluginPre};
use crate::bindings::reward_world_v0_2::{RewardPlugin as BindingsV0_2, RewardPluginPre as RewardPluginPreV0_2};
use crate::call::{CallStats, Failure, FailureKind, HostState};
use crate::inference::InferenceHost;
use crate::plugin::{Instances, Plugin};
use crate::{Error, Result, Score, Task, World};
use std::sync::Arc;
use wasmtime::Store;

/// A reward plugin (or a grader, which scores too) ready to score. Not shared between
/// threads: make one per worker from the same [`Plugin`] (cheap; the compiled code is
/// shared).
pub struct RewardPlugin {
    pre: Pre,
    instances: Instances<Scorer>,
    /// What a 0.2.0 plugin's `inference.generate` reaches in the next call (a judge's
    /// budget for that call); none: such a call is an error.
    inference: Option<Arc<dyn InferenceHost>>,
}

/// The worlds that export `wirl:rl/reward`: 0.1.0's reward and grader, 0.2.0's reward.
enum Pre {
    Reward(RewardPluginPre<HostState>),
    Grader(GraderPluginPre<HostState>),
    RewardV0_2(RewardPluginPreV0_2<HostState>),
}

enum Scorer {
    Reward(Bindings),
    Grader(GraderPlugin),
    RewardV0_2(BindingsV0_2),
}

type Verdict = Result<Score, String>;

impl Pre {
    async fn instantiate(&self, store: &mut Store<HostState>) -> wasmtime::Result<Scorer> {
        match self {
            Pre::Reward(pre) => pre.instantiate_async(store).await.map(Scorer::Reward),
            Pre::Grader(pre) => pre.instantiate_async(store).await.map(Scorer::Grader),
            Pre::RewardV0_2(pre) => pre.instantiate_async(store).await.map(Scorer::RewardV0_2),
        }
    }
}

impl Scorer {
    async fn score(
        &self,
        store: &mut Store<HostState>,
        task: &Task,
        completion: &str,
        progress: Progress,
    ) -> wasmtime::Result<Verdict> {
        match self {
            Scorer::Reward(b) => b.wirl_rl_reward().call_score_completion(store, task, completion).await,
            Scorer::Grader(b) => b.wirl_rl_reward().call_score_completion(store, task, completion).await,
            // 0.2.0 scores groups only: a group of one.
            Scorer::RewardV0_2(b) => {
                let completions = [completion.to_string()];
                let mut verdicts = b.wirl_rl_reward().call_score_group(store, task, &completions, progress).await?;
                match verdicts.len() {
                    1 => Ok(verdicts.remove(0)),
                    n => Ok(Err(format!("returned {n} scores for a group of 1 completion"))),
                }
            }
        }
    }

    /// The group's verdicts; 0.1.0's worlds are not told `progress`.
    async fn score_group(
        &self,
        store: &mut Store<HostState>,
        task: &Task,
        completions: &[String],
        progress: Progress,
    ) -> wasmtime::Result<Vec<Verdict>> {
        match self {
            Scorer::Reward(b) => b.wirl_rl_reward().call_score_group(store, task, completions).await,
            Scorer::Grader(b) => b.wirl_rl_reward().call_score_group(store, task, completions).await,
            Scorer::RewardV0_2(b) => b.wirl_rl_reward().call_score_group(store, task, completions, progress).await,
        }
    }
}

/// A score whose reward or a part is NaN or infinite is the plugin's failure: such a
/// number would poison the group's advantages and, through them, the weights.
fn finite(score: Score) -> Result<Score, Failure> {
    let bad = |value: f32| !value.is_finite();
    if bad(score.reward) {
        return Err(Failure {
            kind: FailureKind::NonFinite,
            message: format!("returned a reward of {}", score.reward),
        });
    }
    if let Some((name, value)) = score.parts.iter().find(|(_, value)| bad(*value)) {
        return Err(Failure {
            kind: FailureKind::NonFinite,
            message: format!("returned {value} for part `{}`", name.escape_debug()),
        });
    }
    Ok(score)
}

impl RewardPlugin {
    pub fn new(plugin: Arc<Plugin>) -> Result<Self> {
        if !plugin.world().scores() {
            return Err(Error::WrongWorld {
                name: plugin.name().to_string(),
                path: plugin.path().to_path_buf(),
                found: plugin.world(),
                wanted: "a reward-plugin or grader-plugin".to_string(),
            });
        }
        if plugin.world() == World::GraderPlugin && plugin.code_runner().is_none() {
            return Err(Error::Config {
                name: plugin.name().to_string(),
                message: "it is a grader (it imports wirl:rl/code-runner) but was loaded without a code \
                          runner: give it one (`code_runner = { plugin = \"…/code_runner.wasm\" }` in its \
                          [[rewards]] entry, or --code-runner on the command line)"
                    .into(),
            });
        }
        let refused =
            |e: wasmtime::Error| Error::Refused { path: plugin.path().to_path_buf(), reason: format!("{e:#}") };
        let pre = match (plugin.world(), crate::world::compatible_version(plugin.wit_version())) {
            (World::GraderPlugin, _) => Pre::Grader(GraderPluginPre::new(plugin.component()?).map_err(refused)?),
            (_, Some("0.2.0")) => Pre::RewardV0_2(RewardPluginPreV0_2::new(plugin.component()?).map_err(refused)?),
            _ => Pre::Reward(RewardPluginPre::new(plugin.component()?).map_err(refused)?),
        };
        Ok(RewardPlugin { pre, instances: Instances::new(plugin), inference: None })
    }

    pub fn plugin(&self) -> &Arc<Plugin> {
        &self.instances.plugin
    }

    /// Where the next calls' `inference.generate` goes (0.2.0 plugins: an LLM judge's
    /// model, through a host that bounds what one call may generate); `None`: nowhere.
    pub fn set_inference(&mut self, host: Option<Arc<dyn InferenceHost>>) {
        self.inference = host;
    }

    /// Time spent instantiating and calling in the last call.
    pub fn last_call(&self) -> CallStats {
        self.instances.last
    }

    /// Score one completion, outside training ([`Progress::OUTSIDE_TRAINING`]).
    pub fn score(&mut self, task: &Task, completion: &str) -> Result<Score, Failure> {
        self.score_at(task, completion, Progress::OUTSIDE_TRAINING)
    }

    /// [`score`](Self::score) at the run's `progress`, which a 0.2.0 plugin is told (as a
    /// group of one).
    pub fn score_at(&mut self, task: &Task, completion: &str, progress: Progress) -> Result<Score, Failure> {
        let (pre, inference) = (&self.pre, self.inference.clone());
        let verdict = self.instances.call(
            async |store| pre.instantiate(store).await,
            async |store, scorer| {
                store.data_mut().inference = inference;
                scorer.score(store, task, completion, progress).await
            },
        )?;
        let plugin = &self.instances.plugin;
        match verdict {
            Ok(score) => {
                plugin.check_return_size(score.text_bytes())?;
                finite(score)
            }
            Err(reason) => {
                plugin.check_return_size(reason.len())?;
                Err(Failure::guest(reason))
            }
        }
    }

    /// Score the completions of one group in one call, outside training
    /// ([`Progress::OUTSIDE_TRAINING`]). A failed call fails every completion with the same
    /// verdict.
    pub fn score_group(&mut self, task: &Task, completions: &[String]) -> Vec<Result<Score, Failure>> {
        self.score_group_at(task, completions, Progress::OUTSIDE_TRAINING)
    }

    /// [`score_group`](Self::score_group) at the run's `progress`, which a 0.2.0 plugin is
    /// told (a 0.1.0 plugin is not: its world has no such argument).
    pub fn score_group_at(
        &mut self,
        task: &Task,
        completions: &[String],
        progress: Progress,
    ) -> Vec<Result<Score, Failure>> {
        let (pre, inference) = (&self.pre, self.inference.clone());
        let verdicts = self.instances.call(
            async |store| pre.instantiate(store).await,
            async |store, scorer| {
                store.data_mut().inference = inference;
                scorer.score_group(store, task, completions, progress).await
            },
        );
        let verdicts = verdicts.and_then(|verdicts| {
            let bytes: usize = verdicts.iter().map(|v| v.as_ref().map_or_else(String::len, Score::text_bytes)).sum();
            self.instances.plugin.check_return_size(bytes)?;
            if verdicts.len() != completions.len() {
                return Err(Failure::guest(format!(
                    "score-group returned {} results for {} completions",
                    verdicts.len(),
                    completions.len()
                )));
            }
            Ok(verdicts)
        });
        match verdicts {
            Ok(verdicts) => verdicts.into_iter().map(|v| v.map_err(Failure::guest).and_then(finite)).collect(),
            Err(failure) => vec![Err(failure); completions.len()],
        }
    }
}
