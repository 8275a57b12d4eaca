//! A run's directory: `config.toml` as given, `config.resolved.toml` (absolute paths,
//! overrides applied: what `--resume` reads), `metrics.jsonl`, `rollouts.jsonl`,
//! `checkpoints/`, `summary.json`.

use crate::checkpoint::{self, Checkpoint};
use crate::config::TrainConfig;
use crate::error::{Context, bail};
use std::path::{Path, PathBuf};

/// The config as resolved, in a run directory.
pub const RESOLVED: &str = "config.resolved.toml";

/// `runs/train-<unix time>`.
pub fn default_run_dir() -> crate::error::Result<PathBuf> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    Ok(PathBuf::from(format!("runs/train-{now}")))
}

/// Make `run_dir` a new run's directory, keeping the config as given (`text`) and as
/// resolved. A directory that already holds a run is refused, untouched.
pub fn create(run_dir: &Path, text: &str, config: &TrainConfig) -> crate::error::Result<()> {
    if run_dir.join(RESOLVED).exists() {
        bail!(
            "{} already holds a run; continue it with `wirl train --resume {0}`, or choose another --run-dir",
            run_dir.display()
        );
    }
    std::fs::create_dir_all(run_dir).with_context(|| format!("creating run directory {}", run_dir.display()))?;
    std::fs::write(run_dir.join("config.toml"), text)?;
    std::fs::write(run_dir.join(RESOLVED), toml::to_string(config)?)?;
    Ok(())
}

/// Undo [`create`] for a run that failed to start (nothing trained): the directory goes if
/// this run made it, else only the files that mark it as a run's.
pub fn abandon(run_dir: &Path, existed: bool) {
    if existed {
        let _ = std::fs::remove_file(run_dir.join("config.toml"));
        let _ = std::fs::remove_file(run_dir.join(RESOLVED));
    } else {
        let _ = std::fs::remove_dir_all(run_dir);
    }
}

/// The config of the run in `run_dir`.
pub fn config(run_dir: &Path) -> crate::error::Result<TrainConfig> {
    let path = run_dir.join(RESOLVED);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("{} is not a wirl run directory (no {RESOLVED})", run_dir.display()))?;
    TrainConfig::parse_resolved(&text, &path.display().to_string())
}

/// Whether resuming the run in `run_dir` to `steps` steps in all leaves anything to do:
/// `Some(done)` when the run has trained all its `done` steps and written their summary (a
/// resume would train nothing), `None` when steps (or the final evaluation) remain. A resume
/// to fewer steps than its newest checkpoint holds is refused: steps done are not undone,
/// and its summary would claim a step count the weights do not have. Reads only.
pub fn finished(run_dir: &Path, steps: usize) -> crate::error::Result<Option<usize>> {
    let Some(checkpoint) = checkpoint::latest(run_dir)? else {
        return Ok(None);
    };
    let done = checkpoint.state.step;
    if steps < done {
        bail!(
            "{}: {steps} steps asked (--steps, else the run's grpo.steps), but the run has done {done} (its newest \
             checkpoint, {}): --steps counts the run's steps in all; give more than {done} to train further, or \
             start a new run from the checkpoint's weights",
            run_dir.display(),
            checkpoint.dir.display()
        );
    }
    let summary = std::fs::read_to_string(run_dir.join("summary.json")).ok();
    let summarized = summary
        .and_then(|text| serde_json::from_str::<crate::trainer::Summary>(&text).ok())
        .is_some_and(|summary| summary.steps == done);
    Ok((steps == done && summarized).then_some(done))
}

/// The newest complete checkpoint of the run in `run_dir`, its records cut back to it (the
/// steps after it are run again).
pub fn prepare_resume(run_dir: &Path) -> crate::error::Result<Checkpoint> {
    let Some(checkpoint) = checkpoint::latest(run_dir)? else {
        bail!("{}: no complete checkpoint to resume from (checkpoints/step-*)", run_dir.display());
    };
    checkpoint::truncate_jsonl(&run_dir.join("metrics.jsonl"), checkpoint.state.step)?;
    checkpoint::truncate_jsonl(&run_dir.join("rollouts.jsonl"), checkpoint.state.step)?;
    Ok(checkpoint)
}
