//! Tasks served over HTTP (`wirl serve --config TRAIN.toml`): the config's tasks, loaded as
//! `wirl train` loads them (sources and reward plugins from `wirl-rollout`), behind
//!
//! - `GET /v1/tasks` and `POST /v1/tasks/draw`: what is served; tasks by seed and index;
//! - `POST /v1/score` (a group, or several) and OpenRLHF's `POST /get_reward`;
//! - `POST /v1/episodes`, `POST /v1/episodes/{id}/step`, `DELETE /v1/episodes/{id}`: stateful
//!   episodes (reset / step), each in an instance of its own, reaped when idle;
//! - Megatron-RL's `POST /rollouts/`, `/grouped_rollouts/`, `/evaluation/`: token rollouts
//!   sampled by this server's engine and scored here.
//!
//! Plugin calls block: they run on tokio's blocking threads, one task's plugins at a time.

use crate::openai::Widened;
use crate::request::{self, Fields};
use crate::task_replies::{
    Closed, DrawReply, Drawn, EpisodeStarted, EpisodeStep, EvalReply, EvalResult, GroupScores, GroupsReply,
    Observation, PluginInfo, RewardReply, Rewards, SamplingInfo, ScoreInfo, ScoreReply, TaskInfo, TaskList,
    TokenRollout, usable_reward,
};
use crate::{ApiError, AppState};
use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use wirl_engine::FinishReason;
use wirl_engine::sampling::rules;
use wirl_rollout::collect;
use wirl_rollout::{GroupAsk, LoadedTask, RolloutGroup, SamplingSpec, Scored, Status, TaskSource};
use wirl_sandbox::{Message, Progress, StepResult, Task, printable};

/// One task of the served config, loaded through the task runtime (as `wirl train` and
/// `wirl eval` load it), with what serving adds.
pub struct ServedTask {
    pub loaded: LoadedTask,
    /// Where an environment's held-out tasks start (`eval.first_index`).
    pub eval_first_index: u64,
    /// Seeds the samples of rollouts (the config's `grpo.seed`).
    pub seed: u64,
}

/// Limits of the task endpoints.
#[derive(Clone, Debug)]
pub struct TaskLimits {
    /// Groups (or rollouts, prompts) per rollout request, tasks per draw, groups per score.
    pub max_groups: usize,
    /// Completions per scored group; rollouts per group.
    pub max_group_size: usize,
    /// Episodes open at once; more are answered 503.
    pub max_sessions: usize,
    /// An episode not stepped for this long is closed.
    pub session_idle: Duration,
}

impl Default for TaskLimits {
    fn default() -> Self {
        crate::ServeSettings::default().task_limits()
    }
}

/// The served tasks and the open episodes.
pub(crate) struct Tasks {
    tasks: Vec<Arc<Mutex<ServedTask>>>,
    names: Vec<String>,
    /// Each task's next training index for rollout requests that name none.
    cursors: Vec<AtomicU64>,
    /// A description of each task, made once (its plugins and their sha256).
    described: Vec<TaskInfo>,
    sessions: Mutex<HashMap<String, Arc<Mutex<Session>>>>,
    /// Episodes being opened (their environment called outside the lock): counted against
    /// `max_sessions` with the open ones, so concurrent resets never open more than it.
    opening: AtomicU64,
    next_session: AtomicU64,
    limits: TaskLimits,
}

/// A place among the episodes, held while one opens; given back when dropped, once the
/// episode is in the table (or failed to open).
struct Opening(Arc<Tasks>);

impl Opening {
    fn open(self, id: String, session: Session) {
        lock(&self.0.sessions).insert(id, Arc::new(Mutex::new(session)));
    }
}

impl Drop for Opening {
    fn drop(&mut self) {
        self.0.opening.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An open episode.
struct Session {
    task: usize,
    problem: Task,
    /// The environment's episode, for a multi-turn task; single-turn sessions are scored
    /// by the task's reward plugins on their one step.
    episode: Option<Box<dyn wirl_rollout::EpisodeSteps + Send>>,
    turns: usize,
    max_turns: usize,
    done: bool,
    last_used: Instant,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Tasks {
    /// The served tasks; a thread closes idle episodes for as long as they are served.
    pub(crate) fn new(tasks: Vec<ServedTask>, limits: TaskLimits) -> Arc<Self> {
        let described = tasks.iter().map(describe).collect();
        let names = tasks.iter().map(|t| t.loaded.spec.name.clone()).collect();
        let cursors = tasks.iter().map(|_| AtomicU64::new(0)).collect();
        let tasks = Arc::new(Tasks {
            tasks: tasks.into_iter().map(|t| Arc::new(Mutex::new(t))).collect(),
            names,
            cursors,
            described,
            sessions: Mutex::default(),
            opening: AtomicU64::new(0),
            next_session: AtomicU64::new(1),
            limits,
        });
        let weak = Arc::downgrade(&tasks);
        let period = (tasks.limits.session_idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(5));
        let _ = std::thread::Builder::new().name("wirl-episode-reaper".into()).spawn(move || reap(weak, period));
        tasks
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Episodes open now.
    pub(crate) fn sessions(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// The task a request names in `field` (or the only one).
    fn find(&self, body: &Map<String, Value>, field: &str) -> Result<usize, ApiError> {
        match body.get(field) {
            None | Some(Value::Null) if self.tasks.len() == 1 => Ok(0),
            None | Some(Value::Null) => Err(ApiError::bad(
                Some(field),
                &format!("is needed: this server serves several tasks ({})", self.names.join(", ")),
            )),
            Some(Value::String(name)) => self.names.iter().position(|n| n == name).ok_or_else(|| ApiError {
                status: StatusCode::NOT_FOUND,
                message: format!("`{field}`: no task `{name}` here; served: {}", self.names.join(", ")),
                param: Some(field.to_string()),
                retry_after: None,
            }),
            Some(_) => Err(ApiError::bad(Some(field), "must be a task's name (a string)")),
        }
    }

    /// A place for one more episode, if the limit leaves one (counting those opening).
    fn reserve(self: &Arc<Self>) -> Option<Opening> {
        let sessions = lock(&self.sessions);
        let opening = self.opening.load(Ordering::SeqCst) as usize;
        if sessions.len() + opening >= self.limits.max_sessions {
            return None;
        }
        // Under the table's lock: a reservation and the check above cannot interleave.
        self.opening.fetch_add(1, Ordering::SeqCst);
        Some(Opening(self.clone()))
    }

    /// Close the episodes idle for longer than the limit; how many.
    fn sweep(&self) -> usize {
        let idle = self.limits.session_idle;
        let closed: Vec<Arc<Mutex<Session>>> = {
            let mut sessions = lock(&self.sessions);
            // A session being stepped is locked: it is in use, not idle.
            let stale: Vec<String> = sessions
                .iter()
                .filter(|(_, s)| s.try_lock().is_ok_and(|s| s.last_used.elapsed() >= idle))
                .map(|(id, _)| id.clone())
                .collect();
            stale.iter().filter_map(|id| sessions.remove(id)).collect()
        };
        // Closed here, outside the table's lock: closing a remote session talks to its server.
        closed.len()
    }

    /// Take episode `id` out of the table and close it on a blocking thread, away from the
    /// table's lock and the async handlers: closing a remote (OpenEnv) session is a network
    /// exchange, and a server that dribbles its goodbye once held every other request.
    fn close(&self, id: &str) {
        let removed = lock(&self.sessions).remove(id);
        if let Some(session) = removed {
            tokio::task::spawn_blocking(move || drop(session));
        }
    }
}

fn reap(tasks: Weak<Tasks>, period: Duration) {
    loop {
        std::thread::sleep(period);
        let Some(tasks) = tasks.upgrade() else { return };
        let closed = tasks.sweep();
        if closed > 0 {
            tracing::info!("closed {closed} idle episode(s)");
        }
    }
}

fn describe(task: &ServedTask) -> TaskInfo {
    let plugin =
        |p: &Arc<wirl_sandbox::Plugin>| PluginInfo { name: p.name().to_string(), sha256: p.sha256().to_string() };
    let kind = match &task.loaded.source {
        TaskSource::Environment { .. } => "environment",
        TaskSource::Dataset { .. } => "dataset",
        TaskSource::Agent { .. } => "agent",
        TaskSource::Remote(_) => "remote",
        TaskSource::OpenEnv(_) => "openenv",
    };
    let (spec, sampling) = (&task.loaded.spec, &task.loaded.spec.sampling);
    TaskInfo {
        max_turns: spec.max_turns,
        name: spec.name.clone(),
        on_failure: spec.failures.on_failure,
        rewards: task.loaded.scorers.plugins().map(plugin).collect(),
        sampling: SamplingInfo {
            max_tokens: sampling.max_tokens,
            temperature: sampling.temperature,
            top_k: sampling.top_k,
            top_p: sampling.top_p,
        },
        source: kind,
        source_plugin: task.loaded.source.plugin().map(plugin),
    }
}

fn served(state: &AppState) -> Result<Arc<Tasks>, ApiError> {
    state.tasks.clone().filter(|t| !t.is_empty()).ok_or_else(|| {
        ApiError::with_status(
            StatusCode::NOT_FOUND,
            "this server serves no tasks (start it with `wirl serve --config TRAIN.toml` to serve that config's \
             tasks, rewards and environments)"
                .into(),
        )
    })
}

/// Run blocking plugin work off the async workers, answered 504 at the server's deadline.
async fn blocking<T: Send + 'static>(
    state: &AppState,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    // The call itself cannot be cut from here: it ends within its plugin's own limits
    // (`deadline_ms`, a remote task's `timeout_s`) in the background, its task's lock held
    // until then, while the client has its answer at the server's deadline.
    let timeout = state.config.request_timeout;
    match tokio::time::timeout(timeout, tokio::task::spawn_blocking(work)).await {
        Err(_) => Err(ApiError::with_status(
            StatusCode::GATEWAY_TIMEOUT,
            format!(
                "the task's plugin call ran past this server's deadline of {} s (--timeout-s); it ends within its \
                 own limits",
                timeout.as_secs()
            ),
        )),
        Ok(joined) => joined.map_err(|e| {
            ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("the plugin call did not finish: {e}"))
        })?,
    }
}

fn count(body: &Map<String, Value>, field: &str, default: usize, max: usize) -> Result<usize, ApiError> {
    let value = Fields::of(body).unsigned(field, default as u64, max as u64)?;
    if value == 0 {
        return Err(ApiError::bad(Some(field), &format!("must be from 1 to {max}")));
    }
    Ok(value as usize)
}

/// A task as a client gives it: wirl's `{id, messages, answer, metadata}`, or `prompt`
/// (text, the user's message) in place of `messages`; `metadata` as JSON text or a value.
fn problem(value: Option<&Value>, field: &str) -> Result<Task, ApiError> {
    let Some(Value::Object(task)) = value else {
        return Err(ApiError::bad(
            Some(field),
            "must be a task: {\"messages\" or \"prompt\", \"answer\", \"metadata\"}",
        ));
    };
    let text = |key: &str| -> Result<Option<String>, ApiError> {
        match task.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(Value::Number(n)) if key == "answer" => Ok(Some(n.to_string())),
            Some(_) => Err(ApiError::bad(Some(&format!("{field}.{key}")), "must be a string")),
        }
    };
    let messages = match (task.get("messages"), text("prompt")?) {
        (Some(Value::Array(_)), _) => request::messages(task)
            .map_err(|e| ApiError::bad(Some(&format!("{field}.messages")), &e.message))?
            .into_iter()
            .map(|m| Message { role: m.role, content: m.content })
            .collect(),
        (None | Some(Value::Null), Some(prompt)) => vec![Message { role: "user".into(), content: prompt }],
        _ => return Err(ApiError::bad(Some(field), "needs `messages` (an array) or `prompt` (text)")),
    };
    let metadata = match task.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    Ok(Task { id: text("id")?.unwrap_or_default(), messages, answer: text("answer")?, metadata })
}

fn completions(value: Option<&Value>, field: &str, max: usize) -> Result<Vec<String>, ApiError> {
    let Some(Value::Array(items)) = value else {
        return Err(ApiError::bad(Some(field), "must be an array of completions (strings)"));
    };
    if items.is_empty() || items.len() > max {
        return Err(ApiError::bad(Some(field), &format!("must hold 1 to {max} completions")));
    }
    items
        .iter()
        .map(|item| match item {
            Value::String(text) => Ok(text.clone()),
            // TRL's conversational completions: [{"role": "assistant", "content": ...}].
            Value::Array(messages) => Ok(messages
                .iter()
                .filter_map(|m| m.get("content").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .concat()),
            _ => Err(ApiError::bad(Some(field), "must hold strings (or assistant messages)")),
        })
        .collect()
}

pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let tasks = served(&state)?;
    Ok(Json(TaskList { data: &tasks.described, object: "list" }).into_response())
}

/// `{task, index = 0, count = 1, seed, split = "train" | "eval"}`: tasks by index, each
/// `{index, task}` or `{index, error}` (the source could not give it).
pub(crate) async fn draw(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let tasks = served(&state)?;
    let body = request::object(&body)?;
    let t = tasks.find(&body, "task")?;
    let index = Fields::of(&body).unsigned("index", 0, u64::MAX / 2)?;
    let n = count(&body, "count", 1, tasks.limits.max_groups)?;
    let seed = body.get("seed").filter(|v| !v.is_null()).map(|v| v.as_u64().ok_or(())).transpose();
    let seed = seed.map_err(|()| ApiError::bad(Some("seed"), "must be a non-negative integer"))?;
    let eval = match body.get("split") {
        None | Some(Value::Null) => false,
        Some(Value::String(split)) if split == "train" => false,
        Some(Value::String(split)) if split == "eval" => true,
        _ => return Err(ApiError::bad(Some("split"), "must be \"train\" or \"eval\"")),
    };
    let task = tasks.tasks[t].clone();
    let drawn = blocking(&state, move || {
        let mut task = lock(&task);
        let first = task.eval_first_index;
        let out: Vec<Drawn> = match (&mut task.loaded.source, eval) {
            (TaskSource::Agent { .. }, _) => {
                return Err(ApiError::bad(Some("task"), "is an agent's: it makes rollouts, not tasks"));
            }
            (TaskSource::Remote(remote), eval) => remote
                .draw(index, n, eval)
                .map_err(|e| ApiError::with_status(StatusCode::BAD_GATEWAY, e.to_string()))?
                .into_iter()
                .zip(index..)
                .map(|(task, i)| match task {
                    Ok(problem) => Drawn::task(i, problem),
                    Err(error) => Drawn::error(i, wirl_engine::error_chain(&error)),
                })
                .collect(),
            (TaskSource::Environment { plugin, seed: own }, _) => (0..n as u64)
                .map(|k| {
                    let i = index + k;
                    let at = if eval { first.saturating_add(i) } else { i };
                    match plugin.task_at(seed.unwrap_or(*own), at) {
                        Ok(problem) => Drawn::task(i, problem),
                        Err(failure) => Drawn::error(i, failure.to_string()),
                    }
                })
                .collect(),
            (TaskSource::OpenEnv(server), _) => (0..n as u64)
                .map(|k| {
                    let i = index + k;
                    let at = if eval { first.saturating_add(i) } else { i };
                    match server.task_at(at) {
                        Ok(problem) => Drawn::task(i, problem),
                        Err(error) => Drawn::error(i, wirl_engine::error_chain(&error)),
                    }
                })
                .collect(),
            (source @ TaskSource::Dataset { .. }, false) => (0..n as u64)
                .map(|k| match source.training(index + k) {
                    Ok(problem) => Drawn::task(index + k, problem),
                    Err(error) => Drawn::error(index + k, wirl_engine::error_chain(&error)),
                })
                .collect(),
            (source @ TaskSource::Dataset { .. }, true) => source
                .held_out(0, index, n)
                .into_iter()
                .map(|(i, problem)| match problem {
                    Ok(problem) => Drawn::task(i, problem),
                    Err(reason) => Drawn::error(i, reason),
                })
                .collect(),
        };
        Ok(out)
    })
    .await?;
    Ok(Json(DrawReply { task: &tasks.names[t], tasks: drawn }).into_response())
}

/// `{task, problem, completions}` or `{task, groups: [{problem, completions}]}`: each
/// completion's reward by the task's reward plugins (summed by weight), status, parts,
/// failures and notes.
pub(crate) async fn score(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let tasks = served(&state)?;
    let body = request::object(&body)?;
    let t = tasks.find(&body, "task")?;
    let max = tasks.limits.max_group_size;
    let single = body.get("groups").is_none();
    let groups: Vec<(Task, Vec<String>)> = if single {
        vec![(problem(body.get("problem"), "problem")?, completions(body.get("completions"), "completions", max)?)]
    } else {
        let Some(Value::Array(groups)) = body.get("groups") else {
            return Err(ApiError::bad(Some("groups"), "must be an array of {problem, completions}"));
        };
        if groups.is_empty() || groups.len() > tasks.limits.max_groups {
            return Err(ApiError::bad(Some("groups"), &format!("must hold 1 to {} groups", tasks.limits.max_groups)));
        }
        groups
            .iter()
            .enumerate()
            .map(|(i, group)| {
                let field = format!("groups[{i}]");
                Ok((
                    problem(group.get("problem"), &format!("{field}.problem"))?,
                    completions(group.get("completions"), &format!("{field}.completions"), max)?,
                ))
            })
            .collect::<Result<_, ApiError>>()?
    };
    let task = tasks.tasks[t].clone();
    let results = blocking(&state, move || {
        let mut task = lock(&task);
        let policy = task.loaded.spec.failures;
        // At once where the task's graders run programs in worker processes.
        let asked: Vec<(&Task, &[String], Progress)> =
            groups.iter().map(|(p, c)| (p, c.as_slice(), Progress::OUTSIDE_TRAINING)).collect();
        Ok(task.loaded.scorers.score_groups(&asked, policy))
    })
    .await?;
    let name = &tasks.names[t];
    if single {
        let group = GroupScores::of(results.first().map_or(&[], Vec::as_slice));
        return Ok(Json(ScoreReply { rewards: group.rewards, scores: group.scores, task: name }).into_response());
    }
    Ok(Json(GroupsReply { groups: results.iter().map(|scores| GroupScores::of(scores)).collect(), task: name })
        .into_response())
}

/// OpenRLHF's remote reward: `{query: [prompt + response], prompts: [prompt], labels:
/// [answer]}` → `{rewards}`, each query scored alone by the task's plugins (the response is
/// the query past its prompt). A masked failure is null (and named in `failures`).
pub(crate) async fn get_reward(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let tasks = served(&state)?;
    let body = request::object(&body)?;
    let t = tasks.find(&body, "task")?;
    let strings = |field: &str, required: bool| -> Result<Option<Vec<String>>, ApiError> {
        match body.get(field) {
            None | Some(Value::Null) if !required => Ok(None),
            Some(Value::Array(items)) if items.len() <= tasks.limits.max_groups * tasks.limits.max_group_size => items
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .map(Some)
                .ok_or_else(|| ApiError::bad(Some(field), "must be an array of strings")),
            Some(Value::Array(_)) => Err(ApiError::bad(Some(field), "holds too many items")),
            _ => Err(ApiError::bad(Some(field), "must be an array of strings")),
        }
    };
    let queries = strings("query", true)?.unwrap_or_default();
    let prompts = strings("prompts", false)?;
    let labels = strings("labels", false)?;
    for (field, items) in [("prompts", &prompts), ("labels", &labels)] {
        if items.as_ref().is_some_and(|items| items.len() != queries.len()) {
            return Err(ApiError::bad(Some(field), "must have one item per `query`"));
        }
    }
    let task = tasks.tasks[t].clone();
    let results: Vec<Scored> = blocking(&state, move || {
        let mut task = lock(&task);
        let policy = task.loaded.spec.failures;
        Ok(queries
            .iter()
            .enumerate()
            .map(|(i, query)| {
                let prompt = prompts.as_ref().map(|p| p[i].clone()).unwrap_or_default();
                let response = query.strip_prefix(prompt.as_str()).unwrap_or(query).to_string();
                let problem = Task {
                    id: String::new(),
                    messages: vec![Message { role: "user".into(), content: prompt }],
                    answer: labels.as_ref().map(|l| l[i].clone()),
                    metadata: None,
                };
                task.loaded.scorers.score_group(&problem, &[response], policy, Progress::OUTSIDE_TRAINING).remove(0)
            })
            .collect())
    })
    .await?;
    Ok(Json(RewardReply {
        failures: results.iter().map(|s| s.failures.as_slice()).collect(),
        rewards: Rewards(results.iter().map(usable_reward).collect()),
    })
    .into_response())
}

/// Reset: `{task, seed, index}` (the source's task) or `{task, problem}` (a given one) →
/// `{session_id, observation: {messages}, task, done: false}`. A multi-turn task's episode
/// runs in its environment's own instance; a single-turn one is scored on its one step.
pub(crate) async fn episode_reset(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let tasks = served(&state)?;
    let body = request::object(&body)?;
    let t = tasks.find(&body, "task")?;
    let given = match body.get("problem") {
        None | Some(Value::Null) => None,
        value => Some(problem(value, "problem")?),
    };
    let index = Fields::of(&body).unsigned("index", 0, u64::MAX / 2)?;
    let seed = body.get("seed").filter(|v| !v.is_null()).map(|v| v.as_u64().ok_or(())).transpose();
    let seed = seed.map_err(|()| ApiError::bad(Some("seed"), "must be a non-negative integer"))?;
    tasks.sweep();
    let Some(place) = tasks.reserve() else {
        return Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "{} episodes are open (this server's limit); close one (DELETE /v1/episodes/ID) or retry after idle \
                 ones are closed",
                tasks.limits.max_sessions
            ),
            param: None,
            retry_after: Some(1),
        });
    };
    let task = tasks.tasks[t].clone();
    let session = blocking(&state, move || {
        let mut task = lock(&task);
        let problem = match (given, &mut task.loaded.source) {
            (Some(problem), _) => problem,
            (None, TaskSource::Environment { plugin, seed: own }) => plugin
                .task_at(seed.unwrap_or(*own), index)
                .map_err(|f| ApiError::with_status(StatusCode::UNPROCESSABLE_ENTITY, format!("task {index}: {f}")))?,
            (None, source @ (TaskSource::Dataset { .. } | TaskSource::Remote(_) | TaskSource::OpenEnv(_))) => {
                source.training(index).map_err(|e| source_failure(&e))?
            }
            (None, TaskSource::Agent { .. }) => {
                return Err(ApiError::bad(Some("task"), "is an agent's: it has no episodes to step"));
            }
        };
        let episode = match (task.loaded.source.episodes(), task.loaded.runs_episodes()) {
            (Some(environment), true) => Some(environment.start(&problem).map_err(|(kind, message)| {
                ApiError::with_status(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    format!("the episode cannot start: {kind}: {message}"),
                )
            })?),
            _ => None,
        };
        let max_turns = task.loaded.spec.max_turns.max(1);
        Ok(Session { task: t, problem, episode, turns: 0, max_turns, done: false, last_used: Instant::now() })
    })
    .await?;
    let number = tasks.next_session.fetch_add(1, Ordering::Relaxed);
    let id = format!("ep-{number}-{:016x}", unguessable(number));
    let reply = Json(EpisodeStarted {
        done: false,
        max_turns: session.max_turns,
        observation: Observation { messages: &session.problem.messages },
        session_id: &id,
        task: &session.problem,
    })
    .into_response();
    place.open(id, session);
    Ok((StatusCode::CREATED, reply).into_response())
}

/// A task source's error, answered with the status its cause calls for: the remote task
/// server failing or refusing is upstream's (502), its silence past `timeout_s` too (504),
/// an I/O error the host's (500), anything else the task's own (422: the source cannot give
/// that task).
fn source_failure(error: &wirl_rollout::Error) -> ApiError {
    use wirl_rollout::{Error, RemoteError};
    let remote = error.layers().find_map(|layer| match layer {
        Error::Remote(remote) => Some(remote),
        _ => None,
    });
    let mut causes = std::iter::successors(Some(error as &(dyn std::error::Error + 'static)), |e| e.source());
    let io =
        error.layers().any(|layer| matches!(layer, Error::Io(_))) || causes.any(|cause| cause.is::<std::io::Error>());
    let status = match remote {
        Some(RemoteError::TimedOut(_)) => StatusCode::GATEWAY_TIMEOUT,
        Some(RemoteError::Unreachable(_) | RemoteError::Refused(_)) => StatusCode::BAD_GATEWAY,
        None if io => StatusCode::INTERNAL_SERVER_ERROR,
        None => StatusCode::UNPROCESSABLE_ENTITY,
    };
    ApiError::with_status(status, wirl_engine::error_chain(error))
}

/// A session id's suffix that cannot be guessed from another's: `number` hashed under a
/// key drawn at random by the standard library.
fn unguessable(number: u64) -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(number)
}

fn session(tasks: &Tasks, id: &str) -> Result<Arc<Mutex<Session>>, ApiError> {
    lock(&tasks.sessions).get(id).cloned().ok_or_else(|| {
        ApiError::with_status(
            StatusCode::NOT_FOUND,
            format!(
                "no episode `{}` (never opened, closed, or idle for more than {} s and reaped)",
                printable(id),
                tasks.limits.session_idle.as_secs()
            ),
        )
    })
}

/// Step: `{action}` (the model's reply) → `{observation: {messages}, reward, done, ...}`.
///
/// Over ~80 lines on purpose: the reply read, the episode locked, stepped, scored and
/// answered or closed, in the order the session's state allows; each branch is a reply.
pub(crate) async fn episode_step(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let tasks = served(&state)?;
    let body = request::object(&body)?;
    let action = match body.get("action") {
        Some(Value::String(text)) => text.clone(),
        _ => return Err(ApiError::bad(Some("action"), "must be the model's reply (a string)")),
    };
    let session = session(&tasks, &id)?;
    let owner = tasks.clone();
    let (reply, done) = blocking(&state, move || {
        let mut session = lock(&session);
        if session.done {
            return Err(ApiError::with_status(
                StatusCode::CONFLICT,
                "the episode is over: reset to begin another".into(),
            ));
        }
        session.turns += 1;
        session.last_used = Instant::now();
        let task = owner.tasks[session.task].clone();
        let turns = session.turns;
        let max_turns = session.max_turns;
        let ended = |failure: String| EpisodeStep { failure: Some(failure), ..EpisodeStep::plain(&[], true, turns) };
        let reply = match session.episode.as_mut() {
            None => {
                let mut task = lock(&task);
                let policy = task.loaded.spec.failures;
                let score = task
                    .loaded
                    .scorers
                    .score_group(&session.problem, std::slice::from_ref(&action), policy, Progress::OUTSIDE_TRAINING)
                    .remove(0);
                let step = EpisodeStep {
                    reward: usable_reward(&score),
                    score: Some(ScoreInfo::of(&score)),
                    ..EpisodeStep::plain(&[], true, turns)
                };
                serde_json::to_value(step)
            }
            Some(episode) => match episode.step(&action) {
                // A 0.2.0 environment's turn reward is the step's reward, as OpenEnv's steps
                // carry theirs (a client sums them with the outcome's into the return).
                Ok(StepResult::Continue { messages, reward }) if turns < max_turns => {
                    serde_json::to_value(EpisodeStep { reward, ..EpisodeStep::plain(&messages, false, turns) })
                }
                Ok(StepResult::Continue { messages, .. }) => serde_json::to_value(EpisodeStep {
                    failure: Some(format!("max_turns: the episode did not end within {max_turns} model turns")),
                    truncated: Some(true),
                    ..EpisodeStep::plain(&messages, true, turns)
                }),
                Ok(StepResult::Done(score)) if score.reward.is_finite() => serde_json::to_value(EpisodeStep {
                    note: Some(score.note),
                    parts: Some(score.parts.into_iter().collect()),
                    reward: Some(score.reward),
                    ..EpisodeStep::plain(&[], true, turns)
                }),
                Ok(StepResult::Done(score)) => {
                    serde_json::to_value(ended(format!("non_finite: the environment's score is {}", score.reward)))
                }
                Err((kind, message)) => serde_json::to_value(ended(format!("{kind}: {message}"))),
            },
        }
        .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("the reply: {e}")))?;
        session.done = reply["done"].as_bool().unwrap_or(true);
        let done = session.done;
        Ok((reply, done))
    })
    .await
    .map_err(|error| {
        if error.status != StatusCode::GATEWAY_TIMEOUT {
            return error;
        }
        // The step goes on in the background and moves the episode on; its client cannot
        // know where to: the episode ends here (its id answers 404 from now on).
        tasks.close(&id);
        ApiError { message: format!("{}; the episode is closed: reset to begin another", error.message), ..error }
    })?;
    if done {
        // Its instance is freed now; the id answers 404 from here on.
        tasks.close(&id);
    }
    Ok(Json(reply))
}

pub(crate) async fn episode_close(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tasks = served(&state)?;
    let _ = session(&tasks, &id)?;
    tasks.close(&id);
    Ok(Json(Closed { closed: &id }).into_response())
}

/// Megatron's `generation_args` (and wirl's names) over the task's own sampling, within the
/// server's limits.
fn sampling(body: &Map<String, Value>, task: SamplingSpec, limits: &request::Limits) -> Result<SamplingSpec, ApiError> {
    let mut spec = task;
    let Some(args) = body.get("generation_args").filter(|v| !v.is_null()) else { return Ok(spec) };
    let Value::Object(args) = args else {
        return Err(ApiError::bad(Some("generation_args"), "must be an object"));
    };
    let args = Fields::within(args, "generation_args");
    // The ranges are the engine's (`wirl_engine::sampling::rules`), as for requests and configs.
    let bad = |key: &str, range: &str| ApiError::bad(Some(&args.name(key)), range);
    if let Some(t) = args.number("temperature")? {
        spec.temperature = rules::temperature(t).map_err(|range| bad("temperature", range))?;
    }
    if let Some(p) = args.number("top_p")? {
        spec.top_p = rules::top_p(p).map_err(|range| bad("top_p", range))?;
    }
    if let Some(k) = args.whole("top_k")? {
        spec.top_k = rules::top_k(k).map_err(|range| bad("top_k", range))?;
    }
    if let Some(m) = args.whole("max_tokens")? {
        spec.max_tokens = rules::max_tokens(m, limits.max_tokens).map_err(|range| bad("max_tokens", &range.0))?;
    }
    Ok(spec)
}

/// What a rollout request asks for, read.
struct RolloutAsk {
    task: usize,
    groups: usize,
    group_size: usize,
    sampling: SamplingSpec,
    /// The first task index; by default each request takes the next ones.
    first: u64,
    /// Held-out tasks (`validation`).
    validation: bool,
    filter_same_reward: bool,
}

/// Draw the tasks, then roll them through the one rolling path (sample, run episodes,
/// score): the groups, in order; `None` if cancelled.
fn roll(
    state: &AppState,
    task: &Arc<Mutex<ServedTask>>,
    ask: &RolloutAsk,
    cancelled: &AtomicBool,
) -> Result<Option<Vec<RolloutGroup>>, ApiError> {
    let stop = || cancelled.load(Ordering::Relaxed);
    let mut owner = lock(task);
    let asks = draw_asks(state, &mut owner, ask)?;
    let engine = wirl_rollout::Engine { handle: &state.engine, tokenizer: &state.tokenizer, context: state.context };
    let rolled = if owner.loaded.spec.max_turns > 1 {
        // Episodes go on in the environment's plugin: the task stays held throughout.
        collect::collect_groups(engine, std::slice::from_mut(&mut owner.loaded), asks, &stop)
    } else {
        // Single-turn: the task is free for other requests while the engine samples.
        drop(owner);
        let in_flight = collect::send(&state.engine, &asks);
        let Some(sampled) = collect::receive(in_flight, &asks, None, &stop) else { return Ok(None) };
        let sampled = sampled.map_err(roll_failure)?;
        owner = lock(task);
        collect::finish(engine, std::slice::from_mut(&mut owner.loaded), asks, sampled, &stop)
    };
    let Some(groups) = rolled else { return Ok(None) };
    let mut groups = groups.map_err(roll_failure)?;
    if ask.filter_same_reward {
        groups.retain(|g| {
            let rewards: Vec<f32> = g.scores.iter().filter(|s| s.status.usable()).map(|s| s.reward).collect();
            rewards.windows(2).any(|w| (w[0] - w[1]).abs() > 1e-6)
        });
    }
    Ok(Some(groups))
}

/// A rollout request's groups: its training (or held-out) problems from `ask.first` on, whose
/// prompts fit, each seeded by its index (the rolling path's rule, slot = problem index).
fn draw_asks(state: &AppState, owner: &mut ServedTask, ask: &RolloutAsk) -> Result<Vec<GroupAsk>, ApiError> {
    let (context, tokenizer, room) = (state.context, &state.tokenizer, ask.sampling.max_tokens);
    let (problems, prompts): (Vec<_>, Vec<_>) = if ask.validation {
        let (first, name) = (owner.eval_first_index, owner.loaded.spec.name.clone());
        let source = &mut owner.loaded.source;
        wirl_rollout::held_out_prompts(&name, source, first, ask.first, ask.groups, tokenizer, room, context)
            .0
            .into_iter()
            .unzip()
    } else {
        let drawn = wirl_rollout::step_tasks(&mut owner.loaded.source, ask.first..ask.first + ask.groups as u64, |p| {
            wirl_rollout::fitting_prompt(tokenizer, p, room, context)
        })
        .map_err(|e| source_failure(&e))?;
        (drawn.tasks, drawn.prompts)
    };
    if problems.is_empty() {
        return Err(ApiError::with_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "the task source gave no task whose prompt fits the model's context".into(),
        ));
    }
    Ok(problems
        .into_iter()
        .zip(prompts)
        .enumerate()
        .map(|(i, (problem, prompt))| {
            GroupAsk::new(0, problem, prompt, ask.group_size, ask.sampling, owner.seed, ask.first + i as u64)
        })
        .collect())
}

/// A roll's failure as an answer: the engine's is the server's own (500); a chat template
/// that cannot hold the task's ledger is the task's (422).
fn roll_failure(error: wirl_rollout::RollError) -> ApiError {
    let status = match error {
        wirl_rollout::RollError::Generation(_) => StatusCode::INTERNAL_SERVER_ERROR,
        wirl_rollout::RollError::Template(_) => StatusCode::UNPROCESSABLE_ENTITY,
    };
    ApiError::with_status(status, error.to_string())
}

/// One trajectory as Megatron-RL's `TokenRollout`: `trajectory` (prompt and every token after
/// it, one turn as wirl keeps a multi-turn ledger whole), `generation_mask` (which the model
/// sampled), `logprobs` (per token after the prompt, 0 for appended ones), `reward`, `env_id`,
/// `problem_id`; and wirl's `rollout_status` (`ok`, `failed`, `masked`: a masked rollout's
/// reward is not a score, skip it), `failures`, `text`, `weights_version`.
fn token_rollout(group: &RolloutGroup, i: usize) -> TokenRollout<'_> {
    let (t, s) = (&group.trajectories[i], &group.scores[i]);
    let mut trajectory = group.prompt.clone();
    trajectory.extend(&t.tokens);
    let mut mask = vec![false; group.prompt.len()];
    if t.trainable.is_empty() {
        mask.extend(std::iter::repeat_n(true, t.tokens.len()));
    } else {
        mask.extend(&t.trainable);
    }
    let status = match s.status {
        Status::Ok => "ok",
        Status::Failed => "failed",
        Status::Masked => "masked",
    };
    let epoch = [[[0, t.weights_version]]];
    TokenRollout {
        env_id: &group.task_name,
        failures: &s.failures,
        finish_reason: match t.finish {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
        },
        generation_mask: [mask],
        kv_cache_epoch: epoch,
        logprobs: [Widened(&t.logprobs)],
        notes: &s.notes,
        num_evictions: [0],
        parts: &s.parts,
        policy_epoch: epoch,
        problem_id: &group.task.id,
        prompt_length: [group.prompt.len()],
        reward: s.reward,
        rollout_status: status,
        text: &t.text,
        trajectory: [trajectory],
        turns: t.turns,
        weights_version: t.weights_version,
    }
}

/// Read a rollout request, take a slot, roll, under the deadline; a client that goes away
/// cancels the generation.
async fn rollouts_of(
    state: Arc<AppState>,
    body: &Map<String, Value>,
    groups_field: &str,
    per_group: bool,
) -> Result<(usize, Vec<RolloutGroup>), ApiError> {
    let tasks = served(&state)?;
    let t = tasks.find(body, "task")?;
    let groups = count(body, groups_field, 1, tasks.limits.max_groups)?;
    let group_size = if per_group { count(body, "rollouts_per_group", 1, tasks.limits.max_group_size)? } else { 1 };
    let validation = body.get("validation").and_then(Value::as_bool).unwrap_or(false);
    let filter_same_reward = body.get("filter_groups_with_same_reward").and_then(Value::as_bool).unwrap_or(false);
    let own = lock(&tasks.tasks[t]).loaded.spec.sampling;
    let sampling = sampling(body, own, &state.config.limits)?;
    let first = match body.get("start_index") {
        None | Some(Value::Null) if validation => 0,
        None | Some(Value::Null) => tasks.cursors[t].fetch_add(groups as u64, Ordering::Relaxed),
        Some(_) => Fields::of(body).unsigned("start_index", 0, u64::MAX / 4)?,
    };
    let ask = RolloutAsk { task: t, groups, group_size, sampling, first, validation, filter_same_reward };
    crate::weights::wait_unpaused(&state).await?;
    let slot = crate::take_slot(&state)?;
    let cancelled = Arc::new(AtomicBool::new(false));
    // Set when this future is dropped (the client went away) or the deadline passes.
    struct CancelOnDrop(Arc<AtomicBool>);
    impl Drop for CancelOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _guard = CancelOnDrop(cancelled.clone());
    let task = tasks.tasks[ask.task].clone();
    let worker = state.clone();
    let flag = cancelled.clone();
    let work = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        roll(&worker, &task, &ask, &flag)
    });
    let timeout = state.config.request_timeout;
    match tokio::time::timeout(timeout, work).await {
        Err(_) => Err(ApiError::with_status(
            StatusCode::GATEWAY_TIMEOUT,
            format!("the rollouts ran past this server's deadline of {} s; they were cancelled", timeout.as_secs()),
        )),
        Ok(Err(e)) => {
            Err(ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("the rollouts failed: {e}")))
        }
        Ok(Ok(Err(e))) => Err(e),
        Ok(Ok(Ok(None))) => Err(ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, "cancelled".into())),
        Ok(Ok(Ok(Some(groups)))) => {
            let tokens: usize = groups.iter().flat_map(|g| &g.trajectories).map(|t| t.model_tokens()).sum();
            state.requests.fetch_add(1, Ordering::Relaxed);
            state.generated_tokens.fetch_add(tokens as u64, Ordering::Relaxed);
            Ok((t, groups))
        }
    }
}

/// Megatron's `/grouped_rollouts/`: `{num_groups, rollouts_per_group, validation,
/// filter_groups_with_same_reward, generation_args, task, start_index}` →
/// `[[TokenRollout]]`. `inference_interface` is not used: this server samples itself.
pub(crate) async fn grouped_rollouts(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let body = request::object(&body)?;
    let (_, groups) = rollouts_of(state, &body, "num_groups", true).await?;
    let out: Vec<Vec<TokenRollout>> =
        groups.iter().map(|g| (0..g.trajectories.len()).map(|i| token_rollout(g, i)).collect()).collect();
    Ok(Json(out).into_response())
}

/// Megatron's `/rollouts/`: `{num_rollouts, ...}` → `[TokenRollout]`, one per task.
pub(crate) async fn rollouts(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let body = request::object(&body)?;
    let (_, groups) = rollouts_of(state, &body, "num_rollouts", false).await?;
    let out: Vec<TokenRollout> = groups.iter().map(|g| token_rollout(g, 0)).collect();
    Ok(Json(out).into_response())
}

/// Megatron's `/evaluation/`: `{num_prompts, rank_info: [rank, ranks], generation_args,
/// task}` → `{env_id, results: [{prompt, response, reward, problem_id, passed, status}],
/// pass_rate}` over held-out tasks, greedy unless `generation_args` say otherwise.
pub(crate) async fn evaluation(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let mut body = request::object(&body)?;
    let prompts = body.remove("num_prompts").unwrap_or(json!(1));
    body.insert("num_groups".into(), prompts);
    body.insert("validation".into(), json!(true));
    // Greedy by default: an evaluation compares models, not samples.
    let mut args = body.remove("generation_args").filter(Value::is_object).unwrap_or_else(|| json!({}));
    if args.get("temperature").is_none_or(Value::is_null) {
        args["temperature"] = json!(0.0);
    }
    body.insert("generation_args".into(), args);
    let rank = match body.get("rank_info") {
        None | Some(Value::Null) => None,
        Some(Value::Array(pair)) if pair.len() == 2 => match (pair[0].as_u64(), pair[1].as_u64()) {
            (Some(rank), Some(ranks)) if rank < ranks => Some((rank as usize, ranks as usize)),
            _ => return Err(ApiError::bad(Some("rank_info"), "must be [rank, ranks] with rank < ranks")),
        },
        Some(_) => return Err(ApiError::bad(Some("rank_info"), "must be [rank, ranks]")),
    };
    let pass = {
        let tasks = served(&state)?;
        let t = tasks.find(&body, "task")?;
        lock(&tasks.tasks[t]).loaded.spec.pass_reward
    };
    let (t, groups) = rollouts_of(state.clone(), &body, "num_groups", false).await?;
    let results: Vec<EvalResult> = groups
        .iter()
        .enumerate()
        .filter(|(i, _)| rank.is_none_or(|(rank, ranks)| i % ranks == rank))
        .map(|(_, g)| {
            let s = &g.scores[0];
            EvalResult {
                failures: &s.failures,
                passed: s.status.usable() && s.reward >= pass,
                problem_id: &g.task.id,
                prompt: &g.task.messages,
                response: &g.trajectories[0].text,
                reward: usable_reward(s),
                status: s.status,
            }
        })
        .collect();
    let passed = results.iter().filter(|r| r.passed).count();
    let env_id = served(&state)?.names[t].clone();
    let pass_rate = (!results.is_empty()).then(|| passed as f64 / results.len() as f64);
    Ok(Json(EvalReply { env_id: &env_id, pass_rate, results }).into_response())
}
