//! Reward models against Hugging Face transformers: a tiny random-weight sequence classifier of
//! each family (`scripts/reference/tiny_reward_models.py` → `tests/fixtures/tiny-reward-<family>/`),
//! loaded as transformers saved it. Each text's scores within 1e-4 of transformers' — alone,
//! and batched with texts of other lengths (left-padded here, right-padded there) — and a
//! text ending in the padding id read where transformers reads it.

use serde::Deserialize;
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
