//! `wirl train` under hostile plugins, configs and files: training goes on past failed
//! tasks and non-finite rewards, stops cleanly (with a checkpoint) when it must, and never
//! writes or loads unusable weights.

use crate::grpo::{metrics, train, write_config};
use std::path::Path;
use std::time::{Duration, Instant};
use wirl_test_artifacts::{ARITHMETIC, EXACT_MATCH, HOSTILE, HOSTILE_ENVIRONMENT, MATH_ANSWER};

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

use crate::grpo::rollouts;

/// The config of `write_config` with its environment replaced by `environment`.
fn with_environment(dir: &Path, environment: &str, steps: usize) -> std::path::PathBuf {
    let config = write_config(dir, "", steps, 0.01);
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text.replace(&format!("plugin = {ARITHMETIC:?}\nconfig = {{ shots = false }}"), environment);
    std::fs::write(&config, text).unwrap();
    config
}

#[test]
fn tasks_that_fail_are_skipped_recorded_and_replaced() {
    for (mode, reason) in [("fail_mod = 2", "on purpose"), ("trap_mod = 2", "trap")] {
        let dir = tempfile::tempdir().unwrap();
        let environment = format!("plugin = {HOSTILE_ENVIRONMENT:?}\nconfig = {{ {mode} }}");
        let config = with_environment(dir.path(), &environment, 2);
        let run = dir.path().join("run");
        let out = train(&config, &run);
        assert!(out.status.success(), "{mode}: {}", stderr(&out));
        let mut total = 0;
        for (step, line) in metrics(&run).iter().enumerate() {
            // Indices 2·step and 2·step + 1: the odd one fails and is replaced (by indices
            // from a range of their own, which may fail too).
            let skipped = line["tasks_skipped"].as_array().unwrap();
            assert!(!skipped.is_empty() && skipped.len() < 8, "{mode}: {line}");
            assert_eq!(skipped[0]["index"], 2 * step as u64 + 1);
            assert!(skipped.iter().all(|s| s["reason"].as_str().unwrap().contains(reason)), "{mode}: {line}");
            total += skipped.len();
        }
        let records = rollouts(&run);
        assert_eq!(records.iter().filter(|r| r.get("skipped_task").is_some()).count(), total, "{mode}");
        // Every step still trains on its full count of tasks × samples.
        assert_eq!(records.iter().filter(|r| r.get("completion").is_some()).count(), 2 * 2 * 6, "{mode}");
    }
}

#[test]
fn a_source_that_fails_every_task_stops_with_a_message_after_bounded_tries() {
    let dir = tempfile::tempdir().unwrap();
    let environment = format!("plugin = {HOSTILE_ENVIRONMENT:?}\nconfig = {{ fail_all = true }}");
    let config = with_environment(dir.path(), &environment, 2);
    let out = train(&config, &dir.path().join("run"));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let error = stderr(&out);
    assert!(error.contains("failed 8 tasks in a row") && error.contains("on purpose"), "{error}");
}

#[test]
fn a_prompt_longer_than_the_context_is_a_failed_task_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    // The tiny model's context is 64 tokens: one task of the dataset is 200 words long.
    let task = |id: &str, words: usize| {
        let content = vec!["w2 w3"; words / 2].join(" ");
        format!(r#"{{"id": "{id}", "messages": [{{"role": "user", "content": "{content}"}}], "answer": "1"}}"#)
    };
    std::fs::write(
        dir.path().join("train.jsonl"),
        [task("short-a", 4), task("too-long", 200), task("short-b", 6)].join("\n"),
    )
    .unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let start = text.find("[environment]").unwrap();
    let end = text.find("[[rewards]]").unwrap();
    let text =
        format!("{}[dataset]\ntrain = \"train.jsonl\"\neval = \"train.jsonl\"\n\n{}", &text[..start], &text[end..]);
    std::fs::write(&config, text).unwrap();
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", stderr(&out));
    // `wirl eval` leaves the task out too, and evaluates the others.
    let eval = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("eval")
        .arg(&config)
        .args(["--tasks", "3", "--output"])
        .arg(dir.path().join("eval.jsonl"))
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", stderr(&eval));
    assert!(stderr(&eval).contains("`too-long` left out"), "{}", stderr(&eval));
    let result: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(result["tasks"], 2, "{result}");
    let skipped: Vec<serde_json::Value> =
        metrics(&run).iter().flat_map(|m| m["tasks_skipped"].as_array().unwrap().clone()).collect();
    assert!(!skipped.is_empty());
    for skip in &skipped {
        assert_eq!(skip["task"], "too-long");
        assert!(skip["reason"].as_str().unwrap().contains("context of 64"), "{skip}");
    }
    assert!(stderr(&out).contains("too-long"), "the warning names the task");
}

#[test]
fn non_finite_rewards_are_failures_of_the_plugin_and_training_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "config = { nan_odd_tasks = true }", 2, 0.01);
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", stderr(&out));
    for line in metrics(&run) {
        assert_eq!(line["failures"]["non_finite"], 6, "{line}");
        assert!(line["loss"].as_f64().unwrap().is_finite(), "{line}");
        assert_eq!(line["updates_skipped"], 0, "{line}");
    }
    // The rollouts keep the plugin's failure message under its name.
    let failed = rollouts(&run).into_iter().find(|r| r["failures"].as_array().is_some_and(|f| !f.is_empty())).unwrap();
    let note = failed["notes"]["hostile"].as_str().unwrap();
    assert!(note.starts_with("non_finite") && note.contains("NaN"), "{failed}");
    // A checkpoint of the run loads.
    assert!(run.join("checkpoints/step-000002/model/model.safetensors").is_file());
}

/// A learning rate this large sends the weights to 1e30 in one update, and the next forward
/// overflows. The sampler and the learner compute the same numbers (`wirl_engine::invariant`,
/// the norms' sums in f64 on both sides), so it is the sampler that meets the overflow first:
/// the run stops at once, naming the non-finite logits and with exit code 2.
/// (Before issue 61 the sampler's f32 norm overflowed to a zero scale and kept sampling, and
/// the learner's gradients went NaN instead — the path `grpo.max_skipped_updates` guards,
/// tested by `wirl-grpo`'s optimizer tests.)
#[test]
fn weights_that_overflow_stop_the_run_naming_the_logits() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 10, 0.01);
    let text = std::fs::read_to_string(&config).unwrap().replace("learning_rate = 0.01", "learning_rate = 1e30");
    std::fs::write(&config, text).unwrap();
    let run = dir.path().join("run");
    let out = train(&config, &run);
    let error = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{error}");
    assert!(error.contains("logits are NaN or infinite"), "{error}");
    // The step that made the weights overflow is recorded; none after it.
    assert_eq!(metrics(&run).len(), 1, "{error}");
}

#[test]
fn weights_with_nan_are_refused_on_load_naming_the_weight() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    crate::engine::write_tiny_model(&model, false);
    let path = model.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &candle_core::Device::Cpu).unwrap();
    let norm = tensors.get("model.norm.weight").unwrap();
    let poisoned = (norm * f64::NAN).unwrap();
    tensors.insert("model.norm.weight".into(), poisoned);
    candle_core::safetensors::save(&tensors, &path).unwrap();
    let generate = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["generate", "--max-tokens", "2", "--prompt", "w2", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(!generate.status.success());
    let error = stderr(&generate);
    assert!(error.contains("model.norm.weight") && error.contains("NaN"), "{error}");
}

#[test]
fn non_finite_and_out_of_range_settings_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 1, 0.01);
    let text = std::fs::read_to_string(&config).unwrap();
    let run = dir.path().join("run");
    let cases = [
        (text.replace("beta = 0.0", "beta = 0.0\nweight_decay = nan"), "grpo.weight_decay"),
        (text.replace("beta = 0.0", "beta = nan"), "grpo.beta"),
        (text.replace("beta = 0.0", "beta = 0.0\nmax_grad_norm = -1.0"), "grpo.max_grad_norm"),
        (text.replace("beta = 0.0", "beta = 0.0\nclip_high = inf"), "grpo.loss.clip_high"),
        (text.replace("learning_rate = 0.01", "learning_rate = inf"), "grpo.learning_rate"),
        (text.replace("max_tokens = 6", "max_tokens = 6\ntemperature = 0.0"), "sampling.temperature"),
        (
            text.replace(&format!("plugin = {HOSTILE:?}"), &format!("plugin = {HOSTILE:?}\nweight = nan")),
            "rewards[0].weight",
        ),
        (
            text.replace(
                &format!("plugin = {HOSTILE:?}"),
                &format!("plugin = {HOSTILE:?}\nmemory_mib = 18014398509481984"),
            ),
            "rewards[0].memory_mib",
        ),
        (
            text.replace(
                &format!("plugin = {HOSTILE:?}"),
                &format!(
                    "plugin = {HOSTILE:?}\ncode_runner = {{ plugin = {:?}, workers = 100000 }}",
                    wirl_test_artifacts::PYTHON_CODE_RUNNER
                ),
            ),
            "rewards[0].code_runner.workers",
        ),
        // A count past i64 is read as the config's own type, named by its key; in a config of
        // the flat objective keys, which goes through a TOML table (i64 at most), by its line.
        (
            text.replace("steps = 1", "steps = 18446744073709551615").replace("beta = 0.0", "kl = { where = \"off\" }"),
            "grpo.steps",
        ),
        (text.replace("steps = 1", "steps = 18446744073709551615"), "steps = 18446744073709551615"),
        (text.replace("beta = 0.0", "beta = 0.0\nkeep_activations_mib = -1"), "keep_activations_mib"),
    ];
    for (bad, key) in cases {
        std::fs::write(&config, bad).unwrap();
        let out = train(&config, &run);
        assert_eq!(out.status.code(), Some(2), "{key}: {}", stderr(&out));
        let error = stderr(&out);
        assert!(error.contains("train.toml") && error.contains(key), "expected `{key}` in: {error}");
        assert!(!run.exists(), "{key}: nothing is written for a refused config");
    }
    // Overrides on the command line are checked too.
    std::fs::write(&config, &text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg(&config)
        .args(["--steps", "0", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("grpo.steps"), "{}", stderr(&out));
}

#[test]
fn ctrl_c_cuts_a_sleeping_reward_and_stops_with_a_checkpoint_within_a_second() {
    // The reward sleeps a minute per call under a two-minute deadline: only the interrupt
    // can end the step early.
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "config = { sleep_ms = 60000 }\ndeadline_ms = 120000", 3, 0.01);
    let run = dir.path().join("run");
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg(&config)
        .arg("--run-dir")
        .arg(&run)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Scoring has begun once the run directory exists and a few seconds have passed for the
    // tiny model's generation.
    let started = Instant::now();
    while !run.join("config.resolved.toml").exists() && started.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    let signalled = Instant::now();
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let took = signalled.elapsed();
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
    // Each call would sleep a minute: stopping within seconds is the interrupt's doing.
    assert!(took < Duration::from_secs(15), "stopped {took:?} after Ctrl-C");
    assert!(stderr(&out).contains("interrupted during step 1"), "{}", stderr(&out));
    // Nothing of the abandoned step is recorded; a checkpoint of step 0 lets it resume.
    assert!(run.join("checkpoints/step-000000/state.json").is_file());
    assert!(std::fs::read_to_string(run.join("metrics.jsonl")).unwrap().is_empty());
}

#[test]
fn resume_passes_over_a_damaged_newest_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let text = std::fs::read_to_string(&config).unwrap().replace("seed = 3", "seed = 3\ncheckpoint_every = 1");
    std::fs::write(&config, text).unwrap();
    let run = dir.path().join("run");
    assert!(train(&config, &run).status.success());
    // The newest checkpoint's state disagrees with its directory.
    let state = run.join("checkpoints/step-000002/state.json");
    std::fs::write(&state, std::fs::read_to_string(&state).unwrap().replace("\"step\": 2", "\"step\": 7")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", "--steps", "3", "--resume"])
        .arg(&run)
        .output()
        .unwrap();
    let error = stderr(&out);
    assert!(out.status.success(), "{error}");
    assert!(error.contains("step-000002 passed over") && error.contains("says step 7"), "{error}");
    assert!(error.contains("resuming") && error.contains("from step 1"), "{error}");
    assert_eq!(metrics(&run).len(), 3);

    // A truncated model file is passed over the same way.
    let model = run.join("checkpoints/step-000003/model/model.safetensors");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", "--steps", "4", "--resume"])
        .arg(&run)
        .output()
        .unwrap();
    let error = stderr(&out);
    assert!(out.status.success(), "{error}");
    assert!(error.contains("step-000003 passed over") && error.contains("damaged"), "{error}");
}

/// Finite corruption of a checkpoint's weights (4 MiB of 1.0, a valid file still) is caught
/// by its sha256 and the checkpoint passed over for the one before; only the newest
/// `grpo.keep_checkpoints` are kept.
#[test]
fn resume_passes_over_changed_weights_and_old_checkpoints_are_pruned() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 4, 0.01);
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("seed = 3", "seed = 3\ncheckpoint_every = 1\nkeep_checkpoints = 2");
    std::fs::write(&config, text).unwrap();
    let run = dir.path().join("run");
    assert!(train(&config, &run).status.success());
    let kept: Vec<String> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(kept, ["step-000003", "step-000004"], "the newest two are kept");

    let model = run.join("checkpoints/step-000004/model/model.safetensors");
    let mut bytes = std::fs::read(&model).unwrap();
    let tail = bytes.len() - 64;
    let span = (4 << 20).min(tail / 2);
    for value in bytes[tail - span..tail].chunks_exact_mut(4) {
        value.copy_from_slice(&1.0f32.to_le_bytes());
    }
    std::fs::write(&model, &bytes).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", "--steps", "5", "--resume"])
        .arg(&run)
        .output()
        .unwrap();
    let error = stderr(&out);
    assert!(out.status.success(), "{error}");
    assert!(error.contains("step-000004 passed over") && error.contains("changed since it was written"), "{error}");
    assert!(error.contains("from step 3"), "{error}");
}

/// The tiny model's config and weights (its directory kept alive by the first).
pub(crate) fn tiny_weights()
-> (tempfile::TempDir, wirl_engine::Config, std::collections::HashMap<String, candle_core::Tensor>) {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), true);
    let options = wirl_engine::LoadOptions::default();
    let (config, _, tensors) = wirl_engine::load::load_tensors(dir.path(), &options).unwrap();
    (dir, config, tensors)
}

/// A loss over every token's log-prob and entropy (as GRPO's terms are), for the gradient
/// tests: the loss, and its value.
pub(crate) fn mixed_loss(stats: &wirl_grpo::TokenStats) -> candle_core::Result<(candle_core::Tensor, f32)> {
    let loss = ((&stats.logp * 0.7)?.sum_all()? + (&stats.entropy * 0.1)?.sum_all()?)?;
    Ok((loss.clone(), loss.to_scalar::<f32>()?))
}

/// The layer-by-layer backward gives the loss and gradients of the whole-graph backward,
/// whether every layer is rebuilt in the backward, only some (the top layer keeps its graph
/// from the forward), or none.
#[test]
fn recomputed_layers_give_the_same_gradients() {
    let (_dir, config, tensors) = tiny_weights();
    let policy = wirl_grpo::Policy::new(&config, &tensors, &wirl_engine::Device::Cpu).unwrap();
    let prompt: Vec<u32> = (0..20).map(|i| (i * 7 % 60 + 2) as u32).collect();
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17], vec![5, 6], vec![44, 1, 8]];
    let loss_of = mixed_loss;
    let mut whole = wirl_grpo::Gradients::new();
    let (whole_loss, recomputed) =
        policy.loss_and_grads(&prompt, &completions, &wirl_grpo::MemoryLimits::WHOLE, &mut whole, loss_of).unwrap();
    assert!(!recomputed);
    let width = completions.iter().map(Vec::len).max().unwrap();
    let one_layer = policy.net().layer_graph_bytes(prompt.len(), &[(completions.len(), width)]);
    assert!(config.num_hidden_layers > 1, "the test keeps some layers' graphs and not others");
    let mut worst = 0f32;
    for keep_layers in [0, one_layer, u64::MAX] {
        let limits = wirl_grpo::MemoryLimits { recompute_above: 0, keep_layers, head_chunk: u64::MAX };
        let mut layered = wirl_grpo::Gradients::new();
        let (layered_loss, recomputed) =
            policy.loss_and_grads(&prompt, &completions, &limits, &mut layered, loss_of).unwrap();
        assert!(recomputed);
        assert!((whole_loss - layered_loss).abs() < 1e-5, "keep {keep_layers}: {whole_loss} vs {layered_loss}");
        for (name, var) in policy.vars() {
            let a = whole.tensor(var).unwrap().unwrap_or_else(|| panic!("no gradient for {name}"));
            let b =
                layered.tensor(var).unwrap().unwrap_or_else(|| panic!("keep {keep_layers}: no gradient for {name}"));
            let difference = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            let scale = a.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-3);
            worst = worst.max(difference / scale);
        }
    }
    assert!(worst < 1e-4, "largest relative gradient difference {worst}");
}

/// A step on a 2,000-token prompt trains, recomputing its layers.
#[test]
fn a_step_on_a_two_thousand_token_prompt_trains() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 1, 0.01);
    // The tiny model with room for the prompt.
    let model_config = dir.path().join("model/config.json");
    let text = std::fs::read_to_string(&model_config).unwrap();
    std::fs::write(&model_config, text.replace("\"max_position_embeddings\":64", "\"max_position_embeddings\":2200"))
        .unwrap();
    let content = vec!["w2 w3 w4 w5"; 500].join(" ");
    let task = format!(r#"{{"id": "long", "messages": [{{"role": "user", "content": "{content}"}}], "answer": "1"}}"#);
    std::fs::write(dir.path().join("train.jsonl"), task).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let start = text.find("[environment]").unwrap();
    let end = text.find("[[rewards]]").unwrap();
    let text = format!("{}[dataset]\ntrain = \"train.jsonl\"\n\n{}", &text[..start], &text[end..])
        .replace("prompts_per_step = 2", "prompts_per_step = 1\nrecompute_above_mib = 64")
        .replace("group_size = 6", "group_size = 2");
    std::fs::write(&config, text).unwrap();
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", stderr(&out));
    let line = &metrics(&run)[0];
    assert!(line["tasks_skipped"].as_array().unwrap().is_empty(), "{line}");
    assert_eq!(line["groups_recomputed"], line["groups_kept"], "{line}");
    assert!(line["grad_norm"].as_f64().is_some_and(|n| n > 0.0), "{line}");
    eprintln!("peak resident memory with a 2,000-token prompt: {} MiB", line["peak_rss_mib"]);
}

#[test]
fn parts_that_two_plugins_share_are_namespaced_and_notes_kept_per_plugin() {
    // math-answer and exact-match both give a part `correct`; math-answer alone gives
    // `format`; the same file twice gets a second name.
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "\n[[rewards]]\nplugin = {MATH_ANSWER:?}\n\n[[rewards]]\nplugin = {EXACT_MATCH:?}\n\n[[rewards]]\nplugin = {EXACT_MATCH:?}\n"
    );
    let config = write_config(dir.path(), &extra, 1, 0.01);
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", stderr(&out));
    let record = rollouts(&run).into_iter().find(|r| r.get("completion").is_some()).unwrap();
    let parts = record["parts"].as_object().unwrap();
    let mut names: Vec<&str> = parts.keys().map(String::as_str).collect();
    names.sort();
    assert_eq!(names, ["exact_match#2/correct", "exact_match/correct", "format", "math_answer/correct"], "{record}");
    let notes = record["notes"].as_object().unwrap();
    assert!(notes.contains_key("math_answer") && notes.contains_key("hostile"), "{record}");
}

/// The head computed a chunk of positions at a time (its `[rows, positions, vocab]` tensors
/// never whole) gives the log-probs, loss and gradients of the whole head, within 1e-5, with
/// the layers' graph whole and recomputed alike.
#[test]
fn a_head_computed_by_chunks_gives_the_same_loss_and_gradients() {
    let (_dir, config, tensors) = tiny_weights();
    let policy = wirl_grpo::Policy::new(&config, &tensors, &wirl_engine::Device::Cpu).unwrap();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 5 % 60 + 2) as u32).collect();
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17, 8, 40, 2], vec![5, 6], vec![44, 1, 8, 12, 13]];
    let loss_of = mixed_loss;
    let logp_only = |stats: &wirl_grpo::TokenStats| {
        let loss = (&stats.logp * -1.3)?.sum_all()?;
        Ok((loss.clone(), loss.to_scalar::<f32>()?))
    };
    let per_position = (completions.len() * config.vocab_size * 4) as u64;
    let net = policy.net();
    let whole_stats = net.completion_stats(&prompt, &completions).unwrap();
    for chunk in [1, 2, 3, 8] {
        let stats = net.completion_stats_chunked(&prompt, &completions, chunk * per_position).unwrap();
        for (a, b) in [(&whole_stats.logp, &stats.logp), (&whole_stats.entropy, &stats.entropy)] {
            let difference = (a - b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
            assert!(difference < 1e-5, "chunk {chunk}: stats differ by {difference}");
        }
    }
    for (what, objective) in
        [("logp and entropy", &loss_of as &dyn Fn(&wirl_grpo::TokenStats) -> _), ("logp", &logp_only)]
    {
        for recompute_above in [u64::MAX, 0] {
            let limits = |head_chunk| wirl_grpo::MemoryLimits { recompute_above, keep_layers: 0, head_chunk };
            let mut whole = wirl_grpo::Gradients::new();
            let (whole_loss, _) =
                policy.loss_and_grads(&prompt, &completions, &limits(u64::MAX), &mut whole, objective).unwrap();
            for chunk in [1, 3, 8] {
                let mut chunked = wirl_grpo::Gradients::new();
                let (loss, recomputed) = policy
                    .loss_and_grads(&prompt, &completions, &limits(chunk * per_position), &mut chunked, objective)
                    .unwrap();
                assert_eq!(recomputed, recompute_above == 0);
                assert!((whole_loss - loss).abs() < 1e-5, "{what}, chunk {chunk}: {whole_loss} vs {loss}");
                for (name, var) in policy.vars() {
                    let a = whole.tensor(var).unwrap().unwrap_or_else(|| panic!("no gradient for {name}"));
                    let b = chunked
                        .tensor(var)
                        .unwrap()
                        .unwrap_or_else(|| panic!("{what}: no chunked gradient for {name}"));
                    let difference = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                    assert!(
                        difference < 1e-5,
                        "{what}, chunk {chunk}, recompute {recompute_above}: {name} differs by {difference}"
                    );
                }
            }
        }
    }
}

/// The head computed only where a token carries loss (a ledger's model tokens, not the
/// environment's or the padding) gives the loss and gradients of the head over every
/// position, when the loss weighs the skipped positions 0 — as GRPO's token weights do —
/// through every backward path (whole graph or layer by layer, whole head or by chunks, the
/// CPU's fused head or the generic ops), and the stats of a read-only pass agree where kept
/// and are 0 where skipped.
#[test]
fn the_head_skips_positions_without_loss_and_changes_nothing_that_has_one() {
    let (_dir, config, tensors) = tiny_weights();
    let prompt: Vec<u32> = (0..12).map(|i| (i * 5 % 60 + 2) as u32).collect();
    // Row 0 a ledger: two model turns around the environment's three tokens; rows 1 and 2
    // padded; row 2 carries no loss at all.
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17, 8, 40, 2], vec![5, 6], vec![44, 1, 8, 12]];
    let trained: Vec<Vec<bool>> =
        vec![vec![true, true, false, false, false, true, true], vec![true, true], vec![false, false, false, false]];
    let width = 7;
    let mut weights = vec![0f32; completions.len() * width];
    for (row, mask) in trained.iter().enumerate() {
        for (i, &t) in mask.iter().enumerate() {
            weights[row * width + i] = if t { 0.5 + (row * width + i) as f32 / 10.0 } else { 0.0 };
        }
    }
    let device = wirl_engine::Device::Cpu;
    let weights = candle_core::Tensor::from_vec(weights, (completions.len(), width), &device).unwrap();
    let weighted = |stats: &wirl_grpo::TokenStats| {
        let terms = ((&stats.logp * 0.7)? + (&stats.entropy * 0.1)?)?;
        let loss = (terms * &weights)?.sum_all()?;
        Ok((loss.clone(), loss.to_scalar::<f32>()?))
    };
    let per_position = (completions.len() * config.vocab_size * 4) as u64;
    for fast in [true, false] {
        let mut policy = wirl_grpo::Policy::new(&config, &tensors, &device).unwrap();
        policy.set_fast_paths(fast);
        let part = wirl_grpo::Part::trained(&completions, &trained);
        // Read-only stats: equal where kept, 0 where skipped.
        let every = policy.net().completion_stats(&prompt, &completions).unwrap();
        let kept = policy.net().parts_stats_chunked(&prompt, &[part], 2 * per_position).unwrap().pop().unwrap();
        let (every_logp, kept_logp) = (every.logp.to_vec2::<f32>().unwrap(), kept.logp.to_vec2::<f32>().unwrap());
        for row in 0..completions.len() {
            for i in 0..width {
                let carries = trained[row].get(i).copied().unwrap_or(false);
                let (a, b) = (every_logp[row][i], kept_logp[row][i]);
                if carries {
                    assert!((a - b).abs() < 1e-5, "fast {fast}, row {row} position {i}: {a} vs {b}");
                } else {
                    assert_eq!(b, 0.0, "fast {fast}, row {row} position {i} is skipped");
                }
            }
        }
        for recompute_above in [u64::MAX, 0] {
            for head_chunk in [u64::MAX, per_position, 3 * per_position] {
                let limits = wirl_grpo::MemoryLimits { recompute_above, keep_layers: 0, head_chunk };
                let mut all = wirl_grpo::Gradients::new();
                let mut skipped = wirl_grpo::Gradients::new();
                let (all_loss, _) = policy.loss_and_grads(&prompt, &completions, &limits, &mut all, weighted).unwrap();
                let (loss, _) = policy.part_loss_and_grads(&prompt, part, &limits, &mut skipped, weighted).unwrap();
                let what = format!("fast {fast}, recompute above {recompute_above}, head chunk {head_chunk}");
                assert!((all_loss - loss).abs() < 1e-4 * all_loss.abs().max(1.0), "{what}: {all_loss} vs {loss}");
                for (name, var) in policy.vars() {
                    let a = all.tensor(var).unwrap().unwrap_or_else(|| panic!("{what}: no gradient for {name}"));
                    let b = skipped.tensor(var).unwrap().unwrap_or_else(|| panic!("{what}: none skipped, {name}"));
                    let difference = (&a - &b).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
                    let size = a.abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap().max(1e-3);
                    assert!(difference / size < 1e-4, "{what}: {name} differs by {difference} of {size}");
                }
            }
        }
    }
}

/// A completion token outside the vocabulary (only ever a target: the last token of a
/// completion is never an input) is an error from every path, not a panic.
#[test]
fn a_token_outside_the_vocabulary_is_an_error() {
    let (_dir, config, tensors) = tiny_weights();
    let policy = wirl_grpo::Policy::new(&config, &tensors, &wirl_engine::Device::Cpu).unwrap();
    let prompt: Vec<u32> = vec![2, 3, 4];
    let completions = vec![vec![5, 6, config.vocab_size as u32 + 7]];
    let loss_of = |stats: &wirl_grpo::TokenStats| {
        let loss = stats.logp.sum_all()?;
        Ok((loss.clone(), ()))
    };
    let per_position = (config.vocab_size * 4) as u64;
    for (recompute_above, head_chunk) in
        [(0, per_position), (0, u64::MAX), (u64::MAX, per_position), (u64::MAX, u64::MAX)]
    {
        let mut grads = wirl_grpo::Gradients::new();
        let limits = wirl_grpo::MemoryLimits { recompute_above, keep_layers: 0, head_chunk };
        let result = policy.loss_and_grads(&prompt, &completions, &limits, &mut grads, loss_of);
        assert!(result.is_err(), "recompute above {recompute_above}, head chunk {head_chunk}");
    }
    let stats = policy.net().completion_stats_chunked(&prompt, &completions, per_position);
    let message = stats.err().expect("an error").to_string();
    assert!(message.contains("outside the model's"), "{message}");
}

/// An update of the tiny model's tests: lr 1e-3, μ = 1, no KL or entropy term, whole groups
/// and head, C = 2.
pub(crate) fn tiny_update_settings() -> wirl_grpo::UpdateSettings {
    wirl_grpo::UpdateSettings {
        learning_rate: 1e-3,
        loss: wirl_grpo::loss::LossSettings::grpo(0.2, 0.2, 0.0, 0.0),
        inner_epochs: 1,
        aggregation: wirl_grpo::loss::Aggregation::TokenMean,
        max_grad_norm: Some(1.0),
        max_tokens: 8,
        memory: wirl_grpo::MemoryLimits::WHOLE,
        micro_batch_rows: 0,
        split_by_length: false,
        rows_per_pass: 0,
        tis_cap: 2.0,
        rollout_correction: wirl_grpo::RolloutCorrection::default(),
    }
}

/// μ = 2 epochs, clipping, a KL term and an entropy bonus: every part of the loss at work.
pub(crate) fn two_epochs_with_kl() -> wirl_grpo::UpdateSettings {
    wirl_grpo::UpdateSettings {
        loss: wirl_grpo::loss::LossSettings::grpo(0.2, 0.2, 0.04, 0.01),
        inner_epochs: 2,
        ..tiny_update_settings()
    }
}

/// A learner over `tensors` with a frozen KL reference and AdamW (no weight decay); `fast`:
/// the CPU's hand-written ops, else candle's composed ops and the tensor-ops optimizer (a
/// GPU's path).
pub(crate) fn learner_with_reference(
    config: &wirl_engine::Config,
    tensors: &std::collections::HashMap<String, candle_core::Tensor>,
    fast: bool,
) -> wirl_grpo::Learner {
    let mut policy = wirl_grpo::Policy::new(config, tensors, &wirl_engine::Device::Cpu).unwrap();
    policy.set_fast_paths(fast);
    let vars: Vec<_> = policy.vars().iter().map(|(_, v)| v.clone()).collect();
    let reference = Some(policy.frozen_copy(&wirl_engine::Device::Cpu).unwrap());
    let mut optimizer = wirl_grpo::optim::Optimizer::new(vars, 0.0).unwrap();
    optimizer.fast_paths = fast;
    wirl_grpo::Learner::new(policy, reference, optimizer)
}

/// A group split into micro-batches (gradients summed) updates the weights as the whole group
/// does, with μ = 2 epochs (old log-probs from the sampler's) and a KL reference: in order,
/// and by length (the long completion apart, the rows reordered).
#[test]
fn micro_batches_update_the_weights_as_the_whole_group_does() {
    let (_dir, config, tensors) = tiny_weights();
    let prompt: Vec<u32> = (0..10).map(|i| (i * 3 % 60 + 2) as u32).collect();
    // One long completion among short ones: split by length, it trains apart (rows reordered).
    let long: Vec<u32> = (0..45).map(|i| (i * 7 % 60 + 2) as u32).collect();
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27, 17], vec![5, 6], long, vec![44, 1, 8]];
    // Adam's first steps are about lr × sign(g): a weight whose gradient is ~0 moves by float
    // noise (another batch shape sums in another order). So the loss and the gradient norm
    // are asked equal within 1e-5, the weights within a tenth of one step (lr 1e-3): a row
    // lost or given another's advantage would move many of them by a whole step.
    let tolerance = 1e-4;
    let reference = wirl_grpo::Policy::new(&config, &tensors, &wirl_engine::Device::Cpu).unwrap();
    let sampled = reference.net().completion_stats(&prompt, &completions).unwrap().logp.to_vec2::<f32>().unwrap();
    let sampler_logprobs: Vec<Vec<f32>> =
        completions.iter().zip(&sampled).map(|(c, row)| row[..c.len()].to_vec()).collect();
    let group = wirl_grpo::GroupBatch {
        prompt,
        completions,
        advantages: vec![1.0, -0.5, 0.25, -0.75],
        token_advantages: Vec::new(),
        trainable: Vec::new(),
        sampler_logprobs,
        sampler_lag: 0,
    };
    // Recomputing, a group's micro-batches share one pass of the prompt, every layer rebuilt
    // in the backward or every one keeping its graph from the forward; the head whole or by
    // chunks of 3 positions (fused).
    let chunk_of_3 = (3 * 4 * config.vocab_size * 4) as u64;
    let weights_after = |micro_batch_rows: usize, split_by_length: bool, recompute: Option<u64>, chunked: bool| {
        let mut learner = learner_with_reference(&config, &tensors, true);
        let settings = wirl_grpo::UpdateSettings {
            micro_batch_rows,
            split_by_length,
            memory: wirl_grpo::MemoryLimits {
                recompute_above: if recompute.is_some() { 0 } else { u64::MAX },
                keep_layers: recompute.unwrap_or(0),
                head_chunk: if chunked { chunk_of_3 } else { u64::MAX },
            },
            ..two_epochs_with_kl()
        };
        let stats =
            learner.update(std::slice::from_ref(&group), &settings, None, &|| false, &mut |_, _| {}).unwrap().unwrap();
        let weights: Vec<Vec<f32>> = learner
            .policy
            .vars()
            .iter()
            .map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect();
        (stats.loss, stats.grad_norm, weights)
    };
    let (whole_loss, whole_norm, whole) = weights_after(0, false, None, false);
    let (rebuilt, kept) = (Some(0), Some(u64::MAX));
    for (rows, by_length, recompute, chunked) in [
        (1, false, None, false),
        (3, false, None, false),
        (0, true, None, false),
        (2, true, None, false),
        (0, true, rebuilt, false),
        (0, true, rebuilt, true),
        (0, true, kept, true),
        (2, true, rebuilt, true),
        (2, true, kept, false),
    ] {
        let (loss, norm, split) = weights_after(rows, by_length, recompute, chunked);
        let what = format!(
            "micro-batches of {rows} (0: any), by length {by_length}, layer by layer (bytes kept) {recompute:?}, head by chunks {chunked}"
        );
        assert!((whole_loss - loss).abs() < 1e-5, "{what}: loss {loss} vs {whole_loss}");
        assert!((whole_norm - norm).abs() < 1e-5 * whole_norm, "{what}: gradient norm {norm} vs {whole_norm}");
        let worst = whole.iter().flatten().zip(split.iter().flatten()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst < tolerance, "{what}: a weight differs by {worst}");
    }
}

/// Rows of many groups packed into passes (`rows_per_pass`: a GPU's default) update the
/// weights as group by group does: groups whose prompts share a template's beginning, one
/// that starts elsewhere, a multi-turn group (environment tokens carry no loss), one sampled
/// an update ago; μ = 2 (old log-probs from the sampler's), a KL reference, an entropy
/// bonus; both aggregations; the whole graph, or layer by layer with the head by chunks.
#[test]
fn rows_of_many_groups_in_one_pass_update_as_group_by_group() {
    let (_dir, config, tensors) = tiny_weights();
    let template: Vec<u32> = vec![1, 2, 3, 4, 20];
    let with = |rest: &[u32]| template.iter().chain(rest).copied().collect::<Vec<u32>>();
    let current = wirl_grpo::Policy::new(&config, &tensors, &wirl_engine::Device::Cpu).unwrap();
    let group = |prompt: Vec<u32>, completions: Vec<Vec<u32>>, advantages: Vec<f32>, lag: u64| {
        let logp = current.net().completion_stats(&prompt, &completions).unwrap().logp.to_vec2::<f32>().unwrap();
        // An update ago the sampler's weights gave each token a little less.
        let shift = 0.3 * lag as f32;
        let sampler_logprobs =
            completions.iter().zip(&logp).map(|(c, row)| row[..c.len()].iter().map(|l| l - shift).collect()).collect();
        wirl_grpo::GroupBatch {
            prompt,
            completions,
            advantages,
            token_advantages: Vec::new(),
            trainable: Vec::new(),
            sampler_logprobs,
            sampler_lag: lag,
        }
    };
    let long: Vec<u32> = (0..30).map(|i| (i * 7 % 60 + 2) as u32).collect();
    let mut multi_turn = group(with(&[12]), vec![vec![8, 9, 10, 11, 12], vec![8, 30, 31]], vec![0.5, -0.5], 0);
    multi_turn.trainable = vec![vec![true, false, false, true, true], vec![true, false, true]];
    let groups = vec![
        group(
            with(&[10, 11]),
            vec![vec![3, 9, 27], vec![5, 6, 11, 4], long, vec![44]],
            vec![1.0, -0.5, 0.25, -0.75],
            0,
        ),
        multi_turn,
        group(vec![5, 6, 7], vec![vec![3, 3], vec![40, 41, 42]], vec![0.8, -0.8], 0),
        group(with(&[13, 14, 15]), vec![vec![9, 9, 9], vec![17, 2]], vec![-1.0, 1.0], 1),
    ];
    let chunk_of_3 = (3 * 4 * config.vocab_size * 4) as u64;
    let layered = wirl_grpo::MemoryLimits { recompute_above: 0, keep_layers: 0, head_chunk: chunk_of_3 };
    // `fast: false`: candle's composed ops and the tensor-ops optimizer, as on a GPU.
    let update = |rows_per_pass: usize, aggregation, memory, fast: bool| {
        let mut learner = learner_with_reference(&config, &tensors, fast);
        let settings = wirl_grpo::UpdateSettings {
            aggregation,
            memory,
            split_by_length: true,
            rows_per_pass,
            ..two_epochs_with_kl()
        };
        let mut passes = 0;
        let stats = learner.update(&groups, &settings, None, &|| false, &mut |_, n| passes = n).unwrap().unwrap();
        let weights: Vec<f32> = learner
            .policy
            .vars()
            .iter()
            .flat_map(|(_, v)| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>().unwrap())
            .collect();
        (stats, weights, passes)
    };
    use wirl_grpo::loss::Aggregation;
    for aggregation in [Aggregation::TokenMean, Aggregation::SequenceMean] {
        for memory in [wirl_grpo::MemoryLimits::WHOLE, layered] {
            let (by_group, before, _) = update(0, aggregation, memory, true);
            assert!(by_group.loss.abs() > 1e-4 && by_group.tis_truncated == 0.0, "{by_group:?}");
            // 64: the template's groups of these weights, the lagged one, the other prompt; 3: the first
            // of those in two passes; 1: a pass per row.
            for (rows, expected_passes, fast) in [(64, 3, true), (3, 4, true), (1, 10, true), (64, 3, false)] {
                let (packed, after, passes) = update(rows, aggregation, memory, fast);
                let what = format!("{rows} rows a pass, {aggregation:?}, {memory:?}, fast paths {fast}");
                assert_eq!(passes, expected_passes, "{what}: passes");
                assert!(
                    (by_group.loss - packed.loss).abs() < 1e-5,
                    "{what}: loss {} vs {}",
                    packed.loss,
                    by_group.loss
                );
                assert!((by_group.kl - packed.kl).abs() < 1e-6, "{what}: kl {} vs {}", packed.kl, by_group.kl);
                assert!((by_group.entropy - packed.entropy).abs() < 1e-4, "{what}: entropy");
                let norm = (by_group.grad_norm - packed.grad_norm).abs();
                assert!(
                    norm < 1e-5 * by_group.grad_norm,
                    "{what}: gradient norm {} vs {}",
                    packed.grad_norm,
                    by_group.grad_norm
                );
                let worst = before.iter().zip(&after).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                assert!(worst < 1e-4, "{what}: a weight differs by {worst}");
            }
        }
    }
}

/// `grpo.rows_per_pass` from the command line: a negative or non-integer count is refused by
/// key before any run directory is made; a count far past the step's rows packs them all
/// into one pass and trains as group by group does (rewards and losses equal step by step).
#[test]
fn rows_per_pass_is_refused_by_key_or_trains_as_group_by_group() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 2, 0.01);
    let train = |run: &str, value: &str| {
        let set = format!("grpo.rows_per_pass={value}");
        crate::grpo::train_with(&config, &dir.path().join(run), &["--eval-tasks", "0", "--set", &set])
    };
    for bad in ["-1", "2.5", "\"many\""] {
        let out = train("bad", bad);
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains("rows_per_pass"), "{bad}: {said}");
        assert!(!dir.path().join("bad").exists(), "{bad}");
    }
    let figures = |run: &str, value: &str| -> Vec<(f64, f64)> {
        let out = train(run, value);
        assert!(out.status.success(), "{value}: {}", String::from_utf8_lossy(&out.stderr));
        let metrics = crate::grpo::metrics(&dir.path().join(run));
        metrics.iter().map(|m| (m["reward_mean"].as_f64().unwrap(), m["loss"].as_f64().unwrap())).collect()
    };
    let (by_group, packed) = (figures("by-group", "0"), figures("packed", "1000000000000"));
    assert_eq!(by_group.len(), 2);
    assert!(by_group.iter().any(|(_, loss)| loss.abs() > 1e-6), "a loss to compare: {by_group:?}");
    for ((reward, loss), (packed_reward, packed_loss)) in by_group.iter().zip(&packed) {
        assert_eq!(reward, packed_reward, "the same rollouts");
        assert!((loss - packed_loss).abs() < 1e-5, "loss {packed_loss} vs {loss}");
    }
}

/// A group sampled one update ago (`sampler_lag` 1) weighs each token's loss by the
/// truncated importance weight min(π_old / π_sampler, C): with the sampler's log-probs equal
/// to the current ones the update is the on-policy one; lower by δ, the loss is e^δ times
/// the on-policy loss up to the cap, where every token counts as truncated.
#[test]
fn lagged_groups_carry_the_truncated_importance_weight() {
    let (_dir, config, tensors) = tiny_weights();
    let prompt: Vec<u32> = (0..10).map(|i| (i * 5 % 60 + 2) as u32).collect();
    let completions: Vec<Vec<u32>> = vec![vec![3, 9, 27], vec![5, 6, 11, 4], vec![44, 1], vec![7, 7, 7]];
    let current = wirl_grpo::Policy::new(&config, &tensors, &wirl_engine::Device::Cpu).unwrap();
    let logp = current.net().completion_stats(&prompt, &completions).unwrap().logp.to_vec2::<f32>().unwrap();
    let update = |lag: u64, shift: f32| {
        let policy = wirl_grpo::Policy::new(&config, &tensors, &wirl_engine::Device::Cpu).unwrap();
        let vars: Vec<_> = policy.vars().iter().map(|(_, v)| v.clone()).collect();
        let optimizer = wirl_grpo::optim::Optimizer::new(vars, 0.0).unwrap();
        let mut learner = wirl_grpo::Learner::new(policy, None, optimizer);
        let group = wirl_grpo::GroupBatch {
            prompt: prompt.clone(),
            completions: completions.clone(),
            advantages: vec![1.0, -0.5, 0.75, -1.25],
            token_advantages: Vec::new(),
            trainable: Vec::new(),
            sampler_logprobs: completions
                .iter()
                .zip(&logp)
                .map(|(c, row)| row[..c.len()].iter().map(|l| l - shift).collect())
                .collect(),
            sampler_lag: lag,
        };
        let settings = tiny_update_settings();
        learner.update(std::slice::from_ref(&group), &settings, None, &|| false, &mut |_, _| {}).unwrap().unwrap()
    };
    let on_policy = update(0, 0.0);
    assert!(on_policy.loss.abs() > 1e-4, "a loss to compare: {}", on_policy.loss);
    assert_eq!(on_policy.tis_truncated, 0.0);
    // Lag 0 ignores the sampler's log-probs (with μ = 1 nothing reads them).
    assert_eq!(update(0, 0.5).loss, on_policy.loss);
    let equal = update(1, 0.0);
    assert!((equal.loss - on_policy.loss).abs() < 1e-5, "{} vs {}", equal.loss, on_policy.loss);
    assert_eq!(equal.tis_truncated, 0.0);
    let weighted = update(1, 0.5);
    let expected = on_policy.loss * 0.5f32.exp();
    assert!((weighted.loss - expected).abs() < 1e-4 * expected.abs().max(1.0), "{} vs {expected}", weighted.loss);
    assert_eq!(weighted.tis_truncated, 0.0);
    let capped = update(1, 3.0);
    assert!((capped.loss - 2.0 * on_policy.loss).abs() < 1e-4, "{} vs 2 × {}", capped.loss, on_policy.loss);
    assert_eq!(capped.tis_truncated, 1.0);
}
