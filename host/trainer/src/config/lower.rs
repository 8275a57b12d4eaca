//! A checked config lowered into the [`RunConfig`] the trainer runs on: each task (of
//! `[[tasks]]` or the single-source keys) as a `TaskSpec` whose source is an enum.

use super::*;

/// A TOML table as the plugin's JSON config.
fn json_config(table: &toml::Table) -> serde_json::Map<String, serde_json::Value> {
    table.iter().map(|(key, value)| (key.clone(), serde_json::to_value(value).unwrap_or_default())).collect()
}

/// One task as the config gives it, `[[tasks]]` or the single-source keys alike, with the
/// key prefix that its errors name.
pub(super) struct TaskView<'a> {
    /// `tasks[1].` or empty.
    pub(super) key: String,
    pub(super) name: String,
    pub(super) weight: f64,
    pub(super) eval_only: bool,
    pub(super) environment: Option<&'a PluginSection>,
    pub(super) dataset: Option<&'a DatasetSection>,
    pub(super) agent: Option<&'a AgentSection>,
    pub(super) remote: Option<&'a RemoteSection>,
    pub(super) openenv: Option<&'a OpenEnvSection>,
    pub(super) rewards: &'a [RewardSection],
    /// `tasks[1].rewards` or `rewards`.
    pub(super) rewards_key: String,
    pub(super) sampling: &'a SamplingOverrides,
    pub(super) on_failure: Option<OnFailure>,
    pub(super) max_turns: usize,
    pub(super) pass_reward: Option<f32>,
    /// Whether the task named rewards of its own (not the shared ones).
    pub(super) own_rewards: bool,
}

static NO_OVERRIDES: SamplingOverrides =
    SamplingOverrides { max_tokens: None, temperature: None, top_p: None, top_k: None };

impl TaskView<'_> {
    fn sampling(&self, run: &SamplingSection) -> SamplingSpec {
        let own = self.sampling;
        SamplingSpec {
            max_tokens: own.max_tokens.unwrap_or(run.max_tokens),
            temperature: own.temperature.unwrap_or(run.temperature),
            top_p: own.top_p.unwrap_or(run.top_p),
            top_k: own.top_k.unwrap_or(run.top_k),
        }
    }
}

/// A plugin's name as its file would give it: `arithmetic` for `.../arithmetic.wasm` and for
/// `builtin:arithmetic`.
fn plugin_stem(reference: &Path) -> String {
    match wirl_builtins::lookup(reference) {
        Ok(Some(builtin)) => builtin.spec().name,
        _ => reference.file_stem().map_or("plugin".into(), |s| s.to_string_lossy().into_owned()),
    }
}

/// A plugin entry of any section (environment, reward, agent) as the rollout layer's spec.
fn plugin_ref(path: &Path, config: &toml::Table, deadline_ms: Option<u64>, memory_mib: Option<u64>) -> PluginRef {
    PluginRef { path: path.to_path_buf(), stored: None, config: json_config(config), deadline_ms, memory_mib }
}

impl TrainConfig {
    /// The tasks, `[[tasks]]` or the one of the single-source keys (named after its
    /// environment plugin's file, or `dataset`).
    pub(super) fn task_views(&self) -> Vec<TaskView<'_>> {
        if self.tasks.is_empty() {
            let name = match &self.environment {
                Some(environment) => plugin_stem(&environment.plugin),
                None => "dataset".to_string(),
            };
            return vec![TaskView {
                key: String::new(),
                name,
                weight: 1.0,
                eval_only: false,
                environment: self.environment.as_ref(),
                dataset: self.dataset.as_ref(),
                agent: None,
                remote: None,
                openenv: None,
                rewards: &self.rewards,
                rewards_key: "rewards".into(),
                sampling: &NO_OVERRIDES,
                on_failure: None,
                max_turns: 1,
                pass_reward: None,
                own_rewards: true,
            }];
        }
        self.tasks
            .iter()
            .enumerate()
            .map(|(i, task)| {
                let (rewards, rewards_key) = if task.rewards.is_empty() {
                    (&self.rewards[..], "rewards".to_string())
                } else {
                    (&task.rewards[..], format!("tasks[{i}].rewards"))
                };
                TaskView {
                    key: format!("tasks[{i}]."),
                    name: task.name.clone(),
                    weight: task.weight,
                    eval_only: task.eval_only,
                    environment: task.environment.as_ref(),
                    dataset: task.dataset.as_ref(),
                    agent: task.agent.as_ref(),
                    remote: task.remote.as_ref(),
                    openenv: task.openenv.as_ref(),
                    rewards,
                    rewards_key,
                    sampling: &task.sampling,
                    on_failure: task.on_failure,
                    max_turns: task.max_turns,
                    pass_reward: task.pass_reward,
                    own_rewards: !task.rewards.is_empty(),
                }
            })
            .collect()
    }

    /// The validated form. Only for a config that `parse` (or `check_numbers`, after an
    /// override) accepted.
    pub fn run_config(&self) -> crate::error::Result<RunConfig> {
        let mut tasks = Vec::new();
        for view in self.task_views() {
            let source = view.source_spec()?;
            // A multi-turn task is scored by its episodes, an agent by itself.
            let rewards = if view.max_turns > 1 || view.agent.is_some() { Vec::new() } else { view.reward_specs() };
            tasks.push(TaskSpec {
                max_turns: view.max_turns,
                pass_reward: view.pass_reward.unwrap_or(self.grpo.pass_reward),
                failures: FailurePolicy {
                    on_failure: view.on_failure.unwrap_or(self.grpo.on_failure),
                    failure_reward: self.grpo.failure_reward,
                },
                weight: if view.eval_only { 0.0 } else { view.weight },
                sampling: view.sampling(&self.sampling),
                name: view.name,
                source,
                rewards,
            });
        }
        let s = &self.sampling;
        let continues =
            tasks.iter().any(|t| t.max_turns > 1 || matches!(t.source, wirl_rollout::SourceSpec::Agent { .. }));
        let prefix_cache_mib =
            self.model.prefix_cache_mib.unwrap_or(if continues { super::DEFAULT_PREFIX_CACHE_MIB } else { 0 });
        Ok(RunConfig {
            model: self.model.path.clone(),
            device: self.model.device.as_deref().and_then(DeviceSpec::parse).unwrap_or_default(),
            prefix_cache_bytes: prefix_cache_mib.saturating_mul(1 << 20),
            inference_dtype: self.model.inference_dtype.as_deref().and_then(super::parse_inference_dtype),
            train_dtype: self
                .model
                .train_dtype
                .as_deref()
                .and_then(super::parse_train_dtype)
                .unwrap_or(candle_core::DType::F32),
            device_sampling: self.model.device_sampling.unwrap_or(false),
            tf32: self.model.tf32.unwrap_or(false),
            chat_template_kwargs: self.model.chat_template_kwargs.clone(),
            tasks,
            sampling: SamplingSpec {
                max_tokens: s.max_tokens,
                temperature: s.temperature,
                top_p: s.top_p,
                top_k: s.top_k,
            },
            objective: self.grpo.objective(),
            grpo: self.grpo.clone(),
            eval: self.eval.clone(),
            lora: self.lora.clone(),
            distill: self.distill.clone(),
        })
    }
}

impl GrpoSection {
    /// The objective its tables choose, lowered once (each parameter is already in the one
    /// variant that reads it; `validate.rs` has checked the numbers).
    pub fn objective(&self) -> wirl_grpo::Objective {
        use super::{KlSpec, LossSpec};
        use wirl_grpo::{KlTarget, KlTerm, PolicyTerm};
        let policy = match self.loss {
            LossSpec::Grpo { clip_low, clip_high } => PolicyTerm::Grpo { clip_low, clip_high },
            LossSpec::Gspo { clip_low, clip_high } => PolicyTerm::Gspo { clip_low, clip_high },
            LossSpec::Cispo { clip_high } => PolicyTerm::Cispo { clip_high },
            LossSpec::Sapo { temperature_pos, temperature_neg } => {
                PolicyTerm::Sapo { temperature_pos, temperature_neg }
            }
        };
        let kl = match self.kl {
            KlSpec::Off {} => KlTerm::Off,
            KlSpec::Loss { beta, estimator } => KlTerm::InLoss { beta, estimator },
            KlSpec::Reward { beta, estimator, target, horizon } => KlTerm::InReward {
                beta,
                estimator,
                target: target
                    .map(|kl| KlTarget { kl, horizon: horizon.unwrap_or(wirl_grpo::AdaptiveKl::DEFAULT_HORIZON) }),
            },
        };
        wirl_grpo::Objective {
            policy,
            advantage: self.advantage,
            aggregation: self.aggregation,
            kl,
            entropy: self.entropy,
            overlong: self
                .overlong
                .filter(|o| o.buffer > 0)
                .map(|o| wirl_grpo::Overlong { buffer: o.buffer, penalty: o.penalty }),
            mask_truncated: self.mask_truncated,
            correction: self.correction.lowered(),
        }
    }
}

impl TaskView<'_> {
    /// Where the task's problems come from: exactly one source (checked on load).
    fn source_spec(&self) -> crate::error::Result<SourceSpec> {
        if let Some(remote) = self.remote {
            return self.remote_spec(remote);
        }
        if let Some(openenv) = self.openenv {
            return Ok(SourceSpec::OpenEnv {
                spec: wirl_rollout::OpenEnvSpec {
                    url: openenv.url.trim_end_matches('/').to_string(),
                    action_field: openenv.action_field.clone(),
                    observation_field: openenv.observation_field.clone(),
                    system: openenv.system.clone(),
                    timeout: std::time::Duration::from_secs_f64(openenv.timeout_s),
                    retries: openenv.retries,
                },
                seed: openenv.seed,
            });
        }
        Ok(match (self.environment, self.dataset, self.agent) {
            (Some(e), None, None) => SourceSpec::Environment {
                plugin: plugin_ref(&e.plugin, &e.config, e.deadline_ms, e.memory_mib),
                seed: e.seed,
            },
            (None, Some(dataset), None) => SourceSpec::Dataset {
                train: dataset_spec(dataset, &dataset.train),
                eval: dataset_spec(dataset, &dataset.eval),
            },
            (None, None, Some(agent)) => SourceSpec::Agent {
                plugin: plugin_ref(&agent.plugin, &agent.config, agent.deadline_ms, agent.memory_mib),
                limits: AgentLimits { generate_calls: agent.max_generate_calls, tokens: agent.max_tokens },
            },
            _ => bail!("task `{}` needs exactly one source: an environment, a dataset or an agent", self.name),
        })
    }

    /// A remote task, its API key read from the environment variable the config names.
    fn remote_spec(&self, remote: &RemoteSection) -> crate::error::Result<SourceSpec> {
        let api_key = match &remote.api_key_env {
            None => None,
            Some(variable) => Some(std::env::var(variable).map_err(|_| {
                crate::error::invalid!(
                    "task `{}`: remote.api_key_env names {variable}, which is not set: export it with the server's key",
                    self.name
                )
            })?),
        };
        Ok(SourceSpec::Remote(wirl_rollout::RemoteSpec {
            url: remote.url.clone(),
            task: remote.task.clone(),
            timeout: std::time::Duration::from_secs_f64(remote.timeout_s),
            retries: remote.retries,
            api_key,
        }))
    }

    /// The task's reward plugins (its own, or the shared ones).
    fn reward_specs(&self) -> Vec<RewardSpec> {
        self.rewards
            .iter()
            .map(|reward| {
                let source = match (&reward.plugin, &reward.model) {
                    (_, Some(model)) => {
                        RewardSource::Model(RewardModelRef { path: model.clone(), label: reward.label.unwrap_or(0) })
                    }
                    // Validation made sure one is given: a missing one reads as an empty path,
                    // which loading names.
                    (plugin, None) => RewardSource::Plugin {
                        plugin: plugin_ref(
                            plugin.as_deref().unwrap_or(Path::new("")),
                            &reward.config,
                            reward.deadline_ms,
                            reward.memory_mib,
                        ),
                        code_runner: reward.code_runner.as_ref().map(|runner| CodeRunnerRef {
                            path: runner.plugin.clone(),
                            stored: None,
                            deadline_ms: runner.deadline_ms,
                            memory_mib: runner.memory_mib,
                            workers: runner.workers,
                        }),
                        inference: InferenceBudget {
                            calls: reward.inference_calls.unwrap_or(InferenceBudget::default().calls),
                            tokens: reward.inference_tokens.unwrap_or(InferenceBudget::default().tokens),
                        },
                        judge: match reward.judge_model.as_deref() {
                            None => JudgeModel::Policy,
                            Some(path) if path.as_os_str() == "policy" => JudgeModel::Policy,
                            Some(path) if path.as_os_str() == "initial" => JudgeModel::Initial,
                            Some(path) => JudgeModel::Path(path.to_path_buf()),
                        },
                    },
                };
                RewardSpec { source, weight: reward.weight }
            })
            .collect()
    }
}

/// One of a dataset's files (`train` or `eval`) as the rollout layer's spec.
fn dataset_spec(dataset: &DatasetSection, path: &Option<PathBuf>) -> Option<Box<DatasetSpec>> {
    path.as_ref().map(|path| {
        Box::new(DatasetSpec {
            path: path.clone(),
            columns: dataset.columns.as_ref().map(|c| Columns {
                prompt: c.prompt.clone(),
                messages: c.messages.clone(),
                system: c.system.clone(),
                answer: c.answer.clone(),
                id: c.id.clone(),
                metadata: c.metadata.clone(),
            }),
            shuffle: dataset.shuffle,
            seed: dataset.seed,
        })
    })
}
