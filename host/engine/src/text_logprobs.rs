//! Log-probabilities of text the model did not sample: a judge asking how likely a reply is
//! (`P("Yes")`, a reference answer's likelihood), a reward reading a continuation's surprise.
//!
//! One text is one row run through the decoder `chunk` positions at a time (a long text's
//! logits are `positions × vocabulary`: gigabytes in one forward), every position's logits
//! kept only from where the scored part begins. Each token's log-prob is the sampler's
//! ([`crate::invariant::log_norm`]): where the engine's kernels are batch-invariant, a
//! sampled reply scored here gets the log-probs its sampling reported, to the bit.

use crate::llama::Model;
use crate::{Error, Result};
use candle_core::{DType, Tensor};

/// Positions read per forward: bounds the logits held at once to this × the vocabulary.
pub const CHUNK: usize = 256;

/// One text to score: the model reads `ids`; the log-probs asked for are those of
/// `ids[from..]`, each given the tokens before it.
#[derive(Clone, Debug)]
pub struct TextToScore {
    pub ids: Vec<u32>,
    /// Where the scored part begins (≥ 1: the first token has nothing before it).
    pub from: usize,
}

impl TextToScore {
    /// Whether a model of `context` positions and `vocab` tokens can score it: tokens after
    /// the first, within its context, every id in its vocabulary (checked before any
    /// forward: an id past the embedding table must not reach it).
    pub fn check(&self, context: usize, vocab: usize) -> std::result::Result<(), String> {
        if self.from == 0 {
            return Err("the first token has no log-prob (nothing comes before it)".into());
        }
        if self.from > self.ids.len() {
            return Err(format!("the scored part starts at {} of {} tokens", self.from, self.ids.len()));
        }
        if self.ids.len() > context {
            return Err(format!("the text is {} tokens, past the model's context of {context}", self.ids.len()));
        }
        if let Some(id) = self.ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(format!("token id {id} is past the model's vocabulary of {vocab}"));
        }
        Ok(())
    }
}

/// The log-prob of each of `text.ids[text.from..]` under `model`, in order.
pub fn token_logprobs(model: &Model, text: &TextToScore, chunk: usize) -> Result<Vec<f32>> {
    let config = model.config();
    text.check(config.context(), config.vocab_size).map_err(Error::Input)?;
    if text.from == text.ids.len() {
        return Ok(Vec::new()); // an empty reply: nothing to read
    }
    let chunk = chunk.max(1);
    let ids = &text.ids;
    let mut cache = model.new_cache();
    let mut out = Vec::with_capacity(ids.len() - text.from);
    // The logits at position p predict token p + 1: the scored tokens need positions
    // from - 1 to len - 2; the last token is read by nobody.
    let last_read = ids.len() - 1;
    let mut start = 0;
    while start < last_read {
        let len = chunk.min(last_read - start);
        let tokens = Tensor::from_slice(&ids[start..start + len], (1, len), model.device())?;
        let wanted = start + len > text.from - 1;
        let logits = model.forward(&tokens, &[0], &mut cache, wanted)?;
        if wanted {
            let rows = logits.squeeze(0)?.to_dtype(DType::F32)?.to_vec2::<f32>()?;
            for (offset, row) in rows.iter().enumerate() {
                let position = start + offset;
                if position + 1 < text.from {
                    continue;
                }
                let next = ids[position + 1] as usize;
                let logit = *row
                    .get(next)
                    .ok_or_else(|| Error::Internal(format!("logits of {} tokens for id {next}", row.len())))?;
                out.push(logit - crate::invariant::log_norm(row));
            }
        }
        start += len;
    }
    Ok(out)
}
