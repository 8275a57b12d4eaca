//! The run manifest: the task set in force (tasks, weights, sources, rewards, plugin configs
//! and limits) and every plugin it names by the sha256 of its bytes, which are kept in the
//! run directory (`plugins/SHA256.wasm`), so that a run never depends on files the user
//! rebuilds later. Each change of the task set is a new generation, written to
//! `manifests/GENERATION.json` with the step it took effect at; checkpoints record the
//! generation in force, and `--resume` replays the later ones at their steps.

use crate::config::{RunConfig, TaskSet, TaskSpec};
use crate::error::{Context, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use wirl_rollout::dataset::FileFingerprint;
use wirl_rollout::{RewardSource, SourceSpec};

/// The largest plugin file kept (the sandbox loads none larger).
const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// One generation of a run's task set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// 0 at the start of the run, one more for each applied change or rollback.
    pub generation: u64,
    /// Steps done when it took effect: it produced steps `from_step + 1` on.
    pub from_step: usize,
    /// Why it came: `start`, `apply`, `watch`, `rollback`, `auto-rollback`.
    pub reason: String,
    pub tasks: TaskSet,
    /// Every plugin the task set names (its path as written, or `builtin:NAME`) → the sha256
    /// of the bytes in force, kept in the run directory.
    pub plugins: BTreeMap<String, String>,
    /// Every file of the datasets the task set reads → its size and sha256 when the
    /// generation began. Datasets are read where they are (not kept: they may be large), so
    /// a resumed run checks them against this (empty in runs from before it was recorded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub datasets: BTreeMap<String, FileFingerprint>,
    /// Every file of the models the task set reads besides the policy (reward models,
    /// `judge_model` paths) → its size and sha256 when the generation began: a model is its
    /// bytes as much as a plugin is, so rollouts name it through the manifest, and a resumed
    /// run refuses one that changed (empty in runs from before it was recorded).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, FileFingerprint>,
}

impl Manifest {
    /// A generation of `tasks` whose plugins are read now (files or built-ins) and kept in
    /// `store`.
    pub fn keep(
        generation: u64,
        from_step: usize,
        reason: &str,
        tasks: TaskSet,
        store: &PluginStore,
    ) -> crate::error::Result<Self> {
        let mut plugins = BTreeMap::new();
        for reference in references(&tasks) {
            let sha256 = store.keep(&reference)?;
            plugins.insert(reference.display().to_string(), sha256);
        }
        let datasets = fingerprint_datasets(&tasks)?;
        let models = fingerprint_models(&tasks)?;
        Ok(Manifest { generation, from_step, reason: reason.to_string(), tasks, plugins, datasets, models })
    }

    /// Refuse to go on from this generation if a dataset or model file it read changed
    /// since: a resumed run would draw other rows under the indices it trained on (and read
    /// them at offsets that no longer hold them), or be rewarded by another model.
    pub fn check_inputs(&self) -> crate::error::Result<()> {
        let datasets =
            self.datasets.iter().map(|entry| (entry, "dataset", "draw other rows under the indices it trained on"));
        let models = self.models.iter().map(|entry| (entry, "model", "be scored or judged by another model"));
        for ((file, then), what, otherwise) in datasets.chain(models) {
            let path = Path::new(file);
            let now = wirl_rollout::dataset::fingerprint(path).with_context(|| {
                format!(
                    "{file}: a {what} file of manifest generation {} cannot be read; restore it to resume the run",
                    self.generation
                )
            })?;
            let Some(now) = now.get(path) else { continue };
            if now != then {
                bail!(
                    "{file}: changed since the run read it (manifest generation {}: {} bytes, sha256 {}; now {} bytes, \
                     sha256 {}): resumed, the run would {otherwise}. Restore the file, or start a new run from the \
                     checkpoint's weights (`model.path = RUN_DIR/checkpoints/step-N/model`)",
                    self.generation,
                    then.bytes,
                    then.sha256,
                    now.bytes,
                    now.sha256
                );
            }
        }
        Ok(())
    }

    /// The sha256 in force for the plugin named `reference`.
    pub fn sha256_of(&self, reference: &Path) -> Option<&str> {
        self.plugins.get(&reference.display().to_string()).map(String::as_str)
    }

    /// Point every plugin of `run`'s tasks at its kept bytes.
    pub fn pin(&self, run: &mut RunConfig, store: &PluginStore) -> crate::error::Result<()> {
        for task in &mut run.tasks {
            for (reference, stored) in plugin_slots(task) {
                let sha256 = self.sha256_of(reference).with_context(|| {
                    format!("the manifest (generation {}) has no sha256 for {}", self.generation, reference.display())
                })?;
                let path = store.path(sha256);
                if !path.is_file() {
                    bail!(
                        "{}: the bytes of {} (sha256 {sha256}) are missing from the run directory",
                        path.display(),
                        reference.display()
                    );
                }
                store.verify(sha256).with_context(|| {
                    format!("the kept bytes of {} (manifest generation {})", reference.display(), self.generation)
                })?;
                *stored = Some(path);
            }
        }
        Ok(())
    }

    /// Write `manifests/GENERATION.json` (atomically).
    pub fn write(&self, run_dir: &Path) -> crate::error::Result<()> {
        let dir = run_dir.join("manifests");
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join(format!("{:06}.json", self.generation));
        write_atomically(&path, (serde_json::to_string_pretty(self)? + "\n").as_bytes())
    }
}

/// Every generation written in `run_dir`, oldest first.
pub fn history(run_dir: &Path) -> crate::error::Result<Vec<Manifest>> {
    let dir = run_dir.join("manifests");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(Vec::new());
    };
    let mut manifests = Vec::new();
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let manifest: Manifest =
            serde_json::from_str(&text).with_context(|| format!("{}: not a run manifest", path.display()))?;
        manifests.push(manifest);
    }
    manifests.sort_by_key(|m| m.generation);
    Ok(manifests)
}

/// Plugin files and built-ins named by a task set, each once, in order.
pub fn references(tasks: &TaskSet) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = Vec::new();
    let rewards = |rewards: &[crate::config::RewardSection], all: &mut Vec<PathBuf>| {
        // Reward models are directories of weights, not plugins: not kept by sha256.
        for reward in rewards {
            all.extend(reward.plugin.clone());
            all.extend(reward.code_runner.as_ref().map(|r| r.plugin.clone()));
        }
    };
    for task in &tasks.tasks {
        all.extend(task.environment.as_ref().map(|e| e.plugin.clone()));
        all.extend(task.agent.as_ref().map(|a| a.plugin.clone()));
        rewards(&task.rewards, &mut all);
    }
    rewards(&tasks.rewards, &mut all);
    let mut seen = std::collections::BTreeSet::new();
    all.retain(|path| seen.insert(path.clone()));
    all
}

/// Every file of every dataset `tasks` reads (training and held-out), fingerprinted now.
pub fn fingerprint_datasets(tasks: &TaskSet) -> crate::error::Result<BTreeMap<String, FileFingerprint>> {
    let mut prints = BTreeMap::new();
    for dataset in tasks.tasks.iter().filter_map(|task| task.dataset.as_ref()) {
        for path in dataset.train.iter().chain(&dataset.eval) {
            for (file, print) in wirl_rollout::dataset::fingerprint(path)? {
                prints.insert(file.display().to_string(), print);
            }
        }
    }
    Ok(prints)
}

/// Every file of the models the task set reads besides the policy: each reward model's and
/// each `judge_model` path's (a directory's weights, config and tokenizer files; a GGUF
/// file), by size and sha256.
pub fn fingerprint_models(tasks: &TaskSet) -> crate::error::Result<BTreeMap<String, FileFingerprint>> {
    let rewards = tasks.rewards.iter().chain(tasks.tasks.iter().flat_map(|task| task.rewards.iter()));
    let mut prints = BTreeMap::new();
    for reward in rewards {
        let judge =
            reward.judge_model.as_ref().filter(|p| !crate::config::JUDGE_WORDS.iter().any(|w| p.as_os_str() == *w));
        for model in reward.model.iter().chain(judge) {
            for file in model_files(model)? {
                for (file, print) in wirl_rollout::dataset::fingerprint(&file)? {
                    prints.insert(file.display().to_string(), print);
                }
            }
        }
    }
    Ok(prints)
}

/// The files a model at `path` is read from: a file itself, or a directory's `*.json`,
/// `*.safetensors` and `*.gguf` (weights, config, tokenizer), sorted.
fn model_files(path: &Path) -> crate::error::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let entries = std::fs::read_dir(path).with_context(|| format!("reading the model directory {}", path.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let file = entry.with_context(|| format!("reading the model directory {}", path.display()))?.path();
        let read =
            file.extension().and_then(|e| e.to_str()).is_some_and(|e| ["json", "safetensors", "gguf"].contains(&e));
        if read && file.is_file() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// Each plugin of a task: its reference and where its kept bytes are.
fn plugin_slots(task: &mut TaskSpec) -> Vec<(&Path, &mut Option<PathBuf>)> {
    let mut slots = Vec::new();
    match &mut task.source {
        SourceSpec::Environment { plugin, .. } | SourceSpec::Agent { plugin, .. } => {
            slots.push((plugin.path.as_path(), &mut plugin.stored));
        }
        SourceSpec::Dataset { .. } | SourceSpec::Remote(_) | SourceSpec::OpenEnv { .. } => {}
    }
    for reward in &mut task.rewards {
        if let RewardSource::Plugin { plugin, code_runner, .. } = &mut reward.source {
            slots.push((plugin.path.as_path(), &mut plugin.stored));
            if let Some(runner) = code_runner {
                slots.push((runner.path.as_path(), &mut runner.stored));
            }
        }
    }
    slots
}

/// `RUN_DIR/plugins`: plugin bytes by sha256.
#[derive(Clone, Debug)]
pub struct PluginStore {
    dir: PathBuf,
}

impl PluginStore {
    pub fn new(run_dir: &Path) -> Self {
        PluginStore { dir: run_dir.join("plugins") }
    }

    /// Where the bytes of `sha256` are kept.
    pub fn path(&self, sha256: &str) -> PathBuf {
        self.dir.join(format!("{sha256}.wasm"))
    }

    /// Check that the kept file of `sha256` still holds those bytes: never run bytes that
    /// changed after the run kept them (a tampered or damaged `RUN_DIR/plugins/` file).
    pub fn verify(&self, sha256: &str) -> crate::error::Result<()> {
        let path = self.path(sha256);
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let actual = hex::encode(Sha256::digest(&bytes));
        if actual != sha256 {
            bail!(
                "{}: its bytes hash to sha256 {actual}, not the {sha256} its name and the manifest say; they changed \
                 after the run kept them, and are not run. Restore the file from a copy of the run, or start a new run",
                path.display()
            );
        }
        Ok(())
    }

    /// The bytes of a plugin reference (a file, or a built-in) as they are now.
    pub fn read(reference: &Path) -> crate::error::Result<Vec<u8>> {
        if let Some(builtin) = wirl_builtins::lookup(reference)? {
            return Ok(builtin.bytes.to_vec());
        }
        let metadata =
            std::fs::metadata(reference).with_context(|| format!("cannot read plugin {}", reference.display()))?;
        if !metadata.is_file() {
            bail!("{}: not a regular file; a plugin is a .wasm component file", reference.display());
        }
        if metadata.len() > MAX_PLUGIN_BYTES {
            bail!("{}: {} MiB, more than the largest plugin wirl loads", reference.display(), metadata.len() >> 20);
        }
        std::fs::read(reference).with_context(|| format!("cannot read plugin {}", reference.display()))
    }

    /// Keep the bytes of `reference` as they are now; their sha256.
    pub fn keep(&self, reference: &Path) -> crate::error::Result<String> {
        self.put(&Self::read(reference)?)
    }

    /// Keep `bytes`; their sha256.
    pub fn put(&self, bytes: &[u8]) -> crate::error::Result<String> {
        let sha256 = hex::encode(Sha256::digest(bytes));
        let path = self.path(&sha256);
        if !path.is_file() {
            std::fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))?;
            write_atomically(&path, bytes)?;
        }
        Ok(sha256)
    }
}

/// Write through a temporary file and a rename, so a reader (or a kill) never sees half a file.
fn write_atomically(path: &Path, bytes: &[u8]) -> crate::error::Result<()> {
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&temporary, bytes).with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, path).with_context(|| format!("writing {}", path.display()))
}
