//! Batched generation. A [`Batch`] holds the rows being decoded; requests join it between
//! decode steps (their prompts prefilled together, each prompt once for all its samples, then
//! left-padded to the batch's cache length) and rows leave it when they finish. [`generate`]
//! runs one set of requests through a batch; the batching actor (`actor.rs`) keeps one batch
//! open for requests that arrive over time.

use crate::llama::{KvCache, Model};
use crate::prefix_cache::{BLOCK, PrefixCache, PrefixStats};
use crate::sampling::{Sampler, Sampling};
use crate::tokenizer::{TextStream, Tokenizer};
use crate::{Error, Result};
use candle_core::{DType, Tensor};
use rayon::prelude::*;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

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
    request.sampling.validate().map_err(Error::Input)?;
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
    /// Kept for the prefix cache: a finished row's prompt and tokens are kept there.
    prompt: Vec<u32>,
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
    /// Keys and values of earlier prompts and completions ([`Batch::use_prefix_cache`]).
    prefix_cache: Option<Arc<Mutex<PrefixCache>>>,
    /// Prompt positions taken from the prefix cache, and computed.
    stats: Arc<PrefixStats>,
    /// Prompts longer than this are prefilled in slices of this many positions, one slice
    /// per step, between the running rows' decode steps ([`Batch::prefill_in_slices`]).
    prefill_chunk: Option<usize>,
    /// Long prompts being prefilled slice by slice, first come first served.
    prefilling: VecDeque<Prefilling>,
    /// Cache positions each open request may come to need (see [`extent`]).
    extents: HashMap<RequestId, usize>,
    /// Draw tokens where the logits are ([`Batch::sample_on_device`]).
    device_sampling: bool,
}

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
            prefix_cache: None,
            stats: Arc::default(),
            prefill_chunk: None,
            prefilling: VecDeque::new(),
            extents: HashMap::new(),
            device_sampling: false,
        }
    }

    /// Draw each step's tokens where the logits are (`device_sampling`): only a token and a
    /// log-probability per row come back to the host, not the rows' logits. A step with a
    /// row that cuts its distribution (top-k, top-p, min-p) or asks for `top_logprobs`
    /// samples on the host as before. Off by default: on the CPU the host sampler is the
    /// same memory, and on a GPU its figure is still to be measured (issue 45).
    pub fn sample_on_device(&mut self, on: bool) {
        self.device_sampling = on;
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

    /// Take prompts' keys and values from `cache` where an earlier prompt or completion
    /// covered their start (whole blocks), computing only the rest, and keep every prompt's
    /// and finished row's blocks there for later requests. Prompts admitted together that
    /// are equal are computed once whether or not there is a cache. Off (`None`) by default:
    /// a prefix computed in another batch rounds differently from a whole prompt (by float
    /// summation order), so results then depend on what came before.
    pub fn use_prefix_cache(&mut self, cache: Option<Arc<Mutex<PrefixCache>>>) {
        self.prefix_cache = cache;
    }

    /// Count prompt positions (taken from the cache, computed) into `stats`.
    pub fn count_into(&mut self, stats: Arc<PrefixStats>) {
        self.stats = stats;
    }

    /// The cached blocks that cover the start of `prompt` (at least its last token is left
    /// to compute: its logits are the next token's).
    fn cached_blocks(&self, prompt: &[u32]) -> Vec<u64> {
        match &self.prefix_cache {
            Some(cache) => lock(cache).lookup(prompt, prompt.len().saturating_sub(1)),
            None => Vec::new(),
        }
    }

    /// A one-row cache of the first `len` positions of the blocks `keys`.
    fn cache_of(&self, keys: &[u64], len: usize) -> Result<KvCache> {
        let Some(cache) = &self.prefix_cache else { return Ok(self.model.new_cache()) };
        if len == 0 {
            return Ok(self.model.new_cache());
        }
        let span = lock(cache).assemble(&keys[..len.div_ceil(BLOCK)])?;
        KvCache::from_span(&span, len)
    }

    fn keep(&self, tokens: &[u32], cache: &KvCache, row: usize, first: usize) -> Result<()> {
        keep_blocks(self.prefix_cache.as_ref(), tokens, cache, row, first)
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
        let context = self.model.config().context();
        for (id, request) in &live {
            self.extents.insert(*id, extent(request, context));
        }

        self.prime_shared_prefixes(live.iter().map(|(_, request)| request.prompt.as_slice()))?;
        let mut live: Vec<(RequestId, GenerateRequest, Vec<u64>)> = live
            .into_iter()
            .map(|(id, request)| {
                let keys = self.cached_blocks(&request.prompt);
                (id, request, keys)
            })
            .collect();
        if let Some(chunk) = self.prefill_chunk {
            // Prompts with more than a slice left to compute are prefilled slice by slice.
            let (long, short): (Vec<_>, Vec<_>) =
                live.into_iter().partition(|(_, request, keys)| request.prompt.len() - keys.len() * BLOCK > chunk);
            for (id, request, keys) in long {
                let done = keys.len() * BLOCK;
                let cache = self.cache_of(&keys, done)?;
                self.stats.count(done, 0);
                self.prefilling.push_back(Prefilling { id, request, cache, done });
            }
            live = short;
        }
        if live.is_empty() {
            return Ok(());
        }
        // Equal prompts are computed once; the rest in two passes: those the cache covers
        // in part (only their uncovered ends computed), and those it does not.
        let mut unique: Vec<(usize, &[u64])> = Vec::new();
        let mut slot_of = Vec::with_capacity(live.len());
        for (i, (_, request, keys)) in live.iter().enumerate() {
            match unique.iter().position(|&(j, _)| live[j].1.prompt == request.prompt) {
                Some(slot) => slot_of.push(slot),
                None => {
                    slot_of.push(unique.len());
                    unique.push((i, keys.as_slice()));
                }
            }
        }
        let mut passes: Vec<Vec<usize>> = vec![Vec::new(), Vec::new()];
        for (slot, (_, keys)) in unique.iter().enumerate() {
            passes[usize::from(keys.is_empty())].push(slot);
        }
        let prompts: Vec<(&[u32], &[u64])> =
            unique.iter().map(|&(i, keys)| (live[i].1.prompt.as_slice(), keys)).collect();
        let mut computed = Vec::new();
        for pass in passes.into_iter().filter(|pass| !pass.is_empty()) {
            let rows: Vec<(&[u32], &[u64])> = pass.iter().map(|&slot| prompts[slot]).collect();
            computed.push((pass, self.prefill_rows(&rows)?));
        }
        let mut live: Vec<Option<(RequestId, GenerateRequest)>> =
            live.into_iter().map(|(id, request, _)| Some((id, request))).collect();
        for (pass, (logits, cache, pads)) in computed {
            // The requests of this pass's prompts, each with its prompt's row.
            let mut joining = Vec::new();
            let mut rows = Vec::new();
            for (i, &slot) in slot_of.iter().enumerate() {
                if let Some(row) = pass.iter().position(|&s| s == slot) {
                    joining.push(live[i].take().expect("each request joins once"));
                    rows.push(row);
                }
            }
            self.join(joining, rows, logits, cache, pads)?;
        }
        Ok(())
    }

    /// With a prefix cache: the whole blocks that several prompts admitted together start with
    /// (a few-shot preamble, a system prompt), and that the cache does not hold yet, are
    /// computed once, alone, and kept; the prompts then take them from the cache. Prompts
    /// are grouped by their first block; each group's common start counts up to the
    /// shortest member's last token (which must be computed), and, when prompts are
    /// prefilled in slices, up to one slice.
    fn prime_shared_prefixes<'p>(&mut self, prompts: impl Iterator<Item = &'p [u32]>) -> Result<()> {
        if self.prefix_cache.is_none() {
            return Ok(());
        }
        let mut by_start: Vec<(&[u32], Vec<&[u32]>)> = Vec::new();
        for prompt in prompts.filter(|p| p.len() > BLOCK) {
            match by_start.iter_mut().find(|(start, _)| *start == &prompt[..BLOCK]) {
                Some((_, members)) => members.push(prompt),
                None => by_start.push((&prompt[..BLOCK], vec![prompt])),
            }
        }
        for (_, members) in by_start.iter().filter(|(_, members)| members.len() > 1) {
            let first = members[0];
            let shared = members.iter().fold(first.len() - 1, |n, p| {
                n.min(p.len() - 1).min(first.iter().zip(p.iter()).take_while(|(a, b)| a == b).count())
            });
            // Computed in one pass, alone: with slices, at most a slice's worth (a long shared
            // start must not hold every other request, nor take whole-prompt attention).
            let shared = match self.prefill_chunk {
                Some(chunk) => shared.min(chunk.max(BLOCK)),
                None => shared,
            };
            let shared = shared / BLOCK * BLOCK;
            if shared < BLOCK || self.cached_blocks(&first[..=shared]).len() * BLOCK >= shared {
                continue;
            }
            let prefix = &first[..shared];
            let mut cache = self.model.new_cache();
            let tokens = Tensor::from_vec(prefix.to_vec(), (1, shared), self.model.device())?;
            self.model.forward(&tokens, &[0], &mut cache, false)?;
            self.stats.count(0, shared);
            self.keep(prefix, &cache, 0, 0)?;
        }
        Ok(())
    }

    /// Prefill `prompts` together, each past the part of its start that its cached blocks
    /// cover, and keep their blocks: returns the last position's logits, the cache (one row
    /// per prompt, left-padded) and each row's padding. The rows line up by computing the
    /// same number of tokens `T` each — the longest uncovered end — so a row whose
    /// uncovered end is shorter takes fewer cached positions (recomputing the rest of its
    /// cached start), and one shorter than `T` is left-padded as an uncached prompt is.
    fn prefill_rows(&mut self, prompts: &[(&[u32], &[u64])]) -> Result<(Tensor, KvCache, Vec<usize>)> {
        let device = self.model.device();
        let width = prompts.iter().map(|(p, keys)| p.len() - keys.len() * BLOCK).max().unwrap_or(0);
        let taken: Vec<usize> = prompts.iter().map(|(p, _)| p.len().saturating_sub(width)).collect();
        let past = taken.iter().copied().max().unwrap_or(0);
        let mut cache = self.model.new_cache();
        if past > 0 {
            let cached: Vec<Option<KvCache>> = prompts
                .iter()
                .zip(&taken)
                .map(|((_, keys), &take)| (take > 0).then(|| self.cache_of(keys, take)).transpose())
                .collect::<Result<_>>()?;
            let template = cached.iter().flatten().next().expect("some row takes cached positions");
            let mut rows = Vec::with_capacity(prompts.len());
            for (row, &take) in cached.iter().zip(&taken) {
                rows.push(match row {
                    Some(row) => row.left_pad(past - take)?,
                    None => template.zeros_like(past)?,
                });
            }
            let mut rows = rows.into_iter();
            cache = rows.next().expect("at least one row");
            for row in rows {
                cache = cache.cat_rows(&row)?;
            }
        }
        let mut ids = Vec::with_capacity(prompts.len() * width);
        let mut pads = Vec::with_capacity(prompts.len());
        for ((prompt, _), &take) in prompts.iter().zip(&taken) {
            let rest = &prompt[take..];
            let pad = width - rest.len();
            ids.extend(std::iter::repeat_n(0u32, pad));
            ids.extend(rest);
            pads.push(past - take + pad);
            self.stats.count(take, rest.len());
        }
        let tokens = Tensor::from_vec(ids, (prompts.len(), width), device)?;
        let logits = self.model.forward(&tokens, &pads, &mut cache, false)?;
        for (row, ((prompt, _), &pad)) in prompts.iter().zip(&pads).enumerate() {
            self.keep(prompt, &cache, row, pad)?;
        }
        Ok((logits, cache, pads))
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
        self.stats.count(0, end - prefilling.done);
        prefilling.done = end;
        if end < prompt.len() {
            self.prefilling.push_front(prefilling);
            return Ok(());
        }
        let Prefilling { id, request, cache, .. } = prefilling;
        self.keep(&request.prompt, &cache, 0, 0)?;
        self.join(vec![(id, request)], vec![0], logits, cache, vec![0])
    }

    /// Let prefilled prompts' rows join the batch: `logits` and `cache` hold one row per
    /// prompt, left-padded by `prompt_pads`; request `i` of `live` takes row `slots[i]`.
    fn join(
        &mut self,
        live: Vec<(RequestId, GenerateRequest)>,
        slots: Vec<usize>,
        logits: Tensor,
        cache: KvCache,
        prompt_pads: Vec<usize>,
    ) -> Result<()> {
        let device = self.model.device();
        // Each prompt's cache row and logits, repeated for its samples.
        let mut source_rows = Vec::new();
        let mut rows = Vec::new();
        for ((id, request), slot) in live.into_iter().zip(slots) {
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
            let open = Open {
                sampling: request.sampling,
                prompt_len: request.prompt.len(),
                prompt: if self.prefix_cache.is_some() { request.prompt } else { Vec::new() },
                done: vec![None; request.n],
            };
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
        let drawn = self.draw(&logits)?;
        let context = self.model.config().context();
        let eos = self.tokenizer.eos_ids();
        let mut keep = Vec::with_capacity(self.rows.len());
        let mut next = Vec::with_capacity(self.rows.len());
        let rows_before = self.rows.len();
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
                    if self.prefix_cache.is_some() {
                        // The row's prompt and all its tokens but the last (never run) are in
                        // the cache: kept for a next turn that extends them.
                        let mut sequence = open.prompt.clone();
                        sequence.extend(&row.tokens[..row.tokens.len() - 1]);
                        keep_blocks(self.prefix_cache.as_ref(), &sequence, &self.cache, position, row.pad)?;
                    }
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
        if keep.len() != rows_before {
            self.cache = self.cache.select_rows(&Tensor::from_vec(keep, self.rows.len(), device)?)?;
        }
        self.drop_shared_padding()?;
        let pads: Vec<usize> = self.rows.iter().map(|r| r.pad).collect();
        let tokens = Tensor::from_vec(next, (self.rows.len(), 1), device)?;
        self.logits = Some(self.model.forward(&tokens, &pads, &mut self.cache, false)?);
        Ok(done)
    }

    /// Each row's next token and its log-probability, drawn from `logits` (`[rows, vocab]`)
    /// on the device when [`Batch::sample_on_device`] allows this step, else on the host
    /// (with any `top_logprobs` asked for). Non-finite logits (weights that overflow, a
    /// config whose numbers break the maths) are an error, never an answer: they would
    /// sample token 0 for ever with a log-prob of NaN.
    fn draw(&mut self, logits: &Tensor) -> Result<Vec<(u32, f32)>> {
        let non_finite = || {
            Error::Generation(
                "the model's logits are NaN or infinite: its weights or config give non-finite values, so nothing it \
                 samples means anything"
                    .into(),
            )
        };
        let host_only = self.rows.iter().any(|row| {
            let sampler = row.sampler.settings();
            sampler.top_logprobs > 0 || (sampler.temperature > 0.0 && !sampler.unfiltered())
        });
        if self.device_sampling && !host_only {
            let logits = logits.to_dtype(DType::F32)?;
            // x − x is 0 for every finite x and NaN for NaN and ±∞: one number comes back.
            if !(logits.clone() - &logits)?.sum_all()?.to_scalar::<f32>()?.is_finite() {
                return Err(non_finite());
            }
            let draws: Vec<crate::device_sampling::Draw> = self
                .rows
                .iter_mut()
                .map(|row| crate::device_sampling::Draw {
                    temperature: row.sampler.settings().temperature,
                    uniform: row.sampler.next_uniform(),
                })
                .collect();
            let (tokens, logprobs) = crate::device_sampling::sample_rows(&logits, &draws)?;
            return Ok(tokens.into_iter().zip(logprobs).collect());
        }
        let logits_rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32)?.to_vec2()?;
        if logits_rows.par_iter().any(|row| row.iter().any(|x| x.is_nan() || *x == f32::INFINITY)) {
            return Err(non_finite());
        }
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
        Ok(drawn)
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

/// Keep `tokens`' whole blocks in the prefix cache (if any), from row `row` of `cache`,
/// whose position 0 is at `first`.
fn keep_blocks(
    prefix_cache: Option<&Arc<Mutex<PrefixCache>>>,
    tokens: &[u32],
    cache: &KvCache,
    row: usize,
    first: usize,
) -> Result<()> {
    let Some(prefix_cache) = prefix_cache else { return Ok(()) };
    lock(prefix_cache).insert(tokens, |start, len| cache.row_span(row, first + start, len))
}

/// The prefix cache, even if a thread panicked holding it (its blocks are whole: a block
/// goes in only once copied).
fn lock(cache: &Mutex<PrefixCache>) -> std::sync::MutexGuard<'_, PrefixCache> {
    cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Generate the completions of every request in one batch. `on_text(request, sample, piece)`
/// receives text as it is produced.
pub fn generate(
    model: &Model,
    tokenizer: &Tokenizer,
    requests: &[GenerateRequest],
    on_text: impl FnMut(usize, usize, &str),
) -> Result<Vec<Vec<Completion>>> {
    generate_with(model, tokenizer, requests, false, on_text)
}

/// [`generate`], drawing tokens where the logits are when `device_sampling`
/// ([`Batch::sample_on_device`]).
pub fn generate_with(
    model: &Model,
    tokenizer: &Tokenizer,
    requests: &[GenerateRequest],
    device_sampling: bool,
    mut on_text: impl FnMut(usize, usize, &str),
) -> Result<Vec<Vec<Completion>>> {
    for (i, request) in requests.iter().enumerate() {
        validate(model, request).map_err(|e| match e {
            Error::Input(message) => Error::Input(format!("request {i}: {message}")),
            other => other,
        })?;
    }
    let mut batch = Batch::new(model, tokenizer);
    batch.sample_on_device(device_sampling);
    batch.admit(requests.iter().cloned().enumerate().map(|(i, r)| (i as RequestId, r)).collect())?;
    let mut results: Vec<Vec<Completion>> = vec![Vec::new(); requests.len()];
    while !batch.is_idle() {
        for (id, completions) in batch.step(|id, sample, piece| on_text(id as usize, sample, piece))? {
            results[id as usize] = completions;
        }
    }
    Ok(results)
}
