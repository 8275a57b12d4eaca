//! `wirl tasks`: the tasks of an environment plugin, as JSONL.

use std::io::Write;
use std::process::ExitCode;
use wirl_app::plugins::PluginOptions;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    plugin: PluginOptions,
    /// The task set's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Index of the first task.
    #[arg(long, default_value_t = 0)]
    start: u64,
    /// Number of tasks.
    #[arg(long, default_value_t = 10)]
    count: u64,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (_sandbox, plugin) = args.plugin.load()?;
    let mut environment = wirl_sandbox::EnvironmentPlugin::new(plugin)?;
    let mut out = std::io::stdout().lock();
    let end = args.start.checked_add(args.count).ok_or_else(|| {
        anyhow::anyhow!("--start {} + --count {} is past the last index (2^64 - 1)", args.start, args.count)
    })?;
    for index in args.start..end {
        let task = environment
            .task_at(args.seed, index)
            .map_err(|failure| anyhow::anyhow!("task {index} of seed {}: {failure}", args.seed))?;
        serde_json::to_writer(&mut out, &serde_json::json!({ "task": task }))?;
        writeln!(out)?;
    }
    Ok(ExitCode::SUCCESS)
}
