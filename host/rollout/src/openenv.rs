//! A task whose environment is an OpenEnv server (meta-pytorch/OpenEnv, `openenv-core` on
//! the package index): each episode a session of its own over the server's WebSocket (`/ws`:
//! `{"type": "reset" | "step" | "close", "data": …}` answered by `{"type": "observation",
//! "data": {"observation", "reward", "done"}}`), the model's reply sent as one field of the
//! environment's action, the observation shown to the model as the next user message, and
//! the episode's return (its steps' rewards summed) as its score.
//!
//! A task is the environment's reset with a seed derived from (the run's seed, the task's
//! index): its first observation is the prompt, and every sample of the group resets its own
//! session with the same seed. Calls have the task's timeout; opening a session is retried
//! (a step is not: it is not idempotent); what still fails is the episode's failure
//! (`remote`), under the task's failure policy — never a reward.
//!
//! Every operation (the handshake, a reset, a step, the close) is bounded as a whole, not per
//! read: the socket is read through [`Bounded`], which gives each read only the time left to
//! the operation's deadline, so a server that answers only with pings or dribbles a frame a
//! byte at a time ends the operation at its timeout. The sandbox's interrupter (Ctrl-C) ends
//! it within [`SLICE`]. A session that failed is never spoken to again (tungstenite panics on
//! a socket used after some errors), only dropped.

use crate::seed::seed_for;
use serde_json::{Value, json};
use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use tungstenite::{Message as Frame, WebSocket};
use wirl_sandbox::{Interrupter, Message, Score, StepResult, Task, printable};

/// Where the environment is served and how its actions and observations map to text.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenEnvSpec {
    /// The server's base URL, `http://HOST:PORT`.
    pub url: String,
    /// The field of the environment's action that holds the model's reply (`message`).
    pub action_field: String,
    /// The field of an observation shown to the model; the whole observation (JSON) if none.
    pub observation_field: Option<String>,
    /// A system message before the first observation.
    pub system: Option<String>,
    /// Per call.
    pub timeout: Duration,
    /// Further tries to open a session and reset it.
    pub retries: u32,
}

/// The largest message read from a server.
const MAX_MESSAGE_BYTES: usize = 16 << 20;

/// What an operation cut short by the interrupter says.
const STOPPING: &str = "interrupted (the run is stopping)";

/// The longest a read waits before it looks at the interrupter again.
const SLICE: Duration = Duration::from_millis(100);

/// The most of a server's own text (an error it sent, an answer it should not have) quoted
/// in a failure: a 15 MB error message was once logged whole for every episode.
const QUOTED_CHARS: usize = 300;

/// Seeds the server's reset accepts (a non-negative 32-bit integer everywhere we looked).
const SEED_RANGE: u64 = 1 << 31;

/// A connected OpenEnv task: its tasks by index, its episodes.
pub struct OpenEnvTasks {
    spec: OpenEnvSpec,
    seed: u64,
    /// `HOST:PORT`, as the URL names it.
    authority: String,
    /// Set on stop (Ctrl-C): every session's operation in flight ends at once.
    interrupter: Interrupter,
}

/// A failed call: (kind, message), as an episode's failure is recorded.
pub type Failed = (String, String);

fn remote(message: String) -> Failed {
    ("remote".to_string(), message)
}

impl OpenEnvTasks {
    /// A client; it checks that the server answers (`/health`) and that its action has
    /// `action_field` (and its observation `observation_field`) in its schema (`/schema`).
    /// `interrupter` (the run's sandbox's) ends every operation in flight when set.
    pub fn connect(spec: &OpenEnvSpec, seed: u64, interrupter: Interrupter) -> crate::error::Result<Self> {
        let authority = spec
            .url
            .trim_end_matches('/')
            .strip_prefix("http://")
            .filter(|rest| !rest.is_empty() && !rest.contains('/'))
            .ok_or_else(|| crate::error::invalid!("openenv url {:?}: give the server as http://HOST:PORT", spec.url))?
            .to_string();
        // No redirects: the sessions go to this URL's /ws, so the checks must be of it too.
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(spec.timeout))
            .http_status_as_error(false)
            .max_redirects(0)
            .build()
            .into();
        let get = |path: &str| -> crate::error::Result<Value> {
            let url = format!("http://{authority}{path}");
            let mut last = String::new();
            for attempt in 0..=spec.retries {
                if attempt > 0 {
                    std::thread::sleep(crate::remote::backoff(attempt));
                }
                match agent.get(&url).call() {
                    Ok(mut response) if response.status().is_success() => {
                        let text =
                            response.body_mut().with_config().limit(MAX_MESSAGE_BYTES as u64).read_to_string()?;
                        return serde_json::from_str(&text)
                            .map_err(|e| crate::error::invalid!("GET {url}: not JSON: {e}"));
                    }
                    Ok(response) if response.status().is_redirection() => crate::error::bail!(
                        "OpenEnv server {}: GET {url} redirects ({}); give the URL it serves on (openenv.url)",
                        spec.url,
                        response.status()
                    ),
                    Ok(response) => last = format!("GET {url}: {}", response.status()),
                    Err(error) => last = format!("GET {url}: {error}"),
                }
            }
            crate::error::bail!(
                "OpenEnv server {}: {last} (after {} tries; is it running?)",
                spec.url,
                spec.retries + 1
            )
        };
        get("/health")?;
        let schema = get("/schema")?;
        let fields = |part: &str| -> Vec<String> {
            schema[part]["properties"].as_object().map(|p| p.keys().cloned().collect()).unwrap_or_default()
        };
        let actions = fields("action");
        if !actions.contains(&spec.action_field) {
            crate::error::bail!(
                "OpenEnv server {}: its action has no field `{}` (openenv.action_field); its fields: {}",
                spec.url,
                spec.action_field,
                actions.join(", ")
            );
        }
        if let Some(field) = &spec.observation_field {
            let observations = fields("observation");
            if !observations.contains(field) {
                crate::error::bail!(
                    "OpenEnv server {}: its observation has no field `{field}` (openenv.observation_field); its \
                     fields: {}",
                    spec.url,
                    observations.join(", ")
                );
            }
        }
        Ok(OpenEnvTasks { spec: spec.clone(), seed, authority, interrupter })
    }

    pub fn spec(&self) -> &OpenEnvSpec {
        &self.spec
    }

    /// What the model is shown of the environment, for logs and records.
    pub fn name(&self) -> String {
        format!("openenv {}", self.spec.url)
    }

    /// The task at `index`: the first observation after a reset with its seed.
    pub fn task_at(&self, index: u64) -> crate::Result<Task> {
        let reset_seed = seed_for(self.seed, index) % SEED_RANGE;
        let (session, observation) = self.open(reset_seed).map_err(|(_, message)| crate::Error::Invalid(message))?;
        drop(session);
        let mut messages = Vec::new();
        if let Some(system) = &self.spec.system {
            messages.push(Message::new("system", system.clone()));
        }
        messages.push(Message::new("user", observation));
        Ok(Task {
            id: format!("openenv/{}/{index}", self.seed),
            messages,
            answer: None,
            metadata: Some(json!({ "openenv_seed": reset_seed }).to_string()),
        })
    }

    /// Held-out tasks: indices from `first_index + offset`, each with its task or why the
    /// server gave none.
    pub fn held_out(&self, first_index: u64, offset: u64, count: usize) -> Vec<(u64, Result<Task, String>)> {
        (0..count as u64)
            .map(|i| {
                let index = first_index.saturating_add(offset).saturating_add(i);
                (index, self.task_at(index).map_err(|e| e.to_string()))
            })
            .collect()
    }

    /// Begin an episode of `task` (one of this server's): a session of its own, reset with
    /// the task's seed.
    pub fn start(&self, task: &Task) -> Result<OpenEnvEpisode, Failed> {
        let reset_seed = task
            .metadata
            .as_deref()
            .and_then(|m| serde_json::from_str::<Value>(m).ok())
            .and_then(|m| m["openenv_seed"].as_u64())
            .ok_or_else(|| remote(format!("task {} has no openenv_seed in its metadata", task.id)))?;
        let (session, _) = self.open(reset_seed)?;
        Ok(OpenEnvEpisode { session, spec: self.spec.clone(), reward: 0.0 })
    }

    /// A session reset with `reset_seed`, and its first observation as text; retried.
    fn open(&self, reset_seed: u64) -> Result<(Session, String), Failed> {
        let mut last = String::new();
        for attempt in 0..=self.spec.retries {
            if attempt > 0 {
                std::thread::sleep(crate::remote::backoff(attempt));
            }
            if self.interrupter.is_interrupted() {
                return Err(remote(format!("OpenEnv server {}: {STOPPING}", self.spec.url)));
            }
            let opened = Session::connect(&self.authority, &self.spec, &self.interrupter).and_then(|mut session| {
                let answer = session.call(json!({ "type": "reset", "data": { "seed": reset_seed } }))?;
                Ok((session, answer))
            });
            match opened {
                Ok((session, answer)) => {
                    let text = observation_text(&answer, &self.spec)
                        .map_err(|why| remote(format!("OpenEnv server {}: reset: {why}", self.spec.url)))?;
                    return Ok((session, text));
                }
                Err(message) => last = message,
            }
        }
        Err(remote(format!("OpenEnv server {}: {last} (after {} tries)", self.spec.url, self.spec.retries + 1)))
    }
}

/// What the model is shown of an observation answer's `observation`.
fn observation_text(answer: &Value, spec: &OpenEnvSpec) -> Result<String, String> {
    let observation = &answer["observation"];
    let shown = match &spec.observation_field {
        Some(field) => &observation[field.as_str()],
        None => observation,
    };
    match shown {
        Value::String(text) => Ok(text.clone()),
        Value::Null => Err(format!(
            "the observation has no {}",
            spec.observation_field.as_deref().map_or("content".to_string(), |f| format!("field `{f}`"))
        )),
        other => Ok(other.to_string()),
    }
}

/// A socket whose reads and writes end at a deadline (the operation's, not each read's) or
/// when the interrupter is set: each waits at most the time left, in slices of [`SLICE`].
struct Bounded {
    stream: TcpStream,
    deadline: Instant,
    interrupter: Interrupter,
}

impl Bounded {
    /// The time this read or write may wait, or why it may not.
    fn allowance(&self) -> std::io::Result<Duration> {
        if self.interrupter.is_interrupted() {
            // Not `ErrorKind::Interrupted`: std's `write_all` and friends retry that kind, and
            // the interrupter stays set, so they would spin.
            return Err(std::io::Error::other(STOPPING));
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(ErrorKind::TimedOut, "the operation's deadline passed"));
        }
        Ok(left.min(SLICE))
    }

    /// Run `io` until it does something other than time out a slice.
    fn retried<T>(&mut self, mut io: impl FnMut(&mut TcpStream) -> std::io::Result<T>) -> std::io::Result<T> {
        loop {
            let wait = self.allowance()?;
            self.stream.set_read_timeout(Some(wait))?;
            self.stream.set_write_timeout(Some(wait))?;
            match io(&mut self.stream) {
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
                other => return other,
            }
        }
    }
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.retried(|stream| stream.read(buf))
    }
}

impl Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.retried(|stream| stream.write(buf))
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// One WebSocket session with the server.
struct Session {
    socket: WebSocket<Bounded>,
    /// Each operation's whole time.
    timeout: Duration,
    /// An operation failed: the socket is not used again (not even to close it).
    broken: bool,
}

impl Session {
    fn connect(authority: &str, spec: &OpenEnvSpec, interrupter: &Interrupter) -> Result<Session, String> {
        let timeout = spec.timeout;
        let deadline = Instant::now() + timeout;
        let address = authority
            .to_socket_addrs()
            .map_err(|e| format!("cannot resolve {authority}: {e}"))?
            .next()
            .ok_or_else(|| format!("{authority} resolves to no address"))?;
        let stream = TcpStream::connect_timeout(&address, timeout).map_err(|e| format!("connect {authority}: {e}"))?;
        let stream = Bounded { stream, deadline, interrupter: interrupter.clone() };
        let config = tungstenite::protocol::WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        // The handshake too ends at the deadline, however slowly the server answers it.
        let (socket, _) = tungstenite::client::client_with_config(format!("ws://{authority}/ws"), stream, Some(config))
            .map_err(|e| format!("WebSocket /ws: {}", handshake_shown(&e)))?;
        Ok(Session { socket, timeout, broken: false })
    }

    /// Send a message and read the server's answer (`data` of an observation), or what is
    /// wrong with it; the whole exchange within the task's timeout.
    fn call(&mut self, message: Value) -> Result<Value, String> {
        if self.broken {
            return Err("the session failed earlier".into());
        }
        self.socket.get_mut().deadline = Instant::now() + self.timeout;
        let answer = self.exchange(message);
        // Whatever went wrong, the socket is not touched again: after a size error, for
        // one, tungstenite panics on the next use.
        self.broken = answer.is_err();
        answer
    }

    fn exchange(&mut self, message: Value) -> Result<Value, String> {
        self.socket.send(Frame::text(message.to_string())).map_err(|e| format!("sending: {}", shown(&e)))?;
        loop {
            let frame = self.socket.read().map_err(|e| format!("reading the answer: {}", shown(&e)))?;
            let text = match frame {
                Frame::Text(text) => text.to_string(),
                Frame::Binary(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Frame::Close(_) => return Err("the server closed the session".into()),
                // Pings are answered by the library; nothing else carries an answer.
                _ => continue,
            };
            let answer: Value = serde_json::from_str(&text).map_err(|e| format!("the answer is not JSON: {e}"))?;
            return match answer["type"].as_str() {
                Some("observation") => Ok(answer["data"].clone()),
                Some("error") => Err(format!(
                    "the server refused: {}",
                    quoted(
                        &answer["data"]["message"].as_str().map_or_else(|| answer["data"].to_string(), str::to_string)
                    )
                )),
                _ => Err(format!("an answer of unknown type: {}", quoted(&text))),
            };
        }
    }
}

fn shown(error: &tungstenite::Error) -> String {
    match error {
        tungstenite::Error::Io(io) if matches!(io.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
            "no answer within the task's timeout_s".into()
        }
        tungstenite::Error::Io(io) if io.to_string() == STOPPING => STOPPING.into(),
        tungstenite::Error::Capacity(why) => {
            format!("the server's message is too large ({why}; at most {} MiB)", MAX_MESSAGE_BYTES >> 20)
        }
        other => quoted(&other.to_string()),
    }
}

fn handshake_shown(error: &tungstenite::HandshakeError<tungstenite::ClientHandshake<Bounded>>) -> String {
    match error {
        tungstenite::HandshakeError::Failure(error) => shown(error),
        tungstenite::HandshakeError::Interrupted(_) => "the handshake did not finish".into(),
    }
}

/// A server's text, cut to [`QUOTED_CHARS`] and made printable.
fn quoted(text: &str) -> String {
    let mut cut: String = text.chars().take(QUOTED_CHARS).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    printable(&cut).into_owned()
}

impl Drop for Session {
    fn drop(&mut self) {
        // Tell the server the session is over, so that it frees the environment, and read
        // on until it closes the socket (the close handshake): a socket dropped under it
        // fails its own close, and it logs that failure every time. Bounded: CLOSE_WAIT in
        // all; a server that went away is not this episode's concern any more. A session
        // that failed is only dropped (its socket closes with it).
        if self.broken {
            return;
        }
        self.socket.get_mut().deadline = Instant::now() + CLOSE_WAIT;
        let closed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if self.socket.send(Frame::text(json!({ "type": "close" }).to_string())).is_err() {
                return;
            }
            for _ in 0..16 {
                if self.socket.read().is_err() {
                    break;
                }
            }
        }));
        if closed.is_err() {
            tracing::warn!("closing an OpenEnv session panicked in the WebSocket library; the socket was dropped");
        }
    }
}

/// How long a closing session waits, in all, for the server's goodbye.
const CLOSE_WAIT: Duration = Duration::from_secs(2);

/// One episode: its session, and the rewards its steps gave so far.
pub struct OpenEnvEpisode {
    session: Session,
    spec: OpenEnvSpec,
    reward: f64,
}

impl OpenEnvEpisode {
    /// Send the model's reply as the action's field; the next observation, or the return
    /// when the environment says it is done.
    pub fn step(&mut self, reply: &str) -> Result<StepResult, Failed> {
        let mut action = serde_json::Map::new();
        action.insert(self.spec.action_field.clone(), Value::String(reply.to_string()));
        let answer = self
            .session
            .call(json!({ "type": "step", "data": action }))
            .map_err(|why| remote(format!("OpenEnv server {}: step: {why}", self.spec.url)))?;
        let reward = match &answer["reward"] {
            Value::Null => 0.0,
            value => value.as_f64().filter(|r| r.is_finite()).ok_or_else(|| {
                ("non_finite".to_string(), format!("the environment's reward is not a finite number: {value}"))
            })?,
        };
        self.reward += reward;
        if answer["done"].as_bool().unwrap_or(false) {
            let note = observation_text(&answer, &self.spec).ok().map(|text| text.chars().take(200).collect());
            return Ok(StepResult::Done(Score { reward: self.reward as f32, parts: Vec::new(), note }));
        }
        let text = observation_text(&answer, &self.spec)
            .map_err(|why| remote(format!("OpenEnv server {}: step: {why}", self.spec.url)))?;
        // The step's reward is in the return the episode ends with (OpenEnv's return), not
        // credited to its turn: what a server's step reward means is the server's own.
        Ok(StepResult::Continue { messages: vec![Message::new("user", text)], reward: None })
    }
}
