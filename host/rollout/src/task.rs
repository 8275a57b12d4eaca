//! A task, loaded: the one path by which `wirl train`, `wirl eval` and `wirl serve --config`
//! load a config's task and check it (its source and reward plugins; an environment that
//! runs episodes when `max_turns` asks for them; a chat template that can hold a multi-turn
//! ledger), so that the three accept and refuse the same tasks.

use crate::error::{Context, bail};
use crate::{FailurePolicy, RewardSpec, SamplingSpec, Scorers, SourceSpec, TaskSource};
use std::sync::Arc;
use wirl_engine::Tokenizer;
use wirl_sandbox::{Plugin, Sandbox};

/// A task of a run, validated.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskSpec {
    pub name: String,
    /// Its share of the groups: 0 for a task never trained on (`eval_only`, or weight 0).
    pub weight: f64,
    pub source: SourceSpec,
    pub rewards: Vec<RewardSpec>,
    pub sampling: SamplingSpec,
    /// How its reward plugins' (or episodes') failures are handled.
    pub failures: FailurePolicy,
    /// Model turns per episode; 1: single-turn, scored by `rewards`.
    pub max_turns: usize,
    /// A trajectory passes when its reward is at least this.
    pub pass_reward: f32,
}

/// A task, loaded: its source and scorers.
pub struct LoadedTask {
    pub spec: TaskSpec,
    pub source: TaskSource,
    pub scorers: Scorers,
}

impl LoadedTask {
    /// Load `spec`'s plugins (or dataset, or remote) and check that the task can run with
    /// this model: errors name the task.
    pub fn load(sandbox: &Sandbox, spec: &TaskSpec, tokenizer: &Tokenizer) -> crate::error::Result<Self> {
        let name = &spec.name;
        let mut source = TaskSource::load(sandbox, &spec.source).with_context(|| format!("task `{name}`"))?;
        if let TaskSource::OpenEnv(_) = &source {
            // Its replies are appended to the conversation between the server's observations.
            crate::check_template(tokenizer).with_context(|| format!("task `{name}` (an OpenEnv environment)"))?;
        } else if spec.max_turns > 1 {
            let TaskSource::Environment { plugin, .. } = &mut source else {
                bail!("task `{name}`: max_turns = {} needs an environment plugin", spec.max_turns);
            };
            let description = plugin.describe().map_err(|f| crate::error::invalid!("task `{name}`: describe: {f}"))?;
            if !description.episodes {
                bail!(
                    "task `{name}`: max_turns = {}, but its environment `{}` has no episodes (describe says so): \
                     set max_turns = 1 and give it reward plugins",
                    spec.max_turns,
                    plugin.plugin().name()
                );
            }
            crate::check_template(tokenizer)
                .with_context(|| format!("task `{name}` (max_turns = {})", spec.max_turns))?;
        }
        let scorers = Scorers::for_source(sandbox, &source, &spec.rewards).with_context(|| format!("task `{name}`"))?;
        Ok(LoadedTask { spec: spec.clone(), source, scorers })
    }

    /// Whether its groups run as episodes (an environment's, an OpenEnv server's), scored
    /// by their environment; single-turn groups are scored by reward plugins.
    pub fn runs_episodes(&self) -> bool {
        self.spec.max_turns > 1 || matches!(self.source, TaskSource::OpenEnv(_))
    }

    /// A task that trains (`groups` of each step) needs training problems.
    pub fn check_trains(&self, groups: usize) -> crate::error::Result<()> {
        if groups > 0 && !self.source.can_train() {
            bail!(
                "task `{}`: its dataset has no `train` file: name one to train (evaluation needs only `eval`)",
                self.spec.name
            );
        }
        Ok(())
    }

    /// Every plugin of the task: its environment or agent, then its rewards.
    pub fn plugins(&self) -> impl Iterator<Item = &Arc<Plugin>> {
        self.source.plugin().into_iter().chain(self.scorers.plugins())
    }
}
