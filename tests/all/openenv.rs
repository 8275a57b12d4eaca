//! OpenEnv environments as wirl tasks: a real OpenEnv server (openenv-core's own `create_app`,
//! tests/openenv/guess_server.py) driving `wirl train` episodes over its WebSocket sessions,
//! and what wirl says when the server is missing, silent or has no such field.
//!
//! The server runs in the Python that `scripts/python-package` installs (`.venv`, with
//! openenv-core), or in `WIRL_OPENENV_PYTHON`.

use crate::grpo::train;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python with openenv-core.
fn python() -> PathBuf {
    let python = std::env::var_os("WIRL_OPENENV_PYTHON").map_or_else(|| repo().join(".venv/bin/python"), PathBuf::from);
    let importable =
        Command::new(&python).args(["-c", "import openenv, uvicorn"]).output().is_ok_and(|o| o.status.success());
    assert!(
        importable,
        "{} cannot import openenv-core: run `bash scripts/python-package` (it installs it into .venv), or set \
         WIRL_OPENENV_PYTHON to a Python that has it",
        python.display()
    );
    python
}

/// Whether the server answers `GET /health` with 200.
fn healthy(port: u16) -> bool {
    use std::io::Write;
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let mut answer = String::new();
    stream.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The guessing game's server, started once for these tests; it exits when this process
/// does (its stdin, held here, closes).
fn server() -> &'static str {
    static SERVER: OnceLock<(String, Mutex<(Child, ChildStdin)>)> = OnceLock::new();
    let (url, _) = SERVER.get_or_init(|| start_server(&[]));
    url
}

/// A guessing game's server with these extra arguments: its URL, the process and its stdin.
fn start_server(extra: &[&str]) -> (String, Mutex<(Child, ChildStdin)>) {
    {
        let port = free_port();
        // Its log in a file: a pipe nobody reads would stop the server once full.
        let log = std::env::temp_dir().join(format!("wirl-openenv-{port}.log"));
        let mut child = Command::new(python())
            .arg(repo().join("tests/openenv/guess_server.py"))
            .args(["--port", &port.to_string(), "--exit-with-stdin"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let url = format!("http://127.0.0.1:{port}");
        // openenv-core imports gradio and FastAPI: seconds, more on a busy machine.
        let started = Instant::now();
        while !healthy(port) {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the OpenEnv server exited ({status}): {}", std::fs::read_to_string(&log).unwrap_or_default());
            }
            assert!(started.elapsed() < Duration::from_secs(180), "the OpenEnv server did not start in 180 s");
            std::thread::sleep(Duration::from_millis(200));
        }
        (url, Mutex::new((child, stdin)))
    }
}

fn config(dir: &Path, openenv: &str) -> PathBuf {
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    crate::multiturn::write_tiny_model_with_context(&model, 4096);
    let text = format!(
        r#"
[model]
path = {model:?}

[[tasks]]
name = "guess"
max_turns = 3
[tasks.openenv]
{openenv}

[sampling]
max_tokens = 6

[grpo]
steps = 2
prompts_per_step = 2
group_size = 4
learning_rate = 0.01
beta = 0.0

[eval]
tasks = 2
"#
    );
    let path = dir.join("guess.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Two steps of episodes with the server: each sample a session of its own, reset with its
/// task's seed; its guesses sent as the action's `message`, the server's `prompt` shown as
/// the next user turn, its rewards the score; the held-out episodes too.
#[test]
fn an_openenv_server_drives_training_episodes() {
    let dir = tempfile::tempdir().unwrap();
    let url = server();
    let config = config(
        dir.path(),
        &format!("url = {url:?}\naction_field = \"message\"\nobservation_field = \"prompt\"\nsystem = \"Play.\""),
    );
    let run = dir.path().join("run");
    let out = train(&config, &run);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rollouts = crate::grpo::rollouts(&run);
    assert_eq!(rollouts.len(), 2 * 2 * 4);
    for rollout in &rollouts {
        assert_eq!(rollout["status"], "ok", "{rollout}");
        assert!(rollout["task"].as_str().unwrap().starts_with("openenv/0/"), "{rollout}");
        let turns = rollout["turns"].as_u64().unwrap();
        let reward = rollout["reward"].as_f64().unwrap();
        // Done on a right guess (1) or after the third wrong one (0).
        assert!((1..=3).contains(&turns) && (reward == 1.0 || (reward == 0.0 && turns == 3)), "{rollout}");
        let conversation = rollout["conversation"].as_array().unwrap();
        assert_eq!(conversation.len() as u64, 2 * turns - 1, "{rollout}");
        for hint in conversation.iter().skip(1).step_by(2) {
            let text = hint["content"].as_str().unwrap();
            assert!(text.starts_with("No: higher") || text.starts_with("No: lower"), "{rollout}");
        }
    }
    let metrics = crate::grpo::metrics(&run);
    assert!(metrics.iter().any(|m| m["episode_turns"].as_u64().unwrap() > 0), "{metrics:?}");
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert!(summary["held_out_pass_rate_after"].is_number(), "{summary}");
}

/// A server that crashes during a step's episodes: the episodes it leaves fail (`remote`,
/// masked by default), never a reward; the step still trains on what ended, and the run
/// ends with its checkpoint.
#[test]
fn a_server_that_dies_mid_step_fails_its_episodes_not_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _server) = start_server(&["--die-after", "6"]);
    let config = config(dir.path(), &format!("url = {url:?}\ntimeout_s = 5\nretries = 0"));
    let run = dir.path().join("run");
    let out = crate::grpo::train_with(&config, &run, &["--steps", "1", "--eval-tasks", "0"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rollouts = crate::grpo::rollouts(&run);
    assert_eq!(rollouts.len(), 2 * 4);
    let failed: Vec<_> = rollouts.iter().filter(|r| r["failures"] == serde_json::json!(["remote"])).collect();
    assert!(!failed.is_empty(), "{rollouts:?}");
    for rollout in failed {
        assert_eq!(rollout["status"], "masked", "{rollout}");
    }
    assert!(run.join("checkpoints/step-000001").is_dir());
}

/// A server without the configured field, one that is not there, one that never answers:
/// refused before training, naming the key or the server, within the task's timeout.
#[test]
fn a_missing_silent_or_mismatched_server_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let url = server();
    let wrong = config(dir.path(), &format!("url = {url:?}\naction_field = \"guess\""));
    let out = train(&wrong, &dir.path().join("wrong"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("no field `guess` (openenv.action_field)") && err.contains("message"),
        "{err}"
    );
    let wrong = config(dir.path(), &format!("url = {url:?}\nobservation_field = \"text\""));
    let err = String::from_utf8_lossy(&train(&wrong, &dir.path().join("wrong2")).stderr).into_owned();
    assert!(err.contains("no field `text` (openenv.observation_field)"), "{err}");

    let nobody = format!("http://127.0.0.1:{}", free_port());
    let missing = config(dir.path(), &format!("url = {nobody:?}\nretries = 0"));
    let err = String::from_utf8_lossy(&train(&missing, &dir.path().join("missing")).stderr).into_owned();
    assert!(err.contains(&nobody) && err.contains("is it running?"), "{err}");

    // Accepts connections and never answers.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = format!("http://{}", listener.local_addr().unwrap());
    let _held = std::thread::spawn(move || {
        let connections: Vec<_> = listener.incoming().take(4).collect();
        std::thread::sleep(Duration::from_secs(30));
        drop(connections);
    });
    let started = Instant::now();
    let quiet = config(dir.path(), &format!("url = {silent:?}\ntimeout_s = 1\nretries = 0"));
    let out = train(&quiet, &dir.path().join("quiet"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&silent), "{err}");
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());

    for (key, value, says) in [
        ("url", "\"ws://h:1\"", "`tasks[0].openenv.url`"),
        ("timeout_s", "nan", "`tasks[0].openenv.timeout_s`"),
        ("action_field", "\" \"", "`tasks[0].openenv.action_field` is empty"),
    ] {
        let mut fields = format!("url = {url:?}\n");
        if key == "url" {
            fields = String::new();
        }
        let bad = config(dir.path(), &format!("{fields}{key} = {value}"));
        let err = String::from_utf8_lossy(&train(&bad, &dir.path().join("bad")).stderr).into_owned();
        assert!(err.contains(says), "{key}: {err}");
    }
}

/// `wirl serve --config` serves the OpenEnv task as any other: tasks drawn by index (the
/// server's first observation), episodes stepped over HTTP, each a session with the server.
#[test]
fn wirl_serve_serves_an_openenv_task() {
    use serde_json::{Value, json};
    let dir = tempfile::tempdir().unwrap();
    let url = server();
    let config = config(dir.path(), &format!("url = {url:?}\nobservation_field = \"prompt\""));
    let served = crate::serve::Server::start_model(&dir.path().join("model"), &["--config", config.to_str().unwrap()]);
    let (status, drawn) = served.post("/v1/tasks/draw", &json!({"task": "guess", "index": 4, "count": 2}).to_string());
    assert_eq!(status, 200, "{drawn}");
    assert_eq!(drawn["tasks"][1]["task"]["id"], "openenv/0/5", "{drawn}");
    assert_eq!(drawn["tasks"][0]["task"]["messages"][0]["content"], "Guess my digit (0 to 9). Reply with one digit.");
    let (status, opened) = served.post("/v1/episodes", r#"{"task": "guess", "index": 4}"#);
    assert_eq!(status, 201, "{opened}");
    let id = opened["session_id"].as_str().unwrap().to_string();
    let metadata: Value = serde_json::from_str(opened["task"]["metadata"].as_str().unwrap()).unwrap();
    let target = metadata["openenv_seed"].as_u64().unwrap() % 10;
    let step =
        |guess: u64| served.post(&format!("/v1/episodes/{id}/step"), &json!({"action": guess.to_string()}).to_string());
    let (status, wrong) = step((target + 1) % 10);
    assert_eq!((status, wrong["done"].clone()), (200, json!(false)), "{wrong}");
    assert!(wrong["observation"]["messages"][0]["content"].as_str().unwrap().starts_with("No: "), "{wrong}");
    let (_, right) = step(target);
    assert_eq!((right["done"].clone(), right["reward"].clone()), (json!(true), json!(1.0)), "{right}");
}
