//! SandboxFusion's `/run_code` as wirl serves it (`wirl sandbox serve`, and `wirl serve
//! --runner`): the answers verl and the `sandbox-fusion` client read, files in and out of a
//! run's own directory, hostile programs and hostile requests, the bounded queue.

use crate::serve::Server;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Duration;
use wirl_test_artifacts::PYTHON_CODE_RUNNER;

fn start(flags: &[&str]) -> Server {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wirl"));
    command.args(["sandbox", "serve", "--port", "0", "--runner"]).arg(format!("python={PYTHON_CODE_RUNNER}"));
    command.args(flags);
    Server::spawn(command)
}

fn run(server: &Server, body: Value) -> Value {
    let (status, answer) = server.post("/run_code", &body.to_string());
    assert_eq!(status, 200, "{body} -> {answer}");
    answer
}

/// Wait (at most 60 s) until the service's `/v1/status` shows `running` and `waiting`.
fn wait_for_queue(server: &Server, running: u64, waiting: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, _, body) = server.http("GET", "/v1/status", &[], b"");
        let status: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
        if status["running"] == running && status["waiting"] == waiting {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the queue never showed {running} running, {waiting} waiting: {body}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn run_code_answers_as_sandbox_fusion_does_with_files_in_and_out() {
    let server = start(&["--run-workers", "2"]);
    let answer = run(
        &server,
        json!({"code": "import sys\nprint('hi', sys.stdin.read())", "language": "python", "stdin": "there"}),
    );
    assert_eq!(answer["status"], "Success", "{answer}");
    assert_eq!(answer["run_result"]["status"], "Finished", "{answer}");
    assert_eq!(answer["run_result"]["return_code"], 0, "{answer}");
    assert_eq!(answer["run_result"]["stdout"], "hi there\n", "{answer}");
    assert!(answer["compile_result"].is_null() && answer["run_result"]["execution_time"].as_f64().unwrap() > 0.0);

    let answer =
        run(&server, json!({"code": "import sys\nprint('x', file=sys.stderr)\nsys.exit(3)", "language": "python"}));
    assert_eq!((&answer["status"], &answer["run_result"]["return_code"]), (&json!("Failed"), &json!(3)), "{answer}");
    assert_eq!(answer["run_result"]["stderr"], "x\n", "{answer}");

    let answer = run(&server, json!({"code": "while True: pass", "language": "python", "run_timeout": 1}));
    assert_eq!(answer["status"], "Failed", "{answer}");
    assert_eq!(answer["run_result"]["status"], "TimeLimitExceeded", "{answer}");
    assert!(answer["run_result"]["return_code"].is_null(), "{answer}");

    // Files: sent into the run's directory (nested), read and written by the program,
    // fetched back; a file that is not there is left out.
    let program = "import os\nrows = open('data/t.csv').read().split()\nos.makedirs('out', exist_ok=True)\n\
                   open('out/n.txt', 'w').write(str(len(rows)))\nprint(sorted(os.listdir('/')))";
    let answer = run(
        &server,
        json!({"code": program, "language": "python", "files": {"data/t.csv": b64(b"a,b\n1,2\n3,4\n")},
               "fetch_files": ["out/n.txt", "missing.txt", "data/t.csv"]}),
    );
    assert_eq!(answer["status"], "Success", "{answer}");
    assert_eq!(answer["run_result"]["stdout"], "['data', 'out']\n", "{answer}");
    assert_eq!(answer["files"], json!({"out/n.txt": b64(b"3"), "data/t.csv": b64(b"a,b\n1,2\n3,4\n")}), "{answer}");

    // Each run has its own directory: nothing written by one is seen by the next.
    run(&server, json!({"code": "open('left.txt', 'w').write('secret')", "language": "python"}));
    let answer = run(
        &server,
        json!({"code": "import os\nprint(os.path.exists('left.txt'), os.listdir('/'))", "language": "python"}),
    );
    assert_eq!(answer["run_result"]["stdout"], "False []\n", "{answer}");
}

#[test]
fn hostile_programs_end_with_a_verdict_and_reach_nothing_of_the_host() {
    let server = start(&["--run-workers", "1"]);
    // The host's files: none exist for the program, and a link it makes is not followed when
    // the host fetches through it.
    let program = "import os\ntry:\n    open('/etc/passwd').read()\n    print('read')\nexcept OSError as e:\n    print('no', type(e).__name__)\n\
                   try:\n    os.symlink('/etc', 'etc')\nexcept OSError:\n    pass\ntry:\n    os.symlink('/etc/passwd', 'passwd')\nexcept OSError:\n    pass";
    let answer = run(&server, json!({"code": program, "language": "python", "fetch_files": ["etc/passwd", "passwd"]}));
    assert!(answer["run_result"]["stdout"].as_str().unwrap().starts_with("no "), "{answer}");
    assert_eq!(answer["files"], json!({}), "nothing outside the run's directory is fetched: {answer}");

    // Disk: bytes and entries past the bounds stop the program, named in `message`.
    let answer = run(
        &server,
        json!({"code": "f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * (1 << 20))", "language": "python", "run_timeout": 20}),
    );
    assert_eq!((&answer["status"], &answer["run_result"]["status"]), (&json!("Failed"), &json!("Error")), "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("bytes of files"), "{answer}");
    let answer = run(
        &server,
        json!({"code": "i = 0\nwhile True:\n    open(f'f{i}', 'w').close()\n    i += 1", "language": "python", "run_timeout": 20}),
    );
    assert!(answer["message"].as_str().unwrap().contains("files and directories"), "{answer}");

    // Memory: the request's memory_limit_MB holds.
    let answer = run(
        &server,
        json!({"code": "x = bytearray(400 << 20)\nprint('allocated')", "language": "python", "memory_limit_MB": 128}),
    );
    assert_eq!(answer["status"], "Failed", "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("out of memory (limit 128 MiB)"), "{answer}");
    assert_eq!(answer["run_result"]["stdout"], "", "{answer}");

    // The server still runs the next program cleanly.
    let answer = run(&server, json!({"code": "print(6 * 7)", "language": "python"}));
    assert_eq!(answer["run_result"]["stdout"], "42\n", "{answer}");
}

#[test]
fn malformed_requests_get_4xx_naming_the_field_and_other_routes_are_refused_by_name() {
    let server = start(&["--run-workers", "1", "--api-key", "k", "--max-body-bytes", "262144"]);
    let (status, _, body) = server.http("POST", "/run_code", &[], br#"{"code": "print(1)", "language": "python"}"#);
    assert_eq!(status, 401, "{body}");
    let (status, _, body) = server.http("GET", "/health", &[], b"");
    assert_eq!(status, 200, "{body}");
    let auth = ["Authorization: Bearer k"];
    let post = |body: &str| {
        let (status, _, body) = server.http("POST", "/run_code", &auth, body.as_bytes());
        (status, serde_json::from_str::<Value>(&body).unwrap_or(Value::String(body)))
    };
    for (body, param) in [
        (r#"{"language": "python"}"#, "code"),
        (r#"{"code": 1, "language": "python"}"#, "code"),
        (r#"{"code": "x"}"#, "language"),
        (r#"{"code": "x", "language": "cobol"}"#, "language"),
        (r#"{"code": "x", "language": "cpp"}"#, "language"),
        (r#"{"code": "x", "language": "python", "run_timeout": -1}"#, "run_timeout"),
        (r#"{"code": "x", "language": "python", "run_timeout": "ten"}"#, "run_timeout"),
        (r#"{"code": "x", "language": "python", "compile_timeout": []}"#, "compile_timeout"),
        (r#"{"code": "x", "language": "python", "memory_limit_MB": "lots"}"#, "memory_limit_MB"),
        (r#"{"code": "x", "language": "python", "stdin": 5}"#, "stdin"),
        (r#"{"code": "x", "language": "python", "files": []}"#, "files"),
        (r#"{"code": "x", "language": "python", "files": {"../x": ""}}"#, "files.../x"),
        (r#"{"code": "x", "language": "python", "files": {"a": "not base64!"}}"#, "files.a"),
        (r#"{"code": "x", "language": "python", "files": {"a": 5}}"#, "files.a"),
        (r#"{"code": "x", "language": "python", "fetch_files": "a"}"#, "fetch_files"),
        (r#"{"code": "x", "language": "python", "fetch_files": ["ok", "/../../etc/passwd"]}"#, "fetch_files[1]"),
    ] {
        let (status, answer) = post(body);
        assert_eq!((status, answer["error"]["param"].as_str()), (400, Some(param)), "{body} -> {answer}");
    }
    let (status, answer) = post(r#"{"code": "x", "language": "cpp"}"#);
    assert!(answer["error"]["message"].as_str().unwrap().contains("it runs: pytest, python"), "{status} {answer}");
    for bad in ["", "not json", "[1]", "{\"code\": \"x\", \"language\": \"python\", \"run_timeout\": 1e999}"] {
        let (status, answer) = post(bad);
        assert_eq!(status, 400, "{bad:?} -> {answer}");
    }
    // Past the body limit: 413, before anything is decoded or written.
    let huge = json!({"code": "x".repeat(300_000), "language": "python"}).to_string();
    let (status, _) = post(&huge);
    assert_eq!(status, 413);
    // More files than a run may hold: refused naming `files`, nothing written.
    let many: serde_json::Map<String, Value> = (0..1001).map(|i| (format!("f{i}"), json!(""))).collect();
    let (status, answer) = post(&json!({"code": "x", "language": "python", "files": many}).to_string());
    assert_eq!((status, answer["error"]["param"].as_str()), (400, Some("files")), "{answer}");
    let (_, _, body) = server.http("GET", "/v1/status", &auth, b"");
    let status: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status["runs"].as_u64(), status["running"].as_u64()), (Some(0), Some(0)), "{status}");
    assert!(status["refused"].as_u64().unwrap() >= 20, "{status}");
    for route in ["/run_jupyter", "/submit", "/get_prompts"] {
        let (status, _, body) = server.http("POST", route, &auth, b"{}");
        assert_eq!(status, 501, "{route}: {body}");
        assert!(body.contains(route), "{route}: {body}");
    }
    let (status, _, body) = server.http("GET", "/v1/ping", &auth, b"");
    assert_eq!((status, body.as_str()), (200, "pong"));
}

#[test]
fn a_full_queue_is_answered_503_with_retry_after_and_nothing_else_is_lost() {
    let server = start(&["--run-workers", "1", "--max-queued", "1"]);
    let address = server.address.clone();
    let slow = json!({"code": "import time\ntime.sleep(4)\nprint('slept')", "language": "python", "run_timeout": 30})
        .to_string();
    let send = || {
        let (address, slow) = (address.clone(), slow.clone());
        std::thread::spawn(move || crate::serve::http(&address, "POST", "/run_code", &[], slow.as_bytes()))
    };
    // One runs, one waits (seen in /v1/status, not guessed from sleeps): a third is refused at
    // once, saying when to come back.
    let first = send();
    wait_for_queue(&server, 1, 0);
    let second = send();
    wait_for_queue(&server, 1, 1);
    let clients = [first, second];
    let (status, headers, body) = server.http("POST", "/run_code", &[], slow.as_bytes());
    assert_eq!(status, 503, "{body}");
    assert!(headers.to_lowercase().contains("retry-after: 1"), "{headers}");
    for client in clients {
        let (status, _, body) = client.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("slept"), "{body}");
    }
}

#[test]
fn the_sandbox_fusion_client_and_verls_request_work_against_wirl() {
    let server = start(&[
        "--run-workers",
        "2",
        "--runner",
        &format!("nodejs={}", wirl_test_artifacts::JS_CODE_RUNNER),
        "--runner",
        &format!("lua={}", wirl_test_artifacts::C_LUA_RUNNER),
        "--runner",
        &format!("ruby={}", wirl_test_artifacts::PREBUILT_RUBY_RUNNER),
    ]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/serve/sandbox_fusion_client.py");
    let run =
        Command::new(sandbox_fusion_python()).arg(script).arg(format!("http://{}", server.address)).output().unwrap();
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let seen: Value = serde_json::from_slice(&run.stdout).unwrap();
    let check = |name: &str, want: Value| {
        for (key, value) in want.as_object().unwrap() {
            assert_eq!(&seen[name][key], value, "{name}.{key}: {seen}");
        }
    };
    check(
        "hello",
        json!({"status": "Success", "run_status": "Finished", "return_code": 0, "stdout": "hello, world\n"}),
    );
    check("stdin", json!({"status": "Success", "stdout": "6\n"}));
    check(
        "hello_nodejs",
        json!({"status": "Success", "run_status": "Finished", "return_code": 0, "stdout": "hello, world\n"}),
    );
    check("stdin_nodejs", json!({"status": "Success", "stdout": "6\n"}));
    check(
        "hello_lua",
        json!({"status": "Success", "run_status": "Finished", "return_code": 0, "stdout": "hello, world\n"}),
    );
    check("stdin_lua", json!({"status": "Success", "stdout": "6\n"}));
    check("exit_code_lua", json!({"status": "Failed", "run_status": "Finished", "return_code": 3}));
    check("raised_lua", json!({"status": "Failed", "return_code": 1}));
    assert!(seen["raised_lua"]["stderr"].as_str().unwrap().starts_with("lua: program.lua:1: no"), "{seen}");
    check("files_lua", json!({"status": "Success", "fetched": "2"}));
    check(
        "hello_ruby",
        json!({"status": "Success", "run_status": "Finished", "return_code": 0, "stdout": "hello, world\n"}),
    );
    check("stdin_ruby", json!({"status": "Success", "stdout": "6\n"}));
    check(
        "exit_code_ruby",
        json!({"status": "Failed", "run_status": "Finished", "return_code": 3, "stdout": "ensure ran\n"}),
    );
    check("raised_ruby", json!({"status": "Failed", "return_code": 1}));
    assert!(
        seen["raised_ruby"]["stderr"].as_str().unwrap().starts_with("program.rb:1:in '<main>': no (ArgumentError)"),
        "{seen}"
    );
    check("files_ruby", json!({"status": "Success", "fetched": "2"}));
    check("exit_code", json!({"status": "Failed", "run_status": "Finished", "return_code": 3}));
    check("raised", json!({"status": "Failed", "return_code": 1}));
    assert!(seen["raised"]["stderr"].as_str().unwrap().contains("ValueError: no"), "{seen}");
    check("timeout", json!({"status": "Failed", "run_status": "TimeLimitExceeded", "return_code": null}));
    check("files", json!({"status": "Success", "fetched": "2"}));
    check("unknown_language", json!({"status": 400, "param": "language"}));
    check("no_code", json!({"status": 400, "param": "code"}));
    check("bad_timeout", json!({"status": 400, "param": "run_timeout"}));
    check("escaping_file", json!({"status": 400, "param": "files.../x"}));
    check("verl", json!({"status": "Success", "run_status": "Finished", "stdout": "42\n", "passed": true}));
}

#[test]
fn wirl_serve_runs_code_beside_the_model() {
    let server = Server::start(&["--runner", &format!("python={PYTHON_CODE_RUNNER}"), "--run-workers", "1"]);
    let answer = run(&server, json!({"code": "print(sum(range(10)))", "language": "python"}));
    assert_eq!(answer["run_result"]["stdout"], "45\n", "{answer}");
    let (status, _, models) = server.http("GET", "/v1/models", &[], b"");
    assert_eq!(status, 200, "the model's routes are still there: {models}");
}

/// Lua programs that push the interpreter's own limits end as `lua` ends them — an error the
/// program can catch, or the time limit — and the worker goes on to the next program.
#[test]
fn hostile_lua_programs_end_as_lua_would_and_the_worker_goes_on() {
    let server = start(&["--run-workers", "1", "--runner", &format!("lua={}", wirl_test_artifacts::C_LUA_RUNNER)]);
    let lua = |code: &str, timeout: u32| {
        run(&server, json!({"code": code, "language": "lua", "run_timeout": timeout, "memory_limit_MB": 128}))
    };
    // 100,000 coroutines each resuming the next: Lua's C-stack limit, caught by pcall.
    let nested = "local function nest(n) return coroutine.wrap(function() return n > 0 and nest(n - 1)() or 0 end) end\nprint(pcall(nest(100000)))";
    let answer = lua(nested, 10);
    assert_eq!(answer["run_result"]["return_code"], 0, "{answer}");
    assert!(answer["run_result"]["stdout"].as_str().unwrap().starts_with("false"), "{answer}");
    // An __index that calls itself: "C stack overflow", an ordinary error.
    let answer = lua(
        "local t = setmetatable({}, {})\ngetmetatable(t).__index = function(s, k) return s[k] end\nprint(pcall(function() return t.x end))",
        10,
    );
    assert!(answer["run_result"]["stdout"].as_str().unwrap().contains("stack overflow"), "{answer}");
    // A gigabyte string under 128 MiB: "not enough memory", caught.
    let answer = lua("print(pcall(string.rep, 'x', 1e9, ','))\nprint('after')", 10);
    assert_eq!(answer["run_result"]["stdout"], "false\tnot enough memory\nafter\n", "{answer}");
    // A pattern that backtracks without end: the time limit.
    let answer = lua("print(string.find(string.rep('a', 40), string.rep('a*', 40) .. 'b'))", 1);
    assert_eq!(answer["run_result"]["status"], "TimeLimitExceeded", "{answer}");
    let answer = lua("print(('ok'):upper())", 10);
    assert_eq!(answer["run_result"]["stdout"], "OK\n", "{answer}");
}

/// A config's `[sandbox]` table sets `/run_code` for `wirl serve` (runner paths relative to the
/// config), the flags over it; a key it does not know is refused naming the table.
#[test]
fn wirl_serve_reads_runners_and_bounds_from_a_sandbox_table() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("runners")).unwrap();
    std::fs::copy(wirl_test_artifacts::C_LUA_RUNNER, dir.path().join("runners/lua.wasm")).unwrap();
    let config = dir.path().join("serve.toml");
    std::fs::write(&config, "[sandbox]\nruners = 1\n").unwrap();
    let refused = Command::new(env!("CARGO_BIN_EXE_wirl")).arg("serve").arg("--config").arg(&config).output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("[sandbox]") && said.contains("runers"), "{said}");

    std::fs::write(&config, "[sandbox]\nrunners = { lua = \"runners/lua.wasm\" }\nrun_workers = 1\nmax_queued = 0\n")
        .unwrap();
    let python = format!("python={PYTHON_CODE_RUNNER}");
    let server = Server::start(&["--config", config.to_str().unwrap(), "--runner", &python, "--max-queued", "4"]);
    let answer = run(&server, json!({"code": "print(6 * 7)", "language": "lua"}));
    assert_eq!(answer["run_result"]["stdout"], "42\n", "{answer}");
    let (_, _, status) = server.http("GET", "/v1/status", &[], b"");
    let status: Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["languages"], json!(["lua", "pytest", "python"]), "{status}");
}

/// A venv with SandboxFusion's client from PyPI (made once per target directory).
fn sandbox_fusion_python() -> std::path::PathBuf {
    crate::serve::pypi_python("sandbox-fusion-venv", "sandbox_fusion", "sandbox-fusion==0.3.7")
}

/// HumanEval's 164 programs (prompt + canonical solution + test + `check(entry_point)`, as
/// the peers build them) through `/run_code`, from 4 clients at once: every one passes.
#[test]
fn every_canonical_humaneval_solution_passes_through_run_code() {
    let server = start(&["--run-workers", "2"]);
    let dataset = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/humaneval/HumanEval.jsonl");
    let programs: Vec<(String, String)> = std::fs::read_to_string(dataset)
        .unwrap()
        .lines()
        .map(|line| {
            let task: Value = serde_json::from_str(line).unwrap();
            let meta: Value = serde_json::from_str(task["metadata"].as_str().unwrap()).unwrap();
            let source = format!(
                "{}{}\n\n{}\n\ncheck({})\n",
                meta["prompt"].as_str().unwrap(),
                task["answer"].as_str().unwrap(),
                meta["test"].as_str().unwrap(),
                meta["entry_point"].as_str().unwrap()
            );
            (task["id"].as_str().unwrap().to_string(), source)
        })
        .collect();
    assert_eq!(programs.len(), 164);
    let programs = std::sync::Arc::new(programs);
    let failed: Vec<String> = (0..4)
        .map(|client| {
            let (programs, address) = (programs.clone(), server.address.clone());
            std::thread::spawn(move || {
                let mut failed = Vec::new();
                for (id, source) in programs.iter().skip(client).step_by(4) {
                    let body = json!({"code": source, "language": "python", "run_timeout": 20}).to_string();
                    let (status, _, answer) = crate::serve::http(&address, "POST", "/run_code", &[], body.as_bytes());
                    let answer: Value = serde_json::from_str(&answer).unwrap_or(Value::Null);
                    if status != 200 || answer["status"] != "Success" {
                        failed.push(format!("{id}: {status} {answer}"));
                    }
                }
                failed
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .flat_map(|client| client.join().unwrap())
        .collect();
    assert!(failed.is_empty(), "{} of 164 failed: {failed:#?}", failed.len());
}

/// JavaScript (SpiderMonkey in a component) answered as `node program.js` would: output,
/// stdin the three ways Node programs read it, exit codes, errors with the program's lines,
/// timers, and the same limits as Python's runner; `js` and `javascript` name it too.
#[test]
fn javascript_runs_as_node_would_with_the_same_limits() {
    let mut command = Command::new(env!("CARGO_BIN_EXE_wirl"));
    command.args(["sandbox", "serve", "--port", "0", "--run-workers", "1"]);
    command.arg("--runner").arg(format!("python={PYTHON_CODE_RUNNER}"));
    command.arg("--runner").arg(format!("nodejs={}", wirl_test_artifacts::JS_CODE_RUNNER));
    let server = Server::spawn(command);
    let js = |code: &str, stdin: &str| run(&server, json!({"code": code, "language": "nodejs", "stdin": stdin}));
    let out = |answer: &Value| answer["run_result"]["stdout"].as_str().unwrap().to_string();

    let answer = js("console.log('hi', 1 + 2, [1, 2], {a: 1}); process.stdout.write('no newline')", "");
    assert_eq!(
        (answer["status"].as_str(), out(&answer).as_str()),
        (Some("Success"), "hi 3 [ 1, 2 ] { a: 1 }\nno newline")
    );
    let sum = "const n = require('fs').readFileSync(0, 'utf8').trim().split('\\n').map(Number); console.log(n.reduce((a, b) => a + b))";
    assert_eq!(out(&js(sum, "1\n2\n3\n")), "6\n");
    let lines = "const rl = require('readline').createInterface({input: process.stdin}); let s = 0;\n\
                 rl.on('line', l => s += +l); rl.on('close', () => console.log(s))";
    assert_eq!(out(&js(lines, "4\n5\n")), "9\n");
    let chunks =
        "let d = ''; process.stdin.on('data', c => d += c); process.stdin.on('end', () => console.log(d.length))";
    assert_eq!(out(&js(chunks, "abc")), "3\n");
    let later = "setTimeout(() => console.log('b'), 10); setTimeout(() => console.log('a'), 0);\n\
                 Promise.resolve().then(() => console.log('micro')); console.log('sync')";
    assert_eq!(out(&js(later, "")), "sync\na\nb\nmicro\n");

    let answer = js("console.error('bad'); process.exit(3)", "");
    assert_eq!(
        (answer["run_result"]["return_code"].as_i64(), answer["run_result"]["stderr"].as_str()),
        (Some(3), Some("bad\n"))
    );
    let answer = js("function f() { return null.x }\nf()", "");
    assert_eq!(answer["run_result"]["return_code"], 1, "{answer}");
    let stderr = answer["run_result"]["stderr"].as_str().unwrap();
    assert!(stderr.starts_with("TypeError") && stderr.contains("at f (program.js:1:"), "{stderr}");
    assert!(
        !stderr.contains("app.js") && !stderr.contains("initializer"),
        "the runner's own frames stay out: {stderr}"
    );

    // Nothing of the host: no modules but the shims, no network, no WebAssembly inside.
    let answer =
        js("try { require('child_process') } catch (e) { console.log(e.code) }\nconsole.log(typeof WebAssembly)", "");
    assert_eq!(out(&answer), "MODULE_NOT_FOUND\nundefined\n");
    let answer = js("fetch('http://127.0.0.1:9/').then(() => console.log('reached'))", "");
    assert_ne!(answer["status"], "Success", "{answer}");
    assert!(!out(&answer).contains("reached"), "{answer}");

    // The limits: time, memory, output.
    let answer = run(&server, json!({"code": "while (true) {}", "language": "js", "run_timeout": 1}));
    assert_eq!(answer["run_result"]["status"], "TimeLimitExceeded", "{answer}");
    let answer = run(
        &server,
        json!({"code": "const a = []; while (true) a.push(new Array(1e6).fill(1))",
        "language": "javascript", "memory_limit_MB": 64, "run_timeout": 30}),
    );
    assert!(answer["message"].as_str().unwrap().contains("out of memory"), "{answer}");
    let answer = js("while (true) console.log('y'.repeat(1000))", "");
    assert_eq!(answer["run_result"]["status"], "Error", "{answer}");
    assert!(answer["message"].as_str().unwrap().contains("output limit"), "{answer}");
    // And the next program runs clean.
    assert_eq!(out(&js("console.log(6 * 7)", "")), "42\n");
}

/// A worker killed from outside mid-run (the OOM killer, kill -9): that request is answered
/// `SandboxError` (the client retries it; nothing is judged by it), and the next one runs in
/// a fresh worker.
#[test]
fn a_worker_killed_mid_run_is_a_sandbox_error_and_the_next_run_works() {
    let server = start(&["--run-workers", "1"]);
    // Warm: the worker exists once a program has run.
    run(&server, json!({"code": "print(1)", "language": "python"}));
    let address = server.address.clone();
    let slow = json!({"code": "import time\ntime.sleep(30)", "language": "python", "run_timeout": 60}).to_string();
    let client = std::thread::spawn(move || crate::serve::http(&address, "POST", "/run_code", &[], slow.as_bytes()));
    // The run has its turn (/v1/status), then a moment to reach the worker (it sleeps 30 s).
    wait_for_queue(&server, 1, 0);
    std::thread::sleep(Duration::from_millis(1000));
    let children = Command::new("pgrep").args(["-P", &server.pid().to_string()]).output().unwrap();
    let workers: Vec<String> =
        String::from_utf8_lossy(&children.stdout).split_whitespace().map(str::to_string).collect();
    assert_eq!(workers.len(), 1, "one worker: {workers:?}");
    assert!(Command::new("kill").args(["-9", &workers[0]]).status().unwrap().success());
    let (status, _, body) = client.join().unwrap();
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!((status, answer["status"].as_str()), (200, Some("SandboxError")), "{body}");
    assert!(answer["message"].as_str().unwrap().contains("worker"), "{body}");
    let answer = run(&server, json!({"code": "print(2)", "language": "python"}));
    assert_eq!(answer["run_result"]["stdout"], "2\n", "{answer}");
}

/// SandboxFusion's `pytest` language: the program is a test file and pytest (8, inside the
/// Python runner) runs it — its exit status, its report, fixtures, parametrize, tmp_path.
#[test]
fn pytest_mode_runs_the_program_as_a_test_file_with_pytest() {
    let server = start(&["--run-workers", "1"]);
    let passing = "import pytest\n\ndef add(a, b):\n    return a + b\n\n@pytest.mark.parametrize('a,b,c', [(1, 1, 2), (2, 3, 5)])\ndef test_add(a, b, c):\n    assert add(a, b) == c\n\ndef test_raises():\n    with pytest.raises(ZeroDivisionError):\n        1 / 0\n\n@pytest.fixture\ndef answer():\n    yield 42\n\nclass TestFiles:\n    def test_tmp_path(self, tmp_path, answer):\n        (tmp_path / 'x.txt').write_text(str(answer))\n        assert (tmp_path / 'x.txt').read_text() == '42'\n\ndef test_approx():\n    assert 0.1 + 0.2 == pytest.approx(0.3)\n\ndef test_capsys(capsys):\n    print('hi')\n    assert capsys.readouterr().out == 'hi\\n'\n\ndef test_monkeypatch(monkeypatch):\n    import math\n    monkeypatch.setattr(math, 'pi', 3)\n    assert math.pi == 3\n";
    let answer = run(&server, json!({"code": passing, "language": "pytest", "run_timeout": 30}));
    let stdout = answer["run_result"]["stdout"].as_str().unwrap();
    assert_eq!(answer["status"], "Success", "{answer}");
    assert_eq!(answer["run_result"]["return_code"], 0, "{answer}");
    assert!(stdout.contains("7 passed"), "{stdout}");

    let failing = "def test_ok():\n    assert True\n\ndef test_wrong():\n    x = [1, 2]\n    assert sum(x) == 4\n";
    let answer = run(&server, json!({"code": failing, "language": "pytest", "run_timeout": 30}));
    let stdout = answer["run_result"]["stdout"].as_str().unwrap();
    assert_eq!((&answer["status"], &answer["run_result"]["return_code"]), (&json!("Failed"), &json!(1)), "{answer}");
    // pytest's assertion rewriting explains the failure, as it does outside.
    assert!(stdout.contains("1 failed, 1 passed") && stdout.contains("assert 3 == 4"), "{stdout}");

    // No tests: pytest's own status 5; a file that does not import: 2.
    let answer = run(&server, json!({"code": "x = 1\n", "language": "pytest"}));
    assert_eq!(answer["run_result"]["return_code"], 5, "{answer}");
    let answer = run(&server, json!({"code": "import no_such_module\n", "language": "pytest"}));
    assert_eq!(answer["run_result"]["return_code"], 2, "{answer}");
    // The plain language still runs plain programs: pytest is only a mode.
    let answer = run(&server, json!({"code": "print(__name__)", "language": "python"}));
    assert_eq!(answer["run_result"]["stdout"], "__main__\n", "{answer}");
    let answer = run(
        &server,
        json!({"code": "def test_x():\n    while True:\n        pass\n", "language": "pytest", "run_timeout": 1}),
    );
    assert_eq!(answer["run_result"]["status"], "TimeLimitExceeded", "{answer}");
}
