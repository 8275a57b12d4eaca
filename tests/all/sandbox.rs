//! What a plugin can and cannot do, as obeyed/violated pairs; after every misbehaviour the
//! next call works.

use crate::{load, sandbox, sandbox_with, task};
use wirl_sandbox::{EnvironmentPlugin, Error, FailureKind, Limits, PluginSpec, RewardPlugin, SandboxSettings, World};
use wirl_test_artifacts::{ARITHMETIC, EXTRA_IMPORT, HOSTILE, MATH_ANSWER, WRONG_VERSION};

fn hostile_with(limits: Limits) -> (RewardPlugin, tempfile::TempDir) {
    let (sandbox, cache) = sandbox();
    let plugin = sandbox.load(PluginSpec { limits, ..PluginSpec::new(HOSTILE) }).unwrap();
    (RewardPlugin::new(plugin).unwrap(), cache)
}

/// Score `completion`, expect failure `kind`, then check the next call works.
fn fails_then_recovers(reward: &mut RewardPlugin, completion: &str, kind: FailureKind) -> String {
    let failure = reward.score(&task("t", None), completion).expect_err(completion);
    assert_eq!(failure.kind, kind, "{completion}: {failure}");
    let next = reward.score(&task("t", None), "fine").expect("the call after a failure works");
    assert_eq!(next.reward, 4.0);
    failure.message
}

#[test]
fn deadline_obeyed() {
    let (mut reward, _cache) = hostile_with(Limits { deadline_ms: 200, ..Limits::default() });
    assert_eq!(reward.score(&task("t", None), "quick").unwrap().reward, 5.0);
}

#[test]
fn deadline_violated() {
    let (mut reward, _cache) = hostile_with(Limits { deadline_ms: 200, ..Limits::default() });
    let message = fails_then_recovers(&mut reward, "loop", FailureKind::Deadline);
    assert!(message.contains("200 ms"), "{message}");
}

#[test]
fn fuel_violated() {
    let (sandbox, _cache) = sandbox_with(SandboxSettings { fuel: true, ..Default::default() });
    let limits = Limits { fuel: Some(5_000_000), deadline_ms: 10_000, ..Limits::default() };
    let plugin = sandbox.load(PluginSpec { limits, ..PluginSpec::new(HOSTILE) }).unwrap();
    let mut reward = RewardPlugin::new(plugin).unwrap();
    fails_then_recovers(&mut reward, "loop", FailureKind::Fuel);
}

#[test]
fn memory_obeyed() {
    // Building a 100 MB note fits under a 512 MiB cap (and is then refused for its size).
    let (mut reward, _cache) = hostile_with(Limits { memory_bytes: 512 << 20, ..Limits::default() });
    fails_then_recovers(&mut reward, "huge-output", FailureKind::OutputTooLarge);
}

#[test]
fn memory_violated() {
    let (mut reward, _cache) = hostile_with(Limits::default());
    let message = fails_then_recovers(&mut reward, "memory-bomb", FailureKind::Memory);
    assert!(message.contains("64 MiB"), "{message}");
    fails_then_recovers(&mut reward, "huge-output", FailureKind::Memory);
}

#[test]
fn return_size_obeyed() {
    let (mut reward, _cache) = hostile_with(Limits { max_return_bytes: 1 << 10, ..Limits::default() });
    assert_eq!(reward.score(&task("t", None), &"a".repeat(900)).unwrap().reward, 900.0);
}

#[test]
fn return_size_violated() {
    let (mut reward, _cache) = hostile_with(Limits { max_return_bytes: 1 << 10, ..Limits::default() });
    let message = fails_then_recovers(&mut reward, &"a".repeat(2000), FailureKind::OutputTooLarge);
    assert!(message.contains("1024"), "{message}");
}

#[test]
fn stack_overflow_is_named() {
    let (mut reward, _cache) = hostile_with(Limits::default());
    fails_then_recovers(&mut reward, "stack-overflow", FailureKind::StackOverflow);
    let message = fails_then_recovers(&mut reward, "shadow-stack-overflow", FailureKind::Trap);
    assert!(message.contains("out of bounds"), "{message}");
}

#[test]
fn panics_and_unreachable_trap_with_the_guest_message() {
    let (mut reward, _cache) = hostile_with(Limits::default());
    let message = fails_then_recovers(&mut reward, "panic", FailureKind::Trap);
    assert!(message.contains("panics on purpose"), "the panic message reaches the verdict: {message}");
    fails_then_recovers(&mut reward, "unreachable", FailureKind::Trap);
}

#[test]
fn print_limit_obeyed() {
    let (mut reward, _cache) = hostile_with(Limits::default());
    assert_eq!(reward.score(&task("t", None), "print-some").unwrap().reward, 1.0);
}

#[test]
fn print_limit_violated() {
    let (mut reward, _cache) = hostile_with(Limits::default());
    fails_then_recovers(&mut reward, "print-forever", FailureKind::PrintLimit);
}

#[test]
fn no_files_environment_or_sockets() {
    let (mut reward, _cache) = hostile_with(Limits::default());
    for completion in ["read-passwd", "list-root", "read-data", "socket"] {
        let message = fails_then_recovers(&mut reward, completion, FailureKind::GuestError);
        assert!(message.starts_with("cannot"), "{completion}: {message}");
    }
    let env = reward.score(&task("t", None), "env").unwrap();
    assert_eq!((env.reward, env.note.as_deref()), (0.0, Some("")), "no environment variables are inherited");
}

#[test]
fn read_only_dir_granted() {
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("hello.txt"), "hello, plugin").unwrap();
    let mut spec = PluginSpec::new(HOSTILE);
    spec.grants.read_only_dir = Some(data.path().to_path_buf());
    let (sandbox, _cache) = sandbox();
    let mut reward = RewardPlugin::new(sandbox.load(spec).unwrap()).unwrap();
    let read = reward.score(&task("t", None), "read-data").unwrap();
    assert_eq!(read.note.as_deref(), Some("hello, plugin"));
    let write = reward.score(&task("t", None), "write-data").unwrap_err();
    assert_eq!(write.kind, FailureKind::GuestError, "{write}");
    assert!(!data.path().join("written.txt").exists(), "a read-only grant is never written");
    // Outside the grant, the host's files stay invisible.
    assert_eq!(reward.score(&task("t", None), "read-passwd").unwrap_err().kind, FailureKind::GuestError);
}

#[test]
fn fresh_instance_per_call_by_default() {
    let (mut fresh, _cache) = hostile_with(Limits::default());
    let counts: Vec<f32> = (0..3).map(|_| fresh.score(&task("t", None), "count").unwrap().reward).collect();
    assert_eq!(counts, [1.0, 1.0, 1.0], "no state survives between calls");
    let (mut reused, _cache) = hostile_with(Limits { reuse_instance: true, ..Limits::default() });
    let counts: Vec<f32> = (0..3).map(|_| reused.score(&task("t", None), "count").unwrap().reward).collect();
    assert_eq!(counts, [1.0, 2.0, 3.0], "an opted-in instance is kept");
    // A trap discards the kept instance.
    reused.score(&task("t", None), "panic").unwrap_err();
    assert_eq!(reused.score(&task("t", None), "count").unwrap().reward, 1.0);
}

#[test]
fn group_scoring_matches_single_and_fails_as_a_whole() {
    let (mut reward, _cache) = hostile_with(Limits { deadline_ms: 200, ..Limits::default() });
    let completions: Vec<String> = ["a", "bb", "guest-error"].map(String::from).to_vec();
    let group = reward.score_group(&task("t", None), &completions);
    assert_eq!(group[0].as_ref().unwrap().reward, 1.0);
    assert_eq!(group[1].as_ref().unwrap().reward, 2.0);
    assert_eq!(group[2].as_ref().unwrap_err().kind, FailureKind::GuestError);
    let group = reward.score_group(&task("t", None), &["a".to_string(), "loop".to_string()]);
    assert!(group.iter().all(|v| v.as_ref().unwrap_err().kind == FailureKind::Deadline));
}

#[test]
fn files_that_are_not_components_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<u8>, &str); 4] = [
        ("empty.wasm", Vec::new(), "the file is empty"),
        (
            "random.wasm",
            (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect(),
            "not a WebAssembly file",
        ),
        ("core.wasm", b"\0asm\x01\0\0\0".to_vec(), "core WebAssembly module"),
        ("truncated.wasm", b"\0asm\x0d\0\x01\0\x07".to_vec(), "not a valid component"),
    ];
    let (sandbox, _cache) = sandbox();
    for (name, bytes, reason) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let error = sandbox.load(PluginSpec::new(&path)).unwrap_err();
        let text = error.to_string();
        assert!(matches!(error, Error::Refused { .. }), "{text}");
        assert!(text.contains(name) && text.contains(reason), "{name}: {text}");
    }
    let missing = sandbox.load(PluginSpec::new(dir.path().join("missing.wasm"))).unwrap_err();
    assert!(matches!(missing, Error::Read { .. }) && missing.to_string().contains("missing.wasm"));
}

#[test]
fn components_of_another_world_version_or_with_foreign_imports_are_refused() {
    let (sandbox, _cache) = sandbox();
    let environment = load(&sandbox, ARITHMETIC);
    assert_eq!(environment.world(), World::EnvironmentPlugin);
    let error = RewardPlugin::new(environment).err().unwrap().to_string();
    assert!(error.contains("environment-plugin") && error.contains("reward-plugin"), "{error}");
    let error = EnvironmentPlugin::new(load(&sandbox, MATH_ANSWER)).err().unwrap().to_string();
    assert!(error.contains("implements the reward-plugin world"), "{error}");

    let error = sandbox.load(PluginSpec::new(WRONG_VERSION)).unwrap_err().to_string();
    assert!(error.contains("wirl:rl@2.0.0") && error.contains("wrong_version.wasm"), "{error}");
    let error = sandbox.load(PluginSpec::new(EXTRA_IMPORT)).unwrap_err().to_string();
    assert!(error.contains("test:extra-import/vault") && error.contains("does not provide"), "{error}");
}

#[test]
fn plugins_are_known_by_the_sha256_of_their_bytes() {
    use sha2::Digest;
    let (sandbox, _cache) = sandbox();
    let plugin = load(&sandbox, MATH_ANSWER);
    let expected = hex::encode(sha2::Sha256::digest(std::fs::read(MATH_ANSWER).unwrap()));
    assert_eq!(plugin.sha256(), expected);
    assert_eq!(plugin.wit_version(), "0.1.0");
    assert!(plugin.imports().iter().any(|name| name.starts_with("wirl:rl/config")));
}

#[test]
fn compiled_components_are_cached_and_a_corrupt_entry_is_rebuilt() {
    let (sandbox, cache) = sandbox();
    load(&sandbox, MATH_ANSWER);
    let entries: Vec<_> = std::fs::read_dir(cache.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(entries.len(), 1, "{entries:?}");
    std::fs::write(&entries[0], b"garbage").unwrap();
    let mut reward = RewardPlugin::new(load(&sandbox, MATH_ANSWER)).unwrap();
    assert_eq!(reward.score(&task("t", Some("4")), "<answer>4</answer>").unwrap().reward, 1.0);
    assert!(std::fs::read(&entries[0]).unwrap().len() > 1000, "the entry was rewritten");
}

#[test]
fn threads_compiling_one_component_at_once_share_the_cache_safely() {
    // Several sandboxes on one cache directory, all missing the entry at the same moment,
    // each compile and write it; every one must come back with a working plugin (a shared
    // temporary name once let one thread map a file another was still truncating).
    for _round in 0..3 {
        let cache = tempfile::tempdir().unwrap();
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    let settings =
                        SandboxSettings { cache_dir: Some(cache.path().to_path_buf()), ..Default::default() };
                    let sandbox = wirl_sandbox::Sandbox::new(settings).unwrap();
                    barrier.wait();
                    let mut reward = RewardPlugin::new(load(&sandbox, MATH_ANSWER)).unwrap();
                    assert_eq!(reward.score(&task("t", Some("4")), "<answer>4</answer>").unwrap().reward, 1.0);
                });
            }
        });
        let names: Vec<_> = std::fs::read_dir(cache.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names.len(), 1, "one entry and no temporary files left: {names:?}");
    }
}

#[test]
fn memory_limit_above_the_sandbox_maximum_is_a_config_error() {
    let (sandbox, _cache) = sandbox();
    let limits = Limits { memory_bytes: 64 << 30, ..Limits::default() };
    let error = sandbox.load(PluginSpec { limits, ..PluginSpec::new(MATH_ANSWER) }).unwrap_err().to_string();
    assert!(error.contains("limits.memory_bytes") && error.contains("math_answer"), "{error}");
}

/// Time spent in one call of `completion`, and its verdict.
fn timed_score(reward: &mut RewardPlugin, completion: &str) -> (std::time::Duration, Result<f32, FailureKind>) {
    let started = std::time::Instant::now();
    let verdict = reward.score(&task("t", None), completion).map(|s| s.reward).map_err(|f| f.kind);
    (started.elapsed(), verdict)
}

#[test]
fn deadline_obeyed_while_blocked_in_the_host() {
    // A sleep is a clock pollable that the host waits on: shorter than the limit, it ends.
    let (mut reward, _cache) = hostile_with(Limits { deadline_ms: 1_000, ..Limits::default() });
    let (took, verdict) = timed_score(&mut reward, "sleep:200");
    assert_eq!(verdict, Ok(200.0));
    assert!(took >= std::time::Duration::from_millis(200), "{took:?}");
}

#[test]
fn deadline_violated_while_blocked_in_the_host() {
    // Longer than the limit, the sleep is cut at the deadline, not at its own end.
    let (mut reward, _cache) = hostile_with(Limits { deadline_ms: 300, ..Limits::default() });
    let (took, verdict) = timed_score(&mut reward, "sleep:5000");
    assert_eq!(verdict, Err(FailureKind::Deadline));
    // Cut at the deadline, long before the sleep's own end (bounds loose for busy machines).
    let ms = took.as_millis();
    assert!((300..2_500).contains(&ms), "cut after {ms} ms, the deadline is 300 ms, the sleep 5000 ms");
    assert_eq!(timed_score(&mut reward, "fine").1, Ok(4.0), "the next call works");
}

#[test]
fn a_huge_deadline_neither_overflows_nor_cuts() {
    let (mut reward, _cache) = hostile_with(Limits { deadline_ms: u64::MAX, ..Limits::default() });
    assert_eq!(timed_score(&mut reward, "sleep:10").1, Ok(10.0));
}

#[test]
fn an_interrupt_cuts_calls_blocked_or_running_within_a_second() {
    let (sandbox, _cache) = sandbox();
    let limits = Limits { deadline_ms: 60_000, ..Limits::default() };
    let plugin = sandbox.load(PluginSpec { limits, ..PluginSpec::new(HOSTILE) }).unwrap();
    let interrupter = sandbox.interrupter();
    for completion in ["sleep:60000", "loop"] {
        let mut reward = RewardPlugin::new(plugin.clone()).unwrap();
        let trigger = interrupter.clone();
        let timer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            trigger.interrupt();
        });
        let (took, verdict) = timed_score(&mut reward, completion);
        timer.join().unwrap();
        assert_eq!(verdict, Err(FailureKind::Interrupted), "{completion}");
        // The call would last a minute: ending within seconds is the interrupt's doing.
        assert!(took < std::time::Duration::from_secs(10), "{completion}: interrupted after {took:?}");
        // While interrupted, calls fail at once; cleared, they work again.
        assert_eq!(timed_score(&mut reward, "fine").1, Err(FailureKind::Interrupted));
        interrupter.clear();
        assert_eq!(timed_score(&mut reward, "fine").1, Ok(4.0));
    }
}

#[test]
fn non_finite_rewards_and_parts_are_named_failures() {
    let (mut reward, _cache) = hostile_with(Limits::default());
    for completion in ["nan", "inf", "neg-inf", "nan-part"] {
        let message = fails_then_recovers(&mut reward, completion, FailureKind::NonFinite);
        assert!(message.contains("NaN") || message.contains("inf"), "{completion}: {message}");
    }
    // In a group, only the non-finite completion fails.
    let group = ["nan".to_string(), "fine".to_string()];
    let verdicts = reward.score_group(&task("t", None), &group);
    assert_eq!(verdicts[0].as_ref().unwrap_err().kind, FailureKind::NonFinite);
    assert_eq!(verdicts[1].as_ref().unwrap().reward, 4.0);
    // Large but finite is a number like any other.
    assert_eq!(reward.score(&task("t", None), "huge").unwrap().reward, 1e30);
}

#[test]
fn a_cache_entry_with_damaged_machine_code_is_verified_and_rebuilt() {
    // Its header intact, bytes in the middle of the code flipped: mapped and run as it was,
    // such an entry crashed the host.
    let (sandbox, cache) = sandbox();
    load(&sandbox, HOSTILE);
    let entries: Vec<_> = std::fs::read_dir(cache.path()).unwrap().map(|e| e.unwrap().path()).collect();
    let mut entry = std::fs::read(&entries[0]).unwrap();
    let middle = entry.len() / 2;
    for byte in &mut entry[middle..middle + 4096] {
        *byte ^= 0xA5;
    }
    std::fs::write(&entries[0], &entry).unwrap();
    let mut reward = RewardPlugin::new(load(&sandbox, HOSTILE)).unwrap();
    assert_eq!(reward.score(&task("t", None), "fine").unwrap().reward, 4.0);
    assert_ne!(std::fs::read(&entries[0]).unwrap(), entry, "the entry was rewritten");
}

#[test]
fn devices_fifos_directories_and_huge_files_are_refused_before_reading() {
    let (sandbox, _cache) = sandbox();
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("fifo.wasm");
    let path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a plain mkfifo on a path in our own temporary directory.
    assert_eq!(unsafe { libc::mkfifo(path.as_ptr(), 0o600) }, 0);
    let sparse = dir.path().join("sparse.wasm");
    let file = std::fs::File::create(&sparse).unwrap();
    file.set_len(2 << 30).unwrap();
    let cases = [
        ("/dev/zero".into(), "not a regular file"),
        (fifo, "not a regular file"),
        (dir.path().to_path_buf(), "a directory"),
        (sparse, "more than the largest plugin"),
    ];
    for (path, expected) in cases {
        let started = std::time::Instant::now();
        let error = sandbox.load(PluginSpec::new(&path)).unwrap_err().to_string();
        assert!(error.contains(expected) && error.contains(path.to_str().unwrap()), "{error}");
        // Read, /dev/zero never ends and the sparse file is 2 GB: refused before reading.
        assert!(started.elapsed() < std::time::Duration::from_secs(10), "{path:?} took {:?}", started.elapsed());
    }
}
