//! The executor, the engine loop's second part: given the rows the scheduler let in, it runs
//! the model over them — prefills (prompts equal among those joining computed once, their
//! cached starts taken from the prefix cache), one decode step per turn over every running
//! row — and draws each row's next token where the logits are or on the host
//! ([`Executor::sample`]). It owns everything that lives on the device: the rows' key/value
//! cache, their pending logits, their padding and samplers.
//!
//! It knows nothing of text, stop strings or callers: the output processor (`output.rs`)
//! decides from the drawn tokens which rows finish, and tells [`Executor::advance`].

use crate::llama::{KvCache, Model};
use crate::output::Drawn;
use crate::prefix_cache::{BLOCK, PrefixCache, PrefixStats};
use crate::request::{GenerateRequest, RequestId};
use crate::sampling::Sampler;
use crate::{Error, Result};
use candle_core::{DType, Tensor};
use rayon::prelude::*;
use std::sync::{Arc, Mutex};

/// One row's state on the device side.
struct Row {
    sampler: Sampler,
    /// Its row of the cache's buffers. Where the model decodes rows in any slots
    /// ([`Model::decodes_in_slots`]: the CPU's kernels), a finished row leaves its slot
    /// behind — nothing is copied — until half the slots are left ([`Executor::compact`]);
    /// elsewhere the rows are always the buffers' rows, in order.
    slot: usize,
    /// Left-padding positions in the cache before this row's prompt.
    pad: usize,
    /// With a prefix cache: the tokens whose keys and values the row holds (its prompt, then
    /// every drawn token run so far), kept there when it finishes. Empty without one.
    sequence: Vec<u32>,
}

/// A prompt prefilled slice by slice (chunked prefill): its own cache, filled up to `done`
/// positions. It joins the decoding rows once its last slice is computed.
pub struct Prefilling {
    pub id: RequestId,
    pub request: GenerateRequest,
    cache: KvCache,
    done: usize,
}

/// Rows decoding together: their shared, left-padded key/value cache and the logits of
/// their next token.
pub struct Executor<'m> {
    model: &'m Model,
    rows: Vec<Row>,
    cache: KvCache,
    /// How many times rows that left were dropped by copying the others into new buffers.
    compactions: u64,
    /// `[rows, vocab]`: the distribution each row samples from at the next step.
    logits: Option<Tensor>,
    /// Keys and values of earlier prompts and completions.
    prefix_cache: Option<Arc<Mutex<PrefixCache>>>,
    /// Prompt positions taken from the prefix cache, and computed.
    stats: Arc<PrefixStats>,
    /// Draw tokens where the logits are.
    device_sampling: bool,
}

impl<'m> Executor<'m> {
    pub fn new(model: &'m Model) -> Self {
        Executor {
            model,
            rows: Vec::new(),
            cache: model.new_cache(),
            compactions: 0,
            logits: None,
            prefix_cache: None,
            stats: Arc::default(),
            device_sampling: false,
        }
    }

    pub fn model(&self) -> &'m Model {
        self.model
    }

    pub fn sample_on_device(&mut self, on: bool) {
        self.device_sampling = on;
    }

    pub fn use_prefix_cache(&mut self, cache: Option<Arc<Mutex<PrefixCache>>>) {
        self.prefix_cache = cache;
    }

    pub fn count_into(&mut self, stats: Arc<PrefixStats>) {
        self.stats = stats;
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// Rows the cache's buffers hold: the running ones and the slots finished rows left.
    pub fn rows_held(&self) -> usize {
        self.cache.rows().unwrap_or(0).max(self.rows.len())
    }

    /// Cache positions per row, padding included (what one decode step attends over).
    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// The cached blocks that cover the start of `prompt` (at least its last token is left
    /// to compute: its logits are the next token's).
    pub fn cached_blocks(&self, prompt: &[u32]) -> Vec<u64> {
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

    /// With a prefix cache: the whole blocks that several prompts admitted together start with
    /// (a few-shot preamble, a system prompt), and that the cache does not hold yet, are
    /// computed once, alone, and kept; the prompts then take them from the cache. Prompts
    /// are grouped by their first block; each group's common start counts up to the
    /// shortest member's last token (which must be computed), and, when prompts are
    /// prefilled in slices (`chunk`), up to one slice.
    pub fn prime_shared_prefixes<'p>(
        &mut self,
        prompts: impl Iterator<Item = &'p [u32]>,
        chunk: Option<usize>,
    ) -> Result<()> {
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
            let shared = match chunk {
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

    /// Prefill `live` (each with the cached blocks that cover its start) and add their samples'
    /// rows to the batch. Equal prompts are computed once; the rest in two passes: those the
    /// cache covers in part (only their uncovered ends computed), and those it does not.
    /// Returns the requests in the order their rows joined (the output processor's rows
    /// must follow the same order).
    pub fn prefill(
        &mut self,
        live: Vec<(RequestId, GenerateRequest, Vec<u64>)>,
    ) -> Result<Vec<(RequestId, GenerateRequest)>> {
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
        let mut joined = Vec::new();
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
            self.join(&joining, rows, logits, cache, pads)?;
            joined.extend(joining);
        }
        Ok(joined)
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

    /// A prompt to be prefilled slice by slice, starting past its cached blocks `keys`.
    pub fn start_slices(&self, id: RequestId, request: GenerateRequest, keys: &[u64]) -> Result<Prefilling> {
        let done = keys.len() * BLOCK;
        let cache = self.cache_of(keys, done)?;
        self.stats.count(done, 0);
        Ok(Prefilling { id, request, cache, done })
    }

    /// Compute `prefilling`'s next slice of at most `chunk` positions. Once its last slice
    /// is done its rows join the batch, and its request is given back (`Err` holds a prompt
    /// with slices left).
    pub fn prefill_slice(
        &mut self,
        mut prefilling: Prefilling,
        chunk: usize,
    ) -> Result<std::result::Result<(RequestId, GenerateRequest), Prefilling>> {
        let prompt = &prefilling.request.prompt;
        let end = (prefilling.done + chunk).min(prompt.len());
        let tokens =
            Tensor::from_vec(prompt[prefilling.done..end].to_vec(), (1, end - prefilling.done), self.model.device())?;
        let logits = self.model.forward(&tokens, &[0], &mut prefilling.cache, false)?;
        self.stats.count(0, end - prefilling.done);
        prefilling.done = end;
        if end < prompt.len() {
            return Ok(Err(prefilling));
        }
        let Prefilling { id, request, cache, .. } = prefilling;
        self.keep(&request.prompt, &cache, 0, 0)?;
        let joining = vec![(id, request)];
        self.join(&joining, vec![0], logits, cache, vec![0])?;
        Ok(Ok(joining.into_iter().next().expect("one request")))
    }

    /// Let prefilled prompts' rows join the batch: `logits` and `cache` hold one row per
    /// prompt, left-padded by `prompt_pads`; request `i` of `live` takes row `prompt_rows[i]`.
    fn join(
        &mut self,
        live: &[(RequestId, GenerateRequest)],
        prompt_rows: Vec<usize>,
        logits: Tensor,
        cache: KvCache,
        prompt_pads: Vec<usize>,
    ) -> Result<()> {
        let device = self.model.device();
        // The newcomers' rows go after the batch's, which must be the buffers' rows in order.
        self.compact()?;
        // Each prompt's cache row and logits, repeated for its samples.
        let mut source_rows = Vec::new();
        let mut rows = Vec::new();
        for ((_, request), prompt_row) in live.iter().zip(prompt_rows) {
            for sample in 0..request.n {
                source_rows.push(prompt_row as u32);
                rows.push(Row {
                    sampler: Sampler::new(&request.sampling, sample as u64),
                    slot: self.rows.len() + rows.len(),
                    pad: prompt_pads[prompt_row],
                    sequence: if self.prefix_cache.is_some() { request.prompt.clone() } else { Vec::new() },
                });
            }
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

    /// Each row's next token and its log-probability (with the most likely tokens for a row
    /// that asks for them), drawn from the pending logits on the device when
    /// [`sample_on_device`](Self::sample_on_device) allows this step, else on the host.
    /// `None`: no logits pending (no row, or a step already drawn). Non-finite logits
    /// (weights that overflow, a config whose numbers break the maths) are an error, never
    /// an answer: they would sample token 0 for ever with a log-prob of NaN.
    pub fn sample(&mut self) -> Result<Option<Vec<Drawn>>> {
        let Some(logits) = self.logits.take() else { return Ok(None) };
        let non_finite = || {
            Error::Generation(
                "the model's logits are NaN or infinite: its weights or config give non-finite values, so nothing it \
                 samples means anything"
                    .into(),
            )
        };
        let host_only = self.rows.iter().any(|slot| {
            let sampler = slot.sampler.settings();
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
                .map(|slot| crate::device_sampling::Draw {
                    temperature: slot.sampler.settings().temperature,
                    uniform: slot.sampler.next_uniform(),
                })
                .collect();
            let (tokens, logprobs) = crate::device_sampling::sample_rows(&logits, &draws)?;
            let drawn = tokens.into_iter().zip(logprobs).map(|(token, logprob)| Drawn { token, logprob, top: None });
            return Ok(Some(drawn.collect()));
        }
        let logits_rows: Vec<Vec<f32>> = logits.to_dtype(DType::F32)?.to_vec2()?;
        if logits_rows.par_iter().any(|row| row.iter().any(|x| x.is_nan() || *x == f32::INFINITY)) {
            return Err(non_finite());
        }
        // Rows sample independently (each has its own generator): in parallel, as a pass of
        // `exp` over the vocabulary per row is a few percent of a decoding step.
        let drawn: Vec<(u32, f32)> =
            self.rows.par_iter_mut().zip(&logits_rows).map(|(slot, logits)| slot.sampler.sample(logits)).collect();
        let drawn =
            drawn.into_iter().zip(self.rows.iter().zip(&logits_rows)).map(|((token, logprob), (slot, logits))| {
                let k = slot.sampler.settings().top_logprobs;
                Drawn { token, logprob, top: (k > 0).then(|| crate::sampling::top_logprobs(logits, k)) }
            });
        Ok(Some(drawn.collect()))
    }

    /// After a [`sample`](Self::sample): the rows that `finished` leave (their prompt and
    /// tokens kept in the prefix cache, if any), and the others run one position further
    /// with their `next` tokens (in row order).
    pub fn advance(&mut self, finished: &[bool], next: Vec<u32>) -> Result<()> {
        if finished.len() != self.rows.len() || next.len() != finished.iter().filter(|&&f| !f).count() {
            return Err(Error::Input(format!(
                "{} rows decoding, told of {} ({} continuing)",
                self.rows.len(),
                finished.len(),
                next.len()
            )));
        }
        if self.prefix_cache.is_some() {
            for row in self.rows.iter().enumerate().filter(|&(p, _)| finished[p]).map(|(_, row)| row) {
                // The row's prompt and all its tokens but the last (never run) are in the
                // cache: kept for a next turn that extends them.
                keep_blocks(self.prefix_cache.as_ref(), &row.sequence, &self.cache, row.slot, row.pad)?;
            }
        }
        self.leave(finished)?;
        if self.rows.is_empty() {
            return Ok(());
        }
        if self.prefix_cache.is_some() {
            for (row, &token) in self.rows.iter_mut().zip(&next) {
                row.sequence.push(token);
            }
        }
        let pads: Vec<usize> = self.rows.iter().map(|r| r.pad).collect();
        let slots: Vec<usize> = self.rows.iter().map(|r| r.slot).collect();
        let tokens = Tensor::from_vec(next, (self.rows.len(), 1), self.model.device())?;
        self.logits = Some(self.model.forward_in_slots(&tokens, &pads, Some(&slots), &mut self.cache, false)?);
        Ok(())
    }

    /// The rows `leaving` says leave. Where the model decodes rows in any slots, theirs are
    /// left behind until half the buffers' rows are (then the others are copied into new
    /// buffers: each copy at least halves them, so a batch copies at most about its cache's
    /// size again however its rows finish; padding that every row has is kept till then —
    /// the kernels attend from each row's first position, never to it); elsewhere the
    /// others are copied at once and the shared padding dropped every step, as the general
    /// path runs the buffers' rows in order over every position.
    fn leave(&mut self, leaving: &[bool]) -> Result<()> {
        if leaving.contains(&true) {
            let mut position = 0;
            self.rows.retain(|_| {
                position += 1;
                !leaving[position - 1]
            });
        }
        if self.rows.is_empty() {
            self.cache = self.model.new_cache();
            return Ok(());
        }
        let held = self.cache.rows().unwrap_or(0);
        if !self.model.decodes_in_slots() || 2 * self.rows.len() <= held {
            self.compact()?;
        }
        Ok(())
    }

    /// Copy the rows into buffers of their own, in order, dropping the slots that rows left
    /// and the padding every row has at its front.
    fn compact(&mut self) -> Result<()> {
        let in_order = self.rows.iter().enumerate().all(|(i, row)| row.slot == i);
        if !in_order || self.cache.rows().is_some_and(|held| held != self.rows.len()) {
            let keep: Vec<u32> = self.rows.iter().map(|row| row.slot as u32).collect();
            self.cache = self.cache.select_rows(&Tensor::from_vec(keep, self.rows.len(), self.model.device())?)?;
            self.rows.iter_mut().enumerate().for_each(|(i, row)| row.slot = i);
            self.compactions += 1;
        }
        // Padding every row has at its front is dead weight once the rows that needed no
        // padding have left: drop it.
        let common = self.rows.iter().map(|r| r.pad).min().unwrap_or(0);
        if common > 0 {
            self.cache = self.cache.drop_front(common)?;
            self.rows.iter_mut().for_each(|r| r.pad -= common);
        }
        Ok(())
    }

    /// How many times rows that left were dropped by copying the others into new buffers.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Keep only the rows `staying` says (a caller went away), their logits with them.
    pub fn retain(&mut self, staying: &[bool]) -> Result<()> {
        if staying.iter().all(|&s| s) {
            return Ok(());
        }
        let keep: Vec<u32> = (0..staying.len() as u32).filter(|&p| staying[p as usize]).collect();
        let leaving: Vec<bool> = staying.iter().map(|&s| !s).collect();
        self.leave(&leaving)?;
        if self.rows.is_empty() {
            self.logits = None;
            return Ok(());
        }
        let index = Tensor::from_vec(keep, self.rows.len(), self.model.device())?;
        self.logits = match self.logits.take() {
            Some(logits) => Some(logits.index_select(&index, 0)?),
            None => None,
        };
        Ok(())
    }

    /// Drop every row (after an error).
    pub fn abandon(&mut self) {
        self.rows.clear();
        self.logits = None;
        self.cache = self.model.new_cache();
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
