//! The plugins that travel inside the `wirl` binary: the default job's environment
//! (`arithmetic`) and reward (`math-answer`), Math-Verify's judgement of math answers
//! (`math-verify`), the stdin/stdout judging of code tasks (`code-tests`, a grader that
//! runs programs in the code runner its config names) and an LLM judge (`judge`), compiled from `plugins/rust/` by this crate's
//! build script. A config or a command names one as `builtin:NAME` wherever it takes a
//! plugin file, so the default job, `wirl eval` and `wirl score` need no checkout.
//!
//! This crate knows which plugins are built in and turns a reference into a sandbox spec;
//! it does not know configs, runs or the command line.

use sha2::{Digest, Sha256};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use wirl_sandbox::PluginSpec;

/// How a plugin reference names a built-in: `builtin:math-answer`.
pub const PREFIX: &str = "builtin:";

/// One built-in plugin.
#[derive(Debug)]
pub struct Builtin {
    /// Its name after [`PREFIX`]: the package name in `plugins/rust/`.
    pub name: &'static str,
    /// What it is, in a few words.
    pub about: &'static str,
    /// Where its sources are in wirl's repository.
    pub source: &'static str,
    /// The component.
    pub bytes: &'static [u8],
}

impl Builtin {
    /// `builtin:NAME`, as a config names it.
    pub fn reference(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }

    /// The sha256 of the component, in hex: what rollouts and checkpoints record.
    pub fn sha256(&self) -> String {
        hex::encode(Sha256::digest(self.bytes))
    }

    /// A sandbox spec for it, default limits, named as its file would be (`math_answer`), so
    /// that metrics read the same whether the default job names the file or the built-in.
    pub fn spec(&self) -> PluginSpec {
        PluginSpec::from_bytes(&self.name.replace('-', "_"), &self.reference(), self.shared())
    }

    /// The bytes, shared by every spec made from it.
    fn shared(&self) -> Arc<[u8]> {
        static SHARED: OnceLock<Vec<Arc<[u8]>>> = OnceLock::new();
        let shared = SHARED.get_or_init(|| ALL.iter().map(|b| Arc::from(b.bytes)).collect());
        let index = ALL.iter().position(|b| b.name == self.name).expect("a built-in is in ALL");
        shared[index].clone()
    }
}

const ALL: [Builtin; 5] = [
    Builtin {
        name: "arithmetic",
        about: "environment: arithmetic problems (chain sums, mixed operations) with the peers' few-shot prompt",
        source: "plugins/rust/arithmetic",
        bytes: include_bytes!(concat!(env!("OUT_DIR"), "/arithmetic.wasm")),
    },
    Builtin {
        name: "math-answer",
        about: "reward: 1 when the completion's final number equals the task's answer",
        source: "plugins/rust/math-answer",
        bytes: include_bytes!(concat!(env!("OUT_DIR"), "/math_answer.wasm")),
    },
    Builtin {
        name: "math-verify",
        about: "reward: 1 when the completion's answer equals the task's as Math-Verify judges it (LaTeX, sets, intervals, equations, matrices)",
        source: "plugins/rust/math-verify",
        bytes: include_bytes!(concat!(env!("OUT_DIR"), "/math_verify.wasm")),
    },
    Builtin {
        name: "code-tests",
        about: "grader: 1 when the completion's program prints the expected output on every stdin/stdout test case (CodeContests, APPS, LiveCodeBench); needs a code runner",
        source: "plugins/rust/code-tests",
        bytes: include_bytes!(concat!(env!("OUT_DIR"), "/code_tests.wasm")),
    },
    Builtin {
        name: "judge",
        about: "reward (wirl:rl@0.2.0): an LLM judge — the model grades each completion (or ranks the group) from a prompt template, its verdict read by a rule from config",
        source: "plugins/rust/judge",
        bytes: include_bytes!(concat!(env!("OUT_DIR"), "/judge.wasm")),
    },
];

/// Every built-in plugin.
pub fn all() -> &'static [Builtin] {
    &ALL
}

/// The built-in a reference names, when it is one: `builtin:math-answer` (or `math_answer`).
/// `Ok(None)` for a file path; an error, listing the built-ins, for an unknown name.
pub fn lookup(reference: &Path) -> Result<Option<&'static Builtin>, UnknownBuiltin> {
    let Some(name) = reference.to_str().and_then(|r| r.strip_prefix(PREFIX)) else {
        return Ok(None);
    };
    let wanted = name.replace('_', "-");
    match ALL.iter().find(|b| b.name == wanted) {
        Some(builtin) => Ok(Some(builtin)),
        None => Err(UnknownBuiltin { name: name.to_string() }),
    }
}

/// A `builtin:NAME` reference to no built-in; its message lists the built-ins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownBuiltin {
    /// The name as written after `builtin:`.
    pub name: String,
}

impl std::fmt::Display for UnknownBuiltin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{PREFIX}{} is not a built-in plugin; the built-ins are {} (`wirl plugin list`)",
            self.name,
            ALL.iter().map(Builtin::reference).collect::<Vec<_>>().join(", ")
        )
    }
}

impl std::error::Error for UnknownBuiltin {}

/// Whether `reference` is written as a built-in (`builtin:…`), known or not.
pub fn is_builtin(reference: &Path) -> bool {
    reference.to_str().is_some_and(|r| r.starts_with(PREFIX))
}

/// The sandbox spec of a plugin reference: a built-in's bytes, or the file at the path.
/// An unknown built-in is an error naming the built-ins.
pub fn spec(reference: &Path) -> Result<PluginSpec, UnknownBuiltin> {
    Ok(match lookup(reference)? {
        Some(builtin) => builtin.spec(),
        None => PluginSpec::new(reference),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_resolve_to_builtins_or_files() {
        assert_eq!(lookup(Path::new("builtin:math-answer")).unwrap().unwrap().name, "math-answer");
        assert_eq!(lookup(Path::new("builtin:math_answer")).unwrap().unwrap().name, "math-answer");
        assert!(lookup(Path::new("plugins/builtin:x.wasm")).unwrap().is_none());
        let error = lookup(Path::new("builtin:nope")).unwrap_err().to_string();
        assert!(error.contains("builtin:nope") && error.contains("builtin:arithmetic"), "{error}");
        let arithmetic = spec(Path::new("builtin:arithmetic")).unwrap();
        assert_eq!((arithmetic.name.as_str(), arithmetic.path.to_str().unwrap()), ("arithmetic", "builtin:arithmetic"));
        assert!(arithmetic.bytes.unwrap().starts_with(b"\0asm"));
        assert!(spec(Path::new("x.wasm")).unwrap().bytes.is_none());
    }
}
