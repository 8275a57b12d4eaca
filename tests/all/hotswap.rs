//! Hot swap on a live `wirl train` (the tiny model, real plugins), driven as a user drives
//! it: `wirl ctl RUN_DIR pause | apply | resume | rollback | stop` over the run's socket.

use crate::engine::write_tiny_model;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use wirl_test_artifacts::{ARITHMETIC, EXACT_MATCH, HOSTILE, MATH_ANSWER};

/// A `wirl train` running in the background on the tiny model.
struct Live {
    dir: tempfile::TempDir,
    run_dir: PathBuf,
    child: Child,
}

/// Two tasks of the arithmetic environment sharing `reward.wasm` (a copy of math-answer).
fn tasks_toml(weights: (u32, u32), extra: &str) -> String {
    format!(
        r#"
[[tasks]]
name = "sums"
weight = {}
[tasks.environment]
plugin = {ARITHMETIC:?}
config = {{ shots = false }}

[[tasks]]
name = "more"
weight = {}
[tasks.environment]
plugin = {ARITHMETIC:?}
seed = 1
config = {{ shots = false }}
{extra}
[[rewards]]
plugin = "reward.wasm"
"#,
        weights.0, weights.1
    )
}

impl Live {
    fn start() -> Live {
        Self::start_with(&[])
    }

    fn start_with(flags: &[&str]) -> Live {
        Self::start_configured(flags, "")
    }

    /// With `sections` (TOML) added to the run's config.
    fn start_configured(flags: &[&str], sections: &str) -> Live {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("model");
        std::fs::create_dir_all(&model).unwrap();
        write_tiny_model(&model, false);
        std::fs::copy(MATH_ANSWER, dir.path().join("reward.wasm")).unwrap();
        let config = format!(
            r#"
[model]
path = {model:?}
{}
[sampling]
max_tokens = 4

[grpo]
steps = 400
prompts_per_step = 4
group_size = 2
learning_rate = 1e-3
beta = 0.0
seed = 1
checkpoint_every = 1
keep_checkpoints = 0

[swap]
rollback_window = 4

[eval]
tasks = 0
{sections}
"#,
            tasks_toml((1, 1), "")
        );
        std::fs::write(dir.path().join("train.toml"), config).unwrap();
        let run_dir = dir.path().join("run");
        let log = std::fs::File::create(dir.path().join("train.log")).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("train")
            .arg(dir.path().join("train.toml"))
            .arg("--run-dir")
            .arg(&run_dir)
            .args(flags)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let live = Live { dir, run_dir, child };
        live.wait_for("the control socket", || live.ctl(&["status", "--json"]).0);
        live
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.path("train.log")).unwrap_or_default()
    }

    /// `wirl ctl RUN_DIR ARGS…`: success, and what it said.
    fn ctl(&self, args: &[&str]) -> (bool, String) {
        let output = Command::new(env!("CARGO_BIN_EXE_wirl"))
            .arg("ctl")
            .arg(&self.run_dir)
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
        (output.status.success(), said)
    }

    fn status(&self) -> serde_json::Value {
        let (ok, said) = self.ctl(&["status", "--json"]);
        assert!(ok, "{said}");
        serde_json::from_str::<serde_json::Value>(&said).unwrap()["status"].clone()
    }

    fn wait_for(&self, what: &str, mut done: impl FnMut() -> bool) {
        let started = Instant::now();
        while !done() {
            assert!(started.elapsed() < Duration::from_secs(120), "waited 2 min for {what}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(30));
        }
    }

    /// Pause after at least `steps` steps and wait until the run is held between steps; the
    /// steps done.
    fn hold_after(&self, steps: u64) -> usize {
        self.wait_for("steps", || self.status()["step"].as_u64().unwrap() >= steps);
        let (ok, said) = self.ctl(&["pause"]);
        assert!(ok, "{said}");
        self.wait_for("the pause", || self.status()["held"] == true);
        self.status()["step"].as_u64().unwrap() as usize
    }

    /// Apply a task set file written next to the config.
    fn apply(&self, name: &str, text: &str, flags: &[&str]) -> (bool, String) {
        std::fs::write(self.path(name), text).unwrap();
        let mut args = vec!["apply", name];
        args.extend(flags);
        self.ctl(&args)
    }

    /// Resume, let `more` steps run, stop; the exit code.
    fn run_on_and_stop(mut self, more: usize) -> (Self, i32) {
        let from = self.status()["step"].as_u64().unwrap() as usize;
        assert!(self.ctl(&["resume"]).0);
        self.wait_for("more steps", || metrics(&self.run_dir).len() >= from + more);
        assert!(self.ctl(&["stop"]).0);
        let code = self.child.wait().unwrap().code().unwrap_or(-1);
        (self, code)
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn sha256_of(path: &str) -> String {
    hex::encode(Sha256::digest(std::fs::read(path).unwrap()))
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn metrics(run_dir: &Path) -> Vec<serde_json::Value> {
    lines(&run_dir.join("metrics.jsonl"))
}

/// The reward plugins' sha256 named by the rollouts of `step`.
fn shas_at(run_dir: &Path, step: u64) -> Vec<String> {
    let mut shas: Vec<String> = lines(&run_dir.join("rollouts.jsonl"))
        .iter()
        .filter(|r| r["step"] == step && r.get("plugins").is_some())
        .flat_map(|r| r["plugins"].as_array().unwrap().iter().map(|p| p["sha256"].as_str().unwrap().to_string()))
        .collect();
    shas.sort();
    shas.dedup();
    shas
}

/// A reward replaced and the weights changed at step k: rollouts before name the old
/// plugin's sha256, after it the new one's; group counts follow the weights from step k + 1;
/// the switch is an event with its duration.
#[test]
fn a_swapped_reward_and_new_weights_take_effect_at_the_next_step() {
    swap_takes_effect_at_the_next_step(&[]);
}

/// The same on two data-parallel ranks (`--dp 2`): pause, resume and stop act on both at one
/// step boundary, and the other rank switches to rank 0's new task set there too (every
/// step the ranks' plugins are checked against rank 0's: a rank left on the old reward
/// would stop the run).
#[test]
fn a_swap_takes_effect_on_every_rank_at_the_same_step() {
    swap_takes_effect_at_the_next_step(&["--dp", "2"]);
}

/// The same under the new objectives (issue 47): GSPO's sequence ratio with REINFORCE++'s
/// step-wide whitening, CISPO's clipped weights with the KL in the reward, and DAPO, whose
/// dynamic sampling draws again within a step (the tiny model's groups have no signal, so
/// every step makes all its draws: every one after the swap rolls the new plugin). A swap
/// changes the task set; the objective, set on the command line, goes on under it.
#[test]
fn a_swap_takes_effect_under_the_new_objectives() {
    let gspo = ["grpo.loss=gspo", "grpo.aggregation=sequence-mean", "grpo.advantage=reinforce++"];
    let cispo = ["grpo.loss=cispo", "grpo.clip_high=4", "grpo.beta=0.04", "grpo.kl_in_reward=true"];
    let dapo = ["grpo.preset=dapo"];
    for sets in [&gspo[..], &cispo[..], &dapo[..]] {
        let flags: Vec<&str> = sets.iter().flat_map(|set| ["--set", *set]).collect();
        swap_takes_effect_at_the_next_step(&flags);
    }
}

fn swap_takes_effect_at_the_next_step(flags: &[&str]) {
    let live = Live::start_with(flags);
    let k = live.hold_after(1);
    std::fs::copy(EXACT_MATCH, live.path("reward.wasm")).unwrap();
    let (ok, said) = live.apply("swap.toml", &tasks_toml((3, 1), ""), &["--dry-run"]);
    assert!(ok && said.contains("dry run: nothing changed") && said.contains("reward.wasm: replaced"), "{said}");
    assert_eq!(live.status()["manifest"]["generation"], 0, "a dry run changes nothing");
    let (ok, said) = live.apply("swap.toml", &tasks_toml((3, 1), ""), &[]);
    assert!(ok && said.contains("staged as generation 1"), "{said}");
    assert!(said.contains("task `sums`: weight 1 -> 3") && said.contains("rescore"), "{said}");
    let (live, code) = live.run_on_and_stop(3);
    assert_eq!(code, 130, "stopped as by Ctrl-C:\n{}", live.log());

    let (old, new) = (sha256_of(MATH_ANSWER), sha256_of(EXACT_MATCH));
    let steps = metrics(&live.run_dir);
    let draws = if flags.contains(&"grpo.preset=dapo") { 4 } else { 1 };
    assert!(steps.iter().all(|line| line["draws"] == draws), "{draws} draws a step expected: {steps:?}");
    for line in &steps {
        let step = line["step"].as_u64().unwrap();
        let shas = shas_at(&live.run_dir, step);
        let groups =
            (line["tasks"]["sums"]["groups"].as_u64().unwrap(), line["tasks"]["more"]["groups"].as_u64().unwrap());
        if step as usize <= k {
            assert!(shas.contains(&old) && !shas.contains(&new), "step {step}: {shas:?}");
            assert_eq!((groups, line["manifest_generation"].as_u64().unwrap()), ((2, 2), 0), "step {step}");
        } else {
            assert!(shas.contains(&new) && !shas.contains(&old), "step {step}: {shas:?}");
            assert_eq!((groups, line["manifest_generation"].as_u64().unwrap()), ((3, 1), 1), "step {step}");
        }
    }
    let events = lines(&live.run_dir.join("events.jsonl"));
    let applied = events.iter().find(|e| e["kind"] == "applied").expect("an applied event");
    assert_eq!((applied["step"].as_u64().unwrap() as usize, applied["generation"].as_u64()), (k, Some(1)));
    assert!(applied["switch_ms"].is_number(), "the switch is timed: {applied}");
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(live.run_dir.join("manifests/000001.json")).unwrap()).unwrap();
    assert_eq!(manifest["from_step"].as_u64().unwrap() as usize, k);
    assert!(live.run_dir.join(format!("plugins/{new}.wasm")).is_file(), "the new bytes are kept in the run");
}

/// Refused swaps name the file and the reason, are events, and leave the run going with the
/// plugins in force (whose bytes the run keeps, whatever happens to the file).
#[test]
fn refused_swaps_leave_training_running_with_the_old_plugins() {
    let live = Live::start();
    let k = live.hold_after(2);
    let cases = [
        ("not a component", "not-wasm.wasm", "is not a WebAssembly file"),
        ("the wrong world", "env-as-reward.wasm", "implements the environment-plugin world"),
        ("a new capability", "reward.wasm", "--allow-capabilities"),
    ];
    std::fs::write(live.path("not-wasm.wasm"), "plain text").unwrap();
    std::fs::copy(ARITHMETIC, live.path("env-as-reward.wasm")).unwrap();
    std::fs::copy(HOSTILE, live.path("reward.wasm")).unwrap();
    for (what, file, reason) in cases {
        let text = tasks_toml((1, 1), "").replace("plugin = \"reward.wasm\"", &format!("plugin = {file:?}"));
        let (ok, said) = live.apply("bad.toml", &text, &[]);
        assert!(!ok && said.contains(file) && said.contains(reason), "{what}: {said}");
    }
    // Allowed its imports, a reward that traps on every call fails re-scoring the last
    // steps' rollouts: refused with the report.
    let trapping = tasks_toml((1, 1), "")
        .replace("plugin = \"reward.wasm\"", "plugin = \"reward.wasm\"\nconfig = { trap_always = true }");
    let (ok, said) = live.apply("bad.toml", &trapping, &["--allow-capabilities"]);
    assert!(!ok && said.contains("validation failed") && said.contains("trap"), "{said}");
    assert!(said.contains("rescore") && said.contains("failure rate of the checks: 100.0%"), "{said}");
    assert_eq!(live.status()["manifest"]["generation"], 0);

    let (live, code) = live.run_on_and_stop(1);
    assert_eq!(code, 130, "{}", live.log());
    let old = sha256_of(MATH_ANSWER);
    assert_eq!(shas_at(&live.run_dir, k as u64 + 1).iter().filter(|s| **s == old).count(), 1);
    let refused: Vec<serde_json::Value> =
        lines(&live.run_dir.join("events.jsonl")).into_iter().filter(|e| e["kind"] == "refused").collect();
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert!(refused[3]["report"]["failure_rate"].as_f64().unwrap() > 0.99);
}

/// A new task whose reward traps on every call passes validation (it has no rollouts to
/// re-score) and is rolled back after its first trajectories; applying it again waits for
/// the back-off.
#[test]
fn a_plugin_that_traps_on_every_call_is_rolled_back_and_backs_off() {
    let live = Live::start();
    live.hold_after(1);
    std::fs::copy(HOSTILE, live.path("trap.wasm")).unwrap();
    let trap_task = format!(
        r#"
[[tasks]]
name = "trap"
weight = 1
[tasks.environment]
plugin = {ARITHMETIC:?}
seed = 2
config = {{ shots = false }}
[[tasks.rewards]]
plugin = "trap.wasm"
config = {{ trap_always = true }}
"#
    );
    let with_trap = tasks_toml((1, 1), &trap_task);
    let (ok, said) = live.apply("trap.toml", &with_trap, &[]);
    assert!(ok && said.contains("no recent rollouts of this task"), "{said}");
    assert!(live.ctl(&["resume"]).0);
    live.wait_for("the rollback", || {
        lines(&live.run_dir.join("events.jsonl")).iter().any(|e| e["kind"] == "rolled-back")
    });
    let rolled = lines(&live.run_dir.join("events.jsonl")).into_iter().find(|e| e["kind"] == "rolled-back").unwrap();
    let reason = rolled["reason"].as_str().unwrap();
    assert!(reason.starts_with("auto-rollback") && reason.contains("trap"), "{rolled}");
    assert!(rolled["switch_ms"].is_number(), "{rolled}");
    live.hold_after(0);
    let status = live.status();
    assert_eq!(status["manifest"]["generation"], 2, "{status}");
    assert_eq!(status["manifest"]["tasks"]["tasks"].as_array().unwrap().len(), 2, "the trap task is gone");
    let trap_sha = sha256_of(HOSTILE);
    assert!(status["backoff_s"][&trap_sha].as_f64().unwrap() > 30.0, "{status}");
    let (ok, said) = live.apply("trap.toml", &with_trap, &[]);
    assert!(!ok && said.contains("was rolled back 1 time(s); it may be applied again in"), "{said}");
    let (live, code) = live.run_on_and_stop(1);
    assert_eq!(code, 130, "{}", live.log());
}

/// A run killed with SIGKILL after a swap, resumed, goes on with the swapped bytes — kept in
/// its directory — although the file on disk changed again.
/// (A LoRA run on a bf16 base: hot swap, kill -9 and resume work as for every weight.)
#[test]
fn a_run_killed_after_a_swap_resumes_with_the_swapped_bytes() {
    let mut live = Live::start_configured(&[], "[lora]\nrank = 2\nalpha = 4\nbase_dtype = \"bf16\"\n");
    let k = live.hold_after(1);
    std::fs::copy(EXACT_MATCH, live.path("reward.wasm")).unwrap();
    let (ok, said) = live.apply("swap.toml", &tasks_toml((1, 1), ""), &[]);
    assert!(ok, "{said}");
    assert!(live.ctl(&["resume"]).0);
    let checkpoint = live.run_dir.join(format!("checkpoints/step-{:06}", k + 2));
    live.wait_for("two steps after the swap", || checkpoint.join("state.json").is_file());
    live.child.kill().unwrap(); // SIGKILL
    live.child.wait().unwrap();
    std::fs::copy(HOSTILE, live.path("reward.wasm")).unwrap();

    // The newest checkpoint the kill left, and two steps past it.
    let newest = (k + 2..)
        .take_while(|step| live.run_dir.join(format!("checkpoints/step-{step:06}/state.json")).is_file())
        .last()
        .unwrap();
    let resumed = Command::new(env!("CARGO_BIN_EXE_wirl"))
        .args(["train", "--resume"])
        .arg(&live.run_dir)
        .args(["--steps", &(newest + 2).to_string()])
        .output()
        .unwrap();
    assert!(resumed.status.success(), "{}", String::from_utf8_lossy(&resumed.stderr));
    assert!(!String::from_utf8_lossy(&resumed.stderr).contains("never switched in"), "it was switched in");
    let (swapped, rebuilt) = (sha256_of(EXACT_MATCH), sha256_of(HOSTILE));
    for step in k as u64 + 1..=newest as u64 + 2 {
        let shas = shas_at(&live.run_dir, step);
        assert!(shas.contains(&swapped) && !shas.contains(&rebuilt), "step {step}: {shas:?}");
    }
    assert_eq!(metrics(&live.run_dir).len(), newest + 2);
    let last = live.run_dir.join(format!("checkpoints/step-{:06}", newest + 2));
    assert!(last.join("adapter/adapter_config.json").is_file() && !last.join("model").exists());
}

/// A swap staged (the run paused) and the run killed before its next step boundary: the
/// swap was answered "staged" but never switched in. The resume says so — generation 1 not
/// in force, apply it again — and records it as discarded; it goes on with the old plugin.
#[test]
fn a_swap_staged_when_the_run_is_killed_is_said_lost_on_resume() {
    // A held run switches a staged set in at its next look (every 20 ms): the kill has to
    // land before that. On a loaded machine it sometimes does not, and then there is no lost
    // swap to speak of; the scene is set again (the product's behaviour is not in question:
    // either the swap was applied, and a resume replays it, or it was lost, and is said).
    let (live, k) = (1..=5)
        .find_map(|_| {
            let mut live = Live::start();
            let k = live.hold_after(1);
            std::fs::copy(EXACT_MATCH, live.path("reward.wasm")).unwrap();
            let (ok, said) = live.apply("swap.toml", &tasks_toml((3, 1), ""), &[]);
            assert!(ok && said.contains("staged as generation 1"), "{said}");
            live.child.kill().unwrap(); // SIGKILL, still paused
            live.child.wait().unwrap();
            let events = lines(&live.run_dir.join("events.jsonl"));
            assert!(events.iter().any(|e| e["kind"] == "staged" && e["generation"] == 1), "{events:?}");
            let switched = events.iter().any(|e| e["kind"] == "applied" && e["generation"] == 1);
            (!switched).then_some((live, k))
        })
        .expect("in five tries the held run always switched the swap in before the kill");

    let resumed = crate::grpo::resume(&live.run_dir, k + 1);
    let said = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{said}");
    assert!(said.contains("generation 1 was staged before the run stopped, but never switched in"), "{said}");
    let events = lines(&live.run_dir.join("events.jsonl"));
    let discarded = events.iter().rfind(|e| e["kind"] == "discarded").expect("a discarded event");
    assert_eq!(discarded["generation"], 1);
    assert!(discarded["reason"].as_str().unwrap().contains("apply it again"), "{discarded}");
    let old = sha256_of(MATH_ANSWER);
    let shas = shas_at(&live.run_dir, k as u64 + 1);
    assert!(
        !shas.is_empty() && shas.iter().all(|sha| *sha != sha256_of(EXACT_MATCH)) && shas.contains(&old),
        "{shas:?}"
    );
    // Resumed again, nothing more is said: the lost generation was answered once. (A line
    // a kill cut short in events.jsonl does not stop a resume.)
    let mut events = std::fs::OpenOptions::new().append(true).open(live.run_dir.join("events.jsonl")).unwrap();
    std::io::Write::write_all(&mut events, br#"{"time": 17, "st"#).unwrap();
    let again = crate::grpo::resume(&live.run_dir, k + 2);
    let said = String::from_utf8_lossy(&again.stderr);
    assert!(again.status.success() && !said.contains("never switched in"), "{said}");
}

/// `wirl train --watch`: a rebuilt plugin file is checked and switched in by itself; a FIFO
/// put in its place first is refused by name and does not stop the watcher.
#[test]
fn watch_mode_swaps_in_a_rebuilt_plugin() {
    let live = Live::start_with(&["--watch"]);
    let k = live.hold_after(1);
    std::fs::remove_file(live.path("reward.wasm")).unwrap();
    let c_path = std::ffi::CString::new(live.path("reward.wasm").to_str().unwrap()).unwrap();
    // SAFETY: mkfifo(3) on a path in the test's own temporary directory.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    live.wait_for("the watcher's refusal of a FIFO", || {
        lines(&live.run_dir.join("events.jsonl"))
            .iter()
            .any(|e| e["kind"] == "refused" && e["reason"].as_str().is_some_and(|r| r.contains("not a regular file")))
    });
    std::fs::remove_file(live.path("reward.wasm")).unwrap();
    std::fs::copy(EXACT_MATCH, live.path("reward.wasm")).unwrap();
    live.wait_for("the watcher's swap", || {
        lines(&live.run_dir.join("events.jsonl")).iter().any(|e| e["kind"] == "applied" && e["reason"] == "watch")
    });
    assert_eq!(live.status()["manifest"]["generation"], 1);
    let (live, code) = live.run_on_and_stop(1);
    assert_eq!(code, 130, "{}", live.log());
    assert!(live.log().contains("watch:") && live.log().contains("reward.wasm"), "{}", live.log());
    assert!(shas_at(&live.run_dir, k as u64 + 1).contains(&sha256_of(EXACT_MATCH)));
}

/// The control socket is the owner's only, and bad requests get an answer naming what is
/// wrong while the run goes on: garbage, an unknown operation, a request that never ends,
/// one over the size limit, a client that goes away.
#[test]
fn the_control_socket_survives_bad_requests() {
    use std::io::{Read, Write};
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixStream;
    let live = Live::start();
    let socket = live.run_dir.join("control.sock");
    assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
    let ask = |bytes: &[u8]| {
        let mut stream = UnixStream::connect(&socket).unwrap();
        let _ = stream.write_all(bytes);
        let _ = stream.shutdown(std::net::Shutdown::Write);
        let mut reply = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            match stream.read(&mut buffer) {
                Ok(0) => break,
                Ok(n) => reply.extend_from_slice(&buffer[..n]),
                // The server reads at most its limit and closes with the rest of an oversize
                // request unread; Linux then resets the connection, after the reply it sent
                // (queued data is read first), so a reset once the reply is in ends it.
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset && !reply.is_empty() => break,
                Err(e) => panic!("reading the reply: {e}"),
            }
        }
        serde_json::from_slice::<serde_json::Value>(&reply).unwrap()
    };
    let cases: [(&[u8], &str); 4] = [
        (b"{not json\n", "not a control request"),
        (b"{\"op\": \"format-disk\"}\n", "unknown variant"),
        (b"{\"op\": \"status\"}", "not one line"),
        (&[b' '; 5 << 20], "not one line"),
    ];
    for (request, expected) in cases {
        let reply = ask(request);
        assert!(reply["ok"] == false && reply["message"].as_str().unwrap().contains(expected), "{reply}");
    }
    drop(UnixStream::connect(&socket).unwrap());
    let (ok, said) = live.ctl(&["apply", "missing.toml"]);
    assert!(!ok && said.contains("missing.toml"), "{said}");
    assert!(live.ctl(&["status"]).0, "the run still answers");
    let (live, code) = live.run_on_and_stop(1);
    assert_eq!(code, 130, "{}", live.log());
}

/// `wirl train --serve`: the policy's live weights behind the OpenAI routes, the run's
/// control over HTTP (the same operations as `wirl ctl`) and its figures at `/metrics`.
#[test]
fn a_training_serves_its_policy_and_its_control_over_http() {
    use crate::serve::http;
    let live = Live::start_with(&["--serve", "127.0.0.1:0"]);
    let mut address = String::new();
    live.wait_for("the server", || {
        let log = live.log();
        match log.split("serving the policy on http://").nth(1) {
            Some(rest) => {
                address = rest.split_whitespace().next().unwrap().to_string();
                true
            }
            None => false,
        }
    });
    let get = |path: &str| http(&address, "GET", path, &[], b"");
    let post = |path: &str, body: &str| http(&address, "POST", path, &[], body.as_bytes());
    let (status, _, body) = get("/v1/models");
    assert!(status == 200 && body.contains("policy"), "{body}");
    let (status, _, body) = post("/v1/completions", r#"{"prompt": [5, 9, 13], "max_tokens": 3}"#);
    assert_eq!(status, 200, "{body}");

    let (status, _, body) = post("/control/pause", "");
    assert_eq!(status, 200, "{body}");
    live.wait_for("the pause", || live.status()["held"] == true);
    let k = live.status()["step"].as_u64().unwrap();
    let tasks = serde_json::json!({"tasks": {
        "tasks": [
            {"name": "sums", "weight": 3, "environment": {"plugin": ARITHMETIC, "config": {"shots": false}}},
            {"name": "more", "weight": 1, "environment": {"plugin": ARITHMETIC, "seed": 1, "config": {"shots": false}}},
        ],
        "rewards": [{"plugin": live.path("reward.wasm")}],
    }});
    let (status, _, body) = post("/control/apply", &tasks.to_string());
    assert!(status == 200 && body.contains("task `sums`: weight 1 -> 3"), "{status}: {body}");
    let (status, _, body) = post("/control/apply", r#"{"tasks": 3}"#);
    assert!(status == 400 && body.contains("`tasks`"), "{status}: {body}");
    let (status, _, body) = get("/metrics");
    assert!(
        status == 200 && body.contains("wirl_train_paused 1") && body.contains(&format!("wirl_train_step {k}")),
        "{body}"
    );
    // Held at a boundary, the staged set is switched in within the boundary's next poll:
    // the status shows it staged or already in force, never neither.
    let (status, _, body) = get("/control/status");
    let in_force = serde_json::from_str::<serde_json::Value>(&body).is_ok_and(|s| s["manifest"]["generation"] == 1);
    assert!(status == 200 && (body.contains("\"staged\"") || in_force), "{body}");

    assert_eq!(post("/control/resume", "").0, 200);
    live.wait_for("the switch", || metrics(&live.run_dir).iter().any(|m| m["manifest_generation"] == 1));
    let (status, _, _) = post("/control/stop", "");
    assert_eq!(status, 200);
    let mut live = live;
    assert_eq!(live.child.wait().unwrap().code(), Some(130), "{}", live.log());
}

/// Five applies at once: exactly one is staged (and then takes effect), the others are
/// refused saying why; none is answered "staged" and lost. An apply once the run is stopping
/// says so, and is not blamed on the plugins.
#[test]
fn concurrent_applies_stage_one_and_refuse_the_rest() {
    let live = Live::start();
    live.hold_after(1);
    std::fs::copy(EXACT_MATCH, live.path("reward.wasm")).unwrap();
    for i in 0..5 {
        std::fs::write(live.path(&format!("swap{i}.toml")), tasks_toml((i + 2, 1), "")).unwrap();
    }
    let answers: Vec<(bool, String)> = std::thread::scope(|scope| {
        let live = &live;
        let calls: Vec<_> =
            (0..5).map(|i| scope.spawn(move || live.ctl(&["apply", &format!("swap{i}.toml")]))).collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    // While the run is held, a staged set is switched in within ~20 ms, so an apply that
    // arrives after that is checked and staged in turn: each "staged" names a generation of
    // its own, one after another, and every one takes effect (before, all five said
    // "staged as generation 3" and four vanished). How many are refused depends on timing.
    let mut generations: Vec<u64> = answers
        .iter()
        .filter(|(ok, _)| *ok)
        .map(|(_, said)| {
            let at = said.find("staged as generation ").unwrap_or_else(|| panic!("{said}"));
            let number = said[at + "staged as generation ".len()..].split(':').next().unwrap();
            number.parse().unwrap_or_else(|_| panic!("{said}"))
        })
        .collect();
    generations.sort_unstable();
    let staged = generations.len() as u64;
    assert!(staged >= 1 && generations == (1..=staged).collect::<Vec<_>>(), "{answers:#?}");
    for (ok, said) in &answers {
        assert!(
            *ok || said.contains("another apply is being checked")
                || said.contains("is staged and switches in")
                || said.contains("is being switched in"),
            "{said}"
        );
    }
    // Many control connections at once: every one is answered (a status, or busy), none
    // reset unanswered.
    let socket = live.run_dir.join("control.sock");
    let replies: Vec<String> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..100)
            .map(|_| {
                scope.spawn(|| {
                    use std::io::{BufRead, Write};
                    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
                    stream.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    // A busy answer may come (and the socket close) before this is sent.
                    let _ = stream.write_all(b"{\"op\": \"status\"}\n");
                    let mut line = String::new();
                    let _ = std::io::BufReader::new(stream).read_line(&mut line);
                    line
                })
            })
            .collect();
        calls.into_iter().map(|c| c.join().unwrap()).collect()
    });
    for reply in &replies {
        let reply: serde_json::Value = serde_json::from_str(reply).unwrap_or_else(|_| panic!("unanswered: {reply:?}"));
        assert!(reply["ok"] == true || reply["message"].as_str().unwrap().starts_with("busy"), "{reply}");
    }
    // What was staged takes effect at the boundary.
    assert!(live.ctl(&["resume"]).0);
    live.wait_for("the switch", || live.status()["manifest"]["generation"] == staged);
    // Stopping: an apply now is refused as the stop's, nothing staged.
    assert!(live.ctl(&["stop"]).0);
    let (ok, said) = live.apply("late.toml", &tasks_toml((9, 1), ""), &[]);
    // Refused by the stopping run, or the run is gone (its socket removed, or it ended
    // between accepting the connection and answering).
    let gone = said.contains("no training answers") || said.contains("without answering (it was ending)");
    assert!(!ok && (said.contains("stopping") || gone), "{said}");
    assert!(!said.contains("validation failed"), "{said}");
}

/// Kept plugin bytes that changed after the run kept them are never run on resume: the
/// resume is refused naming the file; so is a manifest rewritten (with bytes to match) to
/// name other bytes than the checkpoint was trained with.
#[test]
fn resume_refuses_tampered_plugin_bytes_and_manifests() {
    let mut live = Live::start();
    live.wait_for("a checkpoint", || live.run_dir.join("checkpoints/step-000001/state.json").is_file());
    assert!(live.ctl(&["stop"]).0);
    live.child.wait().unwrap();
    let kept = live.run_dir.join(format!("plugins/{}.wasm", sha256_of(MATH_ANSWER)));
    let original = std::fs::read(&kept).unwrap();
    std::fs::copy(HOSTILE, &kept).unwrap();
    let resume = || {
        Command::new(env!("CARGO_BIN_EXE_wirl"))
            .args(["train", "--resume"])
            .arg(&live.run_dir)
            .args(["--steps", "400"])
            .output()
            .unwrap()
    };
    let out = resume();
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{error}");
    assert!(
        error.contains(&kept.display().to_string()) && error.contains("changed after the run kept them"),
        "{error}"
    );

    // Bytes and manifest rewritten together: the bytes match their new name, but the
    // checkpoint was trained with others.
    std::fs::write(&kept, &original).unwrap();
    let hostile = sha256_of(HOSTILE);
    std::fs::copy(HOSTILE, live.run_dir.join(format!("plugins/{hostile}.wasm"))).unwrap();
    let manifest = live.run_dir.join("manifests/000000.json");
    let text = std::fs::read_to_string(&manifest).unwrap().replace(&sha256_of(MATH_ANSWER), &hostile);
    std::fs::write(&manifest, text).unwrap();
    let out = resume();
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{error}");
    assert!(error.contains("not those its checkpoint") && error.contains(&hostile), "{error}");
}
