//! The OpenAI-style replies `wirl serve` writes, as types: a completion (chat or text), its
//! choices, token log-probs, usage, stream chunks, the model list and the error body.
//!
//! Every struct lists its fields in alphabetical order, and log-probs are written as the
//! `f64` of their `f32`: the replies were `json!` literals before, whose maps sort their keys
//! and widen floats so, and clients may compare bytes (a test pins a reply's bytes). Absent
//! values are `null` unless a field says it is left out.

use serde::Serialize;
use serde::ser::Serializer;
use std::collections::BTreeMap;
use wirl_engine::FinishReason;

/// `f32` values written as the `f64` they widen to (what `serde_json::Value` holds).
pub struct Widened<'a>(pub &'a [f32]);

impl Serialize for Widened<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.0.iter().map(|&x| f64::from(x)))
    }
}

pub(crate) fn widened<S: Serializer>(x: &f32, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_f64(f64::from(*x))
}

/// A finished completion: `chat.completion` or `text_completion`.
#[derive(Serialize)]
pub struct Reply<'a> {
    pub choices: Vec<Choice<'a>>,
    pub created: u64,
    pub id: &'a str,
    pub model: &'a str,
    pub object: &'static str,
    /// The prompt's token ids (wirl's addition: a trainer's exact tokens).
    pub prompt_token_ids: &'a [u32],
    pub usage: Usage,
    /// The client's version of the weights that sampled the first choice (wirl's addition).
    pub weights_version: Option<u64>,
}

#[derive(Serialize)]
pub struct Usage {
    pub completion_tokens: usize,
    pub prompt_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt: usize, generated: usize) -> Usage {
        Usage { completion_tokens: generated, prompt_tokens: prompt, total_tokens: prompt + generated }
    }
}

/// One choice, in its endpoint's shape.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Choice<'a> {
    Chat(ChatChoice<'a>),
    Text(TextChoice<'a>),
}

/// A chat choice: its `message` when finished, or — as a stream's last chunk — a `delta`
/// with the token ids and log-probs.
#[derive(Serialize)]
pub struct ChatChoice<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delta: Option<LastDelta<'a>>,
    pub finish_reason: &'static str,
    pub index: usize,
    pub logprobs: Option<Logprobs>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Message<'a>>,
    pub token_ids: &'a [u32],
}

#[derive(Serialize)]
pub struct Message<'a> {
    pub content: &'a str,
    pub generation_log_probs: Widened<'a>,
    pub generation_token_ids: &'a [u32],
    pub role: &'static str,
}

/// A streamed chat choice's last delta: what its message would carry beside the text.
#[derive(Serialize)]
pub struct LastDelta<'a> {
    pub generation_log_probs: Widened<'a>,
    pub generation_token_ids: &'a [u32],
}

/// A text completion's choice (a stream's last chunk has an empty `text`).
#[derive(Serialize)]
pub struct TextChoice<'a> {
    pub finish_reason: &'static str,
    pub generation_log_probs: Widened<'a>,
    pub index: usize,
    pub logprobs: Option<Logprobs>,
    pub text: &'a str,
    pub token_ids: &'a [u32],
}

/// The sampled tokens' log-probs (and the most likely alternatives'), in the endpoint's shape.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Logprobs {
    Chat { content: Vec<TokenLogprob> },
    Text(TextLogprobs),
}

/// A chat position: the sampled token and its alternatives (each with its id: wirl's
/// addition).
#[derive(Serialize)]
pub struct TokenLogprob {
    pub bytes: Vec<u8>,
    #[serde(serialize_with = "widened")]
    pub logprob: f32,
    pub token: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_id: Option<u32>,
    /// Left out of the alternatives themselves.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_logprobs: Option<Vec<TokenLogprob>>,
}

/// The completions endpoint's log-probs (its legacy shape).
#[derive(Serialize)]
pub struct TextLogprobs {
    /// Not computed: always `null`.
    pub text_offset: (),
    pub token_logprobs: Vec<f64>,
    pub tokens: Vec<String>,
    /// Per position, the alternatives by their text (`null` when none were asked for).
    pub top_logprobs: Option<Vec<BTreeMap<String, f64>>>,
}

/// A stream's text chunk for one choice.
#[derive(Serialize)]
#[serde(untagged)]
pub enum Piece<'a> {
    Chat { delta: Delta<'a>, finish_reason: (), index: usize },
    Text { finish_reason: (), index: usize, text: &'a str },
}

#[derive(Serialize)]
pub struct Delta<'a> {
    pub content: &'a str,
    /// A chat's first chunk says the role.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
}

/// One server-sent event of a stream: choices (pieces, or a last chunk), or usage alone.
#[derive(Serialize)]
pub struct Chunk<'a, C: Serialize> {
    pub choices: Vec<C>,
    pub created: u64,
    pub id: &'a str,
    pub model: &'a str,
    pub object: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `GET /v1/models`.
#[derive(Serialize)]
pub struct ModelList<'a> {
    pub data: [ModelCard<'a>; 1],
    pub object: &'static str,
}

#[derive(Serialize)]
pub struct ModelCard<'a> {
    pub created: u64,
    pub id: &'a str,
    /// The positions the server runs (vLLM's field).
    pub max_model_len: usize,
    pub object: &'static str,
    pub owned_by: &'static str,
}

/// An error body: `{"error": {...}}`.
#[derive(Serialize)]
pub struct ErrorBody<'a> {
    pub error: ErrorDetail<'a>,
}

#[derive(Serialize)]
pub struct ErrorDetail<'a> {
    /// Always `null` (left out of a stream's error event).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<()>,
    pub message: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub param: Option<Option<&'a str>>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
}

/// OpenAI's `finish_reason`.
pub fn finish(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply's bytes as clients have read them since the first release (keys sorted, log-probs
    /// as the f64 of their f32): a field renamed, reordered or re-typed shows here.
    #[test]
    fn a_reply_keeps_its_bytes() {
        let (ids, logprobs) = ([5u32, 7], [-0.1f32, -2.5]);
        let alternative = TokenLogprob {
            bytes: b"a".to_vec(),
            logprob: -0.3,
            token: "a".into(),
            token_id: Some(9),
            top_logprobs: None,
        };
        let choice = Choice::Chat(ChatChoice {
            delta: None,
            finish_reason: finish(FinishReason::Stop),
            index: 0,
            logprobs: Some(Logprobs::Chat {
                content: vec![TokenLogprob {
                    bytes: b"hi".to_vec(),
                    logprob: -0.1,
                    token: "hi".into(),
                    token_id: None,
                    top_logprobs: Some(vec![alternative]),
                }],
            }),
            message: Some(Message {
                content: "hi!",
                generation_log_probs: Widened(&logprobs),
                generation_token_ids: &ids,
                role: "assistant",
            }),
            token_ids: &ids,
        });
        let reply = Reply {
            choices: vec![choice],
            created: 1,
            id: "chatcmpl-1",
            model: "m",
            object: "chat.completion",
            prompt_token_ids: &[1, 2],
            usage: Usage::new(2, 2),
            weights_version: Some(0),
        };
        assert_eq!(
            serde_json::to_string(&reply).unwrap(),
            r#"{"choices":[{"finish_reason":"stop","index":0,"logprobs":{"content":[{"bytes":[104,105],"logprob":-0.10000000149011612,"token":"hi","top_logprobs":[{"bytes":[97],"logprob":-0.30000001192092896,"token":"a","token_id":9}]}]},"message":{"content":"hi!","generation_log_probs":[-0.10000000149011612,-2.5],"generation_token_ids":[5,7],"role":"assistant"},"token_ids":[5,7]}],"created":1,"id":"chatcmpl-1","model":"m","object":"chat.completion","prompt_token_ids":[1,2],"usage":{"completion_tokens":2,"prompt_tokens":2,"total_tokens":4},"weights_version":0}"#
        );
        let piece = Piece::Chat { delta: Delta { content: "x", role: None }, finish_reason: (), index: 1 };
        assert_eq!(
            serde_json::to_string(&piece).unwrap(),
            r#"{"delta":{"content":"x"},"finish_reason":null,"index":1}"#
        );
    }
}
