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
    /// The running trainer's swap state, once it has started (rank 0's, with ranks: the
    /// others follow the task set it has in force at each step boundary).
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
    pub fn pause(&self) -> Result<RunStatus, ControlError> {
        self.paused.store(true, Ordering::SeqCst);
        self.event("paused");
        self.status()
    }

    pub fn resume(&self) -> Result<RunStatus, ControlError> {
        self.paused.store(false, Ordering::SeqCst);
        self.event("resumed");
        self.status()
    }

    pub fn is_paused(&self) -> bool {
        self.paused.load(Ordering::SeqCst)
    }

    /// Where the run stands: step, manifest in force, staged changes, last step's figures.
    pub fn status(&self) -> Result<RunStatus, ControlError> {
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
    pub fn rollback(&self) -> Result<String, ControlError> {
        let swapper = self.swapper()?;
        let mut state = swapper.state();
        let Some(previous) = &state.previous else {
            return Err(ControlError::Conflict(format!(
                "nothing to roll back to: generation {} is the run's first, or was reached by a rollback",
                state.current.generation
            )));
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

    fn swapper(&self) -> Result<Arc<Swapper>, ControlError> {
        self.swapper.lock().unwrap_or_else(|e| e.into_inner()).clone().ok_or(ControlError::Loading)
    }

    fn event(&self, kind: &str) {
        if let Ok(swapper) = self.swapper() {
            let step = swapper.state().status.step;
            swapper.record(&SwapEvent::new(step, kind));
        }
    }
}

/// Why a control request was not carried out: a caller answers the two differently (over
/// HTTP: 503 and try again, or 409).
#[derive(Debug)]
pub enum ControlError {
    /// The run is still loading (its tasks are not there yet): ask again in a moment.
    Loading,
    /// The request does not fit the run's state (nothing to roll back to).
    Conflict(String),
}

impl std::fmt::Display for ControlError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlError::Loading => f.write_str("the run is still loading; try again in a moment"),
            ControlError::Conflict(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for ControlError {}

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

    /// Before the run has loaded, every request says so as `Loading` (a caller asks again).
    #[test]
    fn a_run_still_loading_says_so_by_its_error() {
        let control = super::Control::new();
        assert!(matches!(control.status(), Err(super::ControlError::Loading)));
        assert!(matches!(control.rollback(), Err(super::ControlError::Loading)));
        let error = control.pause().unwrap_err().to_string();
        assert!(error.contains("still loading; try again"), "{error}");
    }
}
