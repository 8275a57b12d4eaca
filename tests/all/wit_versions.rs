//! `wirl:rl@0.2.0` beside 0.1.0: a 0.2.0 reward (`plugins/tests/step-aware`, built with the
//! Rust SDK's `reward-v0-2`) is linked against 0.2.0 and told the run's progress; a 0.1.0
//! reward beside it in the same scorers and the same run scores as it always did.

use crate::sandbox;
use wirl_rollout::{FailurePolicy, PluginRef, RewardSource, RewardSpec, Scorers};
use wirl_sandbox::{Progress, World};
use wirl_test_artifacts::{EXACT_MATCH, STEP_AWARE, WORD_JUDGE};

pub(crate) fn reward(path: &str, config: serde_json::Value) -> RewardSpec {
    let plugin = PluginRef {
        path: path.into(),
        stored: None,
        config: config.as_object().cloned().unwrap_or_default(),
        deadline_ms: None,
        memory_mib: None,
    };
    let inference = Default::default();
    RewardSpec {
        source: RewardSource::Plugin { plugin, code_runner: None, inference, judge: Default::default() },
        weight: 1.0,
    }
}

#[test]
fn a_0_2_0_reward_loads_as_the_reward_world_of_its_version() {
    let (sandbox, _cache) = sandbox();
    let plugin = crate::load(&sandbox, STEP_AWARE);
    assert_eq!((plugin.world(), plugin.wit_version()), (World::RewardPlugin, "0.2.0"));
    let old = crate::load(&sandbox, EXACT_MATCH);
    assert_eq!((old.world(), old.wit_version()), (World::RewardPlugin, "0.1.0"));
}

/// In one set of scorers: the 0.2.0 plugin rewards the step it is told (its config's
/// `scale` read through 0.2.0's `config`), the whole group in one call; the 0.1.0 plugin
/// beside it gives its own verdicts, whatever the step.
#[test]
fn a_0_2_0_reward_is_told_the_step_beside_a_0_1_0_reward() {
    let (sandbox, _cache) = sandbox();
    let specs = [reward(STEP_AWARE, serde_json::json!({"scale": 2.0})), reward(EXACT_MATCH, serde_json::json!({}))];
    let mut scorers = Scorers::load(&sandbox, &specs).unwrap();
    let task = crate::task("t", Some("Paris"));
    let completions = ["Paris".to_string(), "Rome".to_string(), "Paris".to_string()];
    let policy = FailurePolicy::default();
    for (progress, step_reward) in [(Progress { step: 3, steps: 10 }, 6.0), (Progress { step: 7, steps: 10 }, 14.0)] {
        let scored = scorers.score_group(&task, &completions, policy, progress);
        for (completion, score) in completions.iter().zip(&scored) {
            assert!(score.failures.is_empty(), "{score:?}");
            let exact = if completion == "Paris" { 1.0 } else { 0.0 };
            assert_eq!(score.reward, step_reward + exact, "{completion} at {progress:?}: {score:?}");
            assert_eq!(score.parts["step"], progress.step as f32);
            assert_eq!(score.parts["steps"], 10.0);
            assert_eq!(score.parts["group"], 3.0, "the group in one call");
        }
    }
    let outside = scorers.score_group(&task, &completions[..1], policy, Progress::OUTSIDE_TRAINING);
    assert_eq!((outside[0].reward, outside[0].parts["steps"]), (1.0, 0.0));
}

/// A training run with both: each step's rollouts carry the step the 0.2.0 plugin was told,
/// so its reward changes with the step; the 0.1.0 plugin's parts are there beside it.
#[test]
fn a_step_aware_reward_changes_with_the_step_of_a_training_run() {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("\n[[rewards]]\nplugin = {STEP_AWARE:?}\nweight = 0.5\nconfig = {{ scale = 4 }}\n");
    let config = crate::grpo::write_config(dir.path(), &extra, 2, 0.01);
    let run = dir.path().join("run");
    let out = crate::grpo::train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rollouts = crate::grpo::rollouts(&run);
    let scored: Vec<_> = rollouts.iter().filter(|r| r.get("completion").is_some()).collect();
    assert_eq!(scored.len(), 24, "two steps of two groups of six");
    for rollout in scored {
        let step = rollout["step"].as_f64().unwrap();
        assert_eq!(rollout["parts"]["step"].as_f64(), Some(step), "{rollout}");
        assert_eq!(rollout["parts"]["steps"].as_f64(), Some(2.0), "{rollout}");
        let names: Vec<&str> =
            rollout["plugins"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
        assert!(names.contains(&"step_aware") && names.contains(&"hostile"), "{names:?}");
    }
}

/// A 0.2.0 judge (`plugins/tests/word-judge`) asks the engine about each completion of a group in
/// one call, within its `[[rewards]]` budget: its replies are the engine's own greedy
/// replies, cut at each conversation's share of the tokens; a budget too small for one token
/// each is refused to the plugin (its completions fail, naming `inference_tokens`), and
/// without an engine (`wirl score`) the call is refused too — never a 0.
#[test]
fn a_0_2_0_judge_asks_the_engine_within_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), false);
    let loaded = wirl_engine::load(dir.path(), &wirl_engine::LoadOptions::default()).unwrap();
    let context = loaded.config.context();
    let tokenizer = std::sync::Arc::new(loaded.tokenizer);
    let (handle, _thread) =
        wirl_engine::EngineHandle::spawn(std::sync::Arc::new(loaded.model), tokenizer.clone()).unwrap();
    let engine = wirl_rollout::RewardEngine {
        handle: handle.clone(),
        tokenizer: tokenizer.clone(),
        context,
        seed: 3,
        usage: Default::default(),
    };
    let (sandbox, _cache) = sandbox();
    let judge = |tokens: u64| {
        let mut spec = reward(WORD_JUDGE, serde_json::json!({"max_tokens": 6}));
        if let RewardSource::Plugin { inference, .. } = &mut spec.source {
            *inference = wirl_rollout::InferenceBudget { calls: 2, tokens };
        }
        Scorers::load(&sandbox, &[spec]).unwrap()
    };
    let mut task = crate::task("t", None);
    task.messages = vec![wirl_sandbox::Message::new("user", "w5 w6")];
    let completions: Vec<String> = ["w7", "w8 w9", "w10"].map(String::from).to_vec();
    let policy = FailurePolicy::default();
    let progress = Progress { step: 1, steps: 1 };

    // 9 tokens for 3 conversations: 3 each, though the judge asked for 6.
    let mut scorers = judge(9);
    scorers.set_engine(Some(engine.clone()));
    let scored = scorers.score_group(&task, &completions, policy, progress);
    for (completion, score) in completions.iter().zip(&scored) {
        assert!(score.failures.is_empty(), "{score:?}");
        let conversation = wirl_sandbox::Task {
            messages: vec![wirl_sandbox::Message::new("user", format!("w5 w6 {completion}"))],
            ..crate::task("judged", None)
        };
        let prompt = wirl_rollout::prompt_ids(&tokenizer, &conversation).unwrap();
        let sampling = wirl_engine::Sampling { max_tokens: 3, temperature: 0.0, ..Default::default() };
        let request = wirl_engine::GenerateRequest { prompt, n: 1, sampling };
        let theirs = handle.generate_blocking(request).unwrap().remove(0);
        assert!(theirs.tokens.len() <= 3);
        assert_eq!(score.notes["word_judge"], theirs.text, "the judge's reply is the engine's greedy reply");
        assert_eq!(score.reward, theirs.text.split_whitespace().count() as f32);
    }
    assert!(scored.iter().any(|s| s.reward > 0.0), "the engine said nothing: {scored:?}");

    let mut starved = judge(2);
    starved.set_engine(Some(engine));
    for score in starved.score_group(&task, &completions, policy, progress) {
        assert_eq!(score.failures, ["guest_error"], "{score:?}");
        assert!(score.notes["word_judge"].contains("inference_tokens"), "{score:?}");
    }
    let mut unplugged = judge(9);
    for score in unplugged.score_group(&task, &completions, policy, progress) {
        assert_eq!(score.failures, ["guest_error"], "{score:?}");
        assert!(score.notes["word_judge"].contains("no model to call here"), "{score:?}");
    }
}

/// In `wirl train` a 0.2.0 judge reaches the engine being trained (every rollout judged, none
/// failed); `wirl score`, which has no model, refuses its calls with the reason.
#[test]
fn a_judge_scores_a_training_run_and_wirl_score_says_it_has_no_model() {
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "\n[[rewards]]\nplugin = {WORD_JUDGE:?}\ninference_tokens = 60\nconfig = {{ max_tokens = 4 }}\nweight = 0.1\n"
    );
    let config = crate::grpo::write_config(dir.path(), &extra, 1, 0.01);
    // The held-out evaluations (before the first step and after the last) judge too.
    let text = std::fs::read_to_string(&config).unwrap().replace("tasks = 0", "tasks = 2");
    std::fs::write(&config, text).unwrap();
    let run = dir.path().join("run");
    let out = crate::grpo::train(&config, &run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("no model to call here"), "a judge went without the engine: {stderr}");
    let rollouts = crate::grpo::rollouts(&run);
    let scored: Vec<_> = rollouts.iter().filter(|r| r.get("completion").is_some() && r["step"] != 0).collect();
    assert_eq!(scored.len(), 12);
    for rollout in &scored {
        assert_eq!(rollout["failures"], serde_json::json!([]), "{rollout}");
        let words = rollout["parts"]["judge_words"].as_f64().unwrap();
        assert!(words <= 4.0, "cut at its max_tokens: {rollout}");
    }
    assert!(scored.iter().any(|r| r["parts"]["judge_words"].as_f64().unwrap() > 0.0));

    let line = r#"{"task": {"id": "q", "messages": [], "answer": null}, "completion": "w5"}"#;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["score", "--plugin", WORD_JUDGE])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(line.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("guest_error") && stdout.contains("no model to call here"), "{stdout}");
}

/// `wirl serve --config` with a model: a served task's 0.2.0 judge asks the served model
/// (`/v1/score` answers with its verdicts, none failed).
#[test]
fn a_served_tasks_judge_asks_the_served_model() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), false);
    let config = dir.path().join("served.toml");
    let text = format!(
        "[[tasks]]\nname = \"judged\"\n[tasks.dataset]\ntrain = \"tasks.jsonl\"\n[[tasks.rewards]]\nplugin = {WORD_JUDGE:?}\n\
         inference_tokens = 8\nconfig = {{ max_tokens = 2 }}\n"
    );
    std::fs::write(&config, text).unwrap();
    std::fs::write(
        dir.path().join("tasks.jsonl"),
        "{\"id\": \"u\", \"messages\": [{\"role\": \"user\", \"content\": \"w5\"}]}\n",
    )
    .unwrap();
    let server = crate::serve::Server::start_model(dir.path(), &["--config", config.to_str().unwrap()]);
    let body = serde_json::json!({"task": "judged", "problem": {"prompt": "w5 w6"}, "completions": ["w7", "w8"]});
    let (status, scored) = server.post("/v1/score", &body.to_string());
    assert_eq!(status, 200, "{scored}");
    for score in scored["scores"].as_array().unwrap() {
        assert_eq!(score["failures"], serde_json::json!([]), "{scored}");
        assert!(score["parts"]["judge_words"].as_f64().unwrap() <= 2.0, "{scored}");
    }
}
