//! Builds every guest in `plugins/` (scripts/build-plugins: Rust for wasm32-wasip2, Python
//! with componentize-py, installed on first use) and emits one constant per guest with the
//! path of its component, so tests name guests by constant: an unknown guest fails the
//! build, and every guest is built before any test runs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().parent().unwrap().to_path_buf();
    let plugins = root.join("plugins");
    for watched in [
        "plugins/sdk",
        "plugins/rust",
        "plugins/tests",
        "plugins/python",
        "plugins/js",
        "plugins/c",
        "plugins/prebuilt",
        "scripts/componentize-c/src",
        "plugins/Cargo.toml",
        "wit",
        "scripts/build-plugins",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }

    let mut build = Command::new("bash");
    build.arg(root.join("scripts/build-plugins"));
    // The outer build's settings are for the host (and under clippy, its driver, which would
    // compile the guests with `cfg(clippy)` into other bytes than the built-ins'); the guest
    // workspace has its own. The same list as host/builtins/build.rs.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let host_only = key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_MAKEFLAGS";
        if host_only || ["RUSTFLAGS", "RUSTC", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "RUSTDOC"].contains(&&*key) {
            build.env_remove(&key);
        }
    }
    let status = build.status().expect("running scripts/build-plugins");
    if !status.success() {
        panic!("building the guests in {} failed (scripts/build-plugins; see its output above)", plugins.display());
    }

    let out_dir = plugins.join("target/wasm32-wasip2/release");
    let mut constants = String::new();
    for group in ["rust", "tests"] {
        for package in packages(&plugins.join(group)) {
            let wasm = out_dir.join(format!("{}.wasm", package.replace('-', "_")));
            assert!(wasm.exists(), "guest {package} built no component at {}", wasm.display());
            let name = package.to_uppercase().replace('-', "_");
            constants.push_str(&format!("pub const {name}: &str = {:?};\n", wasm.display().to_string()));
        }
    }
    // Other languages' guests are named with the language first: PYTHON_MATH_ANSWER.
    for (language, app) in [("python", "app.py"), ("js", "app.js"), ("c", "app.c"), ("prebuilt", "source")] {
        let built = plugins.join("target").join(language);
        for package in packages_with(&plugins.join(language), app) {
            let wasm = built.join(format!("{}.wasm", package.replace('-', "_")));
            assert!(wasm.exists(), "{language} guest {package} built no component at {}", wasm.display());
            let name = format!("{language}_{package}").to_uppercase().replace('-', "_");
            constants.push_str(&format!("pub const {name}: &str = {:?};\n", wasm.display().to_string()));
        }
    }
    let dest = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("guests.rs");
    std::fs::write(dest, constants).unwrap();
}

/// Package directories (those with a Cargo.toml) under `dir`, sorted.
fn packages(dir: &Path) -> Vec<String> {
    packages_with(dir, "Cargo.toml")
}

/// Directories under `dir` that hold `file`, sorted.
fn packages_with(dir: &Path, file: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().join(file).exists())
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}
