//! The engine's errors: what can go wrong (`Error`, file errors naming the file and config
//! errors the field), a caller's value refused by a rule (`Refused`), and how a chain of
//! causes reads for a user (`error_chain`, candle's backtraces left out).

/// What can go wrong in the engine. File errors name the file; config errors the field.
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
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("input: {0}")]
    Input(String),
    #[error("generation failed: {0}")]
    Generation(String),
    /// The request fits, but not beside the work in flight now: retry shortly.
    #[error("busy: {0}")]
    Busy(String),
    #[error("the engine has stopped")]
    Stopped,
    /// A collective across ranks failed (a rank left the group, a transport error).
    #[error("ranks: {0}")]
    Comm(String),
    /// Shown without the backtrace candle attaches when `RUST_BACKTRACE` is set: the message
    /// reaches users and HTTP clients, the backtrace (this machine's paths) would too.
    #[error("tensor: {}", without_backtrace(.0))]
    Tensor(#[from] candle_core::Error),
    /// A broken invariant of wirl's own (a declaration or state it should never hold), told
    /// apart from the caller's bad input.
    #[error("internal error (a bug in wirl, please report it): {0}")]
    Internal(String),
}

pub use wirl_model::{Refused, without_backtrace};

/// The model's errors in the engine's words: the same variants, the same messages.
impl From<wirl_model::Error> for Error {
    fn from(error: wirl_model::Error) -> Self {
        match error {
            wirl_model::Error::Io { file, source } => Error::Io { file, source },
            wirl_model::Error::Format { file, message } => Error::Format { file, message },
            wirl_model::Error::Config { field, message } => Error::Config { field, message },
            wirl_model::Error::Input(message) => Error::Input(message),
            wirl_model::Error::Comm(message) => Error::Comm(message),
            wirl_model::Error::Stopped => Error::Stopped,
            wirl_model::Error::Tensor(error) => Error::Tensor(error),
        }
    }
}

/// `error` and its causes joined as anyhow's `{:#}` joins them ("reading x: No such file"),
/// for a user or a client: each tensor error without candle's backtrace, and a cause left out
/// where the message above it already ends with its text (an error that both shows and keeps
/// its source, as `Error::Tensor` does).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut shown = String::new();
    let mut cause = Some(error);
    while let Some(this) = cause {
        let text = match this.downcast_ref::<candle_core::Error>() {
            Some(tensor) => without_backtrace(tensor).to_string(),
            None => this.to_string(),
        };
        if shown.is_empty() {
            shown = text;
        } else if !text.is_empty() && !shown.ends_with(&text) {
            shown = format!("{shown}: {text}");
        }
        cause = this.source();
    }
    shown
}

/// Defines `Context` in the calling crate's error module: anyhow's `.context(..)` and
/// `.with_context(..)`, typed. That module's `Error` must have `Context { context: String,
/// source: Box<Error> }` (what was being done, the failure kept as its source) and
/// `Invalid(String)` (what a missing value, `Option::context`, becomes: the caller's).
#[macro_export]
macro_rules! error_context {
    () => {
        /// What was being done, around a failure (anyhow's `Context`, typed).
        pub trait Context<T> {
            fn context(self, context: impl std::fmt::Display) -> Result<T>;
            fn with_context<C: std::fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T>;
        }

        impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
            fn context(self, context: impl std::fmt::Display) -> Result<T> {
                self.map_err(|e| Error::Context { context: context.to_string(), source: Box::new(e.into()) })
            }
            fn with_context<C: std::fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T> {
                self.map_err(|e| Error::Context { context: context().to_string(), source: Box::new(e.into()) })
            }
        }

        impl Error {
            /// This error, as the cause of what was being done.
            pub fn context(self, context: impl std::fmt::Display) -> Error {
                Error::Context { context: context.to_string(), source: Box::new(self) }
            }

            /// This error and those it wraps through `Context`, outermost first: where to
            /// look for a variant (the standard chain shows a `Context`'s cause boxed, which
            /// a downcast to `Error` does not see).
            pub fn layers(&self) -> impl Iterator<Item = &Error> {
                std::iter::successors(Some(self), |error| match error {
                    Error::Context { source, .. } => Some(source.as_ref()),
                    _ => None,
                })
            }
        }

        impl<T> Context<T> for Option<T> {
            fn context(self, context: impl std::fmt::Display) -> Result<T> {
                self.ok_or_else(|| Error::Invalid(context.to_string()))
            }
            fn with_context<C: std::fmt::Display>(self, context: impl FnOnce() -> C) -> Result<T> {
                self.ok_or_else(|| Error::Invalid(context().to_string()))
            }
        }
    };
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A message names what failed, never the machine's stack: candle's backtrace (attached
    /// when `RUST_BACKTRACE` is set) is left out, however deeply it is wrapped.
    #[test]
    fn errors_are_shown_without_candles_backtraces() {
        let wrapped = candle_core::Error::WithBacktrace {
            inner: Box::new(candle_core::Error::WithBacktrace {
                inner: Box::new(candle_core::Error::Msg("tensor needs 2304 bytes".into())),
                backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
            }),
            backtrace: Box::new(std::backtrace::Backtrace::force_capture()),
        };
        assert!(wrapped.to_string().lines().count() > 1, "candle's own display carries the backtrace");
        assert_eq!(without_backtrace(&wrapped).to_string(), "tensor needs 2304 bytes");
        assert_eq!(Error::from(wrapped).to_string(), "tensor: tensor needs 2304 bytes");
    }

    /// The chain reads as anyhow's `{:#}` did, each cause once.
    #[test]
    fn an_error_chain_names_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("reading weights.bin")]
        struct Reading(#[source] std::io::Error);
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        assert_eq!(error_chain(&Reading(io)), "reading weights.bin: no such file");
        let tensor = Error::from(candle_core::Error::Msg("tensor needs 2304 bytes".into()));
        assert_eq!(error_chain(&tensor), "tensor: tensor needs 2304 bytes");
    }
}
