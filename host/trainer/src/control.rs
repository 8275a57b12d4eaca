//! A handle on a running training from outside its thread: a signal handler, the control
//! socket (`wirl ctl`), a server. Every operation a transport offers is a method here: stop,
//! pause, resume, status, apply a task set (hot swap), roll back.

use crate::config::TaskSet;
use crate::swap::{ApplyOptions, Refusal, Report, RunStatus, SwapEvent, Swapper};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use wirl_sandbox::Interrupter;

/// Stops a run: plugin calls in progress end within milliseconds (`interrupted`), generation
/// is given up, and the step in progress is abandoned if its weights are still untouched, or
/// finished if its update has begun; then the trainer checkpoints and returns. Pauses it
/// between steps, and swaps its tasks. Cheap to clone.
#[derive(Clone, Default)]
pub struct Control {
    stopped: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    /// The sandboxes whose calls a stop cuts short.
    interrupters: Arc<Mutex<Vec<Interrupter>>>,
    /// The running trainer's swap state, once it has started.
    swapper: Arc<Mutex<Option<Arc<Swapper>>>>,
}

impl Control {
    pub fn new() -> Self {
        Self::default()
    }

    /// Ask the run to stop.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        for interrupter in self.interrupters.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            interrupter.interrupt();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Hold the run at its next step boundary (the step in progress finishes) until
    /// [`Control::resume`]; a swap staged meanwhile is switched in while it waits.
    pub fn pause(&self) -> anyhow::Result<RunStatus> {
        self.paused.store(true, Ordering::SeqCst);
        self.event("paused");
        self.status()
    }

    pub fn resume(&self) -> anyhow::Result<RunStatus> {
        self.paused.store(false, Ordering::SeqCst);
        self.event("resumed");
        self.status()
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Where the run stands: step, manifest in force, staged changes, last step's figures.
    pub fn status(&self) -> anyhow::Result<RunStatus> {
        let mut status = self.swapper()?.status();
        status.paused = self.is_paused();
        status.stopping = self.is_stopped();
        Ok(status)
    }

    /// Check a new task set beside training and stage it for the next step boundary (or,
    /// with `dry_run`, only report what it would change and how its checks went).
    pub fn apply(&self, tasks: TaskSet, options: &ApplyOptions) -> Result<Report, Refusal> {
        let stopping = || Refusal {
            message: "the run is stopping: nothing was staged (apply to the resumed run)".into(),
            report: None,
        };
        if self.is_stopped() {
            return Err(stopping());
        }
        let swapper = self.swapper().map_err(|e| Refusal { message: e.to_string(), report: None })?;
        let applied = swapper.apply(tasks, options);
        // A stop during the checks cuts their plugin calls short: the refusal is the stop's,
        // not the plugins'; and a set staged as the run stops would never be in force.
        if self.is_stopped() {
            let Ok(report) = &applied else { return Err(stopping()) };
            if options.dry_run {
                return applied;
            }
            let mut state = swapper.state();
            // Already switched in at a boundary before the stop: it did take effect.
            if state.staged.as_ref().is_some_and(|s| s.manifest.generation == report.generation) {
                state.staged = None;
                return Err(stopping());
            }
        }
        applied
    }

    /// Go back to the task set in force before the last switch, at the next step boundary.
    pub fn rollback(&self) -> anyhow::Result<String> {
        let swapper = self.swapper()?;
        let mut state = swapper.state();
        let Some(previous) = &state.previous else {
            anyhow::bail!(
                "nothing to roll back to: generation {} is the run's first, or was reached by a rollback",
                state.current.generation
            );
        };
        let message = format!(
            "rolling back from generation {} to the task set of generation {} at the next step boundary",
            state.current.generation, previous.generation
        );
        state.staged = None;
        state.rollback = Some("rollback".into());
        Ok(message)
    }

    /// Cut `interrupter`'s calls short on stop (at once if already stopped).
    pub(crate) fn watch(&self, interrupter: Interrupter) {
        if self.is_stopped() {
            interrupter.interrupt();
        }
        self.interrupters.lock().unwrap_or_else(|e| e.into_inner()).push(interrupter);
    }

    pub(crate) fn attach(&self, swapper: Arc<Swapper>) {
        *self.swapper.lock().unwrap_or_else(|e| e.into_inner()) = Some(swapper);
    }

    fn swapper(&self) -> anyhow::Result<Arc<Swapper>> {
        self.swapper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| anyhow::anyhow!("the run is still loading; try again in a moment"))
    }

    fn event(&self, kind: &str) {
        if let Ok(swapper) = self.swapper() {
            let step = swapper.state().status.step;
            swapper.record(&SwapEvent::new(step, kind));
        }
    }
}

#[cfg(test)]
mod tests {
    /// An apply once the run is stopping is refused as the stop's, before any check runs
    /// (whose plugin calls the stop would cut short, and whose failure would read as theirs).
    #[test]
    fn an_apply_after_stop_says_the_run_is_stopping() {
        let control = super::Control::new();
        control.stop();
        let refusal = control.apply(Default::default(), &Default::default()).unwrap_err();
        assert!(refusal.message.contains("the run is stopping: nothing was staged"), "{}", refusal.message);
    }
}
