//! A sequence classifier as a reward: a checkpoint transformers saves as
//! `...ForSequenceClassification` (Llama, Qwen2, Qwen3, Gemma 3 — reward models such as
//! Skywork-Reward are these), run by the same decoder as the policy, its `score` head read at
//! each text's last token.
//!
//! Which token is "last" is transformers' rule, so that a model scores here as it does there:
//! the rightmost token that is not the config's `pad_token_id` (a text ending in that id is
//! read at the token before; causal attention makes that the state the shorter text has).
//! Texts are scored in batches, left-padded (the padding masked), a batch's tokens bounded.

use crate::config::Config;
use crate::llama::Model;
use crate::load::{self, LoadOptions};
use crate::tokenizer::{ChatMessage, Tokenizer};
use crate::{Error, Refused, Result};
use candle_core::Tensor;
use std::path::{Path, PathBuf};

/// The most tokens (rows × the longest row) one batch holds.
pub const BATCH_TOKENS: usize = 8192;
/// A batch is read this many positions at a time through the key/value cache: attention's
/// scores and mask grow with positions read × positions seen, which in one forward of a
/// long text (its square) would be gigabytes.
pub const PREFILL_CHUNK: usize = 512;

/// A loaded reward model.
pub struct RewardModel {
    model: Model,
    tokenizer: Tokenizer,
    path: PathBuf,
    /// The padding id (`pad_token_id`) transformers skips at a text's end.
    pad: Option<u32>,
    labels: usize,
    /// Positions read per forward ([`PREFILL_CHUNK`]).
    chunk: usize,
}

impl RewardModel {
    /// Load the classifier at `path` (a Hugging Face directory). A causal language model is
    /// refused, naming what a reward model is.
    pub fn load(path: &Path, options: &LoadOptions) -> Result<Self> {
        let loaded = load::load_classifier(path, options)?;
        let config = &loaded.config;
        let labels = config
            .classifier_labels()
            .ok_or_else(|| Error::Internal(format!("{} loaded as a classifier without labels", path.display())))?;
        // It reads each completion through its own template: without one it could score nothing.
        if loaded.tokenizer.chat_template().is_none() {
            return Err(Error::Config {
                field: "chat_template".into(),
                message: format!(
                    "the reward model {} has no chat template (tokenizer_config.json's `chat_template`): it is \
                     fed the conversation through its own template",
                    path.display()
                ),
            });
        }
        Ok(RewardModel {
            pad: pad_id(config),
            labels,
            model: loaded.model,
            tokenizer: loaded.tokenizer,
            path: path.to_path_buf(),
            chunk: PREFILL_CHUNK,
        })
    }

    /// Read batches `chunk` positions at a time (at least 1) instead of [`PREFILL_CHUNK`]:
    /// less memory, more forwards; the scores are the same.
    pub fn with_prefill_chunk(mut self, chunk: usize) -> Self {
        self.chunk = chunk.max(1);
        self
    }

    /// How many scores it gives a text (its `id2label`'s count).
    pub fn labels(&self) -> usize {
        self.labels
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The most tokens a text may have.
    pub fn context(&self) -> usize {
        self.model.config().context()
    }

    /// The token ids a completion is scored as: the task's conversation with the completion
    /// as the assistant's turn, through the reward model's own chat template (as a reward
    /// model's card asks it to be fed), every message's text escaped so that none becomes a
    /// control token.
    pub fn conversation_ids(&self, messages: &[ChatMessage], completion: &str) -> Result<Vec<u32>> {
        let escaped =
            |role: &str, content: &str| ChatMessage { role: role.into(), content: self.tokenizer.escape(content) };
        let mut conversation: Vec<ChatMessage> = messages.iter().map(|m| escaped(&m.role, &m.content)).collect();
        conversation.push(escaped("assistant", completion));
        self.tokenizer.encode(&self.tokenizer.render_chat(&conversation, false)?)
    }

    /// Each text's scores (one per label), in the order given. A text refused on its own (no
    /// token left to read, longer than the context) is that text's `Err`; the others are
    /// scored. An `Err` of the whole call is the engine's (a failed forward).
    pub fn score(&self, texts: &[Vec<u32>]) -> Result<Vec<std::result::Result<Vec<f32>, Refused>>> {
        let mut out: Vec<std::result::Result<Vec<f32>, Refused>> = Vec::with_capacity(texts.len());
        let mut runnable: Vec<(usize, &[u32])> = Vec::new();
        for (i, ids) in texts.iter().enumerate() {
            let read = self.read_span(ids);
            out.push(Err(Refused(String::new())));
            match read {
                Ok(span) => runnable.push((i, span)),
                Err(refused) => out[i] = Err(refused),
            }
        }
        // Longest first, so that a batch's rows are of like length (little padding).
        runnable.sort_by_key(|(_, span)| std::cmp::Reverse(span.len()));
        let mut start = 0;
        while start < runnable.len() {
            let longest = runnable[start].1.len();
            let rows = (BATCH_TOKENS / longest).clamp(1, runnable.len() - start);
            let batch = &runnable[start..start + rows];
            let spans: Vec<&[u32]> = batch.iter().map(|(_, span)| *span).collect();
            for ((i, _), scores) in batch.iter().zip(self.forward(&spans, longest)?) {
                out[*i] = Ok(scores);
            }
            start += rows;
        }
        Ok(out)
    }

    /// The part of `ids` the model reads: up to and including the rightmost token that is
    /// not the padding id.
    fn read_span<'a>(&self, ids: &'a [u32]) -> std::result::Result<&'a [u32], Refused> {
        let end = match self.pad {
            Some(pad) => ids.iter().rposition(|&id| id != pad).map_or(0, |at| at + 1),
            None => ids.len(),
        };
        if end == 0 {
            return Err(crate::refused!("the text has no token to score (empty, or nothing but the padding id)"));
        }
        if end > self.context() {
            return Err(crate::refused!(
                "the text is {end} tokens, past the reward model's context of {}",
                self.context()
            ));
        }
        Ok(&ids[..end])
    }

    /// One batch: rows left-padded to `longest`, read `chunk` positions at a time through the
    /// cache; the head's output at the last position.
    fn forward(&self, spans: &[&[u32]], longest: usize) -> Result<Vec<Vec<f32>>> {
        let pads: Vec<usize> = spans.iter().map(|span| longest - span.len()).collect();
        let ids: Vec<u32> = spans
            .iter()
            .zip(&pads)
            .flat_map(|(span, &pad)| std::iter::repeat_n(0, pad).chain(span.iter().copied()))
            .collect();
        let tokens = Tensor::from_vec(ids, (spans.len(), longest), self.model.device())?;
        let mut cache = self.model.new_cache();
        let mut scores = None;
        for start in (0..longest).step_by(self.chunk) {
            let read = tokens.narrow(1, start, self.chunk.min(longest - start))?;
            scores = Some(self.model.forward(&read, &pads, &mut cache, false)?);
        }
        let scores = scores.ok_or_else(|| Error::Internal("a batch of empty texts".into()))?;
        Ok(scores.to_dtype(candle_core::DType::F32)?.to_vec2()?)
    }
}

/// The config's `pad_token_id` as a token id (transformers' configs write a number or null;
/// anything else reads as none).
fn pad_id(config: &Config) -> Option<u32> {
    config.pad_token_id.as_ref().and_then(serde_json::Value::as_u64).and_then(|id| u32::try_from(id).ok())
}
