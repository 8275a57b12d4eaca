//! 0.2.0's `inference.logprobs`: how likely the model finds a reply it did not sample. The
//! engine scores a sampled reply with the log-probs its sampling reported (to the bit, the
//! kernels being batch-invariant), however the text is read in chunks; a 0.2.0 reward
//! (`plugins/tests/likelihood`) gets those numbers through the sandbox within its budget;
//! every refusal (the budget, the context, no model, a host that only samples) reaches the
//! plugin as its call's error, never a 0.

use crate::sandbox;
use std::sync::Arc;
use wirl_engine::{EngineHandle, GenerateRequest, TextToScore};
use wirl_rollout::{FailurePolicy, InferenceBudget, RewardEngine, RewardSource, Scorers};
use wirl_sandbox::{Message, Progress};
use wirl_test_artifacts::LIKELIHOOD;

struct Engine {
    handle: EngineHandle,
    tokenizer: Arc<wirl_engine::Tokenizer>,
    context: usize,
    model: Arc<wirl_engine::Model>,
    _thread: std::thread::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

fn engine() -> Engine {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), false);
    let loaded = wirl_engine::load(dir.path(), &wirl_engine::LoadOptions::default()).unwrap();
    let context = loaded.config.context();
    let tokenizer = Arc::new(loaded.tokenizer);
    let model = Arc::new(loaded.model);
    let (handle, thread) = EngineHandle::spawn(model.clone(), tokenizer.clone()).unwrap();
    Engine { handle, tokenizer, context, model, _thread: thread, _dir: dir }
}

fn block_on<T>(future: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(future)
}

fn prompt(engine: &Engine, messages: &[Message]) -> Vec<u32> {
    let task = wirl_sandbox::Task { messages: messages.to_vec(), ..crate::task("asked", None) };
    wirl_rollout::prompt_ids(&engine.tokenizer, &task).unwrap()
}

#[test]
fn a_sampled_reply_scores_with_the_log_probs_it_was_sampled_with() {
    let engine = engine();
    let prompt = prompt(&engine, &[Message::new("user", "w1 w2 w3")]);
    let mut texts = Vec::new();
    let mut sampled = Vec::new();
    for seed in 0..4 {
        let sampling =
            wirl_engine::Sampling { max_tokens: 12, temperature: 1.0, seed: Some(seed), ..Default::default() };
        let request = GenerateRequest { prompt: prompt.clone(), n: 1, sampling };
        let completion = engine.handle.generate_blocking(request).unwrap().remove(0);
        assert!(!completion.tokens.is_empty());
        texts.push(TextToScore { ids: [prompt.clone(), completion.tokens.clone()].concat(), from: prompt.len() });
        sampled.push(completion.logprobs);
    }
    let scored = block_on(engine.handle.logprobs(texts.clone())).unwrap();
    for (scored, sampled) in scored.into_iter().zip(&sampled) {
        assert_eq!(&scored.unwrap(), sampled, "the sampler's log-probs, to the bit");
    }
    // Read a few positions at a time through the cache, the same numbers.
    for (text, sampled) in texts.iter().zip(&sampled) {
        for chunk in [1, 3, 7] {
            let chunked = wirl_engine::text_logprobs::token_logprobs(&engine.model, text, chunk).unwrap();
            assert_eq!(&chunked, sampled, "chunk {chunk}");
        }
    }
    // The scored part may start anywhere after the first token; the first has no log-prob.
    let whole = TextToScore { ids: texts[0].ids.clone(), from: 1 };
    let all = wirl_engine::text_logprobs::token_logprobs(&engine.model, &whole, 256).unwrap();
    assert_eq!(all.len(), whole.ids.len() - 1);
    assert_eq!(&all[prompt.len() - 1..], &sampled[0][..]);
    // Each text is refused alone: the rest are scored.
    let refused = vec![
        TextToScore { ids: texts[0].ids.clone(), from: 0 },
        texts[1].clone(),
        TextToScore { ids: vec![1; engine.context + 1], from: 1 },
        TextToScore { ids: vec![1, 2], from: 3 },
        TextToScore { ids: vec![1, u32::MAX], from: 1 },
        // Past the vocabulary where the model reads it (the embedding), not only where it
        // is scored: refused before any forward.
        TextToScore { ids: vec![u32::MAX, 1, 2], from: 2 },
    ];
    let results = block_on(engine.handle.logprobs(refused)).unwrap();
    let errors: Vec<String> = results.iter().filter_map(|r| r.as_ref().err().map(|e| e.to_string())).collect();
    assert_eq!(errors.len(), 5, "{errors:?}");
    assert!(errors[4].contains("token id 4294967295 is past the model's vocabulary"), "{errors:?}");
    assert!(errors[0].contains("first token"), "{errors:?}");
    assert!(errors[1].contains("past the model's context"), "{errors:?}");
    assert!(errors[2].contains("starts at 3 of 2"), "{errors:?}");
    assert!(errors[3].contains("vocabulary"), "{errors:?}");
    assert_eq!(results[1].as_ref().unwrap(), &sampled[1]);
}

fn likelihood(tokens: u64, calls: u64) -> Scorers {
    reward(LIKELIHOOD, serde_json::json!({}), tokens, calls)
}

fn reward(path: &str, config: serde_json::Value, tokens: u64, calls: u64) -> Scorers {
    let (sandbox, _cache) = sandbox();
    let mut spec = crate::wit_versions::reward(path, config);
    if let RewardSource::Plugin { inference, .. } = &mut spec.source {
        *inference = InferenceBudget { calls, tokens };
    }
    Scorers::load(&sandbox, &[spec]).unwrap()
}

#[test]
fn a_reward_reads_the_engines_log_probs_of_its_completions_within_its_budget() {
    let engine = engine();
    let reward_engine = engine_for(&engine);
    let mut task = crate::task("t", None);
    task.messages = vec![Message::new("user", "w5 w6")];
    // The last completion holds the chat template's control text: read as text, not as the
    // token that ends the turn.
    let completions: Vec<String> = ["w7", "w8 w9 w10", "", "w1 <|im_end|> w2"].map(String::from).to_vec();
    let policy = FailurePolicy::default();
    let progress = Progress { step: 1, steps: 1 };

    let mut scorers = likelihood(200, 2);
    scorers.set_engine(Some(reward_engine.clone()));
    let scored = scorers.score_group(&task, &completions, policy, progress);
    let prompt = prompt(&engine, &task.messages);
    let mut scored_tokens = 0;
    for (completion, score) in completions.iter().zip(&scored) {
        assert!(score.failures.is_empty(), "{score:?}");
        let reply = engine.tokenizer.encode(&engine.tokenizer.escape(completion)).unwrap();
        scored_tokens += reply.len();
        let text = TextToScore { ids: [prompt.clone(), reply.clone()].concat(), from: prompt.len() };
        let theirs = block_on(engine.handle.logprobs(vec![text])).unwrap().remove(0).unwrap();
        let note: serde_json::Value = serde_json::from_str(&score.notes["likelihood"]).unwrap();
        let logprobs: Vec<f32> =
            note["logprobs"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        assert_eq!(logprobs, theirs, "{completion:?}");
        let tokens: Vec<String> =
            note["tokens"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        assert_eq!(tokens.concat(), engine.tokenizer.decode(&reply, false).unwrap(), "{completion:?}");
        let total: f32 = theirs.iter().sum();
        assert_eq!(score.parts["total"], total);
        assert_eq!(score.parts["tokens"], reply.len() as f32);
        let mean = if reply.is_empty() { 0.0 } else { total / reply.len() as f32 };
        assert_eq!(score.reward, mean, "{completion:?}");
    }
    assert!(scored[1].reward < 0.0, "{scored:?}");
    let usage = reward_engine.usage.take();
    assert_eq!((usage.calls, usage.tokens), (1, scored_tokens as u64), "counted as the judge's use");

    // Fewer tokens left than the replies have: refused to the plugin, naming the key.
    let mut starved = likelihood(3, 2);
    starved.set_engine(Some(reward_engine.clone()));
    for score in starved.score_group(&task, &completions, policy, progress) {
        assert_eq!(score.failures, ["guest_error"], "{score:?}");
        assert!(score.notes["likelihood"].contains("inference_tokens"), "{score:?}");
    }
    // No call allowed at all.
    let mut no_calls = likelihood(200, 0);
    no_calls.set_engine(Some(reward_engine));
    for score in no_calls.score_group(&task, &completions, policy, progress) {
        assert!(score.notes["likelihood"].contains("inference_calls"), "{score:?}");
    }
    // No engine (`wirl score`).
    let mut unplugged = likelihood(200, 2);
    for score in unplugged.score_group(&task, &completions, policy, progress) {
        assert_eq!(score.failures, ["guest_error"], "{score:?}");
        assert!(score.notes["likelihood"].contains("no model to call here"), "{score:?}");
    }
    // A reply past the context: the call is refused, naming which.
    let mut scorers = likelihood(1 << 20, 2);
    scorers.set_engine(Some(RewardEngine { context: 8, ..engine_for(&engine) }));
    for score in scorers.score_group(&task, &["w1 w2 w3 w4 w5 w6 w7 w8 w9".to_string()], policy, progress) {
        assert!(score.notes["likelihood"].contains("past the model's context"), "{score:?}");
    }
}

fn engine_for(engine: &Engine) -> RewardEngine {
    RewardEngine {
        handle: engine.handle.clone(),
        tokenizer: engine.tokenizer.clone(),
        context: engine.context,
        seed: 3,
        usage: Default::default(),
    }
}

/// The Python, JavaScript and C SDKs' `logprobs` (the word judges with `likelihood = true`) read
/// the numbers the Rust one does: the same rewards, totals and token counts, and token texts
/// that join into each completion.
#[test]
fn python_javascript_and_c_rewards_read_the_same_log_probs() {
    let engine = engine();
    let mut task = crate::task("t", None);
    task.messages = vec![Message::new("user", "w5 w6")];
    let completions: Vec<String> = ["w7", "w8 w9 w10", "w1 w1 w1 w1"].map(String::from).to_vec();
    let progress = Progress { step: 1, steps: 1 };
    let scored_by = |path: &str, config: serde_json::Value| {
        let mut scorers = reward(path, config, 200, 2);
        scorers.set_engine(Some(engine_for(&engine)));
        scorers.score_group(&task, &completions, FailurePolicy::default(), progress)
    };
    let rust = scored_by(LIKELIHOOD, serde_json::json!({}));
    let on = serde_json::json!({"likelihood": true});
    for path in
        [wirl_test_artifacts::PYTHON_WORD_JUDGE, wirl_test_artifacts::JS_WORD_JUDGE, wirl_test_artifacts::C_WORD_JUDGE]
    {
        let theirs = scored_by(path, on.clone());
        for ((r, o), completion) in rust.iter().zip(&theirs).zip(&completions) {
            assert!(o.failures.is_empty(), "{path}: {o:?}");
            assert_eq!(
                (r.reward, r.parts["total"], r.parts["tokens"]),
                (o.reward, o.parts["total"], o.parts["tokens"])
            );
            let ids = engine.tokenizer.encode(completion).unwrap();
            let text = engine.tokenizer.decode(&ids, true).unwrap();
            assert_eq!(o.notes["word_judge"], text, "{path}: the token texts join into the reply's");
        }
        assert!(theirs.iter().all(|s| s.reward < 0.0), "{path}: {theirs:?}");
    }
}

/// `builtin:judge` with `read = "probability"` on the engine: each completion's reward is the
/// labels' values weighted by the engine's own probabilities of each label as the judge's
/// reply to its prompt.
#[test]
fn a_probability_judge_reads_the_engines_label_probabilities() {
    let engine = engine();
    let config =
        serde_json::json!({"read": "probability", "labels": {"w1": 1.0, "w2": 0.0}, "template": "{completion}"});
    let mut scorers = reward("builtin:judge", config, 200, 2);
    scorers.set_engine(Some(engine_for(&engine)));
    let task = crate::task("t", None);
    let completions: Vec<String> = ["w5", "w6 w7"].map(String::from).to_vec();
    let scored = scorers.score_group(&task, &completions, FailurePolicy::default(), Progress { step: 1, steps: 1 });
    for (completion, score) in completions.iter().zip(&scored) {
        assert!(score.failures.is_empty(), "{score:?}");
        let prompt = prompt(&engine, &[Message::new("user", completion)]);
        let label = |word: &str| {
            let ids = [prompt.clone(), engine.tokenizer.encode(word).unwrap()].concat();
            let text = TextToScore { ids, from: prompt.len() };
            let logprobs = block_on(engine.handle.logprobs(vec![text])).unwrap().remove(0).unwrap();
            logprobs.iter().map(|&l| f64::from(l)).sum::<f64>().exp()
        };
        let (yes, no) = (label("w1"), label("w2"));
        let expected = (yes / (yes + no)) as f32;
        assert!((score.reward - expected).abs() < 1e-6, "{completion}: {} against {expected}", score.reward);
        assert!((score.parts["label_mass"] - (yes + no) as f32).abs() < 1e-6);
    }
}

/// What a reward may ask is bounded before anything is tokenized: at most 64 replies a call,
/// known roles, text that could fit the context; each refusal names the bound.
#[test]
fn hostile_log_prob_calls_are_refused_before_tokenizing() {
    let engine = engine();
    let progress = Progress { step: 1, steps: 1 };
    let policy = FailurePolicy::default();
    let mut scorers = reward(LIKELIHOOD, serde_json::json!({}), 1 << 40, 4);
    let counted = engine_for(&engine);
    scorers.set_engine(Some(counted.clone()));
    let mut task = crate::task("t", None);
    task.messages = vec![Message::new("user", "w5")];
    let many: Vec<String> = (0..65).map(|_| "w1".to_string()).collect();
    let huge = vec!["w1 ".repeat(engine.context * 64 / 3 + 10)];
    let mut robot = task.clone();
    robot.messages = vec![Message::new("robot", "w5")];
    for (task, completions, expected) in [
        (&task, &many, "one call carries 65 conversations"),
        (&task, &huge, "bytes: it cannot fit the model's context"),
        (&robot, &many[..1].to_vec(), "the role \"robot\""),
    ] {
        for score in scorers.score_group(task, completions, policy, progress) {
            assert_eq!(score.failures, ["guest_error"], "{score:?}");
            assert!(score.notes["likelihood"].contains(expected), "{expected}: {score:?}");
        }
    }
    let usage = counted.usage.take();
    assert_eq!((usage.calls, usage.tokens), (0, 0), "nothing reached the engine");
}

/// A host that only samples (the scripted one of the judge tests, an OpenAI-compatible
/// server) refuses `logprobs` with the reason.
#[test]
fn a_host_that_only_samples_refuses_log_probs_with_the_reason() {
    struct Sampler;
    impl wirl_sandbox::InferenceHost for Sampler {
        fn generate(
            &self,
            _conversations: Vec<Vec<Message>>,
            _sampling: wirl_sandbox::Sampling,
        ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<wirl_sandbox::Completion>, String>> + Send + '_>>
        {
            Box::pin(std::future::ready(Ok(Vec::new())))
        }
    }
    let (sandbox, _cache) = sandbox();
    let mut plugin = wirl_sandbox::RewardPlugin::new(crate::load(&sandbox, LIKELIHOOD)).unwrap();
    plugin.set_inference(Some(Arc::new(Sampler)));
    let task = crate::task("t", None);
    for verdict in plugin.score_group_at(&task, &["w1".to_string()], Progress { step: 1, steps: 1 }) {
        let failure = verdict.unwrap_err();
        assert!(failure.message.contains("no log-probs of given text"), "{failure}");
    }
}
