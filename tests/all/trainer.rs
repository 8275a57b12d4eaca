//! The training layer as a whole: the default job's numbers held against a fixture made
//! before the loop moved out of the CLI (issue 13), so that no restructuring moves them.

use std::path::Path;
use wirl_test_artifacts::{ARITHMETIC, HOSTILE};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures");

/// This CPU's data and unified cache sizes, and AVX-512 where it has it
/// (`l1d48K-l21024K-l332768K-avx512`): the matrix products block their sums by the caches
/// and pick their kernels by the vector width, so another CPU generation adds f32 terms in
/// another order and, from the first logit that moves a sample, draws other tokens.
fn cpu_fingerprint() -> String {
    let mut parts = Vec::new();
    for index in 0..8 {
        let dir = std::path::PathBuf::from(format!("/sys/devices/system/cpu/cpu0/cache/index{index}"));
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_string());
        let (Ok(level), Ok(kind), Ok(size)) = (read("level"), read("type"), read("size")) else { continue };
        if kind != "Instruction" {
            parts.push(format!("l{level}{}{size}", if kind == "Data" { "d" } else { "" }));
        }
    }
    #[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
    if std::arch::is_x86_feature_detected!("avx512f") {
        parts.push("avx512".to_string());
    }
    parts.join("-")
}

/// The default job's fixture for this machine: the one made on a CPU with this fingerprint
/// (`default-job-2-steps.<fingerprint>.json`) where there is one, else the first one made.
/// `WIRL_WRITE_FIXTURE=1` rewrites the one this machine reads, `WIRL_WRITE_FIXTURE=machine`
/// makes one for this machine's fingerprint.
fn fixture_path() -> std::path::PathBuf {
    let dir = Path::new(FIXTURES);
    let this_machine = dir.join(format!("default-job-2-steps.{}.json", cpu_fingerprint()));
    let writing_this_machine = std::env::var_os("WIRL_WRITE_FIXTURE").is_some_and(|v| v == "machine");
    if writing_this_machine || this_machine.exists() { this_machine } else { dir.join("default-job-2-steps.json") }
}

/// What of a run is deterministic: each step's metrics without timings and memory, every
/// rollout without the plugins' sha256 (a rebuilt guest may differ in bytes, not in scores),
/// and the held-out pass rate before and after.
fn deterministic_record(run: &Path) -> serde_json::Value {
    let read = |name: &str| std::fs::read_to_string(run.join(name)).unwrap();
    let metrics: Vec<serde_json::Value> = read("metrics.jsonl")
        .lines()
        .map(|line| {
            let mut m: serde_json::Value = serde_json::from_str(line).unwrap();
            let object = m.as_object_mut().unwrap();
            for key in ["time_s", "generate_tokens_per_s", "peak_rss_mib", "peak_rss_mib_by_phase"] {
                object.remove(key);
            }
            m
        })
        .collect();
    let rollouts: Vec<serde_json::Value> = read("rollouts.jsonl")
        .lines()
        .map(|line| {
            let mut r: serde_json::Value = serde_json::from_str(line).unwrap();
            r.as_object_mut().unwrap().remove("plugins");
            r
        })
        .collect();
    let summary: serde_json::Value = serde_json::from_str(&read("summary.json")).unwrap();
    serde_json::json!({
        "metrics": metrics,
        "rollouts": rollouts,
        "held_out_before": summary["held_out_pass_rate_before"],
        "held_out_after": summary["held_out_pass_rate_after"],
    })
}

/// A run's metrics without timings, speeds and memory.
fn deterministic_metrics(run: &Path) -> Vec<serde_json::Value> {
    crate::grpo::metrics(run)
        .into_iter()
        .map(|mut m| {
            for key in ["time_s", "generate_tokens_per_s", "peak_rss_mib", "peak_rss_mib_by_phase"] {
                m.as_object_mut().unwrap().remove(key);
            }
            m
        })
        .collect()
}

/// `wirl train CONFIG --run-dir DIR/NAME` with `--set` overrides; the run directory.
fn train_with(config: &Path, dir: &Path, name: &str, sets: &[&str]) -> std::path::PathBuf {
    let run = dir.join(name);
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"));
    command.arg("train").arg(config).arg("--run-dir").arg(&run);
    for set in sets {
        command.args(["--set", set]);
    }
    let out = command.output().unwrap();
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    run
}

/// Equal, except that floats may differ by a relative 1e-3 (another CPU's vector width
/// reorders f32 sums in the loss and gradient norm; sampled tokens and rewards stay exact),
/// and that records may have gained keys the fixture does not know (every key it has must
/// be there, with its value).
fn assert_close(path: &str, expected: &serde_json::Value, actual: &serde_json::Value) {
    use serde_json::Value;
    match (expected, actual) {
        (Value::Number(a), Value::Number(b)) if a.is_f64() || b.is_f64() => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() <= 1e-3 * a.abs().max(b.abs()) + 1e-6, "{path}: fixture {a}, this run {b}");
        }
        (Value::Object(a), Value::Object(b)) => {
            for (key, value) in a {
                let actual = b.get(key).unwrap_or_else(|| panic!("{path}: no `{key}` in this run"));
                assert_close(&format!("{path}.{key}"), value, actual);
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            assert_eq!(a.len(), b.len(), "{path}: length");
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert_close(&format!("{path}[{i}]"), x, y);
            }
        }
        _ => assert_eq!(expected, actual, "{path}"),
    }
}

/// The default job (real model, real plugins, KL reference on), 2 seeded steps and 4
/// held-out tasks: the same completions, rewards and losses as the fixture ([`fixture_path`]:
/// one per CPU fingerprint). Regenerate it only on purpose, for a change meant to move the
/// numbers: `WIRL_WRITE_FIXTURE=1 cargo test default_job` (and so every fixture there is).
#[test]
fn the_default_jobs_numbers_hold() {
    crate::engine::default_model();
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/train/default.toml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", config, "--steps", "2", "--eval-tasks", "4", "--run-dir"])
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let record = deterministic_record(&run);
    let fixture_path = fixture_path();
    if std::env::var_os("WIRL_WRITE_FIXTURE").is_some() {
        std::fs::write(&fixture_path, serde_json::to_string_pretty(&record).unwrap() + "\n").unwrap();
    }
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&fixture_path).unwrap()).unwrap();
    assert_eq!(record["rollouts"].as_array().unwrap().len(), 2 * 4 * 8);
    eprintln!("fixture {} (this CPU: {})", fixture_path.display(), cpu_fingerprint());
    assert_close("run", &fixture, &record);
}

/// A `[[tasks]]` config on the tiny model (given a context of 1024): two weighted
/// environment tasks (3:1, the second with its own seed, kind and `max_tokens`) sharing the
/// top-level reward, a multi-turn task (the arithmetic environment's retry episodes, up to 3
/// turns, weight 1), and an `eval_only` dataset task. Returns the config's path.
pub(crate) fn write_multitask_config(dir: &Path, steps: usize) -> std::path::PathBuf {
    let legacy = crate::grpo::write_config(dir, "", steps, 0.01);
    let model = dir.join("model");
    let model_config = std::fs::read_to_string(model.join("config.json")).unwrap();
    std::fs::write(
        model.join("config.json"),
        model_config.replace("\"max_position_embeddings\":64", "\"max_position_embeddings\":1024"),
    )
    .unwrap();
    let tasks = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["tasks", "--plugin", ARITHMETIC, "--count", "2", "--seed", "9", "--config", "shots=false"])
        .output()
        .unwrap();
    assert!(tasks.status.success());
    std::fs::write(dir.join("held.jsonl"), &tasks.stdout).unwrap();
    let config = format!(
        r#"
[model]
path = {model:?}

[[rewards]]
plugin = {HOSTILE:?}

[[tasks]]
name = "sums"
weight = 3
[tasks.environment]
plugin = {ARITHMETIC:?}
config = {{ shots = false }}

[[tasks]]
name = "mixed"
weight = 1
[tasks.environment]
plugin = {ARITHMETIC:?}
seed = 7
config = {{ shots = false, kind = "basic_arithmetic" }}
[tasks.sampling]
max_tokens = 3

[[tasks]]
name = "retry"
max_turns = 3
[tasks.environment]
plugin = {ARITHMETIC:?}
seed = 11
config = {{ shots = false, attempts = 3 }}

[[tasks]]
name = "held"
eval_only = true
[tasks.dataset]
eval = "held.jsonl"

[sampling]
max_tokens = 6

[grpo]
steps = {steps}
prompts_per_step = 5
group_size = 4
learning_rate = 0.01
beta = 0.0
seed = 3
checkpoint_every = 1

[eval]
tasks = 2
"#
    );
    std::fs::write(&legacy, config).unwrap();
    legacy
}

/// The prefix cache changes no sample of a multi-turn run: the multitask run (its retry
/// task's episodes take 3 turns) with the cache on (the default for a multi-turn task) and
/// off writes the same rollouts, and its losses agree within 1e-4 relative (not bit for bit:
/// a cached position's keys were computed in another batch shape, so the sampler's
/// log-probs, which the loss's importance weights read, differ in their last bits). The
/// cached run took the later turns' earlier positions from the cache and computed fewer.
#[test]
fn the_prefix_cache_changes_no_sample_of_a_multi_turn_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_multitask_config(dir.path(), 2);
    let train = |run: &Path, extra: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("train")
            .arg(&config)
            .arg("--run-dir")
            .arg(run)
            .args(extra)
            .output()
            .unwrap();
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let (on, off) = (dir.path().join("on"), dir.path().join("off"));
    train(&on, &[]);
    train(&off, &["--set", "model.prefix_cache_mib=0"]);
    let read = |run: &Path| std::fs::read_to_string(run.join("rollouts.jsonl")).unwrap();
    assert_eq!(read(&on), read(&off));
    let (on, off) = (crate::grpo::metrics(&on), crate::grpo::metrics(&off));
    for (with, without) in on.iter().zip(&off) {
        assert!(with["prompt_positions_cached"].as_u64().unwrap() > 0, "{with}");
        assert_eq!(without["prompt_positions_cached"], 0, "{without}");
        let computed = |line: &serde_json::Value| line["prompt_positions_computed"].as_u64().unwrap();
        assert!(computed(with) < computed(without), "{} vs {}", computed(with), computed(without));
        let (a, b) = (with["loss"].as_f64().unwrap(), without["loss"].as_f64().unwrap());
        assert!((a - b).abs() <= 1e-4 * a.abs().max(1e-3), "loss {a} vs {b}");
    }
}

/// Weighted multi-task: each step gives the tasks 3, 1 and 1 groups (Megatron's rule), each
/// task's groups are sampled with its own settings and recorded under its name; the
/// multi-turn task's episodes run 3 turns with the environment's feedback between; the
/// `eval_only` task is evaluated, never trained on; `--resume` of the multi-task, multi-turn
/// run equals an uninterrupted one.
#[test]
fn a_weighted_multitask_run_records_each_task_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_multitask_config(dir.path(), 2);
    let whole = dir.path().join("whole");
    let out = crate::grpo::train(&config, &whole);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metrics = crate::grpo::metrics(&whole);
    assert_eq!(metrics.len(), 2);
    for line in &metrics {
        let tasks = line["tasks"].as_object().unwrap();
        assert_eq!(tasks.keys().collect::<Vec<_>>(), ["mixed", "retry", "sums"], "{line}");
        assert_eq!((tasks["sums"]["groups"].as_u64(), tasks["mixed"]["groups"].as_u64()), (Some(3), Some(1)));
        assert_eq!(tasks["retry"]["groups"], 1);
        // The tiny model never solves it: each of the 4 episodes takes 2 more turns.
        assert_eq!(line["episode_turns"], 4 * 2, "{line}");
        // Their tokens are counted apart from the first turns' (per-token turn times).
        let (all, later) = (line["completion_tokens"].as_u64().unwrap(), line["episode_tokens"].as_u64().unwrap());
        assert!(later > 0 && later < all, "{later} of {all} tokens in later turns: {line}");
    }
    let rollouts: Vec<serde_json::Value> = std::fs::read_to_string(whole.join("rollouts.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rollouts.len(), 2 * 5 * 4);
    let of = |name: &str| rollouts.iter().filter(|r| r["task_name"] == name).collect::<Vec<_>>();
    assert_eq!(
        (of("sums").len(), of("mixed").len(), of("retry").len(), of("held").len()),
        (2 * 3 * 4, 2 * 4, 2 * 4, 0)
    );
    for episode in of("retry") {
        assert_eq!(episode["turns"], 3, "{episode}");
        let conversation = episode["conversation"].as_array().unwrap();
        assert_eq!(conversation.len(), 5, "{episode}");
        assert_eq!(conversation[1]["role"], "user");
        assert!(episode["tokens"].as_u64().unwrap() <= 3 * 6, "model tokens only: {episode}");
    }
    assert!(of("mixed").iter().all(|r| r["tokens"].as_u64().unwrap() <= 3), "the task's own max_tokens");
    assert!(of("sums").iter().any(|r| r["tokens"].as_u64().unwrap() > 3), "the run's max_tokens");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(whole.join("summary.json")).unwrap()).unwrap();
    let by_task = summary["held_out_by_task"].as_object().unwrap();
    assert_eq!(by_task.keys().collect::<Vec<_>>(), ["held", "mixed", "retry", "sums"], "{summary}");

    // Stopped after step 1 (its checkpoint), resumed to step 2: the same records.
    let parts = dir.path().join("parts");
    let first = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg(&config)
        .args(["--steps", "1", "--run-dir"])
        .arg(&parts)
        .output()
        .unwrap();
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let resume = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["train", "--steps", "2", "--resume"])
            .arg(&parts)
            .output()
            .unwrap()
    };
    // The run recorded its dataset's fingerprint; edited, the dataset is refused on resume
    // (its rows would not be the ones the run read), restored, it resumes.
    let manifest = std::fs::read_to_string(parts.join("manifests/000000.json")).unwrap();
    assert!(manifest.contains("held.jsonl") && manifest.contains("sha256"), "{manifest}");
    let held = dir.path().join("held.jsonl");
    let original = std::fs::read(&held).unwrap();
    std::fs::write(&held, [&original[..], b"\n"].concat()).unwrap();
    let refused = resume();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("held.jsonl: changed since the run read it"), "{said}");
    std::fs::write(&held, &original).unwrap();
    let resumed = resume();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let read = |run: &Path, name: &str| std::fs::read_to_string(run.join(name)).unwrap();
    assert_eq!(read(&whole, "rollouts.jsonl"), read(&parts, "rollouts.jsonl"));
    assert_eq!(deterministic_metrics(&whole), deterministic_metrics(&parts));
    let summary_of = |run: &Path| -> serde_json::Value { serde_json::from_str(&read(run, "summary.json")).unwrap() };
    assert_eq!(summary_of(&whole)["held_out_by_task"], summary_of(&parts)["held_out_by_task"]);

    // `wirl eval` on the same config: every task's held-out problems, a line each, per task.
    let eval = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("eval")
        .arg(&config)
        .arg("--output")
        .arg(dir.path().join("eval.jsonl"))
        .output()
        .unwrap();
    assert!(eval.status.success(), "{}", String::from_utf8_lossy(&eval.stderr));
    let result: serde_json::Value = serde_json::from_slice(&eval.stdout).unwrap();
    assert_eq!(result["tasks"], 8, "{result}");
    assert_eq!(result["by_task"]["held"]["tasks"], 2, "{result}");
}

/// `[[tasks]]` mistakes are errors naming the file, the key and what to do; weights that
/// `grpo.prompts_per_step` cannot follow exactly are a warning giving the groups.
#[test]
fn multitask_config_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_multitask_config(dir.path(), 1);
    let text = std::fs::read_to_string(&config).unwrap();
    let run = dir.path().join("run");
    let cases = [
        (text.replace("prompts_per_step = 5", "prompts_per_step = 2"), "prompts_per_step to at least 3"),
        (text.replace("max_turns = 3", "max_turns = 0"), "`tasks[2].max_turns` = 0"),
        (text.replace("max_turns = 3", "max_turns = 1000"), "`tasks[2].max_turns` = 1000"),
        (
            text.replace("max_turns = 3\n", "max_turns = 3\n[[tasks.rewards]]\nplugin = \"x.wasm\"\n"),
            "is scored by its environment's episodes",
        ),
        (text.replace("name = \"mixed\"", "name = \"sums\""), "`tasks[1].name`: two tasks are named"),
        (text.replace("name = \"mixed\"", "name = \"a b\""), "`tasks[1].name`"),
        (text.replace("weight = 1\n", "weight = -1.0\n"), "`tasks[1].weight` = -1"),
        (text.replace("weight = 3", "weight = nan"), "`tasks[0].weight` = NaN"),
        (
            text.replace("weight = 3", "weight = 0")
                .replace("weight = 1\n", "weight = 0\n")
                .replace("max_turns = 3\n", "max_turns = 3\nweight = 0\n"),
            "no task is trained on",
        ),
        (text.replace("max_tokens = 3", "max_tokens = 0"), "`tasks[1].sampling.max_tokens`"),
        (text.replace("max_tokens = 3", "temperature = inf"), "`tasks[1].sampling.temperature`"),
        (text.replace("max_tokens = 3", "flavour = 3"), "flavour"),
        (format!("[environment]\nplugin = {ARITHMETIC:?}\n{text}"), "[tasks.environment]"),
        (text.replace("eval_only = true", "eval_only = false"), "`tasks[3].dataset` has no `train` file"),
        (text.replace("[tasks.dataset]\neval = \"held.jsonl\"", ""), "has no source"),
        (text.replace(HOSTILE, "/nonexistent/reward.wasm"), "`rewards[0].plugin`"),
        (text.replace(HOSTILE, "builtin:nope"), "builtin:nope is not a built-in plugin; the built-ins are"),
    ];
    for (bad, expected) in cases {
        std::fs::write(&config, &bad).unwrap();
        let out = crate::grpo::train(&config, &run);
        let error = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "accepted:\n{bad}");
        assert!(error.contains("train.toml") && error.contains(expected), "expected `{expected}` in: {error}");
        assert!(!run.join("config.resolved.toml").exists(), "a refused config leaves no run");
    }
    // 1:1:1 over 4 groups: 2, 1 and 1, said so.
    let uneven = text.replace("weight = 3", "weight = 1").replace("prompts_per_step = 5", "prompts_per_step = 4");
    std::fs::write(&config, uneven).unwrap();
    let out = crate::grpo::train(&config, &run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot follow the task weights exactly") && stderr.contains("sums 2, mixed 1, retry 1"),
        "{stderr}"
    );
}

/// `examples/train/multitask.toml` as shipped (its real plugins, few-shot prompts, the
/// word problems' Parquet file, the retry episodes), on the tiny model given a context that
/// holds them: one step, each task evaluated, plotted.
#[test]
fn the_multitask_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir_all(&model).unwrap();
    crate::engine::write_tiny_model(&model, false);
    let config = std::fs::read_to_string(model.join("config.json")).unwrap();
    std::fs::write(
        model.join("config.json"),
        config.replace("\"max_position_embeddings\":64", "\"max_position_embeddings\":4096"),
    )
    .unwrap();
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/train/multitask.toml");
    let run = dir.path().join("run");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", example, "--steps", "1", "--eval-tasks", "1", "--model"])
        .arg(&model)
        .arg("--run-dir")
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let metrics = crate::grpo::metrics(&run);
    let tasks = &metrics[0]["tasks"];
    assert_eq!((tasks["sums"]["groups"].as_u64(), tasks["word-problems"]["groups"].as_u64()), (Some(2), Some(1)));
    assert_eq!(tasks["retry"]["groups"], 1);
    assert!(metrics[0]["episode_turns"].as_u64().unwrap() > 0, "the retry episodes went on: {}", metrics[0]);
    let rollouts = std::fs::read_to_string(run.join("rollouts.jsonl")).unwrap();
    assert!(rollouts.contains("\"task\":\"word-problems/train/"), "rows of the Parquet dataset");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["held_out_by_task"].as_object().unwrap().len(), 4, "{summary}");
    let plot = std::process::Command::new(env!("CARGO_BIN_EXE_wirl")).arg("plot").arg(&run).output().unwrap();
    assert!(plot.status.success(), "{}", String::from_utf8_lossy(&plot.stderr));
    assert!(std::fs::read(run.join("tasks.png")).unwrap().starts_with(b"\x89PNG"));
    // TensorBoard's event file: the version record, then the step with per-task scalars.
    let events: Vec<_> = std::fs::read_dir(run.join("tensorboard")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(events.len(), 1, "{events:?}");
    let scalars = wirl_trainer::tensorboard::read_scalars(&events[0]).unwrap();
    assert_eq!(scalars.len(), 2);
    assert_eq!(scalars[1].0, 1);
    let tags: Vec<&str> = scalars[1].1.iter().map(|(t, _)| t.as_str()).collect();
    for tag in ["reward/mean", "loss/loss", "tasks/sums/reward_mean", "tasks/retry/pass_rate"] {
        assert!(tags.contains(&tag), "{tag} in {tags:?}");
    }
}

/// `examples/train/NAME` as shipped, one step on the tiny model written in `model_dir`,
/// evaluated on two tasks, with `extra` arguments: the run's metrics and summary.
pub(crate) fn run_example(name: &str, model_dir: &Path, extra: &[&str]) -> (Vec<serde_json::Value>, serde_json::Value) {
    let (metrics, summary, _) = run_example_logged(name, model_dir, extra);
    (metrics, summary)
}

/// [`run_example`], with what the run wrote to stderr.
pub(crate) fn run_example_logged(
    name: &str,
    model_dir: &Path,
    extra: &[&str],
) -> (Vec<serde_json::Value>, serde_json::Value, String) {
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/train").join(name);
    let run = model_dir.join("run");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg(&example)
        .args(["--steps", "1", "--eval-tasks", "2"])
        .args(extra)
        .arg("--model")
        .arg(model_dir)
        .arg("--run-dir")
        .arg(&run)
        .output()
        .unwrap();
    assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
    let summary = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    (crate::grpo::metrics(&run), summary, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The step's line on stderr, and in it the seconds that follow `name` (`gen 1.2s` → "1.2").
pub(crate) fn step_line_seconds<'a>(log: &'a str, name: &str) -> Option<&'a str> {
    let line = log.lines().find(|l| l.starts_with("step "))?;
    let after = line.split(&format!(" {name} ")).nth(1)?;
    after.split('s').next()
}

/// `examples/train/multiturn.toml` as shipped, on the tiny model: one step of retry
/// episodes, their later turns run, evaluated as greedy episodes.
#[test]
fn the_multiturn_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    crate::multiturn::write_tiny_model_with_context(dir.path(), 4096);
    let (metrics, summary, log) = run_example_logged("multiturn.toml", dir.path(), &[]);
    assert!(metrics[0]["episode_turns"].as_u64().unwrap() > 0, "{}", metrics[0]);
    // The later turns' time is on the step's line, not only in metrics.jsonl.
    let seconds = metrics[0]["time_s"]["episodes"].as_f64().unwrap();
    assert!(seconds > 0.0, "{}", metrics[0]);
    assert_eq!(step_line_seconds(&log, "episodes"), Some(format!("{seconds:.1}").as_str()), "{log}");
    assert!(summary["held_out_pass_rate_after"].is_number(), "{summary}");
}

/// `examples/train/word-problems.toml` as shipped (the GPU issue's learning run: built-in
/// reward, the checkout's Parquet files), on the tiny model: one step, evaluated.
#[test]
fn the_word_problems_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    crate::multiturn::write_tiny_model_with_context(dir.path(), 4096);
    let (metrics, summary) = run_example("word-problems.toml", dir.path(), &["--set", "sampling.max_tokens=8"]);
    assert_eq!(metrics[0]["tasks"]["word-problems"]["groups"], 4, "{}", metrics[0]);
    assert!(summary["held_out_pass_rate_after"].is_number(), "{summary}");
}

/// `examples/train/math-latex.toml` as shipped (a JSONL dataset of LaTeX answers scored by
/// builtin:math-verify), on the tiny model: one step, evaluated, every completion scored (the
/// tiny model's text is no answer, a 0 with its verdict — never a failed call).
#[test]
fn the_math_latex_example_runs() {
    let dir = tempfile::tempdir().unwrap();
    crate::multiturn::write_tiny_model_with_context(dir.path(), 4096);
    let (metrics, summary) = run_example("math-latex.toml", dir.path(), &["--set", "sampling.max_tokens=8"]);
    assert_eq!(metrics[0]["tasks"]["dataset"]["groups"], 4, "{}", metrics[0]);
    assert_eq!(metrics[0]["failures"], serde_json::json!({}), "{}", metrics[0]);
    assert_eq!(metrics[0]["parts"]["no_answer"], 1.0, "{}", metrics[0]);
    assert!(summary["held_out_pass_rate_after"].is_number(), "{summary}");
}

/// `grpo.overlap` (each group scored as soon as its samples finish, the next step's tasks
/// drawn during the update) changes no number: the multitask run (two environment tasks,
/// a multi-turn one, an eval-only dataset) records the same metrics and rollouts with it
/// off; with it on, every step after the first found its tasks already drawn.
#[test]
fn overlapping_the_phases_changes_no_number() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_multitask_config(dir.path(), 3);
    let on = train_with(&config, dir.path(), "on", &[]);
    let off = train_with(&config, dir.path(), "off", &["grpo.overlap=false"]);
    assert_eq!(deterministic_metrics(&on), deterministic_metrics(&off));
    let read = |run: &Path| std::fs::read_to_string(run.join("rollouts.jsonl")).unwrap();
    assert_eq!(read(&on), read(&off));
    let draws = |run: &Path| -> Vec<f64> {
        crate::grpo::metrics(run).iter().map(|m| m["time_s"]["draw"].as_f64().unwrap()).collect()
    };
    // Drawn ahead, a step records no drawing time of its own (exactly 0, not a timing).
    let draws = draws(&on);
    assert!(draws[1..].iter().all(|&d| d == 0.0), "{draws:?}");
}

/// `grpo.generation_lag = 1`: step 1 is the serial run's; every later step trains on groups
/// sampled during the previous update by the weights before it (its rollouts' weights
/// version one behind the serial run's), weighted by the truncated importance ratio. Not
/// for multi-turn tasks; the keys' bad values are refused by name.
#[test]
fn a_generation_lag_samples_the_next_step_during_the_update() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::grpo::write_config(dir.path(), "", 3, 0.01);
    let serial = train_with(&config, dir.path(), "serial", &[]);
    let lagged = train_with(&config, dir.path(), "lagged", &["grpo.generation_lag=1"]);
    let rollouts = |run: &Path| -> Vec<serde_json::Value> {
        std::fs::read_to_string(run.join("rollouts.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let versions = |run: &Path| -> Vec<u64> {
        let rollouts = rollouts(run);
        (1..=3)
            .map(|step| rollouts.iter().find(|r| r["step"] == step).unwrap()["weights_version"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(versions(&serial), [0, 1, 2]);
    assert_eq!(versions(&lagged), [0, 0, 1]);
    let first = |run: &Path| rollouts(run).into_iter().filter(|r| r["step"] == 1).collect::<Vec<_>>();
    assert_eq!(first(&serial), first(&lagged), "step 1 samples with the same weights and seeds");
    let lags =
        |run: &Path| crate::grpo::metrics(run).iter().map(|m| m["sampler_lag"].as_u64().unwrap()).collect::<Vec<_>>();
    assert_eq!(lags(&serial), [0, 0, 0]);
    assert_eq!(lags(&lagged), [0, 1, 1]);
    for line in crate::grpo::metrics(&lagged) {
        assert!(line["loss"].as_f64().unwrap().is_finite(), "{line}");
        let truncated = line["tis_truncated"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&truncated), "{line}");
    }

    let refused = |config: &Path, set: &str, expected: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("train")
            .arg(config)
            .args(["--set", set, "--run-dir"])
            .arg(dir.path().join("refused"))
            .output()
            .unwrap();
        let error = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && error.contains(expected), "{set}: expected `{expected}` in: {error}");
    };
    refused(&config, "grpo.generation_lag=2", "`grpo.generation_lag` = 2");
    refused(&config, "grpo.tis_cap=0.5", "`grpo.correction.tis_cap` = 0.5");
    refused(&config, "grpo.tis_cap=nan", "`grpo.correction.tis_cap` = NaN");
    let multitask = write_multitask_config(&dir.path().join("multi"), 1);
    refused(&multitask, "grpo.generation_lag=1", "task `retry` (tasks[2]) is a multi-turn task");
}

/// `examples/train/code-io.toml` as shipped (stdin/stdout problems in Lua, scored by
/// builtin:code-tests in the Lua runner), on the tiny model: one step, evaluated, every
/// completion scored — the tiny model's text is no program, a 0 with its reason, never a
/// failed call.
#[test]
fn the_code_io_example_runs_its_programs_in_the_lua_runner() {
    let dir = tempfile::tempdir().unwrap();
    crate::multiturn::write_tiny_model_with_context(dir.path(), 4096);
    let (metrics, summary) = run_example("code-io.toml", dir.path(), &["--set", "sampling.max_tokens=8"]);
    // Scored by code-tests (its parts), each completion run as a program and failing its first case.
    assert_eq!(metrics[0]["parts"]["passed"], 0.0, "{}", metrics[0]);
    assert_eq!(metrics[0]["tasks"]["dataset"]["groups"], 4, "{}", metrics[0]);
    assert_eq!(metrics[0]["failures"], serde_json::json!({}), "{}", metrics[0]);
    assert!(summary["held_out_pass_rate_after"].is_number(), "{summary}");
}
