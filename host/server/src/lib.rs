//! `wirl serve`: the engine's batching actor over HTTP, OpenAI-compatible — `GET /v1/models`,
//! `POST /v1/chat/completions`, `POST /v1/completions` (streaming, `n`, sampling, log-probs,
//! usage) — with the exact token ids RL clients need (`prompt_token_ids`, per choice
//! `token_ids`, and Megatron's `generation_token_ids` / `generation_log_probs` on the
//! message). Every request is bounded (body size, `n`, tokens, a deadline); when all slots
//! are busy a request is answered 503 with `Retry-After`; a client that goes away cancels its
//! generation (the engine drops rows no one waits for); bad input is a 4xx naming the field.
//!
//! With tasks (`wirl serve --config`), it also serves the rollout layer: rewards, tasks,
//! episodes and Megatron-RL's rollout endpoints (`tasks`), from the same `wirl-rollout`
//! pieces `wirl train` steps with.
//!
//! It must not know the trainer's loop, configs or the command line.

mod code;
mod control;
mod openai;
mod request;
mod settings;
mod task_replies;
mod tasks;
mod weights;

/// The routes `router` and `sandbox_router` make, as `serve` takes them.
pub use axum::Router;
pub use code::{CodeLanguage, CodeLimits, CodeService, canonical_language};
pub use control::{ControlFailure, RunControl};
pub use request::Limits;
#[cfg(feature = "flags")]
pub use settings::ServeFlags;
pub use settings::{InvalidSetting, ServeSettings};
pub use tasks::{ServedTask, TaskLimits};

use axum::Json;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use openai::{
    ChatChoice, Choice, Chunk, Delta, ErrorBody, ErrorDetail, LastDelta, Logprobs, Message, ModelCard, ModelList,
    Piece, Reply, TextChoice, TextLogprobs, TokenLogprob, Usage, Widened,
};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};
use wirl_engine::{ChatMessage, Completion, EngineHandle, GenerateRequest, Tokenizer};

/// How the server behaves.
#[derive(Clone, Debug)]
pub struct ServeConfig {
    /// The model's name in `/v1/models` and responses.
    pub model_name: String,
    /// Required as `Authorization: Bearer KEY` on every route but `/health`.
    pub api_key: Option<String>,
    pub limits: Limits,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// Requests generating at once; more are answered 503 with `Retry-After`.
    pub max_concurrent: usize,
    /// A request still generating after this is cut (504) and its generation cancelled.
    pub request_timeout: Duration,
    /// A request's body must arrive within this, or it is answered 408.
    pub body_timeout: Duration,
    /// Limits of the task endpoints (rewards, episodes, rollouts).
    pub task_limits: TaskLimits,
    /// Where `/v1/load_weights` may load checkpoints and models from (off when `None`: a
    /// client must not make the server read any file it likes).
    pub weights_dir: Option<std::path::PathBuf>,
    /// How loaded weights are held (quantized or not, like the first).
    pub load_options: wirl_engine::LoadOptions,
    /// SandboxFusion's `/run_code` beside the model's routes (`wirl serve --runner`), if
    /// any.
    pub code: Option<Arc<CodeService>>,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeSettings::default().serve_config("wirl".into(), None, None, wirl_engine::LoadOptions::default())
    }
}

struct AppState {
    engine: EngineHandle,
    /// The training this server belongs to (`wirl train --serve`), if any.
    control: Option<Arc<dyn RunControl>>,
    /// The tasks served (`wirl serve --config`), if any.
    tasks: Option<Arc<tasks::Tasks>>,
    requests: AtomicU64,
    generated_tokens: AtomicU64,
    refused: AtomicU64,
    /// Streamed generations given up because their client went away.
    cancelled: AtomicU64,
    tokenizer: Arc<Tokenizer>,
    context: usize,
    config: ServeConfig,
    slots: Arc<Semaphore>,
    next_id: AtomicU64,
    created: u64,
    /// Set while generation is paused (`/pause`): new requests wait, in-flight ones finish.
    paused: tokio::sync::watch::Sender<bool>,
    /// The weights in force: where they came from and the version a client gave them.
    weights: std::sync::Mutex<weights::Loaded>,
}

/// An error in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<String>,
    retry_after: Option<u64>,
}

impl ApiError {
    fn bad(param: Option<&str>, message: &str) -> Self {
        let message = match param {
            Some(field) => format!("`{field}` {message}"),
            None => message.to_string(),
        };
        ApiError { status: StatusCode::BAD_REQUEST, message, param: param.map(str::to_string), retry_after: None }
    }

    fn with_status(status: StatusCode, message: String) -> Self {
        ApiError { status, message, param: None, retry_after: None }
    }

    /// Told to try again after `seconds` (`Retry-After`).
    fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = match self.status.as_u16() {
            401 => "authentication_error",
            404 => "not_found_error",
            429 | 503 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        };
        let detail = ErrorDetail {
            code: Some(()),
            message: &self.message,
            param: Some(self.param.as_deref()),
            kind: Some(kind),
        };
        let mut response = (self.status, Json(ErrorBody { error: detail })).into_response();
        if let Some(seconds) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

/// The routes, over an engine and its tokenizer; with `control`, also a running training's
/// `/control/*` and its figures in `/metrics`; with `tasks`, their rewards, environments and
/// rollouts.
pub fn router(
    engine: EngineHandle,
    tokenizer: Arc<Tokenizer>,
    context: usize,
    config: ServeConfig,
    control: Option<Arc<dyn RunControl>>,
    served: Vec<ServedTask>,
) -> Router {
    let created = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let state = Arc::new(AppState {
        engine,
        control,
        tasks: (!served.is_empty()).then(|| tasks::Tasks::new(served, config.task_limits.clone())),
        requests: AtomicU64::new(0),
        generated_tokens: AtomicU64::new(0),
        refused: AtomicU64::new(0),
        cancelled: AtomicU64::new(0),
        tokenizer,
        context,
        slots: Arc::new(Semaphore::new(config.max_concurrent.max(1))),
        next_id: AtomicU64::new(1),
        created,
        paused: tokio::sync::watch::Sender::new(false),
        weights: std::sync::Mutex::new(weights::Loaded::default()),
        config,
    });
    let body_limit = state.config.max_body_bytes;
    let code = state.config.code.clone().map_or_else(Router::new, code::routes);
    let api = Router::new()
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics))
        .route("/control/status", get(control_status))
        .route("/control/pause", post(control_pause))
        .route("/control/resume", post(control_resume))
        .route("/control/rollback", post(control_rollback))
        .route("/control/stop", post(control_stop))
        .route("/control/apply", post(control_apply))
        .route("/v1/load_weights", post(weights::load))
        .route("/update_weights", post(weights::load))
        .route("/v1/weights", get(weights::status))
        .route("/pause", post(weights::pause))
        .route("/resume", post(weights::resume))
        .route("/v1/tasks", get(tasks::list))
        .route("/v1/tasks/draw", post(tasks::draw))
        .route("/v1/score", post(tasks::score))
        .route("/get_reward", post(tasks::get_reward))
        .route("/v1/episodes", post(tasks::episode_reset))
        .route("/v1/episodes/{id}/step", post(tasks::episode_step))
        .route("/v1/episodes/{id}", axum::routing::delete(tasks::episode_close))
        .route("/rollouts/", post(tasks::rollouts))
        .route("/grouped_rollouts/", post(tasks::grouped_rollouts))
        .route("/evaluation/", post(tasks::evaluation))
        .merge(code)
        .route_layer(middleware::from_fn_with_state(state.clone(), authorize));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/liveness", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(api)
        .fallback(|| async { ApiError::with_status(StatusCode::NOT_FOUND, "no such route".into()) })
        .method_not_allowed_fallback(|| async {
            ApiError::with_status(StatusCode::METHOD_NOT_ALLOWED, "this route does not take that method".into())
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(middleware::from_fn_with_state((state.config.body_timeout, body_limit), read_body))
        .layer(middleware::from_fn_with_state(state.clone(), count))
        .with_state(state)
}

/// Count answers that refuse (for `/metrics`).
async fn count(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    if response.status().is_client_error() || response.status().is_server_error() {
        state.refused.fetch_add(1, Ordering::Relaxed);
    }
    response
}

async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let status = state.control.as_ref().and_then(|c| c.status().ok());
    let (cached, computed) = state.engine.prefix_stats().positions();
    let figures = control::ServerFigures {
        requests: state.requests.load(Ordering::Relaxed),
        tokens: state.generated_tokens.load(Ordering::Relaxed),
        refused: state.refused.load(Ordering::Relaxed),
        cancelled: state.cancelled.load(Ordering::Relaxed),
        paused: *state.paused.borrow(),
        weights_version: weights::current(&state),
        episodes_open: state.tasks.as_ref().map_or(0, |t| t.sessions()),
        prompt_positions_cached: cached,
        prompt_positions_computed: computed,
        prefix_cache_blocks: state.engine.prefix_stats().held_blocks(),
    };
    let text = control::metrics(status.as_ref(), &figures);
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}

fn run_control(state: &AppState) -> Result<&Arc<dyn RunControl>, ApiError> {
    state.control.as_ref().ok_or_else(|| {
        ApiError::with_status(
            StatusCode::NOT_FOUND,
            "this server controls no training (start one with `wirl train --serve ADDR`)".into(),
        )
    })
}

fn answer(result: Result<Value, control::ControlFailure>) -> Result<Json<Value>, ApiError> {
    result.map(Json).map_err(control::failed)
}

async fn control_status(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    answer(run_control(&state)?.status())
}

async fn control_pause(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    answer(run_control(&state)?.pause())
}

async fn control_resume(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    answer(run_control(&state)?.resume())
}

async fn control_rollback(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    answer(run_control(&state)?.rollback().map(|message| json!({"message": message})))
}

async fn control_stop(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    run_control(&state)?.stop();
    Ok(Json(json!({"message": "stopping: the run checkpoints and ends"})))
}

/// `{"tasks": {"tasks": [...], "rewards": [...]}, "dry_run": false, "allow_capabilities": false}`.
async fn control_apply(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let control = run_control(&state)?.clone();
    let mut body = request::object(&body)?;
    let Some(tasks) = body.remove("tasks").filter(Value::is_object) else {
        return Err(ApiError::bad(Some("tasks"), "must be a task set: {\"tasks\": [...], \"rewards\": [...]}"));
    };
    let flag = |name: &str| body.get(name).and_then(Value::as_bool).unwrap_or(false);
    let (dry_run, allow) = (flag("dry_run"), flag("allow_capabilities"));
    // The checks load plugins and re-score rollouts: off the async workers.
    let applied = tokio::task::spawn_blocking(move || control.apply(tasks, dry_run, allow))
        .await
        .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("the apply failed: {e}")))?;
    Ok(match applied {
        Ok(report) => Json(report).into_response(),
        Err((message, report)) => control::refused(message, report),
    })
}

/// How many connections the server holds, and how long it waits for a client.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed as soon as it is accepted (a client that
    /// opens connections without end cannot exhaust the process's file descriptors).
    pub max_connections: usize,
    /// A request's headers must arrive within this (a connection idle between requests
    /// waits at most this for the next one): half-sent headers do not hold a connection.
    pub header_timeout: Duration,
    /// After the shutdown signal, requests in flight get this long to finish; then their
    /// connections are closed (a generation or a prompt that never ends cannot keep the
    /// server from stopping).
    pub drain: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ServeSettings::default().connection_limits()
    }
}

/// How long a stopping server waits for requests in flight.
pub const DRAIN: Duration = Duration::from_secs(10);

/// Serve `router` on `listener` until `shutdown` resolves; requests in flight then finish
/// (within [`DRAIN`]).
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(listener, router, ConnectionLimits::default(), shutdown).await
}

/// [`serve`] with `limits` on connections: at most `max_connections` open, headers within
/// `header_timeout`.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let open = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (closing, closing_seen) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of file descriptors, or a connection reset before it was taken:
                    // wait a moment instead of spinning on the error.
                    tracing::warn!("accepting a connection: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            tracing::warn!("{} connections are open: one more refused", limits.max_connections);
            drop(stream);
            continue;
        };
        let service = hyper_util::service::TowerToHyperService::new(router.clone());
        let mut closing = closing_seen.clone();
        connections.spawn(async move {
            let _permit = permit;
            let connection = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => return,
                _ = closing.wait_for(|closing| *closing) => connection.as_mut().graceful_shutdown(),
            }
            let _ = connection.await;
        });
    }
    drop(listener);
    let _ = closing.send(true);
    let drained = tokio::time::timeout(limits.drain, async { while connections.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        tracing::warn!(
            "{} connections still busy {} s after the shutdown signal: closed",
            connections.len(),
            limits.drain.as_secs()
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Read a request's body within `timeout` and its size limit (408 and 413, in the JSON error
/// shape), so that a client trickling its body cannot hold a handler without end.
async fn read_body(State((timeout, limit)): State<(Duration, usize)>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let bytes = match tokio::time::timeout(timeout, axum::body::to_bytes(body, limit)).await {
        Err(_) => {
            return ApiError::with_status(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive within {} s", timeout.as_secs()),
            )
            .into_response();
        }
        Ok(Err(_)) => {
            return ApiError::with_status(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("the request body is over this server's limit of {limit} bytes (--max-body-bytes)"),
            )
            .into_response();
        }
        Ok(Ok(bytes)) => bytes,
    };
    next.run(Request::from_parts(parts, axum::body::Body::from(bytes))).await
}

async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    match refused_key(state.config.api_key.as_deref(), &request) {
        Some(refusal) => refusal,
        None => next.run(request).await,
    }
}

/// The 401 for a request without `key` as its bearer token, when a key is required.
fn refused_key(key: Option<&str>, request: &Request) -> Option<Response> {
    let key = key?;
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given.is_some_and(|given| same_secret(given.as_bytes(), key.as_bytes())) {
        return None;
    }
    let message =
        if given.is_some() { "the API key is not valid" } else { "an API key is needed: Authorization: Bearer KEY" };
    Some(ApiError::with_status(StatusCode::UNAUTHORIZED, message.into()).into_response())
}

/// The routes of a server that runs code and loads no model (`wirl sandbox serve`):
/// SandboxFusion's `/run_code` over `service`, `/health`, with the same body bounds and API
/// key rule as the model server's.
pub fn sandbox_router(
    service: Arc<CodeService>,
    api_key: Option<String>,
    max_body_bytes: usize,
    body_timeout: Duration,
) -> Router {
    let key: Option<Arc<str>> = api_key.map(Arc::from);
    let guarded = code::routes(service).route_layer(middleware::from_fn(move |request: Request, next: Next| {
        let key = key.clone();
        async move {
            match refused_key(key.as_deref(), &request) {
                Some(refusal) => refusal,
                None => next.run(request).await,
            }
        }
    }));
    Router::new()
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .merge(guarded)
        .fallback(|| async {
            ApiError::with_status(StatusCode::NOT_FOUND, "no such route (this server runs code: POST /run_code)".into())
        })
        .method_not_allowed_fallback(|| async {
            ApiError::with_status(StatusCode::METHOD_NOT_ALLOWED, "this route does not take that method".into())
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn_with_state((body_timeout, max_body_bytes), read_body))
}

/// Whether `given` equals `secret`, in time that does not depend on where they first differ
/// (a key compared byte by byte, stopping at the first difference, can be guessed byte by
/// byte from response times). Only the length may show.
fn same_secret(given: &[u8], secret: &[u8]) -> bool {
    given.len() == secret.len() && given.iter().zip(secret).fold(0u8, |differ, (a, b)| differ | (a ^ b)) == 0
}

async fn models(State(state): State<Arc<AppState>>) -> Response {
    let card = ModelCard {
        created: state.created,
        id: &state.config.model_name,
        max_model_len: state.context,
        object: "model",
        owned_by: "wirl",
    };
    Json(ModelList { data: [card], object: "list" }).into_response()
}

/// What a generation endpoint answers in: chat or text completions.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Chat,
    Text,
}

async fn chat(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let request::ChatRequest { common, messages, spliced_ids: spliced, template_vars } =
        request::ChatRequest::read(&body, &state.config.limits, state.tokenizer.vocab_size())?;
    let messages: Vec<ChatMessage> =
        messages.into_iter().map(|m| ChatMessage { role: m.role, content: m.content }).collect();
    // The chat template is the model's program and tokenizing a long conversation takes
    // time: both run off the server's async threads, so that a slow template (bounded in
    // its own right) never holds up `/health` or other requests.
    let rendering = state.clone();
    let prompt = tokio::task::spawn_blocking(move || match spliced {
        Some(ids) => spliced_prompt(&rendering, &messages, &ids),
        None => {
            let text = rendering.tokenizer.render_chat_with(&messages, true, &template_vars).map_err(|e| {
                ApiError::with_status(StatusCode::UNPROCESSABLE_ENTITY, format!("the messages cannot be rendered: {e}"))
            })?;
            encode(&rendering, &text)
        }
    })
    .await
    .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("rendering the prompt: {e}")))??;
    generate(state, common, prompt, Kind::Chat).await
}

/// The prompt of a conversation whose assistant messages carry their own token ids: those
/// ids as they are, and only what the chat template puts around and after them tokenized —
/// the ledger `wirl train` keeps for multi-turn episodes, so that a multi-turn client's
/// tokens never drift from what the model sampled.
fn spliced_prompt(state: &AppState, messages: &[ChatMessage], ids: &[Option<Vec<u32>>]) -> Result<Vec<u32>, ApiError> {
    let all: Vec<wirl_sandbox::Message> =
        messages.iter().map(|m| wirl_sandbox::Message { role: m.role.clone(), content: m.content.clone() }).collect();
    let marks: Vec<usize> = ids.iter().enumerate().filter_map(|(i, own)| own.as_ref().map(|_| i)).collect();
    let drift = |e: wirl_rollout::TemplateDrift| {
        ApiError::with_status(StatusCode::UNPROCESSABLE_ENTITY, format!("`prevent_retokenization`: {e}"))
    };
    let head = state.tokenizer.render_chat(&messages[..marks[0]], true).map_err(|e| {
        ApiError::with_status(StatusCode::UNPROCESSABLE_ENTITY, format!("the messages cannot be rendered: {e}"))
    })?;
    let mut tokens = encode(state, &head)?;
    for (k, &at) in marks.iter().enumerate() {
        let own = ids[at].as_deref().unwrap_or_default();
        tokens.extend_from_slice(own);
        let next = marks.get(k + 1).copied().unwrap_or(all.len());
        let eos = own.last().copied().filter(|id| state.tokenizer.eos_ids().contains(id));
        let text = wirl_rollout::episode::appended_text(
            &state.tokenizer,
            &all[..at],
            &all[at].content,
            eos,
            &all[at + 1..next],
        )
        .map_err(drift)?;
        tokens.extend(encode(state, &text)?);
    }
    Ok(tokens)
}

async fn completions(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Response, ApiError> {
    let request::CompletionRequest { common, prompt } =
        request::CompletionRequest::read(&body, &state.config.limits, state.tokenizer.vocab_size())?;
    let prompt = match prompt {
        request::Prompt::Text(text) => encode(&state, &text)?,
        request::Prompt::Tokens(ids) => ids,
    };
    generate(state, common, prompt, Kind::Text).await
}

fn encode(state: &AppState, text: &str) -> Result<Vec<u32>, ApiError> {
    state.tokenizer.encode(text).map_err(|e| {
        ApiError::with_status(StatusCode::UNPROCESSABLE_ENTITY, format!("the prompt cannot be tokenized: {e}"))
    })
}

/// Check the prompt's size, take a slot, generate (or stream), answer.
async fn generate(
    state: Arc<AppState>,
    common: request::Common,
    prompt: Vec<u32>,
    kind: Kind,
) -> Result<Response, ApiError> {
    if let Some(model) = &common.model
        && model != &state.config.model_name
    {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "the model `{model}` does not exist here; this server serves `{}`",
                state.config.model_name
            ),
            param: Some("model".into()),
            retry_after: None,
        });
    }
    if prompt.is_empty() || prompt.len() >= state.context {
        return Err(ApiError::bad(
            Some(if kind == Kind::Chat { "messages" } else { "prompt" }),
            &format!("is {} tokens; the model's context is {}", prompt.len(), state.context),
        ));
    }
    weights::wait_unpaused(&state).await?;
    let slot = take_slot(&state)?;
    let id = state.next_id.fetch_add(1, Ordering::Relaxed);
    let id = match kind {
        Kind::Chat => format!("chatcmpl-{id}"),
        Kind::Text => format!("cmpl-{id}"),
    };
    let request = GenerateRequest { prompt: prompt.clone(), n: common.n, sampling: common.sampling.clone() };
    if common.stream {
        return stream(state, slot, request, common, id, kind).await;
    }
    let timeout = state.config.request_timeout;
    let generated = tokio::time::timeout(timeout, state.engine.generate(request)).await;
    drop(slot);
    let completions = match generated {
        Err(_) => {
            return Err(ApiError::with_status(
                StatusCode::GATEWAY_TIMEOUT,
                format!(
                    "the request ran past this server's deadline of {} s; its generation was cancelled",
                    timeout.as_secs()
                ),
            ));
        }
        Ok(Err(error)) => return Err(engine_error(error)),
        Ok(Ok(completions)) => completions,
    };
    let logprobs: Vec<Option<Logprobs>> =
        completions.iter().map(|c| common.logprobs.then(|| token_logprobs(&state, kind, c))).collect();
    let choices = completions
        .iter()
        .zip(logprobs)
        .enumerate()
        .map(|(i, (c, logprobs))| choice(kind, i, c, logprobs, Ending::Reply))
        .collect();
    let generated: usize = completions.iter().map(|c| c.tokens.len()).sum();
    state.requests.fetch_add(1, Ordering::Relaxed);
    state.generated_tokens.fetch_add(generated as u64, Ordering::Relaxed);
    let reply = Reply {
        choices,
        created: now(),
        id: &id,
        model: &state.config.model_name,
        object: if kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        prompt_token_ids: &prompt,
        usage: Usage::new(prompt.len(), generated),
        weights_version: completions.first().map(|c| weights::label(&state, c.weights_version)),
    };
    Ok(Json(reply).into_response())
}

/// The engine's refusal or failure as an answer: bad input 400, its memory budget full 503
/// with `Retry-After`, anything else 500.
fn engine_error(error: wirl_engine::Error) -> ApiError {
    match error {
        wirl_engine::Error::Input(message) => ApiError::bad(None, &message),
        wirl_engine::Error::Busy(message) => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!("{message}; retry shortly"),
            param: None,
            retry_after: Some(1),
        },
        error => ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("generation failed: {error}")),
    }
}

/// A generation slot, or 503 with `Retry-After` when every one is busy.
pub(crate) fn take_slot(state: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    state.slots.clone().try_acquire_owned().map_err(|_| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!("all {} generation slots are busy; retry shortly", state.config.max_concurrent),
        param: None,
        retry_after: Some(1),
    })
}

fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Where a choice goes: a whole reply (a chat's `message`), or a stream's last chunk (a
/// chat's `delta` with the ids and log-probs; a text's empty `text`).
#[derive(Clone, Copy, PartialEq)]
enum Ending {
    Reply,
    LastChunk,
}

/// One choice of a finished completion, with its exact tokens.
fn choice(kind: Kind, index: usize, completion: &Completion, logprobs: Option<Logprobs>, ending: Ending) -> Choice<'_> {
    let finish_reason = openai::finish(completion.finish);
    let (ids, log_probs) = (&completion.tokens[..], Widened(&completion.logprobs));
    match kind {
        Kind::Chat => Choice::Chat(ChatChoice {
            delta: (ending == Ending::LastChunk)
                .then(|| LastDelta { generation_log_probs: Widened(&completion.logprobs), generation_token_ids: ids }),
            finish_reason,
            index,
            logprobs,
            message: (ending == Ending::Reply).then_some(Message {
                content: &completion.text,
                generation_log_probs: log_probs,
                generation_token_ids: ids,
                role: "assistant",
            }),
            token_ids: ids,
        }),
        Kind::Text => Choice::Text(TextChoice {
            finish_reason,
            generation_log_probs: log_probs,
            index,
            logprobs,
            text: if ending == Ending::Reply { &completion.text } else { "" },
            token_ids: ids,
        }),
    }
}

/// The sampled tokens' log-probs (and the most likely alternatives', when asked), in the
/// endpoint's shape; wirl adds each alternative's token id.
fn token_logprobs(state: &AppState, kind: Kind, completion: &Completion) -> Logprobs {
    let text = |id: u32| state.tokenizer.decode(&[id], false).unwrap_or_default();
    let tokens: Vec<String> = completion.tokens.iter().map(|&id| text(id)).collect();
    let alternatives = |i: usize| completion.top_logprobs.get(i).map(Vec::as_slice).unwrap_or_default();
    match kind {
        Kind::Chat => Logprobs::Chat {
            content: tokens
                .into_iter()
                .zip(&completion.logprobs)
                .enumerate()
                .map(|(i, (token, &logprob))| TokenLogprob {
                    bytes: token.as_bytes().to_vec(),
                    logprob,
                    token,
                    token_id: None,
                    top_logprobs: Some(
                        alternatives(i)
                            .iter()
                            .map(|&(id, logprob)| {
                                let token = text(id);
                                TokenLogprob {
                                    bytes: token.as_bytes().to_vec(),
                                    logprob,
                                    token,
                                    token_id: Some(id),
                                    top_logprobs: None,
                                }
                            })
                            .collect(),
                    ),
                })
                .collect(),
        },
        Kind::Text => Logprobs::Text(TextLogprobs {
            text_offset: (),
            token_logprobs: completion.logprobs.iter().map(|&x| f64::from(x)).collect(),
            top_logprobs: (!completion.top_logprobs.is_empty()).then(|| {
                (0..tokens.len())
                    .map(|i| alternatives(i).iter().map(|&(id, logprob)| (text(id), f64::from(logprob))).collect())
                    .collect()
            }),
            tokens,
        }),
    }
}

/// Server-sent events: a chunk per text piece, then each choice's last chunk (with its
/// token ids), usage if asked, `[DONE]`. The stream starts once the engine has admitted the
/// request (a refusal is still a status: 400, or 503 beyond the memory budget). A client
/// that goes away drops the stream, which drops the generation's receiver: the engine gives
/// the rows up.
async fn stream(
    state: Arc<AppState>,
    slot: tokio::sync::OwnedSemaphorePermit,
    request: GenerateRequest,
    common: request::Common,
    id: String,
    kind: Kind,
) -> Result<Response, ApiError> {
    let (pieces, receive_pieces) = mpsc::unbounded_channel();
    let (events, receive_events) = mpsc::channel::<Event>(64);
    let prompt_len = request.prompt.len();
    let streaming =
        match tokio::time::timeout(state.config.request_timeout, state.engine.start_streaming(request, pieces)).await {
            Ok(Ok(started)) => started,
            Ok(Err(error)) => return Err(engine_error(error)),
            Err(_) => {
                return Err(ApiError::with_status(
                    StatusCode::GATEWAY_TIMEOUT,
                    "the request waited past this server's deadline to start; it was cancelled".into(),
                ));
            }
        };
    let chunks = Chunks { id, kind, created: now(), model: state.config.model_name.clone() };
    let feed = Feed { state, pieces: receive_pieces, events, chunks, common, prompt_len };
    tokio::spawn(async move {
        let _slot = slot;
        feed.run(streaming).await;
    });
    let stream = futures_util::stream::unfold(receive_events, |mut receiver| async move {
        receiver.recv().await.map(|event| (Ok::<_, std::convert::Infallible>(event), receiver))
    });
    let mut response = Sse::new(stream).keep_alive(KeepAlive::default()).into_response();
    response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(response)
}

/// How a stream's chunks are written.
struct Chunks {
    id: String,
    kind: Kind,
    created: u64,
    model: String,
}

impl Chunks {
    fn object(&self) -> &'static str {
        if self.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" }
    }

    /// A chunk of `choices`, with `usage` when given.
    fn event<C: serde::Serialize>(&self, choices: Vec<C>, usage: Option<Usage>) -> Event {
        let chunk =
            Chunk { choices, created: self.created, id: &self.id, model: &self.model, object: self.object(), usage };
        Event::default().data(serde_json::to_string(&chunk).expect("chunks serialize"))
    }

    /// A chunk of one choice's text (a chat's first says its role).
    fn delta(&self, index: usize, text: &str, first: bool) -> Event {
        let piece = match self.kind {
            Kind::Chat => Piece::Chat {
                delta: Delta { content: text, role: first.then_some("assistant") },
                finish_reason: (),
                index,
            },
            Kind::Text => Piece::Text { finish_reason: (), index, text },
        };
        self.event(vec![piece], None)
    }

    /// The usage chunk (no choices).
    fn usage(&self, prompt_len: usize, generated: usize) -> Event {
        self.event(Vec::<()>::new(), Some(Usage::new(prompt_len, generated)))
    }
}

fn error_event(message: &str) -> Event {
    let error = ErrorDetail { code: None, message, param: None, kind: None };
    Event::default().data(serde_json::to_string(&ErrorBody { error }).expect("errors serialize"))
}

/// A streaming request's events, fed from its generation.
struct Feed {
    state: Arc<AppState>,
    pieces: mpsc::UnboundedReceiver<wirl_engine::TextPiece>,
    events: mpsc::Sender<Event>,
    chunks: Chunks,
    common: request::Common,
    prompt_len: usize,
}

impl Feed {
    /// The text as it comes, then each choice's last chunk, usage if asked, `[DONE]`. Ends
    /// early when the client goes away (dropping the generation cancels it).
    async fn run(mut self, streaming: wirl_engine::Streaming) {
        let Some(completions) = self.relay(streaming).await else { return };
        for (index, completion) in completions.iter().enumerate() {
            let kind = self.chunks.kind;
            let logprobs = self.common.logprobs.then(|| token_logprobs(&self.state, kind, completion));
            let last = choice(kind, index, completion, logprobs, Ending::LastChunk);
            if self.events.send(self.chunks.event(vec![last], None)).await.is_err() {
                return;
            }
        }
        let generated: usize = completions.iter().map(|c| c.tokens.len()).sum();
        self.state.requests.fetch_add(1, Ordering::Relaxed);
        self.state.generated_tokens.fetch_add(generated as u64, Ordering::Relaxed);
        if self.common.include_usage {
            let _ = self.events.send(self.chunks.usage(self.prompt_len, generated)).await;
        }
        let _ = self.events.send(Event::default().data("[DONE]")).await;
    }

    /// Relay the text pieces until the generation ends: its completions, or `None` when the
    /// client went away or the generation failed or ran past the deadline (said in the stream).
    async fn relay(&mut self, streaming: wirl_engine::Streaming) -> Option<Vec<Completion>> {
        let n = self.common.n;
        let generation = streaming.finish();
        tokio::pin!(generation);
        let deadline = tokio::time::sleep(self.state.config.request_timeout);
        tokio::pin!(deadline);
        let mut started = vec![false; n];
        let result = loop {
            tokio::select! {
                piece = self.pieces.recv() => {
                    if let Some(piece) = piece {
                        let first = !std::mem::replace(&mut started[piece.sample.min(n - 1)], true);
                        if self.events.send(self.chunks.delta(piece.sample, &piece.text, first)).await.is_err() {
                            // The client went away: dropping `generation` cancels it.
                            self.state.cancelled.fetch_add(1, Ordering::Relaxed);
                            return None;
                        }
                    }
                }
                result = &mut generation => break Some(result),
                _ = &mut deadline => break None,
            }
        };
        // Text produced after the last poll.
        while let Ok(piece) = self.pieces.try_recv() {
            let first = !std::mem::replace(&mut started[piece.sample.min(n - 1)], true);
            if self.events.send(self.chunks.delta(piece.sample, &piece.text, first)).await.is_err() {
                return None;
            }
        }
        match result {
            Some(Ok(completions)) => Some(completions),
            Some(Err(error)) => {
                let _ = self.events.send(error_event(&error.to_string())).await;
                None
            }
            None => {
                let message = "the request ran past this server's deadline; its generation was cancelled";
                let _ = self.events.send(error_event(message)).await;
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_compare_whole() {
        assert!(super::same_secret(b"sk-abc", b"sk-abc"));
        assert!(!super::same_secret(b"sk-abd", b"sk-abc"));
        assert!(!super::same_secret(b"sk-ab", b"sk-abc"));
        assert!(!super::same_secret(b"", b"sk-abc"));
    }
}
