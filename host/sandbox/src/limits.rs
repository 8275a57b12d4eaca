//! Every sandbox default, in one place, each with the reason it has this value.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// The longest per-call deadline a plugin may be given, in milliseconds: an hour is far past
/// any reward, grader or episode step, and keeps a typo (or 2^64 - 1) from meaning "never".
pub const MAX_DEADLINE_MS: u64 = 3_600_000;

/// Per-call limits of one plugin. Set per plugin in the wirl config; these are the defaults.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Wall-clock time one call may take, in milliseconds.
    pub deadline_ms: u64,
    /// Linear memory (and table) bytes one instance may grow to.
    pub memory_bytes: u64,
    /// Deterministic instruction budget per call; none for no fuel limit.
    pub fuel: Option<u64>,
    /// Most bytes a call may return (strings and lists in its result, summed).
    pub max_return_bytes: u64,
    /// Most bytes the guest may print to stdout and to stderr each per call.
    pub max_print_bytes: u64,
    /// Keep one instance across calls instead of a fresh one per call.
    pub reuse_instance: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            // Scoring a completion takes microseconds; a second catches a hung plugin quickly
            // without failing a legitimately slow grader (raise it per plugin for those).
            deadline_ms: 1_000,
            // Reward code needs little memory; 64 MiB stops a memory bomb long before it
            // hurts the trainer that shares this process.
            memory_bytes: 64 << 20,
            // Off: epoch interruption enforces time at ~10% of guest speed, fuel costs about
            // twice that. Turn fuel on where a budget must be deterministic across machines.
            fuel: None,
            // A score is a number, a few named parts and a note: 1 MiB is generous and keeps
            // a hostile plugin from flooding logs and rollout files.
            max_return_bytes: 1 << 20,
            // Enough for a debugging session's prints, little enough that printing without
            // end fails fast instead of filling memory.
            max_print_bytes: 64 << 10,
            // A fresh instance per call, so one completion cannot influence the grading of
            // another through state left in the instance. Reuse is opt-in, for speed.
            reuse_instance: false,
        }
    }
}

impl Limits {
    /// Defaults for a code runner: the most one untrusted program may use (a grader asks
    /// for less per program, never more).
    pub fn code_runner() -> Self {
        Limits {
            // A test suite of a programming exercise runs in milliseconds; ten seconds is
            // room for a slow correct solution, and the bound on a looping one.
            deadline_ms: 10_000,
            // An interpreter's heap plus the program's data: CPython starts at ~20 MiB.
            memory_bytes: 512 << 20,
            fuel: None,
            max_return_bytes: 1 << 20,
            // A test's output is short; a program printing without end stops at 1 MiB.
            max_print_bytes: 1 << 20,
            reuse_instance: false,
        }
    }

    pub fn deadline(&self) -> Duration {
        Duration::from_millis(self.deadline_ms)
    }
}

/// Capabilities granted to one plugin. Everything is denied unless granted here.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Grants {
    /// A host directory the plugin may read (never write), seen by it as `/data`.
    pub read_only_dir: Option<PathBuf>,
}

/// Engine-wide settings. Precompiled components are keyed by these, because compiled code
/// only loads into an engine configured the same way.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
pub struct SandboxSettings {
    /// Compile fuel checks into guest code, so that per-plugin `fuel` limits work.
    pub fuel: bool,
    /// Where compiled components are cached; none to compile on every load.
    pub cache_dir: Option<PathBuf>,
    /// Instances that may be alive at once across all plugins (the pooling allocator's
    /// slots).
    pub max_instances: u32,
    /// The largest `memory_bytes` any plugin may ask for (each pool slot reserves this much
    /// address space, not memory).
    pub max_memory_bytes: u64,
    /// How often the epoch ticker advances, in milliseconds: the resolution of deadlines.
    pub epoch_tick_ms: u64,
}

/// The most memory any plugin instance may have, in MiB: the limit's one home (the sandbox's
/// default `max_memory_bytes`, configs' `memory_mib`, the code service's per-program bound).
pub const MAX_MEMORY_MIB: u64 = 4096;

impl Default for SandboxSettings {
    fn default() -> Self {
        SandboxSettings {
            // Off by default: it costs guest speed on every call of every plugin.
            fuel: false,
            // Compiling a component takes from milliseconds (Rust reward) to minutes (CPython
            // in a debug build); caching makes the second start instant.
            cache_dir: default_cache_dir(),
            // Enough for a trainer's concurrent reward calls and episodes; each slot only
            // reserves address space.
            max_instances: 256,
            // Model-written Python needs room; per-plugin limits stay far lower by default.
            max_memory_bytes: MAX_MEMORY_MIB << 20,
            // 1 ms resolution costs one atomic increment per millisecond.
            epoch_tick_ms: 1,
        }
    }
}

/// `$WIRL_CACHE_DIR/components`, else the user's cache directory.
pub fn default_cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("WIRL_CACHE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => dirs::cache_dir()?.join("wirl"),
    };
    Some(base.join("components"))
}
