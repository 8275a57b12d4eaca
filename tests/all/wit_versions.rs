//! `wirl:rl@0.2.0` beside 0.1.0: a 0.2.0 reward (`plugins/tests/step-aware`, built with the
//! Rust SDK's `reward-v0-2`) is linked against 0.2.0 and told the run's progress; a 0.1.0
//! reward beside it in the same scorers and the same run scores as it always did.

use crate::sandbox;
use wirl_rollout::{FailurePolicy, PluginRef, RewardSource, RewardSpec, Scorers};
use wirl_sandbox::{Progress, World};
use wirl_test_artifacts::{EXACT_MATCH, STEP_AWARE};

fn reward(path: &str, config: serde_json::Value) -> RewardSpec {
    let plugin = PluginRef {
        path: path.into(),
        stored: None,
        config: config.as_object().cloned().unwrap_or_default(),
        deadline_ms: None,
        memory_mib: None,
    };
    RewardSpec { source: RewardSource::Plugin { plugin, code_runner: None }, weight: 1.0 }
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
