//! A running training's control over HTTP (`wirl train --serve`): the operations of the
//! trainer's `Control`, behind a trait so that this crate does not depend on the trainer;
//! and `GET /metrics` in Prometheus' text format.

use crate::ApiError;
use axum::http::StatusCode;
use serde_json::Value;

/// Why a run did not carry out a control request: answered 503 (with `Retry-After`: ask
/// again) or 409.
#[derive(Debug)]
pub enum ControlFailure {
    /// The run cannot answer yet (it is still loading).
    NotReady(String),
    /// The request does not fit the run's state.
    Conflict(String),
}

/// What `/control/*` can ask a run. Replies are JSON (the trainer's own types, serialized).
pub trait RunControl: Send + Sync + 'static {
    /// Step, manifest in force, staged changes, last step's figures.
    fn status(&self) -> Result<Value, ControlFailure>;
    fn pause(&self) -> Result<Value, ControlFailure>;
    fn resume(&self) -> Result<Value, ControlFailure>;
    fn stop(&self);
    fn rollback(&self) -> Result<String, ControlFailure>;
    /// Check and stage a task set (`{"tasks": [...], "rewards": [...]}`, absolute paths);
    /// `Err` carries the message and, when the checks ran, their report.
    fn apply(
        &self,
        tasks: Value,
        dry_run: bool,
        allow_new_capabilities: bool,
    ) -> Result<Value, (String, Option<Value>)>;
}

pub(crate) fn refused(message: String, report: Option<Value>) -> axum::response::Response {
    use axum::response::IntoResponse;
    let body = serde_json::json!({"error": {"message": message, "type": "invalid_request_error", "param": null,
                                            "code": null, "report": report}});
    (StatusCode::UNPROCESSABLE_ENTITY, axum::Json(body)).into_response()
}

pub(crate) fn failed(failure: ControlFailure) -> ApiError {
    match failure {
        ControlFailure::NotReady(message) => {
            ApiError::with_status(StatusCode::SERVICE_UNAVAILABLE, message).retry_after(1)
        }
        ControlFailure::Conflict(message) => ApiError::with_status(StatusCode::CONFLICT, message),
    }
}

/// The server's own figures for `/metrics`.
pub(crate) struct ServerFigures {
    pub requests: u64,
    pub tokens: u64,
    pub refused: u64,
    pub cancelled: u64,
    pub paused: bool,
    pub weights_version: u64,
    pub episodes_open: usize,
    /// Prompt positions taken from the engine's prefix cache, and computed.
    pub prompt_positions_cached: u64,
    pub prompt_positions_computed: u64,
    pub prefix_cache_blocks: u64,
}

/// Prometheus text: the run's figures from its status, and the server's counters.
pub(crate) fn metrics(status: Option<&Value>, server: &ServerFigures) -> String {
    let ServerFigures {
        requests,
        tokens,
        refused,
        cancelled,
        paused,
        weights_version,
        episodes_open,
        prompt_positions_cached,
        prompt_positions_computed,
        prefix_cache_blocks,
    } = *server;
    let mut out = String::new();
    let mut gauge = |name: &str, help: &str, value: f64| {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}\n"));
    };
    gauge("wirl_serve_requests_total", "Generation requests answered.", requests as f64);
    gauge("wirl_serve_generated_tokens_total", "Tokens generated for requests.", tokens as f64);
    gauge("wirl_serve_refused_total", "Requests answered 4xx or 5xx.", refused as f64);
    gauge("wirl_serve_cancelled_total", "Streamed generations cancelled: their client went away.", cancelled as f64);
    gauge("wirl_serve_paused", "1 while generation is paused (/pause).", f64::from(u8::from(paused)));
    gauge(
        "wirl_serve_weights_version",
        "The version of the weights loaded last (/v1/load_weights).",
        weights_version as f64,
    );
    gauge("wirl_serve_episodes_open", "Episodes open (/v1/episodes).", episodes_open as f64);
    gauge(
        "wirl_serve_prompt_positions_cached_total",
        "Prompt positions whose keys and values came from the prefix cache.",
        prompt_positions_cached as f64,
    );
    gauge("wirl_serve_prompt_positions_computed_total", "Prompt positions computed.", prompt_positions_computed as f64);
    gauge(
        "wirl_serve_prefix_cache_blocks",
        "Blocks of 16 positions' keys and values the prefix cache holds.",
        prefix_cache_blocks as f64,
    );
    let prompt_positions = prompt_positions_cached + prompt_positions_computed;
    gauge(
        "wirl_serve_prefix_cache_hit_rate",
        "The share of prompt positions taken from the prefix cache, since the server began.",
        if prompt_positions == 0 { 0.0 } else { prompt_positions_cached as f64 / prompt_positions as f64 },
    );
    if let Some(status) = status {
        let number = |key: &str| status.get(key).and_then(Value::as_f64).unwrap_or(0.0);
        gauge("wirl_train_step", "Steps done.", number("step"));
        gauge("wirl_train_steps", "Steps of the run.", number("steps"));
        gauge("wirl_train_reward_mean", "The last step's mean reward.", number("reward_mean"));
        gauge("wirl_train_pass_rate", "The last step's pass rate.", number("pass_rate"));
        let paused = status.get("paused").and_then(Value::as_bool).unwrap_or(false);
        gauge("wirl_train_paused", "1 while the run is paused.", f64::from(u8::from(paused)));
        let generation = status.pointer("/manifest/generation").and_then(Value::as_f64).unwrap_or(0.0);
        gauge("wirl_train_manifest_generation", "The task set's generation in force.", generation);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{ControlFailure, failed};
    use axum::response::IntoResponse;

    /// Errors by layer: a run that cannot answer yet is asked again (503 with `Retry-After`);
    /// a request that does not fit the run's state is a conflict (409). Both were 409.
    #[test]
    fn a_run_not_ready_is_503_to_retry_and_a_conflict_409() {
        let response = failed(ControlFailure::NotReady("the run is still loading".into())).into_response();
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()["retry-after"], "1");
        let response = failed(ControlFailure::Conflict("nothing to roll back to".into())).into_response();
        assert_eq!(response.status(), 409);
    }
}
