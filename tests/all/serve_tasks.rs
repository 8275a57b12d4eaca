//! `wirl serve --config`: a training config's tasks over HTTP — scores (wirl's, OpenRLHF's,
//! a TRL reward function's), tasks by index, episodes with an idle reaper, Megatron-RL's
//! rollout endpoints — and `wirl train` taking its task from such a server, through that
//! server's death.

use crate::serve::Server;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use wirl_test_artifacts::{ARITHMETIC, HOSTILE, MATH_ANSWER};

/// Three tasks: arithmetic scored by math-answer; `flaky`, whose reward traps on every call
/// (masked); `retry`, arithmetic's three-turn episodes.
pub(crate) fn served_config(dir: &Path) -> std::path::PathBuf {
    let text = format!(
        r#"
[[tasks]]
name = "arithmetic"
[tasks.environment]
plugin = {ARITHMETIC:?}
seed = 0
config = {{ kind = "chain_sum", min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 }}
[[tasks.rewards]]
plugin = {MATH_ANSWER:?}

[[tasks]]
name = "flaky"
[tasks.environment]
plugin = {ARITHMETIC:?}
[[tasks.rewards]]
plugin = {HOSTILE:?}
config = {{ trap_always = true }}

[[tasks]]
name = "retry"
max_turns = 3
[tasks.environment]
plugin = {ARITHMETIC:?}
config = {{ shots = false }}
"#
    );
    let path = dir.join("served.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn ok(server: &Server, path: &str, body: Value) -> Value {
    let (status, answer) = server.post(path, &body.to_string());
    assert_eq!(status, 200, "{path} {body}: {answer}");
    answer
}

#[test]
fn served_tasks_score_draw_step_episodes_and_roll_out() {
    let dir = tempfile::tempdir().unwrap();
    let config = served_config(dir.path());
    let server = Server::start(&["--config", config.to_str().unwrap(), "--episode-idle-s", "1", "--max-episodes", "3"]);
    let (status, _, listed) = server.http("GET", "/v1/tasks", &[], b"");
    assert_eq!(status, 200, "{listed}");
    let listed: Value = serde_json::from_str(&listed).unwrap();
    let names: Vec<&str> = listed["data"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["arithmetic", "flaky", "retry"]);
    assert_eq!(listed["data"][0]["rewards"][0]["sha256"].as_str().unwrap().len(), 64);

    // Tasks by index are the environment's own, the same every time; another seed, others.
    let drawn = ok(&server, "/v1/tasks/draw", json!({"task": "arithmetic", "index": 5, "count": 3}));
    assert_eq!(drawn, ok(&server, "/v1/tasks/draw", json!({"task": "arithmetic", "index": 5, "count": 3})));
    assert_eq!(drawn["tasks"][1]["task"]["id"], "arithmetic/0/6");
    let reseeded = ok(&server, "/v1/tasks/draw", json!({"task": "arithmetic", "index": 5, "seed": 9}));
    assert_eq!(reseeded["tasks"][0]["task"]["id"], "arithmetic/9/5");
    let held = ok(&server, "/v1/tasks/draw", json!({"task": "arithmetic", "split": "eval"}));
    assert_eq!(held["tasks"][0]["task"]["id"], format!("arithmetic/0/{}", 1u64 << 40));

    // Scores: one group; several; a reward that fails is null and named, never 0.
    let problem = json!({"prompt": "What is 2 + 3?", "answer": "5"});
    let scored = ok(
        &server,
        "/v1/score",
        json!({"task": "arithmetic", "problem": problem, "completions": ["<answer>5</answer>", "<answer>6</answer>", "5"]}),
    );
    assert_eq!(scored["rewards"], json!([1.0, 0.0, 1.0]), "{scored}");
    assert_eq!(scored["scores"][2]["parts"]["format"], 0.0, "{scored}");
    let groups = ok(
        &server,
        "/v1/score",
        json!({"task": "arithmetic", "groups": [{"problem": problem, "completions": ["<answer>5</answer>"]},
                                              {"problem": {"prompt": "1+1", "answer": "2"}, "completions": ["<answer>2</answer>"]}]}),
    );
    assert_eq!(groups["groups"][1]["rewards"], json!([1.0]), "{groups}");
    let flaky = ok(&server, "/v1/score", json!({"task": "flaky", "problem": problem, "completions": ["a", "b"]}));
    assert_eq!(flaky["rewards"], json!([null, null]), "{flaky}");
    assert_eq!(flaky["scores"][0]["status"], "masked", "{flaky}");
    assert_eq!(flaky["scores"][0]["failures"], json!(["trap"]), "{flaky}");
    let openrlhf = ok(
        &server,
        "/get_reward",
        json!({"task": "arithmetic", "query": ["Q: 2+3? <answer>5</answer>", "Q: 2+3? <answer>4</answer>"],
               "prompts": ["Q: 2+3?", "Q: 2+3?"], "labels": ["5", "5"]}),
    );
    assert_eq!(openrlhf["rewards"], json!([1.0, 0.0]), "{openrlhf}");

    // A TRL reward function, called as GRPOTrainer calls it.
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/serve/trl_reward.py");
    let run = Command::new("python3").arg(script).arg(format!("http://{}", server.address)).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let trl: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(trl["name"], "wirl_arithmetic");
    assert_eq!(trl["conversational"], json!([1.0, 0.0, 1.0, 0.0]), "{trl}");
    assert_eq!(trl["standard"], json!([1.0, 0.0]), "{trl}");
    assert_eq!(trl["masked"], json!([null]), "{trl}");
    assert!(trl["unreachable"].as_str().unwrap().contains("after 2 tries"), "{trl}");
    assert!(trl["unknown_task"].as_str().unwrap().contains("no task `nonesuch`"), "{trl}");

    // Episodes: a single-turn task is scored on its step; a multi-turn one goes on.
    let opened = server.post("/v1/episodes", &json!({"task": "arithmetic", "problem": problem}).to_string());
    assert_eq!(opened.0, 201, "{}", opened.1);
    let id = opened.1["session_id"].as_str().unwrap().to_string();
    let step = ok(&server, &format!("/v1/episodes/{id}/step"), json!({"action": "<answer>5</answer>"}));
    assert_eq!((step["done"].clone(), step["reward"].clone()), (json!(true), json!(1.0)), "{step}");
    let (status, again) = server.post(&format!("/v1/episodes/{id}/step"), r#"{"action": "x"}"#);
    assert_eq!(status, 404, "a finished episode is closed: {again}");
    let (_, opened) = server.post("/v1/episodes", r#"{"task": "retry", "index": 3}"#);
    let id = opened["session_id"].as_str().unwrap().to_string();
    let answer: u64 = opened["task"]["answer"].as_str().unwrap().parse().unwrap();
    let wrong =
        ok(&server, &format!("/v1/episodes/{id}/step"), json!({"action": format!("<answer>{}</answer>", answer + 1)}));
    assert_eq!(wrong["done"], false, "{wrong}");
    assert!(!wrong["observation"]["messages"].as_array().unwrap().is_empty(), "feedback: {wrong}");
    let right =
        ok(&server, &format!("/v1/episodes/{id}/step"), json!({"action": format!("<answer>{answer}</answer>")}));
    assert_eq!((right["done"].clone(), right["reward"].clone()), (json!(true), json!(0.5)), "{right}");
    // At most 3 open; idle ones are reaped (after 1 s here).
    for _ in 0..3 {
        assert_eq!(server.post("/v1/episodes", r#"{"task": "retry"}"#).0, 201);
    }
    let (status, full) = server.post("/v1/episodes", r#"{"task": "retry"}"#);
    assert_eq!(status, 503, "{full}");
    // Reaped once idle: asked until a slot frees (bounded, not timed).
    let reaped = (0..120).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(250));
        server.post("/v1/episodes", r#"{"task": "retry"}"#).0 == 201
    });
    assert!(reaped, "the idle episodes were never reaped");

    // Megatron's rollouts: token rollouts, the prompt and the sampled ids, their log-probs.
    let grouped = ok(
        &server,
        "/grouped_rollouts/",
        json!({"task": "arithmetic", "num_groups": 2, "rollouts_per_group": 3, "generation_args": {"max_tokens": 8},
               "inference_interface": {"anything": "ignored"}}),
    );
    let grouped = grouped.as_array().unwrap();
    assert_eq!(grouped.iter().map(|g| g.as_array().unwrap().len()).collect::<Vec<_>>(), [3, 3]);
    for rollout in grouped.iter().flat_map(|g| g.as_array().unwrap()) {
        let trajectory = rollout["trajectory"][0].as_array().unwrap();
        let prompt = rollout["prompt_length"][0].as_u64().unwrap() as usize;
        let sampled = trajectory.len() - prompt;
        assert!((1..=8).contains(&sampled), "{rollout}");
        assert_eq!(rollout["logprobs"][0].as_array().unwrap().len(), sampled, "{rollout}");
        let mask = rollout["generation_mask"][0].as_array().unwrap();
        assert_eq!(mask.iter().filter(|m| **m == json!(true)).count(), sampled, "{rollout}");
        assert!(rollout["reward"].is_number() && rollout["rollout_status"] == "ok", "{rollout}");
        assert_eq!(rollout["env_id"], "arithmetic");
    }
    let episodes =
        ok(&server, "/rollouts/", json!({"task": "retry", "num_rollouts": 2, "generation_args": {"max_tokens": 8}}));
    for rollout in episodes.as_array().unwrap() {
        let mask = rollout["generation_mask"][0].as_array().unwrap();
        assert!(mask.contains(&json!(false)) && mask.contains(&json!(true)), "a ledger of turns: {rollout}");
        assert!(rollout["turns"].as_u64().unwrap() >= 1, "{rollout}");
    }
    let evaluation = ok(
        &server,
        "/evaluation/",
        json!({"task": "arithmetic", "num_prompts": 3, "generation_args": {"max_tokens": 8}}),
    );
    assert_eq!(evaluation["env_id"], "arithmetic");
    assert_eq!(evaluation["results"].as_array().unwrap().len(), 3, "{evaluation}");
    assert!(evaluation["pass_rate"].is_number(), "{evaluation}");
    // Held-out rollouts from an offset: the held-out range's tasks from it, as many as asked
    // (the offset was applied twice before: 1 group of 3).
    let validation = ok(
        &server,
        "/grouped_rollouts/",
        json!({"task": "arithmetic", "num_groups": 3, "rollouts_per_group": 1, "validation": true,
               "start_index": 2, "generation_args": {"max_tokens": 4}}),
    );
    let ids: Vec<&str> = validation.as_array().unwrap().iter().map(|g| g[0]["problem_id"].as_str().unwrap()).collect();
    let held = 1u64 << 40;
    assert_eq!(ids, [2, 3, 4].map(|k| format!("arithmetic/0/{}", held + k)), "{validation}");

    // Hostile bodies: a 4xx naming the field, never a 5xx.
    let cases = [
        ("/v1/score", json!({"problem": problem, "completions": ["x"]}), 400, "task"),
        ("/v1/score", json!({"task": "nonesuch", "problem": problem, "completions": ["x"]}), 404, "task"),
        ("/v1/score", json!({"task": "arithmetic", "completions": ["x"]}), 400, "problem"),
        ("/v1/score", json!({"task": "arithmetic", "problem": problem, "completions": []}), 400, "completions"),
        ("/v1/score", json!({"task": "arithmetic", "problem": problem, "completions": [1]}), 400, "completions"),
        ("/v1/score", json!({"task": "arithmetic", "groups": "x"}), 400, "groups"),
        ("/v1/tasks/draw", json!({"task": "arithmetic", "count": 100000}), 400, "count"),
        ("/v1/tasks/draw", json!({"task": "arithmetic", "index": -1}), 400, "index"),
        ("/v1/tasks/draw", json!({"task": "arithmetic", "split": "test"}), 400, "split"),
        ("/v1/episodes", json!({"task": "arithmetic", "seed": "x"}), 400, "seed"),
        ("/v1/episodes/nonesuch/step", json!({"action": "x"}), 404, ""),
        ("/grouped_rollouts/", json!({"task": "arithmetic", "num_groups": 0}), 400, "num_groups"),
        (
            "/grouped_rollouts/",
            json!({"task": "arithmetic", "num_groups": 1, "rollouts_per_group": 1000}),
            400,
            "rollouts_per_group",
        ),
        // The engine's rule set, word for word, as for a chat request and a config.
        (
            "/grouped_rollouts/",
            json!({"task": "arithmetic", "num_groups": 1, "generation_args": {"temperature": 2.5}}),
            400,
            "`generation_args.temperature` must be from 0 to 2",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "temperature": 2.5}),
            400,
            "`temperature` must be from 0 to 2",
        ),
        (
            "/grouped_rollouts/",
            json!({"task": "arithmetic", "num_groups": 1, "generation_args": {"top_k": 1.5}}),
            400,
            "`generation_args.top_k` must be a whole number",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "min_p": 1.0}),
            400,
            "`min_p` must be from 0 up to (not including) 1",
        ),
        (
            "/grouped_rollouts/",
            json!({"task": "arithmetic", "num_groups": 1, "generation_args": {"max_tokens": 1e12}}),
            400,
            "max_tokens",
        ),
        ("/get_reward", json!({"task": "arithmetic", "query": ["a"], "labels": ["1", "2"]}), 400, "labels"),
        ("/evaluation/", json!({"task": "arithmetic", "rank_info": [3, 2]}), 400, "rank_info"),
    ];
    for (path, body, status, field) in cases {
        let (got, answer) = server.post(path, &body.to_string());
        assert_eq!(got, status, "{path} {body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(field), "{path} {body}: {answer}");
    }
    let (status, _, _) = server.http("POST", "/v1/score", &[], b"{not json");
    assert_eq!(status, 400);
    let (status, health, _) = server.http("GET", "/health", &[], b"");
    assert_eq!(status, 200, "{health}");
}

/// A line of a JSONL file, parsed.
fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// `wirl train` with its task from another `wirl serve`: the tasks are the server's, sampled
/// here and scored there; when the server dies (kill -9) after step 1, later steps'
/// groups are recorded as failed (`remote`, masked) and the run ends normally.
#[test]
fn a_training_takes_its_task_from_another_server_and_outlives_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = served_config(dir.path());
    let mut server = Server::start(&["--config", config.to_str().unwrap()]);
    let model = crate::engine::default_model();
    let train = dir.path().join("train.toml");
    std::fs::write(
        &train,
        format!(
            r#"
[model]
path = {model:?}
[[tasks]]
name = "math"
remote = {{ url = "http://{}", task = "arithmetic", timeout_s = 20, retries = 1 }}
[sampling]
max_tokens = 8
[grpo]
steps = 3
prompts_per_step = 2
group_size = 2
checkpoint_every = 0
[eval]
tasks = 2
"#,
            server.address
        ),
    )
    .unwrap();
    // Refused before any step, naming the key or the server and what to do.
    let text = std::fs::read_to_string(&train).unwrap();
    let remote_line = text.lines().find(|l| l.starts_with("remote")).unwrap().to_string();
    let cases = [
        (text.replace(&remote_line, r#"remote = { url = "ftp://somewhere" }"#), "remote.url"),
        (text.replace("timeout_s = 20", "timeout_s = nan"), "remote.timeout_s"),
        (text.replace("retries = 1", "retries = 100"), "remote.retries"),
        (
            text.replace("[sampling]", "[[tasks.rewards]]\nplugin = \"builtin:math-answer\"\n[sampling]"),
            "scored by its server",
        ),
        (text.replace("task = \"arithmetic\"", "task = \"nonesuch\""), "does not serve `nonesuch`"),
        (text.replace(&server.address, "127.0.0.1:9"), "wirl serve --config"),
        (text.replace(", task = \"arithmetic\"", ""), "name one with `task`"),
    ];
    for (bad, expected) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, bad).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("train")
            .arg(&path)
            .arg("--run-dir")
            .arg(dir.path().join("refused"))
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && said.contains(expected), "expected {expected:?} in: {said}");
        let _ = std::fs::remove_dir_all(dir.path().join("refused"));
    }

    let run_dir = dir.path().join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train"])
        .arg(&train)
        .arg("--run-dir")
        .arg(&run_dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut log = Vec::new();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines().map_while(Result::ok);
    // Step 1 done: the server dies.
    for line in lines.by_ref() {
        let done = line.starts_with("step   1/3");
        log.push(line);
        if done {
            server.kill();
            break;
        }
    }
    log.extend(lines);
    let status = child.wait().unwrap();
    let log = log.join("\n");
    assert!(status.success(), "{log}");

    let rollouts = jsonl(&run_dir.join("rollouts.jsonl"));
    let of_step = |s: u64| rollouts.iter().filter(|r| r["step"] == s).collect::<Vec<_>>();
    let first = of_step(1);
    assert_eq!(first.len(), 4, "{first:?}");
    assert!(
        first.iter().all(|r| r["status"] == "ok" && r["task"].as_str().unwrap().starts_with("arithmetic/0/")),
        "{first:?}"
    );
    for step in [2, 3] {
        let failed = of_step(step);
        assert_eq!(failed.len(), 4, "every trajectory of step {step} is recorded: {failed:?}");
        for record in failed {
            assert_eq!(record["status"], "masked", "{record}");
            assert_eq!(record["failures"], json!(["remote"]), "{record}");
            assert!(record["notes"]["remote"].as_str().unwrap().contains("after 2 tries"), "{record}");
        }
    }
    let metrics = jsonl(&run_dir.join("metrics.jsonl"));
    assert_eq!(metrics.len(), 3, "{log}");
    assert!(log.contains("task server failed") || log.contains("Connection refused"), "{log}");
}

/// `--config`'s `[serve]` table sets the options (a flag given wins); its unknown keys are
/// refused by name.
#[test]
fn a_config_file_sets_serve_options_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let tasks = std::fs::read_to_string(served_config(dir.path())).unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, format!("[serve]\nname = \"from-file\"\nmax_n = 2\nmax_episodes = 1\n{tasks}")).unwrap();
    let too_many = r#"{"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 2}"#;

    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let (_, _, models) = server.http("GET", "/v1/models", &[], b"");
    assert!(models.contains("from-file"), "{models}");
    let (status, answer) = server.post("/v1/chat/completions", too_many);
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("from 1 to 2"), "{answer}");
    assert_eq!(server.post("/v1/episodes", r#"{"task": "retry"}"#).0, 201);
    assert_eq!(server.post("/v1/episodes", r#"{"task": "retry"}"#).0, 503, "max_episodes = 1");
    drop(server);

    let server = Server::start(&["--config", config.to_str().unwrap(), "--max-n", "3"]);
    let (status, answer) = server.post("/v1/chat/completions", too_many);
    assert_eq!(status, 200, "the flag wins: {answer}");
    drop(server);

    std::fs::write(&config, format!("[serve]\nmax_m = 2\n{tasks}")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wirl")).args(["serve", "--config"]).arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("[serve]") && said.contains("max_m"), "{said}");
}

/// A task's plugin call that outlasts the server's `--timeout-s` is answered 504 at that
/// deadline, not when the call ends (issue 58: the task endpoints had no deadline of their
/// own, so a slow reward held its client as long as its own `deadline_ms`); the server goes
/// on answering other tasks meanwhile, and an episode whose step passed it is closed.
#[test]
fn a_task_call_past_the_servers_deadline_is_answered_504() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        r#"
[[tasks]]
name = "slow"
[tasks.environment]
plugin = {ARITHMETIC:?}
[[tasks.rewards]]
plugin = {HOSTILE:?}
config = {{ sleep_ms = 30000 }}
deadline_ms = 60000

[[tasks]]
name = "arithmetic"
[tasks.environment]
plugin = {ARITHMETIC:?}
[[tasks.rewards]]
plugin = {MATH_ANSWER:?}
"#
    );
    let config = dir.path().join("slow.toml");
    std::fs::write(&config, text).unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap(), "--timeout-s", "2"]);
    let problem = json!({"prompt": "2+3", "answer": "5"});
    // An episode whose step (here: its one scored turn) passes the deadline is closed: the
    // step goes on in the background, so the client could not know the episode's state.
    let (status, episode) = server.post("/v1/episodes", &json!({"task": "slow", "problem": problem}).to_string());
    assert_eq!(status, 201, "{episode}");
    let step = format!("/v1/episodes/{}/step", episode["session_id"].as_str().unwrap());
    // The reward sleeps 30 s within its 60 s deadline: without the server's own deadline
    // this answered 200 when the sleep ended; a 504 is the deadline's answer.
    let (status, answer) = server.post(&step, &json!({"action": "x"}).to_string());
    assert_eq!(status, 504, "{answer}");
    assert!(answer.to_string().contains("--timeout-s") && answer.to_string().contains("closed"), "{answer}");
    let (status, answer) = server.post(&step, &json!({"action": "x"}).to_string());
    assert_eq!(status, 404, "{answer}");
    // The slow task's score waits for its lock (the step still sleeps) and gets its 504 too;
    // another task is served meanwhile.
    let (status, answer) =
        server.post("/v1/score", &json!({"task": "slow", "problem": problem, "completions": ["x"]}).to_string());
    assert_eq!(status, 504, "{answer}");
    let scored = ok(
        &server,
        "/v1/score",
        json!({"task": "arithmetic", "problem": problem, "completions": ["<answer>5</answer>"]}),
    );
    assert_eq!(scored["rewards"], json!([1.0]), "{scored}");
}
