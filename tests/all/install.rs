//! `wirl` installed once and run anywhere: the built binary copied into a read-only folder
//! outside the repository, a fresh `HOME` holding only the cached default model, and every
//! command run from an empty folder.

use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use wirl_test_artifacts::{ARITHMETIC, CODE_TESTS, JUDGE, MATH_ANSWER, MATH_VERIFY};

struct Installed {
    _root: tempfile::TempDir,
    bin: PathBuf,
    home: PathBuf,
    work: PathBuf,
}

impl Installed {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let (bin, home, work) = (root.path().join("bin"), root.path().join("home"), root.path().join("work"));
        let models = home.join(".cache/wirl/models");
        for dir in [&bin, &models, &work] {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::copy(env!("CARGO_BIN_EXE_wirl"), bin.join("wirl")).unwrap();
        set_mode(&bin, 0o555);
        let model = crate::engine::default_model();
        std::os::unix::fs::symlink(&model, models.join(model.file_name().unwrap())).unwrap();
        Installed { _root: root, bin, home, work }
    }

    /// The installed `wirl`, in the empty folder, with nothing of the developer's
    /// environment but `PATH` (where a user's toolchain is) and a fresh `HOME`.
    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.bin.join("wirl"));
        command.args(args).current_dir(&self.work).env_clear().env("HOME", &self.home);
        command.env("PATH", std::env::var_os("PATH").unwrap());
        command
    }

    fn run(&self, args: &[&str]) -> Output {
        let output = self.command(args).output().unwrap();
        assert!(
            output.status.success(),
            "wirl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        output
    }
}

impl Drop for Installed {
    fn drop(&mut self) {
        set_mode(&self.bin, 0o755);
    }
}

fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn sha256_of(path: &str) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

fn json_lines(bytes: &[u8]) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(bytes).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn an_installed_wirl_runs_the_default_job_and_its_plugins_from_an_empty_folder() {
    let wirl = Installed::new();

    let version = String::from_utf8(wirl.run(&["--version"]).stdout).unwrap();
    assert!(version.starts_with(&format!("wirl {}", env!("CARGO_PKG_VERSION"))), "{version}");
    let spoken: Vec<String> = wirl_sandbox::WIT_VERSIONS.iter().map(|v| format!("wirl:rl@{v}")).collect();
    assert!(version.contains(&format!("wit: {}", spoken.join(" "))), "{version}");
    assert!(version.contains("features: cpu"), "{version}");
    let completions = String::from_utf8(wirl.run(&["completions", "bash"]).stdout).unwrap();
    assert!(completions.contains("_wirl()") && completions.contains("train"), "bash completions");

    // The built-ins are the components built from plugins/rust (the files the tests load).
    let listed = json_lines(&wirl.run(&["plugin", "list", "--json"]).stdout);
    let by_name = |name: &str| listed.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name} listed"));
    let arithmetic = by_name("builtin:arithmetic");
    assert_eq!(arithmetic["sha256"], sha256_of(ARITHMETIC));
    assert_eq!(arithmetic["world"], "environment-plugin");
    assert_eq!(by_name("builtin:math-answer")["sha256"], sha256_of(MATH_ANSWER));
    assert_eq!(by_name("builtin:math-answer")["wit_version"], wirl_sandbox::WIT_VERSION);
    assert_eq!(by_name("builtin:math-verify")["sha256"], sha256_of(MATH_VERIFY));
    assert_eq!(by_name("builtin:code-tests")["sha256"], sha256_of(CODE_TESTS));
    assert_eq!(by_name("builtin:code-tests")["world"], "grader-plugin");
    assert_eq!(by_name("builtin:judge")["sha256"], sha256_of(JUDGE));
    assert_eq!(
        (&by_name("builtin:judge")["world"], &by_name("builtin:judge")["wit_version"]),
        (&"reward-plugin".into(), &"0.2.0".into())
    );

    // One (shrunk) step of the default job: the run goes under ./runs, nowhere else.
    wirl.run(&[
        "train",
        "--steps",
        "1",
        "--eval-tasks",
        "2",
        "--set",
        "grpo.prompts_per_step=2",
        "--set",
        "grpo.group_size=2",
        "--set",
        "sampling.max_tokens=16",
    ]);
    let runs: Vec<PathBuf> =
        std::fs::read_dir(wirl.work.join("runs")).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();
    assert_eq!(runs.len(), 1, "{runs:?}");
    let metrics = json_lines(&std::fs::read(runs[0].join("metrics.jsonl")).unwrap());
    assert_eq!(metrics.len(), 1);
    let rollouts = json_lines(&std::fs::read(runs[0].join("rollouts.jsonl")).unwrap());
    assert_eq!(rollouts.len(), 4, "2 prompts x 2 samples");
    let hashes: Vec<&str> =
        rollouts[0]["plugins"].as_array().unwrap().iter().map(|p| p["sha256"].as_str().unwrap()).collect();
    assert!(hashes.contains(&sha256_of(MATH_ANSWER).as_str()), "rollouts name the built-in's sha256: {hashes:?}");

    let eval = wirl.run(&["eval", "--tasks", "2"]);
    assert!(String::from_utf8_lossy(&eval.stderr).contains("[2/2]"), "{}", String::from_utf8_lossy(&eval.stderr));
    // Beside the runs, named after the model; nothing loose in the current folder.
    let written: Vec<PathBuf> =
        std::fs::read_dir(wirl.work.join("runs/eval")).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(written.len(), 1, "{written:?}");
    assert_eq!(json_lines(&std::fs::read(&written[0]).unwrap()).len(), 2);
    assert!(!wirl.work.join("eval.jsonl").exists());

    let mut score = wirl.command(&["score", "--plugin", "builtin:math-answer"]);
    let mut child = score.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let line = r#"{"task": {"id": "t", "messages": [], "answer": "12"}, "completion": "<answer>12</answer>"}"#;
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), format!("{line}\n").as_bytes()).unwrap();
    let scored = child.wait_with_output().unwrap();
    assert!(scored.status.success(), "{}", String::from_utf8_lossy(&scored.stderr));
    assert_eq!(json_lines(&scored.stdout)[0]["reward"], 1.0);

    let tasks = wirl.run(&["tasks", "--plugin", "builtin:arithmetic", "--count", "2"]);
    assert_eq!(json_lines(&tasks.stdout).len(), 2);
    let unknown = wirl.command(&["score", "--plugin", "builtin:nope"]).output().unwrap();
    let said = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success() && said.contains("builtin:math-answer"), "{said}");

    // A plugin author without a checkout: a project of its own, built with cargo alone.
    let created = String::from_utf8(wirl.run(&["plugin", "new", "--lang", "rust", "my-reward"]).stdout).unwrap();
    assert!(created.contains("cargo build --release"), "{created}");
    let project = wirl.work.join("my-reward");
    let build = Command::new("cargo")
        .args(["build", "--release", "--quiet"])
        .current_dir(&project)
        // Kept between test runs on this machine (a fresh one builds in about half a minute).
        .env("CARGO_TARGET_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("standalone-plugin"))
        .env_remove("RUSTFLAGS")
        .output()
        .unwrap();
    assert!(build.status.success(), "{}", String::from_utf8_lossy(&build.stderr));
    let wasm = Path::new(env!("CARGO_TARGET_TMPDIR")).join("standalone-plugin/wasm32-wasip2/release/my_reward.wasm");
    let output = wirl.run(&["score", "--plugin", wasm.to_str().unwrap(), "--input", "my-reward/example.jsonl"]);
    let rewards: Vec<f64> = json_lines(&output.stdout).iter().map(|v| v["reward"].as_f64().unwrap()).collect();
    assert_eq!(rewards, [1.0, 0.0, 1.0]);

    // Nothing was written beside the binary; caches went to the fresh HOME.
    let installed: Vec<_> = std::fs::read_dir(&wirl.bin).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(installed, ["wirl"]);
    assert!(wirl.home.join(".cache/wirl/components").is_dir(), "compiled components cached under HOME");
}
