//! Why a run could not start, step, save or resume: a config, run directory or checkpoint
//! that cannot be used (`Invalid`, the message naming the file and key), a failure under the
//! trainer (I/O, a TOML or JSON parser, the engine, the learner, the rollout layer, the
//! sandbox: kept as sources), or a broken invariant of wirl's own (`Internal`). `context`
//! adds what was being done, as anyhow's did, keeping the cause as the source.

/// An error of the trainer; `wirl_engine::error_chain` shows it with its causes.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A config, run directory, checkpoint or event that cannot be used; the message says
    /// which and what to do.
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
    Toml(#[from] toml::de::Error),
    #[error(transparent)]
    TomlWrite(#[from] toml::ser::Error),
    #[error(transparent)]
    Tensor(#[from] candle_core::Error),
    #[error(transparent)]
    Engine(#[from] wirl_engine::Error),
    #[error(transparent)]
    Learner(#[from] wirl_grpo::Error),
    #[error(transparent)]
    Rollout(#[from] wirl_rollout::Error),
    #[error(transparent)]
    Roll(#[from] wirl_rollout::RollError),
    #[error(transparent)]
    Sandbox(#[from] wirl_sandbox::Error),
    #[error(transparent)]
    Builtin(#[from] wirl_builtins::UnknownBuiltin),
    /// Task weights that cannot be shared out.
    #[error(transparent)]
    Mixture(#[from] wirl_rollout::MixtureError),
    #[error(transparent)]
    Clock(#[from] std::time::SystemTimeError),
    #[error(transparent)]
    Path(#[from] std::path::StripPrefixError),
    #[error(transparent)]
    Slice(#[from] std::array::TryFromSliceError),
    /// A broken invariant of wirl's own, told apart from the caller's bad input.
    #[error("internal error (a bug in wirl, please report it): {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The model's errors (its files, the ranks' collectives) in the engine's words, as the
/// engine shows them.
impl From<wirl_model::Error> for Error {
    fn from(error: wirl_model::Error) -> Self {
        Error::Engine(error.into())
    }
}

/// `Error::Invalid` from a format string.
macro_rules! invalid {
    ($($message:tt)*) => { $crate::error::Error::Invalid(format!($($message)*)) };
}

/// Return `Error::Invalid` from a format string.
macro_rules! bail {
    ($($message:tt)*) => { return Err($crate::error::invalid!($($message)*).into()) };
}

/// Return `Error::Invalid` from a format string unless `condition` holds.
macro_rules! ensure {
    ($condition:expr, $($message:tt)*) => { if !$condition { $crate::error::bail!($($message)*) } };
}

pub(crate) use {bail, ensure, invalid};

wirl_engine::error_context!();
