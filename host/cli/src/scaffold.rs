//! `wirl plugin new --lang LANG NAME`: a reward plugin that builds and scores out of the box
//! (`wirl_app::scaffold`), and what to run next.

use std::path::PathBuf;
use std::process::ExitCode;
use wirl_app::scaffold::{Language, NewPlugin};

#[derive(clap::Args)]
pub struct Args {
    /// The plugin's language.
    #[arg(long)]
    lang: Language,
    /// The plugin's name: lowercase letters, digits and `-` (it names the `.wasm` too).
    name: String,
    /// The wirl checkout to put it in (default: the one around the current directory; with
    /// none, a project of its own in ./NAME).
    #[arg(long, value_name = "DIR", conflicts_with = "standalone")]
    root: Option<PathBuf>,
    /// Make a project of its own in ./NAME even inside a wirl checkout.
    #[arg(long)]
    standalone: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let Args { lang, name, root, standalone } = args;
    let created = wirl_app::scaffold::create(NewPlugin { lang, name, root, standalone })?;
    println!("created {}/ ({})", created.shown, created.top.join(", "));
    println!("next, from {}:", created.from.display());
    println!("  {}", created.build);
    println!("  {}", created.try_it);
    Ok(ExitCode::SUCCESS)
}
