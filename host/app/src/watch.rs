//! `--watch`: a run's plugin files watched on disk; one rebuilt makes an apply of the same
//! task set, which reads the new bytes (checked, then switched in between steps).

use crate::notices::notice;
use std::path::Path;
use wirl_trainer::Control;

/// `--watch`: every second, compare each plugin file of the manifest in force with the
/// bytes the run keeps; a file that changed (and has not changed again for a second) makes
/// an apply of the same task set, which reads the new bytes. Each new content is tried once.
pub fn watch_plugins(control: Control) {
    let spawned = std::thread::Builder::new().name("wirl-watch".into()).spawn(move || {
        let mut tried: std::collections::BTreeMap<String, String> = Default::default();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
            if control.is_stopped() {
                return;
            }
            let Ok(status) = control.status() else { continue };
            let Some(manifest) = status.manifest else { continue };
            let mut changed = Vec::new();
            for (reference, sha256) in &manifest.plugins {
                let path = Path::new(reference);
                if wirl_builtins::is_builtin(path) {
                    continue;
                }
                let settled = std::fs::metadata(path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().is_ok_and(|age| age.as_secs_f64() >= 1.0));
                // Read as the apply reads it: a FIFO or a device put in a plugin's place is
                // not read (it would block this thread or never end); it counts as a change,
                // so the apply it makes is refused naming the file.
                let now = match wirl_trainer::manifest::PluginStore::read(path) {
                    Ok(bytes) => sha256_hex(&bytes),
                    Err(error) => format!("unreadable: {error}"),
                };
                if settled && &now != sha256 && tried.get(reference) != Some(&now) {
                    tried.insert(reference.clone(), now);
                    changed.push(reference.clone());
                }
            }
            if changed.is_empty() {
                continue;
            }
            let options = wirl_trainer::ApplyOptions {
                origin: format!("--watch ({} changed)", changed.join(", ")),
                reason: "watch".into(),
                ..Default::default()
            };
            match control.apply(manifest.tasks.clone(), &options) {
                Ok(report) => notice(&format!(
                    "watch: {} changed: staged as generation {} (checks failed {:.1}%), switched in at the next step",
                    changed.join(", "),
                    report.generation,
                    report.failure_rate * 100.0
                )),
                Err(refusal) => notice(&format!("watch: refused: {}", refusal.message)),
            }
        }
    });
    if let Err(error) = spawned {
        tracing::warn!("--watch: cannot start its thread ({error})");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}
