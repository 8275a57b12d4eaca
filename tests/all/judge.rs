//! `builtin:judge`: the prompts it renders from its template, the verdicts it reads from the
//! model's replies by its rule, one completion at a time and the group ranked in one call,
//! and every way a reply or a config can fail (each a failed completion that says why, never
//! a 0). The model here is a scripted inference host that records what it was asked; the
//! judge against the real engine is `a_judge_built_in_scores_a_training_run`.

use std::sync::{Arc, Mutex};
use wirl_sandbox::{Completion, FinishReason, InferenceHost, Message, Progress, RewardPlugin, Sampling, Task};

/// A model that answers each conversation with the next of its scripted replies (cycling),
/// and remembers the conversations and sampling it was given.
struct Scripted {
    replies: Vec<(String, FinishReason)>,
    asked: Mutex<Vec<(Vec<Message>, Sampling)>>,
    /// The log-prob of each reply `logprobs` is asked about (one token each), by its text;
    /// a reply not here: refused.
    likelihoods: Vec<(String, f32)>,
    scored: Mutex<Vec<wirl_sandbox::ReplyToScore>>,
    /// How many conversations or replies each call carried, in order.
    calls: Mutex<Vec<usize>>,
}

impl Scripted {
    fn new(replies: &[&str]) -> Arc<Scripted> {
        Arc::new(Scripted {
            replies: replies.iter().map(|r| (r.to_string(), FinishReason::Stop)).collect(),
            ..Scripted::default()
        })
    }

    fn cut(reply: &str) -> Arc<Scripted> {
        Arc::new(Scripted { replies: vec![(reply.to_string(), FinishReason::Length)], ..Scripted::default() })
    }

    /// A model that gives each of these replies this log-prob.
    fn likely(likelihoods: &[(&str, f32)]) -> Arc<Scripted> {
        Arc::new(Scripted {
            likelihoods: likelihoods.iter().map(|(w, l)| (w.to_string(), *l)).collect(),
            ..Scripted::default()
        })
    }

    fn asked(&self) -> Vec<(Vec<Message>, Sampling)> {
        self.asked.lock().unwrap().clone()
    }
}

impl Default for Scripted {
    fn default() -> Self {
        Scripted {
            replies: vec![(String::new(), FinishReason::Stop)],
            asked: Mutex::new(Vec::new()),
            likelihoods: Vec::new(),
            scored: Mutex::new(Vec::new()),
            calls: Mutex::new(Vec::new()),
        }
    }
}

impl InferenceHost for Scripted {
    fn logprobs(
        &self,
        replies: Vec<wirl_sandbox::ReplyToScore>,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<wirl_sandbox::ReplyLogprobs>, String>> + Send + '_>> {
        let scored = replies
            .iter()
            .map(|asked| {
                let (_, logprob) = self
                    .likelihoods
                    .iter()
                    .find(|(word, _)| *word == asked.reply)
                    .ok_or_else(|| format!("no likelihood scripted for {:?}", asked.reply))?;
                Ok(wirl_sandbox::ReplyLogprobs { tokens: vec![asked.reply.clone()], logprobs: vec![*logprob] })
            })
            .collect();
        self.calls.lock().unwrap().push(replies.len());
        self.scored.lock().unwrap().extend(replies);
        Box::pin(std::future::ready(scored))
    }

    fn generate(
        &self,
        conversations: Vec<Vec<Message>>,
        sampling: Sampling,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Completion>, String>> + Send + '_>> {
        self.calls.lock().unwrap().push(conversations.len());
        let mut asked = self.asked.lock().unwrap();
        let start = asked.len();
        let replies = (0..conversations.len())
            .map(|i| {
                let (text, finish_reason) = self.replies[(start + i) % self.replies.len()].clone();
                Completion { text, finish_reason, generation: 0 }
            })
            .collect();
        asked.extend(conversations.into_iter().map(|c| (c, sampling.clone())));
        Box::pin(std::future::ready(Ok(replies)))
    }
}

/// `builtin:judge` with `config`, its model `model`.
fn judge(config: serde_json::Value, model: Arc<Scripted>) -> RewardPlugin {
    let (sandbox, _cache) = crate::sandbox();
    let mut spec = wirl_builtins::spec(std::path::Path::new("builtin:judge")).unwrap();
    for (key, value) in config.as_object().unwrap() {
        spec.config.insert(key.clone(), value.clone());
    }
    let mut plugin = RewardPlugin::new(sandbox.load(spec).unwrap()).unwrap();
    plugin.set_inference(Some(model));
    plugin
}

fn task(answer: Option<&str>) -> Task {
    Task {
        id: "capital".into(),
        messages: vec![Message::new("system", "Be brief."), Message::new("user", "What is the capital of France?")],
        answer: answer.map(str::to_string),
        metadata: None,
    }
}

fn completions(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|t| t.to_string()).collect()
}

/// The judge's reward of each completion, or its failure's message.
fn scored(plugin: &mut RewardPlugin, task: &Task, texts: &[&str]) -> Vec<Result<(f32, f32), String>> {
    plugin
        .score_group_at(task, &completions(texts), Progress { step: 1, steps: 2 })
        .into_iter()
        .map(|r| r.map(|s| (s.reward, s.parts[0].1)).map_err(|f| f.message))
        .collect()
}

#[test]
fn each_completion_is_judged_in_its_own_conversation_by_the_default_template() {
    let model = Scripted::new(&["Paris is right. Score: 9", "Wrong city.\nScore: 2.5", "score = 4 ... Score: **10**"]);
    let mut plugin = judge(serde_json::json!({}), model.clone());
    let verdicts = scored(&mut plugin, &task(Some("Paris")), &["Paris", "Lyon", "It is Paris."]);
    // 0..10 onto 0..1, the last `Score:` of a reply; the raw verdict as the `judge` part.
    assert_eq!(verdicts, [Ok((0.9, 9.0)), Ok((0.25, 2.5)), Ok((1.0, 10.0))]);
    let asked = model.asked();
    assert_eq!(asked.len(), 3, "one conversation per completion, in one call");
    for ((conversation, sampling), completion) in asked.iter().zip(["Paris", "Lyon", "It is Paris."]) {
        assert_eq!(conversation.len(), 1, "no system message unless configured");
        let prompt = &conversation[0].content;
        assert_eq!(conversation[0].role, "user");
        assert!(prompt.contains("[Task]\nWhat is the capital of France?\n"), "{prompt}");
        assert!(prompt.contains("[Reference answer]\nParis\n"), "{prompt}");
        assert!(prompt.contains(&format!("[Response]\n{completion}\n")), "{prompt}");
        assert!(!prompt.contains("Be brief."), "{{question}} is the last user message: {prompt}");
        assert_eq!((sampling.max_tokens, sampling.temperature), (512, 0.0));
    }
    // Without a reference answer, the template without one.
    let model = Scripted::new(&["Score: 5"]);
    let mut plugin = judge(serde_json::json!({}), model.clone());
    assert_eq!(scored(&mut plugin, &task(None), &["Paris"]), [Ok((0.5, 5.0))]);
    assert!(!model.asked()[0].0[0].content.contains("Reference"));
}

#[test]
fn a_configured_template_system_rule_labels_and_sampling_are_used() {
    let model = Scripted::new(&["VERDICT: Yes", "verdict: no", "Verdict: maybe"]);
    let config = serde_json::json!({
        "template": "Q: {question}\nAll: {conversation}\nRef: {answer}\nA: {completion}\n{{literal}}",
        "system": "You are a strict grader.",
        "pattern": "(?i)verdict:\\s*(\\w+)",
        "labels": {"YES": 1.0, "no": -0.5},
        "max_tokens": 32,
        "temperature": 0.7,
        "stop": ["\n\n"],
    });
    let mut plugin = judge(config, model.clone());
    let verdicts = scored(&mut plugin, &task(Some("Paris")), &["Paris", "Rome", "Nice"]);
    assert_eq!(verdicts[..2], [Ok((1.0, 1.0)), Ok((-0.5, -0.5))], "labels are their own values, any case");
    let error = verdicts[2].as_ref().unwrap_err();
    assert!(
        error.contains("`maybe` is none of the labels") && error.contains("the judge said: Verdict: maybe"),
        "{error}"
    );
    let (conversation, sampling) = &model.asked()[0];
    assert_eq!(conversation[0], Message::new("system", "You are a strict grader."));
    assert_eq!(
        conversation[1].content,
        "Q: What is the capital of France?\nAll: system: Be brief.\n\nuser: What is the capital of France?\nRef: Paris\n\
         A: Paris\n{literal}"
    );
    assert_eq!((sampling.max_tokens, sampling.temperature, sampling.stop.clone()), (32, 0.7, vec!["\n\n".to_string()]));
}

/// `read = "probability"`: no reply is sampled; each completion's reward is the labels'
/// values weighted by the model's probability of each label as its whole reply, all of a
/// group's asked in one call; the default prompt names the labels.
#[test]
fn a_probability_judge_weighs_the_labels_by_the_models_probability_of_each() {
    let model = Scripted::likely(&[("Yes", 0.6f32.ln()), ("No", 0.2f32.ln())]);
    let config = serde_json::json!({"read": "probability", "labels": {"Yes": 1.0, "No": 0.0}});
    let mut plugin = judge(config, model.clone());
    let scored =
        plugin.score_group_at(&task(Some("Paris")), &completions(&["Paris", "Lyon"]), Progress::OUTSIDE_TRAINING);
    for score in &scored {
        let score = score.as_ref().unwrap();
        assert!((score.reward - 0.75).abs() < 1e-6, "{score:?}");
        let mass = score.parts.iter().find(|(name, _)| name == "label_mass").unwrap().1;
        assert!((mass - 0.8).abs() < 1e-6, "{score:?}");
        assert!(score.note.as_deref().unwrap().contains("P(Yes) = 0.6000"), "{score:?}");
    }
    assert!(model.asked().is_empty(), "nothing sampled");
    let asked = model.scored.lock().unwrap().clone();
    assert_eq!(asked.len(), 4, "every label of every completion, in one call");
    let prompt = &asked[0].conversation[0].content;
    assert!(prompt.contains("[Response]\nParis\n") && prompt.contains("[Reference answer]\nParis"), "{prompt}");
    assert!(prompt.contains("Reply with one word, \"No\" or \"Yes\""), "{prompt}");
    assert_eq!(asked.iter().map(|a| a.reply.as_str()).collect::<Vec<_>>(), ["No", "Yes", "No", "Yes"]);
    assert!(asked[2].conversation[0].content.contains("[Response]\nLyon\n"));

    // Refusals and bad configs fail every completion with the reason.
    let refusing = Scripted::likely(&[("Yes", -1.0)]);
    let mut plugin = judge(serde_json::json!({"read": "probability", "labels": {"Yes": 1, "No": 0}}), refusing);
    let failure = plugin.score(&task(None), "Paris").unwrap_err();
    assert!(failure.message.contains("no likelihood scripted for \"No\""), "{failure}");
    for (config, expected) in [
        (serde_json::json!({"read": "probability", "labels": {"Yes": 1}}), "at least two labels"),
        (serde_json::json!({"read": "probability"}), "at least two labels"),
        (serde_json::json!({"read": "probability", "mode": "group", "labels": {"A": 1, "B": 0}}), "mode \"each\""),
        (serde_json::json!({"read": "vibes"}), "config key `read`"),
        (serde_json::json!({"read": "probability", "labels": {" ": 1, "No": 0}}), "is empty"),
    ] {
        let mut plugin = judge(config.clone(), Scripted::likely(&[]));
        let failure = plugin.score(&task(None), "Paris").unwrap_err();
        assert!(failure.message.contains(expected), "{config}: {failure}");
    }
}

/// A group larger than one call may carry (64 conversations, or replies to score) is asked in
/// several calls, its verdicts in order.
#[test]
fn a_large_group_is_judged_in_calls_of_at_most_64() {
    let texts: Vec<String> = (0..70).map(|i| format!("answer {i}")).collect();
    let model = Scripted::new(&["Score: 10", "Score: 0"]);
    let mut plugin = judge(serde_json::json!({}), model.clone());
    let verdicts = plugin.score_group_at(&task(None), &texts, Progress::OUTSIDE_TRAINING);
    let rewards: Vec<f32> = verdicts.iter().map(|v| v.as_ref().unwrap().reward).collect();
    assert_eq!(rewards, (0..70).map(|i| if i % 2 == 0 { 1.0 } else { 0.0 }).collect::<Vec<_>>());
    assert_eq!(*model.calls.lock().unwrap(), [64, 6]);
    assert!(model.asked()[69].0[0].content.contains("answer 69"));
    // Probability verdicts: 40 completions of 2 labels.
    let model = Scripted::likely(&[("Yes", -0.1), ("No", -3.0)]);
    let mut plugin = judge(serde_json::json!({"read": "probability", "labels": {"Yes": 1, "No": 0}}), model.clone());
    let verdicts = plugin.score_group_at(&task(None), &texts[..40], Progress::OUTSIDE_TRAINING);
    assert!(verdicts.iter().all(|v| v.as_ref().unwrap().reward > 0.9), "{verdicts:?}");
    assert_eq!(*model.calls.lock().unwrap(), [64, 16]);
}

#[test]
fn group_mode_ranks_the_group_in_one_call() {
    let model = Scripted::new(&["Comparing them...\n[1]: 8\n[2]: 3\n- [3] = 10\n[2]: 4\n[9]: 1"]);
    let mut plugin = judge(serde_json::json!({"mode": "group"}), model.clone());
    let verdicts = scored(&mut plugin, &task(Some("Paris")), &["Paris", "Lyon", "Paris, France"]);
    // Per response the last verdict; one it was not asked about is ignored.
    assert_eq!(verdicts, [Ok((0.8, 8.0)), Ok((0.4, 4.0)), Ok((1.0, 10.0))]);
    let asked = model.asked();
    assert_eq!(asked.len(), 1, "one conversation shows the whole group");
    let prompt = &asked[0].0[0].content;
    assert!(prompt.starts_with("Below are 3 responses"), "{prompt}");
    assert!(prompt.contains("[1]\nParis\n\n[2]\nLyon\n\n[3]\nParis, France\n"), "{prompt}");
    assert_eq!(asked[0].1.max_tokens, 1024);
    // A response the ranking leaves out fails alone.
    let model = Scripted::new(&["[1]: 8\n[3]: 6"]);
    let mut plugin = judge(serde_json::json!({"mode": "group"}), model);
    let verdicts = scored(&mut plugin, &task(None), &["a", "b", "c"]);
    assert_eq!((verdicts[0].clone(), verdicts[2].clone()), (Ok((0.8, 8.0)), Ok((0.6, 6.0))));
    assert!(verdicts[1].as_ref().unwrap_err().contains("gives response [2] no verdict"), "{verdicts:?}");
}

#[test]
fn an_unreadable_verdict_fails_its_completion_and_says_why() {
    // No verdict at all; a verdict outside the range; a reply cut at max_tokens.
    let model = Scripted::new(&["I think it is fine.", "Score: 11", "Score: 7"]);
    let mut plugin = judge(serde_json::json!({}), model);
    let verdicts = scored(&mut plugin, &task(None), &["a", "b", "c"]);
    let error = verdicts[0].as_ref().unwrap_err();
    assert!(error.contains("no verdict matching") && error.contains("the judge said: I think it is fine."), "{error}");
    assert!(verdicts[1].as_ref().unwrap_err().contains("outside the range [0, 10]"), "{verdicts:?}");
    assert_eq!(verdicts[2], Ok((0.7, 7.0)));
    let mut rambling = judge(serde_json::json!({"max_tokens": 8}), Scripted::cut(&"blah ".repeat(400)));
    let error = scored(&mut rambling, &task(None), &["a"]).remove(0).unwrap_err();
    assert!(error.contains("cut at max_tokens = 8"), "{error}");
    assert!(error.len() < 1000, "the reply is shown cut short: {} bytes", error.len());
    // A custom range maps onto 0..1.
    let mut five = judge(serde_json::json!({"range": [1, 5]}), Scripted::new(&["Score: 4"]));
    assert_eq!(scored(&mut five, &task(None), &["a"]), [Ok((0.75, 4.0))]);
}

#[test]
fn a_bad_config_fails_every_completion_naming_the_key() {
    let cases = [
        (serde_json::json!({"mode": "pairs"}), "config key `mode`: \"pairs\" is not a mode"),
        (serde_json::json!({"template": "{question} {answr}"}), "unknown field `{answr}`"),
        (serde_json::json!({"template": "{question}"}), "never shows the judged text: put {completion}"),
        (serde_json::json!({"template": "{completions}"}), "`{completions}` is not a field of mode \"each\""),
        (serde_json::json!({"mode": "group", "template": "{completion}"}), "is not a field of mode \"group\""),
        (serde_json::json!({"template": "{completion"}), "never closed"),
        (serde_json::json!({"template": "} {completion}"}), "a lone `}`"),
        (serde_json::json!({"pattern": "score: ("}), "config key `pattern`: not a regular expression"),
        (serde_json::json!({"pattern": "score: \\d+"}), "it needs a group"),
        (serde_json::json!({"mode": "group", "pattern": "(\\d+)"}), "needs two groups"),
        (serde_json::json!({"range": [5, 1]}), "config key `range`"),
        (serde_json::json!({"max_tokens": 0}), "config key `max_tokens`"),
        (serde_json::json!({"max_tokens": -3}), "config key `max_tokens`"),
        (serde_json::json!({"temperature": 1e9}), "config key `temperature`"),
        (serde_json::json!({"labels": {"yes": "one"}}), "config key `labels`"),
    ];
    for (config, expected) in cases {
        let model = Scripted::new(&["Score: 5"]);
        let mut plugin = judge(config.clone(), model.clone());
        for verdict in scored(&mut plugin, &task(None), &["a", "b"]) {
            let error = verdict.unwrap_err();
            assert!(error.contains(expected), "{config}: {error}");
        }
        assert!(model.asked().is_empty(), "{config}: the model was asked before the config was read");
    }
    // {answer} on a task without one.
    let mut plugin = judge(serde_json::json!({"template": "{answer} {completion}"}), Scripted::new(&["Score: 5"]));
    let error = scored(&mut plugin, &task(None), &["a"]).remove(0).unwrap_err();
    assert!(error.contains("task `capital` has no reference answer"), "{error}");
}

/// `builtin:judge` in `wirl train` on the tiny model (a context of 64 tokens: the template is
/// the completion alone): it asks the engine being trained about each completion. The tiny
/// model's replies are not verdicts, so each completion fails as
/// unreadable (masked, the default) — recorded with the judge's words, never scored 0.
#[test]
fn a_judge_built_in_scores_a_training_run() {
    let dir = tempfile::tempdir().unwrap();
    let extra = "\n[[rewards]]\nplugin = \"builtin:judge\"\nconfig = { max_tokens = 4, template = \"{completion}\" }\n";
    let config = crate::grpo::write_config(dir.path(), extra, 1, 0.01);
    let run = dir.path().join("run");
    let out = crate::grpo::train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rollouts = crate::grpo::rollouts(&run);
    let scored: Vec<_> = rollouts.iter().filter(|r| r.get("completion").is_some()).collect();
    assert!(!scored.is_empty());
    for rollout in scored {
        let note = rollout["notes"]["judge"].as_str().unwrap_or_else(|| panic!("{rollout}"));
        if rollout["failures"].as_array().unwrap().is_empty() {
            assert!(rollout["parts"].get("judge").is_some(), "{rollout}");
        } else {
            assert!(note.contains("no verdict matching") || note.contains("outside the range"), "{note}");
            assert!(!note.contains("no model to call here"), "the judge had the engine: {note}");
        }
    }
    // The step counts the judge's calls, tokens and wait, and its line shows their share.
    let metrics = crate::grpo::metrics(&run);
    let step = &metrics[0];
    // One call per group of the step (prompts_per_step = 2), each 6 replies of at most 4 tokens.
    assert_eq!(step["judge_calls"], 2, "{step}");
    let tokens = step["judge_tokens"].as_u64().unwrap();
    assert!((1..=2 * 6 * 4).contains(&tokens), "{step}");
    let waited = step["time_s"]["judge"].as_f64().unwrap();
    assert!(waited > 0.0 && waited <= step["time_s"]["total"].as_f64().unwrap() * 2.0, "{step}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("% of the step, 2 calls,"), "{stderr}");
}

/// A 0.2.0 judge written in Python, JavaScript and C (`plugins/{python,js,c}/word-judge`, built
/// against wit/0.2.0 by their `reward-plugin@0.2.0` line) asks the model as its Rust twin
/// does — the same conversations, the same rewards — and reads the step it is scored at; a
/// 0.1.0 plugin of each language, built with the same helpers, still scores as before.
#[test]
fn python_javascript_and_c_judges_ask_the_model_as_the_rust_one_does() {
    let (sandbox, _cache) = crate::sandbox();
    let replies = ["one two three", "", "a b"];
    let mut task = crate::task("t", Some("4"));
    task.messages = vec![Message::new("user", "What is 2 + 2?")];
    let texts = completions(&["4", "five", "I think 4"]);
    let progress = Progress { step: 3, steps: 7 };
    let mut asked = Vec::new();
    let mut verdicts = Vec::new();
    let judges = [
        wirl_test_artifacts::WORD_JUDGE,
        wirl_test_artifacts::PYTHON_WORD_JUDGE,
        wirl_test_artifacts::JS_WORD_JUDGE,
        wirl_test_artifacts::C_WORD_JUDGE,
    ];
    for path in judges {
        let plugin = crate::load(&sandbox, path);
        assert_eq!(plugin.wit_version(), "0.2.0", "{path}");
        let mut plugin = RewardPlugin::new(plugin).unwrap();
        let model = Scripted::new(&replies);
        plugin.set_inference(Some(model.clone()));
        let scored: Vec<wirl_sandbox::Score> =
            plugin.score_group_at(&task, &texts, progress).into_iter().map(|r| r.unwrap()).collect();
        asked.push(model.asked());
        verdicts.push(scored);
    }
    let conversations =
        |asked: &[(Vec<Message>, Sampling)]| -> Vec<Vec<Message>> { asked.iter().map(|(c, _)| c.clone()).collect() };
    let rust = &verdicts[0];
    for (other, verdicts) in asked.iter().zip(&verdicts).skip(1) {
        assert_eq!(conversations(&asked[0]), conversations(other), "the same prompts");
        assert_eq!((other[0].1.max_tokens, other[0].1.temperature), (6, 0.0));
        for (r, o) in rust.iter().zip(verdicts) {
            assert_eq!((r.reward, &r.note), (o.reward, &o.note));
        }
        assert_eq!(verdicts.iter().map(|s| s.reward).collect::<Vec<_>>(), [3.0, 0.0, 2.0]);
        assert!(verdicts.iter().all(|s| s.parts.contains(&("step".to_string(), 3.0))), "{verdicts:?}");
    }
    // Without a model, the call is refused to the plugin and it fails every completion.
    for path in &judges[1..] {
        let mut unplugged = RewardPlugin::new(crate::load(&sandbox, path)).unwrap();
        for verdict in unplugged.score_group_at(&task, &texts, progress) {
            let failure = verdict.unwrap_err();
            assert!(failure.message.contains("no model to call here"), "{path}: {failure}");
        }
    }
    // The 0.1.0 plugins share the helpers.
    for path in [
        wirl_test_artifacts::PYTHON_MATH_ANSWER,
        wirl_test_artifacts::JS_MATH_ANSWER,
        wirl_test_artifacts::C_MATH_ANSWER,
    ] {
        let mut math = RewardPlugin::new(crate::load(&sandbox, path)).unwrap();
        assert_eq!(math.score(&task, "<answer>4</answer>").unwrap().reward, 1.0, "{path}");
    }
}

/// `judge_model = "initial"`: the judge is the model the run started from, frozen, while the
/// policy learns. Two runs of three steps at a high learning rate: with the initial model,
/// every judge reply of every step is the starting model's greedy reply to the judge's
/// prompt; with the policy (the default), some reply of a later step is not (the weights
/// moved). The judge's template is the completion alone, so the prompt is known here.
#[test]
fn a_frozen_initial_judge_does_not_drift_with_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let judged = |judge_model: &str| {
        let extra = format!(
            "\n[[rewards]]\nplugin = \"builtin:judge\"\njudge_model = \"{judge_model}\"\nconfig = {{ max_tokens = 4, \
             template = \"{{completion}}\" }}\n"
        );
        let config = crate::grpo::write_config(dir.path(), &extra, 3, 0.5);
        // Failures (the tiny model's replies are no verdicts) must still train: reward them.
        let text = std::fs::read_to_string(&config).unwrap().replace("seed = 3", "seed = 3\non_failure = \"reward\"");
        std::fs::write(&config, text).unwrap();
        let run = dir.path().join(format!("run-{judge_model}"));
        let out = crate::grpo::train(&config, &run);
        assert!(out.status.success(), "{judge_model}: {}", String::from_utf8_lossy(&out.stderr));
        crate::grpo::rollouts(&run)
            .into_iter()
            .filter(|r| r.get("completion").is_some())
            .map(|r| {
                let note = r["notes"]["judge"].as_str().unwrap_or_else(|| panic!("{r}")).to_string();
                let reply = note.split_once("; the judge said: ").unwrap_or_else(|| panic!("{note}")).1.to_string();
                (r["step"].as_u64().unwrap(), r["completion"].as_str().unwrap().to_string(), reply)
            })
            .collect::<Vec<_>>()
    };
    // The starting model's greedy replies, as the judge asks: the completion as the user's turn.
    let start = |model_dir: &std::path::Path| {
        let loaded = wirl_engine::load(model_dir, &wirl_engine::LoadOptions::default()).unwrap();
        let tokenizer = Arc::new(loaded.tokenizer);
        let (handle, _thread) = wirl_engine::EngineHandle::spawn(Arc::new(loaded.model), tokenizer.clone()).unwrap();
        move |completion: &str| {
            let task = Task { messages: vec![Message::new("user", completion)], ..crate::task("judged", None) };
            let prompt = wirl_rollout::prompt_ids(&tokenizer, &task).unwrap();
            let sampling = wirl_engine::Sampling { max_tokens: 4, temperature: 0.0, ..Default::default() };
            handle.generate_blocking(wirl_engine::GenerateRequest { prompt, n: 1, sampling }).unwrap().remove(0).text
        }
    };
    let frozen = judged("initial");
    let greedy = start(&dir.path().join("model"));
    for (step, completion, reply) in &frozen {
        assert_eq!(reply.trim(), greedy(completion).trim(), "step {step}: the frozen judge's reply to {completion:?}");
    }
    assert!(frozen.iter().any(|(step, ..)| *step == 3));
    let drifting = judged("policy");
    let moved =
        drifting.iter().filter(|(step, completion, reply)| *step > 1 && reply.trim() != greedy(completion).trim());
    assert!(moved.count() > 0, "the policy judge drifted with the weights: {drifting:?}");
}
