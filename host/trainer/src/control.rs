//! A handle on a running training from outside its thread: a signal handler, a server.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use wirl_sandbox::Interrupter;

/// Stops a run: plugin calls in progress end within milliseconds (`interrupted`), generation
/// is given up, and the step in progress is abandoned if its weights are still untouched, or
/// finished if its update has begun; then the trainer checkpoints and returns. Cheap to clone.
#[derive(Clone, Default)]
pub struct Control {
    stopped: Arc<AtomicBool>,
    /// The sandboxes whose calls a stop cuts short.
    interrupters: Arc<Mutex<Vec<Interrupter>>>,
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

    /// Cut `interrupter`'s calls short on stop (at once if already stopped).
    pub(crate) fn watch(&self, interrupter: Interrupter) {
        if self.is_stopped() {
            interrupter.interrupt();
        }
        self.interrupters.lock().unwrap_or_else(|e| e.into_inner()).push(interrupter);
    }
}
