//! `wirl plugin new --lang LANG NAME`: a reward plugin that builds and scores out of the box,
//! in the checkout's `plugins/LANG/NAME`, where scripts/build-plugins finds it.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Language {
    Rust,
    Python,
    Js,
    C,
}

#[derive(clap::Args)]
pub struct Args {
    /// The plugin's language.
    #[arg(long)]
    lang: Language,
    /// The plugin's name: lowercase letters, digits and `-` (it names the `.wasm` too).
    name: String,
    /// The wirl checkout to put it in (default: the one around the current directory).
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
}

const EXAMPLE: &str = include_str!("../templates/example.jsonl");

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let name = args.name.as_str();
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!("plugin name {name:?}: use lowercase letters, digits and `-`, starting with a letter (e.g. my-reward)");
    }
    let root = match args.root {
        Some(root) => root,
        None => find_checkout(&std::env::current_dir()?)?,
    };
    let module = name.replace('-', "_");
    let fill = |template: &str| template.replace("{name}", name).replace("{module}", &module);
    let (language, files, built): (&str, Vec<(&str, String)>, String) = match args.lang {
        Language::Rust => (
            "rust",
            vec![
                ("Cargo.toml", fill(include_str!("../templates/rust-Cargo.toml"))),
                ("src/lib.rs", fill(include_str!("../templates/rust-lib.rs"))),
            ],
            format!("plugins/target/wasm32-wasip2/release/{module}.wasm"),
        ),
        Language::Python => (
            "python",
            vec![("app.py", fill(include_str!("../templates/python-app.py")))],
            format!("plugins/target/python/{module}.wasm"),
        ),
        Language::Js => (
            "js",
            vec![("app.js", fill(include_str!("../templates/js-app.js")))],
            format!("plugins/target/js/{module}.wasm"),
        ),
        Language::C => (
            "c",
            vec![("app.c", fill(include_str!("../templates/c-app.c")))],
            format!("plugins/target/c/{module}.wasm"),
        ),
    };
    let dir = root.join("plugins").join(language).join(name);
    if dir.exists() {
        bail!("{} already exists; choose another name or remove it", dir.display());
    }
    for (file, text) in files.iter().chain([&("example.jsonl", EXAMPLE.to_string())]) {
        let path = dir.join(file);
        std::fs::create_dir_all(path.parent().expect("a file in the plugin directory"))?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let shown = dir.strip_prefix(&root).unwrap_or(&dir).display().to_string();
    println!(
        "created {shown}/ ({})",
        files.iter().map(|(f, _)| *f).chain(["example.jsonl"]).collect::<Vec<_>>().join(", ")
    );
    println!("next, from {}:", root.display());
    println!("  bash scripts/build-plugins");
    println!("  wirl score --plugin {built} --input {shown}/example.jsonl");
    Ok(ExitCode::SUCCESS)
}

/// The wirl checkout holding `dir`: the nearest ancestor with `wit/` and `plugins/`.
fn find_checkout(dir: &Path) -> anyhow::Result<PathBuf> {
    dir.ancestors()
        .find(|d| d.join("wit/worlds.wit").is_file() && d.join("plugins").is_dir())
        .map(Path::to_path_buf)
        .with_context(|| {
            format!(
                "{} is not inside a wirl checkout (no wit/ and plugins/ above it); run this from \
                 one, or pass --root",
                dir.display()
            )
        })
}
