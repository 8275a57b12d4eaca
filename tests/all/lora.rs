//! LoRA adapters against PEFT: the tiny Qwen3 of `tests/fixtures/tiny-qwen3/` with an adapter
//! PEFT made and saved (`scripts/reference/tiny_lora.py` → `tests/fixtures/tiny-qwen3-lora/`).
//! wirl reads PEFT's directory; the engine (base + adapter, unmerged) gives PEFT's logits and
//! greedy continuations, the trainer its log-probs; the adapters' gradients are the full
//! weights' gradients projected; the KL reference is the base; what wirl writes reads back
//! and merges into a plain model that computes the same; hostile adapters are refused by name.

use crate::families::{Reference, matches_reference, tiny, trains_reference};
use candle_core::{Device, Tensor};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use wirl_engine::LoadOptions;
use wirl_engine::load::TensorSource;
use wirl_engine::lora::{self, Adapter};

fn fixture() -> PathBuf {
    fixture_of("qwen3")
}

/// PEFT's adapter on the tiny model of `family` (`tests/fixtures/tiny-{family}-lora`).
fn fixture_of(family: &str) -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(format!("tiny-{family}-lora"))
}

type Adapted = (tempfile::TempDir, wirl_engine::Config, HashMap<String, Tensor>, Adapter, Reference);

/// The tiny Qwen3's config and tensors, PEFT's adapter on it, and PEFT's reference values.
pub(crate) fn adapted() -> Adapted {
    adapted_family("qwen3")
}

/// [`adapted`] for the tiny model of `family`.
fn adapted_family(family: &str) -> Adapted {
    let (dir, _) = tiny(family);
    let (config, _, tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
    let fixture = fixture_of(family);
    let adapter = lora::read(&fixture, &config).unwrap();
    let reference = serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap()).unwrap();
    (dir, config, tensors, adapter, reference)
}

/// The engine's model over `tensors` with `adapter` applied beside them.
pub(crate) fn engine_model(
    config: &wirl_engine::Config,
    tensors: &HashMap<String, Tensor>,
    adapter: &Adapter,
) -> wirl_engine::Model {
    let mut all = tensors.clone();
    all.extend(adapter.tensors.clone());
    let mut source = TensorSource::new(&all).with_lora_scale(Some(adapter.spec.scale()));
    wirl_engine::Model::load(config, &mut source, &Device::Cpu).unwrap()
}

#[test]
fn a_peft_adapter_gives_pefts_logits_unmerged_in_the_engine_and_the_trainer() {
    let (_dir, config, tensors, adapter, reference) = adapted();
    assert_eq!((adapter.spec.rank, adapter.spec.alpha, adapter.spec.target_modules.len()), (4, 8.0, 7));
    matches_reference(&engine_model(&config, &tensors, &adapter), &reference, "qwen3 + LoRA");
    let policy = wirl_grpo::Policy::with_adapter(&config, tensors, &adapter, &Device::Cpu).unwrap();
    trains_reference(policy.net(), &reference, "qwen3 + LoRA");
    // Only the adapters train: 7 projections × 2 layers × (A, B).
    assert_eq!(policy.vars().len(), 28);
    assert!(policy.vars().iter().all(|(name, _)| name.contains(".lora_")));
}

/// PEFT's adapter on Phi-3's fused matrices (one A and B for all of q, k and v; one for gate
/// and up): the engine and the trainer give PEFT's logits, only the adapters train, and what
/// wirl writes reads back and merges into a plain Phi-3 that computes the same.
#[test]
fn a_peft_adapter_on_phi3s_fused_projections_gives_pefts_logits_and_merges() {
    let (_dir, config, tensors, adapter, reference) = adapted_family("phi3");
    assert_eq!(adapter.spec.target_modules.len(), 4);
    assert!(adapter.tensors.contains_key(&lora::a_name("model.layers.0.self_attn.qkv_proj")));
    matches_reference(&engine_model(&config, &tensors, &adapter), &reference, "phi3 + LoRA");
    let policy = wirl_grpo::Policy::with_adapter(&config, tensors.clone(), &adapter, &Device::Cpu).unwrap();
    trains_reference(policy.net(), &reference, "phi3 + LoRA");
    // 4 projections × 2 layers × (A, B).
    assert_eq!(policy.vars().len(), 16);
    // Llama's names adapt nothing on Phi-3: refused naming the module, not trained silently.
    let spec = lora::LoraSpec { target_modules: vec!["qkv_proj".into(), "q_proj".into()], ..adapter.spec.clone() };
    let error = Adapter::init(&spec, &config, 0, &Device::Cpu).expect_err("refused").to_string();
    assert!(error.contains("\"q_proj\", which Phi-3 (phi3) does not have") && error.contains("qkv_proj"), "{error}");
    let every = lora::LoraSpec { target_modules: lora::targets().into_iter().map(String::from).collect(), ..spec };
    let adapter_of_every = Adapter::init(&every, &config, 0, &Device::Cpu).unwrap();
    assert_eq!(adapter_of_every.tensors.len(), 16, "the default list: every projection Phi-3 has");

    let out = tempfile::tempdir().unwrap();
    lora::write(&out.path().join("adapter"), &adapter, "tiny-phi3").unwrap();
    let again = lora::read(&out.path().join("adapter"), &config).unwrap();
    assert_eq!(again.spec, adapter.spec);
    let mut merged = tensors;
    lora::merge(&mut merged, &adapter, &config).unwrap();
    let model = wirl_engine::Model::load(&config, &mut TensorSource::new(&merged), &Device::Cpu).unwrap();
    matches_reference(&model, &reference, "phi3, adapter merged");
}

/// With `W' = W + s·B·A`, the adapters' gradients are the full weight's projected:
/// `dA = s·Bᵀ·dW'` and `dB = s·dW'·Aᵀ` — through the whole graph, the layer-by-layer backward
/// and the fused head, whose frozen weights take no gradient.
#[test]
fn adapter_gradients_are_the_full_weights_gradients_projected() {
    let (_dir, config, tensors, adapter, _) = adapted();
    let mut merged = tensors.clone();
    lora::merge(&mut merged, &adapter, &config).unwrap();
    let full = wirl_grpo::Policy::new(&config, &merged, &Device::Cpu).unwrap();
    let policy = wirl_grpo::Policy::with_adapter(&config, tensors, &adapter, &Device::Cpu).unwrap();
    let prompt: Vec<u32> = vec![2, 17, 33, 5, 9, 40, 41];
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17], vec![5, 6], vec![44, 1, 8]];
    let loss_of = crate::hardening::mixed_loss;
    let mut full_grads = wirl_grpo::Gradients::new();
    let limits = wirl_grpo::MemoryLimits::WHOLE;
    let (full_loss, _) = full.loss_and_grads(&prompt, &completions, &limits, &mut full_grads, loss_of).unwrap();
    let full_grad = |name: &str| {
        let (_, var) = full.vars().iter().find(|(n, _)| n == name).unwrap();
        full_grads.tensor(var).unwrap().unwrap()
    };
    let scale = adapter.spec.scale();
    let layered = wirl_grpo::MemoryLimits { recompute_above: 0, keep_layers: 0, head_chunk: 64 };
    for limits in [wirl_grpo::MemoryLimits::WHOLE, layered] {
        let mut grads = wirl_grpo::Gradients::new();
        let (loss, _) = policy.loss_and_grads(&prompt, &completions, &limits, &mut grads, loss_of).unwrap();
        assert!((loss - full_loss).abs() < 1e-4, "{loss} vs {full_loss}");
        let mut worst = 0f32;
        for (module, _, _) in adapter.spec.modules(&config) {
            let pair = adapter.pair(&module).unwrap();
            let dw = full_grad(&format!("{module}.weight"));
            let expected_a = (pair.b.t().unwrap().matmul(&dw).unwrap() * scale).unwrap();
            let expected_b = (dw.matmul(&pair.a.t().unwrap()).unwrap() * scale).unwrap();
            for (name, expected) in [(lora::a_name(&module), expected_a), (lora::b_name(&module), expected_b)] {
                let (_, var) = policy.vars().iter().find(|(n, _)| *n == name).unwrap();
                let got = grads.tensor(var).unwrap().unwrap_or_else(|| panic!("no gradient for {name}"));
                let difference =
                    (&got - &expected).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                let size = expected.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-3);
                worst = worst.max(difference / size);
            }
        }
        assert!(worst < 1e-3, "{limits:?}: largest relative difference {worst}");
    }
}

/// The KL reference of a LoRA policy is the base with the adapters off: the base's own
/// log-probs, from the same storage (no second copy of the weights).
#[test]
fn the_reference_of_a_lora_policy_is_the_base() {
    let (_dir, config, tensors, adapter, _) = adapted();
    let base = wirl_grpo::Policy::new(&config, &tensors, &Device::Cpu).unwrap();
    let policy = wirl_grpo::Policy::with_adapter(&config, tensors.clone(), &adapter, &Device::Cpu).unwrap();
    let reference = policy.reference(&Device::Cpu).unwrap();
    let (prompt, completions) = (vec![2, 17, 33], vec![vec![5u32, 9, 40]]);
    let logp = |net: &wirl_grpo::Net| -> Vec<f32> {
        net.completion_stats(&prompt, &completions).unwrap().logp.flatten_all().unwrap().to_vec1().unwrap()
    };
    assert_eq!(logp(&reference), logp(base.net()));
    assert_ne!(logp(policy.net()), logp(base.net()), "the adapter changes the policy");
    let stored = |net: &wirl_grpo::Net| {
        let (storage, _) = net.weights()["model.layers.0.mlp.up_proj.weight"].storage_and_layout();
        std::ptr::from_ref(&*storage) as usize
    };
    assert_eq!(stored(&reference), stored(policy.net()), "the reference shares the base's storage");
}

/// What wirl writes, wirl reads back the same; merged into the base, it makes a plain model
/// that computes what base + adapter does.
#[test]
fn a_written_adapter_reads_back_and_merges_into_an_equal_model() {
    let (_dir, config, tensors, adapter, reference) = adapted();
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("adapter");
    lora::write(&dir, &adapter, "tiny-qwen3").unwrap();
    let again = lora::read(&dir, &config).unwrap();
    assert_eq!(again.spec, adapter.spec);
    for (name, tensor) in &adapter.tensors {
        let read: Vec<f32> = again.tensors[name].flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(read, tensor.flatten_all().unwrap().to_vec1::<f32>().unwrap(), "{name}");
    }
    let error = lora::write(&dir, &adapter, "tiny-qwen3").unwrap_err().to_string();
    assert!(error.contains("already exists"), "{error}");
    let mut merged = tensors.clone();
    lora::merge(&mut merged, &adapter, &config).unwrap();
    let mut source = TensorSource::new(&merged);
    let model = wirl_engine::Model::load(&config, &mut source, &Device::Cpu).unwrap();
    matches_reference(&model, &reference, "qwen3, adapter merged");
}

/// A copy of the fixture's adapter in a temporary directory, its config edited by `edit`.
fn edited(edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(fixture().join(lora::WEIGHTS_FILE), dir.path().join(lora::WEIGHTS_FILE)).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join(lora::CONFIG_FILE)).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.path().join(lora::CONFIG_FILE), config.to_string()).unwrap();
    dir
}

/// Adapters wirl cannot apply as their writer meant are refused naming what is wrong,
/// never half-applied.
#[test]
fn hostile_or_unsupported_adapters_are_refused_by_name() {
    let (_dir, config, _, adapter, _) = adapted();
    let refused = |dir: &Path| lora::read(dir, &config).unwrap_err().to_string();
    type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
    let cases: Vec<(Edit, &str)> = vec![
        (Box::new(|c| c["use_dora"] = true.into()), "use_dora"),
        (Box::new(|c| c["use_rslora"] = true.into()), "use_rslora"),
        (Box::new(|c| c["lora_bias"] = true.into()), "lora_bias"),
        (Box::new(|c| c["target_modules"] = ".*proj".into()), "pattern"),
        (Box::new(|c| c["target_modules"] = serde_json::json!(["q_proj", "lm_head"])), "lm_head"),
        (Box::new(|c| c["peft_type"] = "IA3".into()), "IA3"),
        (Box::new(|c| c["r"] = 8.into()), "shape"),
        (Box::new(|c| c["r"] = 0.into()), "rank 0"),
        (Box::new(|c| c["r"] = u64::MAX.into()), "rank"),
        (Box::new(|c| c["lora_alpha"] = (-1.0).into()), "alpha"),
        (Box::new(|c| c["layers_to_transform"] = serde_json::json!([0])), "layers_to_transform"),
        (Box::new(|c| c["r"] = "four".into()), "adapter_config.json"),
    ];
    for (edit, expected) in cases {
        let dir = edited(edit);
        let error = refused(dir.path());
        assert!(error.contains(expected), "expected {expected:?}: {error}");
    }
    // Fewer targets named than stored: the extra tensors are refused, not ignored.
    let dir = edited(|c| c["target_modules"] = serde_json::json!(["q_proj", "v_proj"]));
    assert!(refused(dir.path()).contains("is not one of the adapter's"));
    // An adapter for a model with other shapes.
    let mut other = config.clone();
    other.hidden_size = 64;
    let error = lora::read(&fixture(), &other).unwrap_err().to_string();
    assert!(error.contains("another model"), "{error}");
    // NaN in a matrix, a file that is not safetensors, a directory with no config.
    let dir = tempfile::tempdir().unwrap();
    let mut poisoned = adapter.clone();
    let name = lora::b_name("model.layers.1.mlp.down_proj");
    poisoned.tensors.insert(name.clone(), (poisoned.tensors[&name].clone() * f64::NAN).unwrap());
    lora::write(&dir.path().join("nan"), &poisoned, "base").unwrap();
    assert!(refused(&dir.path().join("nan")).contains("NaN"));
    let dir = edited(|_| {});
    std::fs::write(dir.path().join(lora::WEIGHTS_FILE), b"not safetensors").unwrap();
    assert!(refused(dir.path()).contains(lora::WEIGHTS_FILE));
    let empty = tempfile::tempdir().unwrap();
    assert!(refused(empty.path()).contains("a PEFT adapter directory has one"));
}

/// `wirl train` with `[lora]` (and a KL term, whose reference is the base): only the
/// adapters train, checkpoints are PEFT adapter directories, a run stopped and resumed
/// gives the same records as one that was not, `wirl model merge` writes a plain model from
/// the base and a checkpoint, and a resume that does not match the checkpoint is refused.
#[test]
fn a_lora_run_trains_checkpoints_resumes_and_merges() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.05);
    let text = std::fs::read_to_string(&config).unwrap().replace("beta = 0.0", "beta = 0.04");
    std::fs::write(
        &config,
        format!("{text}\n[lora]\nrank = 4\nalpha = 8\ntarget_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]\n"),
    )
    .unwrap();
    let wirl = || std::process::Command::new(env!("CARGO_BIN_EXE_wirl"));
    let whole = dir.path().join("whole");
    let out = crate::grpo::train(&config, &whole);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metrics = crate::grpo::metrics(&whole);
    assert_eq!(metrics.len(), 2);
    assert!(metrics.iter().all(|m| m["loss"].as_f64().is_some_and(f64::is_finite)), "{metrics:?}");
    assert!(metrics[1]["kl"].as_f64().unwrap() > 0.0, "the adapters moved the policy off the base: {metrics:?}");
    let checkpoint = whole.join("checkpoints/step-000002");
    assert!(!checkpoint.join("model").exists(), "a LoRA checkpoint holds no copy of the base");
    let model_dir = dir.path().join("model");
    let (base_config, _, base) = wirl_engine::load::load_tensors(&model_dir, &LoadOptions::default()).unwrap();
    let adapter = lora::read(&checkpoint.join("adapter"), &base_config).unwrap();
    assert_eq!(adapter.spec.target_modules, ["q_proj", "v_proj", "down_proj"]);
    let b = &adapter.tensors[&lora::b_name("model.layers.0.self_attn.q_proj")];
    assert!(b.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap() > 0.0, "B left zero: nothing trained");

    // Stopped after step 1, resumed to 2: the same samples and numbers.
    let parts = dir.path().join("parts");
    let first = wirl().arg("train").arg(&config).args(["--steps", "1", "--run-dir"]).arg(&parts).output().unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let resumed = wirl().args(["train", "--steps", "2", "--resume"]).arg(&parts).output().unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let read = |run: &Path, name: &str| std::fs::read_to_string(run.join(name)).unwrap();
    assert_eq!(read(&whole, "rollouts.jsonl"), read(&parts, "rollouts.jsonl"));
    let losses = |run: &Path| crate::grpo::metrics(run).iter().map(|m| m["loss"].clone()).collect::<Vec<_>>();
    assert_eq!(losses(&whole), losses(&parts));

    // Merged: a plain HF directory whose adapted weights moved and whose others did not.
    let merged = dir.path().join("merged");
    let out =
        wirl().args(["model", "merge"]).arg(&model_dir).arg(checkpoint.join("adapter")).arg(&merged).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (_, _, merged_tensors) = wirl_engine::load::load_tensors(&merged, &LoadOptions::default()).unwrap();
    let moved = |name: &str| {
        let difference = (&merged_tensors[name] - &base[name]).unwrap().abs().unwrap().max_all().unwrap();
        difference.to_scalar::<f32>().unwrap() > 0.0
    };
    assert!(moved("model.layers.0.self_attn.q_proj.weight") && moved("model.layers.1.mlp.down_proj.weight"));
    assert!(!moved("model.layers.0.self_attn.k_proj.weight") && !moved("model.embed_tokens.weight"));
    adapter_flags_run_the_merged_model(&config, &model_dir, &checkpoint.join("adapter"), &merged);

    // A resume whose [lora] is not the checkpoint's, or that has none, is refused by name.
    let resolved = parts.join("config.resolved.toml");
    let changed = std::fs::read_to_string(&resolved).unwrap();
    for (edit, expected) in [
        (changed.replace("rank = 4", "rank = 8"), "not the config's [lora]"),
        (changed[..changed.find("[lora]").unwrap()].to_string(), "holds LoRA adapters"),
    ] {
        std::fs::write(&resolved, edit).unwrap();
        let out = wirl().args(["train", "--steps", "3", "--resume"]).arg(&parts).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(expected), "expected {expected:?}: {said}");
    }
}

/// `--adapter` on `wirl generate`, `wirl eval` and `wirl serve`: base + adapter merged as it
/// loads computes as the merged model does (the same greedy text, on one rank and on two
/// tensor-parallel ones, the same evaluation, the same served answer); an adapter that is
/// not one, one of another model, or one asked to go into quantized weights is refused by
/// name.
fn adapter_flags_run_the_merged_model(config: &Path, base: &Path, adapter: &Path, merged: &Path) {
    let wirl = || std::process::Command::new(env!("CARGO_BIN_EXE_wirl"));
    let generate = |model: &Path, extra: &[&str]| {
        let out = wirl()
            .args(["generate", "--prompt", "1 + 1 =", "--temperature", "0", "--max-tokens", "8", "--model"])
            .arg(model)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let adapted = ["--adapter", adapter.to_str().unwrap()];
    let expected = generate(merged, &[]);
    assert!(!expected.trim().is_empty());
    assert_eq!(generate(base, &adapted), expected);
    assert_eq!(generate(merged, &["--tp", "2"]), generate(base, &[&adapted[..], &["--tp", "2"]].concat()));
    assert_ne!(generate(base, &[]), expected, "the adapter changed nothing the test can see");

    let eval = |model: &Path, extra: &[&str], output: &Path| {
        let out = wirl()
            .arg("eval")
            .arg(config)
            .args(["--tasks", "3", "--model"])
            .arg(model)
            .args(extra)
            .arg("--output")
            .arg(output)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        (summary, std::fs::read_to_string(output).unwrap())
    };
    let dir = merged.parent().unwrap();
    let (plain, plain_lines) = eval(merged, &[], &dir.join("merged.jsonl"));
    let (with, with_lines) = eval(base, &adapted, &dir.join("adapted.jsonl"));
    assert_eq!((plain["greedy_pass_rate"].clone(), plain_lines), (with["greedy_pass_rate"].clone(), with_lines));
    assert_eq!(with["adapter"].as_str(), adapter.to_str(), "{with}");

    let answer = |server: crate::serve::Server| {
        let body = r#"{"model": "m", "prompt": "1 + 1 =", "max_tokens": 8, "temperature": 0}"#;
        let (status, answer) = server.post("/v1/completions", body);
        assert_eq!(status, 200, "{answer}");
        answer["choices"][0]["text"].clone()
    };
    let served = answer(crate::serve::Server::start_model(base, &[&adapted[..], &["--name", "m"]].concat()));
    assert_eq!(served, answer(crate::serve::Server::start_model(merged, &["--name", "m"])));

    let refused = |extra: &[&str], expected: &str| {
        let out = wirl().args(["generate", "--prompt", "x", "--model"]).arg(base).args(extra).output().unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(expected), "{extra:?}: expected {expected:?} in {said}");
    };
    refused(&["--adapter", base.to_str().unwrap()], "adapter_config.json (a PEFT adapter directory has one)");
    refused(&[&adapted[..], &["--quantized"]].concat(), "merged into dense weights");
    let other = fixture_of("phi3");
    refused(
        &["--adapter", other.to_str().unwrap()],
        "target_modules has \"qkv_proj\", which Llama (llama) does not have",
    );
}

/// `[lora]` keys out of range are errors naming the key and the file.
#[test]
fn lora_config_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 1, 0.01);
    let text = std::fs::read_to_string(&config).unwrap();
    for (section, expected) in [
        ("rank = 0", "rank 0 is out of range"),
        ("rank = 100000", "rank 100000 is out of range"),
        ("alpha = nan", "alpha NaN"),
        ("alpha = -2.0", "alpha -2"),
        ("dropout = 0.1", "`lora.dropout` = 0.1"),
        ("target_modules = [\"lm_head\"]", "\"lm_head\""),
        ("target_modules = []", "target_modules is empty"),
        ("target_modules = [\"q_proj\", \"q_proj\"]", "twice"),
        ("ranks = 4", "unknown field `ranks`"),
    ] {
        std::fs::write(&config, format!("{text}\n[lora]\n{section}\n")).unwrap();
        let out = crate::grpo::train(&config, &dir.path().join("run"));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(expected), "{section}: expected {expected:?}: {said}");
        assert!(said.contains("train.toml"), "{section}: names the file: {said}");
    }
}

/// `wirl model merge` refuses, naming what is wrong and writing nothing: an adapter for
/// another model, a directory that is not an adapter, a damaged weights file, an output
/// directory that exists (left as it was). A merge that fails leaves no directory behind.
#[test]
fn model_merge_refuses_bad_inputs_and_writes_nothing() {
    let (dir, _) = tiny("qwen3");
    let merge = |adapter: &Path, out: &Path| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["model", "merge"])
            .arg(dir.path())
            .arg(adapter)
            .arg(out)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let scratch = tempfile::tempdir().unwrap();
    let out = scratch.path().join("merged");
    // Another model's adapter: its shapes do not fit.
    let other = edited(|c| c["r"] = 8.into());
    let empty = tempfile::tempdir().unwrap();
    let damaged = edited(|_| {});
    std::fs::write(damaged.path().join(lora::WEIGHTS_FILE), &b"\x08\0\0\0\0\0\0\0{}"[..]).unwrap();
    for (adapter, expected) in [
        (other.path(), "shape"),
        (empty.path(), lora::CONFIG_FILE),
        (damaged.path(), lora::WEIGHTS_FILE),
        (&scratch.path().join("missing"), lora::CONFIG_FILE),
    ] {
        let (ok, said) = merge(adapter, &out);
        assert!(!ok && said.contains(expected), "expected {expected:?}: {said}");
        assert!(!out.exists(), "a failed merge left {}", out.display());
        let partial = std::fs::read_dir(scratch.path()).unwrap().count();
        assert_eq!(partial, 0, "a failed merge left a partial directory");
    }
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep"), "mine").unwrap();
    let (ok, said) = merge(&fixture(), &out);
    assert!(!ok && said.contains("already exists"), "{said}");
    assert_eq!(std::fs::read_to_string(out.join("keep")).unwrap(), "mine");
}
