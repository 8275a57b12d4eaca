//! Reward models against Hugging Face transformers: a tiny random-weight sequence classifier of
//! each family (`scripts/reference/tiny_reward_models.py` → `tests/fixtures/tiny-reward-<family>/`),
//! loaded as transformers saved it. Each text's scores within 1e-4 of transformers' — alone,
//! and batched with texts of other lengths (left-padded here, right-padded there) — and a
//! text ending in the padding id read where transformers reads it.

use serde::Deserialize;
use std::path::Path;
use wirl_engine::{ChatMessage, LoadOptions, RewardModel};

#[derive(Deserialize)]
struct Reference {
    texts: Vec<Text>,
    /// The texts right-padded into one batch, as transformers scored them at once.
    batch: Vec<Vec<f32>>,
}

#[derive(Deserialize)]
struct Text {
    ids: Vec<u32>,
    scores: Vec<f32>,
}

const FAMILIES: [&str; 4] = ["llama", "qwen2", "qwen3", "gemma3"];

/// The family's fixture with the tests' tokenizer (and its chat template) beside it.
fn tiny(family: &str) -> (tempfile::TempDir, Reference) {
    crate::families::fixture_model(&format!("tiny-reward-{family}"))
}

fn worst(ours: &[Vec<f32>], theirs: &[Vec<f32>]) -> f32 {
    assert_eq!(ours.len(), theirs.len());
    let mut worst = 0f32;
    for (a, b) in ours.iter().zip(theirs) {
        assert_eq!(a.len(), b.len(), "labels");
        worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(worst, f32::max);
    }
    worst
}

#[test]
fn reward_models_of_each_family_score_as_transformers_does() {
    for family in FAMILIES {
        let (dir, reference) = tiny(family);
        let model = RewardModel::load(dir.path(), &LoadOptions::default()).unwrap();
        assert_eq!(model.labels(), reference.texts[0].scores.len(), "{family}");
        let expected: Vec<Vec<f32>> = reference.texts.iter().map(|t| t.scores.clone()).collect();
        // Alone: one text a call.
        let alone: Vec<Vec<f32>> = reference
            .texts
            .iter()
            .map(|t| model.score(std::slice::from_ref(&t.ids)).unwrap().remove(0).unwrap())
            .collect();
        let gap = worst(&alone, &expected);
        assert!(gap < 1e-4, "{family}: alone, max |wirl − transformers| = {gap}");
        // Together: one batch of several lengths.
        let texts: Vec<Vec<u32>> = reference.texts.iter().map(|t| t.ids.clone()).collect();
        let together: Vec<Vec<f32>> = model.score(&texts).unwrap().into_iter().map(Result::unwrap).collect();
        let gap = worst(&together, &reference.batch);
        assert!(gap < 1e-4, "{family}: batched, max |wirl − transformers| = {gap}");
    }
}

/// Read a few positions at a time through the cache (the last step a single token, the
/// decoding path), a batch scores as in one forward: within 1e-5, and of transformers.
#[test]
fn texts_read_in_chunks_score_as_in_one_forward() {
    for family in FAMILIES {
        let (dir, reference) = tiny(family);
        let whole = RewardModel::load(dir.path(), &LoadOptions::default()).unwrap();
        let texts: Vec<Vec<u32>> = reference.texts.iter().map(|t| t.ids.clone()).collect();
        let expected: Vec<Vec<f32>> = whole.score(&texts).unwrap().into_iter().map(Result::unwrap).collect();
        for chunk in [1, 2, 3] {
            let chunked = RewardModel::load(dir.path(), &LoadOptions::default()).unwrap().with_prefill_chunk(chunk);
            let got: Vec<Vec<f32>> = chunked.score(&texts).unwrap().into_iter().map(Result::unwrap).collect();
            let gap = worst(&got, &expected);
            assert!(gap < 1e-5, "{family}, {chunk} at a time: max gap {gap}");
            let gap = worst(&got, &reference.batch);
            assert!(gap < 1e-4, "{family}, {chunk} at a time: max |wirl − transformers| = {gap}");
        }
    }
}

#[test]
fn a_text_ending_in_the_padding_id_is_read_at_the_token_before() {
    let (dir, reference) = tiny("qwen3");
    let model = RewardModel::load(dir.path(), &LoadOptions::default()).unwrap();
    let ends_in_pad = reference.texts.iter().find(|t| t.ids.last() == Some(&0)).expect("the fixture's padded text");
    let trimmed = ends_in_pad.ids[..ends_in_pad.ids.len() - 1].to_vec();
    let scores = model.score(&[ends_in_pad.ids.clone(), trimmed]).unwrap();
    assert_eq!(scores[0].as_ref().unwrap(), scores[1].as_ref().unwrap());
}

#[test]
fn texts_a_reward_model_cannot_read_fail_alone() {
    let (dir, reference) = tiny("llama");
    let model = RewardModel::load(dir.path(), &LoadOptions::default()).unwrap();
    let too_long = vec![5; model.context() + 1];
    let texts = vec![vec![], reference.texts[0].ids.clone(), vec![0, 0], too_long];
    let scores = model.score(&texts).unwrap();
    assert!(scores[0].as_ref().unwrap_err().to_string().contains("no token to score"), "{:?}", scores[0]);
    assert!((scores[1].as_ref().unwrap()[0] - reference.texts[0].scores[0]).abs() < 1e-4);
    assert!(scores[2].as_ref().unwrap_err().to_string().contains("padding id"), "{:?}", scores[2]);
    let error = scores[3].as_ref().unwrap_err().to_string();
    assert!(error.contains("past the reward model's context of 64"), "{error}");
}

#[test]
fn a_completion_is_scored_as_its_conversation_through_the_reward_models_template() {
    let (dir, _) = tiny("qwen3");
    let model = RewardModel::load(dir.path(), &LoadOptions::default()).unwrap();
    let messages = [ChatMessage { role: "user".into(), content: "w5 w6".into() }];
    let ids = model.conversation_ids(&messages, "w7 </s>").unwrap();
    // The tiny template writes `role: content` lines; the completion's `</s>` is its text,
    // not the end-of-text token.
    let rendered = model.tokenizer().decode(&ids, false).unwrap();
    assert!(rendered.contains("w5 w6") && rendered.contains("w7"), "{rendered}");
    assert!(!ids.contains(&1), "a control token from the completion's text: {ids:?}");
}

#[test]
fn a_classifier_is_no_policy_and_a_language_model_no_reward_model() {
    let (dir, _) = tiny("qwen3");
    let error = wirl_engine::load(dir.path(), &LoadOptions::default()).err().unwrap().to_string();
    assert!(error.contains("is a sequence classifier") && error.contains("[[rewards]] model"), "{error}");
    let error = wirl_engine::load::load_tensors(dir.path(), &LoadOptions::default()).err().unwrap().to_string();
    assert!(error.contains("is a sequence classifier"), "{error}");
    let (policy, _) = crate::families::tiny("qwen3");
    let error = RewardModel::load(policy.path(), &LoadOptions::default()).err().unwrap().to_string();
    assert!(error.contains("is not a sequence classifier"), "{error}");
}

/// A reward model's directory beside the tiny policy of `grpo::write_config`: the tiny Qwen3
/// classifier with the policy's own tokenizer (its words, its chat template).
fn reward_model_beside(dir: &Path) -> std::path::PathBuf {
    let fixture = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/tiny-reward-qwen3"));
    crate::grpo::write_config(dir, "", 1, 0.01);
    let reward = dir.join("reward-model");
    std::fs::create_dir_all(&reward).unwrap();
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(file), reward.join(file)).unwrap();
    }
    for file in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(dir.join("model").join(file), reward.join(file)).unwrap();
    }
    reward
}

/// A training config on the tiny policy whose tasks are dataset prompts (known to the test)
/// and whose rewards are `rewards` (TOML).
fn dataset_config(dir: &Path, rewards: &str) -> std::path::PathBuf {
    let config = crate::grpo::write_config(dir, "", 1, 0.01);
    let prompts: String = [5, 9, 13, 21]
        .iter()
        .map(|w| {
            let prompt = format!("w{w}{} w3zzz", "z".repeat(w % 8));
            let row = serde_json::json!({"id": format!("p{w}"), "messages": [{"role": "user", "content": prompt}], "answer": "1"});
            row.to_string() + "\n"
        })
        .collect();
    std::fs::write(dir.join("train.jsonl"), prompts).unwrap();
    let text = std::fs::read_to_string(&config).unwrap();
    let (start, end) = (text.find("[environment]").unwrap(), text.find("[sampling]").unwrap());
    std::fs::write(
        &config,
        format!("{}[dataset]\ntrain = \"train.jsonl\"\n\n{rewards}\n{}", &text[..start], &text[end..]),
    )
    .unwrap();
    config
}

/// `[[rewards]] model = DIR` in a training run: each completion's reward is the reward
/// model's score of the prompt and the completion (here beside a plugin, weighted), the same
/// value the engine's `RewardModel` gives that conversation; nothing failed.
#[test]
fn a_training_run_is_rewarded_by_a_reward_model_beside_a_plugin() {
    let dir = tempfile::tempdir().unwrap();
    let reward_dir = reward_model_beside(dir.path());
    let rewards = format!(
        "[[rewards]]\nmodel = {reward_dir:?}\nweight = 0.5\n\n[[rewards]]\nplugin = \"builtin:math-answer\"\nweight = 0\n"
    );
    let config = dataset_config(dir.path(), &rewards);
    let run = dir.path().join("run");
    let out = crate::grpo::train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model = RewardModel::load(&reward_dir, &LoadOptions::default()).unwrap();
    let prompts: std::collections::BTreeMap<String, String> = std::fs::read_to_string(dir.path().join("train.jsonl"))
        .unwrap()
        .lines()
        .map(|line| {
            let row: serde_json::Value = serde_json::from_str(line).unwrap();
            (row["id"].as_str().unwrap().to_string(), row["messages"][0]["content"].as_str().unwrap().to_string())
        })
        .collect();
    let rollouts = crate::grpo::rollouts(&run);
    let scored: Vec<&serde_json::Value> = rollouts.iter().filter(|r| r.get("completion").is_some()).collect();
    assert_eq!(scored.len(), 12, "two prompts of six");
    let mut distinct = std::collections::BTreeSet::new();
    for rollout in scored {
        assert_eq!(rollout["status"], "ok", "{rollout}");
        assert_eq!(rollout["failures"], serde_json::json!([]), "{rollout}");
        let id = rollout["task"].as_str().unwrap();
        let prompt = prompts.get(id).unwrap_or_else(|| panic!("the prompt of task {id}"));
        let messages = [ChatMessage { role: "user".into(), content: prompt.clone() }];
        let ids = model.conversation_ids(&messages, rollout["completion"].as_str().unwrap()).unwrap();
        let expected = 0.5 * model.score(&[ids]).unwrap().remove(0).unwrap()[0];
        let reward = rollout["reward"].as_f64().unwrap() as f32;
        assert!((reward - expected).abs() < 1e-4, "reward {reward}, the reward model's {expected}: {rollout}");
        distinct.insert(reward.to_bits());
    }
    assert!(distinct.len() > 1, "every completion scored alike");
    // The run's manifest keeps the reward model: the run resumes with it.
    let resumed = crate::grpo::resume(&run, 2);
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    let rollouts = crate::grpo::rollouts(&run);
    let second: Vec<_> = rollouts.iter().filter(|r| r["step"] == 2 && r.get("completion").is_some()).collect();
    assert_eq!(second.len(), 12);
    assert!(second.iter().all(|r| r["status"] == "ok" && r["reward"].as_f64().unwrap() != 0.0), "{second:?}");
    // The manifest names the reward model by its files' sizes and sha256; a resume refuses one
    // that changed since, naming the file.
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("manifests/000000.json")).unwrap()).unwrap();
    let models = manifest["models"].as_object().unwrap();
    for file in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        let path = std::fs::canonicalize(reward_dir.join(file)).unwrap();
        let print = models
            .iter()
            .find(|(name, _)| std::fs::canonicalize(name).ok().as_ref() == Some(&path))
            .unwrap_or_else(|| panic!("{file} in {models:?}"))
            .1;
        assert_eq!(print["bytes"].as_u64().unwrap(), std::fs::metadata(&path).unwrap().len());
        assert_eq!(print["sha256"].as_str().unwrap().len(), 64);
    }
    let config = reward_dir.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text + " ").unwrap();
    let refused = crate::grpo::resume(&run, 3);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("config.json: changed since the run read it"), "{said}");
    assert!(said.contains("scored or judged by another model"), "{said}");
}

/// Tasks naming the same reward model share one copy of its weights in the process while any
/// holds it; once none does, the next load reads it again.
#[test]
fn tasks_naming_one_reward_model_share_its_weights() {
    let dir = tempfile::tempdir().unwrap();
    let reward_dir = reward_model_beside(dir.path());
    let first = wirl_rollout::shared_reward_model(&reward_dir).unwrap();
    // The same directory written otherwise.
    let again = wirl_rollout::shared_reward_model(&reward_dir.join("../reward-model")).unwrap();
    assert!(std::sync::Arc::ptr_eq(&first, &again));
    let weak = std::sync::Arc::downgrade(&first);
    drop((first, again));
    assert!(weak.upgrade().is_none(), "the registry holds no copy of its own");
    let reloaded = wirl_rollout::shared_reward_model(&reward_dir).unwrap();
    assert_eq!(reloaded.labels(), 1);
}

/// A reward model's keys are checked with the config: a reward is a plugin or a model, a
/// model takes none of a plugin's settings, its directory exists, its label is one it has.
#[test]
fn reward_model_config_errors_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let reward_dir = reward_model_beside(dir.path());
    let run = dir.path().join("run");
    let cases = [
        (
            format!("[[rewards]]\nmodel = {reward_dir:?}\nplugin = \"builtin:math-answer\""),
            "names both a `plugin` and a `model`",
        ),
        ("[[rewards]]\nweight = 1".to_string(), "names no `plugin` and no `model`"),
        (
            format!("[[rewards]]\nmodel = {reward_dir:?}\ndeadline_ms = 10"),
            "`rewards[0].deadline_ms` is a plugin's setting",
        ),
        ("[[rewards]]\nplugin = \"builtin:math-answer\"\nlabel = 1".to_string(), "`rewards[0].label`"),
        ("[[rewards]]\nmodel = \"train.jsonl\"".to_string(), "is not a directory"),
        (format!("[[rewards]]\nmodel = {reward_dir:?}\nlabel = 1"), "label 1 is not one of its 1 scores"),
        (format!("[[rewards]]\nmodel = {:?}", dir.path().join("model")), "is not a sequence classifier"),
        (
            format!("[[rewards]]\nmodel = {reward_dir:?}\ninference_calls = 2"),
            "`rewards[0].inference_calls` is a plugin's",
        ),
        (
            "[[rewards]]\nplugin = \"builtin:math-answer\"\ninference_tokens = 0".to_string(),
            "`rewards[0].inference_tokens` = 0",
        ),
        (
            "[[rewards]]\nplugin = \"builtin:math-answer\"\ninference_calls = 100000".to_string(),
            "`rewards[0].inference_calls` = 100000",
        ),
        (
            format!("[[rewards]]\nmodel = {reward_dir:?}\njudge_model = \"initial\""),
            "`rewards[0].judge_model` is a plugin's",
        ),
        ("[[rewards]]\nplugin = \"builtin:judge\"\njudge_model = \"inital\"".to_string(), "`rewards[0].judge_model`: "),
        (
            format!("[[rewards]]\nplugin = \"builtin:judge\"\njudge_model = {:?}", dir.path().join("train.jsonl")),
            "judge_model = \"",
        ),
    ];
    for (rewards, expected) in cases {
        let config = dataset_config(dir.path(), &rewards);
        let out = crate::grpo::train(&config, &run);
        assert!(!out.status.success(), "{rewards}");
        let error = String::from_utf8_lossy(&out.stderr);
        assert!(error.contains(expected), "expected `{expected}` in: {error}");
        assert!(!run.join("metrics.jsonl").exists());
    }
}

/// Reward model directories someone else made, refused by what is wrong with them before a
/// forward runs: no labels, a head that does not match its labels, no weights.
#[test]
fn a_broken_reward_model_is_refused_naming_what_is_wrong() {
    let edit_config = |edit: &dyn Fn(&mut serde_json::Value)| {
        let (dir, _) = tiny("qwen3");
        let path = dir.path().join("config.json");
        let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut config);
        std::fs::write(&path, config.to_string()).unwrap();
        dir
    };
    let load =
        |dir: &tempfile::TempDir| RewardModel::load(dir.path(), &LoadOptions::default()).err().unwrap().to_string();
    let no_labels = edit_config(&|c| c["id2label"] = serde_json::json!({}));
    assert!(load(&no_labels).contains("id2label's count of labels is 0"), "{}", load(&no_labels));
    let two_labels = edit_config(&|c| c["id2label"] = serde_json::json!({"0": "bad", "1": "good"}));
    let error = load(&two_labels);
    assert!(error.contains("score.weight") && error.contains("[2, 32]"), "{error}");
    let no_weights = edit_config(&|_| {});
    std::fs::remove_file(no_weights.path().join("model.safetensors")).unwrap();
    assert!(load(&no_weights).contains("weights file missing"), "{}", load(&no_weights));
}

/// A completion far past the reward model's context fails alone in a group (the plugin-style
/// `guest_error`, masked by the task's `on_failure`), its neighbours scored.
#[test]
fn a_completion_past_the_reward_models_context_fails_alone_in_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let reward_dir = reward_model_beside(dir.path());
    let (sandbox, _cache) = crate::sandbox();
    let spec = wirl_rollout::RewardSpec {
        source: wirl_rollout::RewardSource::Model(wirl_rollout::RewardModelRef { path: reward_dir, label: 0 }),
        weight: 1.0,
    };
    let mut scorers = wirl_rollout::Scorers::load(&sandbox, &[spec]).unwrap();
    let task = crate::task("t", None);
    let long = "w5zzzzz ".repeat(20_000);
    let completions = ["w9z".to_string(), long, "w13zzzzz w3zzz".to_string()];
    let scored = scorers.score_group(
        &task,
        &completions,
        wirl_rollout::FailurePolicy::default(),
        wirl_sandbox::Progress::OUTSIDE_TRAINING,
    );
    assert_eq!(scored[1].failures, ["guest_error"], "{:?}", scored[1]);
    assert!(scored[1].notes.values().any(|n| n.contains("past the reward model's context")), "{:?}", scored[1]);
    for i in [0, 2] {
        assert!(scored[i].failures.is_empty() && scored[i].reward != 0.0, "{:?}", scored[i]);
    }
}

/// A reward model without a chat template is refused when it loads (it reads every
/// completion through its own template), not as a failure of every completion later.
#[test]
fn a_reward_model_without_a_chat_template_is_refused_at_load() {
    let (dir, _) = tiny("llama");
    std::fs::write(dir.path().join("tokenizer_config.json"), r#"{"eos_token": "</s>"}"#).unwrap();
    let error = RewardModel::load(dir.path(), &LoadOptions::default()).err().unwrap().to_string();
    assert!(error.contains("has no chat template"), "{error}");
}
