//! One reward, several languages: every build of `math-answer` (Rust, Python, JavaScript, C)
//! gives identical scores, parts and notes on a 1,000-line fixture (tests/fixtures/
//! math-answer-cases.jsonl: Unicode, very long completions, missing tags, several numbers),
//! and each language's plugin behaves alike on config and on a task it cannot score.

use crate::task;
use std::sync::OnceLock;
use wirl_sandbox::{Limits, PluginSpec, RewardPlugin, Sandbox, SandboxSettings, Score, Task};
use wirl_test_artifacts::{C_MATH_ANSWER, JS_MATH_ANSWER, MATH_ANSWER, PYTHON_MATH_ANSWER};

const BUILDS: [(&str, &str); 4] =
    [("rust", MATH_ANSWER), ("python", PYTHON_MATH_ANSWER), ("js", JS_MATH_ANSWER), ("c", C_MATH_ANSWER)];

/// A sandbox whose compiled-component cache is kept in the target directory: the Python and
/// JavaScript components (interpreters inside) are compiled once, not per test.
fn sandbox() -> &'static Sandbox {
    static SANDBOX: OnceLock<Sandbox> = OnceLock::new();
    SANDBOX.get_or_init(|| {
        let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("components");
        Sandbox::new(SandboxSettings { cache_dir: Some(cache), ..Default::default() }).unwrap()
    })
}

fn reward(path: &str, config: &[(&str, serde_json::Value)]) -> RewardPlugin {
    let mut spec = PluginSpec {
        // One instance per language for the 1,000 lines (scoring does not depend on it).
        limits: Limits { reuse_instance: true, deadline_ms: 10_000, ..Limits::default() },
        ..PluginSpec::new(path)
    };
    spec.config = config.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    RewardPlugin::new(sandbox().load(spec).unwrap()).unwrap()
}

fn cases() -> Vec<(Task, String)> {
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/math-answer-cases.jsonl"))
            .unwrap();
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            (serde_json::from_value(value["task"].clone()).unwrap(), value["completion"].as_str().unwrap().to_string())
        })
        .collect()
}

#[test]
fn every_language_scores_the_fixture_identically() {
    let cases = cases();
    assert_eq!(cases.len(), 1000);
    assert!(cases.iter().any(|(_, c)| c.len() > 10_000), "the fixture has very long completions");
    let scored: Vec<(&str, Vec<Score>)> = BUILDS
        .iter()
        .map(|(language, path)| {
            let mut plugin = reward(path, &[]);
            let scores = cases.iter().map(|(task, completion)| plugin.score(task, completion).unwrap()).collect();
            (*language, scores)
        })
        .collect();
    let (_, rust) = &scored[0];
    let correct = rust.iter().filter(|s| s.reward == 1.0).count();
    assert!((100..900).contains(&correct), "the fixture mixes right and wrong answers: {correct}");
    for (language, scores) in &scored[1..] {
        for (i, (ours, theirs)) in rust.iter().zip(scores).enumerate() {
            assert_eq!(ours, theirs, "line {}: rust vs {language} on {:?}", i + 1, cases[i].1);
        }
    }
}

#[test]
fn every_language_reads_config_and_refuses_a_task_without_answer() {
    let config = [("tolerance", serde_json::json!(0.5)), ("format_weight", serde_json::json!(0.25))];
    for (language, path) in BUILDS {
        let mut plugin = reward(path, &config);
        let score = plugin.score(&task("t", Some("42")), "<answer>41.6</answer>").unwrap();
        assert_eq!((score.reward, score.note.as_deref()), (1.25, Some("answer: 41.6")), "{language}");
        let failure = plugin.score(&task("no-answer", None), "<answer>1</answer>").unwrap_err();
        assert!(failure.message.contains("no-answer"), "{language}: {failure}");
        // A group is scored in one call, the same as one by one.
        let group = plugin.score_group(&task("g", Some("7")), &["7".into(), "<answer>8</answer>".into()]);
        let rewards: Vec<f32> = group.into_iter().map(|s| s.unwrap().reward).collect();
        assert_eq!(rewards, [1.0, 0.25], "{language}");
    }
}

/// `wirl plugin new` in Python, JavaScript and C, as a new user runs it: scaffold, build with
/// scripts/build-plugins, score the example. (A checkout with only what those need.)
#[test]
fn scaffolded_plugins_build_and_score_out_of_the_box() {
    let repo = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let root = tempfile::tempdir().unwrap();
    for part in [
        "wit",
        "scripts/build-plugins",
        "scripts/componentize-c",
        "plugins/python/sdk",
        "plugins/js/sdk",
        "plugins/c/sdk",
    ] {
        let target = root.path().join(part);
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let copied = std::process::Command::new("cp").arg("-r").arg(repo.join(part)).arg(&target).status().unwrap();
        assert!(copied.success(), "copying {part}");
    }
    let wirl = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(args)
            .env("WIRL_CACHE_DIR", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr),
        )
    };
    let root_arg = root.path().to_str().unwrap();
    for language in ["python", "js", "c"] {
        let (ok, said) = wirl(&["plugin", "new", "--lang", language, "my-reward", "--root", root_arg]);
        assert!(ok && said.contains("scripts/build-plugins"), "{said}");
    }
    let (ok, said) = wirl(&["plugin", "new", "--lang", "python", "my-reward", "--root", root_arg]);
    assert!(!ok && said.contains("already exists"), "{said}");
    let (ok, said) = wirl(&["plugin", "new", "--lang", "js", "My Reward", "--root", root_arg]);
    assert!(!ok && said.contains("lowercase"), "{said}");

    let build = std::process::Command::new("bash").arg(root.path().join("scripts/build-plugins")).output().unwrap();
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    for (language, wasm) in [
        ("python", "plugins/target/python/my_reward.wasm"),
        ("js", "plugins/target/js/my_reward.wasm"),
        ("c", "plugins/target/c/my_reward.wasm"),
    ] {
        let plugin = root.path().join(wasm);
        let example = root.path().join(format!("plugins/{language}/my-reward/example.jsonl"));
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["score", "--plugin"])
            .arg(&plugin)
            .arg("--input")
            .arg(&example)
            .env("WIRL_CACHE_DIR", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .unwrap();
        assert!(output.status.success(), "{language}: {}", String::from_utf8_lossy(&output.stderr));
        let rewards: Vec<f64> = String::from_utf8_lossy(&output.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reward"].as_f64().unwrap())
            .collect();
        assert_eq!(rewards, [1.0, 0.0, 1.0], "{language}");
    }
    // The same scaffolds built against wirl:rl@0.2.0 by their world line alone score the same
    // (in C the 0.2.0 helper calls `wirl_reward` per completion when no `wirl_reward_group` is
    // defined).
    for (language, app) in [("python", "app.py"), ("c", "app.c")] {
        let path = root.path().join(format!("plugins/{language}/my-reward/{app}"));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replacen("wirl-world: reward-plugin", "wirl-world: reward-plugin@0.2.0", 1))
            .unwrap();
    }
    let build = std::process::Command::new("bash").arg(root.path().join("scripts/build-plugins")).output().unwrap();
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    let (sandbox, _cache) = crate::sandbox();
    for wasm in ["plugins/target/python/my_reward.wasm", "plugins/target/c/my_reward.wasm"] {
        let plugin = crate::load(&sandbox, root.path().join(wasm).to_str().unwrap());
        assert_eq!(plugin.wit_version(), "0.2.0", "{wasm}");
        let mut plugin = wirl_sandbox::RewardPlugin::new(plugin).unwrap();
        let task = crate::task("t", Some("4"));
        let scored =
            plugin.score_group_at(&task, &["4".to_string(), "5".to_string()], wirl_sandbox::Progress::OUTSIDE_TRAINING);
        let rewards: Vec<f32> = scored.into_iter().map(|s| s.unwrap().reward).collect();
        assert_eq!(rewards, [1.0, 0.0], "{wasm}");
    }
}
