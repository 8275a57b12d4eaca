//! What the application has to tell its user while it works — a model being fetched, a
//! plugin compiling for seconds, a watched plugin applied — sent where the program that uses
//! it says (the CLI: a line on stderr). Library code does not print: without a sink installed
//! these go to `tracing` at info level.

use std::sync::OnceLock;

type Sink = Box<dyn Fn(&str) + Send + Sync>;

static SINK: OnceLock<Sink> = OnceLock::new();

/// Where notices go from now on (the first call wins: a process has one user to tell).
pub fn install(sink: impl Fn(&str) + Send + Sync + 'static) {
    let _ = SINK.set(Box::new(sink));
}

/// Tell the user `line`.
pub fn notice(line: &str) {
    match SINK.get() {
        Some(sink) => sink(line),
        None => tracing::info!("{line}"),
    }
}

/// `work()`, with a notice of `what` if it takes more than a second (a new plugin's first
/// compilation takes seconds; a cached one a few milliseconds, and says nothing).
pub fn said_if_slow<T>(what: &str, work: impl FnOnce() -> T) -> T {
    let (done, finished) = std::sync::mpsc::channel::<()>();
    let what = what.to_string();
    let waiting = std::thread::spawn(move || {
        if finished.recv_timeout(std::time::Duration::from_secs(1)) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            notice(&format!("{what} ..."));
        }
    });
    let result = work();
    drop(done);
    let _ = waiting.join();
    result
}
