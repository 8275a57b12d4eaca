//! Batched generation: ragged prompts share a batch (left-padded); the samples of one prompt
//! share its prefill; finished rows leave the batch between decode steps.

use crate::llama::Model;
use crate::sampling::{Sampler, Sampling};
use crate::tokenizer::{TextStream, Tokenizer};
use crate::{Error, Result};
use candle_core::{DType, Tensor};

/// `n` completions of one prompt.
#[derive(Clone, Debug)]
pub struct GenerateRequest {
    pub prompt: Vec<u32>,
    pub n: usize,
    pub sampling: Sampling,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence token or a stop string.
    Stop,
    /// `max_tokens`, or the model's context, was reached.
    Length,
}

#[derive(Clone, Debug)]
pub struct Completion {
    /// Generated token ids (the EOS token included when generation stopped on it).
    pub tokens: Vec<u32>,
    /// Log-probability of each generated token under the model at temperature 1.
    pub logprobs: Vec<f32>,
    /// The text, without EOS or the stop string.
    pub text: String,
    pub finish: FinishReason,
}

struct Row {
    request: usize,
    /// Which sample of its request this row is.
    sample: usize,
    sampler: Sampler,
    pad: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    stream: TextStream,
    text: String,
    finish: Option<FinishReason>,
}

/// Generate the completions of every request. `on_text(request, sample, piece)` receives text
/// as it is produced (never a split UTF-8 character).
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    requests: &[GenerateRequest],
    mut on_text: impl FnMut(usize, usize, &str),
) -> Result<Vec<Vec<Completion>>> {
    for (i, request) in requests.iter().enumerate() {
        request.sampling.validate().map_err(|m| Error::Input(format!("request {i}: {m}")))?;
        if request.prompt.is_empty() {
            return Err(Error::Input(format!("request {i}: the prompt is empty")));
        }
        let context = model.config().max_position_embeddings;
        if request.prompt.len() >= context {
            return Err(Error::Input(format!(
                "request {i}: the prompt has {} tokens, the model's context is {context}",
                request.prompt.len()
            )));
        }
    }
    let live: Vec<usize> = (0..requests.len()).filter(|&i| requests[i].n > 0).collect();
    let mut results: Vec<Vec<Completion>> = vec![Vec::new(); requests.len()];
    if live.is_empty() {
        return Ok(results);
    }
    let device = model.device();

    // Prefill every distinct prompt once, left-padded to the longest.
    let longest = live.iter().map(|&i| requests[i].prompt.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(live.len() * longest);
    let mut prompt_pads = Vec::with_capacity(live.len());
    for &i in &live {
        let prompt = &requests[i].prompt;
        let pad = longest - prompt.len();
        ids.extend(std::iter::repeat_n(0u32, pad));
        ids.extend(prompt);
        prompt_pads.push(pad);
    }
    let tokens = Tensor::from_vec(ids, (live.len(), longest), device)?;
    let mut cache = model.new_cache();
    let logits = model.forward(&tokens, &prompt_pads, &mut cache, false)?;

    // Each prompt's cache row and logits, repeated for its samples.
    let mut source_rows = Vec::new();
    let mut rows = Vec::new();
    for (slot, &i) in live.iter().enumerate() {
        for sample in 0..requests[i].n {
            source_rows.push(slot as u32);
            rows.push(Row {
                request: i,
                sample,
                sampler: Sampler::new(&requests[i].sampling, sample as u64),
                pad: prompt_pads[slot],
                tokens: Vec::new(),
                logprobs: Vec::new(),
                stream: TextStream::new(),
                text: String::new(),
                finish: None,
            });
        }
    }
    let index = Tensor::from_vec(source_rows, rows.len(), device)?;
    let mut cache = cache.select_rows(&index)?;
    let mut logits = logits.index_select(&index, 0)?;
    let mut active: Vec<usize> = (0..rows.len()).collect();
    let eos = tokenizer.eos_ids().to_vec();
    let context = model.config().max_position_embeddings;

    loop {
        let logits_rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32)?.to_vec2()?;
        let mut next = Vec::with_capacity(active.len());
        for (position, &r) in active.iter().enumerate() {
            let row = &mut rows[r];
            let (token, logprob) = row.sampler.sample(&logits_rows[position]);
            row.tokens.push(token);
            row.logprobs.push(logprob);
            if eos.contains(&token) {
                row.finish = Some(FinishReason::Stop);
            } else if let Some(piece) = row.stream.push(tokenizer, token)? {
                row.text.push_str(&piece);
                let settings = &requests[row.request].sampling;
                if let Some(at) = settings.stop.iter().filter_map(|s| row.text.find(s.as_str())).min() {
                    row.text.truncate(at);
                    row.finish = Some(FinishReason::Stop);
                } else {
                    on_text(row.request, row.sample, &piece);
                }
            }
            let settings = &requests[row.request].sampling;
            if row.finish.is_none() && (row.tokens.len() >= settings.max_tokens || cache.len() + 1 >= context) {
                row.finish = Some(FinishReason::Length);
            }
            next.push(token);
        }
        // Finished rows leave the batch.
        let keep: Vec<usize> = (0..active.len()).filter(|&p| rows[active[p]].finish.is_none()).collect();
        if keep.is_empty() {
            break;
        }
        let mut pads = Vec::with_capacity(keep.len());
        let mut inputs = Vec::with_capacity(keep.len());
        if keep.len() != active.len() {
            let index = Tensor::from_vec(keep.iter().map(|&p| p as u32).collect::<Vec<_>>(), keep.len(), device)?;
            cache = cache.select_rows(&index)?;
        }
        active = keep.iter().map(|&p| active[p]).collect();
        for (&r, &p) in active.iter().zip(&keep) {
            pads.push(rows[r].pad);
            inputs.push(next[p]);
        }
        let tokens = Tensor::from_vec(inputs, (active.len(), 1), device)?;
        logits = model.forward(&tokens, &pads, &mut cache, false)?;
    }

    for row in rows {
        results[row.request].push(Completion {
            tokens: row.tokens,
            logprobs: row.logprobs,
            text: row.text,
            finish: row.finish.unwrap_or(FinishReason::Length),
        });
    }
    Ok(results)
}
