//! `wirl serve`: a model behind an OpenAI-compatible HTTP API (wirl-server), on loopback by
//! default; any other address needs an API key.

use anyhow::{Context, bail};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, an HF model directory, or the default model's name (default: the
    /// config's model, else the default model).
    #[arg(long)]
    model: Option<String>,
    /// A training config (TOML) whose tasks are served: their rewards (/v1/score,
    /// /get_reward), tasks and episodes (/v1/tasks, /v1/episodes) and Megatron-RL's
    /// /rollouts/, /grouped_rollouts/, /evaluation/. `default`: the embedded default job.
    #[arg(long, value_name = "TRAIN.toml")]
    config: Option<std::path::PathBuf>,
    /// The address to listen on. Anything but loopback needs --api-key.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port (0: any free one, printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Required as `Authorization: Bearer KEY` (but on /health); also read from WIRL_API_KEY.
    #[arg(long)]
    api_key: Option<String>,
    /// The model's name in /v1/models and responses (default: the file or directory name).
    #[arg(long)]
    name: Option<String>,
    /// Run a GGUF model's quantized weights (faster for single requests on the CPU).
    #[arg(long)]
    quantized: bool,
    /// Completions per request (`n`) at most.
    #[arg(long, default_value_t = 16)]
    max_n: usize,
    /// New tokens per completion at most.
    #[arg(long, default_value_t = 4096)]
    max_tokens: usize,
    /// Requests generating at once; more are answered 503 with Retry-After.
    #[arg(long, default_value_t = 64)]
    max_concurrent: usize,
    /// Seconds a request may take; then it is answered 504 and its generation cancelled.
    #[arg(long, default_value_t = 300)]
    timeout_s: u64,
    /// The largest request body, in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Episodes open at once (/v1/episodes); more are answered 503.
    #[arg(long, default_value_t = 256)]
    max_episodes: usize,
    /// Seconds an episode may sit idle before it is closed.
    #[arg(long, default_value_t = 600)]
    episode_idle_s: u64,
    /// Let clients load weights (POST /v1/load_weights, /update_weights) from checkpoints
    /// and models under this directory (off by default).
    #[arg(long, value_name = "DIR")]
    weights_dir: Option<std::path::PathBuf>,
}

/// The API key (`--api-key`, else WIRL_API_KEY); an error when `host` is not loopback and
/// there is none.
pub fn api_key(host: &str, given: Option<&str>, flag: &str) -> anyhow::Result<Option<String>> {
    let key = given.map(str::to_string).or_else(|| std::env::var("WIRL_API_KEY").ok()).filter(|k| !k.is_empty());
    let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback && key.is_none() {
        bail!(
            "{flag} {host}: serving beyond this machine needs an API key (--api-key KEY or WIRL_API_KEY); \
             without one, wirl serves on 127.0.0.1 only"
        );
    }
    Ok(key)
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let api_key = api_key(&args.host, args.api_key.as_deref(), "--host")?;
    for (flag, value) in
        [("--max-n", args.max_n), ("--max-tokens", args.max_tokens), ("--max-concurrent", args.max_concurrent)]
    {
        if value == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    let run = match &args.config {
        None => None,
        Some(path) if path.as_os_str() == "default" => Some(crate::train::default_config()?.run_config()?),
        Some(path) => Some(served_config(path)?.run_config()?),
    };
    let model = args.model.clone().or_else(|| run.as_ref().map(|r| r.model.clone()));
    let path = crate::model::resolve(model.as_deref())?;
    let options = wirl_engine::LoadOptions { quantized: args.quantized, ..Default::default() };
    let loaded = wirl_engine::load(&path, &options)?;
    let context = loaded.config.max_position_embeddings;
    let name = args.name.clone().unwrap_or_else(|| match model.as_deref() {
        None | Some(crate::model::DEFAULT_MODEL) => crate::model::DEFAULT_MODEL.to_string(),
        Some(_) => path.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    });
    let tokenizer = Arc::new(loaded.tokenizer);
    let served = match &run {
        Some(run) => served_tasks(run)?,
        None => Vec::new(),
    };
    let (engine, _thread) = wirl_engine::EngineHandle::spawn(Arc::new(loaded.model), tokenizer.clone())?;
    let config = wirl_server::ServeConfig {
        model_name: name.clone(),
        api_key,
        limits: wirl_server::Limits { max_n: args.max_n, max_tokens: args.max_tokens, ..Default::default() },
        max_body_bytes: args.max_body_bytes,
        max_concurrent: args.max_concurrent,
        request_timeout: Duration::from_secs(args.timeout_s.max(1)),
        weights_dir: match &args.weights_dir {
            Some(dir) if !dir.is_dir() => bail!("--weights-dir {}: not a directory", dir.display()),
            Some(dir) => Some(dir.canonicalize().with_context(|| format!("--weights-dir {}", dir.display()))?),
            None => None,
        },
        load_options: options.clone(),
        task_limits: wirl_server::TaskLimits {
            max_sessions: args.max_episodes.max(1),
            session_idle: Duration::from_secs(args.episode_idle_s.max(1)),
            ..Default::default()
        },
    };
    let names: Vec<String> = served.iter().map(|t| t.name.clone()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let address = listener.local_addr()?;
        eprintln!("wirl serve: {name} on http://{address} (OpenAI-compatible: /v1/models, /v1/chat/completions, /v1/completions)");
        if !names.is_empty() {
            eprintln!(
                "wirl serve: tasks {} (/v1/tasks, /v1/score, /get_reward, /v1/episodes, /rollouts/, /grouped_rollouts/, \
                 /evaluation/)",
                names.join(", ")
            );
        }
        let router = wirl_server::router(engine, tokenizer, context, config, None, served);
        wirl_server::serve(listener, router, shutdown_signal()).await.context("serving")?;
        eprintln!("wirl serve: stopped (requests in flight were finished)");
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// A training config, or a task set (`[[tasks]]` and `[[rewards]]` alone, as `wirl ctl apply`
/// takes) in the embedded default's settings.
fn served_config(path: &std::path::Path) -> anyhow::Result<wirl_trainer::TrainConfig> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| anyhow::anyhow!("{}: {}", path.display(), e.message()))?;
    if table.contains_key("model") {
        return wirl_trainer::TrainConfig::load(path);
    }
    let set = wirl_trainer::TrainConfig::read_task_set(path)?;
    let base = path.parent().unwrap_or(std::path::Path::new("."));
    crate::train::default_config()?.with_task_set(set, &path.display().to_string(), base)
}

/// The config's tasks, loaded as `wirl train` loads them.
fn served_tasks(run: &wirl_trainer::RunConfig) -> anyhow::Result<Vec<wirl_server::ServedTask>> {
    let sandbox = wirl_sandbox::Sandbox::new(wirl_sandbox::SandboxSettings::default())?;
    let mut served = Vec::new();
    for spec in &run.tasks {
        let name = &spec.name;
        let source =
            wirl_rollout::TaskSource::load(&sandbox, &spec.source).with_context(|| format!("task `{name}`"))?;
        let scorers = wirl_rollout::Scorers::for_source(&sandbox, &source, &spec.rewards)
            .with_context(|| format!("task `{name}`"))?;
        served.push(wirl_server::ServedTask {
            name: name.clone(),
            source,
            scorers,
            sampling: spec.sampling,
            failures: spec.failures,
            max_turns: spec.max_turns,
            pass_reward: spec.pass_reward,
            eval_first_index: run.eval.first_index,
            seed: run.grpo.seed,
        });
    }
    Ok(served)
}

/// Ctrl-C or SIGTERM: stop accepting, let requests in flight finish.
async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}

/// `wirl train --serve ADDR`: the training's live weights behind the same API, its control at
/// `/control/*`, its figures at `/metrics`; from a thread, until the returned sender drops.
pub fn serve_training(
    address: &str,
    api_key: Option<String>,
    trainer: &wirl_trainer::Trainer,
    control: wirl_trainer::Control,
) -> anyhow::Result<tokio::sync::oneshot::Sender<()>> {
    let (host, port) = address
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_string(), port.parse::<u16>().ok()?)))
        .with_context(|| format!("--serve {address}: expected HOST:PORT, for example 127.0.0.1:8000"))?;
    let api_key = self::api_key(&host, api_key.as_deref(), "--serve")?;
    let config = wirl_server::ServeConfig { model_name: "policy".into(), api_key, ..Default::default() };
    let router = wirl_server::router(
        trainer.engine().clone(),
        trainer.tokenizer().clone(),
        trainer.context(),
        config,
        Some(Arc::new(TrainingControl(control))),
        Vec::new(),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((host.as_str(), port)))
        .with_context(|| format!("--serve: cannot listen on {address}"))?;
    eprintln!("serving the policy on http://{} (/v1/*, /control/*, /metrics)", listener.local_addr()?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    std::thread::Builder::new().name("wirl-serve".into()).spawn(move || {
        let served = runtime.block_on(wirl_server::serve(listener, router, async {
            let _ = stopped.await;
        }));
        if let Err(error) = served {
            tracing::warn!("--serve: the server stopped: {error}");
        }
    })?;
    Ok(stop)
}

/// The trainer's `Control` as the server's `RunControl`.
struct TrainingControl(wirl_trainer::Control);

impl wirl_server::RunControl for TrainingControl {
    fn status(&self) -> Result<serde_json::Value, String> {
        self.0.status().map_err(|e| format!("{e:#}")).and_then(|s| serde_json::to_value(s).map_err(|e| e.to_string()))
    }
    fn pause(&self) -> Result<serde_json::Value, String> {
        self.0.pause().map_err(|e| format!("{e:#}")).and_then(|s| serde_json::to_value(s).map_err(|e| e.to_string()))
    }
    fn resume(&self) -> Result<serde_json::Value, String> {
        self.0.resume().map_err(|e| format!("{e:#}")).and_then(|s| serde_json::to_value(s).map_err(|e| e.to_string()))
    }
    fn stop(&self) {
        self.0.stop();
    }
    fn rollback(&self) -> Result<String, String> {
        self.0.rollback().map_err(|e| format!("{e:#}"))
    }
    fn apply(
        &self,
        tasks: serde_json::Value,
        dry_run: bool,
        allow_new_capabilities: bool,
    ) -> Result<serde_json::Value, (String, Option<serde_json::Value>)> {
        let tasks: wirl_trainer::config::TaskSet =
            serde_json::from_value(tasks).map_err(|e| (format!("`tasks` is not a task set: {e}"), None))?;
        let options = wirl_trainer::ApplyOptions {
            dry_run,
            allow_new_capabilities,
            origin: "POST /control/apply".into(),
            reason: "apply".into(),
        };
        match self.0.apply(tasks, &options) {
            Ok(report) => Ok(serde_json::to_value(report).unwrap_or_default()),
            Err(refusal) => Err((refusal.message, refusal.report.and_then(|r| serde_json::to_value(r).ok()))),
        }
    }
}
