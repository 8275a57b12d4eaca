//! `NativeEnvironment` and `NativeEpisode`: an environment plugin's tasks and multi-turn
//! episodes. Tasks and step results cross as JSON (the WIT records' serde form).

use crate::reward::plugin_spec;
use crate::{Loaded, plugin_error};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use std::sync::Mutex;
use wirl_sandbox::{EnvironmentPlugin, Episode, Failure, PluginSpec, Task};

#[pyclass(frozen, module = "wirl._native")]
pub struct NativeEnvironment {
    spec: PluginSpec,
    state: Mutex<(Loaded, EnvironmentPlugin)>,
}

/// A call's answer as Python sees it: (the value, or None when the call failed; `ok` or
/// the failure's kind; the failure's message).
type Answer<T> = (Option<T>, &'static str, String);

fn answer<T>(verdict: Result<T, Failure>) -> Answer<T> {
    match verdict {
        Ok(value) => (Some(value), "ok", String::new()),
        Err(failure) => (None, failure.kind.name(), failure.message),
    }
}

fn json(value: &impl serde::Serialize) -> PyResult<String> {
    serde_json::to_string(value).map_err(plugin_error)
}

#[pymethods]
impl NativeEnvironment {
    #[new]
    #[pyo3(signature = (plugin, config_json=None, deadline_ms=None, memory_mib=None, fuel=None))]
    fn new(
        py: Python<'_>,
        plugin: &str,
        config_json: Option<&str>,
        deadline_ms: Option<u64>,
        memory_mib: Option<u64>,
        fuel: Option<u64>,
    ) -> PyResult<Self> {
        let spec = plugin_spec(plugin, config_json, deadline_ms, memory_mib, fuel)?;
        let state = py.detach(|| load(&spec))?;
        Ok(NativeEnvironment { spec, state: Mutex::new(state) })
    }

    #[getter]
    fn sha256(&self) -> PyResult<String> {
        self.with(|_, environment| Ok(environment.plugin().sha256().to_string()))
    }

    /// (name, size or None, whether it runs episodes), or the failed call's (verdict,
    /// message) as a `PluginError`.
    fn describe(&self, py: Python<'_>) -> PyResult<(String, Option<u64>, bool)> {
        py.detach(|| {
            self.with(|_, environment| {
                let description = environment.describe().map_err(|f| plugin_error(format!("describe: {f}")))?;
                Ok((description.name, description.size, description.episodes))
            })
        })
    }

    /// The task at `index` for `seed`, as JSON.
    fn task_at(&self, py: Python<'_>, seed: u64, index: u64) -> PyResult<Answer<String>> {
        py.detach(|| {
            self.with(|_, environment| match environment.task_at(seed, index) {
                Ok(task) => Ok(answer(Ok(json(&task)?))),
                Err(failure) => Ok(answer(Err(failure))),
            })
        })
    }

    /// Begin an episode of a task (JSON).
    fn start(&self, py: Python<'_>, task_json: &str) -> PyResult<Answer<NativeEpisode>> {
        let task: Task =
            serde_json::from_str(task_json).map_err(|e| PyValueError::new_err(format!("not a task: {e}")))?;
        py.detach(|| {
            self.with(|_, environment| {
                Ok(answer(environment.start_episode(&task).map(|episode| NativeEpisode(Mutex::new(episode)))))
            })
        })
    }
}

impl NativeEnvironment {
    /// Call `f` with the plugin as loaded in this process: loaded again after a fork.
    fn with<R>(&self, f: impl FnOnce(&Loaded, &mut EnvironmentPlugin) -> PyResult<R>) -> PyResult<R> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if !state.0.is_ours() {
            crate::inherited(std::mem::replace(&mut *state, load(&self.spec)?));
        }
        let (loaded, environment) = &mut *state;
        f(loaded, environment)
    }
}

fn load(spec: &PluginSpec) -> PyResult<(Loaded, EnvironmentPlugin)> {
    let loaded = Loaded::load(spec)?;
    let environment = EnvironmentPlugin::new(loaded.plugin.clone()).map_err(plugin_error)?;
    Ok((loaded, environment))
}

/// One running episode, its state in an instance of its own.
#[pyclass(frozen, module = "wirl._native")]
pub struct NativeEpisode(Mutex<Episode>);

#[pymethods]
impl NativeEpisode {
    /// Give the model's reply: the step result as JSON (`{"Continue": {"messages": [...],
    /// "reward": r or null}}` or `{"Done": score}`); a failed call ends the episode.
    fn step(&self, py: Python<'_>, reply: &str) -> PyResult<Answer<String>> {
        py.detach(|| {
            let mut episode = self.0.lock().unwrap_or_else(|e| e.into_inner());
            match episode.step(reply) {
                Ok(result) => Ok(answer(Ok(json(&result)?))),
                Err(failure) => Ok(answer(Err(failure))),
            }
        })
    }
}
