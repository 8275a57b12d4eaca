//! `wirl serve`: a model behind an OpenAI-compatible HTTP API, on loopback by default (any
//! other address needs an API key). The flags are `ServeSettings`' own (`ServeFlags`: each
//! declared once, with its default); the server is composed by `wirl_app::serve`.

use std::path::PathBuf;
use std::process::ExitCode;
use wirl_app::serve::ServeLaunch;

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
    /// Required as `Authorization: Bearer KEY` (but on /health); also read from WIRL_API_KEY.
    #[arg(long)]
    api_key: Option<String>,
    #[command(flatten)]
    settings: wirl_server::ServeFlags,
    /// SandboxFusion's POST /run_code beside the model (`--runner python=code_runner.wasm`).
    #[command(flatten)]
    runners: wirl_app::code::RunnerOptions,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args { model, config, api_key, settings, runners } = args;
    let server = wirl_app::serve::start(ServeLaunch { model, config, api_key, flags: settings, runners })?;
    say!(
        "wirl serve: {} on http://{} (OpenAI-compatible: /v1/models, /v1/chat/completions, /v1/completions)",
        server.name,
        server.address
    );
    if !server.tasks.is_empty() {
        say!(
            "wirl serve: tasks {} (/v1/tasks, /v1/score, /get_reward, /v1/episodes, /rollouts/, /grouped_rollouts/, \
             /evaluation/)",
            server.tasks.join(", ")
        );
    }
    if let Some(languages) = &server.code_languages {
        say!("wirl serve: code ({languages}) at POST /run_code, as SandboxFusion serves it");
    }
    server.run(shutdown_signal())?;
    say!("wirl serve: stopped (requests in flight were given {} s to finish)", wirl_server::DRAIN.as_secs());
    Ok(ExitCode::SUCCESS)
}

/// Ctrl-C or SIGTERM: stop accepting, let requests in flight finish.
pub async fn shutdown_signal() {
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
