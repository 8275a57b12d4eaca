//! Reward-plugin throughput: `math-answer` over (completion, answer) pairs in three modes —
//! a fresh instance per call, one reused instance, one batched call per group of 8 — with
//! instantiate and call latency percentiles and the component's cold and warm load time.
//!
//! Run with: `bash benches/reward.sh` (makes the pairs and runs the Python peer beside it).
//! Directly: `cargo bench -p wirl-cli --bench reward -- PAIRS.jsonl [PLUGIN.wasm]` (default:
//! the Rust `math-answer`; benches/languages.sh passes each language's build); prints one
//! JSON line.

use std::time::{Duration, Instant};
use wirl_sandbox::{Limits, PluginSpec, RewardPlugin, Sandbox, SandboxSettings, Task};

const GROUP: usize = 8;

fn main() {
    // `cargo bench` appends `--bench` to the arguments: only the positional ones count.
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--")).collect();
    let pairs_path = args.first().cloned().expect("usage: reward PAIRS.jsonl [PLUGIN] (from benches/reward.sh)");
    let pairs: Vec<(String, String)> = std::fs::read_to_string(&pairs_path)
        .unwrap()
        .lines()
        .map(|line| {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            (v["completion"].as_str().unwrap().to_string(), v["answer"].as_str().unwrap().to_string())
        })
        .collect();
    let tasks: Vec<Task> = pairs
        .iter()
        .enumerate()
        .map(|(i, (_, answer))| Task {
            id: i.to_string(),
            messages: Vec::new(),
            answer: Some(answer.clone()),
            metadata: None,
        })
        .collect();
    let n = pairs.len();
    let plugin_path = args.get(1).cloned().unwrap_or_else(|| wirl_test_artifacts::MATH_ANSWER.to_string());
    let plugin_path = plugin_path.as_str();

    // Load times: cold compiles into an empty cache, warm deserializes the cached code.
    let cache = tempfile::tempdir().unwrap();
    let settings = SandboxSettings { cache_dir: Some(cache.path().to_path_buf()), ..Default::default() };
    let sandbox = Sandbox::new(settings).unwrap();
    let started = Instant::now();
    sandbox.load(PluginSpec::new(plugin_path)).unwrap();
    let cold = started.elapsed();
    let started = Instant::now();
    let plugin = sandbox.load(PluginSpec::new(plugin_path)).unwrap();
    let warm = started.elapsed();

    // Fresh instance per call.
    let mut reward = RewardPlugin::new(plugin.clone()).unwrap();
    let (mut instantiate, mut call) = (Vec::with_capacity(n), Vec::with_capacity(n));
    let started = Instant::now();
    let mut total = 0.0f64;
    for ((completion, _), task) in pairs.iter().zip(&tasks) {
        total += f64::from(reward.score(task, completion).unwrap().reward);
        let stats = reward.last_call();
        instantiate.push(stats.instantiate);
        call.push(stats.call);
    }
    let fresh = started.elapsed();

    // One instance reused across calls.
    let reused_spec =
        PluginSpec { limits: Limits { reuse_instance: true, ..Limits::default() }, ..PluginSpec::new(plugin_path) };
    let mut reused_reward = RewardPlugin::new(sandbox.load(reused_spec).unwrap()).unwrap();
    let mut reused_call = Vec::with_capacity(n);
    let started = Instant::now();
    let mut reused_total = 0.0f64;
    for ((completion, _), task) in pairs.iter().zip(&tasks) {
        reused_total += f64::from(reused_reward.score(task, completion).unwrap().reward);
        reused_call.push(reused_reward.last_call().call);
    }
    let reused = started.elapsed();

    // One call per group of 8 completions of one task (a fresh instance per group), as the
    // trainer scores a GRPO group. The pairs have distinct answers, so each group is scored
    // against its first task's answer here: the work per completion is the same.
    let started = Instant::now();
    let mut batched_scored = 0usize;
    for (chunk, task) in pairs.chunks(GROUP).zip(tasks.iter().step_by(GROUP)) {
        let completions: Vec<String> = chunk.iter().map(|(c, _)| c.clone()).collect();
        batched_scored += reward.score_group(task, &completions).iter().filter(|v| v.is_ok()).count();
    }
    let batched = started.elapsed();
    assert_eq!(batched_scored, n);

    // The same groups into the reused instance: what the guest's scoring itself costs.
    let started = Instant::now();
    for (chunk, task) in pairs.chunks(GROUP).zip(tasks.iter().step_by(GROUP)) {
        let completions: Vec<String> = chunk.iter().map(|(c, _)| c.clone()).collect();
        reused_reward.score_group(task, &completions);
    }
    let reused_batched = started.elapsed();
    assert_eq!(total, reused_total, "fresh and reused instances score alike");

    let per_sec = |d: Duration| n as f64 / d.as_secs_f64();
    let report = serde_json::json!({
        "bench": "reward_math_answer",
        "pairs": n,
        "threads": 1,
        "reward_sum": total,
        "fresh_per_s": per_sec(fresh).round(),
        "reused_per_s": per_sec(reused).round(),
        "batched8_per_s": per_sec(batched).round(),
        "reused_batched8_per_s": per_sec(reused_batched).round(),
        "fresh_instantiate_us": percentiles(&mut instantiate),
        "fresh_call_us": percentiles(&mut call),
        "reused_call_us": percentiles(&mut reused_call),
        "load_cold_ms": cold.as_secs_f64() * 1e3,
        "load_warm_ms": warm.as_secs_f64() * 1e3,
        "component_bytes": plugin.size(),
    });
    println!("{report}");
}

fn percentiles(samples: &mut [Duration]) -> serde_json::Value {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize].as_secs_f64() * 1e6;
    serde_json::json!({ "p50": (at(0.5) * 100.0).round() / 100.0, "p99": (at(0.99) * 100.0).round() / 100.0 })
}
