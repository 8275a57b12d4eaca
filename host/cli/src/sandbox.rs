//! `wirl sandbox serve`: SandboxFusion's `/run_code` over wirl's code runners, with no model
//! loaded (`wirl_app::serve::start_sandbox`).

use std::process::ExitCode;
use wirl_app::code::RunnerOptions;

#[derive(clap::Subcommand)]
pub enum SandboxCommand {
    /// Serve SandboxFusion's POST /run_code (the request and response verl's
    /// `sandbox_fusion`, SkyRL and the `sandbox-fusion` client send and read): every program
    /// in a fresh WebAssembly instance of its language's runner, no model loaded.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The address to listen on. Anything but loopback needs an API key.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// The port (0: any free one, printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Required as `Authorization: Bearer KEY` (but on /health); also read from WIRL_API_KEY.
    #[arg(long)]
    api_key: Option<String>,
    /// The largest request body, in bytes (a request's `files` travel in it, base64).
    #[arg(long, default_value_t = 64 << 20)]
    max_body_bytes: usize,
    #[command(flatten)]
    runners: RunnerOptions,
}

pub fn run(command: SandboxCommand) -> anyhow::Result<ExitCode> {
    let SandboxCommand::Serve(args) = command;
    let address = (args.host.as_str(), args.port);
    let server = wirl_app::serve::start_sandbox(address, args.api_key.as_deref(), args.max_body_bytes, &args.runners)?;
    let languages = server.code_languages.clone().unwrap_or_default();
    say!("wirl sandbox serve: {languages} on http://{} (POST /run_code)", server.address);
    server.run(crate::serve::shutdown_signal())?;
    say!("wirl sandbox serve: stopped");
    Ok(ExitCode::SUCCESS)
}
