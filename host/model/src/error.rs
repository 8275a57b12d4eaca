//! The model's errors: a value one of its rules refuses (`Refused`, naming the field and what
//! is allowed), an input its kernels cannot take, a file of its formats (an adapter) that
//! cannot be read or written, a collective across ranks that failed, and candle's own. The
//! engine and the learner carry them into their errors with the same words.

/// What can go wrong computing a model's pieces or reading and writing its files. File errors
/// name the file; config errors the field.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{file}: {message}")]
    Format { file: String, message: String },
    #[error("config field `{field}`: {message}")]
    Config { field: String, message: String },
    #[error("input: {0}")]
    Input(String),
    /// What reads the weights (the engine) has stopped: they can no longer be held.
    #[error("the engine has stopped")]
    Stopped,
    /// A collective across ranks failed (a rank left the group, a transport error).
    #[error("ranks: {0}")]
    Comm(String),
    /// Shown without the backtrace candle attaches when `RUST_BACKTRACE` is set: the message
    /// reaches users and HTTP clients, the backtrace (this machine's paths) would too.
    #[error("tensor: {}", without_backtrace(.0))]
    Tensor(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// A value the caller gave (a config's field, a sampling setting, an adapter's targets, a
/// GGUF file's metadata) that one of the rules refuses: the message names the field and
/// what is allowed. Callers say where the value came from (the file, the request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// `Refused` from a format string.
#[macro_export]
macro_rules! refused {
    ($($message:tt)*) => { $crate::Refused(format!($($message)*)) };
}

impl From<String> for Refused {
    fn from(message: String) -> Self {
        Refused(message)
    }
}

impl From<&str> for Refused {
    fn from(message: &str) -> Self {
        Refused(message.to_string())
    }
}

/// `error` without the backtraces candle wraps around its errors when `RUST_BACKTRACE` is
/// set (`candle_core::Error::WithBacktrace`): what a message for a user or a client says.
pub fn without_backtrace(error: &candle_core::Error) -> &candle_core::Error {
    match error {
        candle_core::Error::WithBacktrace { inner, .. } => without_backtrace(inner),
        other => other,
    }
}
