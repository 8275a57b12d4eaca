//! Compiles the built-in plugins from their sources in `plugins/` (the guest workspace, for
//! wasm32-wasip2) and copies each component into OUT_DIR, where `src/lib.rs` embeds it.
//!
//! Built here rather than committed: the bytes in the binary are always those of the sources
//! beside it, and `scripts/build-plugins` compiles into the same guest target directory, so
//! the file a config names by path and the built-in are the same component (same sha256).

use std::path::PathBuf;
use std::process::Command;

/// The built-in plugins: package name in plugins/rust, as the workspace builds them.
const BUILTINS: [&str; 5] = ["arithmetic", "math-answer", "math-verify", "code-tests", "judge"];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().parent().unwrap().to_path_buf();
    let plugins = root.join("plugins");
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").unwrap());
    for watched in [
        "plugins/sdk",
        "plugins/rust",
        "plugins/tests",
        "plugins/Cargo.toml",
        "plugins/Cargo.lock",
        "plugins/.cargo",
        "wit",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(watched).display());
    }
    println!("cargo:rerun-if-env-changed=WIRL_GUEST_TARGET_DIR");

    // The guest workspace's own target directory (shared with scripts/build-plugins, so
    // nothing is compiled twice), unless the checkout is read-only.
    let target_dir = std::env::var_os("WIRL_GUEST_TARGET_DIR").map_or_else(|| plugins.join("target"), PathBuf::from);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    // In plugins/: its .cargo/config.toml sets the target (wasm32-wasip2) and the guests' flags.
    // The whole workspace, as scripts/build-plugins builds it: cargo unifies the SDK's
    // features over the packages it builds, so building only these two would make other
    // bytes than the files in plugins/target, and each build would overwrite the other's.
    build.current_dir(&plugins).args(["build", "--release", "--workspace", "--target-dir"]).arg(&target_dir);
    // The outer build's settings are for the host (and under clippy, its driver); the guest
    // workspace has its own.
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        let host_only = key.starts_with("CARGO_") && key != "CARGO_HOME" && key != "CARGO_MAKEFLAGS";
        if host_only || ["RUSTFLAGS", "RUSTC", "RUSTC_WRAPPER", "RUSTC_WORKSPACE_WRAPPER", "RUSTDOC"].contains(&&*key) {
            build.env_remove(&key);
        }
    }
    let status = build.status().expect("running cargo for the built-in plugins");
    if !status.success() {
        panic!(
            "building the built-in plugins ({}) in {} failed; see cargo's output above. They are \
             WebAssembly components: the wasm32-wasip2 target must be installed \
             (`rustup target add wasm32-wasip2`)",
            BUILTINS.join(", "),
            plugins.display()
        );
    }
    for name in BUILTINS {
        let file = format!("{}.wasm", name.replace('-', "_"));
        let built = target_dir.join("wasm32-wasip2/release").join(&file);
        std::fs::copy(&built, out_dir.join(&file))
            .unwrap_or_else(|e| panic!("built-in plugin {name}: cannot copy {}: {e}", built.display()));
    }
}
