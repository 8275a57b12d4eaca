//! `wirl serve`: a model behind an OpenAI-compatible HTTP API (wirl-server), on loopback by
//! default; any other address needs an API key.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use wirl_server::ControlFailure;
use wirl_trainer::ControlError;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, an HF model directory, or the default model's name (default: the
    /// config's model, else the default model).
    #[arg(long)]
    model: Option<String>,
    /// A config (TOML): its `[serve]` table sets this command's options (a flag given wins);
    /// its tasks, as in a training config or a task set, are served: their rewards
    /// (/v1/score, /get_reward), tasks and episodes (/v1/tasks, /v1/episodes) and
    /// Megatron-RL's /rollouts/, /grouped_rollouts/, /evaluation/. `default`: the embedded
    /// default job.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The address to listen on [default: 127.0.0.1]. Anything but loopback needs an API key.
    #[arg(long)]
    host: Option<String>,
    /// The port (0: any free one, printed) [default: 8000].
    #[arg(long)]
    port: Option<u16>,
    /// Required as `Authorization: Bearer KEY` (but on /health); also read from WIRL_API_KEY.
    #[arg(long)]
    api_key: Option<String>,
    /// The model's name in /v1/models and responses (default: the file or directory name).
    #[arg(long)]
    name: Option<String>,
    /// Run a GGUF model's quantized weights (faster on the CPU; log-probs then differ from
    /// the trainer's f32 ones).
    #[arg(long)]
    quantized: bool,
    /// A LoRA adapter directory (PEFT's format; a LoRA run's `checkpoints/step-N/adapter`)
    /// merged into the model as it loads (weights loaded later through /v1/load_weights
    /// come as their directory holds them).
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// The weights' dtype [default: f32]: bf16 keeps the linear layers' matrices in half the
    /// bytes and computes in f32 (decoding is faster on the CPU; log-probs differ from f32's
    /// by the rounding of the weights).
    #[arg(long, value_enum)]
    dtype: Option<crate::generate::WeightsDtype>,
    /// Where the model runs: `cpu`, `cuda` or `cuda:N` (a build made by scripts/build-cuda)
    /// [default: cpu].
    #[arg(long)]
    device: Option<String>,
    /// Split the model over this many tensor-parallel ranks (threads of this process; on
    /// CUDA one GPU each, from the one `--device` names, summing over NCCL) [default: 1].
    #[arg(long)]
    tp: Option<u16>,
    /// Completions per request (`n`) at most [default: 16].
    #[arg(long)]
    max_n: Option<usize>,
    /// New tokens per completion at most [default: 4096].
    #[arg(long)]
    max_tokens: Option<usize>,
    /// Requests generating at once; more are answered 503 with Retry-After [default: 64].
    #[arg(long)]
    max_concurrent: Option<usize>,
    /// Seconds a request may take; then it is answered 504 and its generation cancelled
    /// [default: 300].
    #[arg(long)]
    timeout_s: Option<u64>,
    /// Prompts longer than this many tokens are prefilled in slices of it, between other
    /// requests' decode steps, so that a long prompt does not hold every client [default: 128].
    #[arg(long)]
    prefill_chunk: Option<usize>,
    /// Connections open at once; more are closed when accepted [default: 1024].
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds a request's headers may take to arrive (and an idle connection may wait for
    /// its next request); its body gets three times as long, then 408 [default: 10].
    #[arg(long)]
    header_timeout_s: Option<u64>,
    /// MiB of key/value cache the requests in flight may come to hold (each counted at its
    /// prompt plus max_tokens); beyond it a request is answered 503 with Retry-After, and one
    /// that alone needs more, 400 [default: 2048].
    #[arg(long)]
    kv_budget_mib: Option<usize>,
    /// MiB of keys and values kept for later requests that start the same way (a shared
    /// system prompt, a conversation's earlier turns): they compute only their new tokens;
    /// least recently used blocks go first; 0 keeps none [default: 256].
    #[arg(long)]
    prefix_cache_mib: Option<u64>,
    /// SandboxFusion's POST /run_code beside the model (`--runner python=code_runner.wasm`).
    #[command(flatten)]
    runners: crate::sandbox::RunnerArgs,
    /// The largest request body, in bytes [default: 1048576].
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Episodes open at once (/v1/episodes); more are answered 503 [default: 256].
    #[arg(long)]
    max_episodes: Option<usize>,
    /// Seconds an episode may sit idle before it is closed [default: 600].
    #[arg(long)]
    episode_idle_s: Option<u64>,
    /// Let clients load weights (POST /v1/load_weights, /update_weights) from checkpoints
    /// and models under this directory (off by default).
    #[arg(long, value_name = "DIR")]
    weights_dir: Option<PathBuf>,
}

/// What `--config` gives: its `[serve]` table (paths in it resolved against the config's
/// directory; `[model] device` where it sets no device), the tasks' config (if it has tasks),
/// its `[model]` (a training config's, or the file's only section).
#[derive(Default)]
struct ConfigFile {
    serve: toml::Table,
    /// `[sandbox]`: `/run_code`'s runners and bounds (the flags over it).
    sandbox: Option<crate::sandbox::SandboxSection>,
    origin: String,
    tasks: Option<wirl_trainer::TrainConfig>,
    model: Option<wirl_trainer::config::ModelSection>,
}

/// Read `--config`: a `[serve]` table, and a training config, a task set, or only `[model]`.
fn read_config(path: &Path) -> anyhow::Result<ConfigFile> {
    if path.as_os_str() == "default" {
        let config = wirl_trainer::TrainConfig::embedded_default()?;
        return Ok(ConfigFile { model: Some(config.model.clone()), tasks: Some(config), ..Default::default() });
    }
    let origin = path.display().to_string();
    let text = wirl_trainer::config::read_config_text(path)?;
    let mut table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| anyhow::anyhow!("{origin}: {}", e.to_string().trim_end()))?;
    let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut serve = match table.remove("serve") {
        None => toml::Table::new(),
        Some(toml::Value::Table(section)) => section,
        Some(_) => bail!("{origin}: [serve] must be a table of settings (the flags of `wirl serve`)"),
    };
    for key in ["weights_dir", "adapter"] {
        if let Some(toml::Value::String(dir)) = serve.get(key) {
            let resolved = base.join(dir).to_string_lossy().into_owned();
            serve.insert(key.into(), toml::Value::String(resolved));
        }
    }
    let sandbox =
        table.remove("sandbox").map(|value| crate::sandbox::SandboxSection::read(value, &origin, base)).transpose()?;
    let only_model = table.keys().all(|k| k == "model");
    let rest = toml::to_string(&table)?;
    let (tasks, model) = match table.remove("model") {
        Some(section) if only_model => (None, Some(model_only(section, &origin)?)),
        Some(_) => {
            let config = wirl_trainer::TrainConfig::parse(&rest, &origin, base)?;
            let model = config.model.clone();
            (Some(config), Some(model))
        }
        None if table.is_empty() => (None, None),
        None => {
            let set = wirl_trainer::TrainConfig::parse_task_set(&rest, &origin, base)?;
            (Some(wirl_trainer::TrainConfig::embedded_default()?.with_task_set(set, &origin, base)?), None)
        }
    };
    // The model runs where its `[model]` says unless `[serve]` (or --device) says otherwise.
    if let Some(device) = model.as_ref().and_then(|m| m.device.clone()) {
        serve.entry("device").or_insert(toml::Value::String(device));
    }
    Ok(ConfigFile { serve, sandbox, origin, tasks, model })
}

/// A file whose only section is `[model]` trains nothing: `wirl serve` reads its path, device
/// and chat template variables, and refuses its training keys rather than ignore them, naming
/// what sets the same for the server.
fn model_only(section: toml::Value, origin: &str) -> anyhow::Result<wirl_trainer::config::ModelSection> {
    let model: wirl_trainer::config::ModelSection =
        section.try_into().map_err(|e: toml::de::Error| anyhow::anyhow!("{origin}: [model]: {}", e.message()))?;
    let training_keys = [
        (
            "prefix_cache_mib",
            model.prefix_cache_mib.is_some(),
            "set `[serve] prefix_cache_mib` (or --prefix-cache-mib)",
        ),
        ("inference_dtype", model.inference_dtype.is_some(), "set `[serve] dtype` (or --dtype)"),
        ("train_dtype", model.train_dtype.is_some(), "remove it"),
        ("device_sampling", model.device_sampling.is_some(), "remove it"),
        ("tf32", model.tf32.is_some(), "remove it"),
    ];
    if let Some(device) = &model.device
        && wirl_trainer::config::DeviceSpec::parse(device).is_none()
    {
        bail!("{origin}: [model] device = {device:?}: expected cpu, cuda or cuda:N");
    }
    if let Some((key, _, instead)) = training_keys.iter().find(|(_, set, _)| *set) {
        bail!("{origin}: [model] {key}: a training key, which `wirl serve` does not read; {instead}");
    }
    wirl_engine::check_template_vars(&model.chat_template_kwargs)
        .map_err(|reason| anyhow::anyhow!("{origin}: `model.chat_template_kwargs`: {reason}"))?;
    Ok(model)
}

/// The settings: the config's `[serve]` table, each flag given on the command line over it,
/// the defaults (`wirl_server::ServeSettings`) for the rest; checked.
fn settings(args: &Args, file: &ConfigFile) -> anyhow::Result<wirl_server::ServeSettings> {
    use clap::ValueEnum;
    let mut table = file.serve.clone();
    let mut set = |key: &str, value: Option<toml::Value>| {
        if let Some(value) = value {
            table.insert(key.to_string(), value);
        }
    };
    let int = |value: Option<u64>| value.map(|v| toml::Value::Integer(i64::try_from(v).unwrap_or(i64::MAX)));
    let count = |value: Option<usize>| int(value.map(|v| v as u64));
    let text = |value: &Option<String>| value.clone().map(toml::Value::String);
    set("host", text(&args.host));
    set("port", int(args.port.map(u64::from)));
    set("name", text(&args.name));
    set("quantized", args.quantized.then_some(toml::Value::Boolean(true)));
    set("adapter", args.adapter.as_ref().map(|dir| toml::Value::String(dir.to_string_lossy().into_owned())));
    set("dtype", args.dtype.and_then(|d| d.to_possible_value()).map(|v| toml::Value::String(v.get_name().into())));
    set("device", text(&args.device));
    set("tp", int(args.tp.map(u64::from)));
    set("max_n", count(args.max_n));
    set("max_tokens", count(args.max_tokens));
    set("max_concurrent", count(args.max_concurrent));
    set("timeout_s", int(args.timeout_s));
    set("prefill_chunk", count(args.prefill_chunk));
    set("max_connections", count(args.max_connections));
    set("header_timeout_s", int(args.header_timeout_s));
    set("kv_budget_mib", count(args.kv_budget_mib));
    set("prefix_cache_mib", int(args.prefix_cache_mib));
    set("max_body_bytes", count(args.max_body_bytes));
    set("max_episodes", count(args.max_episodes));
    set("episode_idle_s", int(args.episode_idle_s));
    set("weights_dir", args.weights_dir.as_ref().map(|dir| toml::Value::String(dir.to_string_lossy().into_owned())));
    let settings: wirl_server::ServeSettings = toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| {
        let origin = if file.origin.is_empty() { "the command line" } else { &file.origin };
        anyhow::anyhow!("{origin}: [serve]: {} (its keys are the flags of `wirl serve`, and api_key_env)", e.message())
    })?;
    settings.check()?;
    Ok(settings)
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

/// `wirl serve`. Over ~80 lines on purpose: the command's steps in the order they must run
/// (settings and their checks, the key, the model and its shards, the tasks, the engine, the
/// listener, the drain), each a few lines over the library calls that do the work.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let file = match &args.config {
        Some(path) => read_config(path)?,
        None => ConfigFile::default(),
    };
    let settings = settings(&args, &file)?;
    let (host, port) = (settings.host.clone(), settings.port);
    let key_from_file = match &settings.api_key_env {
        Some(variable) => Some(std::env::var(variable).map_err(|_| {
            anyhow::anyhow!("[serve] api_key_env names {variable}, which is not set: export it with the key")
        })?),
        None => None,
    };
    let api_key = api_key(&host, args.api_key.as_deref().or(key_from_file.as_deref()), "--host")?;
    let weights_dir = settings.weights_dir.clone();
    let run = file.tasks.as_ref().map(wirl_trainer::TrainConfig::run_config).transpose()?;
    let configured = run.as_ref().map(|r| r.model.clone()).or_else(|| file.model.as_ref().map(|m| m.path.clone()));
    let path = match &args.model {
        Some(model) => crate::model::resolve(Some(model))?,
        None => crate::model::resolve_named(configured.as_deref(), &format!("{}: `model.path` = ", file.origin))?,
    };
    let model = args.model.clone().or(configured);
    let device_name = settings.device.clone().unwrap_or_else(|| "cpu".into());
    let device = crate::device::parse_device(&device_name)?;
    let tp = usize::from(settings.tp);
    if tp > 1 && weights_dir.is_some() {
        bail!("--tp {tp} with --weights-dir: a tensor-parallel server's weights cannot be reloaded yet");
    }
    // Settings that a model's config or the machine refuse are refused before it loads.
    crate::ranks::check_split(&path, tp, "--tp")?;
    let options = wirl_engine::LoadOptions {
        quantized: settings.quantized,
        device,
        adapter: settings.adapter.clone(),
        ..Default::default()
    };
    let dtype = settings.dtype.as_deref().map(|name| {
        <crate::generate::WeightsDtype as clap::ValueEnum>::from_str(name, true)
            .expect("checked by ServeSettings::check")
    });
    let options = crate::generate::WeightsDtype::apply(dtype, options);
    let mut shards = if tp == 1 {
        vec![wirl_engine::load(&path, &options)?]
    } else {
        let spec = wirl_trainer::config::DeviceSpec::parse(&device_name).unwrap_or_default();
        crate::ranks::load_shards(&path, &options, tp, spec)?
    };
    let loaded = shards.remove(0);
    let context = loaded.config.context();
    let name = settings.name.clone().unwrap_or_else(|| match model.as_deref() {
        None | Some(crate::model::DEFAULT_MODEL) => crate::model::DEFAULT_MODEL.to_string(),
        Some(_) => path.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    });
    let mut tokenizer = loaded.tokenizer;
    // A config's `model.chat_template_kwargs` are every request's (a request's own go over them).
    if let Some(model) = &file.model {
        tokenizer.set_template_vars(model.chat_template_kwargs.clone())?;
    }
    let tokenizer = Arc::new(tokenizer);
    let mut served = match &run {
        Some(run) => served_tasks(run, &tokenizer)?,
        None => Vec::new(),
    };
    // Requests share their chat preamble and extend earlier conversations: the prefix cache
    // keeps their keys and values. Long prompts are prefilled in slices, very long ones
    // decode in a lane of their own, and the cache in flight has a budget.
    let options_engine = wirl_engine::EngineOptions {
        prefix_cache_bytes: settings.prefix_cache_mib.saturating_mul(1 << 20),
        prefill_chunk: Some(settings.prefill_chunk),
        max_lanes: 4,
        kv_budget_bytes: Some((settings.kv_budget_mib as u64) << 20),
        ..Default::default()
    };
    let models =
        std::iter::once(loaded.model).chain(shards.into_iter().map(|shard| shard.model)).map(Arc::new).collect();
    let (engine, _threads) = wirl_engine::EngineHandle::spawn_ranks(models, tokenizer.clone(), options_engine)?;
    // The served tasks' 0.2.0 rewards that judge with the model ask the one served.
    if let Some(run) = &run {
        let for_rewards = wirl_rollout::RewardEngine {
            handle: engine.clone(),
            tokenizer: tokenizer.clone(),
            context,
            seed: run.grpo.seed,
            usage: Default::default(),
        };
        for task in &mut served {
            task.loaded.scorers.set_engine(Some(for_rewards.clone()));
        }
    }
    let weights_dir = match &weights_dir {
        Some(dir) if !dir.is_dir() => bail!("--weights-dir {}: not a directory", dir.display()),
        Some(dir) => Some(dir.canonicalize().with_context(|| format!("--weights-dir {}", dir.display()))?),
        None => None,
    };
    // Weights loaded later (/v1/load_weights) come as their directory holds them.
    let reload_options = wirl_engine::LoadOptions { adapter: None, ..options.clone() };
    let mut config = settings.serve_config(name.clone(), api_key, weights_dir, reload_options);
    config.code = args.runners.over(file.sandbox.unwrap_or_default()).service()?;
    let code_languages = config.code.as_ref().map(|service| service.languages().join(", "));
    let names: Vec<String> = served.iter().map(|t| t.loaded.spec.name.clone()).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((host.as_str(), port))
            .await
            .with_context(|| format!("cannot listen on {host}:{port}"))?;
        let address = listener.local_addr()?;
        eprintln!("wirl serve: {name} on http://{address} (OpenAI-compatible: /v1/models, /v1/chat/completions, /v1/completions)");
        if !names.is_empty() {
            eprintln!(
                "wirl serve: tasks {} (/v1/tasks, /v1/score, /get_reward, /v1/episodes, /rollouts/, /grouped_rollouts/, \
                 /evaluation/)",
                names.join(", ")
            );
        }
        if let Some(languages) = code_languages {
            eprintln!("wirl serve: code ({languages}) at POST /run_code, as SandboxFusion serves it");
        }
        let router = wirl_server::router(engine, tokenizer, context, config, None, served);
        let limits = settings.connection_limits();
        wirl_server::serve_with(listener, router, limits, shutdown_signal()).await.context("serving")?;
        eprintln!(
            "wirl serve: stopped (requests in flight were given {} s to finish)",
            wirl_server::DRAIN.as_secs()
        );
        anyhow::Ok(())
    })?;
    // Work still running off the async threads (a chat template near its time limit) is not
    // waited for: the process ends.
    runtime.shutdown_timeout(Duration::from_millis(200));
    Ok(ExitCode::SUCCESS)
}

/// The config's tasks, loaded and checked as `wirl train` and `wirl eval` load them.
fn served_tasks(
    run: &wirl_trainer::RunConfig,
    tokenizer: &wirl_engine::Tokenizer,
) -> anyhow::Result<Vec<wirl_server::ServedTask>> {
    let sandbox = wirl_sandbox::Sandbox::new(wirl_sandbox::SandboxSettings::default())?;
    let mut served = Vec::new();
    for spec in &run.tasks {
        let loaded = wirl_rollout::LoadedTask::load(&sandbox, spec, tokenizer)?;
        served.push(wirl_server::ServedTask { loaded, eval_first_index: run.eval.first_index, seed: run.grpo.seed });
    }
    Ok(served)
}

/// Ctrl-C or SIGTERM: stop accepting, let requests in flight finish.
pub(crate) async fn shutdown_signal() {
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

/// The trainer's control error as the server's (which does not know the trainer).
fn control_failure(error: ControlError) -> ControlFailure {
    match error {
        ControlError::Loading => ControlFailure::NotReady(error.to_string()),
        ControlError::Conflict(message) => ControlFailure::Conflict(message),
    }
}

/// A status as JSON (it always serializes: plain fields and maps with string keys).
fn json_of(status: wirl_trainer::RunStatus) -> serde_json::Value {
    serde_json::to_value(status).unwrap_or_default()
}

/// The trainer's `Control` as the server's `RunControl`.
struct TrainingControl(wirl_trainer::Control);

impl wirl_server::RunControl for TrainingControl {
    fn status(&self) -> Result<serde_json::Value, ControlFailure> {
        self.0.status().map_err(control_failure).map(json_of)
    }
    fn pause(&self) -> Result<serde_json::Value, ControlFailure> {
        self.0.pause().map_err(control_failure).map(json_of)
    }
    fn resume(&self) -> Result<serde_json::Value, ControlFailure> {
        self.0.resume().map_err(control_failure).map(json_of)
    }
    fn stop(&self) {
        self.0.stop();
    }
    fn rollback(&self) -> Result<String, ControlFailure> {
        self.0.rollback().map_err(control_failure)
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
