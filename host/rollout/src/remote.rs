//! A task served by another `wirl serve --config` process: its tasks drawn over HTTP
//! (`POST /v1/tasks/draw`) and its completions scored there (`POST /v1/score`), while the
//! completions themselves are sampled here, by the trainer's own policy — so that every
//! trained token is the sampler's own (on-policy, with its log-probs), whatever machine the
//! environment and its reward plugins run on.
//!
//! Every call has a timeout and is retried; a call that still fails is the server's failure,
//! never a reward: the step's groups of that task become placeholders (masked, counted,
//! recorded with the reason), or its completions failed trajectories (`remote`, under the
//! task's `on_failure`).

use crate::score::{FailurePolicy, Scored, Status};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use wirl_sandbox::Task;

/// Where the task is served and how patiently it is asked.
#[derive(Clone, Debug, PartialEq)]
pub struct RemoteSpec {
    /// The server's base URL, `http://HOST:PORT`.
    pub url: String,
    /// The task's name there (default: the only one it serves).
    pub task: Option<String>,
    /// Per call.
    pub timeout: Duration,
    /// Further tries after a failed call (a refused connection, a timeout, a 5xx).
    pub retries: u32,
    /// Sent as `Authorization: Bearer KEY`.
    pub api_key: Option<String>,
}

pub use crate::error::RemoteError;

/// The largest answer read from a server.
const MAX_ANSWER_BYTES: u64 = 256 << 20;

/// A client for one remote task (clones share the connection pool).
#[derive(Clone)]
pub struct RemoteTasks {
    spec: RemoteSpec,
    agent: ureq::Agent,
    /// Tasks drawn ahead (`prefetch`), by index.
    /// Drawn ahead: each task, or the reason (with its causes) the server could not give it.
    drawn: HashMap<u64, Result<Task, String>>,
}

impl RemoteTasks {
    /// A client; it checks that the server answers and serves the task.
    pub fn connect(spec: &RemoteSpec) -> crate::error::Result<Self> {
        let agent: ureq::Agent =
            ureq::Agent::config_builder().timeout_global(Some(spec.timeout)).http_status_as_error(false).build().into();
        let client = RemoteTasks { spec: spec.clone(), agent, drawn: HashMap::new() };
        let listed = client.call("GET", "/v1/tasks", None).map_err(|e| {
            crate::error::invalid!(
                "remote task server {}: {e} (start it with `wirl serve --config TRAIN.toml --port PORT`)",
                spec.url
            )
        })?;
        let names: Vec<&str> =
            listed["data"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
        match &spec.task {
            Some(name) if !names.contains(&name.as_str()) => {
                crate::error::bail!(
                    "remote task server {} does not serve `{name}`; it serves: {}",
                    spec.url,
                    names.join(", ")
                )
            }
            None if names.len() != 1 => crate::error::bail!(
                "remote task server {} serves {} tasks ({}): name one with `task`",
                spec.url,
                names.len(),
                names.join(", ")
            ),
            _ => {}
        }
        Ok(client)
    }

    pub fn spec(&self) -> &RemoteSpec {
        &self.spec
    }

    /// One call, retried on failures that another try may fix.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, RemoteError> {
        let url = format!("{}{path}", self.spec.url.trim_end_matches('/'));
        let mut last = String::new();
        let mut timed_out = false;
        for attempt in 0..=self.spec.retries {
            if attempt > 0 {
                std::thread::sleep(backoff(attempt));
            }
            let sent = match (method, body) {
                ("GET", _) => self.authorized_get(&url).call(),
                (_, body) => self
                    .authorized_post(&url)
                    .header("content-type", "application/json")
                    .send(body.unwrap_or(&Value::Null).to_string().as_bytes()),
            };
            let mut response = match sent {
                Ok(response) => response,
                Err(error) => {
                    timed_out = matches!(error, ureq::Error::Timeout(_));
                    last = format!("{method} {url}: {error}");
                    continue;
                }
            };
            let status = response.status().as_u16();
            let text = response.body_mut().with_config().limit(MAX_ANSWER_BYTES).read_to_string();
            let text = match text {
                Ok(text) => text,
                Err(error) => {
                    timed_out = matches!(error, ureq::Error::Timeout(_));
                    last = format!("{method} {url}: reading the answer: {error}");
                    continue;
                }
            };
            let parsed: Result<Value, _> = serde_json::from_str(&text);
            let message = || {
                parsed
                    .as_ref()
                    .ok()
                    .and_then(|v| v.pointer("/error/message").and_then(Value::as_str).map(str::to_string))
                    .unwrap_or_else(|| text.chars().take(300).collect())
            };
            match status {
                200..=299 => {
                    return parsed.map_err(|e| RemoteError::Refused(format!("{method} {url}: not JSON: {e}")));
                }
                // Busy or failing: another try may do.
                429 | 500..=599 => {
                    timed_out = false;
                    last = format!("{method} {url}: {status}: {}", message());
                }
                _ => return Err(RemoteError::Refused(format!("{method} {url}: {status}: {}", message()))),
            }
        }
        let last = format!("{last} (after {} tries)", self.spec.retries + 1);
        Err(if timed_out { RemoteError::TimedOut(last) } else { RemoteError::Unreachable(last) })
    }

    fn authorized_get(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let request = self.agent.get(url);
        match &self.spec.api_key {
            Some(key) => request.header("authorization", format!("Bearer {key}")),
            None => request,
        }
    }

    fn authorized_post(&self, url: &str) -> ureq::RequestBuilder<ureq::typestate::WithBody> {
        let request = self.agent.post(url);
        match &self.spec.api_key {
            Some(key) => request.header("authorization", format!("Bearer {key}")),
            None => request,
        }
    }

    /// Tasks `first..first + count` of the split, each a task or the reason the server's
    /// source could not give it.
    pub fn draw(&self, first: u64, count: usize, eval: bool) -> Result<Vec<crate::Result<Task>>, RemoteError> {
        let body = json!({"task": self.spec.task, "index": first, "count": count,
                          "split": if eval { "eval" } else { "train" }});
        let answer = self.call("POST", "/v1/tasks/draw", Some(&body))?;
        let items = answer["tasks"]
            .as_array()
            .ok_or_else(|| RemoteError::Refused("POST /v1/tasks/draw: the answer has no `tasks`".into()))?;
        Ok(items
            .iter()
            .map(|item| match (item.get("task"), item.get("error").and_then(Value::as_str)) {
                (Some(task), _) => serde_json::from_value::<Task>(task.clone())
                    .map_err(|e| crate::Error::from(e).context("the server's task is not a task")),
                (None, Some(error)) => Err(crate::Error::Invalid(error.to_string())),
                (None, None) => Err(crate::Error::Invalid("the server gave neither a task nor an error".into())),
            })
            .collect())
    }

    /// Draw the step's training tasks in one call, for [`RemoteTasks::training`] to hand out.
    pub fn prefetch(&mut self, first: u64, count: usize) -> Result<(), RemoteError> {
        let drawn = self.draw(first, count, false)?;
        let reasons = drawn.into_iter().map(|task| task.map_err(|e| wirl_engine::error_chain(&e)));
        self.drawn = (first..).zip(reasons).collect();
        Ok(())
    }

    /// The training task at `index` (drawn ahead, or asked for alone).
    pub fn training(&mut self, index: u64) -> crate::error::Result<Task> {
        let task = match self.drawn.remove(&index) {
            Some(task) => task.map_err(crate::Error::Invalid),
            None => self
                .draw(index, 1, false)?
                .pop()
                .unwrap_or_else(|| Err(crate::Error::Invalid("the server gave no task".into()))),
        };
        task.map_err(|e| e.context(format!("remote task {index}")))
    }

    /// `count` held-out tasks from `offset` in the server's held-out range, slot by slot:
    /// each one's place with its task or why the server gave none.
    pub fn held_out(&self, offset: u64, count: usize) -> Vec<(u64, Result<Task, String>)> {
        match self.draw(offset, count, true) {
            Ok(tasks) => (offset..).zip(tasks.into_iter().map(|t| t.map_err(|e| e.to_string()))).collect(),
            Err(error) => vec![(offset, Err(format!("the remote held-out tasks: {error}")))],
        }
    }

    /// Score a group on the server. A failed call fails every completion (`remote`), under
    /// `policy`; a masked verdict there stays masked here.
    pub fn score_group(&self, task: &Task, completions: &[String], policy: FailurePolicy) -> Vec<Scored> {
        let body = json!({"task": self.spec.task, "problem": task, "completions": completions});
        let answer = self.call("POST", "/v1/score", Some(&body)).and_then(|answer| {
            let scores = answer["scores"].as_array().cloned().unwrap_or_default();
            if scores.len() != completions.len() {
                return Err(RemoteError::Refused(format!(
                    "POST /v1/score: {} scores for {} completions",
                    scores.len(),
                    completions.len()
                )));
            }
            Ok(scores)
        });
        match answer {
            Ok(scores) => scores.iter().map(|s| verdict(s, policy)).collect(),
            Err(error) => {
                tracing::warn!("remote task {}: {error}", self.spec.url);
                completions.iter().map(|_| failed("remote", &error.to_string(), policy)).collect()
            }
        }
    }
}

/// The wait before try `attempt` (from 1) of a call to a server: 0.2 s, 0.4 s, 0.8 s, … at
/// most 5 s.
pub(crate) fn backoff(attempt: u32) -> Duration {
    Duration::from_millis((200u64 << (attempt.max(1) - 1).min(5)).min(5000))
}

/// A failed trajectory of `kind`, under `policy`.
pub(crate) fn failed(kind: &str, message: &str, policy: FailurePolicy) -> Scored {
    Scored::failed(kind, kind, message.to_string(), Some(policy))
}

/// The server's verdict on one completion (`{reward, status, parts, failures, notes}`).
fn verdict(score: &Value, policy: FailurePolicy) -> Scored {
    let status = match score["status"].as_str() {
        Some("ok") => Status::Ok,
        Some("failed") => Status::Failed,
        Some("masked") => Status::Masked,
        _ => return failed("remote", &format!("the server's score has no valid status: {score}"), policy),
    };
    let reward = score["reward"].as_f64().map(|r| r as f32);
    let reward = match (status, reward) {
        (Status::Masked, _) => 0.0,
        (_, Some(r)) if r.is_finite() => r,
        _ => return failed("remote", &format!("the server's reward is not a finite number: {score}"), policy),
    };
    let parts: BTreeMap<String, f32> = score["parts"]
        .as_object()
        .map(|p| p.iter().filter_map(|(k, v)| Some((k.clone(), v.as_f64()? as f32))).collect())
        .unwrap_or_default();
    let failures = score["failures"]
        .as_array()
        .map(|f| f.iter().filter_map(|k| k.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let notes = score["notes"]
        .as_object()
        .map(|n| n.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
        .unwrap_or_default();
    Scored { status, reward, parts, failures, notes, turn_rewards: Vec::new() }
}
