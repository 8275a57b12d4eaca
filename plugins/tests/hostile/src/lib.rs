//! A reward plugin that misbehaves on request, for the sandbox's tests: the completion
//! names the misbehaviour. Anything else is echoed (reward = its length, note = itself), so a
//! test can check that the call after a misbehaving one works.
//!
//! With config `trap_odd_tasks = true` it traps whenever the task id ends in an odd number
//! (the trainer's test: a reward plugin that fails every other call); with
//! `nan_odd_tasks = true` it scores those NaN instead; with `trap_always = true` it traps on
//! every call (the hot-swap tests' plugin that must be rolled back); with `sleep_ms = N`
//! every call first sleeps N ms (blocked in the host, on a clock pollable).

use std::hint::black_box;
use wirl_sdk::reward::{Reward, Score, Task};

struct Hostile;

static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Whether the config switch `key` is on and the task's index is odd.
fn odd_task_with(key: &str, task: &Task) -> bool {
    let enabled: bool = wirl_sdk::reward::config::get_or(key, false).unwrap_or(false);
    let index = task.id.rsplit(['/', '-', '_']).next().and_then(|n| n.parse::<u64>().ok());
    enabled && index.is_some_and(|i| i % 2 == 1)
}

/// Whether this call must trap (`trap_odd_tasks`), after the configured sleep.
fn trap_for(task: &Task) -> bool {
    let sleep_ms: u64 = wirl_sdk::reward::config::get_or("sleep_ms", 0).unwrap_or(0);
    if sleep_ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(sleep_ms));
    }
    let always: bool = wirl_sdk::reward::config::get_or("trap_always", false).unwrap_or(false);
    always || odd_task_with("trap_odd_tasks", task)
}

impl Reward for Hostile {
    fn score_group(task: Task, completions: Vec<String>) -> Vec<Result<Score, String>> {
        if trap_for(&task) {
            std::process::abort();
        }
        if odd_task_with("nan_odd_tasks", &task) {
            return completions.iter().map(|_| Ok(Score::new(f32::NAN))).collect();
        }
        completions.into_iter().map(|c| Self::score_one(&task, c)).collect()
    }

    fn score(task: Task, completion: String) -> Result<Score, String> {
        if trap_for(&task) {
            std::process::abort();
        }
        Self::score_one(&task, completion)
    }
}

impl Hostile {
    fn score_one(_task: &Task, completion: String) -> Result<Score, String> {
        match completion.as_str() {
            "loop" => loop {
                black_box(());
            },
            "memory-bomb" => {
                let mut hoard: Vec<Vec<u8>> = Vec::new();
                loop {
                    hoard.push(black_box(vec![1u8; 1 << 20]));
                }
            }
            "stack-overflow" => Ok(Score::new(recurse_natively(black_box(1)) as f32)),
            "shadow-stack-overflow" => Ok(Score::new(recurse_in_memory(black_box(1)) as f32)),
            "huge-output" => Ok(Score::new(0.0).note("x".repeat(100 << 20))),
            "panic" => panic!("the hostile plugin panics on purpose"),
            "unreachable" => std::process::abort(),
            "print-forever" => loop {
                println!("spam spam spam spam spam spam spam spam spam spam spam spam");
            },
            "print-some" => {
                println!("hello from the guest");
                eprintln!("a warning from the guest");
                Ok(Score::new(1.0))
            }
            "read-passwd" => match std::fs::read_to_string("/etc/passwd") {
                Ok(text) => Ok(Score::new(1.0).note(text)),
                Err(e) => Err(format!("cannot read /etc/passwd: {e}")),
            },
            "list-root" => match std::fs::read_dir("/") {
                Ok(entries) => Ok(Score::new(entries.count() as f32)),
                Err(e) => Err(format!("cannot list /: {e}")),
            },
            "env" => {
                let vars: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
                Ok(Score::new(vars.len() as f32).note(vars.join(",")))
            }
            "socket" => match std::net::TcpStream::connect("127.0.0.1:22") {
                Ok(_) => Ok(Score::new(1.0).note("connected")),
                Err(e) => Err(format!("cannot connect: {e}")),
            },
            "read-data" => match std::fs::read_to_string("/data/hello.txt") {
                Ok(text) => Ok(Score::new(1.0).note(text)),
                Err(e) => Err(format!("cannot read /data/hello.txt: {e}")),
            },
            "write-data" => match std::fs::write("/data/written.txt", "tampered") {
                Ok(()) => Ok(Score::new(1.0).note("wrote /data/written.txt")),
                Err(e) => Err(format!("cannot write /data/written.txt: {e}")),
            },
            "count" => {
                // State left in the instance: a fresh instance per call always says 1.
                let calls = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                Ok(Score::new(calls as f32))
            }
            "guest-error" => Err("the completion is unscorable, says the guest".into()),
            // Non-finite and extreme numbers, as a buggy reward might return them.
            "nan" => Ok(Score::new(f32::NAN)),
            "inf" => Ok(Score::new(f32::INFINITY)),
            "neg-inf" => Ok(Score::new(f32::NEG_INFINITY)),
            "nan-part" => Ok(Score::new(1.0).part("broken", f32::NAN)),
            "huge" => Ok(Score::new(1e30)),
            "carriage-return" => Ok(Score::new(1.0).note("\rforged log line\x1b[2K")),
            other => match other.strip_prefix("sleep:").and_then(|ms| ms.parse::<u64>().ok()) {
                // Blocks in the host: std's sleep is a monotonic-clock pollable that WASI
                // waits on, outside guest code.
                Some(ms) => {
                    std::thread::sleep(std::time::Duration::from_millis(ms));
                    Ok(Score::new(ms as f32).note("slept"))
                }
                None => Ok(Score::new(other.len() as f32).note(other)),
            },
        }
    }
}

/// Frames of scalars only: they live on WebAssembly's own stack, which the host bounds.
/// (No `black_box` here: it takes an address, which would put the frame in linear memory;
/// the rotate keeps LLVM from turning the recursion into a loop.)
#[inline(never)]
fn recurse_natively(depth: u64) -> u64 {
    if depth == STOP.load(std::sync::atomic::Ordering::Relaxed) {
        0
    } else {
        recurse_natively(depth + 1).rotate_left(7) ^ depth
    }
}

static STOP: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// An array in every frame: it lives on the shadow stack in linear memory, below the data.
#[inline(never)]
fn recurse_in_memory(depth: u64) -> u64 {
    let buffer = black_box([depth; 64]);
    if buffer[0] == 0 { 0 } else { recurse_in_memory(depth + 1) + buffer[63] }
}

wirl_sdk::register_reward!(Hostile);
