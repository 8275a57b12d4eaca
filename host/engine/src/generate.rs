//! Batched generation. A [`Batch`] holds the rows being decoded; requests join it between
//! decode steps (their prompts prefilled together, each prompt once for all its samples, then
//! left-padded to the batch's cache length) and rows leave it when they finish. [`generate`]
//! runs one set of requests through a batch; the batching actor (`actor.rs`) keeps one batch
//! open for requests that arrive over time.

use crate::llama::{KvCache, Model};
use crate::sampling::{Sampler, Sampling};
use crate::tokenizer::{TextStream, Tokenizer};
use crate::{Error, Result};
use candle_core::{DType, Tensor};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet, VecDeque};

/// `n` completions of one prompt.
#[derive(Clone, Debug)]
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
    request.sampling.validate().map_err(Error::Input)?;
    if request.prompt.is_empty() {
        return Err(Error::Input("the prompt is empty".into()));
    }
    let context = model.config().max_position_embeddings;
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

/// One sample being decoded.
struct Row {
    request: RequestId,
    /// Which sample of its request this row is.
    sample: usize,
    sampler: Sampler,
    /// Left-padding positions in the cache before this row's prompt.
    pad: usize,
    tokens: Vec<u32>,
    logprobs: Vec<f32>,
    top_logprobs: Vec<Vec<(u32, f32)>>,
    stream: TextStream,
    text: String,
}

/// A request whose samples are still running.
struct Open {
    sampling: Sampling,
    prompt_len: usize,
    done: Vec<Option<Completion>>,
}

/// A prompt prefilled slice by slice (chunked prefill): its own cache, filled up to `done`
/// positions. It joins the decoding rows once its last slice is computed.
struct Prefilling {
    id: RequestId,
    request: GenerateRequest,
    cache: KvCache,
    done: usize,
    /// Whether it was admitted alone (its prefix is then kept for the next request).
    alone: bool,
}

/// Cache positions a request may come to need: its prompt and every token it may generate,
/// within the model's context.
pub fn extent(request: &GenerateRequest, context: usize) -> usize {
    (request.prompt.len() + request.sampling.max_tokens).min(context)
}

/// Rows decoding together, with their shared KV cache and the logits of their next token.
pub struct Batch<'m> {
    model: &'m Model,
    tokenizer: &'m Tokenizer,
    rows: Vec<Row>,
    cache: KvCache,
    /// `[rows, vocab]`: the distribution each row samples from at the next step.
    logits: Option<Tensor>,
    open: HashMap<RequestId, Open>,
    /// Requests that finished while being admitted (`n = 0`).
    finished: Vec<(RequestId, Vec<Completion>)>,
    /// The last prompt admitted alone and its keys and values, when prefixes are reused
    /// ([`Batch::reuse_prefixes`]).
    prefix: Option<(Vec<u32>, KvCache)>,
    reuse_prefixes: bool,
    /// Prompt positions taken from a kept prefix instead of computed, so far.
    reused: usize,
    /// Prompts longer than this are prefilled in slices of this many positions, one slice
    /// per step, between the running rows' decode steps ([`Batch::prefill_in_slices`]).
    prefill_chunk: Option<usize>,
    /// Long prompts being prefilled slice by slice, first come first served.
    prefilling: VecDeque<Prefilling>,
    /// Cache positions each open request may come to need (see [`extent`]).
    extents: HashMap<RequestId, usize>,
}

/// The shortest shared prefix worth reusing instead of recomputing.
const MIN_PREFIX_REUSE: usize = 16;

/// The longest prefix kept for reuse: a system prompt and a chat preamble, not a whole
/// long document held in memory after its request is gone.
const MAX_KEPT_PREFIX: usize = 1024;

impl<'m> Batch<'m> {
    pub fn new(model: &'m Model, tokenizer: &'m Tokenizer) -> Self {
        Batch {
            model,
            tokenizer,
            rows: Vec::new(),
            cache: model.new_cache(),
            logits: None,
            open: HashMap::new(),
            finished: Vec::new(),
            prefix: None,
            reuse_prefixes: false,
            reused: 0,
            prefill_chunk: None,
            prefilling: VecDeque::new(),
            extents: HashMap::new(),
        }
    }

    /// Prefill prompts longer than `chunk` positions in slices of `chunk`, one slice per
    /// [`step`](Self::step), between the decode steps of the rows already running (as vLLM's
    /// and llama.cpp's servers do): a long prompt neither stalls every other client for its
    /// whole prefill nor computes attention scores over all its positions at once (a slice's
    /// scores are `chunk × prompt` instead of `prompt × prompt`). Off (`None`) by default: a
    /// prompt computed in slices rounds differently from a whole one, and a trainer's
    /// batches must not depend on it.
    pub fn prefill_in_slices(&mut self, chunk: Option<usize>) {
        self.prefill_chunk = chunk.map(|c| c.max(1));
    }

    /// What this batch may come to hold: its rows (with the prompts still being prefilled)
    /// and the longest extent among its requests — cache positions are rows × longest, since
    /// the rows share one left-padded cache. What a server's memory budget counts.
    pub fn load(&self) -> (usize, usize) {
        let rows = self.rows.len() + self.prefilling.iter().map(|p| p.request.n).sum::<usize>();
        (rows, self.extents.values().copied().max().unwrap_or(0))
    }

    /// Reuse the keys and values of the last prompt admitted alone for the next one that
    /// starts like it (a server's requests share their system prompt and chat preamble):
    /// only the rest of the prompt is computed. Off by default: a prefix computed apart
    /// rounds differently from a whole prompt, and a trainer's batches must not depend on
    /// what came before them.
    pub fn reuse_prefixes(&mut self, on: bool) {
        self.reuse_prefixes = on;
        self.prefix = None;
    }

    /// Prompt positions reused from kept prefixes so far.
    pub fn reused_prefix_positions(&self) -> usize {
        self.reused
    }

    /// Forget the kept prefix (the weights changed under it).
    pub fn forget_prefix(&mut self) {
        self.prefix = None;
    }

    /// How much of `prompt` the kept prefix covers, if worth reusing (at least one token is
    /// left to compute: its logits are the next token's).
    fn reusable(&self, prompt: &[u32]) -> Option<usize> {
        let (kept, _) = self.prefix.as_ref()?;
        let common = kept.iter().zip(prompt).take_while(|(a, b)| a == b).count().min(prompt.len() - 1);
        (common >= MIN_PREFIX_REUSE).then_some(common)
    }

    /// Rows decoding now.
    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Nothing left to prefill, to decode or to hand back.
    pub fn is_idle(&self) -> bool {
        self.rows.is_empty() && self.finished.is_empty() && self.prefilling.is_empty()
    }

    /// Cache positions per row, padding included (what one decode step attends over).
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// Prefill `requests` (already validated, ids not in use) and add their samples to the
    /// batch. Each prompt is run once; its samples share its cache rows.
    pub fn admit(&mut self, requests: Vec<(RequestId, GenerateRequest)>) -> Result<()> {
        let mut live = Vec::with_capacity(requests.len());
        for (id, request) in requests {
            if self.open.contains_key(&id) {
                return Err(Error::Input(format!("request id {id} is already in the batch")));
            }
            if request.n == 0 {
                self.finished.push((id, Vec::new()));
            } else {
                live.push((id, request));
            }
        }
        if live.is_empty() {
            return Ok(());
        }
        let context = self.model.config().max_position_embeddings;
        for (id, request) in &live {
            self.extents.insert(*id, extent(request, context));
        }

        let alone = self.reuse_prefixes && live.len() == 1;
        let reused = if alone { self.reusable(&live[0].1.prompt) } else { None };
        if let Some(chunk) = self.prefill_chunk {
            // Prompts with more than a slice left to compute are prefilled slice by slice.
            let (long, short): (Vec<_>, Vec<_>) =
                live.into_iter().partition(|(_, request)| request.prompt.len() - reused.unwrap_or(0) > chunk);
            for (id, request) in long {
                let (cache, done) = match (reused, &self.prefix) {
                    (Some(reused), Some((_, kept))) => {
                        self.reused += reused;
                        (kept.prefix_copy(reused)?, reused)
                    }
                    _ => (self.model.new_cache(), 0),
                };
                self.prefilling.push_back(Prefilling { id, request, cache, done, alone });
            }
            if short.is_empty() {
                return Ok(());
            }
            return self.prefill_whole(short, reused, alone);
        }
        self.prefill_whole(live, reused, alone)
    }

    /// Prefill `live` (each prompt once, together, left-padded to the longest; or, with
    /// `reused`, the one prompt past the kept prefix) and let its rows join.
    fn prefill_whole(
        &mut self,
        live: Vec<(RequestId, GenerateRequest)>,
        reused: Option<usize>,
        alone: bool,
    ) -> Result<()> {
        let device = self.model.device();
        let (logits, cache, prompt_pads) = match (reused, &self.prefix) {
            // Only the part past the kept prefix is computed.
            (Some(reused), Some((_, kept))) => {
                let prompt = &live[0].1.prompt;
                let mut cache = kept.prefix_copy(reused)?;
                self.reused += reused;
                let tokens = Tensor::from_vec(prompt[reused..].to_vec(), (1, prompt.len() - reused), device)?;
                let logits = self.model.forward(&tokens, &[0], &mut cache, false)?;
                (logits, cache, vec![0])
            }
            _ => {
                // Prefill every prompt once, left-padded to the longest.
                let longest = live.iter().map(|(_, r)| r.prompt.len()).max().unwrap_or(0);
                let mut ids = Vec::with_capacity(live.len() * longest);
                let mut prompt_pads = Vec::with_capacity(live.len());
                for (_, request) in &live {
                    let pad = longest - request.prompt.len();
                    ids.extend(std::iter::repeat_n(0u32, pad));
                    ids.extend(&request.prompt);
                    prompt_pads.push(pad);
                }
                let tokens = Tensor::from_vec(ids, (live.len(), longest), device)?;
                let mut cache = self.model.new_cache();
                let logits = self.model.forward(&tokens, &prompt_pads, &mut cache, false)?;
                (logits, cache, prompt_pads)
            }
        };
        if alone {
            self.keep_prefix(&live[0].1.prompt, &cache)?;
        }
        self.join(live, logits, cache, prompt_pads)
    }

    /// Keep (at most [`MAX_KEPT_PREFIX`] positions of) a prompt admitted alone, for the next.
    fn keep_prefix(&mut self, prompt: &[u32], cache: &KvCache) -> Result<()> {
        let kept = cache.len().min(MAX_KEPT_PREFIX);
        self.prefix = Some((prompt[..kept].to_vec(), cache.prefix_copy(kept)?));
        Ok(())
    }

    /// Compute the next slice of the first prompt being prefilled in slices; once its last
    /// slice is done, its rows join the batch.
    fn prefill_slice(&mut self) -> Result<()> {
        let Some(chunk) = self.prefill_chunk else { return Ok(()) };
        let Some(mut prefilling) = self.prefilling.pop_front() else { return Ok(()) };
        let prompt = &prefilling.request.prompt;
        let end = (prefilling.done + chunk).min(prompt.len());
        let tokens =
            Tensor::from_vec(prompt[prefilling.done..end].to_vec(), (1, end - prefilling.done), self.model.device())?;
        let logits = self.model.forward(&tokens, &[0], &mut prefilling.cache, false)?;
        prefilling.done = end;
        if end < prompt.len() {
            self.prefilling.push_front(prefilling);
            return Ok(());
        }
        let Prefilling { id, request, cache, alone, .. } = prefilling;
        if alone {
            self.keep_prefix(&request.prompt, &cache)?;
        }
        self.join(vec![(id, request)], logits, cache, vec![0])
    }

    /// Let prefilled prompts' rows join the batch: `logits` and `cache` hold one row per
    /// prompt, left-padded by `prompt_pads`.
    fn join(
        &mut self,
        live: Vec<(RequestId, GenerateRequest)>,
        logits: Tensor,
        cache: KvCache,
        prompt_pads: Vec<usize>,
    ) -> Result<()> {
        let device = self.model.device();
        // Each prompt's cache row and logits, repeated for its samples.
        let mut source_rows = Vec::new();
        let mut rows = Vec::new();
        for (slot, (id, request)) in live.into_iter().enumerate() {
            for sample in 0..request.n {
                source_rows.push(slot as u32);
                rows.push(Row {
                    request: id,
                    sample,
                    sampler: Sampler::new(&request.sampling, sample as u64),
                    pad: prompt_pads[slot],
                    tokens: Vec::new(),
                    logprobs: Vec::new(),
                    top_logprobs: Vec::new(),
                    stream: TextStream::new(),
                    text: String::new(),
                });
            }
            let open =
                Open { sampling: request.sampling, prompt_len: request.prompt.len(), done: vec![None; request.n] };
            self.open.insert(id, open);
        }
        let index = Tensor::from_vec(source_rows, rows.len(), device)?;
        let mut cache = cache.select_rows(&index)?;
        let logits = logits.index_select(&index, 0)?;

        // Line the newcomers' cache up with the batch's: the shorter side is left-padded.
        let (current, incoming) = (self.cache.len(), cache.len());
        if self.rows.is_empty() {
            self.cache = cache;
            self.logits = Some(logits);
        } else {
            if incoming < current {
                cache = cache.left_pad(current - incoming)?;
                rows.iter_mut().for_each(|r| r.pad += current - incoming);
            } else if current < incoming {
                self.cache = self.cache.left_pad(incoming - current)?;
                self.rows.iter_mut().for_each(|r| r.pad += incoming - current);
            }
            self.cache = self.cache.cat_rows(&cache)?;
            let previous = self.logits.take().ok_or_else(|| Error::Input("batch has rows but no logits".into()))?;
            self.logits = Some(Tensor::cat(&[&previous, &logits], 0)?);
        }
        self.rows.extend(rows);
        Ok(())
    }

    /// Sample one token for every row, retire the rows that finished, and run the others one
    /// position further. Returns the requests all of whose samples have finished.
    /// `on_text(request, sample, piece)` receives text as it is produced (never a split
    /// UTF-8 character, never past a stop string).
    pub fn step(
        &mut self,
        mut on_text: impl FnMut(RequestId, usize, &str),
    ) -> Result<Vec<(RequestId, Vec<Completion>)>> {
        let mut done = std::mem::take(&mut self.finished);
        self.prefill_slice()?;
        let Some(logits) = self.logits.take() else {
            return Ok(done);
        };
        let logits_rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32)?.to_vec2()?;
        let context = self.model.config().max_position_embeddings;
        let eos = self.tokenizer.eos_ids();
        let mut keep = Vec::with_capacity(self.rows.len());
        let mut next = Vec::with_capacity(self.rows.len());
        // Rows sample independently (each has its own generator): in parallel, as a pass of
        // `exp` over the vocabulary per row is a few percent of a decoding step.
        let drawn: Vec<(u32, f32)> =
            self.rows.par_iter_mut().zip(&logits_rows).map(|(row, logits)| row.sampler.sample(logits)).collect();
        for (row, logits) in self.rows.iter_mut().zip(&logits_rows) {
            let k = self.open.get(&row.request).map_or(0, |open| open.sampling.top_logprobs);
            if k > 0 {
                row.top_logprobs.push(crate::sampling::top_logprobs(logits, k));
            }
        }
        for (position, mut row) in std::mem::take(&mut self.rows).into_iter().enumerate() {
            let open = self.open.get_mut(&row.request).ok_or_else(|| Error::Input("row without request".into()))?;
            let (token, logprob) = drawn[position];
            row.tokens.push(token);
            row.logprobs.push(logprob);
            let mut finish = None;
            if !open.sampling.ignore_eos && eos.contains(&token) {
                finish = Some(FinishReason::Stop);
            } else if let Some(piece) = row.stream.push(self.tokenizer, token)? {
                row.text.push_str(&piece);
                if let Some(at) = open.sampling.stop.iter().filter_map(|s| row.text.find(s.as_str())).min() {
                    row.text.truncate(at);
                    finish = Some(FinishReason::Stop);
                } else {
                    on_text(row.request, row.sample, &piece);
                }
            }
            // The row's next position is prompt + generated tokens; it must fit the context.
            if finish.is_none()
                && (row.tokens.len() >= open.sampling.max_tokens || open.prompt_len + row.tokens.len() >= context)
            {
                finish = Some(FinishReason::Length);
            }
            match finish {
                Some(finish) => {
                    open.done[row.sample] = Some(Completion {
                        tokens: row.tokens,
                        logprobs: row.logprobs,
                        top_logprobs: row.top_logprobs,
                        text: row.text,
                        finish,
                        weights_version: 0,
                    });
                    if open.done.iter().all(Option::is_some) {
                        let open = self.open.remove(&row.request).expect("request is open");
                        self.extents.remove(&row.request);
                        done.push((row.request, open.done.into_iter().flatten().collect()));
                    }
                }
                None => {
                    keep.push(position as u32);
                    next.push(token);
                    self.rows.push(row);
                }
            }
        }
        if self.rows.is_empty() {
            self.cache = self.model.new_cache();
            return Ok(done);
        }
        let device = self.model.device();
        if keep.len() != logits_rows.len() {
            self.cache = self.cache.select_rows(&Tensor::from_vec(keep, self.rows.len(), device)?)?;
        }
        self.drop_shared_padding()?;
        let pads: Vec<usize> = self.rows.iter().map(|r| r.pad).collect();
        let tokens = Tensor::from_vec(next, (self.rows.len(), 1), device)?;
        self.logits = Some(self.model.forward(&tokens, &pads, &mut self.cache, false)?);
        Ok(done)
    }

    /// Padding every row has at its front is dead weight once the rows that needed no
    /// padding have left: drop it.
    fn drop_shared_padding(&mut self) -> Result<()> {
        let common = self.rows.iter().map(|r| r.pad).min().unwrap_or(0);
        if common > 0 {
            self.cache = self.cache.drop_front(common)?;
            self.rows.iter_mut().for_each(|r| r.pad -= common);
        }
        Ok(())
    }

    /// Drop every row and open request (after an error), returning the ids that were open.
    pub fn abandon(&mut self) -> Vec<RequestId> {
        self.rows.clear();
        self.logits = None;
        self.cache = self.model.new_cache();
        self.extents.clear();
        let mut ids: Vec<RequestId> = self.open.drain().map(|(id, _)| id).collect();
        ids.extend(self.finished.drain(..).map(|(id, _)| id));
        ids.extend(self.prefilling.drain(..).map(|p| p.id));
        ids
    }

    /// Drop the rows of `cancelled` requests (their callers went away), wherever they are:
    /// decoding, waiting for a prefill slice, or finished and not yet handed back.
    pub fn cancel(&mut self, cancelled: &HashSet<RequestId>) -> Result<()> {
        if cancelled.is_empty() {
            return Ok(());
        }
        self.prefilling.retain(|p| !cancelled.contains(&p.id));
        self.finished.retain(|(id, _)| !cancelled.contains(id));
        self.open.retain(|id, _| !cancelled.contains(id));
        self.extents.retain(|id, _| !cancelled.contains(id));
        let keep: Vec<u32> =
            (0..self.rows.len() as u32).filter(|&i| !cancelled.contains(&self.rows[i as usize].request)).collect();
        if keep.len() == self.rows.len() {
            return Ok(());
        }
        self.rows.retain(|row| !cancelled.contains(&row.request));
        if self.rows.is_empty() {
            self.logits = None;
            self.cache = self.model.new_cache();
            return Ok(());
        }
        let index = Tensor::from_vec(keep, self.rows.len(), self.model.device())?;
        self.cache = self.cache.select_rows(&index)?;
        self.logits = match self.logits.take() {
            Some(logits) => Some(logits.index_select(&index, 0)?),
            None => None,
        };
        self.drop_shared_padding()?;
        Ok(())
    }
}

/// Generate the completions of every request in one batch. `on_text(request, sample, piece)`
/// receives text as it is produced.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    requests: &[GenerateRequest],
    mut on_text: impl FnMut(usize, usize, &str),
) -> Result<Vec<Vec<Completion>>> {
    for (i, request) in requests.iter().enumerate() {
        validate(model, request).map_err(|e| match e {
            Error::Input(message) => Error::Input(format!("request {i}: {message}")),
            other => other,
        })?;
    }
    let mut batch = Batch::new(model, tokenizer);
    batch.admit(requests.iter().cloned().enumerate().map(|(i, r)| (i as RequestId, r)).collect())?;
    let mut results: Vec<Vec<Completion>> = vec![Vec::new(); requests.len()];
    while !batch.is_idle() {
        for (id, completions) in batch.step(|id, sample, piece| on_text(id as usize, sample, piece))? {
            results[id as usize] = completions;
        }
    }
    Ok(results)
}
