//! Compiled components on disk, keyed by what makes compiled code reusable: the component's
//! bytes, the wasmtime version and the engine's settings.
//!
//! An entry is the sha256 of the compiled code followed by the code. Machine code is run as
//! it is found, so a damaged entry whose header still parses would crash the host (SIGTRAP,
//! or worse): every entry is verified against its checksum before it is used, and one that
//! does not match is compiled again.

use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::component::Component;
use wasmtime::{Engine, Module};

/// Load `bytes` (whose sha256 is `sha256`) as a component, from the cache when possible.
pub(crate) fn load(
    engine: &Engine,
    cache_dir: Option<&Path>,
    bytes: &[u8],
    sha256: &str,
) -> wasmtime::Result<Component> {
    let Some(dir) = cache_dir else {
        return Component::new(engine, bytes);
    };
    // SAFETY (both closures): the code given is either `precompile_component`'s output of
    // this very engine, or a cache entry that matches the checksum written with such output
    // by an engine with the same settings and version (both are in the entry's name).
    cached(
        &entry_path(engine, dir, sha256),
        || engine.precompile_component(bytes),
        |code| unsafe { Component::deserialize(engine, code) },
    )
}

/// Load `bytes` (whose sha256 is `sha256`) as a core module, from the cache when possible.
pub(crate) fn load_module(
    engine: &Engine,
    cache_dir: Option<&Path>,
    bytes: &[u8],
    sha256: &str,
) -> wasmtime::Result<Module> {
    let Some(dir) = cache_dir else {
        return Module::new(engine, bytes);
    };
    // SAFETY: as in `load`, with `precompile_module`.
    cached(
        &entry_path(engine, dir, sha256).with_extension("cwasm-module"),
        || engine.precompile_module(bytes),
        |code| unsafe { Module::deserialize(engine, code) },
    )
}

/// The code at `path` if its checksum holds and it deserializes, or else `compile`d afresh
/// and written there.
fn cached<T>(
    path: &Path,
    compile: impl FnOnce() -> wasmtime::Result<Vec<u8>>,
    deserialize: impl Fn(&[u8]) -> wasmtime::Result<T>,
) -> wasmtime::Result<T> {
    if let Ok(entry) = std::fs::read(path) {
        match verified(&entry) {
            Some(code) => match deserialize(code) {
                Ok(loaded) => return Ok(loaded),
                Err(error) => tracing::warn!("recompiling: cached code {} unusable: {error}", path.display()),
            },
            None => tracing::warn!("recompiling: cached code {} is damaged (checksum)", path.display()),
        }
    }
    let compiled = compile()?;
    let mut entry = Sha256::digest(&compiled).to_vec();
    entry.extend_from_slice(&compiled);
    if let Err(error) = write_atomically(path, &entry) {
        tracing::warn!("cannot cache compiled code in {}: {error}", path.display());
    }
    deserialize(&compiled)
}

/// The compiled code of a cache entry, if its checksum holds.
fn verified(entry: &[u8]) -> Option<&[u8]> {
    let (checksum, code) = entry.split_at_checked(32)?;
    (Sha256::digest(code).as_slice() == checksum).then_some(code)
}

fn entry_path(engine: &Engine, dir: &Path, sha256: &str) -> PathBuf {
    let mut settings = std::hash::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut settings);
    let key = Sha256::new()
        .chain_update(sha256.as_bytes())
        .chain_update(env!("CARGO_PKG_VERSION").as_bytes())
        .chain_update(wasmtime_version().as_bytes())
        .chain_update(settings.finish().to_le_bytes())
        .finalize();
    dir.join(format!("{}.cwasm", hex::encode(&key[..16])))
}

fn wasmtime_version() -> &'static str {
    // Pinned in the workspace manifest; part of the key so an upgrade never loads old code.
    "48.0.8"
}

/// Write to a temporary file in the same directory and rename, so that a crash never
/// leaves a half-written entry under the final name. The temporary name is unique per
/// call, not only per process: two threads compiling the same component at once (tests,
/// or a trainer loading one plugin for two tasks) must not write into one inode while
/// the other has already renamed it into place and is mapping it.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().expect("cache entries live in a directory");
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let result = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::write_atomically;

    #[test]
    fn concurrent_writers_of_one_entry_never_expose_a_partial_file() {
        // Threads of one process racing to write the same entry: whatever a reader finds
        // under the final name is always one writer's whole file.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("entry.cwasm");
        let bytes = vec![7u8; 8 << 20];
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..5 {
                        write_atomically(&path, &bytes).unwrap();
                        assert_eq!(std::fs::read(&path).unwrap().len(), bytes.len());
                    }
                });
            }
        });
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary files left");
    }
}
