//! `wirl plugin inspect`: what a plugin file is.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The plugin component (`.wasm`).
    plugin: std::path::PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let sandbox = wirl_sandbox::Sandbox::new(Default::default())?;
    let plugin = sandbox.load(wirl_sandbox::PluginSpec::new(&args.plugin))?;
    if args.json {
        let report = serde_json::json!({
            "path": plugin.path(),
            "world": plugin.world(),
            "wit_version": plugin.wit_version(),
            "sha256": plugin.sha256(),
            "size": plugin.size(),
            "imports": plugin.imports(),
            "exports": plugin.exports(),
        });
        println!("{report}");
    } else {
        println!("path:     {}", plugin.path().display());
        println!("world:    {}", plugin.world());
        println!("wit:      {}@{}", wirl_sandbox::WIT_PACKAGE, plugin.wit_version());
        println!("sha256:   {}", plugin.sha256());
        println!("size:     {} bytes", plugin.size());
        println!("exports:  {}", plugin.exports().join(", "));
        println!("imports:");
        for import in plugin.imports() {
            println!("  {import}");
        }
    }
    Ok(ExitCode::SUCCESS)
}
