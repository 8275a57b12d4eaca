//! One task runtime: `wirl train`, `wirl eval` and `wirl serve --config` load and check a
//! config's tasks through the same path (`wirl_rollout::LoadedTask::load`), so they accept
//! and refuse the same configs, with the same message. `wirl serve` accepted multi-turn
//! tasks that training refused before.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use wirl_test_artifacts::{HOSTILE_ENVIRONMENT, MATH_ANSWER};

fn wirl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_wirl"))
}

/// `wirl serve --config`, which runs until stopped when it accepts: its output once it has
/// exited, or None if it is still serving after a while.
fn serve_refusal(config: &Path) -> Option<Output> {
    let mut child = wirl()
        .args(["serve", "--port", "0", "--config"])
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(300) {
        if child.try_wait().unwrap().is_some() {
            return Some(child.wait_with_output().unwrap());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// What each of train, eval and serve says of `config`: `(command, refused, stderr)`.
fn verdicts(dir: &Path, config: &Path) -> Vec<(&'static str, bool, String)> {
    let train = wirl()
        .arg("train")
        .arg(config)
        .arg("--run-dir")
        .arg(dir.join("run"))
        .args(["--steps", "1", "--eval-tasks", "0"])
        .output()
        .unwrap();
    // A refused start leaves no run directory behind to refuse the corrected retry.
    assert!(train.status.success() || !dir.join("run").exists(), "a refused run left its directory");
    let eval =
        wirl().arg("eval").arg(config).args(["--tasks", "1", "--output"]).arg(dir.join("eval.jsonl")).output().unwrap();
    let serve = serve_refusal(config);
    let said = |out: &Output| String::from_utf8_lossy(&out.stderr).into_owned();
    vec![
        ("train", !train.status.success(), said(&train)),
        ("eval", !eval.status.success(), said(&eval)),
        (
            "serve",
            serve.as_ref().is_some_and(|out| !out.status.success()),
            serve.as_ref().map(said).unwrap_or_default(),
        ),
    ]
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn train_eval_and_serve_refuse_the_same_tasks_with_the_same_message() {
    let dir = tempfile::tempdir().unwrap();
    let rows = r#"{"prompt": "What is 2 + 2?", "answer": "4"}"#;
    write(dir.path(), "rows.jsonl", &format!("{rows}\n{rows}\n"));
    let no_episodes =
        format!("[[tasks]]\nname = \"talk\"\nmax_turns = 3\n[tasks.environment]\nplugin = {HOSTILE_ENVIRONMENT:?}\n");
    let rows_in_turns = format!(
        "[[tasks]]\nname = \"rows\"\nmax_turns = 3\n[tasks.dataset]\ntrain = \"rows.jsonl\"\neval = \"rows.jsonl\"\n\
         [[tasks.rewards]]\nplugin = {MATH_ANSWER:?}\n"
    );
    let wrong_kind = format!(
        "[[tasks]]\nname = \"swapped\"\n[tasks.environment]\nplugin = {MATH_ANSWER:?}\n[[tasks.rewards]]\nplugin = \
         {MATH_ANSWER:?}\n"
    );
    let model = format!("[model]\npath = {:?}\n\n", crate::engine::default_model());
    for (name, text, says) in [
        ("no-episodes.toml", no_episodes, "has no episodes"),
        ("rows-in-turns.toml", rows_in_turns, "a dataset task is single-turn"),
        ("wrong-kind.toml", wrong_kind, "but an environment-plugin is needed here"),
    ] {
        let config = write(dir.path(), name, &format!("{model}{text}"));
        for (command, refused, stderr) in verdicts(dir.path(), &config) {
            assert!(refused, "{name}: `wirl {command}` accepted it: {stderr}");
            assert!(stderr.contains(says), "{name}: `wirl {command}` said: {stderr}");
        }
    }
}

/// And they accept the same good ones: the multitask config (weighted environment tasks, a
/// multi-turn task, an `eval_only` dataset) trains a step, evaluates, and is served with its
/// four tasks.
#[test]
fn train_eval_and_serve_accept_the_same_good_tasks() {
    let dir = tempfile::tempdir().unwrap();
    let config = crate::trainer::write_multitask_config(dir.path(), 1);
    let train = wirl()
        .arg("train")
        .arg(&config)
        .arg("--run-dir")
        .arg(dir.path().join("run"))
        .args(["--steps", "1", "--eval-tasks", "1"])
        .output()
        .unwrap();
    assert!(train.status.success(), "train: {}", String::from_utf8_lossy(&train.stderr));
    let eval = wirl()
        .arg("eval")
        .arg(&config)
        .args(["--tasks", "1", "--output"])
        .arg(dir.path().join("eval.jsonl"))
        .output()
        .unwrap();
    assert!(eval.status.success(), "eval: {}", String::from_utf8_lossy(&eval.stderr));
    let server = crate::serve::Server::start(&["--config", config.to_str().unwrap()]);
    let (status, _, body) = server.http("GET", "/v1/tasks", &[], b"");
    assert_eq!(status, 200, "{body}");
    let listed: serde_json::Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = listed["data"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["sums", "mixed", "retry", "held"], "{body}");
}

/// Errors by layer: a served task's failures answer with the status of their cause — its
/// remote task server gone is upstream's (502), its dataset file gone is the host's (500), a
/// row that is not a task is the task's own (422). All were 422 before.
#[test]
fn a_served_tasks_failures_answer_by_their_cause() {
    let dir = tempfile::tempdir().unwrap();
    let upstream_config = crate::serve_tasks::served_config(dir.path());
    let mut upstream = crate::serve::Server::start(&["--config", upstream_config.to_str().unwrap()]);
    let row = r#"{"id": "r0", "messages": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}"#;
    // Past the first chunk of rows (1,024), a row is read from the file when first asked for.
    write(dir.path(), "rows.jsonl", &format!("{row}\nnot json\n{}", format!("{row}\n").repeat(1100)));
    let config = write(
        dir.path(),
        "downstream.toml",
        &format!(
            "[[tasks]]\nname = \"math\"\nremote = {{ url = \"http://{}\", task = \"arithmetic\", timeout_s = 5, retries = 1 \
             }}\n\n[[tasks]]\nname = \"rows\"\n[tasks.dataset]\ntrain = \"rows.jsonl\"\n[[tasks.rewards]]\nplugin = \
             {MATH_ANSWER:?}\n",
            upstream.address
        ),
    );
    let server = crate::serve::Server::start(&["--config", config.to_str().unwrap()]);
    let status = |path: &str, body: &str| {
        let (status, answer) = server.post(path, body);
        (status, answer.to_string())
    };
    let (ok, answer) = status("/v1/episodes", r#"{"task": "rows", "index": 0}"#);
    assert_eq!(ok, 201, "{answer}");
    let (code, answer) = status("/v1/episodes", r#"{"task": "rows", "index": 1}"#);
    assert_eq!(code, 422, "a row that is not a task: {answer}");

    upstream.kill();
    let (code, answer) = status("/v1/episodes", r#"{"task": "math", "index": 0}"#);
    assert_eq!(code, 502, "the remote server is gone: {answer}");
    let rollouts =
        r#"{"task": "math", "num_groups": 1, "rollouts_per_group": 1, "generation_args": {"max_tokens": 4}}"#;
    let (code, answer) = status("/grouped_rollouts/", rollouts);
    assert_eq!(code, 502, "the remote server is gone: {answer}");

    std::fs::remove_file(dir.path().join("rows.jsonl")).unwrap();
    let (code, answer) = status("/v1/episodes", r#"{"task": "rows", "index": 1100}"#);
    assert_eq!(code, 500, "the dataset file is gone: {answer}");
}

/// A task server that lists one task (`slow`) and then answers nothing: every later request
/// is read and held, unanswered, for `hold`. Serves `connections` connections, then ends.
fn silent_task_server(connections: usize, hold: Duration) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(connections) {
            let Ok(mut stream) = stream else { continue };
            std::thread::spawn(move || {
                let mut head = [0u8; 4096];
                let read = stream.read(&mut head).unwrap_or(0);
                if head[..read].starts_with(b"GET /v1/tasks ") {
                    let body = r#"{"object": "list", "data": [{"name": "slow"}]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: \
                         close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes());
                } else {
                    std::thread::sleep(hold);
                }
            });
        }
    });
    address
}

/// Errors by layer, upstream's silence: a remote task whose server does not answer within
/// its `timeout_s` answers 504 (a dead one 502, above), naming the timeout.
#[test]
fn a_remote_task_server_that_does_not_answer_in_time_is_a_gateway_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = silent_task_server(8, Duration::from_secs(6));
    let config = write(
        dir.path(),
        "downstream.toml",
        &format!(
            "[[tasks]]\nname = \"slow\"\nremote = {{ url = \"http://{upstream}\", timeout_s = 1, retries = 0 }}\n"
        ),
    );
    let server = crate::serve::Server::start(&["--config", config.to_str().unwrap()]);
    // The upstream holds each request 6 s, then closes it unanswered (which would be a 502):
    // only the task's 1 s timeout answers 504.
    let (code, answer) = server.post("/v1/episodes", r#"{"task": "slow", "index": 0}"#);
    assert_eq!(code, 504, "{answer}");
    assert!(answer.to_string().contains("timeout_s"), "{answer}");
}
