//! Model families beyond Llama against Hugging Face transformers: a tiny random-weight model
//! of each, built, saved and run by transformers in float32 (`scripts/reference/
//! tiny_families.py`, with the peers' virtual environment), in `tests/fixtures/tiny-<family>/`
//! with its `reference.json`. wirl loads the directory as transformers saved it: its logits
//! within 1e-4, its greedy continuations (through the decoding path, with a cache) equal,
//! and the trainer's forward gives the log-probs the engine samples with.

use candle_core::{Device, Tensor};
use serde::Deserialize;
use std::path::Path;
use wirl_engine::LoadOptions;

#[derive(Deserialize)]
pub(crate) struct Reference {
    pub logits: Vec<LogitsCase>,
    pub greedy: Vec<GreedyCase>,
}

#[derive(Deserialize)]
pub(crate) struct LogitsCase {
    pub ids: Vec<u32>,
    /// `[position][vocabulary]`.
    pub values: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
pub(crate) struct GreedyCase {
    pub prompt: Vec<u32>,
    pub continuation: Vec<u32>,
}

/// The family's fixture model in a temporary directory, with the tests' tokenizer beside it.
pub(crate) fn tiny(family: &str) -> (tempfile::TempDir, Reference) {
    fixture_model(&format!("tiny-{family}"))
}

/// The model of `tests/fixtures/NAME/` (as transformers saved it) in a temporary directory,
/// with the tests' tokenizer beside it, and its `reference.json`.
pub(crate) fn fixture_model<R: serde::de::DeserializeOwned>(name: &str) -> (tempfile::TempDir, R) {
    let fixture = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures")).join(name);
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(file), dir.path().join(file)).unwrap();
    }
    crate::engine::write_tiny_tokenizer(dir.path());
    let reference = serde_json::from_str(&std::fs::read_to_string(fixture.join("reference.json")).unwrap()).unwrap();
    (dir, reference)
}

pub(crate) fn argmax(row: &[f32]) -> u32 {
    row.iter().enumerate().fold((0, f32::MIN), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0 as u32
}

/// Logits and greedy continuations of the family's model equal transformers'.
fn matches_transformers(family: &str) {
    let (dir, reference) = tiny(family);
    let loaded = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
    matches_reference(&loaded.model, &reference, family);
}

/// `model`'s logits are within 1e-4 of the reference's, its greedy continuations equal.
pub(crate) fn matches_reference(model: &wirl_engine::Model, reference: &Reference, family: &str) {
    let mut worst = 0f32;
    for case in &reference.logits {
        let tokens = Tensor::from_vec(case.ids.clone(), (1, case.ids.len()), &Device::Cpu).unwrap();
        let logits: Vec<Vec<f32>> =
            model.forward(&tokens, &[0], &mut model.new_cache(), true).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
        for (ours, theirs) in logits.iter().zip(&case.values) {
            assert_eq!(ours.len(), theirs.len());
            worst = ours.iter().zip(theirs).map(|(a, b)| (a - b).abs()).fold(worst, f32::max);
        }
    }
    assert!(worst < 1e-4, "{family}: max |wirl − transformers| logit = {worst}");
    for case in &reference.greedy {
        // The prompt in one pass, then a token at a time from the cache: the decoding path.
        let mut cache = model.new_cache();
        let prompt = Tensor::from_vec(case.prompt.clone(), (1, case.prompt.len()), &Device::Cpu).unwrap();
        let mut last: Vec<f32> =
            model.forward(&prompt, &[0], &mut cache, false).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        let mut continuation = Vec::new();
        while continuation.len() < case.continuation.len() {
            let next = argmax(&last);
            continuation.push(next);
            let token = Tensor::from_vec(vec![next], (1, 1), &Device::Cpu).unwrap();
            last = model.forward(&token, &[0], &mut cache, false).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        }
        assert_eq!(continuation, case.continuation, "{family}: greedy after {:?}", case.prompt);
    }
}

/// The trainer's forward (its own code, with gradients) gives the engine's log-probs.
fn trains_what_it_samples(family: &str) {
    let (dir, reference) = tiny(family);
    let (config, _, tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
    let device = Device::Cpu;
    let policy = wirl_grpo::Policy::new(&config, &tensors, &device).unwrap();
    trains_reference(policy.net(), &reference, family);
}

/// The trainer's log-probs of a completion are within 1e-4 of the reference's.
pub(crate) fn trains_reference(net: &wirl_grpo::Net, reference: &Reference, family: &str) {
    let case = &reference.logits[1];
    let (prompt, completion) = case.ids.split_at(3);
    let stats = net.completion_stats(prompt, &[completion.to_vec()]).unwrap();
    let logp: Vec<f32> = stats.logp.squeeze(0).unwrap().to_vec1().unwrap();
    // transformers' log-softmax at the position before each completion token.
    let mut worst = 0f32;
    for (t, &token) in completion.iter().enumerate() {
        let row = &case.values[prompt.len() + t - 1];
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        let log_sum = max + row.iter().map(|v| (v - max).exp()).sum::<f32>().ln();
        worst = worst.max((logp[t] - (row[token as usize] - log_sum)).abs());
    }
    assert!(worst < 1e-4, "{family}: max |trainer − transformers| log-prob = {worst}");
}

#[test]
fn qwen3_matches_transformers() {
    matches_transformers("qwen3");
}

#[test]
fn qwen3_trains_what_it_samples() {
    trains_what_it_samples("qwen3");
}

/// Phi-3 stacks q, k and v in one matrix (`qkv_proj`) and gate and up in another
/// (`gate_up_proj`): its one declaration (`host/model/src/family/phi3.rs`) is all the engine,
/// the trainer, LoRA and export read.
#[test]
fn phi3_matches_transformers() {
    matches_transformers("phi3");
}

#[test]
fn phi3_trains_what_it_samples() {
    trains_what_it_samples("phi3");
}

/// What wirl writes as a checkpoint of a Phi-3 (its weights under the family's own names)
/// loads back as the same model; a rope over part of each head (Phi-4-mini's
/// `partial_rotary_factor`) is refused by name instead of run wrong.
#[test]
fn a_phi3_writes_back_under_its_own_names_and_a_partial_rope_is_refused() {
    let (dir, reference) = tiny("phi3");
    let (config, tokenizer, tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
    assert!(tensors.contains_key("model.layers.1.self_attn.qkv_proj.weight"));
    let split = |name: &str| name.ends_with(".self_attn.q_proj.weight") || name.ends_with(".mlp.up_proj.weight");
    assert!(!tensors.keys().any(|name| split(name)), "no split names");
    let out = tempfile::tempdir().unwrap();
    let written = out.path().join("phi3");
    wirl_engine::export::write_hf_dir(&written, &config, &tokenizer, &tensors).unwrap();
    let loaded = wirl_engine::load(&written, &LoadOptions::default()).unwrap();
    matches_reference(&loaded.model, &reference, "phi3, written back");
    // transformers' Phi-3 defaults pad_token_id to 32000, outside this vocabulary, and then
    // refuses to load: the config's own is written back.
    let written_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(written.join("config.json")).unwrap()).unwrap();
    assert_eq!(written_config["pad_token_id"], 0);
    // Whatever a config writes there loads and goes back out as written (never read).
    let text = std::fs::read_to_string(written.join("config.json")).unwrap();
    std::fs::write(written.join("config.json"), text.replace("\"pad_token_id\": 0", "\"pad_token_id\": -1")).unwrap();
    let config = wirl_engine::load::read_config(&written).unwrap();
    assert_eq!(config.pad_token_id, Some(serde_json::json!(-1)));

    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    assert!(text.contains("\"partial_rotary_factor\": 1.0"), "the fixture says it: {text}");
    std::fs::write(
        dir.path().join("config.json"),
        text.replace("\"partial_rotary_factor\": 1.0", "\"partial_rotary_factor\": 0.75"),
    )
    .unwrap();
    let error = wirl_engine::load(dir.path(), &LoadOptions::default()).err().expect("refused").to_string();
    assert!(error.contains("partial_rotary_factor is 0.75"), "{error}");
}

/// A fused projection's rows are q, k and v one after another: each tensor-parallel rank
/// takes its share of every part (not a slice of the stacked rows), and two ranks give the
/// whole Phi-3's logits through prefill and a cached decoding step.
#[test]
fn phi3s_fused_projections_split_over_tensor_parallel_ranks() {
    let (dir, _) = tiny("phi3");
    crate::engine::two_ranks_give_the_whole_models_logits(dir.path(), &[2, 17, 33, 5, 9, 40]);
}

/// `wirl model inspect` on `path`: `(succeeded, stdout, stderr)`.
fn inspect(path: &Path) -> (bool, String, String) {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).args(["model", "inspect"]).arg(path).output().unwrap();
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// `wirl model inspect` reads a family from its config alone: the parameters it counts are
/// those the file holds, and an unsupported family is refused naming it and the list.
#[test]
fn inspect_counts_a_families_parameters_and_refuses_an_unknown_one() {
    let (dir, _) = tiny("qwen3");
    let tensors = candle_core::safetensors::load(dir.path().join("model.safetensors"), &Device::Cpu).unwrap();
    let stored: usize = tensors.values().map(|t| t.elem_count()).sum();
    let (ok, said, error) = inspect(dir.path());
    assert!(ok, "{error}");
    assert!(said.contains("family        Qwen3 (qwen3)") && said.contains("per-head q/k norms"), "{said}");
    assert!(said.contains(&format!("parameters    {stored} ")), "the file holds {stored}: {said}");
    let config = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(dir.path().join("config.json"), config.replace("\"qwen3\"", "\"gemma2\"")).unwrap();
    let (ok, _, said) = inspect(dir.path());
    assert!(
        !ok && said.contains("\"gemma2\" is not supported")
            && said.contains("llama, qwen2, qwen3, mistral, gemma3_text"),
        "{said}"
    );
}

/// Hostile inputs to `wirl model inspect`: a config that is not JSON, one with absurd sizes
/// (refused naming the field, not wrapped or panicking), a file that is not GGUF, a cut-off GGUF,
/// a path that does not exist. Each is a clear refusal or a bounded answer, never a crash.
#[test]
fn inspect_refuses_or_bounds_hostile_models() {
    let (dir, _) = tiny("qwen3");
    let config_path = dir.path().join("config.json");
    let config = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(&config_path, "{ not json").unwrap();
    let (ok, _, said) = inspect(dir.path());
    assert!(!ok && said.contains("config.json"), "{said}");
    let huge = config
        .replace("\"hidden_size\": 32", "\"hidden_size\": 18446744073709551615")
        .replace("\"vocab_size\": 64", "\"vocab_size\": 18446744073709551615");
    assert_ne!(huge, config, "the fixture's keys are where this test expects them");
    std::fs::write(&config_path, huge).unwrap();
    let (ok, said, error) = inspect(dir.path());
    assert!(!ok && error.contains("vocab_size") && error.contains("between 1 and"), "{said}{error}");
    let not_gguf = dir.path().join("model.gguf");
    std::fs::write(&not_gguf, b"GGUF\x03\x00\x00\x00 cut short").unwrap();
    let (ok, _, said) = inspect(&not_gguf);
    assert!(!ok && said.contains("not a GGUF file"), "{said}");
    std::fs::write(&not_gguf, b"plain text").unwrap();
    let (ok, _, said) = inspect(&not_gguf);
    assert!(!ok && said.contains("not a GGUF file"), "{said}");
    let (ok, _, said) = inspect(&dir.path().join("missing.gguf"));
    assert!(!ok && said.contains("no such file or directory"), "{said}");
}

#[test]
fn gemma3_matches_transformers() {
    matches_transformers("gemma3");
}

#[test]
fn gemma3_trains_what_it_samples() {
    trains_what_it_samples("gemma3");
}

/// The trainer's gradients of a family agree between the whole-graph backward (autograd
/// through every op, the head whole) and the layer-by-layer one with the fused head by
/// chunks (whose embedding gradient is added by hand): the hand-written paths know the
/// family's embedding scale and norms. Gemma 3's soft-capped head is never fused, so the
/// check runs without the cap as well.
fn gradients_agree(family: &str, edit: impl Fn(&mut wirl_engine::Config)) {
    let (dir, _) = tiny(family);
    let (mut config, _, tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
    edit(&mut config);
    let policy = wirl_grpo::Policy::new(&config, &tensors, &Device::Cpu).unwrap();
    let prompt: Vec<u32> = vec![2, 17, 33, 5, 9, 40, 41];
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17], vec![5, 6], vec![44, 1, 8]];
    let loss_of = crate::hardening::mixed_loss;
    let mut whole = wirl_grpo::Gradients::new();
    let (whole_loss, _) =
        policy.loss_and_grads(&prompt, &completions, &wirl_grpo::MemoryLimits::WHOLE, &mut whole, loss_of).unwrap();
    let limits = wirl_grpo::MemoryLimits { recompute_above: 0, keep_layers: 0, head_chunk: 64 * 4 * 3 };
    let mut layered = wirl_grpo::Gradients::new();
    let (layered_loss, _) = policy.loss_and_grads(&prompt, &completions, &limits, &mut layered, loss_of).unwrap();
    assert!((whole_loss - layered_loss).abs() < 1e-4, "{family}: {whole_loss} vs {layered_loss}");
    let mut worst = (0f32, String::new());
    for (name, var) in policy.vars() {
        let a = whole.tensor(var).unwrap().unwrap_or_else(|| panic!("{family}: no gradient for {name}"));
        let b = layered.tensor(var).unwrap().unwrap_or_else(|| panic!("{family}: no layered gradient for {name}"));
        let difference = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        let scale = a.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-3);
        if difference / scale > worst.0 {
            worst = (difference / scale, name.clone());
        }
    }
    assert!(worst.0 < 1e-3, "{family}: largest relative gradient difference {} ({})", worst.0, worst.1);
}

#[test]
fn gemma3_gradients_agree_across_the_backward_paths() {
    gradients_agree("gemma3", |_| {});
    gradients_agree("gemma3", |config| config.final_logit_softcapping = None);
    gradients_agree("qwen3", |_| {});
}

/// A gemma3 GGUF as llama.cpp writes one (its names, norms stored as 1 + w, no q/k
/// permutation; written from the same tiny model by the reference script) loads as the HF
/// directory does: the same logits. A GGUF does not store `query_pre_attn_scalar` (llama.cpp
/// scales by `head_dim^-1/2`), so the HF side is loaded with that value. Its SentencePiece
/// tokenizer comes from a tokenizer.json beside it; without one the error says so.
#[test]
fn a_gemma3_gguf_loads_as_its_hf_directory() {
    let (dir, reference) = tiny("gemma3");
    let fixture = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tiny-gemma3"));
    let lone = tempfile::tempdir().unwrap();
    let gguf = lone.path().join("model.gguf");
    std::fs::copy(fixture.join("model.gguf"), &gguf).unwrap();
    let error = wirl_engine::load(&gguf, &LoadOptions::default()).err().expect("no tokenizer yet").to_string();
    assert!(error.contains("tokenizer.json") && error.contains("beside the GGUF file"), "{error}");
    crate::engine::write_tiny_tokenizer(lone.path());
    let config = wirl_engine::load::read_config(&gguf).unwrap();
    assert_eq!((config.model_type.as_str(), config.window()), ("gemma3_text", Some(3)));
    assert!(config.layer_is_sliding(0) && !config.layer_is_sliding(1) && config.layer_is_sliding(2));
    assert_eq!(config.query_pre_attn_scalar, Some(16.0));
    let from_gguf = wirl_engine::load(&gguf, &LoadOptions::default()).unwrap().model;
    let text = std::fs::read_to_string(dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("config.json"),
        text.replace("\"query_pre_attn_scalar\": 24", "\"query_pre_attn_scalar\": 16"),
    )
    .unwrap();
    let from_hf = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap().model;
    let export = lone.path().join("exported");
    wirl_engine::export::gguf_to_hf_dir(&gguf, &export).unwrap();
    let exported_config = wirl_engine::load::read_config(&export).unwrap();
    assert_eq!((exported_config.model_type.as_str(), exported_config.window()), ("gemma3_text", Some(3)));
    // transformers refuses `16.0` here: an integer, as Gemma's own configs write it.
    let written: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(export.join("config.json")).unwrap()).unwrap();
    assert_eq!(written["query_pre_attn_scalar"].as_u64(), Some(16), "{written}");
    let exported = wirl_engine::load(&export, &LoadOptions::default()).unwrap().model;
    let mut worst = 0f32;
    for case in &reference.logits {
        let tokens = Tensor::from_vec(case.ids.clone(), (1, case.ids.len()), &Device::Cpu).unwrap();
        let logits = |model: &wirl_engine::Model| -> Vec<f32> {
            model
                .forward(&tokens, &[0], &mut model.new_cache(), true)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let (a, b) = (logits(&from_gguf), logits(&from_hf));
        worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
        // `wirl model export` of the GGUF: an HF directory that computes the same.
        let c = logits(&exported);
        worst = a.iter().zip(&c).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
    }
    assert!(worst < 1e-4, "max |GGUF − HF| logit = {worst}");
    // The trainer's tensors too (norms as w, not llama.cpp's 1 + w; every name the same).
    let (_, _, gguf_tensors) = wirl_engine::load::load_tensors(&gguf, &LoadOptions::default()).unwrap();
    let (_, _, hf_tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
    assert_eq!(gguf_tensors.len(), hf_tensors.len());
    for (name, hf) in &hf_tensors {
        let difference = (&gguf_tensors[name] - hf).unwrap().abs().unwrap().max_all().unwrap();
        let difference = difference.to_scalar::<f32>().unwrap();
        assert!(difference < 1e-6, "{name}: GGUF vs HF differ by {difference}");
    }
}
