//! `wirl serve`: a model behind an OpenAI-compatible HTTP API (wirl-server), on loopback by
//! default; any other address needs an API key.

use anyhow::{Context, bail};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args)]
pub struct Args {
    /// A GGUF file, an HF model directory, or the default model's name (the default).
    #[arg(long)]
    model: Option<String>,
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
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let api_key = args.api_key.clone().or_else(|| std::env::var("WIRL_API_KEY").ok()).filter(|k| !k.is_empty());
    let loopback = args.host == "localhost" || args.host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback());
    if !loopback && api_key.is_none() {
        bail!(
            "--host {}: serving beyond this machine needs an API key (--api-key KEY or WIRL_API_KEY); \
             without one, wirl serves on 127.0.0.1 only",
            args.host
        );
    }
    for (flag, value) in
        [("--max-n", args.max_n), ("--max-tokens", args.max_tokens), ("--max-concurrent", args.max_concurrent)]
    {
        if value == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    let path = crate::model::resolve(args.model.as_deref())?;
    let options = wirl_engine::LoadOptions { quantized: args.quantized, ..Default::default() };
    let loaded = wirl_engine::load(&path, &options)?;
    let context = loaded.config.max_position_embeddings;
    let name = args.name.clone().unwrap_or_else(|| match args.model.as_deref() {
        None | Some(crate::model::DEFAULT_MODEL) => crate::model::DEFAULT_MODEL.to_string(),
        Some(_) => path.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned()),
    });
    let tokenizer = Arc::new(loaded.tokenizer);
    let (engine, _thread) = wirl_engine::EngineHandle::spawn(Arc::new(loaded.model), tokenizer.clone())?;
    let config = wirl_server::ServeConfig {
        model_name: name.clone(),
        api_key,
        limits: wirl_server::Limits { max_n: args.max_n, max_tokens: args.max_tokens, ..Default::default() },
        max_body_bytes: args.max_body_bytes,
        max_concurrent: args.max_concurrent,
        request_timeout: Duration::from_secs(args.timeout_s.max(1)),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind((args.host.as_str(), args.port))
            .await
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?;
        let address = listener.local_addr()?;
        eprintln!("wirl serve: {name} on http://{address} (OpenAI-compatible: /v1/models, /v1/chat/completions, /v1/completions)");
        let router = wirl_server::router(engine, tokenizer, context, config);
        wirl_server::serve(listener, router, shutdown_signal()).await.context("serving")?;
        eprintln!("wirl serve: stopped (requests in flight were finished)");
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
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
