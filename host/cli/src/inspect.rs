//! `wirl plugin inspect`: what a plugin file is; `wirl plugin list`: the built-in plugins.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// The plugin component (`.wasm`), or a built-in: `builtin:NAME`.
    plugin: std::path::PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let sandbox = wirl_sandbox::Sandbox::new(Default::default())?;
    let plugin = sandbox.load(wirl_app::plugins::plugin_spec(&args.plugin)?)?;
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

#[derive(clap::Args)]
pub struct ListArgs {
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    json: bool,
}

/// Every built-in plugin, loaded as a config would load it (so world and WIT version are
/// the sandbox's reading, and the sha256 is the one rollouts record).
pub fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let sandbox = wirl_sandbox::Sandbox::new(Default::default())?;
    for builtin in wirl_builtins::all() {
        let plugin = sandbox.load(builtin.spec())?;
        if args.json {
            let line = serde_json::json!({
                "name": builtin.reference(),
                "world": plugin.world(),
                "wit_version": plugin.wit_version(),
                "sha256": plugin.sha256(),
                "size": plugin.size(),
                "source": builtin.source,
                "about": builtin.about,
            });
            println!("{line}");
        } else {
            println!("{}", builtin.reference());
            println!("  {}", builtin.about);
            println!("  world:  {} (wit {}@{})", plugin.world(), wirl_sandbox::WIT_PACKAGE, plugin.wit_version());
            println!("  sha256: {}", plugin.sha256());
            println!("  size:   {} bytes, built from {} in wirl's repository", plugin.size(), builtin.source);
        }
    }
    Ok(ExitCode::SUCCESS)
}
