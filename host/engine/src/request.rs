//! What callers ask the engine for and what they get back: a request (`n` completions of
//! one prompt, with its sampling), its checks, and the completions. Shared by the
//! scheduler, the executor and the output processor, which know each other only through
//! these.

use crate::llama::Model;
use crate::sampling::Sampling;
use crate::{Error, Result};

/// `n` completions of one prompt.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub n: usize,
    pub sampling: Sampling,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the model's context, was reached.
    Length,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    /// Generated token ids (the EOS token included when generation stopped on it).
    pub tokens: Vec<u32>,
    /// Log-probability of each generated token under the model at temperature 1.
    pub logprobs: Vec<f32>,
    /// For each generated token, the most likely tokens at its position and their
    /// log-probabilities (`Sampling::top_logprobs` of them; empty when that is 0).
    pub top_logprobs: Vec<Vec<(u32, f32)>>,
    /// The text, without EOS or the stop string.
    pub text: String,
    pub finish: FinishReason,
    /// The version of the weights that sampled it: the engine actor counts every update
    /// made through its barrier ([`EngineHandle::hold_weights`](crate::EngineHandle::hold_weights));
    /// 0 outside the actor.
    pub weights_version: u64,
}

/// Which request a batch's row or result belongs to (chosen by the caller).
pub type RequestId = u64;

/// Check a request before it may join a batch.
pub fn validate(model: &Model, request: &GenerateRequest) -> Result<()> {
    request.sampling.validate().map_err(|crate::Refused(message)| Error::Input(message))?;
    if request.prompt.is_empty() {
        return Err(Error::Input("the prompt is empty".into()));
    }
    let context = model.config().context();
    if request.prompt.len() >= context {
        return Err(Error::Input(format!(
            "the prompt has {} tokens, the model's context is {context}",
            request.prompt.len()
        )));
    }
    if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= model.config().vocab_size) {
        return Err(Error::Input(format!("token id {bad} is outside the vocabulary of {}", model.config().vocab_size)));
    }
    Ok(())
}

/// Cache positions a request may come to need: its prompt and every token it may generate,
/// within the model's context.
pub fn extent(request: &GenerateRequest, context: usize) -> usize {
    (request.prompt.len() + request.sampling.max_tokens).min(context)
}
