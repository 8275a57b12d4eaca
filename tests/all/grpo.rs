//! The GRPO trainer: its trainable forward pass against the engine's, and `wirl train` on a
//! tiny random model with real plugins (a toy reward that rises, a reward plugin that traps on
//! every other call, config errors).

use crate::engine::write_tiny_model;
use std::path::Path;
use wirl_engine::{GenerateRequest, LoadOptions, Sampling};
use wirl_test_artifacts::{ARITHMETIC, HOSTILE};

/// The trainer's differentiable forward (prompt once, completions attending to it) gives the
/// log-probs the engine sampled with, on the same weights.
#[test]
fn trainable_and_inference_log_probs_agree() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), true);
    let (config, tokenizer, tensors) = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).unwrap();
    let device = wirl_engine::Device::Cpu;
    let policy = wirl_grpo::Policy::new(&config, &tensors, &device).unwrap();
    let mut source = wirl_engine::load::TensorSource::new(policy.shared_tensors());
    let model = wirl_engine::Model::load(&config, &mut source, &device).unwrap();
    let prompt: Vec<u32> = vec![5, 9, 13, 2, 7];
    let request = GenerateRequest {
        prompt: prompt.clone(),
        n: 4,
        sampling: Sampling { max_tokens: 12, seed: Some(11), ..Default::default() },
    };
    let out = wirl_engine::generate(&model, &tokenizer, &[request], |_, _, _| {}).unwrap().remove(0);
    let completions: Vec<Vec<u32>> = out.iter().map(|c| c.tokens.clone()).collect();
    assert!(completions.iter().any(|c| c.len() != completions[0].len()), "ragged completions exercise the padding");
    let stats = policy.net().completion_stats(&prompt, &completions).unwrap();
    let logp: Vec<Vec<f32>> = stats.logp.to_vec2().unwrap();
    let mut worst = 0f32;
    for (row, completion) in out.iter().enumerate() {
        for (t, &expected) in completion.logprobs.iter().enumerate() {
            worst = worst.max((logp[row][t] - expected).abs());
        }
    }
    assert!(worst < 1e-4, "max |trainable − inference| log-prob = {worst}");
    let entropy: Vec<Vec<f32>> = stats.entropy.to_vec2().unwrap();
    assert!(entropy.iter().flatten().all(|&h| h > 0.0 && h <= (64f32).ln() + 1e-4));
}

/// A config for `wirl train` on the tiny model, the arithmetic environment and the hostile
/// plugin as reward (its reward is the completion's length in characters).
pub fn write_config(dir: &Path, extra_reward: &str, steps: usize, lr: f64) -> std::path::PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_model(&model, false);
    // Words of 1 to 8 letters after the id, so that the length reward has room to rise.
    let path = model.join("tokenizer.json");
    let mut tokenizer: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut vocab = serde_json::Map::new();
    vocab.insert("<unk>".into(), 0.into());
    vocab.insert("</s>".into(), 1.into());
    for i in 2..64usize {
        vocab.insert(format!("w{i}{}", "z".repeat(i % 8)), i.into());
    }
    tokenizer["model"]["vocab"] = vocab.into();
    std::fs::write(&path, tokenizer.to_string()).unwrap();
    let config = format!(
        r#"
[model]
path = {model:?}

[environment]
plugin = {ARITHMETIC:?}
config = {{ shots = false }}

[[rewards]]
plugin = {HOSTILE:?}
{extra_reward}

[sampling]
max_tokens = 6

[grpo]
steps = {steps}
prompts_per_step = 2
group_size = 6
learning_rate = {lr}
beta = 0.0
seed = 3

[eval]
tasks = 0
"#
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// `wirl train --resume RUN_DIR --steps STEPS`.
pub fn resume(run_dir: &Path, steps: usize) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg("--resume")
        .arg(run_dir)
        .args(["--steps", &steps.to_string()])
        .output()
        .unwrap()
}

/// A step's metrics without the figures that depend on the machine's speed and memory.
pub fn deterministic(metrics: &serde_json::Value) -> serde_json::Value {
    let mut metrics = metrics.clone();
    let object = metrics.as_object_mut().expect("a metrics line");
    for key in ["time_s", "generate_tokens_per_s", "peak_rss_mib", "peak_rss_mib_by_phase"] {
        object.remove(key);
    }
    metrics
}

pub fn train(config: &Path, run_dir: &Path) -> std::process::Output {
    train_with(config, run_dir, &[])
}

/// `wirl train CONFIG --run-dir RUN_DIR ARGS...`.
pub fn train_with(config: &Path, run_dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg(config)
        .arg("--run-dir")
        .arg(run_dir)
        .args(args)
        .output()
        .unwrap()
}

/// `wirl train CONFIG` into `run_dir` without the held-out pass, each of `sets` given as a
/// `--set`, then `extra`: its metrics (the run must succeed).
fn trained_with_sets(config: &Path, run_dir: &Path, sets: &[&str], extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["--eval-tasks", "0"];
    for set in sets {
        args.extend(["--set", set]);
    }
    args.extend(extra);
    let out = train_with(config, run_dir, &args);
    assert!(out.status.success(), "{}: {}", run_dir.display(), String::from_utf8_lossy(&out.stderr));
    metrics(run_dir)
}

pub fn metrics(run_dir: &Path) -> Vec<serde_json::Value> {
    json_lines(&run_dir.join("metrics.jsonl"))
}

/// A run's `rollouts.jsonl`, a value per trajectory.
pub fn rollouts(run_dir: &Path) -> Vec<serde_json::Value> {
    json_lines(&run_dir.join("rollouts.jsonl"))
}

fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// Seeded: on a toy reward (longer completions score more: words of 2 to 10 letters) the mean
/// reward of the last 3 of 10 steps is above the first 3's. Not a timing test.
#[test]
fn training_raises_a_toy_reward() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 10, 0.01);
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines = metrics(&run);
    assert_eq!(lines.len(), 10);
    let mean = |steps: &[serde_json::Value]| {
        steps.iter().map(|m| m["reward_mean"].as_f64().unwrap()).sum::<f64>() / steps.len() as f64
    };
    let (first, last) = (mean(&lines[..3]), mean(&lines[7..]));
    assert!(last > first, "mean reward of the first 3 steps {first}, of the last 3 {last}");
    let rollouts = std::fs::read_to_string(run.join("rollouts.jsonl")).unwrap();
    assert_eq!(rollouts.lines().count(), 10 * 2 * 6);
    let first: serde_json::Value = serde_json::from_str(rollouts.lines().next().unwrap()).unwrap();
    assert_eq!(first["plugins"].as_array().unwrap().len(), 2, "environment and reward plugin hashes");

    let plot = std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).arg("plot").arg(&run).output().unwrap();
    assert!(plot.status.success(), "{}", String::from_utf8_lossy(&plot.stderr));
    for chart in ["reward.png", "kl.png", "loss.png", "lengths.png", "time.png"] {
        let bytes = std::fs::read(run.join(chart)).unwrap();
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n") && bytes.len() > 1000, "{chart}");
    }
}

/// A reward plugin that traps on every other call: the run completes and the failures are
/// counted by kind. By default the failed trajectories are masked (no gradient, no reward, a
/// group left without two usable ones skipped and counted); with `on_failure = "reward"`
/// they are trained on with `failure_reward`, as the user asked.
#[test]
fn a_reward_plugin_that_traps_every_other_call_does_not_stop_training() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "config = { trap_odd_tasks = true }", 2, 0.01);
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let statuses = |run: &Path| -> Vec<String> {
        std::fs::read_to_string(run.join("rollouts.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["status"].as_str().unwrap().to_string())
            .collect()
    };
    for line in metrics(&run) {
        // Two tasks per step, the second of each pair traps: its 6 completions fail.
        assert_eq!(line["failures"]["trap"], 6, "{line}");
        assert_eq!((line["trajectories_masked"].as_u64(), line["groups_unusable"].as_u64()), (Some(6), Some(1)));
        // The reward figures are the usable group's: its completions score their length > 0.
        assert!(line["reward_mean"].as_f64().unwrap() > 0.0, "{line}");
    }
    let masked = statuses(&run);
    assert_eq!(masked.iter().filter(|s| *s == "masked").count(), 2 * 6, "{masked:?}");
    assert_eq!(masked.iter().filter(|s| *s == "ok").count(), 2 * 6, "{masked:?}");

    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("seed = 3", "seed = 3\non_failure = \"reward\"\nfailure_reward = -1.0");
    std::fs::write(&config, text).unwrap();
    let rewarded = dir.path().join("rewarded");
    let out = train(&config, &rewarded);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for line in metrics(&rewarded) {
        assert_eq!(line["failures"]["trap"], 6, "{line}");
        assert_eq!(line["trajectories_masked"], 0, "{line}");
        assert_eq!(line["groups_unusable"], 0, "{line}");
    }
    let statuses = statuses(&rewarded);
    assert_eq!(statuses.iter().filter(|s| *s == "failed").count(), 2 * 6, "{statuses:?}");
    let rewards: Vec<f64> = std::fs::read_to_string(rewarded.join("rollouts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["status"] == "failed")
        .map(|r| r["reward"].as_f64().unwrap())
        .collect();
    assert!(rewards.iter().all(|&r| r == -1.0), "{rewards:?}");
}

/// A step whose every reward call failed shows no reward figures (`reward 0.000 pass 0.000`
/// read as a model that scored nothing): it says there was no scored trajectory, names the
/// failures, and records `trajectories_scored = 0`.
#[test]
fn a_step_where_every_reward_call_failed_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "config = { trap_always = true }", 1, 0.01);
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no scored trajectory"), "{stderr}");
    assert!(stderr.contains("every completion's reward call failed (12 trap)"), "{stderr}");
    assert!(!stderr.contains("reward 0.000"), "{stderr}");
    let line = &metrics(&run)[0];
    assert_eq!(line["trajectories_scored"], 0, "{line}");
    assert_eq!(line["trajectories_masked"], 12, "{line}");
}

#[test]
fn config_errors_name_the_file_the_key_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 1, 0.01);
    let text = std::fs::read_to_string(&config).unwrap();
    let run = dir.path().join("run");
    let cases = [
        (text.replace("[eval]", "[eval]\nflavour = 1"), "flavour"),
        (text.replace("steps = 1", "steps = \"many\""), "steps"),
        (text.replace(HOSTILE, "/nonexistent/reward.wasm"), "rewards[0].plugin"),
        (text.replace("group_size = 6", "group_size = 1"), "grpo.group_size"),
        (text.replace("seed = 3", "seed = 3\nfailure_reward = 0.5"), "grpo.on_failure = \"reward\""),
    ];
    for (bad, key) in cases {
        std::fs::write(&config, bad).unwrap();
        let out = train(&config, &run);
        assert!(!out.status.success());
        let error = String::from_utf8_lossy(&out.stderr);
        assert!(error.contains("train.toml") && error.contains(key), "expected `{key}` in: {error}");
    }
}

/// A run stopped after its checkpoint and resumed gives the metrics of an uninterrupted run
/// with the same seed; a half-written checkpoint beside it is never loaded.
#[test]
fn a_resumed_run_equals_an_uninterrupted_one() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 4, 0.01);
    let text = std::fs::read_to_string(&config).unwrap().replace("seed = 3", "seed = 3\ncheckpoint_every = 2");
    std::fs::write(&config, text).unwrap();
    let whole = dir.path().join("whole");
    assert!(train(&config, &whole).status.success());
    // A fresh run into a directory that holds one is refused; nothing there is touched.
    let metrics_before = std::fs::read(whole.join("metrics.jsonl")).unwrap();
    let again = train(&config, &whole);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("--resume"));
    assert_eq!(std::fs::read(whole.join("metrics.jsonl")).unwrap(), metrics_before);

    let parts = dir.path().join("parts");
    let first = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg(&config)
        .args(["--steps", "2", "--run-dir"])
        .arg(&parts)
        .output()
        .unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    assert!(parts.join("checkpoints/step-000002/model/model.safetensors").is_file());
    // What a run killed while writing its next checkpoint leaves behind.
    std::fs::create_dir_all(parts.join("checkpoints/.step-000003.partial/model")).unwrap();
    let resumed = resume(&parts, 4);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert!(String::from_utf8_lossy(&resumed.stderr).contains("resuming"));

    let (a, b) = (metrics(&whole), metrics(&parts));
    assert_eq!(a.len(), 4);
    assert_eq!(b.len(), 4);
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(deterministic(x), deterministic(y));
    }
    let rollouts = |d: &Path| std::fs::read_to_string(d.join("rollouts.jsonl")).unwrap();
    assert_eq!(rollouts(&whole), rollouts(&parts));

    // `wirl eval` scores a checkpoint on the held-out tasks.
    let eval = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("eval")
        .arg(&config)
        .arg("--model")
        .arg(parts.join("checkpoints/step-000004/model"))
        .args(["--tasks", "3", "--output"])
        .arg(parts.join("eval.jsonl"))
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let result: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(result["tasks"], 3);
    let per_task = std::fs::read_to_string(parts.join("eval.jsonl")).unwrap();
    assert_eq!(per_task.lines().count(), 3, "one line per task: {per_task}");
    assert!(result["greedy_pass_rate"].as_f64().is_some_and(|p| (0.0..=1.0).contains(&p)), "{result}");
}

/// Tasks from a JSONL dataset instead of an environment plugin (what `wirl tasks` writes);
/// a bad line is a skipped task whose reason names the file and the line.
#[test]
fn training_on_a_jsonl_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let tasks = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["tasks", "--plugin", ARITHMETIC, "--count", "3", "--config", "shots=false"])
        .output()
        .unwrap();
    assert!(tasks.status.success());
    std::fs::write(dir.path().join("train.jsonl"), &tasks.stdout).unwrap();
    std::fs::write(dir.path().join("eval.jsonl"), &tasks.stdout).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let start = text.find("[environment]").unwrap();
    let end = text.find("[[rewards]]").unwrap();
    let text = format!(
        "{}[dataset]\ntrain = \"train.jsonl\"\neval = \"eval.jsonl\"\n\n{}",
        &text[..start],
        &text[end..].replace("tasks = 0", "tasks = 2")
    );
    std::fs::write(&config, &text).unwrap();
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(metrics(&run).len(), 2);
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert!(summary["held_out_pass_rate_before"].is_number(), "{summary}");

    // A line that is not a task is that task's failure: skipped, recorded with the file and
    // the line, replaced; the other lines train.
    let good = String::from_utf8_lossy(&tasks.stdout).lines().next().unwrap().to_string();
    std::fs::write(dir.path().join("train.jsonl"), format!("{good}\nnot json\n")).unwrap();
    let run2 = dir.path().join("run2");
    let out = train(&config, &run2);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rollouts = std::fs::read_to_string(run2.join("rollouts.jsonl")).unwrap();
    let skipped: Vec<serde_json::Value> = rollouts
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r.get("skipped_task").is_some())
        .collect();
    assert!(!skipped.is_empty(), "{rollouts}");
    let reason = skipped[0]["reason"].as_str().unwrap();
    assert!(reason.contains("train.jsonl") && reason.contains("line 2") && reason.contains("not JSON"), "{reason}");

    // Held out likewise: a line that is no task, and one whose prompt cannot fit the model,
    // are left out of `wirl eval` each with its reason; the lines around them are evaluated.
    let mut long: serde_json::Value = serde_json::from_str(&good).unwrap();
    long["task"]["messages"][1]["content"] = "w2 ".repeat(4000).into();
    std::fs::write(dir.path().join("eval.jsonl"), format!("{good}\nnot json\n{long}\n{good}\n")).unwrap();
    let eval = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("eval")
        .arg(&config)
        .args(["--tasks", "4", "--output"])
        .arg(dir.path().join("eval-results.jsonl"))
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let result: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(result["tasks"], 2, "{result}");
    let skipped = result["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 2, "{result}");
    assert_eq!((&skipped[0]["index"], &skipped[1]["index"]), (&1.into(), &2.into()), "{result}");
    let reason = skipped[0]["reason"].as_str().unwrap();
    assert!(reason.contains("eval.jsonl") && reason.contains("line 2"), "{reason}");
    assert!(skipped[1]["reason"].as_str().unwrap().contains("does not fit the model's context"), "{result}");
    assert_eq!(skipped[1]["id"], long["task"]["id"], "{result}");
}

/// `model.device_sampling = true`: the sampler draws its tokens where the logits are, and a
/// run samples what the host sampler samples given the same draws (the tiny model's tokens
/// are nowhere near a rounding boundary of the running sums) — the same rollouts, step after
/// step; a value that is not a boolean is refused naming the key.
#[test]
fn a_run_sampling_on_the_device_rolls_out_what_the_host_sampler_does() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let rollouts = |run: &str, set: &[&str]| {
        let mut args = vec!["--eval-tasks", "0"];
        args.extend(set);
        let out = train_with(&config, &dir.path().join(run), &args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = std::fs::read_to_string(dir.path().join(run).join("rollouts.jsonl")).unwrap();
        // Everything but timings.
        text.lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                if let Some(o) = v.as_object_mut() {
                    o.retain(|k, _| !k.contains("time") && !k.ends_with("_s") && !k.ends_with("_ms"));
                }
                v
            })
            .collect::<Vec<_>>()
    };
    let host = rollouts("host", &[]);
    let device = rollouts("device", &["--set", "model.device_sampling=true"]);
    assert!(!host.is_empty());
    assert_eq!(host, device);
    let out = train_with(&config, &dir.path().join("bad"), &["--set", "model.device_sampling=yes"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("device_sampling"), "{said}");
}

/// Every objective trains end to end (`grpo.loss`, `grpo.advantage`, `grpo.kl_estimator`,
/// DAPO's overlong shaping, truncated completions masked: two steps each, every loss finite,
/// and each run's losses differ from GRPO's — the objective reached the loss); a value that is not one is refused naming the key and
/// what it may be, before any run directory is made.
#[test]
fn every_objective_trains_and_bad_ones_are_refused_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.05);
    let losses = |run: &str, set: &[&str]| -> Vec<f64> {
        let steps = trained_with_sets(&config, &dir.path().join(run), set, &[]);
        assert_eq!(steps.len(), 2, "{run}");
        steps.iter().map(|s| s["loss"].as_f64().filter(|l| l.is_finite()).expect("a finite loss")).collect()
    };
    let grpo = losses("grpo", &[]);
    for (run, set) in [
        ("gspo", &["grpo.loss=gspo", "grpo.aggregation=sequence-mean"][..]),
        ("cispo", &["grpo.loss=cispo", "grpo.clip_high=4"]),
        ("sapo", &["grpo.loss=sapo", "grpo.sapo_temperature_neg=2"]),
        ("rloo", &["grpo.advantage=rloo"]),
        ("k2", &["grpo.beta=0.04", "grpo.kl_estimator=k2"]),
        // Completions of 3 to 6 tokens lose up to their whole reward (the length reward's
        // order flips); those cut at 6 tokens train nothing.
        ("overlong", &["grpo.overlong_buffer=3", "grpo.overlong_penalty=100"]),
        ("masked", &["grpo.mask_truncated=true"]),
        ("reinforce++", &["grpo.advantage=reinforce++"]),
        ("reinforce++-baseline", &["grpo.advantage=reinforce++-baseline"]),
        ("pass@k", &["grpo.advantage=pass@k"]),
    ] {
        let theirs = losses(run, set);
        assert_ne!(theirs, grpo, "{run}: the same losses as GRPO's");
    }
    for (set, said) in [
        ("grpo.loss=ppo", "expected one of `grpo`, `gspo`, `cispo`, `sapo`"),
        ("grpo.sapo_temperature_pos=2", "`grpo.sapo_temperature_pos` = 2 with `grpo.loss` = \"grpo\""),
        // TRL's loss_type names that are not losses here say what they are.
        ("grpo.loss=dr_grpo", "set grpo.preset = \"dr_grpo\""),
        ("grpo.loss=bnpo", "grpo.aggregation = \"token-mean\""),
        ("grpo.advantage=loo", "`rloo`, `reinforce++`, `reinforce++-baseline`"),
        ("grpo.kl_estimator=k4", "`k3`"),
        ("grpo.overlong_buffer=6", "less than `sampling.max_tokens` = 6"),
        (
            "grpo.overlong={ buffer = 3, penalty = -1 }",
            "`grpo.overlong.penalty` = -1: it must be a number from 0 to 1e6",
        ),
    ] {
        let out = train_with(&config, &dir.path().join("bad"), &["--set", set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(set) && stderr.contains(said), "{set}: {stderr}");
    }
    // REINFORCE++ whitens over every rank's tokens: two ranks train as one trainer does.
    let out = train_with(
        &config,
        &dir.path().join("reinforce++-ranks"),
        &["--eval-tasks", "0", "--dp", "2", "--set", "grpo.advantage=reinforce++"],
    );
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (one, two) = (metrics(&dir.path().join("reinforce++")), metrics(&dir.path().join("reinforce++-ranks")));
    for (a, b) in one.iter().zip(&two) {
        let (la, lb) = (a["loss"].as_f64().unwrap(), b["loss"].as_f64().unwrap());
        assert!((la - lb).abs() < 1e-4 * la.abs().max(1.0), "REINFORCE++ on two ranks: loss {lb}, one trainer {la}");
        assert_eq!(a["groups_kept"], b["groups_kept"]);
    }
    let out = train_with(&config, &dir.path().join("bad"), &["--set", "grpo.kl_estimator=k1", "--set", "grpo.beta=0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("no KL term to estimate"), "{stderr}");
    assert!(!dir.path().join("bad").exists());
}

/// DAPO's dynamic sampling: the reward fails every odd task (NaN: its group is masked, no
/// signal), so each step's first draw of two tasks holds one group with signal; the step
/// draws again (tasks and seeds of their own) and trains two groups, recording two draws
/// and every group it rolled. With `max_draws = 1` the cap holds: one draw, one group
/// trained, recorded. Without dynamic sampling nothing changes.
#[test]
fn dynamic_sampling_draws_until_the_step_has_groups_with_signal() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "config = { nan_odd_tasks = true }", 2, 0.01);
    let run = |name: &str, set: &[&str], extra: &[&str]| trained_with_sets(&config, &dir.path().join(name), set, extra);
    let groups_rolled = |name: &str| {
        let text = std::fs::read_to_string(dir.path().join(name).join("rollouts.jsonl")).unwrap();
        let tasks: std::collections::BTreeSet<String> = text
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter_map(|r| r["task"].as_str().map(str::to_string))
            .collect();
        tasks.len()
    };
    let plain = run("plain", &[], &[]);
    assert!(plain.iter().all(|s| s["groups_kept"] == 1 && s["draws"] == 1), "{plain:?}");
    let dynamic = run("dynamic", &["grpo.dynamic_sampling=true"], &[]);
    assert!(dynamic.iter().all(|s| s["groups_kept"] == 2 && s["draws"] == 2), "{dynamic:?}");
    assert!(groups_rolled("plain") == 4, "two steps of two tasks");
    assert_eq!(groups_rolled("dynamic"), 8, "every drawn group is recorded");
    // Two ranks make the same draws, each rolling its share, and train the same groups as
    // one trainer; with a generation lag too (the first draw sampled during the update
    // before, the extra ones by the step's own weights).
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name).join("rollouts.jsonl")).unwrap();
    let ranked = run("ranked", &["grpo.dynamic_sampling=true"], &["--dp", "2"]);
    assert!(read("dynamic") == read("ranked"), "two ranks rolled other groups than one trainer");
    assert!(ranked.iter().all(|s| s["groups_kept"] == 2 && s["draws"] == 2), "{ranked:?}");
    let lagged = ["grpo.dynamic_sampling=true", "grpo.generation_lag=1"];
    run("lagged", &lagged, &[]);
    run("lagged-ranked", &lagged, &["--dp", "2"]);
    assert!(read("lagged") == read("lagged-ranked"), "with a lag, two ranks rolled other groups than one trainer");
    let capped = run("capped", &["grpo.dynamic_sampling=true", "grpo.max_draws=1"], &[]);
    assert!(capped.iter().all(|s| s["groups_kept"] == 1 && s["draws"] == 1), "{capped:?}");
    // The step line says the draws and the groups kept; the capped one warns.
    let said = |name: &str, sets: &[&str]| {
        let mut args = vec!["--eval-tasks", "0"];
        args.extend(sets.iter().flat_map(|set| ["--set", set]));
        let out = train_with(&config, &dir.path().join(name), &args);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let drew = said("said", &["grpo.dynamic_sampling=true"]);
    assert!(drew.matches("  draws 2 (kept 2)  |").count() == 2, "{drew}");
    let short = said("said-capped", &["grpo.dynamic_sampling=true", "grpo.max_draws=1"]);
    assert!(short.contains("1 of 2 groups have a signal after 1 draw (grpo.max_draws)"), "{short}");
    assert!(!short.contains("draws 1"), "one draw is not said on the step line: {short}");
    let out = train_with(&config, &dir.path().join("bad"), &["--set", "grpo.max_draws=0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("grpo.max_draws"), "{stderr}");
}

/// `grpo.preset`: a paper's combination of keys. In a file it fills the `[grpo]` keys the
/// file does not set (an explicit `clip_high` wins over DAPO's 0.28); `--set grpo.preset=…`
/// sets its keys (Dr. GRPO's mean-only advantages and constant aggregation). Both train; an
/// unknown preset is refused naming the key and the presets there are.
#[test]
fn presets_fill_what_a_config_leaves_and_unknown_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let text =
        std::fs::read_to_string(&config).unwrap().replace("[grpo]\n", "[grpo]\npreset = \"dapo\"\nclip_high = 0.3\n");
    let dapo = dir.path().join("dapo.toml");
    std::fs::write(&dapo, text).unwrap();
    let resolved = |run: &str| -> toml::Table {
        toml::from_str(&std::fs::read_to_string(dir.path().join(run).join("config.resolved.toml")).unwrap()).unwrap()
    };
    let out = train_with(&dapo, &dir.path().join("dapo"), &["--eval-tasks", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let grpo = resolved("dapo")["grpo"].clone();
    // Written in the tables' spelling, a parameter at its default left out.
    let loss = grpo["loss"].as_table().unwrap();
    assert_eq!(loss["clip_high"].as_float(), Some(0.3), "the file's own key wins");
    assert_eq!((loss["kind"].as_str(), loss.get("clip_low")), (Some("grpo"), None), "clip_low: the default, 0.2");
    assert_eq!(grpo["kl"]["where"].as_str(), Some("off"));
    assert_eq!(grpo["dynamic_sampling"].as_bool(), Some(true));
    assert_eq!(grpo["overlong"]["buffer"].as_integer(), Some(1), "a fifth of max_tokens = 6");
    let out = train_with(&config, &dir.path().join("dr"), &["--eval-tasks", "0", "--set", "grpo.preset=dr_grpo"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let grpo = resolved("dr")["grpo"].clone();
    assert_eq!(grpo["advantage"].as_str(), Some("mean-only"));
    assert_eq!(grpo["aggregation"].as_str(), Some("constant"));
    let out = train_with(&config, &dir.path().join("bad"), &["--set", "grpo.preset=ppo"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("`grpo.preset` = \"ppo\"") && stderr.contains("\"dapo\""),
        "{stderr}"
    );
}

/// A resume that would train nothing says so (users of other trainers report resumes that
/// silently did nothing): a finished run, resumed, loads nothing and leaves its records as
/// they were, saying how to train further; a resume to fewer steps than its newest
/// checkpoint holds is refused, untouched (its summary would claim steps the weights do not
/// have); more steps train on; a run stopped before its summary finishes it.
#[test]
fn a_resume_that_would_train_nothing_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let run = dir.path().join("run");
    assert!(train(&config, &run).status.success());
    let records = |run: &Path| {
        ["metrics.jsonl", "rollouts.jsonl", "summary.json"].map(|name| std::fs::read(run.join(name)).unwrap())
    };
    let before = records(&run);
    let plain =
        std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).args(["train", "--resume"]).arg(&run).output().unwrap();
    let said = String::from_utf8_lossy(&plain.stderr);
    assert!(plain.status.success() && said.contains("finished: all 2 steps trained"), "{said}");
    assert!(said.contains("--steps N, with N more than 2") && !said.contains("loading"), "{said}");
    assert!(records(&run) == before, "a finished run's records changed");
    let fewer = resume(&run, 1);
    let said = String::from_utf8_lossy(&fewer.stderr);
    assert!(!fewer.status.success() && said.contains("1 steps asked") && said.contains("has done 2"), "{said}");
    assert!(records(&run) == before, "a refused resume changed the records");
    let more = resume(&run, 3);
    assert!(more.status.success(), "{}", String::from_utf8_lossy(&more.stderr));
    assert_eq!(metrics(&run).len(), 3);
    // Stopped after its last checkpoint but before its summary: the resume summarizes it.
    std::fs::remove_file(run.join("summary.json")).unwrap();
    let finish = resume(&run, 3);
    assert!(finish.status.success(), "{}", String::from_utf8_lossy(&finish.stderr));
    assert_eq!(metrics(&run).len(), 3);
    let summary: serde_json::Value = serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 3, "{summary}");
}

/// `model.chat_template_kwargs`: the variables reach every prompt the run renders (a
/// template that writes a three-word greeting first: three more prompt positions per
/// sampled prompt, every step); a name the template gets from wirl is refused by key.
#[test]
fn chat_template_variables_reach_the_training_prompts() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let template = "{% if greeting is defined %}{{ greeting }} {% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    let tokenizer_config = serde_json::json!({"chat_template": template, "eos_token": "</s>"});
    std::fs::write(dir.path().join("model/tokenizer_config.json"), tokenizer_config.to_string()).unwrap();
    let positions = |m: &serde_json::Value| m["prompt_positions_computed"].as_u64().unwrap();
    let plain = trained_with_sets(&config, &dir.path().join("plain"), &[], &[]);
    let greeted = trained_with_sets(
        &config,
        &dir.path().join("greeted"),
        &["model.chat_template_kwargs={greeting = \"a b c\"}"],
        &[],
    );
    for (a, b) in plain.iter().zip(&greeted) {
        assert!(
            positions(b) > positions(a) && (positions(b) - positions(a)) % 3 == 0,
            "{} vs {}",
            positions(a),
            positions(b)
        );
    }
    let resolved = std::fs::read_to_string(dir.path().join("greeted/config.resolved.toml")).unwrap();
    assert!(
        resolved.contains("[model.chat_template_kwargs]") && resolved.contains("greeting = \"a b c\""),
        "{resolved}"
    );
    let out =
        train_with(&config, &dir.path().join("bad"), &["--set", "model.chat_template_kwargs={bos_token = \"x\"}"]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("`model.chat_template_kwargs`: `bos_token` is the template's own"),
        "{said}"
    );
}

/// `grpo.rollout_correction` as TRL's `vllm_importance_sampling_mode`: with the bounds pinched
/// to exactly 1, a sampler sharing the trainer's f32 weights masks nothing (every ratio is
/// exactly 1: the same bits), while a bf16 sampler copy has tokens masked — and the update
/// then differs from the uncorrected one.
#[test]
fn the_rollout_correction_weighs_only_a_sampler_that_differs() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let pinched = [
        "grpo.rollout_correction=\"token_mask\"",
        "grpo.rollout_correction_min=1.0",
        "grpo.rollout_correction_max=1.0",
    ];
    let cut = |m: &serde_json::Value| m["tis_truncated"].as_f64().unwrap_or_else(|| panic!("{m}"));
    if wirl_engine::invariant::available() {
        let shared = trained_with_sets(&config, &dir.path().join("f32"), &pinched, &[]);
        assert!(shared.iter().all(|m| cut(m) == 0.0), "{shared:?}");
    }
    let bf16 = [&pinched[..], &["model.inference_dtype=bf16"]].concat();
    let corrected = trained_with_sets(&config, &dir.path().join("bf16"), &bf16, &[]);
    let first = cut(&corrected[0]);
    assert!(first > 0.05 && first <= 1.0, "a bf16 sampler has tokens outside [1, 1]: {first}");
    let plain = trained_with_sets(&config, &dir.path().join("plain"), &["model.inference_dtype=bf16"], &[]);
    assert_eq!(cut(&plain[0]), 0.0);
    assert_ne!(corrected[0]["loss"], plain[0]["loss"], "masked tokens carry no policy loss");
}

/// `sampler_logp_diff_mean` / `_max`: the trainer's log-probs of the sampled tokens against
/// the sampler's, on the weights that sampled them. Sharing the trainer's f32 weights they
/// are the same bits (issue 61: `wirl_engine::invariant`; within rounding on a CPU without
/// AVX2 and FMA); a bf16 copy of the weights
/// (`model.inference_dtype`) shows its precision loss, thousands of times larger — what a
/// sampler that does not run the policy looks like. A lagged step has none to compare (its
/// sampler ran older weights); two ranks report the step's. TensorBoard has them too.
#[test]
fn the_samplers_log_probs_are_checked_against_the_trainers() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "", 2, 0.01);
    let gap = |m: &serde_json::Value| {
        let field = |key: &str| m[key].as_f64().unwrap_or_else(|| panic!("no {key}: {m}"));
        (field("sampler_logp_diff_mean"), field("sampler_logp_diff_max"))
    };
    let bound = if wirl_engine::invariant::available() { 0.0 } else { 1e-4 };
    let shared = trained_with_sets(&config, &dir.path().join("f32"), &[], &[]);
    for m in &shared {
        let (mean, max) = gap(m);
        assert!(max <= bound && mean <= max, "step {}: mean {mean}, max {max}", m["step"]);
    }
    let copy = trained_with_sets(&config, &dir.path().join("bf16"), &["model.inference_dtype=bf16"], &[]);
    for (a, b) in shared.iter().zip(&copy) {
        let ((f32_mean, _), (bf16_mean, bf16_max)) = (gap(a), gap(b));
        assert!(bf16_mean > 1e-4 && bf16_mean > 100.0 * f32_mean && bf16_max >= bf16_mean, "{f32_mean} vs {bf16_mean}");
    }
    let lagged = trained_with_sets(&config, &dir.path().join("lag"), &["grpo.generation_lag=1"], &[]);
    assert!(lagged[0]["sampler_logp_diff_mean"].is_number(), "{}", lagged[0]);
    assert!(lagged[1]["sampler_logp_diff_mean"].is_null() && lagged[1]["sampler_lag"] == 1, "{}", lagged[1]);
    let ranks = trained_with_sets(&config, &dir.path().join("ranks"), &[], &["--dp", "2"]);
    for (one, two) in shared.iter().zip(&ranks) {
        let ((a, _), (b, max)) = (gap(one), gap(two));
        assert!(max <= bound && (a - b).abs() < 1e-7, "one rank {a}, two {b} (max {max})");
    }
    let events: Vec<_> =
        std::fs::read_dir(dir.path().join("bf16/tensorboard")).unwrap().map(|e| e.unwrap().path()).collect();
    let scalars = wirl_trainer::tensorboard::read_scalars(&events[0]).unwrap();
    let tags: Vec<&str> = scalars[1].1.iter().map(|(t, _)| t.as_str()).collect();
    assert!(tags.contains(&"sampler/logp_diff_mean") && tags.contains(&"sampler/logp_diff_max"), "{tags:?}");
}
