//! wirl's trainer: a validated run config (`config`), the loop collect → update → record →
//! checkpoint (`trainer`), its typed records (`metrics`), run directories and resume
//! (`run_dir`, `checkpoint`), held-out evaluation (`eval`), the run manifest and its plugin
//! bytes (`manifest`), hot swap (`swap`), a [`Control`] handle to stop, pause and swap a run
//! from another thread, and an [`Observer`] that hears what it does.
//!
//! It must not know clap, the terminal, signals or HTTP: the CLI (and a server) drive it.

pub mod checkpoint;
pub mod config;
pub mod control;
pub mod distill;
pub mod error;
pub mod eval;
pub mod judges;
pub mod manifest;
pub mod metrics;
pub mod observer;
pub mod run_dir;
pub mod swap;
mod tasks;
pub mod tensorboard;
pub mod trainer;

pub use config::{RunConfig, TrainConfig};
pub use control::{Control, ControlError};
pub use error::{Error, Result};
pub use metrics::{RolloutRecord, StepMetrics};
pub use observer::{Event, Observer, Phase, Quiet};
pub use swap::{ApplyOptions, Refusal, Report, RunStatus, SwapEvent};
pub use trainer::{Outcome, Summary, Trainer};
