//! A new reward plugin (`wirl plugin new --lang LANG NAME`): a reward plugin that builds and scores out of the box.
//! Inside a wirl checkout it goes to `plugins/LANG/NAME`, where scripts/build-plugins finds
//! it; anywhere else (or with `--standalone`) it is a project of its own in `./NAME`, with
//! everything its build needs copied from this binary: the SDK or helper of its language,
//! the WIT, and for Python and JavaScript a `build.sh` that installs the pinned tool.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// A plugin's language (the CLI's `--lang`).
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Language {
    Rust,
    Python,
    Js,
    C,
}

/// Which plugin to make, and where.
pub struct NewPlugin {
    pub lang: Language,
    /// Lowercase letters, digits and `-` (it names the `.wasm` too).
    pub name: String,
    /// The wirl checkout to put it in (None: the one around the current directory; with
    /// none, a project of its own in ./NAME).
    pub root: Option<PathBuf>,
    /// A project of its own in ./NAME even inside a wirl checkout.
    pub standalone: bool,
}

/// What was made, and what to run next.
pub struct Created {
    /// The plugin's directory as the user should read it (relative to the checkout, or its name).
    pub shown: String,
    /// Its top-level files and folders.
    pub top: Vec<String>,
    /// Where to run the next commands from.
    pub from: PathBuf,
    /// The command that builds it.
    pub build: String,
    /// A command that scores its example with it.
    pub try_it: String,
}

const EXAMPLE: &str = include_str!("../templates/example.jsonl");

/// The WIT package, as a standalone project's build reads it.
const WIT: [(&str, &str); 6] = [
    ("agent.wit", include_str!("../../../wit/agent.wit")),
    ("code-runner.wit", include_str!("../../../wit/code-runner.wit")),
    ("environment.wit", include_str!("../../../wit/environment.wit")),
    ("reward.wit", include_str!("../../../wit/reward.wit")),
    ("types.wit", include_str!("../../../wit/types.wit")),
    ("worlds.wit", include_str!("../../../wit/worlds.wit")),
];

/// `wirl:rl@0.2.0` (wit/0.2.0/), beside it.
const WIT_V0_2: [(&str, &str); 5] = [
    ("environment.wit", include_str!("../../../wit/0.2.0/environment.wit")),
    ("inference.wit", include_str!("../../../wit/0.2.0/inference.wit")),
    ("reward.wit", include_str!("../../../wit/0.2.0/reward.wit")),
    ("types.wit", include_str!("../../../wit/0.2.0/types.wit")),
    ("worlds.wit", include_str!("../../../wit/0.2.0/worlds.wit")),
];

/// The Rust SDK's sources (plugins/sdk/src).
const RUST_SDK: [(&str, &str); 7] = [
    ("lib.rs", include_str!("../../../plugins/sdk/src/lib.rs")),
    ("reward.rs", include_str!("../../../plugins/sdk/src/reward.rs")),
    ("reward_v0_2.rs", include_str!("../../../plugins/sdk/src/reward_v0_2.rs")),
    ("environment.rs", include_str!("../../../plugins/sdk/src/environment.rs")),
    ("environment_v0_2.rs", include_str!("../../../plugins/sdk/src/environment_v0_2.rs")),
    ("agent.rs", include_str!("../../../plugins/sdk/src/agent.rs")),
    ("grader.rs", include_str!("../../../plugins/sdk/src/grader.rs")),
];

/// The guest workspace's pins, so a standalone Rust plugin builds with the versions wirl's
/// own plugins are tested with (a test keeps these equal to plugins/Cargo.toml and
/// scripts/build-plugins).
const WIT_BINDGEN: &str = "=0.63.0";
const COMPONENTIZE_PY: &str = "0.25.1";
const COMPONENTIZE_JS: &str = "0.23.0";

/// A file of the new plugin: a template (its `{name}`, `{module}`, `{build}`, `{try}` and
/// `{version}` filled in) or a copy, written as is.
enum Content {
    Template(String),
    Copy(String),
}

type Files = Vec<(String, Content)>;

/// Where the new plugin goes.
enum Place {
    /// `plugins/LANG/NAME` of the wirl checkout at this root.
    Checkout(PathBuf),
    /// `./NAME`, a project of its own.
    Standalone,
}

/// Write the new plugin's files.
pub fn create(args: NewPlugin) -> anyhow::Result<Created> {
    let name = args.name.as_str();
    let valid = name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!("plugin name {name:?}: use lowercase letters, digits and `-`, starting with a letter (e.g. my-reward)");
    }
    let here = std::env::current_dir()?;
    let place = match args.root {
        Some(root) => Place::Checkout(root),
        None if args.standalone => Place::Standalone,
        None => find_checkout(&here).map_or(Place::Standalone, Place::Checkout),
    };
    let module = name.replace('-', "_");
    let (dir, files, build, try_it, from) = match &place {
        Place::Checkout(root) => {
            let (language, built) = match args.lang {
                Language::Rust => ("rust", "wasm32-wasip2/release"),
                Language::Python => ("python", "python"),
                Language::Js => ("js", "js"),
                Language::C => ("c", "c"),
            };
            let try_it = format!(
                "wirl score --plugin plugins/target/{built}/{module}.wasm --input plugins/{language}/{name}/example.jsonl"
            );
            let dir = root.join("plugins").join(language).join(name);
            (dir, checkout_files(args.lang), "bash scripts/build-plugins".to_string(), try_it, root.clone())
        }
        Place::Standalone => {
            let (files, build, wasm) = standalone_files(args.lang, &module)?;
            let try_it = format!("wirl score --plugin {wasm} --input example.jsonl");
            (here.join(name), files, build.to_string(), try_it, here.join(name))
        }
    };
    if dir.exists() {
        bail!("{} already exists; choose another name or remove it", dir.display());
    }
    let fill = |template: &str| {
        template
            .replace("{name}", name)
            .replace("{module}", &module)
            .replace("{build}", &build)
            .replace("{try}", &try_it)
            .replace("{version}", env!("CARGO_PKG_VERSION"))
    };
    let example = ("example.jsonl".to_string(), Content::Copy(EXAMPLE.to_string()));
    for (file, content) in files.iter().chain([&example]) {
        let path = dir.join(file);
        let text = match content {
            Content::Template(template) => fill(template),
            Content::Copy(text) => text.clone(),
        };
        std::fs::create_dir_all(path.parent().expect("a file in the plugin directory"))?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    let shown = match &place {
        Place::Checkout(root) => dir.strip_prefix(root).unwrap_or(&dir).display().to_string(),
        Place::Standalone => name.to_string(),
    };
    let top: std::collections::BTreeSet<&str> =
        files.iter().map(|(f, _)| f.split('/').next().unwrap_or(f)).chain(["example.jsonl"]).collect();
    let top = top.into_iter().map(str::to_string).collect();
    Ok(Created { shown, top, from, build, try_it })
}

/// The plugin's own files in a checkout (the SDKs and the WIT are the checkout's).
fn checkout_files(lang: Language) -> Files {
    let files: Vec<(&str, &str)> = match lang {
        Language::Rust => vec![
            ("Cargo.toml", include_str!("../templates/rust-Cargo.toml")),
            ("src/lib.rs", include_str!("../templates/rust-lib.rs")),
        ],
        Language::Python => vec![("app.py", include_str!("../templates/python-app.py"))],
        Language::Js => vec![("app.js", include_str!("../templates/js-app.js"))],
        Language::C => vec![("app.c", include_str!("../templates/c-app.c"))],
    };
    files.into_iter().map(|(f, t)| (f.to_string(), Content::Template(t.to_string()))).collect()
}

/// A standalone project's files, the command that builds it and the component it builds.
fn standalone_files(lang: Language, module: &str) -> anyhow::Result<(Files, &'static str, String)> {
    let wit = |under: &str| {
        let v0_1 = WIT.map(|(file, text)| (format!("{under}wit/{file}"), Content::Copy(text.to_string())));
        let v0_2 = WIT_V0_2.map(|(file, text)| (format!("{under}wit/0.2.0/{file}"), Content::Copy(text.to_string())));
        v0_1.into_iter().chain(v0_2)
    };
    let template = |file: &str, text: &str| (file.to_string(), Content::Template(text.to_string()));
    let copy = |file: &str, text: &str| (file.to_string(), Content::Copy(text.to_string()));
    Ok(match lang {
        Language::Rust => {
            let mut files = vec![
                template("Cargo.toml", include_str!("../templates/rust-standalone-Cargo.toml")),
                // The guests' target (wasm32-wasip2) and stack size, as in wirl's own workspace.
                copy(".cargo/config.toml", include_str!("../../../plugins/.cargo/config.toml")),
                // The versions wirl's own plugins are built and tested with.
                copy("Cargo.lock", include_str!("../../../plugins/Cargo.lock")),
                copy(".gitignore", "/target\n"),
                template("src/lib.rs", include_str!("../templates/rust-lib.rs")),
                template(
                    "wirl-sdk/Cargo.toml",
                    &include_str!("../templates/sdk-Cargo.toml").replace("{wit_bindgen}", WIT_BINDGEN),
                ),
            ];
            // In wirl's tree the SDK reads the WIT two folders up; here it sits beside it.
            for (file, text) in RUST_SDK {
                files.push(copy(&format!("wirl-sdk/src/{file}"), &text.replace("path: \"../../wit", "path: \"wit")));
            }
            files.extend(wit("wirl-sdk/"));
            (files, "cargo build --release", format!("target/wasm32-wasip2/release/{module}.wasm"))
        }
        Language::Python => {
            let mut files = vec![
                template("app.py", include_str!("../templates/python-app.py")),
                copy("wirl.py", include_str!("../../../plugins/python/sdk/wirl.py")),
                copy(".gitignore", "*.wasm\n__pycache__/\n"),
                template(
                    "build.sh",
                    &include_str!("../templates/python-build.sh").replace("{componentize_py}", COMPONENTIZE_PY),
                ),
            ];
            files.extend(wit(""));
            (files, "bash build.sh", format!("{module}.wasm"))
        }
        Language::Js => {
            let mut files = vec![
                template("app.js", include_str!("../templates/js-app.js")),
                copy("wirl.js", include_str!("../../../plugins/js/sdk/wirl.js")),
                copy("wirl_shared.js", include_str!("../../../plugins/js/sdk/wirl_shared.js")),
                copy("wirl_v0_2.js", include_str!("../../../plugins/js/sdk/wirl_v0_2.js")),
                copy(".gitignore", "*.wasm\n"),
                template(
                    "build.sh",
                    &include_str!("../templates/js-build.sh").replace("{componentize_js}", COMPONENTIZE_JS),
                ),
            ];
            files.extend(wit(""));
            (files, "bash build.sh", format!("{module}.wasm"))
        }
        Language::C => bail!(
            "a C plugin is built with a tool of wirl's checkout (scripts/componentize-c); run `wirl plugin new \
             --lang c` inside a checkout, or pass --root CHECKOUT"
        ),
    })
}

/// The wirl checkout holding `dir`: the nearest ancestor with `wit/` and `plugins/`.
fn find_checkout(dir: &Path) -> Option<PathBuf> {
    dir.ancestors().find(|d| d.join("wit/worlds.wit").is_file() && d.join("plugins").is_dir()).map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A standalone plugin is built with the pins of wirl's own guests and the whole WIT.
    #[test]
    fn standalone_pins_follow_the_repository() {
        let workspace = include_str!("../../../plugins/Cargo.toml");
        assert!(workspace.contains(&format!("wit-bindgen = {{ version = \"{WIT_BINDGEN}\"")), "plugins/Cargo.toml");
        let build = include_str!("../../../scripts/build-plugins");
        assert!(build.contains(&format!("componentize_py_version={COMPONENTIZE_PY}\n")));
        assert!(build.contains(&format!("componentize_js_version={COMPONENTIZE_JS}\n")));
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let listed = |dir: &str, ext: &str| {
            let mut names: Vec<String> = std::fs::read_dir(root.join(dir))
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(ext))
                .collect();
            names.sort();
            names
        };
        let mut wit: Vec<&str> = WIT.iter().map(|(f, _)| *f).collect();
        wit.sort();
        assert_eq!(listed("wit", ".wit"), wit, "every file of wit/ is in WIT");
        let mut wit: Vec<&str> = WIT_V0_2.iter().map(|(f, _)| *f).collect();
        wit.sort();
        assert_eq!(listed("wit/0.2.0", ".wit"), wit, "every file of wit/0.2.0/ is in WIT_V0_2");
        let mut sdk: Vec<&str> = RUST_SDK.iter().map(|(f, _)| *f).collect();
        sdk.sort();
        assert_eq!(listed("plugins/sdk/src", ".rs"), sdk, "every file of plugins/sdk/src is in RUST_SDK");
        for (file, text) in RUST_SDK {
            if text.contains("wit_bindgen::generate!") {
                assert!(text.contains("path: \"../../wit"), "{file}: the rewrite of the WIT path must apply");
            }
        }
    }
}
