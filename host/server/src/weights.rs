//! The served weights and generation's pause: `/v1/load_weights` (prime-rl's
//! `/update_weights` too) swaps in a checkpoint or model directory through the engine's
//! barrier, under a version the client names; `/pause` holds new requests and waits for those
//! in flight; `/resume` lets them go. For an inference server beside a trainer in another
//! process: pause, load the step's weights, resume.

use crate::{ApiError, AppState, request};
use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What was loaded, by the engine's weights version.
#[derive(Default)]
pub(crate) struct Loaded {
    /// Engine version → (the client's version, the path), for the last loads.
    by_engine: BTreeMap<u64, (u64, String)>,
}

/// The loads remembered (older completions report the engine's own version).
const REMEMBERED: usize = 64;

/// The version to report for completions sampled by engine version `engine`: the client's,
/// for weights it loaded.
pub(crate) fn label(state: &AppState, engine: u64) -> u64 {
    let loaded = state.weights.lock().unwrap_or_else(|e| e.into_inner());
    loaded.by_engine.get(&engine).map_or(engine, |(version, _)| *version)
}

/// The client's version of the weights loaded last (0 before any load).
pub(crate) fn current(state: &AppState) -> u64 {
    let loaded = state.weights.lock().unwrap_or_else(|e| e.into_inner());
    loaded.by_engine.values().next_back().map_or(0, |(version, _)| *version)
}

/// Wait while generation is paused, at most the request deadline (then 503).
pub(crate) async fn wait_unpaused(state: &AppState) -> Result<(), ApiError> {
    let mut paused = state.paused.subscribe();
    let waited = tokio::time::timeout(state.config.request_timeout, paused.wait_for(|p| !*p)).await;
    match waited {
        Ok(Ok(_)) => Ok(()),
        _ => Err(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "generation is paused (POST /resume resumes it); retry later".into(),
            param: None,
            retry_after: Some(5),
        }),
    }
}

/// `POST /pause`: new requests wait; answers once the ones in flight have finished (or after
/// `timeout_s`, 60 by default, saying how many still run).
pub(crate) async fn pause(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let body = if body.is_empty() { serde_json::Map::new() } else { request::object(&body)? };
    let timeout = match body.get("timeout_s") {
        None | Some(Value::Null) => 60.0,
        Some(v) => v
            .as_f64()
            .filter(|t| t.is_finite() && *t >= 0.0 && *t <= 3600.0)
            .ok_or_else(|| ApiError::bad(Some("timeout_s"), "must be a number of seconds from 0 to 3600"))?,
    };
    state.paused.send_replace(true);
    let all = state.config.max_concurrent.max(1) as u32;
    // Waiting for every slot queues ahead of later requests (the semaphore is fair): a
    // `/resume` while this waits must end the wait, or requests after it would still wait.
    let mut pause = state.paused.subscribe();
    let drain = tokio::time::timeout(Duration::from_secs_f64(timeout), state.slots.acquire_many(all));
    tokio::select! {
        drained = drain => {
            let in_flight = match drained {
                Ok(Ok(_permits)) => 0,
                _ => all as usize - state.slots.available_permits(),
            };
            Ok(Json(json!({"paused": true, "in_flight": in_flight})))
        }
        _ = pause.wait_for(|paused| !*paused) => {
            let in_flight = all as usize - state.slots.available_permits();
            let resumed = "POST /resume came before the requests in flight finished";
            Ok(Json(json!({"paused": false, "in_flight": in_flight, "resumed": resumed})))
        }
    }
}

pub(crate) async fn resume(State(state): State<Arc<AppState>>) -> Json<Value> {
    state.paused.send_replace(false);
    Json(json!({"paused": false}))
}

pub(crate) async fn status(State(state): State<Arc<AppState>>) -> Json<Value> {
    let loaded = state.weights.lock().unwrap_or_else(|e| e.into_inner());
    let last = loaded.by_engine.iter().next_back();
    Json(json!({
        "version": last.map(|(_, (version, _))| *version),
        "engine_version": last.map(|(engine, _)| *engine),
        "path": last.map(|(_, (_, path))| path.clone()),
        "paused": *state.paused.borrow(),
        "loading": state.config.weights_dir.as_ref().map(|d| d.display().to_string()),
    }))
}

/// `{path | weight_dir, version}`: a checkpoint's `model/`, an HF directory or a GGUF file
/// under the server's `--weights-dir`, with the tokenizer's vocabulary; requests in flight
/// finish on the old weights, later ones sample the new.
pub(crate) async fn load(State(state): State<Arc<AppState>>, body: Bytes) -> Result<Json<Value>, ApiError> {
    if state.control.is_some() {
        return Err(ApiError::with_status(
            StatusCode::CONFLICT,
            "this server serves a training's policy: its weights are the trainer's to change".into(),
        ));
    }
    let Some(root) = state.config.weights_dir.clone() else {
        return Err(ApiError::with_status(
            StatusCode::FORBIDDEN,
            "weight loading is off: start `wirl serve --weights-dir DIR` to load models from DIR".into(),
        ));
    };
    let (path, full, version) = asked_model(&root, &body)?;
    let options = state.config.load_options.clone();
    let started = Instant::now();
    let vocab = state.tokenizer.vocab_size();
    let context = state.context;
    let shown = path.clone();
    let model =
        tokio::task::spawn_blocking(move || load_like_served(&full, &options, &shown, vocab, context))
            .await
            .map_err(|e| ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("loading failed: {e}")))??;
    let engine =
        state.engine.set_model(Arc::new(model)).await.map_err(|e| {
            ApiError::with_status(StatusCode::INTERNAL_SERVER_ERROR, format!("the engine stopped: {e}"))
        })?;
    let version = version.unwrap_or(engine);
    {
        let mut loaded = state.weights.lock().unwrap_or_else(|e| e.into_inner());
        loaded.by_engine.insert(engine, (version, path.clone()));
        while loaded.by_engine.len() > REMEMBERED {
            loaded.by_engine.pop_first();
        }
    }
    tracing::info!("loaded {path} as version {version}");
    Ok(Json(json!({"version": version, "engine_version": engine, "path": path,
                   "seconds": started.elapsed().as_secs_f64()})))
}

/// The model a load request names: its path as given, where it is (checked to be under
/// `--weights-dir`: lexically, then following links), and the version asked for.
fn asked_model(root: &Path, body: &[u8]) -> Result<(String, PathBuf, Option<u64>), ApiError> {
    let body = request::object(body)?;
    let (field, path) = match (body.get("path"), body.get("weight_dir")) {
        (Some(Value::String(path)), _) => ("path", path.clone()),
        (None | Some(Value::Null), Some(Value::String(path))) => ("weight_dir", path.clone()),
        _ => return Err(ApiError::bad(Some("path"), "must be a model directory or file under --weights-dir")),
    };
    let version = match body.get("version") {
        None | Some(Value::Null) => None,
        Some(v) => Some(v.as_u64().ok_or_else(|| ApiError::bad(Some("version"), "must be a non-negative integer"))?),
    };
    let requested = PathBuf::from(&path);
    let full = if requested.is_absolute() { requested } else { root.join(requested) };
    let outside = || {
        ApiError::with_status(
            StatusCode::FORBIDDEN,
            format!("`{field}`: {path} is outside --weights-dir; only models under it can be loaded"),
        )
    };
    // Outside (lexically: `..`, another absolute path) is refused before anything is looked
    // at, so that answers do not tell which files exist elsewhere.
    let lexically_outside = full.components().any(|c| matches!(c, std::path::Component::ParentDir))
        || !full.starts_with(root) && root.is_absolute();
    if lexically_outside {
        return Err(outside());
    }
    match place_under(root, &full) {
        Place::Inside => {}
        Place::Missing => {
            return Err(ApiError::bad(Some(field), &format!("{path}: no such file or directory under --weights-dir")));
        }
        Place::Outside => return Err(outside()),
    }
    Ok((path, full, version))
}

/// Load a model that must have the served model's vocabulary and context.
fn load_like_served(
    full: &Path,
    options: &wirl_engine::LoadOptions,
    shown: &str,
    vocab: usize,
    context: usize,
) -> Result<wirl_engine::Model, ApiError> {
    let loaded = wirl_engine::load(full, options)
        .map_err(|e| ApiError::with_status(StatusCode::UNPROCESSABLE_ENTITY, format!("{shown}: {e:#}")))?;
    if loaded.tokenizer.vocab_size() != vocab || loaded.config.context() != context {
        return Err(ApiError::with_status(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "{shown}: its vocabulary ({}) or context ({}) differs from the served model's ({vocab}, {context}); \
                 serve another model with another server",
                loaded.tokenizer.vocab_size(),
                loaded.config.context()
            ),
        ));
    }
    Ok(loaded.model)
}

/// Where a path under `--weights-dir` (lexically) really is.
#[derive(Debug, PartialEq)]
enum Place {
    Inside,
    Missing,
    Outside,
}

/// Its longest existing prefix, with links resolved, decides: a link in the directory that
/// points out of it makes all beneath it outside, whether or not the rest exists, so the
/// answer never tells which files exist elsewhere.
fn place_under(root: &std::path::Path, full: &std::path::Path) -> Place {
    let Ok(root) = root.canonicalize() else { return Place::Outside };
    // An entry that is there, followed or not: a dangling link counts as there (and, not
    // resolving, as outside), so that a link's target does not tell by its absence either.
    let mut existing = full;
    while existing.symlink_metadata().is_err() {
        match existing.parent() {
            Some(parent) => existing = parent,
            None => return Place::Outside,
        }
    }
    match existing.canonicalize() {
        Ok(resolved) if !resolved.starts_with(&root) => Place::Outside,
        Ok(_) if existing == full => Place::Inside,
        Ok(_) => Place::Missing,
        Err(_) => Place::Outside,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_out_of_the_directory_hides_whether_files_exist_beyond_it() {
        let (root, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(elsewhere.path().join("secret"), "x").unwrap();
        std::fs::write(root.path().join("model.gguf"), "x").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), root.path().join("link")).unwrap();
        std::os::unix::fs::symlink(elsewhere.path().join("gone"), root.path().join("dangling")).unwrap();
        let place = |relative: &str| place_under(root.path(), &root.path().join(relative));
        assert_eq!(place("model.gguf"), Place::Inside);
        assert_eq!(place("missing.gguf"), Place::Missing);
        assert_eq!(place("sub/missing.gguf"), Place::Missing);
        assert_eq!(place("link/secret"), Place::Outside);
        assert_eq!(place("link/no-such-file"), Place::Outside, "the same answer whether or not it exists");
        assert_eq!(place("link"), Place::Outside);
        assert_eq!(place("dangling/x"), Place::Outside, "a link whose target is gone answers as a live one");
    }
}
