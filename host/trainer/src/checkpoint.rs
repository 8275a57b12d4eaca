//! Checkpoints: `RUN_DIR/checkpoints/step-NNNNNN/` holds the policy as an HF directory
//! (`model/`, loadable by wirl and transformers), the optimizer's moments
//! (`optimizer.safetensors`) and `state.json` (step, optimizer steps, the held-out score
//! before training, plugin hashes), and `sha256.json`, the sha256 of every other file in it.
//! A checkpoint is written under a dot-name and renamed when complete, so a run killed
//! mid-write leaves nothing that `--resume` would load; `--resume` checks every file against
//! `sha256.json` and passes over a checkpoint whose bytes changed since (bit rot, a bad copy,
//! a hand edit) for the one before it.

use crate::error::{Context, bail};
use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use wirl_grpo::{Optimizer, Policy};

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    /// Steps completed.
    pub step: usize,
    pub optimizer_steps: usize,
    pub held_out_before: Option<f32>,
    /// Each task's held-out pass rate before training (absent in runs before `[[tasks]]`).
    #[serde(default)]
    pub held_out_before_by_task: std::collections::BTreeMap<String, f32>,
    /// `(name, sha256)` of the environment and reward plugins the run was trained with.
    pub plugins: Vec<(String, String)>,
    /// The run manifest's generation in force (`manifests/GENERATION.json`); absent in runs
    /// from before manifests.
    #[serde(default)]
    pub manifest_generation: Option<u64>,
    /// The weights version after this step (the engine's count of weight writes over the
    /// whole run), so that a resumed run's records go on counting; absent in older runs.
    #[serde(default)]
    pub weights_version: Option<u64>,
    /// The KL in the reward's β for the next step, where it adapts (`grpo.kl_target`).
    #[serde(default, skip_serializing_if = "Option::is_none", with = "exact")]
    pub reward_kl_coef: Option<f64>,
}

/// An f64 kept bit for bit: written as its shortest decimal text in a string, read back
/// with Rust's correctly rounded parser. serde_json's own number parser may land one unit
/// in the last place off, and a resumed run must go on from the very value it stopped at.
mod exact {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &Option<f64>, serializer: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(value) => serializer.serialize_str(&format!("{value:?}")),
            None => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<f64>, D::Error> {
        let Some(text) = Option::<String>::deserialize(deserializer)? else { return Ok(None) };
        match text.parse::<f64>() {
            Ok(value) if value.is_finite() && value >= 0.0 => Ok(Some(value)),
            _ => Err(serde::de::Error::custom(format!("{text:?} is not a finite number >= 0"))),
        }
    }
}

#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub dir: PathBuf,
    pub state: State,
}

impl Checkpoint {
    /// The policy as an HF directory (a run that trains every weight).
    pub fn model_dir(&self) -> PathBuf {
        self.dir.join("model")
    }

    /// The adapters as a PEFT directory (a LoRA run; the base is the run's model).
    pub fn adapter_dir(&self) -> PathBuf {
        self.dir.join(ADAPTER_DIR)
    }
}

/// Where a LoRA run's checkpoint keeps its adapters.
const ADAPTER_DIR: &str = "adapter";

/// The checkpoint's adapters, which must be those `lora` describes (a resumed run trains
/// what it trained before).
pub fn read_adapter(
    checkpoint: &Checkpoint,
    config: &wirl_engine::Config,
    lora: &crate::config::LoraSection,
) -> crate::error::Result<wirl_engine::lora::Adapter> {
    let dir = checkpoint.adapter_dir();
    if !dir.is_dir() {
        bail!(
            "{}: the checkpoint holds no LoRA adapters (a run that trained every weight), but the config has a \
             [lora] section; resume with the run's own config",
            checkpoint.dir.display()
        );
    }
    let adapter = wirl_engine::lora::read(&dir, config)?;
    let spec = lora.spec();
    if adapter.spec.rank != spec.rank
        || adapter.spec.alpha != spec.alpha
        || !same_members(&adapter.spec.target_modules, &spec.target_modules)
    {
        bail!(
            "{}: the checkpoint's adapters (rank {}, alpha {}, {}) are not the config's [lora] (rank {}, alpha {}, \
             {}); resume with the run's own config",
            dir.display(),
            adapter.spec.rank,
            adapter.spec.alpha,
            adapter.spec.target_modules.join(", "),
            spec.rank,
            spec.alpha,
            spec.target_modules.join(", ")
        );
    }
    Ok(adapter)
}

fn same_members(a: &[String], b: &[String]) -> bool {
    a.len() == b.len() && a.iter().all(|x| b.contains(x))
}

fn name(step: usize) -> String {
    format!("step-{step:06}")
}

/// Write the checkpoint of `step` atomically.
pub fn write(
    run_dir: &Path,
    state: &State,
    policy: &Policy,
    optimizer: &Optimizer,
    config: &wirl_engine::Config,
    tokenizer: &wirl_engine::Tokenizer,
    base_model: &str,
) -> crate::error::Result<PathBuf> {
    // A checkpoint is a promise of usable weights: never write NaN or infinity.
    for (name, var) in policy.vars() {
        if !wirl_engine::finite::all_finite(var.as_tensor())? {
            bail!("not writing the checkpoint of step {}: weight `{name}` holds NaN or infinite values", state.step);
        }
    }
    let root = run_dir.join("checkpoints");
    std::fs::create_dir_all(&root)?;
    let final_dir = root.join(name(state.step));
    let partial = root.join(format!(".{}.partial", name(state.step)));
    if partial.exists() {
        std::fs::remove_dir_all(&partial)?;
    }
    std::fs::create_dir_all(&partial)?;
    match policy.adapter() {
        // A LoRA run keeps only its adapters: the base is the run's model, unchanged.
        Some(adapter) => wirl_engine::lora::write(&partial.join(ADAPTER_DIR), &adapter, base_model)?,
        None => wirl_engine::export::write_hf_dir(&partial.join("model"), config, tokenizer, policy.shared_tensors())?,
    }
    let mut moments: HashMap<String, Tensor> = HashMap::new();
    for ((name, _), (m, v)) in policy.vars().iter().zip(optimizer.moments()) {
        moments.insert(format!("m/{name}"), m.clone());
        moments.insert(format!("v/{name}"), v.clone());
    }
    candle_core::safetensors::save(&moments, partial.join("optimizer.safetensors"))?;
    std::fs::write(partial.join("state.json"), serde_json::to_string_pretty(state)?)?;
    let sums = checksums(&partial)?;
    std::fs::write(partial.join(CHECKSUMS), serde_json::to_string_pretty(&sums)?)?;
    if final_dir.exists() {
        std::fs::remove_dir_all(&final_dir)?;
    }
    std::fs::rename(&partial, &final_dir)?;
    Ok(final_dir)
}

/// The file in a checkpoint naming the sha256 of every other file in it.
const CHECKSUMS: &str = "sha256.json";

/// Every file under `dir` (but [`CHECKSUMS`]), by its path relative to `dir`: its sha256.
fn checksums(dir: &Path) -> crate::error::Result<BTreeMap<String, String>> {
    let mut sums = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        for entry in std::fs::read_dir(&folder).with_context(|| format!("reading {}", folder.display()))? {
            let path = entry?.path();
            let kind = std::fs::symlink_metadata(&path)?.file_type();
            if kind.is_dir() {
                pending.push(path);
                continue;
            }
            let relative = path.strip_prefix(dir)?.to_string_lossy().replace('\\', "/");
            if relative == CHECKSUMS {
                continue;
            }
            if !kind.is_file() {
                bail!("{}: not a regular file (a checkpoint holds only files it wrote)", path.display());
            }
            sums.insert(relative, sha256_file(&path)?);
        }
    }
    Ok(sums)
}

fn sha256_file(path: &Path) -> crate::error::Result<String> {
    let mut file = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).with_context(|| format!("reading {}", path.display()))?;
    Ok(hex::encode(hasher.finalize()))
}

/// Check the files of the checkpoint in `dir` against its `sha256.json`: the same files,
/// the same bytes. A checkpoint from before checksums (no `sha256.json`) passes with a warning.
fn verify(dir: &Path) -> crate::error::Result<()> {
    let path = dir.join(CHECKSUMS);
    if !path.exists() {
        tracing::warn!("{}: no {CHECKSUMS} (written before checksums): its bytes are not verified", dir.display());
        return Ok(());
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let expected: BTreeMap<String, String> =
        serde_json::from_str(&text).with_context(|| format!("{} is not a list of sha256 sums", path.display()))?;
    let found = checksums(dir)?;
    for (file, sum) in &expected {
        match found.get(file) {
            None => bail!("{file} is missing (named in {CHECKSUMS})"),
            Some(actual) if actual != sum => {
                bail!("{file} changed since it was written: its sha256 is {actual}, {CHECKSUMS} says {sum}")
            }
            Some(_) => {}
        }
    }
    if let Some(extra) = found.keys().find(|f| !expected.contains_key(*f)) {
        bail!("{extra} was not written with the checkpoint (not in {CHECKSUMS})");
    }
    Ok(())
}

/// Delete all but the newest `keep` checkpoints up to `written` (the step just written; 0
/// for `keep`: keep all). Checkpoints of later steps (left by the run before a resume that
/// passed over them) are not counted and not touched, so the one just written is never the
/// one deleted. Only `step-N` directories are touched; a failure to delete is a warning.
pub fn prune(run_dir: &Path, keep: usize, written: usize) {
    if keep == 0 {
        return;
    }
    let mut steps = match step_dirs(&run_dir.join("checkpoints")) {
        Ok(steps) => steps,
        Err(error) => {
            tracing::warn!("cannot list the checkpoints to prune: {}", wirl_engine::error_chain(&error));
            return;
        }
    };
    steps.retain(|(step, _)| *step <= written);
    steps.sort();
    let old = steps.len().saturating_sub(keep);
    for (_, dir) in steps.into_iter().take(old) {
        if let Err(error) = std::fs::remove_dir_all(&dir) {
            tracing::warn!("cannot delete the old checkpoint {}: {error}", dir.display());
        }
    }
}

/// The `step-N` directories under `root`, with their steps.
fn step_dirs(root: &Path) -> crate::error::Result<Vec<(usize, PathBuf)>> {
    Ok(std::fs::read_dir(root)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse::<usize>().ok()?;
            Some((step, e.path()))
        })
        .collect())
}

/// The newest complete and valid checkpoint of a run, if any. One that is damaged (no or
/// unreadable `state.json`, a step that disagrees with its directory's name, no model or
/// moments, a file whose sha256 is not the one written) is passed over with a warning for
/// the one before it.
pub fn latest(run_dir: &Path) -> crate::error::Result<Option<Checkpoint>> {
    let root = run_dir.join("checkpoints");
    if !root.is_dir() {
        return Ok(None);
    }
    let mut steps = step_dirs(&root)?;
    steps.sort();
    while let Some((step, dir)) = steps.pop() {
        match validate(step, &dir) {
            Ok(state) => return Ok(Some(Checkpoint { dir, state })),
            Err(error) => {
                tracing::warn!("checkpoint {} passed over: {}", dir.display(), wirl_engine::error_chain(&error))
            }
        }
    }
    Ok(None)
}

/// The state of the checkpoint in `dir`, named for `step`, if everything it needs is there.
fn validate(step: usize, dir: &Path) -> crate::error::Result<State> {
    let state_path = dir.join("state.json");
    let text = std::fs::read_to_string(&state_path).with_context(|| format!("reading {}", state_path.display()))?;
    let state: State =
        serde_json::from_str(&text).with_context(|| format!("{} is not a checkpoint state", state_path.display()))?;
    if state.step != step {
        bail!("its state.json says step {}, its directory step {step}", state.step);
    }
    let adapter = dir.join(ADAPTER_DIR);
    let mut tensor_files = if adapter.join(wirl_engine::lora::CONFIG_FILE).is_file() {
        vec![format!("{ADAPTER_DIR}/{}", wirl_engine::lora::WEIGHTS_FILE)]
    } else if dir.join("model/config.json").is_file() {
        vec!["model/model.safetensors".to_string()]
    } else {
        bail!("model/config.json is missing (and it holds no LoRA adapters)");
    };
    if state.optimizer_steps > 0 {
        tensor_files.push("optimizer.safetensors".to_string());
    }
    for file in tensor_files {
        // Mapping checks the header and that every tensor lies inside the file (a truncated
        // write fails here); reading the values waits for the load.
        // SAFETY: the file is only read, and the run directory is the trainer's own.
        unsafe { candle_core::safetensors::MmapedSafetensors::new(dir.join(&file)) }
            .with_context(|| format!("{file} is missing or damaged"))?;
    }
    verify(dir)?;
    Ok(state)
}

/// Restore the optimizer's moments from `checkpoint`.
pub fn restore_optimizer(
    checkpoint: &Checkpoint,
    policy: &Policy,
    optimizer: &mut Optimizer,
) -> crate::error::Result<()> {
    if checkpoint.state.optimizer_steps == 0 {
        return Ok(()); // no update yet: no moments were saved
    }
    let path = checkpoint.dir.join("optimizer.safetensors");
    let mut saved = candle_core::safetensors::load(&path, &candle_core::Device::Cpu)
        .with_context(|| format!("reading {}", path.display()))?;
    let mut moments = Vec::new();
    for (name, _) in policy.vars() {
        let (Some(m), Some(v)) = (saved.remove(&format!("m/{name}")), saved.remove(&format!("v/{name}"))) else {
            bail!("{}: no moments for `{name}`", path.display());
        };
        moments.push((m, v));
    }
    optimizer.set_moments(moments, checkpoint.state.optimizer_steps)?;
    Ok(())
}

/// Keep only the lines of a JSONL file whose `step` is at most `step` (a resumed run
/// rewrites what came after its checkpoint).
pub fn truncate_jsonl(path: &Path, step: usize) -> crate::error::Result<()> {
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path)?;
    let kept: String = text
        .lines()
        .filter(|line| {
            serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["step"].as_u64())
                .is_some_and(|s| s as usize <= step)
        })
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(path, kept)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    /// The newest `keep` up to the step written stay; later (stale) ones are left alone.
    #[test]
    fn pruning_keeps_the_newest_up_to_the_step_written() {
        let run = tempfile::tempdir().unwrap();
        for step in 1..=5 {
            std::fs::create_dir_all(run.path().join(format!("checkpoints/{}", super::name(step)))).unwrap();
        }
        std::fs::create_dir_all(run.path().join("checkpoints/.step-000006.partial")).unwrap();
        super::prune(run.path(), 2, 3);
        let mut left: Vec<String> = std::fs::read_dir(run.path().join("checkpoints"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, [".step-000006.partial", "step-000002", "step-000003", "step-000004", "step-000005"]);
        super::prune(run.path(), 0, 5);
        assert_eq!(std::fs::read_dir(run.path().join("checkpoints")).unwrap().count(), 5, "0 keeps all");
    }

    /// The adaptive β comes back bit for bit, is absent where it does not adapt (older
    /// checkpoints read), and a hand-edited one that is no β is refused, not trained with.
    #[test]
    fn the_reward_kl_coefficient_is_kept_exactly() {
        let state = |coef: Option<f64>| super::State {
            step: 2,
            optimizer_steps: 2,
            held_out_before: None,
            held_out_before_by_task: Default::default(),
            plugins: Vec::new(),
            manifest_generation: None,
            weights_version: None,
            reward_kl_coef: coef,
        };
        // The first two are read an ulp off by serde_json's own number reader (0.495000…05
        // is the β the adaptive run's test reaches at step 3); then the extremes.
        for coef in [0.49500000000000005, 0.9047802727761427, 0.1 + 0.2, f64::MIN_POSITIVE, 5e-324, f64::MAX] {
            let text = serde_json::to_string(&state(Some(coef))).unwrap();
            let back: super::State = serde_json::from_str(&text).unwrap();
            assert_eq!(back.reward_kl_coef.map(f64::to_bits), Some(coef.to_bits()), "{text}");
        }
        let text = serde_json::to_string(&state(None)).unwrap();
        assert!(!text.contains("reward_kl_coef"), "{text}");
        assert_eq!(serde_json::from_str::<super::State>(&text).unwrap().reward_kl_coef, None);
        for bad in ["\"NaN\"", "\"-0.5\"", "\"inf\"", "\"x\"", "0.5"] {
            let text = text.replace("\"step\"", &format!("\"reward_kl_coef\":{bad},\"step\""));
            assert!(serde_json::from_str::<super::State>(&text).is_err(), "{text} was read");
        }
    }
}
