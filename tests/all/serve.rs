//! `wirl serve` on the default model, as clients use it: raw HTTP (malformed and oversize
//! bodies, wrong keys, limits), the official `openai` Python package (installed into a venv
//! by the test), a busy server and a client that goes away.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `wirl serve` on a free loopback port.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) address: String,
}

impl Server {
    pub(crate) fn start(flags: &[&str]) -> Server {
        Server::start_model(&crate::engine::default_model(), flags)
    }

    /// A server of the model at `model`.
    pub(crate) fn start_model(model: &Path, flags: &[&str]) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wirl"));
        command.args(["serve", "--port", "0", "--model"]).arg(model).args(flags);
        Server::spawn(command)
    }

    /// `command` (a wirl server told to listen on port 0), once it says where it listens.
    pub(crate) fn spawn(mut command: Command) -> Server {
        let mut child = command.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let first = lines
            .by_ref()
            .map_while(Result::ok)
            .find(|line| line.contains("http://"))
            .expect("the server says where it listens");
        let address = first
            .split("http://")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no address in {first:?}"))
            .to_string();
        // Keep draining stderr so that the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server { child, address }
    }

    pub(crate) fn http(&self, method: &str, path: &str, headers: &[&str], body: &[u8]) -> (u16, String, String) {
        http(&self.address, method, path, headers, body)
    }

    pub(crate) fn post(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (status, _, body) = self.http("POST", path, &[], body.as_bytes());
        (status, serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body)))
    }
}

impl Server {
    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A streaming completion that counts on for up to `max_tokens` tokens, once its stream
    /// has started; dropping the connection gives it up.
    pub(crate) fn start_counting(&self, max_tokens: usize) -> TcpStream {
        self.start_stream(&serde_json::json!({"prompt": "Count from 1 to 5000, one number per line:\n1\n2\n3\n",
            "max_tokens": max_tokens, "temperature": 0, "stream": true}))
    }

    /// The completion `body` (`"stream": true`), once its stream has started.
    pub(crate) fn start_stream(&self, body: &serde_json::Value) -> TcpStream {
        let body = body.to_string();
        let mut stream = TcpStream::connect(&self.address).unwrap();
        let head = format!(
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut buffer = [0u8; 256];
        assert!(stream.read(&mut buffer).unwrap() > 0, "the stream started");
        stream
    }

    /// Close `stream` with a reset (`SO_LINGER` 0), as a client that crashes or a proxy that
    /// gives up does: the server's next write on it fails at once (`EPIPE`).
    pub(crate) fn reset(stream: TcpStream) {
        use std::os::fd::AsRawFd;
        let linger = libc::linger { l_onoff: 1, l_linger: 0 };
        // SAFETY: a valid socket and a `linger` of the size given.
        let set = unsafe {
            libc::setsockopt(
                stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            )
        };
        assert_eq!(set, 0, "SO_LINGER: {}", std::io::Error::last_os_error());
        drop(stream);
    }

    /// Whether the server process is still running.
    pub(crate) fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// kill -9.
    pub(crate) fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One request over a fresh connection to `address`: status, headers and body.
pub fn http(address: &str, method: &str, path: &str, headers: &[&str], body: &[u8]) -> (u16, String, String) {
    http_waiting(address, method, path, headers, body, Duration::from_secs(120))
}

/// [`http`], waiting up to `patience` for the reply (long prompts on a busy machine).
pub fn http_waiting(
    address: &str,
    method: &str,
    path: &str,
    headers: &[&str],
    body: &[u8],
    patience: Duration,
) -> (u16, String, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(patience)).unwrap();
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for header in headers {
        head.push_str(header);
        head.push_str("\r\n");
    }
    head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n\r\n", body.len()));
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
    let mut reply = Vec::new();
    let _ = stream.read_to_end(&mut reply);
    let reply = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

/// The official client, in a venv made (once per machine) next to the test binaries.
fn openai_python() -> std::path::PathBuf {
    pypi_python("openai-venv", "openai", "openai==3.54.0")
}

/// A venv in the target directory named `venv` with `requirement` from PyPI (made once,
/// when `module` cannot be imported there yet): the real clients the servers are tested with.
pub(crate) fn pypi_python(venv: &str, module: &str, requirement: &str) -> std::path::PathBuf {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join(venv);
    let python = venv.join("bin/python");
    let import = format!("import {module}");
    let ready = Command::new(&python).args(["-c", &import]).output().is_ok_and(|o| o.status.success());
    if !ready {
        let made = Command::new("python3").args(["-m", "venv"]).arg(&venv).status().unwrap();
        assert!(made.success(), "python3 -m venv");
        let installed = Command::new(&python)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", requirement])
            .status()
            .unwrap();
        assert!(installed.success(), "pip install {requirement}");
    }
    python
}

#[test]
fn the_openai_client_works_and_bad_requests_get_4xx_naming_the_field() {
    let server = Server::start(&["--max-n", "4", "--max-body-bytes", "65536"]);
    let (status, _, body) = server.http("GET", "/health", &[], b"");
    assert_eq!((status, body.contains("ok")), (200, true), "{body}");

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/serve/openai_client.py");
    let run = Command::new(openai_python()).arg(script).arg(format!("http://{}/v1", server.address)).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let seen: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(seen["models"][0], "SmolLM2-135M-Instruct.Q4_1", "{seen}");
    assert_eq!(seen["chat_choices"], 2, "{seen}");
    assert!(seen["chat_logprobs"].as_u64().unwrap() > 0 && seen["chat_logprobs"] == seen["chat_token_ids"], "{seen}");
    assert!(seen["chat_usage"].as_u64().unwrap() > 0, "{seen}");
    assert!(seen["prompt_token_ids"].as_u64().unwrap() > 5, "{seen}");
    assert_eq!(seen["seeded_equal"], true, "the same seed gives the same completions: {seen}");
    assert!(!seen["stream_text"].as_str().unwrap().is_empty() && seen["stream_finish"].is_string(), "{seen}");
    assert!(seen["stream_usage"].as_u64().unwrap() > 0, "{seen}");
    assert!(seen["completion_text"].as_str().unwrap().to_lowercase().contains("paris"), "{seen}");
    assert!(seen["completion_logprobs"].as_u64().unwrap() > 0, "{seen}");
    assert_eq!(seen["refused"], serde_json::json!({"status": 400, "param": "n"}), "{seen}");
    let counts = seen["top_logprobs_counts"].as_array().unwrap();
    assert!(!counts.is_empty() && counts.iter().all(|c| c == 3), "{seen}");
    assert_eq!(
        (&seen["top_is_sampled"], &seen["top_sorted"]),
        (&serde_json::json!(true), &serde_json::json!(true)),
        "{seen}"
    );
    let counts = seen["completion_top"].as_array().unwrap();
    assert!(!counts.is_empty() && counts.iter().all(|c| c == 2), "{seen}");

    // Exact tokens: a completion's ids, given back as the prompt, are used as they are.
    let (status, body) =
        server.post("/v1/completions", r#"{"prompt": [504, 3575, 282, 4649, 314], "max_tokens": 3, "temperature": 0}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["prompt_token_ids"], serde_json::json!([504, 3575, 282, 4649, 314]));
    assert_eq!(
        body["choices"][0]["token_ids"].as_array().unwrap().len(),
        body["usage"]["completion_tokens"].as_u64().unwrap() as usize
    );

    let chat =
        |extra: &str| format!(r#"{{"messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 2{extra}}}"#);
    let cases: Vec<(String, u16, &str)> = vec![
        ("{not json".into(), 400, "not valid JSON"),
        ("[1, 2]".into(), 400, "JSON object"),
        (r#"{"messages": []}"#.into(), 400, "`messages`"),
        (r#"{"messages": [{"role": "wizard", "content": "x"}]}"#.into(), 400, "messages[0].role"),
        (chat(r#", "temperature": "hot""#), 400, "`temperature`"),
        (chat(r#", "temperature": 1e999"#), 400, "not valid JSON"),
        (chat(r#", "temperature": 7"#), 400, "`temperature`"),
        (chat(r#", "n": 0"#), 400, "`n`"),
        (chat(r#", "n": 5"#), 400, "`n` must be from 1 to 4"),
        (chat(r#", "top_p": 0"#), 400, "`top_p`"),
        (chat(r#", "max_tokens": 99999999"#), 400, "`max_tokens`"),
        (chat(r#", "max_tokens": -1"#), 400, "`max_tokens`"),
        (chat(r#", "stop": [1]"#), 400, "`stop`"),
        (chat(r#", "top_logprobs": 5"#), 400, "needs `logprobs: true`"),
        (chat(r#", "logprobs": true, "top_logprobs": 21"#), 400, "`top_logprobs` must be from 0 to 20"),
        (chat(r#", "frequency_penalty": 1.0"#), 400, "`frequency_penalty`"),
        (chat(r#", "model": "gpt-9""#), 404, "does not exist here"),
        (r#"{"prompt": [99999999], "max_tokens": 2}"#.into(), 400, "`prompt`"),
    ];
    for (body, expected, says) in cases {
        let path = if body.contains("prompt") { "/v1/completions" } else { "/v1/chat/completions" };
        let (status, reply) = server.post(path, &body);
        assert_eq!(status, expected, "{body}: {reply}");
        assert!(reply["error"]["message"].as_str().unwrap_or_default().contains(says), "{body}: {reply}");
    }
    let oversize = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(100_000));
    let (status, _, _) = server.http("POST", "/v1/completions", &[], oversize.as_bytes());
    assert_eq!(status, 413);
    let (status, _, _) = server.http("GET", "/v2/nothing", &[], b"");
    assert_eq!(status, 404);
    let (status, _, body) = server.http("GET", "/health", &[], b"");
    assert_eq!((status, body.contains("ok")), (200, true), "healthy afterwards");
}

#[test]
fn a_key_guards_everything_but_health_and_other_hosts_need_one() {
    let server = Server::start(&["--api-key", "sesame"]);
    assert_eq!(server.http("GET", "/health", &[], b"").0, 200);
    assert_eq!(server.http("GET", "/v1/models", &[], b"").0, 401);
    assert_eq!(server.http("GET", "/v1/models", &["Authorization: Bearer wrong"], b"").0, 401);
    assert_eq!(server.http("GET", "/v1/models", &["Authorization: Bearer sesame"], b"").0, 200);

    let open = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["serve", "--host", "0.0.0.0", "--port", "0"])
        .env_remove("WIRL_API_KEY")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&open.stderr);
    assert!(!open.status.success() && said.contains("needs an API key"), "{said}");
}

/// With one slot, a second request is answered 503 with Retry-After while the first
/// generates; when the first client goes away its generation is cancelled (counted in
/// /metrics) and the slot is free again.
#[test]
fn a_busy_server_says_so_and_a_disconnect_cancels_its_generation() {
    let server = Server::start(&["--max-concurrent", "1"]);
    let first = server.start_counting(3000);

    let (status, head, body) = server.http("POST", "/v1/completions", &[], br#"{"prompt": "hi", "max_tokens": 2}"#);
    assert_eq!(status, 503, "{body}");
    assert!(head.to_lowercase().contains("retry-after: 1"), "{head}");

    drop(first);
    // The server notices the client gone at its next piece and drops the generation (the
    // engine gives its rows up); /metrics counts it, then the one slot is free again.
    let cancelled = |metrics: &str| metrics.lines().any(|l| l == "wirl_serve_cancelled_total 1");
    let started = Instant::now();
    while !cancelled(&server.http("GET", "/metrics", &[], b"").2) {
        assert!(started.elapsed() < Duration::from_secs(120), "hung: the disconnect was never noticed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, _, body) = server.http("POST", "/v1/completions", &[], br#"{"prompt": "hi", "max_tokens": 2}"#);
    assert_eq!(status, 200, "the slot is free after the cancellation: {body}");
}

/// Loopback load, bounded in count and time: 200 requests from 32 clients at once, every one
/// answered 200, and the server's resident memory after them within 10 % (+ 32 MiB) of what
/// it was after a warm-up round (nothing kept per request).
#[test]
fn two_hundred_requests_from_32_clients_are_answered_with_flat_memory() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let server = Server::start(&[]);
    let resident_mib = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() / 1024
    };
    let round = |count: usize| {
        let next = AtomicUsize::new(0);
        let failures = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..32 {
                scope.spawn(|| {
                    loop {
                        let i = next.fetch_add(1, Ordering::SeqCst);
                        if i >= count {
                            return;
                        }
                        let (path, body) = if i.is_multiple_of(2) {
                            ("/v1/completions", format!(r#"{{"prompt": "Count to ten: {i},", "max_tokens": 8, "seed": {i}}}"#))
                        } else {
                            (
                                "/v1/chat/completions",
                                format!(r#"{{"messages": [{{"role": "user", "content": "Say {i}."}}], "max_tokens": 8, "seed": {i}}}"#),
                            )
                        };
                        let (status, _, reply) = server.http("POST", path, &[], body.as_bytes());
                        if status != 200 || !reply.contains("\"usage\"") {
                            failures.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                });
            }
        });
        failures.load(Ordering::SeqCst)
    };
    // The first rounds raise the allocator's high-water mark (batches of up to 32 rows); measured:
    // 885 MiB after 32 requests, 1116 after 200 more, then 1126 and 1127 after two more 200s.
    // A warm-up of 96 left it short of that plateau once (890 -> 1106 MiB in a fresh-clone CI).
    assert_eq!(round(200), 0, "the warm-up round");
    let before = resident_mib();
    // Bounded in time by each client's read timeout (2 min), not by an assertion on speed.
    assert_eq!(round(200), 0, "every request answered");
    let after = resident_mib();
    eprintln!("200 requests from 32 clients; resident {before} MiB -> {after} MiB");
    assert!(after <= before + before / 10 + 32, "resident memory grew from {before} to {after} MiB");
    assert_eq!(server.http("GET", "/health", &[], b"").0, 200);
}

/// Weights loaded by a client (from under `--weights-dir` only) under its version, which
/// responses then report; generation paused (a request waits until `/resume`); a conversation
/// continued from a reply's own ids (`prevent_retokenization`): those ids spliced in as they
/// are.
#[test]
fn weights_load_under_a_version_generation_pauses_and_replies_continue_from_their_ids() {
    let weights = tempfile::tempdir().unwrap();
    let model = crate::engine::default_model();
    std::fs::copy(&model, weights.path().join("step-7.gguf")).unwrap();
    std::fs::write(weights.path().join("notes.txt"), "not a model").unwrap();
    let server = Server::start(&["--weights-dir", weights.path().to_str().unwrap()]);
    let chat = r#"{"messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 8, "temperature": 0}"#;

    let (status, before) = server.post("/v1/chat/completions", chat);
    assert_eq!(status, 200, "{before}");
    let (status, loaded) = server.post("/v1/load_weights", r#"{"path": "step-7.gguf", "version": 7}"#);
    assert_eq!(status, 200, "{loaded}");
    assert_eq!(loaded["version"], 7, "{loaded}");
    let (_, after) = server.post("/v1/chat/completions", chat);
    assert_eq!(after["weights_version"], 7, "{after}");
    assert_eq!(after["choices"][0]["message"]["content"], before["choices"][0]["message"]["content"], "same weights");
    // prime-rl's name for the same.
    let (status, again) = server.post("/update_weights", r#"{"weight_dir": "step-7.gguf", "version": 8}"#);
    assert_eq!((status, &again["version"]), (200, &serde_json::json!(8)), "{again}");
    let (_, _, state) = server.http("GET", "/v1/weights", &[], b"");
    assert!(state.contains("\"version\":8") && state.contains("step-7.gguf"), "{state}");
    let (_, _, metrics) = server.http("GET", "/metrics", &[], b"");
    assert!(metrics.contains("wirl_serve_weights_version 8"), "{metrics}");
    let (status, answer) = server.post("/pause", r#"{"timeout_s": "soon"}"#);
    assert_eq!(status, 400, "{answer}");
    let outside = format!(r#"{{"path": {:?}}}"#, model.to_str().unwrap());
    // A link in the directory to elsewhere: the same answer whether or not a file exists
    // beyond it (no oracle for files outside).
    std::os::unix::fs::symlink(model.parent().unwrap(), weights.path().join("elsewhere")).unwrap();
    let beyond_link = format!(r#"{{"path": "elsewhere/{}"}}"#, model.file_name().unwrap().to_str().unwrap());
    for (body, status, says) in [
        (outside.as_str(), 403, "outside --weights-dir"),
        (beyond_link.as_str(), 403, "outside --weights-dir"),
        (r#"{"path": "elsewhere/no-such-file.gguf"}"#, 403, "outside --weights-dir"),
        (r#"{"path": "../../etc/passwd"}"#, 403, "outside --weights-dir"),
        (r#"{"path": "step-8.gguf"}"#, 400, "no such file"),
        (r#"{"path": "notes.txt"}"#, 422, "notes.txt"),
        (r#"{"path": "step-7.gguf", "version": -1}"#, 400, "`version`"),
        (r#"{"version": 1}"#, 400, "`path`"),
    ] {
        let (got, answer) = server.post("/v1/load_weights", body);
        assert_eq!(got, status, "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{body}: {answer}");
    }

    // Paused: a request waits; it is answered only after /resume.
    let (status, paused) = server.post("/pause", "");
    assert_eq!((status, &paused["paused"]), (200, &serde_json::json!(true)), "{paused}");
    let address = server.address.clone();
    let waiting = std::thread::spawn(move || {
        let (status, _, body) = http(&address, "POST", "/v1/chat/completions", &[], chat.as_bytes());
        (status, body, Instant::now())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(!waiting.is_finished(), "a request must wait while generation is paused");
    let resumed_at = Instant::now();
    let (status, _) = server.post("/resume", "");
    assert_eq!(status, 200);
    let (status, body, answered_at) = waiting.join().unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(answered_at >= resumed_at);

    // prevent_retokenization: the reply's ids are spliced in where its text would be.
    let first: serde_json::Value = before;
    let reply_ids = first["choices"][0]["message"]["generation_token_ids"].clone();
    let reply_text = first["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let prompt_ids = first["prompt_token_ids"].as_array().unwrap().clone();
    let continued = serde_json::json!({
        "messages": [
            {"role": "user", "content": "What is 2 + 3?"},
            {"role": "assistant", "content": reply_text, "generation_token_ids": reply_ids},
            {"role": "user", "content": "And 3 + 3?"},
        ],
        "prevent_retokenization": true, "max_tokens": 2,
    });
    let (status, next) = server.post("/v1/chat/completions", &continued.to_string());
    assert_eq!(status, 200, "{next}");
    let spliced = next["prompt_token_ids"].as_array().unwrap();
    let ids = reply_ids.as_array().unwrap();
    assert_eq!(&spliced[..prompt_ids.len()], &prompt_ids[..], "the first prompt, as it was");
    assert_eq!(&spliced[prompt_ids.len()..prompt_ids.len() + ids.len()], &ids[..], "the reply's own ids");
    assert!(spliced.len() > prompt_ids.len() + ids.len(), "then the next turn");
    // Ids given for a user message, out of the vocabulary, or none at all: refused by field.
    for (patch, field) in [
        (
            serde_json::json!({"role": "user", "content": "x", "generation_token_ids": [1]}),
            "messages[0].generation_token_ids",
        ),
        (
            serde_json::json!({"role": "user", "content": "x", "generation_token_ids": [999999999]}),
            "messages[0].generation_token_ids",
        ),
        (serde_json::json!({"role": "user", "content": "x"}), "prevent_retokenization"),
    ] {
        let body = serde_json::json!({"messages": [patch], "prevent_retokenization": true});
        let (status, answer) = server.post("/v1/chat/completions", &body.to_string());
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer["error"]["message"].as_str().unwrap().contains(field), "{body}: {answer}");
    }
}

/// Without --weights-dir, a client cannot make the server load anything.
#[test]
fn weights_loading_is_off_unless_a_directory_is_given() {
    let server = Server::start(&[]);
    let (status, answer) = server.post("/v1/load_weights", r#"{"path": "/"}"#);
    assert_eq!(status, 403, "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap().contains("--weights-dir"), "{answer}");
}

/// `chat_template_kwargs` (vLLM's field): a request's variables reach the chat template (here
/// a greeting of three words the template writes first: three more prompt tokens); a name
/// the template gets from the server, or a value that is not an object, is refused naming
/// the field.
#[test]
fn a_requests_chat_template_variables_reach_the_template() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), false);
    let template = "{% if greeting is defined %}{{ greeting }} {% endif %}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";
    let config = serde_json::json!({"chat_template": template, "eos_token": "</s>"});
    std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
    let server = Server::start_model(dir.path(), &["--name", "tiny"]);
    let ask_of = |server: &Server, vars: serde_json::Value| {
        let mut body =
            serde_json::json!({"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1});
        if !vars.is_null() {
            body["chat_template_kwargs"] = vars;
        }
        server.post("/v1/chat/completions", &body.to_string())
    };
    let ask = |vars: serde_json::Value| ask_of(&server, vars);
    let prompt_tokens = |(status, answer): (u16, serde_json::Value)| {
        assert_eq!(status, 200, "{answer}");
        answer["usage"]["prompt_tokens"].as_u64().unwrap()
    };
    let plain = prompt_tokens(ask(serde_json::Value::Null));
    assert_eq!(prompt_tokens(ask(serde_json::json!({"greeting": "a b c"}))), plain + 3);
    // A config's `model.chat_template_kwargs` are every request's, in a file of `[model]` alone
    // too; there its training keys are refused rather than ignored, naming the key.
    let config = dir.path().join("serve.toml");
    let model_only = format!("[model]\npath = {:?}\nchat_template_kwargs = {{ greeting = \"a b c\" }}\n", dir.path());
    std::fs::write(&config, &model_only).unwrap();
    let configured = Server::start_model(dir.path(), &["--name", "tiny", "--config", config.to_str().unwrap()]);
    assert_eq!(prompt_tokens(ask_of(&configured, serde_json::Value::Null)), plain + 3);
    drop(configured);
    let with = |extra: &str| model_only.replace("[model]\n", &format!("[model]\n{extra}\n"));
    // `[model] device` is where the server runs unless [serve] or --device says otherwise (a
    // later refusal, --tp 2 with --weights-dir, keeps a server that ignored it from starting).
    let later_refusal: &[&str] = &["--tp", "2", "--weights-dir", "."];
    let mut cases = vec![
        (with("tf32 = true"), "[model] tf32: a training key", &[][..]),
        (with("inference_dtype = \"bf16\""), "set `[serve] dtype`", &[]),
        (with("colour = 1"), "unknown field `colour`", &[]),
        (with("device = \"gpu\""), "[model] device = \"gpu\": expected cpu, cuda or cuda:N", &[]),
        (model_only.replace("greeting", "eos_token"), "`eos_token` is the template's own variable", &[]),
        (
            "[model]\npath = \"no-such-model\"\n".to_string(),
            "serve.toml: `model.path` = no-such-model: no such file",
            &[],
        ),
    ];
    if !cfg!(feature = "cuda") {
        cases.push((with("device = \"cuda\""), "built without CUDA", later_refusal));
    }
    for (text, said, extra) in cases {
        std::fs::write(&config, &text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["serve", "--port", "0", "--config"])
            .arg(&config)
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && stderr.contains(said), "{text}: {stderr}");
    }
    for (vars, said) in [
        (serde_json::json!({"messages": []}), "`messages` is the template's own variable"),
        (serde_json::json!("enable_thinking"), "must be an object"),
    ] {
        let (status, answer) = ask(vars);
        let message = answer["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(
            status == 400 && message.contains(said) && answer["error"]["param"] == "chat_template_kwargs",
            "{answer}"
        );
    }
    // `wirl generate --chat … --template-var NAME=VALUE` likewise; a reserved name refused.
    let generate = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["generate", "--chat", "hi", "--max-tokens", "1", "--model"])
            .arg(dir.path())
            .args(extra)
            .output()
            .unwrap()
    };
    let prompt_of = |out: std::process::Output| {
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{said}");
        said.split(" prompt tokens")
            .next()
            .and_then(|head| head.rsplit(['\n', ' ']).next()?.parse::<u64>().ok())
            .unwrap()
    };
    assert_eq!(prompt_of(generate(&["--template-var", "greeting=a b c"])), prompt_of(generate(&[])) + 3);
    let refused = generate(&["--template-var", "eos_token=x"]);
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("`eos_token` is the template's own variable"), "{said}");
}

/// `wirl serve`'s prefix cache: a request that repeats an earlier one's start computes only
/// the rest, its answer unchanged, and /metrics counts the positions taken from the cache;
/// a flood of distinct prompts never holds more blocks than `--prefix-cache-mib` allows
/// (the least recent go); a budget past 1 TiB is refused.
#[test]
fn served_requests_share_their_prefixes_within_a_budget() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), false);
    let server = Server::start_model(dir.path(), &["--prefix-cache-mib", "1"]);
    let gauge = |name: &str| -> f64 {
        let (_, _, text) = server.http("GET", "/metrics", &[], b"");
        let line =
            text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}: {text}"));
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    let words = |seed: usize, n: usize| {
        (0..n).map(|i| format!("w{}", 2 + (seed * 7 + i * 3) % 40)).collect::<Vec<_>>().join(" ")
    };
    let complete = |prompt: &str| -> String {
        let body = serde_json::json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}).to_string();
        let (status, value) = server.post("/v1/completions", &body);
        assert_eq!(status, 200, "{value}");
        value["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let long = words(1, 40);
    let first = complete(&format!("{long} w3"));
    assert_eq!(gauge("wirl_serve_prompt_positions_cached_total"), 0.0);
    let again = complete(&format!("{long} w3"));
    assert_eq!(first, again, "a cached start gives the same greedy answer");
    assert!(gauge("wirl_serve_prompt_positions_cached_total") >= 32.0);
    assert!(gauge("wirl_serve_prefix_cache_hit_rate") > 0.0);
    // 2 layers × 2 × 2 key/value heads × 8 × 4 bytes = 256 bytes a position: 1 MiB is 256
    // blocks of 16; 200 prompts of 40 tokens would keep 400.
    for seed in 100..300 {
        // Distinct from their first two tokens.
        complete(&format!("w{} w{} {}", 2 + seed % 60, 2 + seed / 60, words(0, 38)));
        assert!(gauge("wirl_serve_prefix_cache_blocks") <= 256.0, "after prompt {seed}");
    }
    assert!(gauge("wirl_serve_prefix_cache_blocks") >= 200.0, "the cache was used to its budget");
    drop(server);
    let out = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["serve", "--port", "0", "--prefix-cache-mib", "2000000", "--model"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--prefix-cache-mib"));
}

/// Clients that reset their streams mid-way (a crash, a proxy giving up) leave the server
/// running. Writing to such a connection fails with EPIPE and can raise SIGPIPE (most likely
/// through a vectored `writev`, which has no MSG_NOSIGNAL): `wirl serve` had it at the default
/// disposition and died, every other client's connection reset with it — seen as
/// `ranks::serve_on_two_tensor_parallel_ranks_answers_as_one_model`'s rare failure (about 1
/// run in 100 under load here, after its cancelled stream; its server's exit status: signal
/// 13; none in 300 runs with SIGPIPE ignored). The write's timing is not the test's to
/// choose, so it asks the kernel for the disposition itself, then resets streams on one
/// rank and two.
#[test]
fn clients_that_reset_their_streams_leave_the_server_running() {
    let dir = tempfile::tempdir().unwrap();
    crate::engine::write_tiny_model(dir.path(), true);
    for flags in [&[][..], &["--tp", "2"][..]] {
        let mut server = Server::start_model(dir.path(), flags);
        let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid())).unwrap();
        let ignored = status.lines().find_map(|l| l.strip_prefix("SigIgn:")).expect("SigIgn in /proc/PID/status");
        let ignored = u64::from_str_radix(ignored.trim(), 16).unwrap();
        assert!(ignored & (1 << (libc::SIGPIPE - 1)) != 0, "{flags:?}: wirl serve must ignore SIGPIPE ({ignored:x})");
        for round in 0..8 {
            let body = serde_json::json!({"prompt": "w2 w3", "max_tokens": 40, "temperature": 1, "stream": true,
                "seed": round});
            Server::reset(server.start_stream(&body));
            // The rest of the stream is written (or given up) into the reset connection.
            std::thread::sleep(Duration::from_millis(100));
            assert!(server.running(), "{flags:?}: the server died after reset stream {round}");
        }
        let (status, value) = server.post("/v1/completions", r#"{"prompt": "w2", "max_tokens": 4, "temperature": 0}"#);
        assert_eq!(status, 200, "{flags:?}: {value}");
    }
}
