//! The rewards of a task — plugins and reward models — scoring groups of completions: every
//! reward weighted and summed; a failing call is recorded by kind and scores
//! `failure_reward` for that reward.

use crate::agent::{EngineInference, InferenceUsage};
use crate::group::SamplingSpec;
use crate::score::{FailurePolicy, OnFailure, Scored, Status};
use crate::spec::{AgentLimits, InferenceBudget};
use crate::spec::{JudgeModel, RewardSource, RewardSpec};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use wirl_engine::{ChatMessage, EngineHandle, LoadOptions, RewardModel, Tokenizer};
use wirl_sandbox::InferenceHost;
use wirl_sandbox::{Failure, FailureKind, Plugin, Progress, RewardPlugin, Sandbox, Score, Task, printable};

/// The model a 0.2.0 reward's `inference.generate` reaches in a training run: the engine
/// being trained (an LLM judge that is the policy), each scoring call with a fresh budget.
#[derive(Clone)]
pub struct RewardEngine {
    pub handle: EngineHandle,
    pub tokenizer: Arc<Tokenizer>,
    pub context: usize,
    /// The run's seed: a judge's samples are seeded by it and the call's number.
    pub seed: u64,
    /// Where every scoring call's use of the engine is counted (a judge's share of a step).
    pub usage: Arc<InferenceUsage>,
}

impl RewardEngine {
    /// The host of one scoring call (call number `call`) within `budget`.
    fn host(&self, budget: InferenceBudget, call: u64) -> Arc<dyn InferenceHost> {
        let cap = SamplingSpec {
            max_tokens: usize::try_from(budget.tokens).unwrap_or(usize::MAX),
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
        };
        let limits = AgentLimits { generate_calls: budget.calls, tokens: budget.tokens };
        let seed = crate::seed::seed_for(self.seed, call ^ (1 << 61));
        Arc::new(
            EngineInference::new(self.handle.clone(), self.tokenizer.clone(), self.context, cap, seed, limits)
                .for_reward()
                .counting(self.usage.clone()),
        )
    }
}

/// Where 0.2.0 rewards' `inference` goes: the engine being trained (`JudgeModel::Policy`)
/// and the run's other judge models, each with an engine of its own.
#[derive(Clone, Default)]
struct Engines {
    policy: Option<RewardEngine>,
    judges: BTreeMap<JudgeModel, RewardEngine>,
}

impl Engines {
    /// The host of one scoring call of a reward judging with `judge`, within `budget`: the
    /// engine, or a refusal saying why there is none.
    fn host(&self, judge: &JudgeModel, budget: InferenceBudget, call: u64) -> Option<Arc<dyn InferenceHost>> {
        let engine = match judge {
            JudgeModel::Policy => self.policy.as_ref(),
            other => self.judges.get(other),
        };
        match (engine, judge) {
            (Some(engine), _) => Some(engine.host(budget, call)),
            // No engine at all (`wirl score`): the sandbox's own refusal says so.
            (None, _) if self.policy.is_none() => None,
            (None, judge) => Some(Arc::new(Refusal(format!(
                "judge_model = \"{judge}\" is not loaded here: judge models are loaded when a run or an evaluation \
                 starts (a task swapped in later, or `wirl serve`, has the served model only)"
            )))),
        }
    }
}

/// An `inference` that refuses every call with its reason.
struct Refusal(String);

impl InferenceHost for Refusal {
    fn generate(
        &self,
        _conversations: Vec<Vec<wirl_sandbox::Message>>,
        _sampling: wirl_sandbox::Sampling,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<wirl_sandbox::Completion>, String>> + Send + '_>> {
        Box::pin(std::future::ready(Err(self.0.clone())))
    }

    fn logprobs(
        &self,
        _replies: Vec<wirl_sandbox::ReplyToScore>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<wirl_sandbox::ReplyLogprobs>, String>> + Send + '_>> {
        Box::pin(std::future::ready(Err(self.0.clone())))
    }
}

/// The reward model at `path`, shared: every task (and a swapped-in task set) naming the same
/// directory gets the copy already loaded in this process while any still holds it, instead
/// of its own (a reward model is a second model's weights). Loads are one at a time.
pub fn shared_reward_model(path: &std::path::Path) -> crate::error::Result<Arc<RewardModel>> {
    static LOADED: std::sync::Mutex<BTreeMap<std::path::PathBuf, std::sync::Weak<RewardModel>>> =
        std::sync::Mutex::new(BTreeMap::new());
    // The same directory however it is written (relative, through a link).
    let key = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    loaded.retain(|_, model| model.strong_count() > 0);
    if let Some(model) = loaded.get(&key).and_then(std::sync::Weak::upgrade) {
        return Ok(model);
    }
    let model = Arc::new(RewardModel::load(path, &LoadOptions::default())?);
    loaded.insert(key, Arc::downgrade(&model));
    Ok(model)
}

/// One reward's scorer (a few per task: the plugin's size next to a model's pointer matters
/// not).
#[allow(clippy::large_enum_variant)]
enum Scorer {
    /// A plugin, with what one of its calls may ask of the model, and which model.
    Plugin(RewardPlugin, InferenceBudget, JudgeModel),
    /// A reward model, shared by the task's lanes (its weights are only read); `label`: which
    /// of its scores is the reward.
    Model { model: Arc<RewardModel>, label: usize },
}

impl Scorer {
    fn load(sandbox: &Sandbox, source: &RewardSource) -> crate::error::Result<Self> {
        match source {
            RewardSource::Plugin { inference, judge, .. } => {
                let spec = source.plugin_spec().expect("a plugin's source");
                Ok(Scorer::Plugin(RewardPlugin::new(sandbox.load(spec)?)?, *inference, judge.clone()))
            }
            RewardSource::Model(reference) => {
                let model = shared_reward_model(&reference.path)?;
                if reference.label >= model.labels() {
                    return Err(crate::error::invalid!(
                        "reward model {}: label {} is not one of its {} scores (id2label; label counts from 0)",
                        reference.path.display(),
                        reference.label,
                        model.labels()
                    ));
                }
                Ok(Scorer::Model { model, label: reference.label })
            }
        }
    }

    /// Its name in notes and parts: the plugin's, or the model directory's.
    fn name(&self) -> String {
        match self {
            Scorer::Plugin(plugin, ..) => plugin.plugin().name().to_string(),
            Scorer::Model { model, .. } => model
                .path()
                .file_name()
                .map_or_else(|| model.path().display().to_string(), |n| n.to_string_lossy().into()),
        }
    }

    /// Another scorer of the same reward, for another thread.
    fn another(&self) -> crate::error::Result<Self> {
        Ok(match self {
            Scorer::Plugin(plugin, budget, judge) => {
                Scorer::Plugin(RewardPlugin::new(plugin.plugin().clone())?, *budget, judge.clone())
            }
            Scorer::Model { model, label } => Scorer::Model { model: model.clone(), label: *label },
        })
    }

    /// The group's verdicts; a plugin's `inference` reaches its judge's engine of `engines`
    /// (none: an error to it), seeded by `call`.
    fn score_group(
        &mut self,
        task: &Task,
        completions: &[String],
        progress: Progress,
        (engines, call): (&Engines, u64),
    ) -> Vec<Result<Score, Failure>> {
        match self {
            Scorer::Plugin(plugin, budget, judge) => {
                plugin.set_inference(engines.host(judge, *budget, call));
                let verdicts = plugin.score_group_at(task, completions, progress);
                plugin.set_inference(None);
                verdicts
            }
            Scorer::Model { model, label } => score_with_model(model, *label, task, completions),
        }
    }
}

/// Each completion scored by `model` as the task's conversation with the completion as the
/// assistant's turn. A completion the model cannot read (past its context) fails alone, as a
/// plugin's `err`; a failed forward fails the group as the host's failure, never a 0.
fn score_with_model(
    model: &RewardModel,
    label: usize,
    task: &Task,
    completions: &[String],
) -> Vec<Result<Score, Failure>> {
    let messages: Vec<ChatMessage> =
        task.messages.iter().map(|m| ChatMessage { role: m.role.clone(), content: m.content.clone() }).collect();
    let mut verdicts: Vec<Result<Score, Failure>> = Vec::with_capacity(completions.len());
    let (mut indices, mut ids): (Vec<usize>, Vec<Vec<u32>>) = (Vec::new(), Vec::new());
    for (i, completion) in completions.iter().enumerate() {
        match model.conversation_ids(&messages, completion) {
            Ok(text) => {
                indices.push(i);
                ids.push(text);
                verdicts.push(Err(Failure::guest(String::new())));
            }
            Err(error) => verdicts.push(Err(Failure::guest(wirl_engine::error_chain(&error)))),
        }
    }
    let scored = match model.score(&ids) {
        Ok(scored) => scored,
        Err(error) => {
            let message = format!("reward model {}: {}", model.path().display(), wirl_engine::error_chain(&error));
            return completions
                .iter()
                .map(|_| Err(Failure { kind: FailureKind::Infrastructure, message: message.clone() }))
                .collect();
        }
    };
    for (i, scores) in indices.into_iter().zip(scored) {
        verdicts[i] = match scores {
            Ok(scores) if scores[label].is_finite() => {
                Ok(Score { reward: scores[label], parts: Vec::new(), note: None })
            }
            Ok(scores) => Err(Failure {
                kind: FailureKind::NonFinite,
                message: format!("the reward model's score is {}", scores[label]),
            }),
            Err(refused) => Err(Failure::guest(refused.to_string())),
        };
    }
    verdicts
}

/// The rewards of a task (plugins and reward models), with their weights.
pub struct Scorers {
    plugins: Vec<(Scorer, f32)>,
    /// A remote task's: its server scores (its reward plugins, not these).
    remote: Option<crate::remote::RemoteTasks>,
    /// Each plugin's name in notes and namespaced parts: its file's name, with `#2`, `#3`
    /// for further entries of one file, so that no two coincide.
    labels: Vec<String>,
    /// Instances of the same plugins for the further threads of [`Scorers::score_groups`],
    /// made when first needed.
    lanes: Vec<Scorers>,
    /// What 0.2.0 plugins' `inference` reaches ([`Scorers::set_engine`],
    /// [`Scorers::set_judges`]); none outside a training run.
    engines: Engines,
}

impl Scorers {
    /// Load the rewards: plugins (a grader with its code runner) and reward models.
    pub fn load(sandbox: &Sandbox, specs: &[RewardSpec]) -> crate::error::Result<Self> {
        let mut plugins = Vec::new();
        for reward in specs {
            plugins.push((Scorer::load(sandbox, &reward.source)?, reward.weight));
        }
        let mut labels: Vec<String> = Vec::new();
        for (scorer, _) in &plugins {
            let name = scorer.name();
            let taken = labels.iter().filter(|l| **l == name || l.starts_with(&format!("{name}#"))).count();
            labels.push(if taken == 0 { name.to_string() } else { format!("{name}#{}", taken + 1) });
        }
        Ok(Scorers { plugins, labels, remote: None, lanes: Vec::new(), engines: Engines::default() })
    }

    /// The scorers of a task from `source`: a remote task's server, else the plugins of
    /// `specs`.
    pub fn for_source(
        sandbox: &Sandbox,
        source: &crate::TaskSource,
        specs: &[RewardSpec],
    ) -> crate::error::Result<Self> {
        match source {
            crate::TaskSource::Remote(remote) => Ok(Scorers {
                plugins: Vec::new(),
                labels: Vec::new(),
                remote: Some((**remote).clone()),
                lanes: Vec::new(),
                engines: Engines::default(),
            }),
            _ => Self::load(sandbox, specs),
        }
    }

    /// Let 0.2.0 plugins' `inference.generate` reach `engine` (a training run's engine:
    /// LLM judges), each scoring call within its `[[rewards]]` entry's budget; `None`: such a
    /// call is an error to the plugin.
    pub fn set_engine(&mut self, engine: Option<RewardEngine>) {
        for lane in &mut self.lanes {
            lane.set_engine(engine.clone());
        }
        self.engines.policy = engine;
    }

    /// The engines of the run's other judge models (`judge_model = "initial"` or a path),
    /// by model; a reward judging with one not here is refused, saying so.
    pub fn set_judges(&mut self, judges: &BTreeMap<JudgeModel, RewardEngine>) {
        for lane in &mut self.lanes {
            lane.set_judges(judges);
        }
        self.engines.judges = judges.clone();
    }

    /// The judge models of this task's rewards other than the policy.
    pub fn judge_models(&self) -> BTreeSet<JudgeModel> {
        self.plugins
            .iter()
            .filter_map(|(scorer, _)| match scorer {
                Scorer::Plugin(_, _, judge) if *judge != JudgeModel::Policy => Some(judge.clone()),
                _ => None,
            })
            .collect()
    }

    /// The loaded plugins, in config order (not the reward models).
    pub fn plugins(&self) -> impl Iterator<Item = &Arc<Plugin>> {
        self.plugins.iter().filter_map(|(scorer, _)| match scorer {
            Scorer::Plugin(plugin, ..) => Some(plugin.plugin()),
            Scorer::Model { .. } => None,
        })
    }

    /// How many groups [`Scorers::score_groups`] scores at once: the most worker processes
    /// any of the plugins' code runners has (programs in process, or no code runner: one).
    pub fn parallelism(&self) -> usize {
        self.plugins().filter_map(|p| p.code_runner()).map(|runner| runner.workers()).max().unwrap_or(0).max(1)
    }

    /// Score several groups, each as [`Scorers::score_group`] does, in the order given. Where
    /// the plugins' code runners have worker processes, as many groups are scored at once
    /// (a grader sends its programs one at a time, so one group cannot use more than one
    /// worker), each thread with instances of its own; one after another otherwise.
    pub fn score_groups(&mut self, groups: &[(&Task, &[String], Progress)], policy: FailurePolicy) -> Vec<Vec<Scored>> {
        let lanes = self.parallelism().min(groups.len());
        if lanes <= 1 || self.remote.is_some() {
            return groups
                .iter()
                .map(|(task, completions, progress)| self.score_group(task, completions, policy, *progress))
                .collect();
        }
        while self.lanes.len() + 1 < lanes {
            match self.another() {
                Ok(lane) => self.lanes.push(lane),
                Err(error) => {
                    // Scored by the lanes there are (at worst this one): slower, nothing lost.
                    tracing::warn!("scoring groups at once: {}", printable(&error.to_string()));
                    break;
                }
            }
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let mut others = std::mem::take(&mut self.lanes);
        let mut scored: Vec<(usize, Vec<Scored>)> = std::thread::scope(|scope| {
            let take = |scorers: &mut Scorers| {
                let mut done = Vec::new();
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some((task, completions, progress)) = groups.get(i) else { return done };
                    done.push((i, scorers.score_group(task, completions, policy, *progress)));
                }
            };
            let handles: Vec<_> =
                others.iter_mut().take(lanes - 1).map(|lane| scope.spawn(move || take(lane))).collect();
            let mut all = take(self);
            for handle in handles {
                all.extend(handle.join().expect("a scoring thread panicked"));
            }
            all
        });
        self.lanes = others;
        scored.sort_by_key(|(i, _)| *i);
        scored.into_iter().map(|(_, scores)| scores).collect()
    }

    /// Fresh instances of the same plugins, weights and labels.
    fn another(&self) -> crate::error::Result<Scorers> {
        let plugins = self
            .plugins
            .iter()
            .map(|(scorer, weight)| Ok((scorer.another()?, *weight)))
            .collect::<crate::error::Result<_>>()?;
        Ok(Scorers {
            plugins,
            labels: self.labels.clone(),
            remote: None,
            lanes: Vec::new(),
            engines: self.engines.clone(),
        })
    }

    fn weights(&self) -> Vec<f32> {
        self.plugins.iter().map(|(_, weight)| *weight).collect()
    }

    /// Score one group at the run's `progress` (which 0.2.0 plugins are told): every
    /// plugin's weighted reward summed. A failing call is recorded (its kind, its message in
    /// the notes) and handled by `policy`.
    pub fn score_group(
        &mut self,
        task: &Task,
        completions: &[String],
        policy: FailurePolicy,
        progress: Progress,
    ) -> Vec<Scored> {
        if let Some(remote) = &self.remote {
            return remote.score_group(task, completions, policy);
        }
        let failure_reward = match policy.on_failure {
            OnFailure::Reward => policy.failure_reward,
            OnFailure::Mask => 0.0,
        };
        let mut scored: Vec<Scored> = completions.iter().map(|_| Scored::default()).collect();
        let mut given: Vec<Vec<(String, String, f32)>> = completions.iter().map(|_| Vec::new()).collect();
        for (index, ((plugin, weight), name)) in self.plugins.iter_mut().zip(&self.labels).enumerate() {
            // A judge's samples are seeded by the problem, the step and the reward: the same
            // whichever thread or batch scores the group.
            let call = task_hash(&task.id) ^ (progress.step << 40) ^ index as u64;
            let verdicts = plugin.score_group(task, completions, progress, (&self.engines, call));
            for ((out, parts), verdict) in scored.iter_mut().zip(&mut given).zip(verdicts) {
                match verdict {
                    Ok(score) => {
                        out.reward += *weight * score.reward;
                        parts.extend(score.parts.into_iter().map(|(part, value)| (name.clone(), part, value)));
                        if let Some(note) = score.note {
                            out.notes.insert(name.clone(), note);
                        }
                    }
                    Err(failure) => {
                        out.reward += *weight * failure_reward;
                        out.failures.push(failure.kind.name().to_string());
                        tracing::warn!("reward plugin {name}: {}", printable(&failure.to_string()));
                        out.notes.insert(name.clone(), failure.to_string());
                    }
                }
            }
        }
        for (out, parts) in scored.iter_mut().zip(given) {
            // Each reward and weight is finite, their sum need not be (a plugin's 3e38 twice):
            // an infinite reward would pass as "no signal", so it is a failed score instead.
            if !out.reward.is_finite() {
                let message =
                    format!("the weighted sum of the rewards is {} (weights {:?})", out.reward, self.weights());
                tracing::warn!("task {}: {message}", printable(&task.id));
                out.failures.push(wirl_sandbox::FailureKind::NonFinite.name().to_string());
                out.notes.insert("rewards".into(), message);
                out.reward = failure_reward;
            }
            out.parts = merge_parts(parts);
            if !out.failures.is_empty() {
                out.status = match policy.on_failure {
                    OnFailure::Reward => Status::Failed,
                    OnFailure::Mask => Status::Masked,
                };
            }
        }
        scored
    }
}

/// A stable hash of a task's id (FNV-1a), for seeds.
fn task_hash(id: &str) -> u64 {
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |hash, byte| (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3))
}

/// Merge the parts that each plugin gave one completion: names given by one plugin stay
/// as they are, names given by several are namespaced by plugin, so none overwrites another.
fn merge_parts(given: Vec<(String, String, f32)>) -> BTreeMap<String, f32> {
    let mut givers: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (plugin, part, _) in &given {
        givers.entry(part.as_str()).or_default().insert(plugin.as_str());
    }
    let shared: BTreeSet<String> =
        givers.into_iter().filter(|(_, plugins)| plugins.len() > 1).map(|(part, _)| part.to_string()).collect();
    given
        .into_iter()
        .map(
            |(plugin, part, value)| {
                if shared.contains(&part) { (format!("{plugin}/{part}"), value) } else { (part, value) }
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::merge_parts;

    #[test]
    fn shared_part_names_are_namespaced_by_plugin() {
        let given = vec![
            ("a".to_string(), "correct".to_string(), 1.0),
            ("b".to_string(), "correct".to_string(), 0.0),
            ("b".to_string(), "format".to_string(), 0.5),
        ];
        let parts = merge_parts(given);
        assert_eq!(parts.len(), 3);
        assert_eq!(parts["a/correct"], 1.0);
        assert_eq!(parts["b/correct"], 0.0);
        assert_eq!(parts["format"], 0.5);
    }
}
