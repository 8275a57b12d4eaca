//! Agent plugins: the `inference` import wired to a host, the agent's deadline counting its
//! own work only, hostile agents in training (each a failed trajectory with a named reason,
//! the step going on), and the exact tokens of resolved rollouts.

use crate::multiturn::{assert_sampled_log_probs, policy_and_engine, write_tiny_model_with_context};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wirl_sandbox::{
    AgentPlugin, Completion, FinishReason, InferenceHost, Message, PluginSpec, RolloutRequest, Sampling,
};
use wirl_test_artifacts::{ARITHMETIC, CALCULATOR_AGENT, HOSTILE, HOSTILE_AGENT};

/// An inference host that answers every conversation with its length, slowly.
struct SlowHost {
    delay: Duration,
}

impl InferenceHost for SlowHost {
    fn generate(
        &self,
        conversations: Vec<Vec<Message>>,
        _sampling: Sampling,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Vec<Completion>, String>> + Send + '_>> {
        Box::pin(async move {
            tokio::time::sleep(self.delay).await;
            Ok(conversations
                .iter()
                .enumerate()
                .map(|(i, c)| Completion {
                    text: "x".repeat(c.len()),
                    finish_reason: FinishReason::Stop,
                    generation: i as u64,
                })
                .collect())
        })
    }
}

fn request(groups: u32, group_size: u32) -> RolloutRequest {
    RolloutRequest {
        groups,
        group_size,
        sampling: Sampling {
            max_tokens: 8,
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            stop: Vec::new(),
            seed: None,
        },
        seed: 0,
        cursor: 0,
    }
}

fn agent(mode: &str, deadline_ms: u64) -> (AgentPlugin, tempfile::TempDir) {
    let (sandbox, cache) = crate::sandbox();
    let mut spec = PluginSpec::new(HOSTILE_AGENT);
    spec.config.insert("mode".into(), mode.into());
    spec.limits.deadline_ms = deadline_ms;
    (AgentPlugin::new(sandbox.load(spec).unwrap()).unwrap(), cache)
}

/// Four generate calls of 250 ms each under a 300 ms deadline: the agent's own work is a
/// few milliseconds, so it finishes; time waiting for the engine is not its time. An agent
/// that loops in its own code is still cut at its deadline, long before it would end.
#[test]
fn an_agents_deadline_counts_its_own_work_not_generation() {
    let (slow, _cache) = agent("slow_generate_ok", 300);
    let host = Arc::new(SlowHost { delay: Duration::from_millis(250) });
    let started = std::time::Instant::now();
    let groups = slow.rollouts(&request(2, 2), host.clone()).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1000), "four calls of 250 ms each");
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0].rollouts.len(), 2);

    let (hang, _cache) = agent("hang", 300);
    let started = std::time::Instant::now();
    let failure = hang.rollouts(&request(1, 2), host).unwrap_err();
    assert_eq!(failure.kind.name(), "deadline", "{failure}");
    assert!(started.elapsed() < Duration::from_secs(10), "cut at its deadline, not left running");
}

/// A training config on the tiny model: the arithmetic task scored by the length reward,
/// beside an agent task of the hostile agent in `mode`.
fn write_agent_config(dir: &Path, mode: &str) -> std::path::PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    write_tiny_model_with_context(&model, 1024);
    let config = format!(
        r#"
[model]
path = {model:?}

[[tasks]]
name = "sums"
[tasks.environment]
plugin = {ARITHMETIC:?}
config = {{ shots = false }}
[[tasks.rewards]]
plugin = {HOSTILE:?}

[[tasks]]
name = "agent"
[tasks.agent]
plugin = {HOSTILE_AGENT:?}
config = {{ mode = "{mode}" }}
deadline_ms = 500
max_generate_calls = 2

[sampling]
max_tokens = 6

[grpo]
steps = 1
prompts_per_step = 2
group_size = 4
learning_rate = 0.01
beta = 0.0
seed = 3

[eval]
tasks = 1
"#
    );
    let path = dir.join("train.toml");
    std::fs::write(&path, config).unwrap();
    path
}

use crate::grpo::rollouts;

/// Agents that hang, trap, call generate without end, name an unknown handle or break the
/// chain of their generations, or fail a rollout: each failed trajectory is masked with a
/// named reason, the step goes on (the other task trains), and the run ends well.
#[test]
fn hostile_agents_give_failed_trajectories_with_named_reasons_and_the_step_goes_on() {
    let cases = [
        ("hang", "deadline", 4),
        ("trap", "trap", 4),
        ("generate_forever", "deadline", 4),
        ("unknown_handle", "unknown_generation", 2),
        ("broken_chain", "broken_generations", 2),
        ("agent_error", "agent_error", 2),
    ];
    for (mode, kind, failed) in cases {
        let dir = tempfile::tempdir().unwrap();
        let config = write_agent_config(dir.path(), mode);
        let run = dir.path().join("run");
        let out = crate::grpo::train(&config, &run);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{mode}: {stderr}");
        let metrics = crate::grpo::metrics(&run);
        assert_eq!(metrics[0]["failures"][kind], failed, "{mode}: {}", metrics[0]);
        assert_eq!(metrics[0]["trajectories_masked"], failed, "{mode}");
        assert_eq!(metrics[0]["tasks"]["sums"]["groups"], 1, "{mode}: the other task trained");
        let agent: Vec<serde_json::Value> = rollouts(&run).into_iter().filter(|r| r["task_name"] == "agent").collect();
        assert_eq!(agent.len(), 4, "{mode}: one record per trajectory asked for");
        let masked: Vec<&serde_json::Value> = agent.iter().filter(|r| r["status"] == "masked").collect();
        assert_eq!(masked.len(), failed, "{mode}");
        for record in masked {
            let note = record["notes"]["hostile_agent"].as_str().unwrap();
            assert!(note.contains(kind), "{mode}: {note}");
        }
    }
}

/// The calculator agent on the tiny model: its rollouts resolve to the exact tokens the
/// engine sampled (the trainer's log-probs equal the sampler's on every model token, to the
/// bit on a CPU with the fixed-order kernels, else within 1e-4), and its example config
/// trains.
#[test]
fn the_calculator_agents_rollouts_carry_the_sampled_tokens_and_its_example_trains() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_with_context(dir.path(), 4096);
    let (policy, engine, tokenizer) = policy_and_engine(dir.path());
    let (sandbox, _cache) = crate::sandbox();
    let agent = AgentPlugin::new(sandbox.load(PluginSpec::new(CALCULATOR_AGENT)).unwrap()).unwrap();
    let call = wirl_rollout::AgentCall {
        agent: &agent,
        engine: &engine,
        tokenizer: &tokenizer,
        context: 4096,
        groups: 2,
        group_size: 3,
        sampling: wirl_rollout::SamplingSpec { max_tokens: 10, temperature: 1.0, top_p: 1.0, top_k: 0 },
        seed: 9,
        cursor: 0,
        limits: wirl_rollout::AgentLimits { generate_calls: 4, tokens: 100 },
        failures: wirl_rollout::FailurePolicy::default(),
        task_name: "calc",
    };
    let groups = wirl_rollout::agent_groups(&call);
    assert_eq!(groups.len(), 2);
    for group in &groups {
        assert!(group.task.id.starts_with("calculator/9/"), "{}", group.task.id);
        assert_eq!(group.trajectories.len(), 3);
        assert!(!group.prompt.is_empty());
        for (t, score) in group.trajectories.iter().zip(&group.scores) {
            assert!(score.status.usable(), "{:?}", score.notes);
            assert!(t.trainable.iter().any(|&x| x));
        }
        let trajectories: Vec<&wirl_rollout::Trajectory> = group.trajectories.iter().collect();
        assert_sampled_log_probs(&policy, &group.prompt, &trajectories);
    }

    // examples/train/agent.toml as shipped, on the tiny model: one step, evaluated.
    let (metrics, summary, log) = crate::trainer::run_example_logged("agent.toml", dir.path(), &[]);
    assert_eq!(metrics[0]["tasks"]["calculator"]["groups"], 4, "{}", metrics[0]);
    // The agents' time (their generation) is on the step's line: it read `gen 0.0s` before.
    let seconds = metrics[0]["time_s"]["agents"].as_f64().unwrap();
    assert!(seconds > 0.0, "{}", metrics[0]);
    assert_eq!(crate::trainer::step_line_seconds(&log, "agents"), Some(format!("{seconds:.1}").as_str()), "{log}");
    assert!(summary["held_out_by_task"]["calculator"].is_array(), "{summary}");
}

/// The Python agent (`plugins/python/check-agent`): two turns per rollout, the second
/// continuing the first's conversation. The host extends the first generation's ledger (its
/// sampled ids kept, the check request appended with no loss), so every rollout resolves to
/// model / request / model tokens whose log-probs the trainer reproduces (to the bit on a CPU
/// with the fixed-order kernels).
#[test]
fn the_python_agents_two_turn_rollouts_resolve_to_one_ledger() {
    let dir = tempfile::tempdir().unwrap();
    write_tiny_model_with_context(dir.path(), 4096);
    let (policy, engine, tokenizer) = policy_and_engine(dir.path());
    let (sandbox, _cache) = crate::sandbox();
    let mut spec = PluginSpec::new(wirl_test_artifacts::PYTHON_CHECK_AGENT);
    spec.limits.deadline_ms = 20_000;
    let agent = AgentPlugin::new(sandbox.load(spec).unwrap()).unwrap();
    let call = wirl_rollout::AgentCall {
        agent: &agent,
        engine: &engine,
        tokenizer: &tokenizer,
        context: 4096,
        groups: 2,
        group_size: 2,
        sampling: wirl_rollout::SamplingSpec { max_tokens: 8, temperature: 1.0, top_p: 1.0, top_k: 0 },
        seed: 4,
        cursor: 0,
        limits: wirl_rollout::AgentLimits { generate_calls: 2, tokens: 100 },
        failures: wirl_rollout::FailurePolicy::default(),
        task_name: "check",
    };
    let groups = wirl_rollout::agent_groups(&call);
    assert_eq!(groups.len(), 2);
    for group in &groups {
        for (t, score) in group.trajectories.iter().zip(&group.scores) {
            assert!(score.status.usable(), "{:?}", score.notes);
            assert_eq!(t.turns, 2);
            let runs = 1 + t.trainable.windows(2).filter(|w| w[0] != w[1]).count();
            assert_eq!(runs, 3, "model, the check request, model: {:?}", t.trainable);
            assert!(score.parts.contains_key("changed"));
        }
        let trajectories: Vec<&wirl_rollout::Trajectory> = group.trajectories.iter().collect();
        assert_sampled_log_probs(&policy, &group.prompt, &trajectories);
    }
}
