//! `wirl serve` as the application composes it: the settings (a config's `[serve]` table,
//! the flags over it, the defaults), the API key, the model and its tensor-parallel shards,
//! the config's tasks, the engine, SandboxFusion's `/run_code` beside it, the listener. And
//! `wirl train --serve`: the training's live weights and its control behind the same API.
//! The caller prints what was started and says when to stop.

use crate::notices::notice;
use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wirl_server::ControlFailure;
use wirl_trainer::ControlError;

/// What `wirl serve` is started with.
#[derive(Default)]
pub struct ServeLaunch {
    /// A GGUF file, an HF model directory, or the default model's name (None: the config's
    /// model, else the default model).
    pub model: Option<String>,
    /// A config: its `[serve]` and `[sandbox]` tables, its `[model]`, its tasks (`default`:
    /// the embedded default job).
    pub config: Option<PathBuf>,
    /// The key given on the command line (else `[serve] api_key_env`, else WIRL_API_KEY).
    pub api_key: Option<String>,
    /// The flags given, over the config's `[serve]` table.
    pub flags: wirl_server::ServeFlags,
    /// `/run_code`'s runners and bounds, over the config's `[sandbox]` table.
    pub runners: crate::code::RunnerOptions,
}

/// A server started and listening, not yet serving: what it serves, for the caller to tell.
pub struct Server {
    runtime: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    router: wirl_server::Router,
    limits: wirl_server::ConnectionLimits,
    /// Where it listens (a port of 0 became a free one).
    pub address: std::net::SocketAddr,
    /// The model's name as served.
    pub name: String,
    /// The config's tasks served.
    pub tasks: Vec<String>,
    /// `/run_code`'s languages, if served.
    pub code_languages: Option<String>,
}

impl Server {
    /// Serve until `shutdown` resolves; requests in flight are then given `wirl_server::DRAIN`.
    pub fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
        let Server { runtime, listener, router, limits, .. } = self;
        runtime.block_on(wirl_server::serve_with(listener, router, limits, shutdown)).context("serving")?;
        // Work still running off the async threads (a chat template near its time limit) is
        // not waited for.
        runtime.shutdown_timeout(Duration::from_millis(200));
        Ok(())
    }
}

/// The listener's runtime: two worker threads serve the HTTP side; the engine and the
/// sandbox have threads of their own.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?)
}

/// Bind `host:port` in `runtime` and make the server of `router`.
fn listen(
    runtime: tokio::runtime::Runtime,
    (host, port): (&str, u16),
    router: wirl_server::Router,
    limits: wirl_server::ConnectionLimits,
) -> anyhow::Result<Server> {
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind((host, port)))
        .with_context(|| format!("cannot listen on {host}:{port}"))?;
    let address = listener.local_addr()?;
    Ok(Server {
        runtime,
        listener,
        router,
        limits,
        address,
        name: String::new(),
        tasks: Vec::new(),
        code_languages: None,
    })
}

/// What `--config` gives: its `[serve]` table (paths in it resolved against the config's
/// directory; `[model] device` where it sets no device), the tasks' config (if it has tasks),
/// its `[model]` (a training config's, or the file's only section).
#[derive(Default)]
struct ConfigFile {
    serve: toml::Table,
    /// `[sandbox]`: `/run_code`'s runners and bounds (the flags over it).
    sandbox: Option<crate::code::SandboxSection>,
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
        table.remove("sandbox").map(|value| crate::code::SandboxSection::read(value, &origin, base)).transpose()?;
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

/// The settings: the config's `[serve]` table, each flag given over it, the defaults
/// (`wirl_server::ServeSettings`) for the rest; checked.
fn settings(flags: &wirl_server::ServeFlags, file: &ConfigFile) -> anyhow::Result<wirl_server::ServeSettings> {
    let mut table = file.serve.clone();
    flags.over(&mut table);
    let settings: wirl_server::ServeSettings = toml::Value::Table(table).try_into().map_err(|e: toml::de::Error| {
        let origin = if file.origin.is_empty() { "the command line" } else { &file.origin };
        anyhow::anyhow!("{origin}: [serve]: {} (its keys are the flags of `wirl serve`, and api_key_env)", e.message())
    })?;
    settings.check()?;
    Ok(settings)
}

/// The key: given, else the variable `[serve] api_key_env` names, else WIRL_API_KEY; needed
/// beyond loopback.
fn key_of(launch: &ServeLaunch, settings: &wirl_server::ServeSettings) -> anyhow::Result<Option<String>> {
    let from_file = match &settings.api_key_env {
        Some(variable) => Some(std::env::var(variable).map_err(|_| {
            anyhow::anyhow!("[serve] api_key_env names {variable}, which is not set: export it with the key")
        })?),
        None => None,
    };
    api_key(&settings.host, launch.api_key.as_deref().or(from_file.as_deref()), "--host")
}

/// The model's path, and the name it was asked by (a flag's, else the config's).
fn model_of(
    launch: &ServeLaunch,
    file: &ConfigFile,
    run: Option<&wirl_trainer::RunConfig>,
) -> anyhow::Result<(PathBuf, Option<String>)> {
    let configured = run.map(|r| r.model.clone()).or_else(|| file.model.as_ref().map(|m| m.path.clone()));
    let path = match &launch.model {
        Some(model) => crate::models::resolve(Some(model))?,
        None => crate::models::resolve_named(configured.as_deref(), &format!("{}: `model.path` = ", file.origin))?,
    };
    Ok((path, launch.model.clone().or(configured)))
}

/// The model loaded as the settings say: one, or its tensor-parallel shards (rank 0's
/// first); and the options it loaded with.
fn load_model(
    path: &Path,
    settings: &wirl_server::ServeSettings,
) -> anyhow::Result<(Vec<wirl_engine::LoadedModel>, wirl_engine::LoadOptions)> {
    // The device first: one this build cannot open is the first thing to say.
    let options = load_options(settings)?;
    let device_name = settings.device.clone().unwrap_or_else(|| "cpu".into());
    let tp = usize::from(settings.tp);
    if tp > 1 && settings.weights_dir.is_some() {
        bail!("--tp {tp} with --weights-dir: a tensor-parallel server's weights cannot be reloaded yet");
    }
    // Settings that a model's config or the machine refuse are refused before it loads.
    crate::ranks::check_split(path, tp, "--tp")?;
    if tp == 1 {
        return Ok((vec![wirl_engine::load(path, &options)?], options));
    }
    let spec = wirl_trainer::config::DeviceSpec::parse(&device_name).unwrap_or_default();
    Ok((crate::ranks::load_shards(path, &options, tp, spec)?, options))
}

/// How the model's weights load (and load again through /v1/load_weights).
fn load_options(settings: &wirl_server::ServeSettings) -> anyhow::Result<wirl_engine::LoadOptions> {
    let device = crate::device::parse_device(settings.device.as_deref().unwrap_or("cpu"))?;
    let options = wirl_engine::LoadOptions {
        quantized: settings.quantized,
        device,
        adapter: settings.adapter.clone(),
        ..Default::default()
    };
    let dtype = settings.dtype.as_deref().map(|name| {
        <crate::models::WeightsDtype as clap::ValueEnum>::from_str(name, true).expect("checked by ServeSettings::check")
    });
    Ok(crate::models::WeightsDtype::apply(dtype, options))
}

/// The engine's options for serving: requests share their chat preamble and extend earlier
/// conversations (the prefix cache keeps their keys and values); long prompts are prefilled
/// in slices, very long ones decode in a lane of their own (4 lanes: what one machine's
/// cores batch well), and the cache in flight has a budget.
fn engine_options(settings: &wirl_server::ServeSettings) -> wirl_engine::EngineOptions {
    wirl_engine::EngineOptions {
        prefix_cache_bytes: settings.prefix_cache_mib.saturating_mul(1 << 20),
        prefill_chunk: Some(settings.prefill_chunk),
        max_lanes: SERVE_LANES,
        kv_budget_bytes: Some((settings.kv_budget_mib as u64) << 20),
        ..Default::default()
    }
}

/// Decoding lanes of a served engine.
const SERVE_LANES: usize = 4;

/// `--weights-dir`, a directory, canonical (what a client names is resolved under it).
fn weights_dir(settings: &wirl_server::ServeSettings) -> anyhow::Result<Option<PathBuf>> {
    match &settings.weights_dir {
        Some(dir) if !dir.is_dir() => bail!("--weights-dir {}: not a directory", dir.display()),
        Some(dir) => Ok(Some(dir.canonicalize().with_context(|| format!("--weights-dir {}", dir.display()))?)),
        None => Ok(None),
    }
}

/// `wirl serve`: everything loaded and the listener bound, in the order the checks must run
/// (settings, the key, the model, the tasks, the engine, the code service).
pub fn start(launch: ServeLaunch) -> anyhow::Result<Server> {
    let file = match &launch.config {
        Some(path) => read_config(path)?,
        None => ConfigFile::default(),
    };
    let settings = settings(&launch.flags, &file)?;
    let api_key = key_of(&launch, &settings)?;
    let run = file.tasks.as_ref().map(wirl_trainer::TrainConfig::run_config).transpose()?;
    let (path, asked) = model_of(&launch, &file, run.as_ref())?;
    let weights_dir = weights_dir(&settings)?;
    let (mut shards, options) = load_model(&path, &settings)?;
    let loaded = shards.remove(0);
    let context = loaded.config.context();
    let name = settings.name.clone().unwrap_or_else(|| match asked.as_deref() {
        None | Some(crate::models::DEFAULT_MODEL) => crate::models::DEFAULT_MODEL.to_string(),
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
    let models = std::iter::once(loaded.model).chain(shards.into_iter().map(|s| s.model)).map(Arc::new).collect();
    let (engine, _threads) =
        wirl_engine::EngineHandle::spawn_ranks(models, tokenizer.clone(), engine_options(&settings))?;
    // The served tasks' 0.2.0 rewards that judge with the model ask the one served.
    if let Some(run) = &run {
        let usage = Default::default();
        let for_rewards = wirl_rollout::RewardEngine {
            handle: engine.clone(),
            tokenizer: tokenizer.clone(),
            context,
            seed: run.grpo.seed,
            usage,
        };
        for task in &mut served {
            task.loaded.scorers.set_engine(Some(for_rewards.clone()));
        }
    }
    // Weights loaded later (/v1/load_weights) come as their directory holds them.
    let reload_options = wirl_engine::LoadOptions { adapter: None, ..options };
    let mut config = settings.serve_config(name.clone(), api_key, weights_dir, reload_options);
    config.code = launch.runners.over(file.sandbox.unwrap_or_default()).service()?;
    let code_languages = config.code.as_ref().map(|service| service.languages().join(", "));
    let tasks = served.iter().map(|t| t.loaded.spec.name.clone()).collect();
    let router = wirl_server::router(engine, tokenizer, context, config, None, served);
    let server = listen(runtime()?, (&settings.host, settings.port), router, settings.connection_limits())?;
    Ok(Server { name, tasks, code_languages, ..server })
}

/// `wirl sandbox serve`: SandboxFusion's `/run_code` alone, no model loaded.
pub fn start_sandbox(
    (host, port): (&str, u16),
    api_key: Option<&str>,
    max_body_bytes: usize,
    runners: &crate::code::RunnerOptions,
) -> anyhow::Result<Server> {
    let api_key = self::api_key(host, api_key, "--host")?;
    let Some(service) = runners.service()? else {
        bail!("wirl sandbox serve: give a language's runner, for example --runner python=code_runner.wasm");
    };
    let languages = service.languages().join(", ");
    let settings = wirl_server::ServeSettings::default();
    let body_timeout = Duration::from_secs(3 * settings.header_timeout_s);
    let router = wirl_server::sandbox_router(service, api_key, max_body_bytes, body_timeout);
    let server = listen(runtime()?, (host, port), router, settings.connection_limits())?;
    Ok(Server { code_languages: Some(languages), ..server })
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

/// The training's live weights served beside it (`--serve HOST:PORT`).
#[derive(Clone, Debug)]
pub struct ServeTraining {
    pub address: String,
    pub api_key: Option<String>,
}

/// `wirl train --serve ADDR`: the training's live weights behind the same API, its control at
/// `/control/*`, its figures at `/metrics`; from a thread, until the returned sender drops.
pub fn serve_training(
    serve: &ServeTraining,
    trainer: &wirl_trainer::Trainer,
    control: wirl_trainer::Control,
) -> anyhow::Result<tokio::sync::oneshot::Sender<()>> {
    let address = serve.address.as_str();
    let (host, port) = address
        .rsplit_once(':')
        .and_then(|(host, port)| Some((host.to_string(), port.parse::<u16>().ok()?)))
        .with_context(|| format!("--serve {address}: expected HOST:PORT, for example 127.0.0.1:8000"))?;
    let api_key = self::api_key(&host, serve.api_key.as_deref(), "--serve")?;
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
    notice(&format!("serving the policy on http://{} (/v1/*, /control/*, /metrics)", listener.local_addr()?));
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
