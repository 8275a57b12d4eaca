//! Why a task source, a dataset or a scorer could not be opened or read: what the caller
//! brought (`Invalid`, the message naming the file, row, column or key), what failed under it
//! (the I/O, JSON, Arrow or Parquet error, the sandbox's or the engine's, kept as sources),
//! or a broken invariant of wirl's own (`Internal`). `context` adds what was being done, as
//! anyhow's did, keeping the cause as the source.

/// An error of the rollout layer; `wirl_engine::error_chain` shows it with its causes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A dataset, task spec or server answer that cannot be used; the message says which.
    #[error("{0}")]
    Invalid(String),
    /// What was being done when `source` failed.
    #[error("{context}")]
    Context {
        context: String,
        #[source]
        source: Box<Error>,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Arrow(#[from] arrow_schema::ArrowError),
    #[error(transparent)]
    Parquet(#[from] parquet::errors::ParquetError),
    #[error(transparent)]
    Sandbox(#[from] wirl_sandbox::Error),
    #[error(transparent)]
    Engine(#[from] wirl_engine::Error),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error(transparent)]
    Http(#[from] ureq::Error),
    #[error(transparent)]
    Template(#[from] TemplateDrift),
    /// A broken invariant of wirl's own, told apart from the caller's bad input.
    #[error("internal error (a bug in wirl, please report it): {0}")]
    Internal(String),
}

// The two errors of the layer that its parts name by themselves live here too, so that
// this file imports none of them (they import it).

/// Why a remote call failed.
#[derive(Debug)]
pub enum RemoteError {
    /// The server could not be reached, or failed (5xx, 429), after every retry.
    Unreachable(String),
    /// It did not answer within the task's `timeout_s`, on the last try.
    TimedOut(String),
    /// It answered, refusing (a 4xx), or with something that is not the expected JSON.
    Refused(String),
}

impl std::fmt::Display for RemoteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RemoteError::Unreachable(message) | RemoteError::Refused(message) => f.write_str(message),
            RemoteError::TimedOut(message) => write!(f, "{message} (no answer within the task's timeout_s)"),
        }
    }
}

impl std::error::Error for RemoteError {}

/// The chat template does not render the conversation as the ledger holds it.
#[derive(Debug)]
pub struct TemplateDrift(pub String);

impl std::fmt::Display for TemplateDrift {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the chat template cannot be used for multi-turn training: {} (the token ledger appends each turn to \
             the last; a template that rewrites earlier turns, or the model's reply, would make the trained \
             tokens differ from what the model saw)",
            self.0
        )
    }
}

impl std::error::Error for TemplateDrift {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Error::Invalid` from a format string.
macro_rules! invalid {
    ($($message:tt)*) => { $crate::error::Error::Invalid(format!($($message)*)) };
}

/// Return `Error::Invalid` from a format string.
macro_rules! bail {
    ($($message:tt)*) => { return Err($crate::error::invalid!($($message)*).into()) };
}

pub(crate) use {bail, invalid};

wirl_engine::error_context!();

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dataset, DatasetSpec};

    fn open(path: &std::path::Path) -> Error {
        let spec = DatasetSpec { path: path.to_path_buf(), columns: None, shuffle: false, seed: 0 };
        Dataset::open(&spec).err().expect("refused")
    }

    /// A file that is not there: what was being done, with the I/O error kept as the source
    /// (not flattened), shown as anyhow showed it.
    #[test]
    fn a_failure_under_the_layer_keeps_its_source() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.jsonl");
        let error = open(&missing);
        let Error::Context { context, source } = &error else { panic!("{error:?}") };
        assert_eq!(context, &format!("reading {}", missing.display()));
        assert!(matches!(source.as_ref(), Error::Io(io) if io.kind() == std::io::ErrorKind::NotFound), "{source:?}");
        let chain = wirl_engine::error_chain(&error);
        assert!(
            chain.starts_with(&format!("reading {}: ", missing.display())) && chain.contains("No such file"),
            "{chain}"
        );
    }

    /// A file the caller brought that cannot be used is `Invalid`, naming it.
    #[test]
    fn the_callers_bad_input_is_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.jsonl");
        std::fs::write(&empty, "").unwrap();
        let error = open(&empty);
        assert!(matches!(&error, Error::Invalid(message) if message.contains("empty.jsonl")), "{error:?}");
    }
}
