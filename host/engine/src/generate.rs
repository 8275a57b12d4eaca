//! Batched generation: the requests and completions, and a [`Batch`] — one lane of rows
//! being decoded, which requests join between decode steps (their prompts prefilled
//! together, each prompt once for all its samples, then left-padded to the batch's cache
//! length) and leave when they finish. A batch's step is the engine loop's three parts:
//! what runs now, the executor's forward and draw (`executor.rs`), the output processor's
//! text and completions (`output.rs`); the scheduler (`scheduler.rs`) places requests in
//! lanes. [`generate`] runs one set of requests through a batch; the batching actor
//! (`actor.rs`) keeps lanes open for requests that arrive over time.

use crate::executor::{Executor, Prefilling};
use crate::llama::Model;
use crate::output::OutputProcessor;
use crate::prefix_cache::{BLOCK, PrefixCache, PrefixStats};
pub use crate::request::{Completion, FinishReason, GenerateRequest, RequestId, extent, validate};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

/// One lane of the engine: rows decoding together. Each [`step`](Batch::step) is the
/// engine loop's three parts in turn — which work runs (the slice of a long prompt due
/// now, the rows admitted), the [`Executor`]'s forward and draw over them, and the
/// [`OutputProcessor`]'s text, stop checks and completions — so that what runs on the
/// device is in `executor.rs` only, and what callers see in `output.rs` only.
pub struct Batch<'m> {
    executor: Executor<'m>,
    output: OutputProcessor<'m>,
    /// Requests that finished while being admitted (`n = 0`).
    finished: Vec<(RequestId, Vec<Completion>)>,
    /// Prompts longer than this are prefilled in slices of this many positions, one slice
    /// per step, between the running rows' decode steps ([`Batch::prefill_in_slices`]).
    prefill_chunk: Option<usize>,
    /// Long prompts being prefilled slice by slice, first come first served.
    prefilling: VecDeque<Prefilling>,
    /// Cache positions each open request may come to need (see [`extent`]).
    extents: HashMap<RequestId, usize>,
}

impl<'m> Batch<'m> {
    pub fn new(model: &'m Model, tokenizer: &'m Tokenizer) -> Self {
        Batch {
            executor: Executor::new(model),
            output: OutputProcessor::new(tokenizer),
            finished: Vec::new(),
            prefill_chunk: None,
            prefilling: VecDeque::new(),
            extents: HashMap::new(),
        }
    }

    /// Draw each step's tokens where the logits are (`device_sampling`): only a token and a
    /// log-probability per row come back to the host, not the rows' logits. A step with a
    /// row that cuts its distribution (top-k, top-p, min-p) or asks for `top_logprobs`
    /// samples on the host as before. Off by default: on the CPU the host sampler is the
    /// same memory, and on a GPU its figure is still to be measured (issue 45).
    pub fn sample_on_device(&mut self, on: bool) {
        self.executor.sample_on_device(on);
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

    /// What this batch may come to hold: its rows (the slots finished rows left in its cache
    /// included, and the prompts still being prefilled) and the longest extent among its
    /// requests — cache positions are rows × longest, since the rows share one left-padded
    /// cache. What a server's memory budget counts.
    pub fn load(&self) -> (usize, usize) {
        let rows = self.executor.rows_held() + self.prefilling.iter().map(|p| p.request.n).sum::<usize>();
        (rows, self.extents.values().copied().max().unwrap_or(0))
    }

    /// Take prompts' keys and values from `cache` where an earlier prompt or completion
    /// covered their start (whole blocks), computing only the rest, and keep every prompt's
    /// and finished row's blocks there for later requests. Prompts admitted together that
    /// are equal are computed once whether or not there is a cache. Off (`None`) by default:
    /// a prefix computed in another batch rounds differently from a whole prompt (by float
    /// summation order), so results then depend on what came before.
    pub fn use_prefix_cache(&mut self, cache: Option<Arc<Mutex<PrefixCache>>>) {
        self.executor.use_prefix_cache(cache);
    }

    /// Count prompt positions (taken from the cache, computed) into `stats`.
    pub fn count_into(&mut self, stats: Arc<PrefixStats>) {
        self.executor.count_into(stats);
    }

    /// Rows decoding now.
    pub fn rows(&self) -> usize {
        self.executor.rows()
    }

    /// Nothing left to prefill, to decode or to hand back.
    pub fn is_idle(&self) -> bool {
        self.executor.rows() == 0 && self.finished.is_empty() && self.prefilling.is_empty()
    }

    /// Cache positions per row, padding included (what one decode step attends over).
    pub fn cache_len(&self) -> usize {
        self.executor.cache_len()
    }

    /// How many times rows that finished left by the others being copied into new buffers
    /// (on the CPU's decoding path at most about log2 of the rows a batch held; elsewhere
    /// once per step that rows finish).
    pub fn compactions(&self) -> u64 {
        self.executor.compactions()
    }

    /// Prefill `requests` (already validated, ids not in use) and add their samples to the
    /// batch. Each prompt is run once; its samples share its cache rows.
    pub fn admit(&mut self, requests: Vec<(RequestId, GenerateRequest)>) -> Result<()> {
        let mut live = Vec::with_capacity(requests.len());
        for (id, request) in requests {
            if self.output.is_open(id) {
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
        let context = self.executor.model().config().context();
        for (id, request) in &live {
            self.extents.insert(*id, extent(request, context));
        }
        let prompts = live.iter().map(|(_, request)| request.prompt.as_slice());
        self.executor.prime_shared_prefixes(prompts, self.prefill_chunk)?;
        let mut live: Vec<(RequestId, GenerateRequest, Vec<u64>)> = live
            .into_iter()
            .map(|(id, request)| {
                let keys = self.executor.cached_blocks(&request.prompt);
                (id, request, keys)
            })
            .collect();
        if let Some(chunk) = self.prefill_chunk {
            // Prompts with more than a slice left to compute are prefilled slice by slice.
            let (long, short): (Vec<_>, Vec<_>) =
                live.into_iter().partition(|(_, request, keys)| request.prompt.len() - keys.len() * BLOCK > chunk);
            for (id, request, keys) in long {
                self.prefilling.push_back(self.executor.start_slices(id, request, &keys)?);
            }
            live = short;
        }
        if live.is_empty() {
            return Ok(());
        }
        for (id, request) in self.executor.prefill(live)? {
            self.output.join(id, &request);
        }
        Ok(())
    }

    /// Compute the next slice of the first prompt being prefilled in slices; once its last
    /// slice is done, its rows join the batch.
    fn prefill_slice(&mut self) -> Result<()> {
        let Some(chunk) = self.prefill_chunk else { return Ok(()) };
        let Some(prefilling) = self.prefilling.pop_front() else { return Ok(()) };
        match self.executor.prefill_slice(prefilling, chunk)? {
            Ok((id, request)) => self.output.join(id, &request),
            Err(unfinished) => self.prefilling.push_front(unfinished),
        }
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
        let Some(drawn) = self.executor.sample()? else {
            return Ok(done);
        };
        let context = self.executor.model().config().context();
        let processed = self.output.process(drawn, context, &mut on_text)?;
        self.executor.advance(&processed.finished, processed.next)?;
        for (id, _) in &processed.done {
            self.extents.remove(id);
        }
        done.extend(processed.done);
        Ok(done)
    }

    /// Drop every row and open request (after an error), returning the ids that were open.
    pub fn abandon(&mut self) -> Vec<RequestId> {
        self.executor.abandon();
        self.extents.clear();
        let mut ids = self.output.abandon();
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
        self.extents.retain(|id, _| !cancelled.contains(id));
        let staying = self.output.cancel(cancelled);
        self.executor.retain(&staying)
    }
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
