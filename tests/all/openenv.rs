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

/// How a hostile OpenEnv server misbehaves once a session is open (each answers resets; it
/// misbehaves in its answer to a step).
#[derive(Clone, Copy, PartialEq)]
enum Hostility {
    /// Answers resets, then answers each step only with WebSocket pings, for ever.
    Pings,
    /// Answers resets, then sends each step's answer one byte every 300 ms.
    Dribbles,
    /// Answers resets, then answers a step with a 20 MB message.
    Huge,
}

/// A server that speaks OpenEnv's HTTP checks and WebSocket handshake, then misbehaves as
/// `hostility` says. Its URL, and the times steps arrived (one per step message).
fn hostile_server(hostility: Hostility) -> (String, std::sync::Arc<Mutex<Vec<Instant>>>) {
    use std::io::{BufRead, BufReader, Write};
    use tungstenite::Message;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let steps = std::sync::Arc::new(Mutex::new(Vec::new()));
    let seen = steps.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let steps = seen.clone();
            std::thread::spawn(move || {
                let mut head = Vec::new();
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                loop {
                    let mut line = String::new();
                    if reader.read_line(&mut line).unwrap_or(0) == 0 {
                        return;
                    }
                    let end = line == "\r\n";
                    head.push(line);
                    if end {
                        break;
                    }
                }
                let mut stream = stream;
                let answer = |stream: &mut std::net::TcpStream, body: &str| {
                    let reply = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: \
                         close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(reply.as_bytes());
                };
                if head[0].starts_with("GET /health") {
                    return answer(&mut stream, "{\"status\": \"healthy\"}");
                }
                if head[0].starts_with("GET /schema") {
                    return answer(
                        &mut stream,
                        r#"{"action": {"properties": {"message": {}}}, "observation": {"properties": {"prompt": {}}}}"#,
                    );
                }
                // The WebSocket: the head read above is replayed to the handshake.
                let replay = std::io::Cursor::new(head.concat().into_bytes());
                let socket = Replayed { head: replay, stream };
                let Ok(mut socket) = tungstenite::accept(socket) else { return };
                let observation = |prompt: &str| {
                    serde_json::json!({"type": "observation", "data": {"observation": {"prompt": prompt}, "reward": 0.0, "done": false}})
                        .to_string()
                };
                loop {
                    let Ok(frame) = socket.read() else { return };
                    let Message::Text(text) = frame else { continue };
                    let message: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                    match message["type"].as_str() {
                        Some("reset") => {
                            if socket.send(Message::text(observation("Guess a number."))).is_err() {
                                return;
                            }
                        }
                        Some("step") => {
                            steps.lock().unwrap().push(Instant::now());
                            match hostility {
                                Hostility::Pings => loop {
                                    std::thread::sleep(Duration::from_millis(200));
                                    if socket.send(Message::Ping(Vec::new().into())).is_err() {
                                        return;
                                    }
                                    let _ = socket.get_mut().stream.set_read_timeout(Some(Duration::from_millis(1)));
                                    match socket.read() {
                                        Err(tungstenite::Error::Io(_)) | Ok(_) => {}
                                        Err(_) => return,
                                    }
                                },
                                Hostility::Dribbles => {
                                    let frame = observation("Higher.");
                                    // A text frame by hand: FIN + text, the length, the bytes.
                                    let mut bytes = vec![0x81, frame.len() as u8];
                                    bytes.extend_from_slice(frame.as_bytes());
                                    for byte in bytes {
                                        std::thread::sleep(Duration::from_millis(300));
                                        if socket.get_mut().stream.write_all(&[byte]).is_err() {
                                            return;
                                        }
                                    }
                                }
                                Hostility::Huge => {
                                    let huge = observation(&"x".repeat(20 << 20));
                                    let _ = socket.send(Message::text(huge));
                                }
                            }
                        }
                        _ => return,
                    }
                }
            });
        }
    });
    (url, steps)
}

/// A stream whose first bytes are a request head already read from it.
struct Replayed {
    head: std::io::Cursor<Vec<u8>>,
    stream: std::net::TcpStream,
}

impl std::io::Read for Replayed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.head.read(buf)?;
        if n > 0 { Ok(n) } else { self.stream.read(buf) }
    }
}

impl std::io::Write for Replayed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// `wirl train` with `args`, killed (and the test failed) if it runs past `limit`.
fn train_within(config: &Path, run: &Path, args: &[&str], limit: Duration) -> (std::process::Output, Duration) {
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .arg("train")
        .arg(config)
        .arg("--run-dir")
        .arg(run)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("wirl train ran past {limit:?} and was killed: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    (child.wait_with_output().unwrap(), started.elapsed())
}

/// Servers that answer a step only with pings, or a byte at a time: each operation ends at
/// the task's timeout as a whole (the timeout was per read, so these held the run for ever),
/// and the step's episodes wait for their servers side by side, not one after another.
#[test]
fn pings_and_dribbles_do_not_extend_a_remote_step() {
    for hostility in [Hostility::Pings, Hostility::Dribbles] {
        let dir = tempfile::tempdir().unwrap();
        let (url, steps) = hostile_server(hostility);
        let config = config(dir.path(), &format!("url = {url:?}\ntimeout_s = 4\nretries = 0"));
        let run = dir.path().join("run");
        let (out, _) = train_within(&config, &run, &["--steps", "1", "--eval-tasks", "0"], Duration::from_secs(300));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let rollouts = crate::grpo::rollouts(&run);
        assert_eq!(rollouts.len(), 2 * 4);
        for rollout in &rollouts {
            assert_eq!(rollout["failures"], serde_json::json!(["remote"]), "{rollout}");
            let note = rollout["notes"].to_string();
            assert!(note.contains(&url) && note.contains("timeout_s"), "{rollout}");
        }
        // One after another, 8 steps of 4 s each would arrive over 28 s or more; side by side
        // they arrive together (the bound leaves a loaded machine room, and still tells them).
        let steps = steps.lock().unwrap();
        assert_eq!(steps.len(), 8);
        let spread = *steps.iter().max().unwrap() - *steps.iter().min().unwrap();
        assert!(spread < Duration::from_secs(20), "the steps were sent {spread:?} apart");
    }
}

/// A 20 MB answer (past the 16 MiB message limit) fails its episode by name: no panic in the
/// WebSocket library while the session is dropped, and the run ends with its checkpoint.
#[test]
fn an_oversize_answer_fails_its_episode_without_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (url, _) = hostile_server(Hostility::Huge);
    let config = config(dir.path(), &format!("url = {url:?}\ntimeout_s = 30\nretries = 0"));
    let run = dir.path().join("run");
    let (out, _) = train_within(&config, &run, &["--steps", "1", "--eval-tasks", "0"], Duration::from_secs(300));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !err.contains("panicked"), "{err}");
    for rollout in crate::grpo::rollouts(&run) {
        assert_eq!(rollout["failures"], serde_json::json!(["remote"]), "{rollout}");
        assert!(rollout["notes"].to_string().contains("too large"), "{rollout}");
    }
    assert!(run.join("checkpoints/step-000001").is_dir());
}

/// Ctrl-C while every episode waits on a server that will not answer for a minute: the run
/// stops within seconds and keeps its checkpoint.
#[test]
fn ctrl_c_ends_a_run_stuck_in_a_remote_step() {
    let dir = tempfile::tempdir().unwrap();
    let (url, steps) = hostile_server(Hostility::Pings);
    let config = config(dir.path(), &format!("url = {url:?}\ntimeout_s = 600\nretries = 0"));
    let run = dir.path().join("run");
    let mut child = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", config.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--eval-tasks", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while steps.lock().unwrap().is_empty() {
        if started.elapsed() > Duration::from_secs(240) || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("no step reached the server: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let interrupted = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if interrupted.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("Ctrl-C did not stop the run in 60 s: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted during step 1"), "{err}");
    assert!(run.join("checkpoints/step-000000/state.json").is_file(), "{err}");
}
