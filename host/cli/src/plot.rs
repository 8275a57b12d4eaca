//! `wirl plot RUN_DIR`: the run's charts (`wirl_app::plot`), each file's path printed.

use std::path::PathBuf;
use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {
    /// A run directory written by `wirl train`.
    run_dir: PathBuf,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    for chart in wirl_app::plot::draw(&args.run_dir)? {
        println!("{}", chart.display());
    }
    Ok(ExitCode::SUCCESS)
}
