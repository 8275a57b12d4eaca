//! The batching actor: one thread owns the model and its lanes ([`Batch`]es); any number of
//! callers (agents, the trainer, a server) send it requests through an [`EngineHandle`].
//! Requests join the running batch between decode steps and leave it when their samples
//! finish (continuous batching), so concurrent callers share every forward pass.
//!
//! Each turn of its loop is vLLM v1's three parts: the scheduler (`scheduler.rs`) places the
//! requests that arrived in lanes within the cache's budget and writes the turn's [`Plan`];
//! each lane's step runs the executor (`executor.rs`: the forward and the draw, everything
//! on the device) and the output processor (`output.rs`: text, stop checks, completions),
//! whose outcomes go to the callers. This file holds the thread, its messages and the
//! weights barrier.
//!
//! The model runs on a plain thread, not a tokio task: a decode step is seconds of CPU work
//! that must not stall an async runtime. Callers await a tokio channel (or block on it).

use crate::generate::Batch;
use crate::llama::Model;
use crate::output::{Outcomes, Replies, Silent, TextPiece, Waiter};
use crate::prefix_cache::{PrefixCache, PrefixStats};
use crate::request::{Completion, GenerateRequest, RequestId, extent, validate};
use crate::scheduler::{LaneLimits, Plan, Scheduler, share_plan};
use crate::text_logprobs::{self, TextToScore};
use crate::tokenizer::Tokenizer;
use crate::{Error, Result};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, oneshot};
use wirl_model::weights::{WeightsBarrier, WeightsHold};

enum Message {
    Generate {
        request: GenerateRequest,
        reply: oneshot::Sender<Result<Vec<Completion>>>,
        text: Option<mpsc::UnboundedSender<TextPiece>>,
        /// Told once the request has joined a batch (dropped unsent if it is refused).
        admitted: Option<oneshot::Sender<()>>,
    },
    /// Several requests that join the batch together (deterministic batch composition).
    GenerateAll { jobs: Vec<(GenerateRequest, oneshot::Sender<Result<Vec<Completion>>>)> },
    /// Use other weights from the next batch on: waits until the running rows finish, and
    /// requests sent after it use the new model.
    SetModel { model: Arc<Model>, reply: oneshot::Sender<u64> },
    /// The weights barrier: once the rows admitted before it finish, tell the holder
    /// (`held`), generate nothing until it lets go (`release` sent or dropped), then count a
    /// new weights version.
    Hold { held: oneshot::Sender<u64>, release: oneshot::Receiver<()> },
    /// Log-probs of given texts ([`text_logprobs`](crate::text_logprobs)), computed between
    /// two decoding steps with the weights of the moment (after the swaps and holds queued
    /// before it). One result per text: a text refused alone is its own `Err`.
    Logprobs { texts: Vec<TextToScore>, reply: oneshot::Sender<Vec<Result<Vec<f32>>>> },
}

/// The learner's seam (`wirl_model::weights`): the engine is what a trainer's barrier holds.
impl WeightsBarrier for EngineHandle {
    fn hold_weights(&self) -> wirl_model::Result<WeightsHold> {
        // The engine's hold fails only when its thread has stopped.
        EngineHandle::hold_weights(self).map_err(|_| wirl_model::Error::Stopped)
    }
}

/// How the engine thread batches.
#[derive(Clone, Copy, Debug, Default)]
pub struct EngineOptions {
    /// Bytes of keys and values kept for later requests that start the same way
    /// ([`PrefixCache`]: an episode's next turn, an agent's next call, a server's shared
    /// system prompt); 0: none kept (prompts admitted together that are equal are still
    /// computed once). Counted at the whole model's size on every tensor-parallel rank, so
    /// that the ranks keep and find the same blocks.
    pub prefix_cache_bytes: u64,
    /// Prompts longer than this are prefilled in slices between decode steps
    /// ([`Batch::prefill_in_slices`]): for a server, so that one long prompt does not hold
    /// every other client; not for a trainer (a sliced prompt rounds differently).
    pub prefill_chunk: Option<usize>,
    /// Up to this many batches ("lanes") decode side by side, so that a request far longer
    /// than the running ones does not pad every one of their cache rows to its length (a
    /// 4,000-token prompt among 32 short chats would otherwise hold 33 rows of 4,000
    /// positions). Each lane costs its own pass over the weights per step. 0 or 1: one batch.
    pub max_lanes: usize,
    /// The most bytes of keys and values the batches may come to hold (each request counted
    /// at its prompt plus `max_tokens`, rows padded to their lane's longest, buffers with
    /// their spare room): a request that would go past it beside the work in flight is
    /// refused with [`Error::Busy`], one that alone would, with [`Error::Input`]. `None`:
    /// unbounded (a trainer sizes its own batches).
    pub kv_budget_bytes: Option<u64>,
    /// Draw tokens where the logits are ([`Batch::sample_on_device`]); off by default.
    pub device_sampling: bool,
}

/// Sends work to the engine thread. Cheap to clone; the thread ends when every handle is
/// dropped and its work is done.
#[derive(Clone)]
pub struct EngineHandle {
    sender: mpsc::UnboundedSender<Message>,
    stats: Arc<PrefixStats>,
}

impl EngineHandle {
    /// Start the engine thread.
    pub fn spawn(model: Arc<Model>, tokenizer: Arc<Tokenizer>) -> Result<(EngineHandle, std::thread::JoinHandle<()>)> {
        Self::spawn_with(model, tokenizer, EngineOptions::default())
    }

    /// Start the engine thread, with `options`.
    pub fn spawn_with(
        model: Arc<Model>,
        tokenizer: Arc<Tokenizer>,
        options: EngineOptions,
    ) -> Result<(EngineHandle, std::thread::JoinHandle<()>)> {
        let (sender, receiver) = mpsc::unbounded_channel();
        let stats = Arc::new(PrefixStats::default());
        let counted = stats.clone();
        let thread = std::thread::Builder::new()
            .name("wirl-engine".into())
            .spawn(move || run(model, tokenizer, receiver, options, counted))
            .map_err(|e| Error::Generation(format!("cannot start the engine thread: {e}")))?;
        Ok((EngineHandle { sender, stats }, thread))
    }

    /// Start a tensor-parallel engine: `ranks[r]` is rank r's shard of one model (loaded with
    /// its `Comm`), each driven by a thread of its own. The first rank's thread batches as
    /// [`spawn_with`](Self::spawn_with) does and, every turn, sends the others its plan (the
    /// requests joining, with their seeds fixed, and those cancelled), which they follow, so
    /// that every rank's forward pass meets the others' in the collectives. Its weights cannot
    /// be changed (`set_model`, `hold_weights` are refused). The threads end when every handle
    /// is dropped.
    pub fn spawn_ranks(
        ranks: Vec<Arc<Model>>,
        tokenizer: Arc<Tokenizer>,
        options: EngineOptions,
    ) -> Result<(EngineHandle, Vec<std::thread::JoinHandle<()>>)> {
        let mut ranks = ranks.into_iter();
        let first = ranks.next().ok_or_else(|| Error::Input("a tensor-parallel engine of no ranks".into()))?;
        if first.comm().rank() != 0 {
            return Err(Error::Input(format!("the first model given is rank {}'s, not rank 0's", first.comm().rank())));
        }
        let mut threads = Vec::new();
        for model in ranks {
            let tokenizer = tokenizer.clone();
            let name = format!("wirl-engine-rank-{}", model.comm().rank());
            threads.push(
                std::thread::Builder::new()
                    .name(name)
                    .spawn(move || follow(model, tokenizer, options))
                    .map_err(|e| Error::Generation(format!("cannot start an engine thread: {e}")))?,
            );
        }
        let (handle, leader) = Self::spawn_with(first, tokenizer, options)?;
        threads.insert(0, leader);
        Ok((handle, threads))
    }

    /// Prompt positions the engine took from its prefix cache and computed, since it began.
    pub fn prefix_stats(&self) -> &Arc<PrefixStats> {
        &self.stats
    }

    /// The `n` completions of `request`, generated alongside whatever else is running.
    pub async fn generate(&self, request: GenerateRequest) -> Result<Vec<Completion>> {
        self.submit(request, None)?.await.map_err(|_| Error::Stopped)?
    }

    /// Like [`generate`](Self::generate), sending text pieces to `text` as they are produced.
    pub async fn generate_streaming(
        &self,
        request: GenerateRequest,
        text: mpsc::UnboundedSender<TextPiece>,
    ) -> Result<Vec<Completion>> {
        self.submit(request, Some(text))?.await.map_err(|_| Error::Stopped)?
    }

    /// Like [`generate_streaming`](Self::generate_streaming), in two halves: this returns
    /// once the request has joined a batch (or with the error that refused it: an invalid
    /// request, [`Error::Busy`] beyond the memory budget), so that a server can still answer
    /// with a status before it starts streaming; [`Streaming::finish`] then waits for the
    /// completions. Dropping either gives the generation up.
    pub async fn start_streaming(
        &self,
        request: GenerateRequest,
        text: mpsc::UnboundedSender<TextPiece>,
    ) -> Result<Streaming> {
        let (reply, receiver) = oneshot::channel();
        let (admitted, on_admission) = oneshot::channel();
        let message = Message::Generate { request, reply, text: Some(text), admitted: Some(admitted) };
        self.sender.send(message).map_err(|_| Error::Stopped)?;
        match on_admission.await {
            Ok(()) => Ok(Streaming { reply: receiver }),
            Err(_) => Err(receiver.await.map_err(|_| Error::Stopped)?.err().unwrap_or(Error::Stopped)),
        }
    }

    /// For callers outside an async runtime (a plugin's host call); must not be called from
    /// within one.
    pub fn generate_blocking(&self, request: GenerateRequest) -> Result<Vec<Completion>> {
        self.submit(request, None)?.blocking_recv().map_err(|_| Error::Stopped)?
    }

    /// Several requests admitted into the batch in one go, in order, so that the batch they
    /// form does not depend on thread timing (the trainer's runs are reproducible). Blocks.
    pub fn generate_all_blocking(&self, requests: Vec<GenerateRequest>) -> Vec<Result<Vec<Completion>>> {
        match self.submit_all(requests) {
            Ok(receivers) => receivers.into_iter().map(|r| r.blocking_recv().map_err(|_| Error::Stopped)?).collect(),
            Err(count) => (0..count).map(|_| Err(Error::Stopped)).collect(),
        }
    }

    /// Several requests admitted into the batch in one go, in order, awaited together (the
    /// async form of [`generate_all_blocking`](Self::generate_all_blocking)).
    pub async fn generate_all(&self, requests: Vec<GenerateRequest>) -> Vec<Result<Vec<Completion>>> {
        match self.submit_all(requests) {
            Ok(receivers) => {
                let mut results = Vec::with_capacity(receivers.len());
                for receiver in receivers {
                    results.push(receiver.await.map_err(|_| Error::Stopped).and_then(|r| r));
                }
                results
            }
            Err(count) => (0..count).map(|_| Err(Error::Stopped)).collect(),
        }
    }

    /// [`generate_all_blocking`](Self::generate_all_blocking), given up as soon as `stop()`
    /// says so (checked every 10 ms): `None` then, and the engine drops the requests' rows at
    /// its next step, since no one waits for them.
    pub fn generate_all_until(
        &self,
        requests: Vec<GenerateRequest>,
        stop: impl Fn() -> bool,
    ) -> Option<Vec<Result<Vec<Completion>>>> {
        let mut in_flight = self.send_all(requests);
        let mut results: Vec<Option<Result<Vec<Completion>>>> = (0..in_flight.len()).map(|_| None).collect();
        loop {
            match in_flight.next_finished(&stop) {
                Finished::Request(index, result) => results[index] = Some(result),
                Finished::All => break,
                Finished::Stopped => return None,
            }
        }
        Some(results.into_iter().map(|r| r.unwrap_or(Err(Error::Stopped))).collect())
    }

    /// Several requests admitted into the batch in one go, in order (as
    /// [`generate_all_blocking`](Self::generate_all_blocking)), each request's completions
    /// taken as soon as they finish: a caller works on the first while the rest generate.
    /// Dropping the returned [`InFlight`] gives up the requests not yet taken.
    pub fn send_all(&self, requests: Vec<GenerateRequest>) -> InFlight {
        match self.submit_all(requests) {
            Ok(receivers) => InFlight { receivers: receivers.into_iter().map(Some).collect(), failed: 0 },
            Err(count) => InFlight { receivers: Vec::new(), failed: count },
        }
    }

    /// Swap in new weights (a server loading a checkpoint). Returns once the engine uses them,
    /// with the weights version they are (completions report it).
    pub async fn set_model(&self, model: Arc<Model>) -> Result<u64> {
        let (reply, receiver) = oneshot::channel();
        self.sender.send(Message::SetModel { model, reply }).map_err(|_| Error::Stopped)?;
        receiver.await.map_err(|_| Error::Stopped)
    }

    /// The log-probs of each of `texts`' scored tokens under the weights the engine has when
    /// it reaches the request (between two decoding steps, after the swaps and holds sent
    /// before it): a judge reading how likely a reply is. A tensor-parallel engine refuses.
    pub async fn logprobs(&self, texts: Vec<TextToScore>) -> Result<Vec<Result<Vec<f32>>>> {
        let (reply, receiver) = oneshot::channel();
        self.sender.send(Message::Logprobs { texts, reply }).map_err(|_| Error::Stopped)?;
        receiver.await.map_err(|_| Error::Stopped)
    }

    /// Wait until the rows admitted before this call have finished, and keep the engine from
    /// generating until the returned hold is dropped. Blocks; must not be called from within
    /// an async runtime.
    pub fn hold_weights(&self) -> Result<WeightsHold> {
        let (held, held_receiver) = oneshot::channel();
        let (release_sender, release) = oneshot::channel();
        self.sender.send(Message::Hold { held, release }).map_err(|_| Error::Stopped)?;
        let version = held_receiver.blocking_recv().map_err(|_| Error::Stopped)?;
        Ok(WeightsHold::new(release_sender, version))
    }

    /// Send `requests` to join the batch together; their reply channels, or (the engine
    /// having stopped) how many there were.
    fn submit_all(&self, requests: Vec<GenerateRequest>) -> std::result::Result<Vec<Receiver>, usize> {
        let count = requests.len();
        let (jobs, receivers): (Vec<_>, Vec<_>) = requests
            .into_iter()
            .map(|request| {
                let (reply, receiver) = oneshot::channel();
                ((request, reply), receiver)
            })
            .unzip();
        self.sender.send(Message::GenerateAll { jobs }).map(|()| receivers).map_err(|_| count)
    }

    fn submit(
        &self,
        request: GenerateRequest,
        text: Option<mpsc::UnboundedSender<TextPiece>>,
    ) -> Result<oneshot::Receiver<Result<Vec<Completion>>>> {
        let (reply, receiver) = oneshot::channel();
        self.sender.send(Message::Generate { request, reply, text, admitted: None }).map_err(|_| Error::Stopped)?;
        Ok(receiver)
    }
}

/// Where a request's completions arrive.
type Receiver = oneshot::Receiver<Result<Vec<Completion>>>;

/// A streaming request that has joined a batch ([`EngineHandle::start_streaming`]).
pub struct Streaming {
    reply: Receiver,
}

impl Streaming {
    /// The completions, once every sample has finished.
    pub async fn finish(self) -> Result<Vec<Completion>> {
        self.reply.await.map_err(|_| Error::Stopped)?
    }
}

/// Requests sent together by [`EngineHandle::send_all`], their completions taken in the
/// order they finish.
pub struct InFlight {
    /// By request index; `None` once taken.
    receivers: Vec<Option<Receiver>>,
    /// Requests that never reached the engine (it had stopped): each finishes as
    /// [`Error::Stopped`].
    failed: usize,
}

/// What [`InFlight::next_finished`] found.
#[derive(Debug)]
pub enum Finished {
    /// Request `index` (in the order sent) finished, or failed.
    Request(usize, Result<Vec<Completion>>),
    /// Every request was taken.
    All,
    /// `stop()` said so before the next request finished.
    Stopped,
}

impl InFlight {
    /// How many requests were sent.
    pub fn len(&self) -> usize {
        self.receivers.len() + self.failed
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next request to finish (the lowest index among those ready), waiting for it;
    /// `stop()` is asked every 10 ms while none is ready. Blocks; must not be called from
    /// within an async runtime.
    pub fn next_finished(&mut self, stop: &dyn Fn() -> bool) -> Finished {
        if self.failed > 0 {
            self.failed -= 1;
            return Finished::Request(self.receivers.len() + self.failed, Err(Error::Stopped));
        }
        loop {
            let mut waiting = false;
            for (index, slot) in self.receivers.iter_mut().enumerate() {
                let Some(receiver) = slot else { continue };
                match receiver.try_recv() {
                    Ok(result) => {
                        *slot = None;
                        return Finished::Request(index, result);
                    }
                    Err(oneshot::error::TryRecvError::Closed) => {
                        *slot = None;
                        return Finished::Request(index, Err(Error::Stopped));
                    }
                    Err(oneshot::error::TryRecvError::Empty) => waiting = true,
                }
            }
            if !waiting {
                return Finished::All;
            }
            if stop() {
                return Finished::Stopped;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// What the actor's loop needs to admit the requests at the front of its queue.
struct Admitting<'a> {
    model: &'a Model,
    context: usize,
    /// Ranks must draw the same tokens: a request without a seed is given one.
    tensor_parallel: bool,
}

impl Admitting<'_> {
    /// Every request at the front of `queue` (up to the next model swap or hold) checked and
    /// placed in the lane the scheduler gives it, or answered with why it cannot be.
    fn admit(
        &self,
        queue: &mut VecDeque<Message>,
        scheduler: &mut Scheduler,
        waiters: &mut HashMap<RequestId, Waiter>,
        next_id: &mut RequestId,
    ) {
        while matches!(queue.front(), Some(Message::Generate { .. })) {
            let Some(Message::Generate { mut request, reply, text, admitted }) = queue.pop_front() else {
                unreachable!()
            };
            if reply.is_closed() {
                continue; // the caller gave up before it started
            }
            if let Err(error) = validate(self.model, &request) {
                let _ = reply.send(Err(error));
                continue;
            }
            if self.tensor_parallel && request.sampling.seed.is_none() {
                // Every rank must draw the same tokens.
                request.sampling.seed = Some(rand::random());
            }
            let reach = extent(&request, self.context);
            if let Err(error) = scheduler.place(*next_id, request, reach) {
                let _ = reply.send(Err(error));
                continue;
            }
            if let Some(admitted) = admitted {
                let _ = admitted.send(());
            }
            waiters.insert(*next_id, Waiter { reply, text });
            *next_id += 1;
        }
    }
}

/// The engine's actor: one loop that sees every message in the order it came (requests,
/// cancellations, weight holds, model swaps) and steps the lanes between them. Kept whole
/// past ~80 lines on purpose: a hold or a swap must wait for the rows in flight and break out
/// of the inner loop with the lanes it drops, and splitting those arms from the loop would
/// hide that order. Admission is `Admitting::admit`, the step `apply`.
fn run(
    mut model: Arc<Model>,
    tokenizer: Arc<Tokenizer>,
    mut receiver: mpsc::UnboundedReceiver<Message>,
    options: EngineOptions,
    stats: Arc<PrefixStats>,
) {
    // A sharded model's ranks follow this thread's every change to the batches.
    let ranks = (model.comm().size() > 1).then(|| model.comm().clone());
    let mut queue: VecDeque<Message> = VecDeque::new();
    let mut next_id: RequestId = 0;
    let mut version: u64 = 0;
    loop {
        let context = model.config().context();
        let bytes_per_position = model.kv_bytes_per_position();
        // A new model starts with an empty cache: no block may serve other weights.
        let prefixes = prefix_cache(&model, &options, &stats);
        let new_lane = || lane(&model, &tokenizer, &options, &prefixes, &stats);
        // Lane 0 always exists; the others open for requests of a very different length and
        // close when idle.
        let mut lanes: Vec<Batch> = vec![new_lane()];
        let mut waiters: HashMap<RequestId, Waiter> = HashMap::new();
        let swap = loop {
            if lanes.iter().all(Batch::is_idle) && queue.is_empty() {
                match receiver.blocking_recv() {
                    Some(message) => queue.push_back(message),
                    None => {
                        if let Some(ranks) = &ranks {
                            let _ = share_plan(ranks.as_ref(), None);
                        }
                        return;
                    }
                }
            }
            while let Ok(message) = receiver.try_recv() {
                queue.push_back(message);
            }
            // Log-probs of given text are answered now, between two steps, unless a swap or a
            // hold comes first (they are then answered with the weights it leads to).
            answer_logprobs(&mut queue, &model, ranks.is_some());
            // A group of requests becomes consecutive single requests, which join together.
            if queue.iter().any(|m| matches!(m, Message::GenerateAll { .. })) {
                queue = queue.into_iter().flat_map(expand).collect();
            }
            // Everything queued before the next model swap joins now, each request in the lane
            // the scheduler places it in.
            let limits = LaneLimits {
                max_lanes: options.max_lanes,
                kv_budget_bytes: options.kv_budget_bytes,
                bytes_per_position,
            };
            let mut scheduler = Scheduler::new(lanes.iter().map(Batch::load).collect(), limits);
            let admitting = Admitting { model: &model, context, tensor_parallel: ranks.is_some() };
            admitting.admit(&mut queue, &mut scheduler, &mut waiters, &mut next_id);
            // Callers that gave up (a client gone, an interrupted trainer): their rows are
            // dropped instead of decoded for no one.
            let gone: Vec<RequestId> = waiters.iter().filter(|(_, w)| w.reply.is_closed()).map(|(&id, _)| id).collect();
            waiters.retain(|id, _| !gone.contains(id));
            let plan = scheduler.plan(gone);
            if let Some(ranks) = &ranks
                && let Err(error) = share_plan(ranks.as_ref(), Some(&plan))
            {
                // The other ranks are gone: nothing more can be generated.
                tracing::error!("the tensor-parallel ranks left: {error}");
                for (_, waiter) in waiters.drain() {
                    let _ =
                        waiter.reply.send(Err(Error::Generation(format!("the tensor-parallel ranks left: {error}"))));
                }
                return;
            }
            let stepped = apply(&mut lanes, plan, &new_lane, &mut Replies { waiters: &mut waiters, version });
            if stepped {
                continue;
            }
            match queue.pop_front() {
                Some(Message::SetModel { model, reply }) if ranks.is_none() => break (model, reply),
                Some(Message::Hold { held, release }) if ranks.is_none() => {
                    // No row is running: the holder may write the weights. A holder that
                    // gave up before this point changed nothing.
                    let holder_waits = held.send(version).is_ok();
                    if holder_waits {
                        let _ = release.blocking_recv();
                        version += 1;
                        // The weights changed: every kept block was computed with others.
                        if let Some(prefixes) = &prefixes {
                            prefixes.lock().unwrap_or_else(|p| p.into_inner()).clear();
                        }
                    }
                }
                Some(Message::SetModel { .. } | Message::Hold { .. }) => {
                    // Dropped unanswered: the caller's error says the engine refused.
                    tracing::error!("a tensor-parallel engine's weights cannot be changed");
                }
                Some(other) => queue.push_front(other),
                None => {}
            }
        };
        drop(lanes);
        let (new_model, reply) = swap;
        model = new_model;
        version += 1;
        let _ = reply.send(version);
    }
}

/// A rank of a tensor-parallel engine other than the first: it makes every change to its
/// batches that the first rank makes (the same requests, seeds, cancellations and steps, so
/// its share of every forward pass meets the others' in the collectives), answering no one.
fn follow(model: Arc<Model>, tokenizer: Arc<Tokenizer>, options: EngineOptions) {
    let ranks = model.comm().clone();
    let stats = Arc::default();
    let prefixes = prefix_cache(&model, &options, &stats);
    let new_lane = || lane(&model, &tokenizer, &options, &prefixes, &stats);
    let mut lanes: Vec<Batch> = vec![new_lane()];
    loop {
        match share_plan(ranks.as_ref(), None) {
            Ok(Some(plan)) => {
                apply(&mut lanes, plan, &new_lane, &mut Silent { rank: ranks.rank() });
            }
            Ok(None) => return,
            Err(error) => {
                tracing::error!("tensor-parallel rank {} stops: {error}", ranks.rank());
                return;
            }
        }
    }
}

type SharedPrefixes = Option<Arc<Mutex<PrefixCache>>>;

fn lane<'m>(
    model: &'m Model,
    tokenizer: &'m Tokenizer,
    options: &EngineOptions,
    prefixes: &SharedPrefixes,
    stats: &Arc<PrefixStats>,
) -> Batch<'m> {
    let mut batch = Batch::new(model, tokenizer);
    batch.sample_on_device(options.device_sampling);
    batch.use_prefix_cache(prefixes.clone());
    batch.count_into(stats.clone());
    batch.prefill_in_slices(options.prefill_chunk);
    batch
}

/// The engine's prefix cache for `model`, if it keeps one; its budget counted at the whole
/// model's bytes per position (every rank of a split model counts alike).
fn prefix_cache(model: &Model, options: &EngineOptions, stats: &Arc<PrefixStats>) -> SharedPrefixes {
    if options.prefix_cache_bytes == 0 {
        return None;
    }
    let config = model.config();
    let per_position =
        config.num_hidden_layers * 2 * config.num_kv_heads() * config.head_dim() * model.dtype().size_in_bytes();
    Some(Arc::new(Mutex::new(PrefixCache::new(options.prefix_cache_bytes, per_position, stats.clone()))))
}

/// Make `plan`'s changes; returns whether a lane stepped (`false`: every lane was idle, and
/// the extra lanes are closed).
fn apply<'m>(
    lanes: &mut Vec<Batch<'m>>,
    plan: Plan,
    new_lane: &dyn Fn() -> Batch<'m>,
    outcomes: &mut dyn Outcomes,
) -> bool {
    for (lane, joining) in plan.joining.into_iter().enumerate() {
        if lane == lanes.len() {
            lanes.push(new_lane());
        }
        if !joining.is_empty()
            && let Err(error) = lanes[lane].admit(joining)
        {
            outcomes.failed(lanes[lane].abandon(), &error);
        }
    }
    if lanes.iter().all(Batch::is_idle) {
        lanes.truncate(1);
        return false;
    }
    let gone: HashSet<RequestId> = plan.gone.into_iter().collect();
    for batch in lanes.iter_mut() {
        if let Err(error) = batch.cancel(&gone) {
            outcomes.failed(batch.abandon(), &error);
        }
    }
    for batch in lanes.iter_mut().filter(|b| !b.is_idle()) {
        match batch.step(|id, sample, piece| outcomes.piece(id, sample, piece)) {
            Ok(done) => {
                for (id, completions) in done {
                    outcomes.done(id, completions);
                }
            }
            Err(error) => outcomes.failed(batch.abandon(), &error),
        }
    }
    // Lanes beyond the first close once idle.
    let mut index = 0;
    lanes.retain(|batch| {
        index += 1;
        index == 1 || !batch.is_idle()
    });
    true
}

/// Answer each `Logprobs` message queued before the first swap or hold.
fn answer_logprobs(queue: &mut VecDeque<Message>, model: &Model, tensor_parallel: bool) {
    let barrier = queue.iter().position(|m| matches!(m, Message::SetModel { .. } | Message::Hold { .. }));
    let end = barrier.unwrap_or(queue.len());
    if !queue.iter().take(end).any(|m| matches!(m, Message::Logprobs { .. })) {
        return;
    }
    let rest = queue.split_off(end);
    for message in std::mem::take(queue) {
        match message {
            Message::Logprobs { texts, reply } => {
                let refused =
                    || Error::Input("log-probs of given text are not served by a tensor-parallel engine".into());
                let results = texts
                    .iter()
                    .map(|text| match tensor_parallel {
                        true => Err(refused()),
                        false => text_logprobs::token_logprobs(model, text, text_logprobs::CHUNK),
                    })
                    .collect();
                let _ = reply.send(results);
            }
            other => queue.push_back(other),
        }
    }
    queue.extend(rest);
}

fn expand(message: Message) -> Vec<Message> {
    match message {
        Message::GenerateAll { jobs } => jobs
            .into_iter()
            .map(|(request, reply)| Message::Generate { request, reply, text: None, admitted: None })
            .collect(),
        other => vec![other],
    }
}
