//! The `wirl` binary, run as a user runs it.

use std::path::Path;
use std::process::{Command, Output};
use wirl_test_artifacts::{ARITHMETIC, EXACT_MATCH, HOSTILE, MATH_ANSWER};

fn wirl(args: &[&str]) -> Output {
    let cache = std::env::temp_dir().join("wirl-cli-test-cache");
    Command::new(env!("CARGO_BIN_EXE_wirl")).args(args).env("WIRL_CACHE_DIR", cache).output().unwrap()
}

fn stdout_lines(output: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&output.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/score").join(name).display().to_string()
}

/// Every example line carries the reward a reader should expect; the plugin must agree.
#[test]
fn score_examples_match_their_expected_rewards() {
    for (plugin, file) in
        [(MATH_ANSWER, "math.jsonl"), (EXACT_MATCH, "exact.jsonl"), ("builtin:math-verify", "math-verify.jsonl")]
    {
        let input = example(file);
        let output = wirl(&["score", "--plugin", plugin, "--input", &input]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let expected: Vec<f64> = std::fs::read_to_string(&input)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["expected_reward"].as_f64().unwrap())
            .collect();
        let got: Vec<f64> = stdout_lines(&output).iter().map(|v| v["reward"].as_f64().unwrap()).collect();
        assert_eq!(got, expected, "{file}");
        let summary = String::from_utf8_lossy(&output.stderr);
        assert!(summary.contains(&format!("scored      {} of {}", got.len(), got.len())), "{summary}");
    }
}

#[test]
fn bad_input_lines_are_named_and_the_rest_still_scored() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let good = r#"{"task": {"id": "a", "messages": [], "answer": "2"}, "completion": "<answer>2</answer>"}"#;
    let lines = [
        good,
        "this is not json",
        r#"{"task": {"id": "b", "messages": [], "answer": "2"}}"#,
        r#"{"task": {"id": "c", "answer": "2"}, "completion": "2"}"#,
        r#"{"task": {"id": "d", "messages": []}, "completion": 5}"#,
        "",
        good,
    ];
    std::fs::write(&input, lines.join("\n")).unwrap();
    let out = dir.path().join("out.jsonl");
    let output = wirl(&[
        "score",
        "--plugin",
        MATH_ANSWER,
        "--input",
        input.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for needle in [
        "line 2: not JSON",
        "line 3: missing field `completion`",
        "line 4: field `task`: missing field `messages`",
        "line 5: field `completion`: expected a string",
        "4 of 6 lines were not scored",
    ] {
        assert!(stderr.contains(needle), "missing {needle:?} in:\n{stderr}");
    }
    let records: Vec<serde_json::Value> =
        std::fs::read_to_string(&out).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(records.len(), 6);
    assert_eq!(records[0]["reward"], 1.0);
    assert_eq!(records[5]["line"], 7);
    assert_eq!(records[5]["reward"], 1.0);
}

#[test]
fn failures_are_reported_with_their_kind_and_duration() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let line = |c: &str| format!(r#"{{"task": {{"id": "{c}", "messages": []}}, "completion": "{c}"}}"#);
    std::fs::write(&input, [line("ok"), line("loop"), line("memory-bomb"), line("ok")].join("\n")).unwrap();
    // A small memory cap: the bomb reaches it in a few milliseconds even on a loaded machine,
    // well inside the deadline that ends the loop (with the default cap, a busy CI machine
    // ran out of time first).
    let input = input.to_str().unwrap();
    let output = wirl(&["score", "--plugin", HOSTILE, "--deadline-ms", "300", "--memory-mib", "32", "--input", input]);
    assert_eq!(output.status.code(), Some(1));
    let records = stdout_lines(&output);
    assert_eq!(records[1]["failure"]["kind"], "deadline");
    assert!(records[1]["micros"].as_u64().unwrap() >= 300_000);
    assert_eq!(records[2]["failure"]["kind"], "memory");
    assert_eq!(records[3]["reward"], 2.0);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("deadline 1") && stderr.contains("memory 1"), "{stderr}");
}

#[test]
fn plugin_inspect_shows_identity() {
    let output = wirl(&["plugin", "inspect", "--json", MATH_ANSWER]);
    assert!(output.status.success());
    let report = &stdout_lines(&output)[0];
    assert_eq!(report["world"], "reward-plugin");
    assert_eq!(report["wit_version"], "0.1.0");
    assert_eq!(report["sha256"].as_str().unwrap().len(), 64);
    assert_eq!(report["size"].as_u64().unwrap(), std::fs::metadata(MATH_ANSWER).unwrap().len());
    let text = wirl(&["plugin", "inspect", ARITHMETIC]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("world:    environment-plugin"));
}

#[test]
fn unusable_plugin_files_exit_2_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let bogus = dir.path().join("bogus.wasm");
    std::fs::write(&bogus, "hello").unwrap();
    for args in [
        vec!["plugin", "inspect", bogus.to_str().unwrap()],
        vec!["score", "--plugin", bogus.to_str().unwrap()],
        vec!["score", "--plugin", ARITHMETIC],
    ] {
        let output = wirl(&args);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("bogus.wasm") || stderr.contains("arithmetic.wasm"), "{stderr}");
    }
}

#[test]
fn tasks_are_reproducible_and_configurable() {
    let first = wirl(&["tasks", "--plugin", ARITHMETIC, "--seed", "9", "--count", "5"]);
    let again = wirl(&["tasks", "--plugin", ARITHMETIC, "--seed", "9", "--count", "5"]);
    let other = wirl(&["tasks", "--plugin", ARITHMETIC, "--seed", "10", "--count", "5"]);
    assert!(first.status.success());
    assert_eq!(first.stdout, again.stdout);
    assert_ne!(first.stdout, other.stdout);
    let hard = wirl(&[
        "tasks",
        "--plugin",
        ARITHMETIC,
        "--config",
        "min_digits=3",
        "--config",
        "max_digits=3",
        "--count",
        "3",
    ]);
    for record in stdout_lines(&hard) {
        assert!(record["task"]["metadata"].as_str().unwrap().contains("chain_sum"));
        let question = record["task"]["messages"][5]["content"].as_str().unwrap();
        assert!(
            question.split(' ').filter(|w| w.chars().all(|c| c.is_ascii_digit())).all(|n| n.len() == 3),
            "{question}"
        );
    }
}

#[test]
fn score_counts_non_finite_scores_as_failures_and_keeps_undecodable_lines_apart() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let line = |c: &str| format!(r#"{{"task": {{"id": "{c}", "messages": []}}, "completion": "{c}"}}"#);
    let mut bytes = [line("nan"), line("inf"), line("ok")].join("\n").into_bytes();
    bytes.extend_from_slice(b"\n{\"task\": {\"id\": \"\xff\xfe\", \"messages\": []}, \"completion\": \"x\"}\n");
    bytes.extend_from_slice(line("fine").as_bytes());
    std::fs::write(&input, bytes).unwrap();
    let output = wirl(&["score", "--plugin", HOSTILE, "--input", input.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(1));
    let records = stdout_lines(&output);
    assert_eq!(records.len(), 5, "every line has a record");
    assert_eq!(records[0]["failure"]["kind"], "non_finite");
    assert_eq!(records[1]["failure"]["kind"], "non_finite");
    assert_eq!(records[2]["reward"], 2.0);
    assert!(records[3]["input_error"].as_str().unwrap().contains("line 4: not UTF-8"), "{}", records[3]);
    assert_eq!(records[4]["reward"], 4.0, "the line after an undecodable one is scored");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("scored      2 of 5") && stderr.contains("non_finite 2"), "{stderr}");
}

#[test]
fn score_refuses_to_write_over_its_input() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let text = r#"{"task": {"id": "t", "messages": []}, "completion": "ok"}"#;
    std::fs::write(&input, text).unwrap();
    // The same file, also when named another way.
    let other_name = dir.path().join(".").join("in.jsonl");
    let output = wirl(&[
        "score",
        "--plugin",
        HOSTILE,
        "--input",
        input.to_str().unwrap(),
        "--output",
        other_name.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("is the --input file"));
    assert_eq!(std::fs::read_to_string(&input).unwrap(), text, "the input is untouched");
}

#[test]
fn a_closed_stdout_ends_a_command_quietly_and_large_numbers_are_errors() {
    // `wirl tasks … | head -c 1`: the reader leaves after one byte.
    let mut child = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["tasks", "--plugin", ARITHMETIC, "--count", "100000"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    std::io::Read::read_exact(child.stdout.as_mut().unwrap(), &mut first).unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked") && !stderr.contains("Broken pipe"), "{stderr}");

    let output = wirl(&["tasks", "--plugin", ARITHMETIC, "--start", "18446744073709551615", "--count", "2"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("past the last index"));
    let output = wirl(&["score", "--plugin", HOSTILE, "--memory-mib", "18014398509481984"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--memory-mib"));
    let output = wirl(&["score", "--plugin", HOSTILE, "--deadline-ms", "18446744073709551615", "--input", "/dev/null"]);
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
}

/// `wirl` runs itself again with glibc's allocator keeping one heap it does not give back,
/// on transparent huge pages where the kernel gives them on request (training faults
/// gigabytes of tensors in); a `GLIBC_TUNABLES` the user set, even empty, is left as it is.
#[test]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn a_process_bound_to_one_core_computes_on_one_thread() {
    use std::os::unix::process::CommandExt;
    let threads = |bound: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wirl"));
        command.arg("--version").env("WIRL_LOG", "debug").env_remove("RAYON_NUM_THREADS");
        if bound {
            // SAFETY: only sched_setaffinity between fork and exec (async-signal-safe).
            unsafe {
                command.pre_exec(|| {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(0, &mut set);
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let out = command.output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        let said = log.split("candle computes on ").nth(1).and_then(|rest| rest.split(' ').next()).map(str::to_string);
        said.unwrap_or_else(|| panic!("no thread count in the debug log: {log}"))
    };
    // (`mpirun --bind-to core` binds a rank so: two threads on one core ran 1.5-2.8x slower.)
    assert_eq!(threads(true), "1");
    let cores = std::thread::available_parallelism().unwrap().get();
    assert_eq!(threads(false), cores.to_string());
}

#[test]
fn the_binary_starts_with_allocator_tunables_unless_some_are_set() {
    let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
    let kernel_gives_them = !thp.is_empty() && !thp.contains("[never]");
    // (huge pages, one heap) as the debug log says them.
    let says = |tunables: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_wirl"));
        command.arg("--version").env("WIRL_LOG", "debug").env_remove("GLIBC_TUNABLES");
        if let Some(tunables) = tunables {
            command.env("GLIBC_TUNABLES", tunables);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("wirl "), "the arguments survive the exec");
        let log = String::from_utf8_lossy(&out.stderr);
        (log.contains("transparent huge pages"), log.contains("keeps its memory in one heap"))
    };
    assert_eq!(says(None), (kernel_gives_them, true), "kernel: {thp}");
    assert_eq!(says(Some("")), (false, false), "an empty GLIBC_TUNABLES opts out");
    assert_eq!(says(Some("glibc.malloc.arena_max=2")), (false, false), "the user's tunables are kept");
    assert!(says(Some("glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")).0, "the user's own ask is seen");
}

/// A model file cut short (a copy that stopped, a disk that filled) is an error naming the
/// file and the tensor it could not read, and nothing else: no stack trace of this machine,
/// even with `RUST_BACKTRACE` set (candle attaches one to its errors then).
#[test]
fn a_truncated_model_file_is_named_without_a_backtrace() {
    let model = crate::engine::default_model();
    let dir = tempfile::tempdir().unwrap();
    let cut = dir.path().join("cut.gguf");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["generate", "--model", cut.to_str().unwrap(), "--prompt", "hi", "--max-tokens", "2"])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cut.gguf") && stderr.contains("remaining in file"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "one line, no backtrace: {stderr}");
}

/// `wirl train CONFIG --check`: every shipped training config validates and shows its lowered
/// objective, loading nothing (the model named need not exist); an override shows in what it
/// lowers to; a config that means nothing is refused naming the key, and nothing is written.
#[test]
fn train_check_shows_the_lowered_objective_of_every_example_and_loads_nothing() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/train");
    let mut configs: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    configs.sort();
    assert!(configs.len() >= 7, "{configs:?}");
    let cwd = tempfile::tempdir().unwrap();
    let check = |args: &[&str]| {
        let output = Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["train", "--check", "--model", "/nonexistent/model"])
            .args(args)
            .current_dir(cwd.path())
            .env("WIRL_CACHE_DIR", cwd.path().join("cache"))
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    for config in &configs {
        let (ok, out, err) = check(&[config.to_str().unwrap()]);
        assert!(ok, "{}: {err}", config.display());
        assert!(out.contains(": valid\n") && out.contains("objective:\n  policy term:"), "{}: {out}", config.display());
        assert!(out.contains("model: /nonexistent/model on cpu") && out.contains("tasks:\n"), "{out}");
    }
    let (ok, out, _) = check(&["--set", "grpo.loss=gspo", "--set", "grpo.beta=0"]);
    assert!(ok && out.contains("policy term:  gspo") && out.contains("kl:           none"), "{out}");
    let (ok, out, _) =
        check(&["--set", "grpo.beta=0.1", "--set", "grpo.kl_in_reward=true", "--set", "grpo.kl_target=0.2"]);
    assert!(ok && out.contains("in the reward, beta 0.1, adapting towards 0.2"), "{out}");
    let (ok, _, err) = check(&["--set", "grpo.kl_target=0.2"]);
    assert!(!ok && err.contains("`grpo.kl_target`"), "{err}");
    assert_eq!(std::fs::read_dir(cwd.path()).unwrap().count(), 0, "nothing written, no model fetched");

    // The objective's typed spelling: each choice a table with only its own parameters.
    let typed = tempfile::tempdir().unwrap();
    let default = std::fs::read_to_string(dir.join("default.toml")).unwrap();
    let write = |grpo: &str| {
        let objective =
            "loss = { kind = \"grpo\", clip_low = 0.2, clip_high = 0.2 }\nkl = { where = \"loss\", beta = 0.04 }\n";
        let text = default.replace(objective, grpo);
        assert_ne!(text, default, "the default's objective keys moved");
        let path = typed.path().join("typed.toml");
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let config = write(
        "loss = { kind = \"cispo\", clip_high = 4.0 }\nkl = { where = \"reward\", beta = 0.05, estimator = \"k2\" }\noverlong = { buffer = 16 }\n",
    );
    let (ok, out, err) = check(&[&config]);
    assert!(ok, "{err}");
    assert!(out.contains("policy term:  cispo, the importance weight capped at 1 + 4"), "{out}");
    assert!(out.contains("kl:           in the reward, beta 0.05, fixed, estimator k2"), "{out}");
    assert!(out.contains("overlong:     the last 16 tokens cost up to 1"), "{out}");
    let config = write("loss = { kind = \"cispo\", clip_low = 0.2 }\n");
    let (ok, _, err) = check(&[&config]);
    assert!(!ok && err.contains("unknown field `clip_low`, expected `clip_high`"), "{err}");
    let config = write("kl = { where = \"loss\", beta = 0.1 }\nbeta = 0.2\n");
    let (ok, _, err) = check(&[&config]);
    assert!(!ok && err.contains("`grpo.beta` is written both"), "{err}");
    // The flat keys of earlier versions still read, and the file is told their new spelling.
    let config = write("loss = \"gspo\"\nbeta = 0.1\nclip_high = 0.3\n");
    let (ok, out, err) = check(&[&config]);
    assert!(ok && out.contains("policy term:  gspo, the sequence's ratio clipped to [1 - 0.2, 1 + 0.3]"), "{out}");
    assert!(err.contains("which read as loss = { clip_high = 0.3, kind = \"gspo\" }, kl = { beta = 0.1"), "{err}");
    assert_eq!(err.matches("which read as").count(), 1, "told once: {err}");
}
