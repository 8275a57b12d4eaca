//! wirl's inference engine: Llama-family decoders on candle, loaded from HF directories or
//! GGUF files, with batched sampling that returns per-token log-probs.

pub mod actor;
pub mod comm;
pub mod config;
pub mod export;
pub mod generate;
pub mod llama;
pub mod load;
pub mod sampling;
pub mod tokenizer;

pub use actor::{EngineHandle, TextPiece};
pub use candle_core::{DType, Device};
pub use comm::{Comm, Solo, ThreadComm};
pub use config::Config;
pub use generate::{Batch, Completion, FinishReason, GenerateRequest, RequestId, generate};
pub use llama::{KvCache, Model};
pub use load::{LoadOptions, LoadedModel, load};
pub use sampling::Sampling;
pub use tokenizer::{ChatMessage, TextStream, Tokenizer};

/// What can go wrong in the engine. File errors name the file; config errors the field.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{file}: {message}")]
    Io { file: String, message: String },
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
    #[error("the engine has stopped")]
    Stopped,
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
