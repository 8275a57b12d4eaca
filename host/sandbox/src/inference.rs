//! What an agent plugin's `inference` import reaches: the host's engine, behind a trait so
//! that the sandbox knows nothing of models (the rollout layer implements it).

use crate::{Completion, Message, ReplyLogprobs, ReplyToScore, Sampling};
use std::future::Future;
use std::pin::Pin;

/// What an agent's `inference.generate` reaches: the engine being trained, in the host.
/// A refusal (`Err`) is returned to the agent as the call's error.
pub trait InferenceHost: Send + Sync {
    /// One completion per conversation (each ends where the model writes the next assistant
    /// turn), all admitted to the engine together.
    fn generate(
        &self,
        conversations: Vec<Vec<Message>>,
        sampling: Sampling,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Completion>, String>> + Send + '_>>;

    /// The log-probs of given replies (0.2.0's `inference.logprobs`), one result per reply.
    /// A host that cannot compute them (an OpenAI-compatible server's chat API returns
    /// log-probs only of what it samples) keeps this refusal.
    fn logprobs(
        &self,
        replies: Vec<ReplyToScore>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<ReplyLogprobs>, String>> + Send + '_>> {
        let _ = replies;
        Box::pin(async { Err("this host's model gives no log-probs of given text (only of what it samples)".into()) })
    }
}
