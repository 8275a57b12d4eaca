//! The `grader-plugin` world: a reward that runs untrusted code. The host wires
//! [`run`] to a separate code-runner sandbox (a fresh interpreter instance per program),
//! so a program can never reach the grader's memory or its verdict.
//!
//! A grader's component is a reward plugin's (the `reward` module's bindings and export)
//! plus this module's import of `wirl:rl/code-runner`; wit-component merges the two into the
//! `grader-plugin` world. (A second `generate!` of the whole grader world would define the
//! reward export's macros twice in a workspace that also builds reward plugins.)

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        inline: "package wirl:sdk-grader; world imports { import wirl:rl/code-runner@0.1.0; }",
        path: "../../wit",
        world: "wirl:sdk-grader/imports",
        generate_all,
        runtime_path: "::wirl_sdk::__wit_bindgen::rt",
    });
}

pub use crate::reward::{Score, Task, config};
pub use bindings::wirl::rl::code_runner::{Limits, Outcome, Program, Termination};

/// Run `program` in a fresh instance of the host's code runner, under `limits` (each
/// lowered to the runner's configured maximum; 0 asks for that maximum).
pub fn run(program: &Program, limits: Limits) -> Outcome {
    bindings::wirl::rl::code_runner::run(program, limits)
}

impl Program {
    /// A Python program reading `stdin`, with no arguments.
    pub fn python(source: impl Into<String>, stdin: impl Into<String>) -> Self {
        Program { language: "python".into(), source: source.into(), stdin: stdin.into(), args: Vec::new() }
    }
}

impl Limits {
    /// The runner's configured maximum for every limit.
    pub fn configured() -> Self {
        Limits { wall_ms: 0, memory_bytes: 0, fuel: None, max_output_bytes: 0 }
    }
}

/// A grader is a reward function with [`run`] at hand: implement it as a
/// [`Reward`](crate::reward::Reward).
pub use crate::reward::Reward as Grader;

/// Export `$ty` (which implements [`Grader`]) as this component's reward function.
#[macro_export]
macro_rules! register_grader {
    ($ty:ty) => {
        $crate::register_reward!($ty);
    };
}
