//! Multi-turn episodes and the token ledger: the trainer's log-probs over a ledger equal the
//! sampler's on every model token, the environment's tokens carry no loss, and a chat
//! template that is not append-only is refused.

use crate::engine::write_tiny_model;
use std::path::Path;
use std::sync::Arc;
use wirl_engine::{ChatMessage, LoadOptions, Tokenizer};
use wirl_rollout::{EpisodeGroup, FailurePolicy, SamplingSpec, TaskSource, Trajectory, run_episodes};
use wirl_sandbox::{PluginSpec, SandboxSettings};
use wirl_test_artifacts::ARITHMETIC;

/// The tiny model with room for a few turns.
pub fn write_tiny_model_with_context(dir: &Path, context: usize) {
    write_tiny_model(dir, false);
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config = config.replace("\"max_position_embeddings\":64", &format!("\"max_position_embeddings\":{context}"));
    std::fs::write(dir.join("config.json"), config).unwrap();
}

/// The trainable policy of the model in `dir` and an engine sampling from its weights.
pub fn policy_and_engine(dir: &Path) -> (wirl_grpo::Policy, wirl_engine::EngineHandle, Arc<Tokenizer>) {
    let (config, tokenizer, tensors) = wirl_engine::load::load_tensors(dir, &LoadOptions::default()).unwrap();
    let device = wirl_engine::Device::Cpu;
    let policy = wirl_grpo::Policy::new(&config, &tensors, &device).unwrap();
    let mut source = wirl_engine::load::TensorSource::new(policy.shared_tensors());
    let model = Arc::new(wirl_engine::Model::load(&config, &mut source, &device).unwrap());
    let tokenizer = Arc::new(tokenizer);
    let (engine, _thread) = wirl_engine::EngineHandle::spawn(model, tokenizer.clone()).unwrap();
    (policy, engine, tokenizer)
}

/// Log-probs of `ledgers` after `prompt` under `policy` equal each trajectory's sampled ones
/// on every token it marks trainable — to the bit where the policy computes as the engine
/// (`Net::computes_as_the_engine`: the engine shares its weights here), else within 1e-4;
/// how many such tokens there were.
pub fn assert_sampled_log_probs(
    policy: &wirl_grpo::Policy,
    prompt: &[u32],
    trajectories: &[&wirl_rollout::Trajectory],
) -> usize {
    let ledgers: Vec<Vec<u32>> = trajectories.iter().map(|t| t.tokens.clone()).collect();
    let stats = policy.net().completion_stats(prompt, &ledgers).unwrap();
    let logp: Vec<Vec<f32>> = stats.logp.to_vec2().unwrap();
    let bound = if policy.net().computes_as_the_engine() { 0.0 } else { 1e-4 };
    let mut checked = 0;
    for (row, t) in trajectories.iter().enumerate() {
        for i in (0..t.tokens.len()).filter(|&i| t.trainable[i]) {
            let gap = (logp[row][i] - t.logprobs[i]).abs();
            assert!(gap <= bound, "row {row} token {i}: |trainer − sampler| log-prob = {gap} (at most {bound})");
            checked += 1;
        }
    }
    checked
}

/// Three-turn episodes of the arithmetic environment (the tiny model never gets the answer,
/// so every episode takes all its attempts): the ledger holds the model's turns as sampled
/// and the feedback in between; the policy's log-probs of the whole ledger equal the
/// sampler's on every model token (to the bit with the fixed-order kernels), and the loss
/// weights of the environment's tokens are 0.
#[test]
fn the_ledger_of_a_three_turn_episode_trains_on_exactly_the_sampled_tokens() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_with_context(dir.path(), 1024);
    let (policy, engine, tokenizer) = policy_and_engine(dir.path());

    let (sandbox, _cache) = crate::sandbox_with(SandboxSettings::default());
    let mut spec = PluginSpec::new(ARITHMETIC);
    spec.config.insert("shots".into(), false.into());
    spec.config.insert("attempts".into(), 3.into());
    let mut tasks = TaskSource::Environment {
        plugin: wirl_sandbox::EnvironmentPlugin::new(sandbox.load(spec).unwrap()).unwrap(),
        seed: 0,
    };
    let task = tasks.training(0).unwrap();
    let prompt = wirl_rollout::fitting_prompt(&tokenizer, &task, 8, 1024).unwrap();
    let TaskSource::Environment { plugin, .. } = &tasks else { unreachable!() };
    let run = three_turn_episodes(&engine, &tokenizer, plugin, &task, &prompt, 3, (7, 5));
    assert_eq!(run.times.turns, 3 * 2, "two turns after the first, for each of 3 episodes");
    for outcome in &run.groups[0] {
        let t = &outcome.trajectory;
        assert_eq!(t.turns, 3);
        assert_eq!(
            (t.tokens.len(), t.logprobs.len(), t.trainable.len()),
            (t.tokens.len(), t.tokens.len(), t.tokens.len())
        );
        // Model, environment, model, environment, model: five runs of one kind.
        let runs = 1 + t.trainable.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(runs, 5, "{:?}", t.trainable);
        assert!(t.trainable[0] && *t.trainable.last().unwrap());
        // The environment's answers are in the conversation: the model's turns and its feedback.
        let roles: Vec<&str> = t.conversation.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["assistant", "user", "assistant", "user", "assistant"]);
        assert!(t.conversation[1].content.contains("<answer>"), "{:?}", t.conversation[1]);
        assert_eq!(outcome.score.reward, 0.0, "the tiny model cannot solve it");
        assert_eq!(outcome.score.parts["attempts"], 3.0);
    }
    let trajectories: Vec<&wirl_rollout::Trajectory> = run.groups[0].iter().map(|o| &o.trajectory).collect();
    let model_tokens = assert_sampled_log_probs(&policy, &prompt, &trajectories);
    assert!(model_tokens > 3 * 3, "every turn sampled something");
    let ledgers: Vec<Vec<u32>> = trajectories.iter().map(|t| t.tokens.clone()).collect();

    // The loss weights: the model's tokens each weigh 1/(model tokens of the step) under
    // token-mean, the environment's and the padding's 0.
    let trainable: Vec<Vec<bool>> = run.groups[0].iter().map(|o| o.trajectory.trainable.clone()).collect();
    let width = ledgers.iter().map(Vec::len).max().unwrap();
    let weights =
        wirl_grpo::masked_token_weights(&trainable, width, wirl_grpo::Aggregation::TokenMean, model_tokens, 3, 8);
    for (row, mask) in trainable.iter().enumerate() {
        for i in 0..width {
            let w = weights[row * width + i];
            match mask.get(i) {
                Some(true) => assert_eq!(w, 1.0 / model_tokens as f32),
                _ => assert_eq!(w, 0.0, "row {row} token {i}: an environment or padding token carries loss"),
            }
        }
    }
}

/// A tokenizer of the tiny model's vocabulary with `template` as its chat template.
/// `n` episodes of `task` of up to three turns (8 tokens each, temperature 1), their first
/// turns sampled with `seeds.0` and the later ones with `seeds.1`.
fn three_turn_episodes(
    engine: &wirl_engine::EngineHandle,
    tokenizer: &Tokenizer,
    environment: &wirl_sandbox::EnvironmentPlugin,
    task: &wirl_sandbox::Task,
    prompt: &[u32],
    n: usize,
    seeds: (u64, u64),
) -> wirl_rollout::EpisodeRun {
    let sampling = SamplingSpec { max_tokens: 8, temperature: 1.0, top_p: 1.0, top_k: 0 };
    let request = wirl_engine::GenerateRequest { prompt: prompt.to_vec(), n, sampling: sampling.seeded(seeds.0) };
    let first: Vec<Trajectory> = engine
        .generate_all_until(vec![request], || false)
        .unwrap()
        .remove(0)
        .unwrap()
        .into_iter()
        .map(Into::into)
        .collect();
    let group = EpisodeGroup {
        environment,
        task,
        prompt,
        first,
        sampling,
        seed: seeds.1,
        max_turns: 3,
        failures: FailurePolicy::default(),
    };
    run_episodes(engine, tokenizer, 1024, vec![group], &|| false).unwrap().unwrap()
}

fn tokenizer_with_template(template: &str) -> Tokenizer {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model(dir.path(), false);
    let json = std::fs::read_to_string(dir.path().join("tokenizer.json")).unwrap();
    let config = serde_json::json!({ "chat_template": template, "eos_token": "</s>" });
    Tokenizer::from_json(json, Some(&config), "test").unwrap()
}

/// Chat templates are written for Jinja under Python: a template in Qwen3's style (its
/// reversed scan for the last user query with `startswith`/`endswith`, its reasoning split
/// out of replies with `split`/`lstrip`/`rstrip`/`strip`, `tests/fixtures/templates/`) renders
/// as Python's Jinja renders it — an earlier reply's reasoning left out, the last one's kept.
/// As a multi-turn ledger's template it takes replies without reasoning and refuses, saying
/// why, replies that think.
#[test]
fn templates_that_call_pythons_string_methods_render() {
    let template = include_str!("../fixtures/templates/qwen3-style.jinja");
    let tokenizer = tokenizer_with_template(template);
    let message = |role: &str, content: &str| ChatMessage { role: role.into(), content: content.into() };
    let first = [message("system", "Be brief."), message("user", "2 + 2?")];
    assert_eq!(
        tokenizer.render_chat(&first, true).unwrap(),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let reply = "<think>\n2 and 2 make 4\n</think>\n\nIt is 4.";
    let later = [message("user", "2 + 2?"), message("assistant", reply), message("user", "And 3 + 3?")];
    assert_eq!(
        tokenizer.render_chat(&later, false).unwrap(),
        "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\nIt is 4.<|im_end|>\n<|im_start|>user\nAnd 3 + \
         3?<|im_end|>\n"
    );
    let last = [message("user", "2 + 2?"), message("assistant", reply)];
    assert_eq!(
        tokenizer.render_chat(&last, false).unwrap(),
        "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n<think>\n2 and 2 make 4\n</think>\n\nIt is \
         4.<|im_end|>\n"
    );
    wirl_rollout::check_template(&tokenizer).unwrap();
    let user = |text: &str| wirl_sandbox::Message { role: "user".into(), content: text.into() };
    let error = wirl_rollout::episode::appended_text(&tokenizer, &[user("2 + 2?")], reply, None, &[user("And 3 + 3?")])
        .unwrap_err()
        .to_string();
    assert!(error.contains("leaves out the reply's reasoning") && error.contains("/no_think"), "{error}");
    let appended =
        wirl_rollout::episode::appended_text(&tokenizer, &[user("2 + 2?")], "It is 4.", None, &[user("And 3 + 3?")])
            .unwrap();
    assert_eq!(appended, "<|im_end|>\n<|im_start|>user\nAnd 3 + 3?<|im_end|>\n<|im_start|>assistant\n");

    // Template variables (TRL's and vLLM's chat_template_kwargs): Qwen3's enable_thinking.
    let mut tokenizer = tokenizer;
    let vars = |value: bool| wirl_engine::TemplateVars::from([("enable_thinking".to_string(), value.into())]);
    tokenizer.set_template_vars(vars(false)).unwrap();
    let prompt = tokenizer.render_chat(&first, true).unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{prompt:?}");
    let over = tokenizer.render_chat_with(&first, true, &vars(true)).unwrap();
    assert!(over.ends_with("<|im_start|>assistant\n"), "a caller's variables go over the tokenizer's: {over:?}");
    let reserved = wirl_engine::TemplateVars::from([("messages".to_string(), serde_json::json!([]))]);
    let error = tokenizer.set_template_vars(reserved.clone()).unwrap_err().to_string();
    assert!(error.contains("`messages` is the template's own variable"), "{error}");
    assert!(tokenizer.render_chat_with(&first, true, &reserved).is_err());

    // transformers' `{% generation %}` tags (TRL's assistant_only_loss) render their body.
    let plain = "{% for m in messages %}{{ m.role }}:\n{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    let tagged = "{% for m in messages %}{{ m.role }}:\n{% if m.role == 'assistant' %}{%- generation -%}\n{{ m.content }}\n{%- endgeneration %}{% else %}{{ m.content }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    let conversation = [message("user", "2 + 2?"), message("assistant", "It is 4."), message("user", "And 3 + 3?")];
    let (plain, tagged) = (tokenizer_with_template(plain), tokenizer_with_template(tagged));
    let expected = "user:\n2 + 2?\nassistant:\nIt is 4.\nuser:\nAnd 3 + 3?\nassistant:";
    assert_eq!(plain.render_chat(&conversation, true).unwrap(), expected);
    // Its whitespace control kept: the newlines inside the tags are trimmed as Jinja trims them.
    assert_eq!(tagged.render_chat(&conversation, true).unwrap(), expected);
}

/// The drift check: a template that drops earlier turns, or one that rewrites the model's
/// reply, is refused with a message saying so; an append-only one passes.
#[test]
fn a_template_that_is_not_append_only_is_refused() {
    let append_only = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    wirl_rollout::check_template(&tokenizer_with_template(append_only)).unwrap();
    // Only the last two messages: rendering a longer conversation changes the beginning.
    let windowed = "{% for m in messages[-2:] %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    let error = wirl_rollout::check_template(&tokenizer_with_template(windowed)).unwrap_err().to_string();
    assert!(error.contains("not append-only"), "{error}");
    // The model's replies upper-cased: the ledger would not be what the template shows.
    let rewriting = "{% for m in messages %}{{ m.role }}: {% if m.role == 'assistant' %}{{ m.content | upper }}{% else %}{{ m.content }}{% endif %}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    let error = wirl_rollout::check_template(&tokenizer_with_template(rewriting)).unwrap_err().to_string();
    assert!(error.contains("renders the model's reply"), "{error}");
}

/// Episodes of a `wirl:rl@0.2.0` environment that rewards turns (`plugins/tests/turn-rewards`:
/// each turn the episode goes on from earns its reply's length, but the turn numbered
/// `silent`): the episode's score carries one reward per model turn (0 for the silent turn
/// and for the last, whose reward is the outcome), and the ledger knows where each turn's
/// tokens start, the model's first and the environment's after.
#[test]
fn turn_rewards_of_a_0_2_0_environment_are_kept_per_turn_with_their_tokens() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_with_context(dir.path(), 1024);
    let (_policy, engine, tokenizer) = policy_and_engine(dir.path());
    let (sandbox, _cache) = crate::sandbox_with(SandboxSettings::default());
    let mut spec = PluginSpec::new(wirl_test_artifacts::TURN_REWARDS);
    spec.config.insert("turns".into(), 3.into());
    spec.config.insert("silent".into(), 1.into());
    spec.config.insert("outcome".into(), 0.25.into());
    let plugin = wirl_sandbox::EnvironmentPlugin::new(sandbox.load(spec).unwrap()).unwrap();
    assert_eq!(plugin.plugin().wit_version(), "0.2.0");
    let task = wirl_sandbox::Task {
        id: "t/0".into(),
        messages: vec![wirl_sandbox::Message::new("user", "Say something.")],
        answer: None,
        metadata: None,
    };
    let prompt = wirl_rollout::fitting_prompt(&tokenizer, &task, 8, 1024).unwrap();
    let run = three_turn_episodes(&engine, &tokenizer, &plugin, &task, &prompt, 4, (3, 9));
    let mut first_rewards = Vec::new();
    for outcome in &run.groups[0] {
        let (t, score) = (&outcome.trajectory, &outcome.score);
        assert_eq!((t.turns, score.reward), (3, 0.25), "{:?}", score.notes);
        // The model's replies are the conversation's assistant messages, in order.
        let replies: Vec<&str> =
            t.conversation.iter().filter(|m| m.role == "assistant").map(|m| m.content.as_str()).collect();
        assert_eq!(score.turn_rewards, [replies[0].chars().count() as f32, 0.0, 0.0], "{replies:?}");
        first_rewards.push(score.turn_rewards[0]);
        // Each turn's span starts with the model's tokens and ends with the environment's
        // answer (the last turn's with the model's).
        let spans = t.turn_spans();
        assert_eq!(spans.len(), 3);
        assert_eq!(spans[0].start, 0);
        assert_eq!(spans[2].end, t.tokens.len());
        for (k, span) in spans.iter().enumerate() {
            assert!(t.trainable[span.start], "turn {k} starts with a model token");
            let model: Vec<u32> = span.clone().filter(|&i| t.trainable[i]).map(|i| t.tokens[i]).collect();
            let ran = span.clone().skip_while(|&i| t.trainable[i]).all(|i| !t.trainable[i]);
            assert!(ran, "turn {k}: the model's tokens, then the environment's");
            let text = tokenizer.decode(&model, true).unwrap();
            assert_eq!(text.trim(), replies[k].trim(), "turn {k}'s tokens are its reply");
        }
    }
    assert!(first_rewards.iter().any(|&r| r != first_rewards[0]), "the samples' replies differ: {first_rewards:?}");

    // A turn reward that is not a number fails its episode (masked, by default), never a reward.
    let mut spec = PluginSpec::new(wirl_test_artifacts::TURN_REWARDS);
    spec.config.insert("nan".into(), 1.into());
    let plugin = wirl_sandbox::EnvironmentPlugin::new(sandbox.load(spec).unwrap()).unwrap();
    let run = three_turn_episodes(&engine, &tokenizer, &plugin, &task, &prompt, 2, (3, 9));
    for outcome in &run.groups[0] {
        let score = &outcome.score;
        assert_eq!(score.status, wirl_rollout::Status::Masked, "{score:?}");
        assert_eq!(score.failures, ["non_finite"], "{score:?}");
        let note = &score.notes["turn_rewards"];
        assert!(note.contains("turn reward of NaN"), "{note}");
        assert_eq!(outcome.trajectory.turns, 2, "the episode ended at the NaN");
    }
}

/// Turn rewards train: the turn-rewards environment's outcome is the same for every episode
/// (a 0.1.0 environment's groups would carry no signal, and nothing would train), but its
/// turns' rewards differ, so its groups are kept and the update moves the weights; with
/// `quiet = true` (no turn rewards) the same run keeps no group. The rollouts record each
/// episode's turn rewards.
#[test]
fn a_run_learns_from_turn_rewards_when_the_outcome_says_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    write_tiny_model_with_context(&model, 1024);
    let train = |name: &str, quiet: bool| {
        let config = dir.path().join(format!("{name}.toml"));
        std::fs::write(
            &config,
            format!(
                r#"
[model]
path = {model:?}

[[tasks]]
name = "turns"
max_turns = 3
[tasks.environment]
plugin = {plugin:?}
config = {{ turns = 3, quiet = {quiet} }}

[sampling]
max_tokens = 6

[grpo]
steps = 2
prompts_per_step = 2
group_size = 4
learning_rate = 0.01
beta = 0.0
seed = 3
"#,
                plugin = wirl_test_artifacts::TURN_REWARDS,
            ),
        )
        .unwrap();
        let run = dir.path().join(name);
        let out = crate::grpo::train(&config, &run);
        assert!(out.status.success(), "{name}: {}", String::from_utf8_lossy(&out.stderr));
        (crate::grpo::metrics(&run), crate::grpo::rollouts(&run))
    };
    let (metrics, rollouts) = train("rewarded", false);
    let kept: u64 = metrics.iter().map(|m| m["groups_kept"].as_u64().unwrap()).sum();
    assert!(kept > 0, "groups told apart by their turns train: {metrics:?}");
    assert!(metrics.iter().any(|m| m["grad_norm"].as_f64().unwrap() > 0.0), "{metrics:?}");
    for rollout in rollouts.iter().filter(|r| r.get("completion").is_some()) {
        let turn_rewards = rollout["turn_rewards"].as_array().unwrap_or_else(|| panic!("{rollout}"));
        assert_eq!(turn_rewards.len(), 3, "{rollout}");
        assert_eq!(rollout["reward"], 0.0);
    }
    let (metrics, rollouts) = train("quiet", true);
    let kept: u64 = metrics.iter().map(|m| m["groups_kept"].as_u64().unwrap()).sum();
    assert_eq!(kept, 0, "equal outcomes and no turn rewards carry no signal: {metrics:?}");
    assert!(rollouts.iter().all(|r| r.get("turn_rewards").is_none()));
}
