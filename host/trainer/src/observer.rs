//! How the trainer reports what it does: events to an [`Observer`] (the CLI draws a status
//! line and prints a line per step; a server would publish them). The library itself
//! never prints; warnings go to `tracing`.

use crate::metrics::StepMetrics;
use std::path::Path;

/// What the trainer is doing or has done.
#[derive(Debug)]
pub enum Event<'a> {
    /// Loading model weights from `path`.
    Loading { path: &'a Path },
    /// Resuming a run from the checkpoint of `step`.
    Resuming { run_dir: &'a Path, step: usize },
    /// A phase of a step began (transient: the next event replaces it).
    Phase { step: usize, steps: usize, phase: Phase },
    /// A step finished; `eta_s` estimates the rest of the run.
    Step { metrics: &'a StepMetrics, steps: usize, eta_s: f64 },
    /// The held-out greedy pass rate over `problems` held-out problems (all tasks'), before
    /// or after training.
    HeldOut { after: bool, pass_rate: f32, problems: usize },
    /// A checkpoint was written.
    Checkpoint { dir: &'a Path },
    /// The task set changed at a step boundary: `kind` is `applied` or `rolled-back`.
    Swap { step: usize, kind: &'a str, generation: u64, changes: &'a [String], reason: Option<&'a str>, switch_ms: f64 },
    /// `wirl eval`: one held-out task judged.
    EvalTask { done: usize, total: usize, task: &'a str, greedy_passed: bool, samples: Option<(usize, usize)> },
}

/// What a step is busy with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Generating {
        prompts: usize,
        group_size: usize,
    },
    /// An agent task (its index in the config) producing its groups.
    Agent {
        task: usize,
    },
    /// Running multi-turn episodes of `groups` groups past their first turn.
    Episodes {
        groups: usize,
    },
    Scoring,
    /// Training on group `group` (0-based) of `groups`.
    Training {
        group: usize,
        groups: usize,
    },
}

/// Receives the trainer's events.
pub trait Observer {
    fn event(&mut self, event: Event<'_>);
}

/// An observer that ignores everything (tests, embedding).
pub struct Quiet;

impl Observer for Quiet {
    fn event(&mut self, _: Event<'_>) {}
}
