//! The device-generic step: with the CPU's hand-written ops switched off (`set_fast_paths`),
//! the trainer runs candle's composed ops — every one of which has a CUDA kernel — as it does
//! on a GPU. Here, on the CPU, that path's gradients and updates equal the fast path's.

use crate::hardening::tiny_weights;
use candle_core::Tensor;
use std::collections::HashMap;
use wirl_engine::Device;
use wirl_grpo::{Gradients, MemoryLimits, Policy};

/// Each variable's gradient of the mixed loss, both backward paths, fast or generic.
fn gradients(policy: &Policy, limits: &MemoryLimits, mut grads: Gradients) -> (f32, HashMap<String, Tensor>) {
    let prompt: Vec<u32> = vec![2, 17, 33, 5, 9, 40, 41];
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17], vec![5, 6], vec![44, 1, 8]];
    let (loss, _) =
        policy.loss_and_grads(&prompt, &completions, limits, &mut grads, crate::hardening::mixed_loss).unwrap();
    let by_name = policy.vars().iter().filter_map(|(n, v)| grads.tensor(v).unwrap().map(|g| (n.clone(), g))).collect();
    (loss, by_name)
}

/// The generic path's loss and every gradient within 1e-4 (relative to the gradient's
/// largest value) of the fast path's, through the whole graph and layer by layer; the
/// generic path's sums kept as tensors, as a GPU's are.
fn generic_equals_fast(what: &str, make: &dyn Fn() -> Policy) {
    let layered = MemoryLimits { recompute_above: 0, keep_layers: 0, head_chunk: 64 };
    for limits in [MemoryLimits::WHOLE, layered] {
        let fast = make();
        let mut generic = make();
        generic.set_fast_paths(false);
        let ((fast_loss, fast_grads), (generic_loss, generic_grads)) =
            (gradients(&fast, &limits, Gradients::new()), gradients(&generic, &limits, Gradients::as_tensors()));
        assert!((fast_loss - generic_loss).abs() < 1e-4, "{what} {limits:?}: loss {fast_loss} vs {generic_loss}");
        assert_eq!(fast_grads.len(), generic_grads.len(), "{what}: the same variables get gradients");
        assert!(!fast_grads.is_empty());
        let mut largest = 0f32;
        for (name, want) in &fast_grads {
            let got = &generic_grads[name];
            let difference = (got - want).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let size = want.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-3);
            assert!(difference / size < 1e-4, "{what} {limits:?} {name}: {difference} of {size}");
            largest = largest.max(difference / size);
        }
        // The two paths sum in other orders: bit-equal gradients would mean one path ran twice.
        assert!(largest > 0.0, "{what} {limits:?}: the generic path gave the fast path's exact bits");
    }
}

#[test]
fn the_generic_path_gives_the_fast_paths_gradients() {
    let (_dir, config, tensors) = tiny_weights();
    generic_equals_fast("llama", &|| Policy::new(&config, &tensors, &Device::Cpu).unwrap());
    for family in ["qwen3", "gemma3"] {
        let (dir, _) = crate::families::tiny(family);
        let (config, _, tensors) = wirl_engine::load::load_tensors(dir.path(), &Default::default()).unwrap();
        generic_equals_fast(family, &|| Policy::new(&config, &tensors, &Device::Cpu).unwrap());
    }
    let (_dir, config, tensors, adapter, _) = crate::lora::adapted();
    generic_equals_fast("qwen3 + LoRA", &|| {
        Policy::with_adapter(&config, tensors.clone(), &adapter, &Device::Cpu).unwrap()
    });
}

/// Two updates (μ = 2, a KL reference, clipping) through the generic path — composed ops and
/// the tensor-ops optimizer — reach the fast path's weights.
#[test]
fn the_generic_path_updates_as_the_fast_path_does() {
    let (_dir, config, tensors) = tiny_weights();
    let group = wirl_grpo::GroupBatch {
        prompt: (0..10).map(|i| (i * 3 % 60 + 2) as u32).collect(),
        completions: vec![vec![3, 9, 27, 17], vec![5, 6], vec![44, 1, 8]],
        advantages: vec![1.0, -0.5, 0.25],
        token_advantages: Vec::new(),
        trainable: Vec::new(),
        sampler_logprobs: Vec::new(),
        sampler_lag: 0,
    };
    let settings = crate::hardening::two_epochs_with_kl();
    let weights_after = |fast: bool| {
        let mut policy = Policy::new(&config, &tensors, &Device::Cpu).unwrap();
        policy.set_fast_paths(fast);
        let vars: Vec<_> = policy.vars().iter().map(|(_, v)| v.clone()).collect();
        let reference = Some(policy.frozen_copy(&Device::Cpu).unwrap());
        let mut optimizer = wirl_grpo::optim::Optimizer::new(vars, 0.01).unwrap();
        optimizer.fast_paths = fast;
        let mut learner = wirl_grpo::Learner::new(policy, reference, optimizer);
        for _ in 0..2 {
            learner.update(std::slice::from_ref(&group), &settings, None, &|| false, &mut |_, _| {}).unwrap().unwrap();
        }
        let vars = learner.policy.vars();
        vars.iter()
            .flat_map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect::<Vec<_>>()
    };
    let (fast, generic) = (weights_after(true), weights_after(false));
    // As in the data-parallel test: a weight whose gradient is ~0 moves by Adam's lr × sign
    // of float noise; a tenth of a step (lr 1e-3) is the bound.
    let worst = fast.iter().zip(&generic).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst < 1e-4, "a weight differs by {worst}");
}

/// `--device` / `model.device`: a name it does not know is refused naming the key; CUDA on a
/// build without it says where a CUDA build comes from; neither leaves a run directory.
#[test]
fn a_device_it_cannot_use_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 1, 0.01);
    let text = std::fs::read_to_string(&config).unwrap();
    let run = dir.path().join("run");
    let train = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("train")
            .arg(&config)
            .arg("--run-dir")
            .arg(&run)
            .args(args)
            .output()
            .unwrap()
    };
    let out = train(&["--device", "gpu"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("`model.device` = \"gpu\""), "{said}");
    if !cfg!(feature = "cuda") {
        let out = train(&["--device", "cuda:1"]);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains("cuda:1") && said.contains("scripts/build-cuda"), "{said}");
    }
    std::fs::write(&config, text.replacen("[model]", "[model]\ndevice = \"cuda:x\"", 1)).unwrap();
    let out = train(&[]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("model.device") && said.contains("train.toml"), "{said}");
    assert!(!run.exists(), "a refused start leaves no run directory");
    // `wirl eval` reads the device too (it ran on the CPU whatever the config said).
    let eval = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("eval")
            .arg(&config)
            .arg("--output")
            .arg(dir.path().join("eval.jsonl"))
            .args(args)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (passed, said) = eval(&[]);
    assert!(!passed && said.contains("model.device") && said.contains("train.toml"), "{said}");
    std::fs::write(&config, &text).unwrap();
    let (passed, said) = eval(&["--device", "gpu"]);
    assert!(!passed && said.contains("`model.device` = \"gpu\""), "{said}");
    if !cfg!(feature = "cuda") {
        let (passed, said) = eval(&["--device", "cuda"]);
        assert!(!passed && said.contains("cuda:0") && said.contains("scripts/build-cuda"), "{said}");
    }
}

/// `wirl model check-device --device cpu` on the tiny model: one JSON line that passes, with
/// a difference that is not zero (the paths sum in other orders) over every variable of both
/// backward paths, and the fixed-order kernels' check bit-equal; a tolerance below that
/// difference fails with exit code 1; a tolerance
/// that is not a positive number is refused.
#[test]
fn check_device_compares_the_generic_path_with_the_cpu() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), false);
    let check = |tolerance: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["model", "check-device", "--device", "cpu", &format!("--tolerance={tolerance}"), "--model"])
            .arg(dir.path())
            .output()
            .unwrap()
    };
    let out = check("1e-3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["pass"], true);
    let worst = report["agreement"]["worst_relative"].as_f64().unwrap();
    assert!(worst > 0.0 && worst < 1e-4, "{report}");
    // The fixed-order kernels' check: four kernels, each bit-equal across batches and
    // positions (on a CPU without them, skipped and saying so).
    if wirl_engine::invariant::available() {
        let kernels = report["kernels"]["kernels"].as_array().expect("the kernels' check");
        assert_eq!(kernels.len(), 4, "{report}");
        assert!(kernels.iter().all(|k| k["bit_equal"] == true), "{report}");
    } else {
        assert!(report["kernels"]["skipped"].is_string(), "{report}");
    }
    let variables = wirl_engine::load::load_tensors(dir.path(), &Default::default()).unwrap().2.len() as u64;
    assert_eq!(report["agreement"]["compared"].as_u64(), Some(2 * variables), "{report}");
    let strict = check(&format!("{}", worst / 4.0));
    assert_eq!(strict.status.code(), Some(1), "{}", String::from_utf8_lossy(&strict.stdout));
    for bad in ["0", "-1", "NaN", "inf"] {
        let out = check(bad);
        assert!(!out.status.success(), "{bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--tolerance"), "{bad}");
    }
}
