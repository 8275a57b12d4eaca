//! The training layer as a whole: the default job's numbers held against a fixture made
//! before the loop moved out of the CLI (issue 13), so that no restructuring moves them.

use std::path::Path;

const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/default-job-2-steps.json");

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
            for key in ["time_s", "generate_tokens_per_s", "peak_rss_mib"] {
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

/// Equal, except that floats may differ by a relative 1e-3 (another CPU's vector width
/// reorders f32 sums in the loss and gradient norm; sampled tokens and rewards stay exact).
fn assert_close(path: &str, expected: &serde_json::Value, actual: &serde_json::Value) {
    use serde_json::Value;
    match (expected, actual) {
        (Value::Number(a), Value::Number(b)) if a.is_f64() || b.is_f64() => {
            let (a, b) = (a.as_f64().unwrap(), b.as_f64().unwrap());
            assert!((a - b).abs() <= 1e-3 * a.abs().max(b.abs()) + 1e-6, "{path}: fixture {a}, this run {b}");
        }
        (Value::Object(a), Value::Object(b)) => {
            let keys = |o: &serde_json::Map<String, Value>| o.keys().cloned().collect::<Vec<_>>();
            assert_eq!(keys(a), keys(b), "{path}: keys");
            for (key, value) in a {
                assert_close(&format!("{path}.{key}"), value, &b[key]);
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
/// held-out tasks: the same completions, rewards and losses as the fixture. Regenerate it
/// only on purpose, for a change meant to move the numbers: `WIRL_WRITE_FIXTURE=1 cargo test
/// default_job`.
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
    if std::env::var_os("WIRL_WRITE_FIXTURE").is_some() {
        std::fs::write(FIXTURE, serde_json::to_string_pretty(&record).unwrap() + "\n").unwrap();
    }
    let fixture: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(FIXTURE).unwrap()).unwrap();
    assert_eq!(record["rollouts"].as_array().unwrap().len(), 2 * 4 * 8);
    assert_close("run", &fixture, &record);
}
