//! `NativeReward`: a reward (or grader) plugin scoring batches on threads of its own.

use crate::inference::{OpenAiInference, OpenAiServer};
use crate::{Loaded, default_threads, parallel, plugin_error, spec_of};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use serde::Deserialize;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use wirl_sandbox::{Interrupter, Limits, Plugin, PluginSpec, Progress, RewardPlugin, Task};

/// The largest per-call memory a plugin may be given, in MiB: the sandbox's slot size.
const MAX_MEMORY_MIB: u64 = 4096;

/// One scored item as Python receives it: (reward or None, verdict, message, parts, note,
/// microseconds). The verdict is `ok` or the failure's kind (`deadline`, `memory`, …).
type Scored = (Option<f64>, &'static str, String, Vec<(String, f64)>, Option<String>, u64);

/// One item of a batch: a task and the completion to score for it.
#[derive(Deserialize)]
struct Item {
    task: Task,
    completion: String,
}

/// The plugin as loaded in this process, and the handles its threads left for reuse (a
/// handle keeps its instance between calls when the plugin's limits say `reuse_instance`).
struct State {
    loaded: Loaded,
    idle: Vec<RewardPlugin>,
}

#[pyclass(frozen, module = "wirl._native")]
pub struct NativeReward {
    spec: PluginSpec,
    threads: usize,
    state: Mutex<State>,
    /// Where a 0.2.0 plugin's `inference.generate` goes (an LLM judge's model); none: such a
    /// call is refused to the plugin with the reason.
    inference: Option<Arc<OpenAiServer>>,
}

/// Limits from the keyword arguments, each checked and named when out of range.
pub(crate) fn limits_from(
    mut limits: Limits,
    deadline_ms: Option<u64>,
    memory_mib: Option<u64>,
    fuel: Option<u64>,
) -> PyResult<Limits> {
    if let Some(ms) = deadline_ms {
        if !(1..=wirl_sandbox::MAX_DEADLINE_MS).contains(&ms) {
            return Err(PyValueError::new_err(format!(
                "deadline_ms must be between 1 and {}, not {ms}",
                wirl_sandbox::MAX_DEADLINE_MS
            )));
        }
        limits.deadline_ms = ms;
    }
    if let Some(mib) = memory_mib {
        if !(1..=MAX_MEMORY_MIB).contains(&mib) {
            return Err(PyValueError::new_err(format!("memory_mib must be between 1 and {MAX_MEMORY_MIB}, not {mib}")));
        }
        limits.memory_bytes = mib << 20;
    }
    limits.fuel = fuel.or(limits.fuel);
    Ok(limits)
}

/// The spec of a plugin reference with its config (JSON text) and per-call limits.
pub(crate) fn plugin_spec(
    plugin: &str,
    config_json: Option<&str>,
    deadline_ms: Option<u64>,
    memory_mib: Option<u64>,
    fuel: Option<u64>,
) -> PyResult<PluginSpec> {
    let mut spec = spec_of(plugin)?;
    spec.config = config_from(config_json)?;
    spec.limits = limits_from(spec.limits, deadline_ms, memory_mib, fuel)?;
    Ok(spec)
}

/// A plugin config from its JSON text: an object, or nothing.
fn config_from(json: Option<&str>) -> PyResult<serde_json::Map<String, serde_json::Value>> {
    match json {
        None => Ok(Default::default()),
        Some(text) => match serde_json::from_str(text) {
            Ok(serde_json::Value::Object(map)) => Ok(map),
            Ok(other) => Err(PyValueError::new_err(format!("config must be a dict, not {other}"))),
            Err(e) => Err(PyValueError::new_err(format!("config is not JSON: {e}"))),
        },
    }
}

#[pymethods]
impl NativeReward {
    #[new]
    #[pyo3(signature = (plugin, config_json=None, deadline_ms=None, memory_mib=None, fuel=None, reuse_instance=false, code_runner=None, code_workers=0, code_deadline_ms=None, code_memory_mib=None, threads=None, inference_url=None, inference_model=None, inference_api_key=None, inference_calls=8, inference_tokens=8192, inference_timeout_ms=120_000))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        plugin: &str,
        config_json: Option<&str>,
        deadline_ms: Option<u64>,
        memory_mib: Option<u64>,
        fuel: Option<u64>,
        reuse_instance: bool,
        code_runner: Option<&str>,
        code_workers: usize,
        code_deadline_ms: Option<u64>,
        code_memory_mib: Option<u64>,
        threads: Option<usize>,
        inference_url: Option<&str>,
        inference_model: Option<String>,
        inference_api_key: Option<String>,
        inference_calls: u64,
        inference_tokens: u64,
        inference_timeout_ms: u64,
    ) -> PyResult<Self> {
        let inference = match inference_url {
            None => None,
            Some(url) => {
                if inference_calls == 0 || inference_tokens == 0 || inference_timeout_ms == 0 {
                    return Err(PyValueError::new_err(
                        "inference_calls, inference_tokens and inference_timeout_ms must be at least 1",
                    ));
                }
                let model = inference_model;
                let timeout = std::time::Duration::from_millis(inference_timeout_ms);
                let server =
                    OpenAiServer::new(url, model, inference_api_key, timeout, inference_calls, inference_tokens)
                        .map_err(PyValueError::new_err)?;
                Some(Arc::new(server))
            }
        };
        let mut spec = plugin_spec(plugin, config_json, deadline_ms, memory_mib, fuel)?;
        spec.limits.reuse_instance = reuse_instance;
        if let Some(runner) = code_runner {
            if code_workers > wirl_sandbox::MAX_WORKERS {
                return Err(PyValueError::new_err(format!(
                    "code_workers must be at most {}, not {code_workers}",
                    wirl_sandbox::MAX_WORKERS
                )));
            }
            spec.code_runner = Some(Box::new(PluginSpec {
                limits: limits_from(Limits::code_runner(), code_deadline_ms, code_memory_mib, None)?,
                workers: code_workers,
                ..spec_of(runner)?
            }));
        }
        let threads = match threads {
            Some(0) => return Err(PyValueError::new_err("threads must be at least 1")),
            Some(n) => n,
            None => default_threads(),
        };
        // Loading compiles the component (or reads it from the cache): seconds at most, but
        // without the GIL, so other Python threads go on.
        let loaded = py.detach(|| Loaded::load(&spec))?;
        if !loaded.plugin.world().scores() {
            return Err(plugin_error(format!(
                "{} implements the {} world; a reward needs a reward-plugin or grader-plugin",
                plugin,
                loaded.plugin.world()
            )));
        }
        let first = RewardPlugin::new(loaded.plugin.clone()).map_err(plugin_error)?;
        Ok(NativeReward { spec, threads, state: Mutex::new(State { loaded, idle: vec![first] }), inference })
    }

    /// The plugin's name (its file's stem, or the built-in's).
    #[getter]
    fn name(&self) -> String {
        self.spec.name.clone()
    }

    /// The sha256 of the component's bytes.
    #[getter]
    fn sha256(&self) -> PyResult<String> {
        Ok(self.current()?.0.sha256().to_string())
    }

    /// The sha256 of the grader's code runner, when it has one.
    #[getter]
    fn code_runner_sha256(&self) -> PyResult<Option<String>> {
        Ok(self.current()?.0.code_runner().map(|runner| runner.plugin().sha256().to_string()))
    }

    /// `reward-plugin` or `grader-plugin`.
    #[getter]
    fn world(&self) -> PyResult<&'static str> {
        Ok(self.current()?.0.world().name())
    }

    #[getter]
    fn threads(&self) -> usize {
        self.threads
    }

    /// Score a batch given as a JSON array of `{"task": {...}, "completion": "..."}`, on
    /// the handle's threads without the GIL, at training step `step` of `steps` (0 of 0:
    /// outside training), which a `wirl:rl@0.2.0` plugin is told.
    #[pyo3(signature = (batch_json, step=0, steps=0))]
    fn score(&self, py: Python<'_>, batch_json: &str, step: u64, steps: u64) -> PyResult<Vec<Scored>> {
        let items: Vec<Item> = serde_json::from_str(batch_json)
            .map_err(|e| PyValueError::new_err(format!("a batch must be a list of {{task, completion}}: {e}")))?;
        let (plugin, interrupter) = self.current()?;
        self.score_items(py, &plugin, &interrupter, &items, Progress { step, steps })
    }
}

impl NativeReward {
    /// The plugin as loaded in this process: loaded again after a fork.
    fn current(&self) -> PyResult<(Arc<Plugin>, Interrupter)> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.loaded.is_ours() {
            crate::inherited(std::mem::replace(
                &mut *state,
                State { loaded: Loaded::load(&self.spec)?, idle: Vec::new() },
            ));
        }
        Ok((state.loaded.plugin.clone(), state.loaded.sandbox.interrupter()))
    }

    fn score_items(
        &self,
        py: Python<'_>,
        plugin: &Arc<Plugin>,
        interrupter: &Interrupter,
        items: &[Item],
        progress: Progress,
    ) -> PyResult<Vec<Scored>> {
        let take = || {
            let idle = self.state.lock().unwrap_or_else(|e| e.into_inner()).idle.pop();
            match idle {
                Some(handle) if Arc::ptr_eq(handle.plugin(), plugin) => Ok(handle),
                _ => RewardPlugin::new(plugin.clone()).map_err(|e| e.to_string()),
            }
        };
        let give_back = |handle: RewardPlugin| self.state.lock().unwrap_or_else(|e| e.into_inner()).idle.push(handle);
        parallel(py, interrupter, items, self.threads, take, give_back, |handle, item| {
            let started = Instant::now();
            // Each scoring call with a budget of its own, as in `wirl train`.
            handle.set_inference(
                self.inference
                    .clone()
                    .map(|server| Arc::new(OpenAiInference::new(server)) as Arc<dyn wirl_sandbox::InferenceHost>),
            );
            let verdict = handle.score_at(&item.task, &item.completion, progress);
            handle.set_inference(None);
            let micros = started.elapsed().as_micros() as u64;
            match verdict {
                Ok(score) => (
                    Some(f64::from(score.reward)),
                    "ok",
                    String::new(),
                    score.parts.into_iter().map(|(name, value)| (name, f64::from(value))).collect(),
                    score.note,
                    micros,
                ),
                Err(failure) => (None, failure.kind.name(), failure.message, Vec::new(), None, micros),
            }
        })
    }
}
