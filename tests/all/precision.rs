//! Half-precision storage: bf16 matrices beside f32 activations compute exactly what their
//! rounded values do in f32, through the decoding kernels (few rows) and the widened product
//! (many rows).

use crate::families::{argmax, tiny};
use candle_core::{DType, Device, Tensor};
use std::collections::HashMap;
use wirl_engine::LoadOptions;
use wirl_engine::load::TensorSource;

/// Logits of `ids` in one pass, and `steps` greedy tokens after them one at a time (the
/// decoding path), with each step's logits.
fn prefill_and_decode(model: &wirl_engine::Model, ids: &[u32], steps: usize) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
    let tokens = Tensor::from_vec(ids.to_vec(), (1, ids.len()), &Device::Cpu).unwrap();
    let mut cache = model.new_cache();
    let prefill: Vec<Vec<f32>> =
        model.forward(&tokens, &[0], &mut cache, true).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
    let mut last = prefill.last().unwrap().clone();
    let mut decoded = Vec::new();
    for _ in 0..steps {
        let token = Tensor::from_vec(vec![argmax(&last)], (1, 1), &Device::Cpu).unwrap();
        last = model.forward(&token, &[0], &mut cache, false).unwrap().flatten_all().unwrap().to_vec1().unwrap();
        decoded.push(last.clone());
    }
    (prefill, decoded)
}

fn max_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs())).fold(0.0, f32::max)
}

#[test]
fn bf16_matrices_compute_what_their_rounded_values_do_in_f32() {
    let (dir, _) = tiny("qwen3");
    let half = LoadOptions { matrix_dtype: Some(DType::BF16), ..Default::default() };
    let half = wirl_engine::load(dir.path(), &half).unwrap();
    let full = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();

    // The same model in f32 with every matrix of a linear layer rounded to bf16 (the tied
    // head untied, so that the embedding lookup keeps its f32 values as the bf16 load does).
    let (mut config, _, tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
    assert!(config.tie_word_embeddings);
    let rounded = |t: &Tensor| t.to_dtype(DType::BF16).unwrap().to_dtype(DType::F32).unwrap();
    let mut tensors: HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(name, t)| {
            let t = if name.starts_with("model.layers.") && name.ends_with("_proj.weight") { rounded(&t) } else { t };
            (name, t)
        })
        .collect();
    tensors.insert("lm_head.weight".into(), rounded(&tensors["model.embed_tokens.weight"]));
    config.tie_word_embeddings = false;
    let reference = wirl_engine::Model::load(&config, &mut TensorSource::new(&tensors), &Device::Cpu).unwrap();

    // 40 positions in one pass: more rows than the decoding kernels take (the matrices are
    // widened for the product); then one row per step (the kernels read bf16).
    let ids: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 64).collect();
    let (half_prefill, half_decoded) = prefill_and_decode(&half.model, &ids, 12);
    let (reference_prefill, reference_decoded) = prefill_and_decode(&reference, &ids, 12);
    let (full_prefill, _) = prefill_and_decode(&full.model, &ids, 12);
    let prefill_difference = max_difference(&half_prefill, &reference_prefill);
    let decode_difference = max_difference(&half_decoded, &reference_decoded);
    assert!(prefill_difference < 1e-4, "prefill: bf16 matrices vs their values in f32: {prefill_difference}");
    assert!(decode_difference < 1e-4, "decoding: bf16 matrices vs their values in f32: {decode_difference}");
    // And the rounding is there: the f32 model's logits differ (else the test proves nothing).
    let rounding = max_difference(&half_prefill, &full_prefill);
    assert!(rounding > 1e-4, "bf16 matrices gave f32's logits exactly ({rounding}): were they loaded in bf16?");
}

/// The base's projection matrices in bf16 (what `lora.base_dtype = "bf16"` keeps), and the
/// same values widened back to f32.
fn bf16_and_rounded(
    config: &wirl_engine::Config,
    tensors: &HashMap<String, Tensor>,
) -> (HashMap<String, Tensor>, HashMap<String, Tensor>) {
    let projection = |name: &str| config.family().is_projection_weight(name);
    let half: HashMap<String, Tensor> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), if projection(n) { t.to_dtype(DType::BF16).unwrap() } else { t.clone() }))
        .collect();
    let rounded = half.iter().map(|(n, t)| (n.clone(), t.to_dtype(DType::F32).unwrap())).collect();
    (half, rounded)
}

/// A LoRA policy over a bf16 base: the trainer computes what an f32 base of the same values
/// does (log-probs, and adapter gradients through the whole graph and layer by layer), the
/// engine samples from the same values (its log-probs are the trainer's), and the KL
/// reference is that bf16 base, sharing its storage.
#[test]
fn a_bf16_lora_base_trains_and_samples_its_rounded_values() {
    let (_dir, config, tensors, adapter, _) = crate::lora::adapted();
    let (half, rounded) = bf16_and_rounded(&config, &tensors);
    let device = Device::Cpu;
    let on_half = wirl_grpo::Policy::with_adapter(&config, half.clone(), &adapter, &device).unwrap();
    let on_rounded = wirl_grpo::Policy::with_adapter(&config, rounded.clone(), &adapter, &device).unwrap();
    let on_f32 = wirl_grpo::Policy::with_adapter(&config, tensors, &adapter, &device).unwrap();

    let prompt: Vec<u32> = vec![2, 17, 33, 5, 9, 40, 41];
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17], vec![5, 6], vec![44, 1, 8]];
    let logp = |net: &wirl_grpo::Net| -> Vec<f32> {
        net.completion_stats(&prompt, &completions).unwrap().logp.flatten_all().unwrap().to_vec1().unwrap()
    };
    let worst = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    let (half_logp, rounded_logp) = (logp(on_half.net()), logp(on_rounded.net()));
    assert!(worst(&half_logp, &rounded_logp) < 1e-5, "{half_logp:?} vs {rounded_logp:?}");
    assert!(worst(&half_logp, &logp(on_f32.net())) > 1e-6, "bf16 rounding changed nothing: was it bf16?");

    // Adapter gradients: the same as over the f32 base of the same values, on both paths.
    let loss_of = crate::hardening::mixed_loss;
    let layered = wirl_grpo::MemoryLimits { recompute_above: 0, keep_layers: 0, head_chunk: 64 };
    for limits in [wirl_grpo::MemoryLimits::WHOLE, layered] {
        let gradients = |policy: &wirl_grpo::Policy| {
            let mut grads = wirl_grpo::Gradients::new();
            policy.loss_and_grads(&prompt, &completions, &limits, &mut grads, loss_of).unwrap();
            policy.vars().iter().map(|(n, v)| (n.clone(), grads.tensor(v).unwrap().unwrap())).collect::<Vec<_>>()
        };
        for ((name, got), (_, want)) in gradients(&on_half).iter().zip(gradients(&on_rounded).iter()) {
            let difference = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let size = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-3);
            assert!(difference / size < 1e-4, "{limits:?} {name}: {difference} of {size}");
        }
    }

    // The sampler reads the trainer's bf16 storage and computes its log-probs.
    let engine = crate::lora::engine_model(&config, &half, &adapter);
    let ids: Vec<u32> = prompt.iter().chain(&completions[0]).copied().collect();
    let tokens = Tensor::from_vec(ids.clone(), (1, ids.len()), &device).unwrap();
    let logits: Vec<Vec<f32>> =
        engine.forward(&tokens, &[0], &mut engine.new_cache(), true).unwrap().squeeze(0).unwrap().to_vec2().unwrap();
    let log_softmax = |row: &[f32], token: u32| {
        let max = row.iter().copied().fold(f32::MIN, f32::max);
        row[token as usize] - max - row.iter().map(|v| (v - max).exp()).sum::<f32>().ln()
    };
    let sampled: Vec<f32> = completions[0]
        .iter()
        .enumerate()
        .map(|(t, &token)| log_softmax(&logits[prompt.len() + t - 1], token))
        .collect();
    assert!(worst(&sampled, &half_logp[..4]) < 1e-4, "engine {sampled:?} vs trainer {:?}", &half_logp[..4]);

    // The reference: the bf16 base itself.
    let reference = on_half.reference(&device).unwrap();
    let up = "model.layers.0.mlp.up_proj.weight";
    assert_eq!(reference.weights()[up].dtype(), DType::BF16);
    let stored = |net: &wirl_grpo::Net| {
        let (storage, _) = net.weights()[up].storage_and_layout();
        std::ptr::from_ref(&*storage) as usize
    };
    assert_eq!(stored(&reference), stored(on_half.net()), "the reference shares the base's storage");
}

/// `wirl train` with `lora.base_dtype = "bf16"` (a KL term on: its reference is the bf16
/// base) trains its adapters and checkpoints them; another dtype is refused naming the key.
#[test]
fn a_lora_run_on_a_bf16_base_trains() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.05);
    let text = std::fs::read_to_string(&config).unwrap().replace("beta = 0.0", "beta = 0.04");
    std::fs::write(&config, format!("{text}\n[lora]\nrank = 4\nalpha = 8\nbase_dtype = \"bf16\"\n")).unwrap();
    let run = dir.path().join("run");
    let out = crate::grpo::train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metrics = crate::grpo::metrics(&run);
    assert_eq!(metrics.len(), 2);
    assert!(metrics.iter().all(|m| m["loss"].as_f64().is_some_and(f64::is_finite)), "{metrics:?}");
    assert!(metrics[1]["kl"].as_f64().unwrap() > 0.0, "the adapters moved the policy off the base: {metrics:?}");
    assert!(run.join("checkpoints/step-000002/adapter/adapter_model.safetensors").is_file());

    for (value, expected) in [("\"f16\"", "unknown variant `f16`, expected `f32` or `bf16`"), ("16", "base_dtype")] {
        std::fs::write(&config, format!("{text}\n[lora]\nbase_dtype = {value}\n")).unwrap();
        let out = crate::grpo::train(&config, &dir.path().join("refused"));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(expected), "{value}: expected {expected:?}: {said}");
        assert!(said.contains("train.toml"), "{value}: names the file: {said}");
    }
}

/// `wirl generate --dtype bf16` runs a model with bf16 matrices; a dtype it does not offer
/// is refused naming the ones it does.
#[test]
fn generate_takes_bf16_weights_and_refuses_other_dtypes() {
    let (dir, _) = tiny("qwen3");
    let generate = |dtype: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["generate", "--max-tokens", "4", "--temperature", "0", "--prompt", "w2", "--dtype", dtype])
            .arg("--model")
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = generate("bf16");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = generate("f16");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("f32") && said.contains("bf16"), "{said}");
}

/// A trainer's bf16 inference copy (`TensorSource::copied_as`, a GPU's default): the engine
/// keeps its own weights, and after an update the learner refreshes them inside the barrier
/// to the new f32 weights rounded — the copy's logits are a fresh bf16 load's of the updated
/// weights, exactly; without the refresh they would still be the old ones. Frozen weights
/// and a tied table asked for twice are copied once and never refreshed.
#[test]
fn a_bf16_inference_copy_follows_the_trainers_updates() {
    let (_dir, config, tensors) = crate::hardening::tiny_weights();
    let policy = wirl_grpo::Policy::new(&config, &tensors, &Device::Cpu).unwrap();
    let names: Vec<String> = policy.vars().iter().map(|(name, _)| name.clone()).collect();
    let frozen = names[0].clone(); // one weight the mirror is told is not trained
    let mut source = TensorSource::new(policy.shared_tensors()).copied_as(DType::BF16);
    let copy = wirl_engine::Model::load(&config, &mut source, &Device::Cpu).unwrap();
    assert_eq!(copy.dtype(), DType::BF16);
    assert!(copy.fused_projections() > 0, "the copy is the model's own: q/k/v and gate/up fused");
    let mirror = source.mirror(|name| name != frozen && names.iter().any(|n| n == name));
    let var_bytes: u64 =
        policy.vars().iter().filter(|(n, _)| *n != frozen).map(|(_, v)| v.elem_count() as u64 * 2).sum();
    assert_eq!(mirror.bytes(), var_bytes, "each trained weight copied once, in bf16");

    let ids: Vec<u32> = (0..12).map(|i| (i * 5 + 2) % 60).collect();
    let logits = |model: &wirl_engine::Model| -> Vec<Vec<f32>> {
        let tokens = Tensor::from_vec(ids.clone(), (1, ids.len()), &Device::Cpu).unwrap();
        let out = model.forward(&tokens, &[0], &mut model.new_cache(), true).unwrap();
        out.squeeze(0).unwrap().to_dtype(DType::F32).unwrap().to_vec2().unwrap()
    };
    let fresh = |tensors: &HashMap<String, Tensor>| {
        let mut source = TensorSource::new(tensors).copied_as(DType::BF16);
        wirl_engine::Model::load(&config, &mut source, &Device::Cpu).unwrap()
    };
    let before = logits(&copy);
    assert_eq!(max_difference(&before, &logits(&fresh(policy.shared_tensors()))), 0.0);

    let vars: Vec<_> = policy.vars().iter().map(|(_, v)| v.clone()).collect();
    let optimizer = wirl_grpo::optim::Optimizer::new(vars, 0.0).unwrap();
    let mut learner = wirl_grpo::Learner { mirror: Some(mirror), ..wirl_grpo::Learner::new(policy, None, optimizer) };
    let group = wirl_grpo::GroupBatch {
        prompt: ids.clone(),
        completions: vec![vec![3, 9, 27], vec![5, 6]],
        advantages: vec![1.0, -1.0],
        token_advantages: Vec::new(),
        trainable: Vec::new(),
        sampler_logprobs: Vec::new(),
        sampler_lag: 0,
    };
    let settings = wirl_grpo::UpdateSettings { learning_rate: 0.05, ..crate::hardening::tiny_update_settings() };
    learner.update(&[group], &settings, None, &|| false, &mut |_, _| {}).unwrap().unwrap();

    // The frozen weight keeps its first copy: the expected model has its old value.
    let mut updated = learner.policy.shared_tensors().clone();
    updated.insert(frozen.clone(), tensors[&frozen].clone());
    let after = logits(&copy);
    assert!(max_difference(&after, &before) > 1e-3, "the copy did not change with the update");
    assert_eq!(max_difference(&after, &logits(&fresh(&updated))), 0.0, "the copy is the updated weights, rounded");
}

/// `model.inference_dtype`: a run whose sampler keeps a bf16 copy (a GPU's default) trains on
/// the CPU too (every step's loss finite); a dtype it cannot keep is refused by key before
/// any run directory is made.
#[test]
fn a_run_with_a_bf16_sampler_copy_trains_and_bad_dtypes_are_refused() {
    refused_or_trains("model.inference_dtype", "f8", "bf16");
}

/// A run with `key` set to `bad` is refused naming the key and the value, before any run
/// directory is made; with `good` it trains two steps, every loss finite.
fn refused_or_trains(key: &str, bad: &str, good: &str) {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.01);
    let train = |run: &str, value: &str| {
        let set = format!("{key}={value}");
        crate::grpo::train_with(&config, &dir.path().join(run), &["--eval-tasks", "0", "--set", &set])
    };
    let out = train("bad", bad);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains(&format!("`{key}` = \"{bad}\"")) && said.contains("bf16"), "{said}");
    assert!(!dir.path().join("bad").exists());
    let out = train("good", good);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let steps = crate::grpo::metrics(&dir.path().join("good"));
    assert_eq!(steps.len(), 2);
    assert!(steps.iter().all(|s| s["loss"].as_f64().is_some_and(f64::is_finite)), "{steps:?}");
}

/// Mixed precision (`model.train_dtype = "bf16"`): the products' operands rounded to bf16,
/// everything else f32. On the CPU's path and on the composed ops a GPU runs, log-probs and
/// gradients stay within bf16's rounding of f32's (the bounds below are ~4-5× what this
/// tiny model measured: 0.012 and 0.011), yet differ from them — the products ran in bf16.
#[test]
fn bf16_products_stay_within_bf16_rounding_of_f32() {
    let (_dir, config, tensors) = crate::hardening::tiny_weights();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 % 60 + 2) as u32).collect();
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17], vec![5, 6], vec![44, 1, 8]];
    for fast in [true, false] {
        let policy = |dtype: DType| {
            let mut policy = wirl_grpo::Policy::new(&config, &tensors, &Device::Cpu).unwrap();
            policy.set_fast_paths(fast);
            policy.set_compute_dtype(dtype);
            policy
        };
        let (full, mixed) = (policy(DType::F32), policy(DType::BF16));
        let logp = |p: &wirl_grpo::Policy| -> Vec<Vec<f32>> {
            p.net().completion_stats(&prompt, &completions).unwrap().logp.to_vec2().unwrap()
        };
        let gap = max_difference(&logp(&full), &logp(&mixed));
        assert!(gap > 1e-5 && gap < LOGP_BOUND, "fast paths {fast}: log-prob gap {gap}");
        let grads = |p: &wirl_grpo::Policy| {
            let mut grads = wirl_grpo::Gradients::new();
            let limits = wirl_grpo::MemoryLimits::WHOLE;
            let (loss, _) =
                p.loss_and_grads(&prompt, &completions, &limits, &mut grads, crate::hardening::mixed_loss).unwrap();
            (loss, grads)
        };
        let ((full_loss, full_grads), (mixed_loss, mixed_grads)) = (grads(&full), grads(&mixed));
        assert!((full_loss - mixed_loss).abs() < LOGP_BOUND * 10.0, "{full_loss} vs {mixed_loss}");
        let mut worst = 0f32;
        for ((name, a), (_, b)) in full.vars().iter().zip(mixed.vars()) {
            let a = full_grads.tensor(a).unwrap().unwrap_or_else(|| panic!("no gradient for {name}"));
            let b = mixed_grads.tensor(b).unwrap().unwrap_or_else(|| panic!("no gradient for {name}"));
            let difference = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let scale = a.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-3);
            worst = worst.max(difference / scale);
        }
        eprintln!("fast paths {fast}: log-prob gap {gap}, largest relative gradient gap {worst}");
        assert!(worst > 1e-5 && worst < GRAD_BOUND, "fast paths {fast}: largest relative gradient gap {worst}");
    }
}

/// The largest log-prob difference bf16 products may make on the tiny model.
const LOGP_BOUND: f32 = 0.05;
/// The largest gradient difference, relative to the weight's largest gradient.
const GRAD_BOUND: f32 = 0.05;

/// `model.train_dtype = "bf16"` trains end to end; another dtype is refused by key.
#[test]
fn a_run_with_bf16_products_trains_and_bad_dtypes_are_refused() {
    refused_or_trains("model.train_dtype", "f16", "bf16");
}

/// A model loaded from its files keeps q/k/v and gate/up as one matrix each (one product
/// where there were three and two); it computes what the same weights kept apart compute —
/// the trainer's shared tensors are never fused — bit for bit, with and without biases,
/// prefilling 40 positions (the general product) and decoding one at a time (the CPU's
/// kernels); the bf16 copy's fused rows follow the trainer's updates (the test above).
#[test]
fn fused_projections_compute_what_the_projections_apart_do() {
    let (qwen3, _) = tiny("qwen3");
    let (gemma3, _) = tiny("gemma3");
    let qwen2 = tempfile::tempdir().unwrap(); // q/k/v biases
    crate::engine::write_tiny_model(qwen2.path(), true);
    crate::engine::write_tiny_tokenizer(qwen2.path());
    for (family, dir) in [("qwen3", &qwen3), ("gemma3", &gemma3), ("qwen2", &qwen2)] {
        let fused = wirl_engine::load(dir.path(), &LoadOptions::default()).unwrap();
        let (config, _, tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
        let apart = wirl_engine::Model::load(&config, &mut TensorSource::new(&tensors), &Device::Cpu).unwrap();
        assert!(fused.model.fused_projections() > 0 && apart.fused_projections() == 0, "{family}");
        let ids: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 64).collect();
        let (fused_prefill, fused_decoded) = prefill_and_decode(&fused.model, &ids, 12);
        let (apart_prefill, apart_decoded) = prefill_and_decode(&apart, &ids, 12);
        assert_eq!(max_difference(&fused_prefill, &apart_prefill), 0.0, "{family}: prefill");
        assert_eq!(max_difference(&fused_decoded, &apart_decoded), 0.0, "{family}: decoding");
    }
}
