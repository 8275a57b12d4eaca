//! `wirl model fetch`: put the default model in the cache; `export`: a GGUF file as an HF
//! directory; `merge`, `inspect`, `check-device`. Where models are found is `wirl_app::models`.

use anyhow::bail;
use std::path::PathBuf;
use std::process::ExitCode;
use wirl_app::models::{DEFAULT_MODEL, fetch_default, resolve_named};

#[derive(clap::Args)]
pub struct FetchArgs {
    /// Which model (only the default is known).
    #[arg(default_value = DEFAULT_MODEL)]
    name: String,
}

#[derive(clap::Args)]
pub struct ExportArgs {
    /// The GGUF file (or the default model's name).
    gguf: String,
    /// The directory to create (it must not exist).
    dir: PathBuf,
}

#[derive(clap::Args)]
pub struct MergeArgs {
    /// The base model: an HF directory or a GGUF file (or the default model's name).
    model: String,
    /// A PEFT LoRA adapter directory (a LoRA run's `checkpoints/step-N/adapter`).
    adapter: PathBuf,
    /// The directory to create (it must not exist).
    dir: PathBuf,
}

#[derive(clap::Args)]
pub struct InspectArgs {
    /// An HF model directory or a GGUF file (or the default model's name).
    model: String,
    /// Print the config as the engine reads it, as JSON.
    #[arg(long)]
    json: bool,
}

/// What a model is and whether wirl runs it (`wirl_app::models::describe`), or its config as
/// the engine reads it.
pub fn inspect(args: InspectArgs) -> anyhow::Result<ExitCode> {
    let path = resolve_named(Some(&args.model), "")?;
    let config = wirl_app::models::config_of(&path)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&config)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}", path.display());
    for line in wirl_app::models::describe(&config) {
        println!("{line}");
    }
    Ok(ExitCode::SUCCESS)
}

pub fn export(args: ExportArgs) -> anyhow::Result<ExitCode> {
    let gguf = resolve_named(Some(&args.gguf), "")?;
    wirl_app::models::export(&gguf, &args.dir)?;
    say!("wrote {} from {}", args.dir.display(), gguf.display());
    Ok(ExitCode::SUCCESS)
}

pub fn merge(args: MergeArgs) -> anyhow::Result<ExitCode> {
    let base = resolve_named(Some(&args.model), "")?;
    wirl_app::models::merge(&base, &args.adapter, &args.dir)?;
    say!("wrote {} from {} with the adapter {} merged", args.dir.display(), base.display(), args.adapter.display());
    Ok(ExitCode::SUCCESS)
}

pub fn fetch(args: FetchArgs) -> anyhow::Result<ExitCode> {
    if args.name != DEFAULT_MODEL {
        bail!(
            "unknown model {:?}: wirl can fetch {DEFAULT_MODEL}; for others pass a GGUF file or HF directory to --model",
            args.name
        );
    }
    let path = fetch_default()?;
    println!("{}", path.display());
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Args)]
pub struct CheckDeviceArgs {
    /// An HF model directory or a GGUF file (or the default model's name) [default: the
    /// default model].
    #[arg(long)]
    model: Option<String>,
    /// `cpu`, `cuda` or `cuda:N`.
    #[arg(long, default_value = "cuda")]
    device: String,
    /// The largest gradient difference allowed, relative to each gradient's largest value.
    #[arg(long, default_value_t = 1e-3)]
    tolerance: f32,
}

/// `wirl model check-device`: `wirl_app::models::check_device`, as one JSON line; exit 1
/// past the tolerance.
pub fn check_device(args: CheckDeviceArgs) -> anyhow::Result<ExitCode> {
    let (report, pass) = wirl_app::models::check_device(args.model.as_deref(), &args.device, args.tolerance)?;
    println!("{report}");
    Ok(if pass { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
