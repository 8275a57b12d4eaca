//! One GRPO update over a step's groups: old and reference log-probs before any change, then
//! μ epochs of (forward, loss, backward per group, gradients summed, one AdamW step), the
//! optimizer writing the weights only through the engine's barrier.
//!
//! The learner sees token ids and advantages, nothing of tasks, plugins or files: the
//! rollout layer turns scored trajectories into [`GroupBatch`]es.

use crate::correction::RolloutCorrection;
use crate::grads::Gradients;
use crate::loss::{
    Aggregation, KlEstimate, KlEstimator, LossParts, LossSettings, grpo_loss, masked_token_weights, token_weights,
};
use crate::optim::Optimizer;
use crate::policy::{MemoryLimits, Net, Policy, TokenStats};
use crate::positions::Part;
use candle_core::Tensor;
use std::sync::Arc;
use std::time::Instant;
use wirl_model::comm::{Comm, Solo};
use wirl_model::weights::{WeightMirror, WeightsBarrier};

/// One group as the learner sees it: the prompt once, its completions, and each
/// completion's advantage.
#[derive(Clone, Debug)]
pub struct GroupBatch {
    pub prompt: Vec<u32>,
    pub completions: Vec<Vec<u32>>,
    pub advantages: Vec<f32>,
    /// Per completion, per token: added to the completion's advantage at that token (a
    /// multi-turn episode's turn rewards, credited to their turn's tokens). Empty: none,
    /// every token of a completion has its advantage.
    pub token_advantages: Vec<Vec<f32>>,
    /// Per completion, per token: trained on (the model's) or not (a multi-turn ledger's
    /// environment tokens, context only). Empty: every token is trained on.
    pub trainable: Vec<Vec<bool>>,
    /// Per completion, the sampler's log-probability of each token (temperature 1). When the
    /// weights that sampled them are the ones this update starts from, and the sampler
    /// shares them (no [`Learner::mirror`]), they are the old log-probs of μ > 1 epochs
    /// (equal to a forward pass's within 1e-4, a test holds), and that pass is not run; on
    /// the same weights the update measures how far its own log-probs are from them
    /// ([`UpdateStats::sampler_gap`]). Empty: unknown.
    pub sampler_logprobs: Vec<Vec<f32>>,
    /// Updates made between the weights that sampled the group and the ones this update
    /// starts from (a generation lag). Above 0 the sampler's log-probs are the behaviour
    /// policy's: each token's loss is weighted by the truncated importance ratio
    /// min(π_old / π_sampler, `tis_cap`), and μ > 1 computes its old log-probs by a pass.
    pub sampler_lag: u64,
}

impl GroupBatch {
    /// The group as micro-batches of at most `rows` completions each (the prompt repeated in
    /// each), and with `by_length`, of completions of similar length: a batch is padded to
    /// its longest completion, so one long completion among short ones would make every row
    /// that long. The loss is a sum over tokens whose weights depend only on the step's
    /// totals, so the micro-batches' losses and gradients add up to the group's.
    /// `prompt_shared`: the micro-batches will share one pass of the prompt (then a cut
    /// does not cost the prompt again).
    fn split(&self, rows: usize, by_length: bool, prompt_shared: bool) -> Vec<GroupBatch> {
        if self.completions.is_empty() {
            return vec![self.clone()];
        }
        let all: Vec<usize> = (0..self.completions.len()).collect();
        let parts = if by_length { self.length_parts(prompt_shared) } else { vec![all] };
        parts
            .into_iter()
            .flat_map(|part| {
                let size = if rows == 0 { part.len().max(1) } else { rows };
                part.chunks(size).map(|chunk| self.subset(chunk)).collect::<Vec<_>>()
            })
            .collect()
    }

    /// The completions' indices in parts of ascending length that cost the fewest positions
    /// to train: each part runs a fixed cost per forward, the prompt once unless the parts
    /// share its pass, and every row to the part's longest completion. Exact over the sorted
    /// order (a small dynamic programme: groups have a few dozen completions at most).
    fn length_parts(&self, prompt_shared: bool) -> Vec<Vec<usize>> {
        // A forward's fixed cost (dispatch, the head's chunks, the backward's set-up), in positions.
        const PER_FORWARD: usize = 32;
        let mut order: Vec<usize> = (0..self.completions.len()).collect();
        order.sort_by_key(|&i| self.completions[i].len());
        let n = order.len();
        let length = |k: usize| self.completions[order[k]].len().max(1);
        let fixed = if prompt_shared { 0 } else { self.prompt.len() } + PER_FORWARD;
        // best[j]: the cost of the first j (sorted) completions; cut[j]: where its last part starts.
        let mut best = vec![0usize; n + 1];
        let mut cut = vec![0usize; n + 1];
        for j in 1..=n {
            (best[j], cut[j]) = (0..j).map(|i| (best[i] + fixed + (j - i) * length(j - 1), i)).min().expect("j >= 1");
        }
        let mut parts = Vec::new();
        let mut j = n;
        while j > 0 {
            parts.push(order[cut[j]..j].to_vec());
            j = cut[j];
        }
        parts.reverse();
        parts
    }

    /// The completions at `rows` (in that order) with their advantages, masks and log-probs.
    fn subset(&self, rows: &[usize]) -> GroupBatch {
        // Per-row vectors, empty when unknown (stays empty).
        fn pick<T: Clone>(v: &[T], rows: &[usize]) -> Vec<T> {
            if v.is_empty() { Vec::new() } else { rows.iter().map(|&r| v[r].clone()).collect() }
        }
        GroupBatch {
            prompt: self.prompt.clone(),
            completions: pick(&self.completions, rows),
            advantages: pick(&self.advantages, rows),
            token_advantages: pick(&self.token_advantages, rows),
            trainable: pick(&self.trainable, rows),
            sampler_logprobs: pick(&self.sampler_logprobs, rows),
            sampler_lag: self.sampler_lag,
        }
    }

    /// The sampler's log-probs as a `[G, width]` tensor (0 past each completion's end), if
    /// known for every completion.
    fn sampled_logprobs(&self, device: &candle_core::Device) -> candle_core::Result<Option<Tensor>> {
        let known = self.sampler_logprobs.len() == self.completions.len()
            && self.sampler_logprobs.iter().zip(&self.completions).all(|(l, c)| l.len() == c.len());
        if !known {
            return Ok(None);
        }
        let width = self.completions.iter().map(Vec::len).max().unwrap_or(0).max(1);
        let mut values = Vec::with_capacity(self.completions.len() * width);
        for logprobs in &self.sampler_logprobs {
            values.extend(logprobs);
            values.extend(std::iter::repeat_n(0f32, width - logprobs.len()));
        }
        Ok(Some(Tensor::from_vec(values, (self.completions.len(), width), device)?))
    }

    /// Each row's advantage at each token as a `[G, width]` tensor (the per-token terms
    /// added to the row's own, 0 past its end), or as `[G]` when there are no per-token terms.
    fn advantages_tensor(&self, width: usize, device: &candle_core::Device) -> candle_core::Result<Tensor> {
        let rows = self.advantages.len();
        if self.token_advantages.is_empty() {
            return Tensor::from_vec(self.advantages.clone(), rows, device);
        }
        let mut values = Vec::with_capacity(rows * width);
        for (r, &advantage) in self.advantages.iter().enumerate() {
            let terms = self.token_advantages.get(r).map_or(&[][..], Vec::as_slice);
            values.extend((0..width).map(|i| advantage + terms.get(i).copied().unwrap_or(0.0)));
        }
        Tensor::from_vec(values, (rows, width), device)
    }

    /// The group as the policy trains it: the head only where a token carries loss.
    fn part(&self) -> Part<'_> {
        Part::trained(&self.completions, &self.trainable)
    }

    /// Tokens of the group that carry loss.
    fn trainable_tokens(&self) -> usize {
        if self.trainable.is_empty() {
            self.completions.iter().map(Vec::len).sum()
        } else {
            self.trainable.iter().flatten().filter(|&&t| t).count()
        }
    }
}

/// The settings of one update (the run config's GRPO keys, the step's learning rate).
#[derive(Clone, Debug)]
pub struct UpdateSettings {
    pub learning_rate: f64,
    pub loss: LossSettings,
    /// μ: passes over the step's groups, each ending in an optimizer step.
    pub inner_epochs: usize,
    pub aggregation: Aggregation,
    pub max_grad_norm: Option<f64>,
    /// The sampler's `max_tokens` (the `constant` aggregation divides by it).
    pub max_tokens: usize,
    /// What a group's backward may hold: when it goes layer by layer, how many layers'
    /// graphs it keeps from the forward, and the head's chunk.
    pub memory: MemoryLimits,
    /// Completions per forward and backward: a larger group is split into micro-batches
    /// of this many rows, their gradients summed (0: the whole group at once).
    pub micro_batch_rows: usize,
    /// Split a group into micro-batches of similar completion lengths where that trains
    /// fewer padded positions (gradients summed, equal to the whole group's).
    pub split_by_length: bool,
    /// Completions of different groups trained side by side in one forward and backward, at
    /// most this many rows a pass ([`pack`]); 0: group by group (each group's prompt run
    /// once, its micro-batches as `micro_batch_rows` and `split_by_length` say).
    pub rows_per_pass: usize,
    /// The truncation C of the importance weight min(π_old / π_sampler, C) of groups
    /// sampled by older weights ([`GroupBatch::sampler_lag`] > 0), when
    /// `rollout_correction` is off.
    pub tis_cap: f64,
    /// Importance weights for every group whose sampler's log-probs are known, TRL's modes
    /// (`correction.rs`); off: lagged groups alone, truncated at `tis_cap`.
    pub rollout_correction: RolloutCorrection,
}

/// What an update did, averaged over its epochs where that is meaningful.
#[derive(Clone, Debug, Default)]
pub struct UpdateStats {
    pub loss: f32,
    /// The k3 KL to the reference (0 without one).
    pub kl: f32,
    pub entropy: f32,
    pub clip_fraction: f32,
    /// The last epoch's gradient norm before clipping (non-finite when it was skipped).
    pub grad_norm: f64,
    /// Optimizer steps skipped for a non-finite gradient (the weights left alone).
    pub updates_skipped: usize,
    /// Group passes that took the layer-by-layer backward (whatever it kept of the forward).
    pub groups_recomputed: usize,
    /// Of the tokens sampled by older weights, the share whose importance weight was cut
    /// to the cap (0 without a lag).
    pub tis_truncated: f32,
    /// Times the engine's weights were held for writing (each bumps its weights version).
    pub weight_writes: u64,
    /// How far the trainer's log-probs of the sampled tokens are from the sampler's, on the
    /// weights that sampled them (before the first optimizer step, groups without a lag):
    /// the same weights in two code paths — kernels, or a converted copy (bf16 on a GPU) —
    /// so a large gap is a sampler that does not run the policy (weights not synced, a
    /// precision loss). `None` when no such group had the sampler's log-probs.
    pub sampler_gap: Option<SamplerGap>,
    pub time: UpdateTimes,
}

/// |log π_trainer − log π_sampler| over the trained tokens of the sampled completions: the
/// mean and the largest (TRL reports the same under vLLM, `sampling_logp_difference`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SamplerGap {
    pub mean: f32,
    pub max: f32,
    /// The token where this rank's gap is largest, when it is above 0.
    pub worst: Option<GapToken>,
}

/// One sampled token whose log-probs differ: the token, its place in its completion, and the
/// two log-probs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GapToken {
    pub token: u32,
    /// 0-based, in its completion (a pass's rows may carry their own prompt's tail first).
    pub position: usize,
    pub trainer: f32,
    pub sampler: f32,
}

/// Seconds spent in each part of an update.
#[derive(Clone, Copy, Debug, Default)]
pub struct UpdateTimes {
    pub reference_forward: f64,
    pub policy_forward: f64,
    pub backward: f64,
    pub optimizer: f64,
}

/// The policy, its frozen reference (kept only when β > 0) and AdamW; and the ranks of
/// its data-parallel group, whose gradients it sums with its own before each optimizer step.
pub struct Learner {
    pub policy: Policy,
    pub reference: Option<Net>,
    pub optimizer: Optimizer,
    /// The data-parallel group ([`Solo`]: this learner alone). Each rank trains on its own
    /// groups of the step; the step's token and sequence totals, the gradients and the
    /// figures are summed across the group, so every rank takes the same optimizer step.
    pub ranks: Arc<dyn Comm>,
    /// The sampling engine's own copy of the weights (bf16 on a GPU), refreshed from the
    /// policy's after each optimizer step, inside the engine's barrier; `None`: the engine
    /// shares the policy's storage and sees each update in place.
    pub mirror: Option<WeightMirror>,
}

impl Learner {
    /// A learner alone (no data-parallel group).
    pub fn new(policy: Policy, reference: Option<Net>, optimizer: Optimizer) -> Self {
        Learner { policy, reference, optimizer, ranks: Arc::new(Solo), mirror: None }
    }

    /// Per completion, its estimate of KL(π_old ‖ π_ref) over its trained tokens, for the KL
    /// in the reward (verl's `apply_kl_penalty`, `use_kl_in_reward`: the penalty is β × its
    /// sum, [`crate::loss::kl_penalty`]). π_old is `old` (the sampler's log-probs), π_ref the
    /// reference net's, run here; `trained` as a `GroupBatch`'s (empty: every token).
    pub fn kl_estimates(
        &self,
        prompt: &[u32],
        completions: &[Vec<u32>],
        trained: &[Vec<bool>],
        old: &[Vec<f32>],
        estimator: KlEstimator,
        head_chunk: u64,
    ) -> crate::Result<Vec<KlEstimate>> {
        let Some(reference) = &self.reference else {
            return Err(crate::Error::Internal("the KL in the reward asked of a learner without a reference".into()));
        };
        let part = Part { completions, trained: Some(trained) };
        let stats = reference.parts_stats_chunked(prompt, &[part], head_chunk)?;
        let logp = stats[0].logp.to_dtype(candle_core::DType::F32)?.to_vec2::<f32>()?;
        Ok(completions
            .iter()
            .enumerate()
            .map(|(row, tokens)| {
                let n = tokens.len();
                let mask = trained.get(row).map(Vec::as_slice);
                crate::loss::kl_estimate(&old[row][..n], &logp[row][..n], mask, estimator)
            })
            .collect())
    }

    /// The step's figures over every rank: sums summed, the sampler gap's largest the
    /// largest. (Skipped updates need no sum: every rank took the same step, so skipped the
    /// same.)
    fn sum_over_ranks(&self, sums: &mut Sums, stats: &mut UpdateStats) -> crate::Result<()> {
        let figures = [sums.loss, sums.kl, sums.entropy, sums.clip, sums.truncated, sums.lagged_tokens];
        let figures =
            self.summed([&figures[..], &[sums.gap, sums.gap_tokens, stats.groups_recomputed as f32]].concat())?;
        (sums.loss, sums.kl, sums.entropy, sums.clip) = (figures[0], figures[1], figures[2], figures[3]);
        (sums.truncated, sums.lagged_tokens) = (figures[4], figures[5]);
        (sums.gap, sums.gap_tokens) = (figures[6], figures[7]);
        stats.groups_recomputed = figures[8] as usize;
        sums.gap_max = self.largest(sums.gap_max)?;
        Ok(())
    }

    /// The largest of every rank's `value`.
    fn largest(&self, value: f32) -> crate::Result<f32> {
        let all = wirl_model::comm::all_gather_bytes(self.ranks.as_ref(), &value.to_le_bytes())?;
        Ok(all
            .iter()
            .filter_map(|bytes| Some(f32::from_le_bytes(bytes.as_slice().try_into().ok()?)))
            .fold(value, f32::max))
    }

    /// Sums across the data-parallel group of `values` (themselves when alone).
    fn summed(&self, mut values: Vec<f32>) -> crate::Result<Vec<f32>> {
        self.ranks.all_reduce_sum_in_place(&mut values)?;
        Ok(values)
    }

    /// Whether the engine that samples computes the learner's log-probs to the bit: it
    /// shares the learner's weights (no converted copy) and the learner computes as the
    /// engine does (`Net::computes_as_the_engine`). Then a sampler gap above 0 is a bug.
    pub fn sampler_is_exact(&self) -> bool {
        self.mirror.is_none() && self.policy.net().computes_as_the_engine()
    }

    /// Update the policy on `groups`. `barrier`, when the policy's weights are shared with a
    /// sampling engine (`WeightsBarrier`), is held for each optimizer step. `stop` is asked
    /// between groups until the first optimizer step: `Ok(None)` then, nothing changed.
    /// `progress(k, n)` says that group `k` of `n` is being trained on.
    ///
    /// Over ~80 lines on purpose: the epochs over the spans, the stop asked (and agreed by the
    /// ranks) only before the first optimizer step, the step taken inside the engine's hold,
    /// and the epoch means, in one loop, so that where a stop may land reads beside the one
    /// place the weights change.
    pub fn update(
        &mut self,
        groups: &[GroupBatch],
        settings: &UpdateSettings,
        barrier: Option<&dyn WeightsBarrier>,
        stop: &dyn Fn() -> bool,
        progress: &mut dyn FnMut(usize, usize),
    ) -> crate::Result<Option<UpdateStats>> {
        let mut stats = UpdateStats::default();
        let data_parallel = self.ranks.size() > 1;
        // A rank with no groups still joins every collective of the step.
        if groups.is_empty() && !data_parallel {
            return Ok(Some(stats));
        }
        let (split, spans) = self.micro_batches(groups, settings);
        // The step's totals (the loss's token weights divide by them) over every rank's groups.
        let local_tokens: usize = groups.iter().map(GroupBatch::trainable_tokens).sum();
        let local_sequences: usize = groups.iter().map(|g| g.completions.len()).sum();
        let (step_tokens, step_sequences, micro_batches) = if data_parallel {
            // Exact in f32 up to 2^24 tokens a step.
            let totals = self.summed(vec![local_tokens as f32, local_sequences as f32, split.len() as f32])?;
            (totals[0] as usize, totals[1] as usize, totals[2] as usize)
        } else {
            (local_tokens, local_sequences, split.len())
        };
        let groups = &split[..];
        let timer = Instant::now();
        // A rank asked to stop still joins the step's collectives: all ranks then drop it.
        let never = || false;
        let local_stop: &dyn Fn() -> bool = if data_parallel { &never } else { stop };
        let Some((old, reference)) = self.before_update(groups, &spans, settings, local_stop)? else {
            return Ok(None);
        };
        stats.time.reference_forward = timer.elapsed().as_secs_f64();
        // The behaviour policy's log-probs: of groups sampled by older weights, and under a
        // rollout correction of every group whose sampler said them.
        let behaviour: Vec<Option<Tensor>> = groups
            .iter()
            .map(|g| {
                let weighed = g.sampler_lag > 0 || settings.rollout_correction.is_on();
                if weighed { g.sampled_logprobs(self.policy.net().device()) } else { Ok(None) }
            })
            .collect::<candle_core::Result<_>>()?;
        let inputs = LossInputs {
            groups,
            old: &old,
            reference: &reference,
            behaviour: &behaviour,
            settings,
            step_tokens,
            step_sequences,
            micro_batches,
        };
        let mut sums = Sums::default();
        let vars: Vec<&candle_core::Var> = self.policy.vars().iter().map(|(_, v)| v).collect();
        for epoch in 0..settings.inner_epochs {
            let mut grads = Gradients::new();
            let mut stopped = false;
            for (span, shared) in &spans {
                // Until the first update the step can still be abandoned whole.
                if epoch == 0 && stop() {
                    stopped = true;
                    break;
                }
                progress(span.start, groups.len());
                let micro = Micro { span: span.clone(), shared: *shared };
                self.train_micro_batches(&inputs, micro, epoch, &mut grads, &mut sums, &mut stats)?;
            }
            if data_parallel {
                // Every rank's gradients summed on every rank; and whether any was stopped.
                let stops = grads.all_reduce(&vars, self.ranks.as_ref(), &[f32::from(u8::from(stopped))])?;
                stopped = stops[0] > 0.0;
            }
            if stopped {
                return Ok(None);
            }
            let timer = Instant::now();
            if !grads.is_empty() {
                // No row samples while the weights change (they are the engine's too).
                let hold = barrier.map(WeightsBarrier::hold_weights).transpose()?;
                stats.weight_writes += u64::from(hold.is_some());
                let update = self.optimizer.step(&grads, settings.learning_rate, settings.max_grad_norm)?;
                if update.applied
                    && let Some(mirror) = &self.mirror
                {
                    // On the device, still inside the barrier: no row samples from a copy
                    // half old and half new.
                    mirror.refresh()?;
                }
                drop(hold);
                stats.grad_norm = update.grad_norm;
                stats.updates_skipped += usize::from(!update.applied);
            }
            stats.time.optimizer += timer.elapsed().as_secs_f64();
        }
        if data_parallel {
            self.sum_over_ranks(&mut sums, &mut stats)?;
        }
        let epochs = settings.inner_epochs as f32;
        stats.loss = sums.loss / epochs;
        stats.kl = sums.kl / epochs;
        stats.entropy = sums.entropy / epochs;
        stats.clip_fraction = sums.clip / epochs;
        stats.tis_truncated = if sums.lagged_tokens > 0.0 { sums.truncated / sums.lagged_tokens } else { 0.0 };
        stats.sampler_gap = (sums.gap_tokens > 0.0).then(|| SamplerGap {
            mean: sums.gap / sums.gap_tokens,
            max: sums.gap_max,
            worst: sums.gap_worst,
        });
        Ok(Some(stats))
    }

    /// The micro-batches of every group, in order, and each group's span among them, with
    /// whether they share one pass of the prompt: a group split only by length, on the
    /// recomputing backward (micro-batches of at most N rows exist to bound memory, and
    /// sharing the prompt keeps all of a layer's rows alive at once).
    fn micro_batches(&self, groups: &[GroupBatch], settings: &UpdateSettings) -> (Vec<GroupBatch>, Vec<Span>) {
        if settings.rows_per_pass > 0 {
            let passes = pack(groups, settings.rows_per_pass);
            let spans = (0..passes.len()).map(|k| (k..k + 1, false)).collect();
            return (passes, spans);
        }
        let mut split: Vec<GroupBatch> = Vec::new();
        let mut spans = Vec::with_capacity(groups.len());
        for group in groups {
            let width = group.completions.iter().map(Vec::len).max().unwrap_or(0).max(1);
            let recomputes =
                self.policy.net().attention_graph_bytes(group.prompt.len(), group.completions.len(), width)
                    > settings.memory.recompute_above;
            let shared = settings.micro_batch_rows == 0 && recomputes;
            let start = split.len();
            split.extend(group.split(settings.micro_batch_rows, settings.split_by_length, shared));
            spans.push((start..split.len(), shared));
        }
        (split, spans)
    }

    /// Old log-probs (μ > 1) and the reference's, per micro-batch, before any update of this
    /// step. `None` when `stop()` said so.
    #[allow(clippy::type_complexity)]
    fn before_update(
        &self,
        groups: &[GroupBatch],
        spans: &[Span],
        settings: &UpdateSettings,
        stop: &dyn Fn() -> bool,
    ) -> crate::Result<Option<(Vec<Option<Tensor>>, Vec<Option<Tensor>>)>> {
        let mut old = Vec::new();
        for group in groups {
            if stop() {
                return Ok(None);
            }
            // A converted copy's log-probs (a mirror) are rounded: not the policy's.
            if settings.inner_epochs > 1
                && group.sampler_lag == 0
                && self.mirror.is_none()
                && let Some(sampled) = group.sampled_logprobs(self.policy.net().device())?
            {
                old.push(Some(sampled));
            } else if settings.inner_epochs > 1 {
                // Read-only: the detached net builds no graph.
                let net = self.policy.net().detached();
                let chunk = settings.memory.head_chunk;
                let mut stats = net.parts_stats_chunked(&group.prompt, &[group.part()], chunk)?;
                old.push(Some(stats.pop().expect("one part").logp));
            } else {
                old.push(None);
            }
        }
        // The reference's: a group's micro-batches share one pass of its prompt. Not with β 0
        // in the loss (the KL in the reward was taken before the advantages).
        let mut reference = Vec::new();
        for (span, _) in spans {
            if stop() {
                return Ok(None);
            }
            let micro = &groups[span.clone()];
            match &self.reference {
                Some(net) if settings.loss.beta > 0.0 => {
                    let parts: Vec<Part<'_>> = micro.iter().map(GroupBatch::part).collect();
                    let stats = net.parts_stats_chunked(&micro[0].prompt, &parts, settings.memory.head_chunk)?;
                    reference.extend(stats.into_iter().map(|s| Some(s.logp.detach())));
                }
                _ => reference.extend(micro.iter().map(|_| None)),
            }
        }
        Ok(Some((old, reference)))
    }

    /// One group's micro-batches: forward, loss, backward, gradients summed into `grads`;
    /// the loss figures into `sums`, the time and recomputations into `stats`.
    fn train_micro_batches(
        &self,
        inputs: &LossInputs<'_>,
        micro: Micro,
        epoch: usize,
        grads: &mut Gradients,
        sums: &mut Sums,
        stats: &mut UpdateStats,
    ) -> crate::Result<()> {
        let (groups, settings) = (inputs.groups, inputs.settings);
        let timer = Instant::now();
        let mut forward_time = None;
        // Micro-batch k's loss from its token stats; the forward ends where the first loss
        // begins (when recomputing, that is the graph-free pass and the head).
        let mut loss_of = |k: usize, token_stats: &TokenStats| {
            forward_time.get_or_insert_with(|| timer.elapsed());
            inputs.loss(k, token_stats, epoch == 0)
        };
        let span = micro.span;
        let batches = &groups[span.clone()];
        let results = if micro.shared && batches.len() > 1 {
            let parts: Vec<Part<'_>> = batches.iter().map(GroupBatch::part).collect();
            let results = self.policy.parts_loss_and_grads(
                &batches[0].prompt,
                &parts,
                &settings.memory,
                grads,
                |j, token_stats| loss_of(span.start + j, token_stats),
            )?;
            stats.groups_recomputed += batches.len();
            results
        } else {
            let mut results = Vec::with_capacity(batches.len());
            for k in span {
                let (result, recomputed) = self.policy.part_loss_and_grads(
                    &groups[k].prompt,
                    groups[k].part(),
                    &settings.memory,
                    grads,
                    |token_stats| loss_of(k, token_stats),
                )?;
                stats.groups_recomputed += usize::from(recomputed);
                results.push(result);
            }
            results
        };
        if grads.is_empty() {
            return Err(crate::Error::Internal("the loss has no gradient with respect to the policy's weights".into()));
        }
        for (parts, (cut, gap)) in results {
            if let (Some((cut, tokens)), 0) = (cut, epoch) {
                sums.truncated += cut;
                sums.lagged_tokens += tokens;
            }
            if let Some(gap) = gap {
                sums.gap += gap.sum;
                if gap.max > sums.gap_max {
                    sums.gap_worst = gap.worst.or(sums.gap_worst);
                }
                sums.gap_max = sums.gap_max.max(gap.max);
                sums.gap_tokens += gap.tokens;
            }
            sums.loss += parts.loss.to_scalar::<f32>()?;
            sums.kl += parts.kl;
            sums.entropy += parts.entropy;
            sums.clip += parts.clip_fraction / inputs.micro_batches as f32;
        }
        let forward_time = forward_time.unwrap_or_default();
        stats.time.policy_forward += forward_time.as_secs_f64();
        stats.time.backward += (timer.elapsed() - forward_time).as_secs_f64();
        Ok(())
    }
}

/// The rows of `groups` packed into passes of at most `rows` completions, rows of different
/// groups side by side. On a GPU a forward and backward cost about as much for 8 rows as for
/// 64 — a fixed price in kernel launches (0.25 s per group on an H200, docs/BENCHMARKS.md) —
/// so training group by group pays it once per group; TRL trains one padded batch.
///
/// A pass is a batch as a group's is: the prompt its rows share (their prompts' common
/// beginning, run once), then per row the rest of its own prompt followed by its completion,
/// the prompt's tokens marked as carrying no loss (as a multi-turn ledger's environment
/// tokens are). Every token sits at its position and attends to what it did in its group, and
/// the loss's token weights depend only on the step's totals: loss and gradients are the
/// group-by-group ones. Rows pack with rows of the same sampler lag and the same knowledge of
/// their sampler's log-probs (a pass has them for every row or for none) and the same first
/// token (a pass shares at least one); sorted by length, so that a pass pads little. A group
/// with an empty prompt (nothing to share) stays as it is.
fn pack(groups: &[GroupBatch], rows: usize) -> Vec<GroupBatch> {
    struct Row<'g> {
        group: &'g GroupBatch,
        index: usize,
    }
    let mut bins: std::collections::BTreeMap<(u64, bool, u32), Vec<Row<'_>>> = Default::default();
    let mut passes = Vec::new();
    for group in groups {
        let Some(&first) = group.prompt.first() else {
            passes.push(group.clone());
            continue;
        };
        let known = group.sampler_logprobs.len() == group.completions.len()
            && group.sampler_logprobs.iter().zip(&group.completions).all(|(l, c)| l.len() == c.len());
        let bin = bins.entry((group.sampler_lag, known, first)).or_default();
        bin.extend((0..group.completions.len()).map(|index| Row { group, index }));
    }
    for ((sampler_lag, known, _), mut bin) in bins {
        bin.sort_by_key(|r| r.group.prompt.len() + r.group.completions[r.index].len());
        // Passes of near-equal size: 65 rows at 64 a pass make two of 33 and 32, not 64 and 1.
        let count = bin.len().div_ceil(rows.max(1));
        let mut rest = &bin[..];
        for k in 0..count {
            let take = rest.len().div_ceil(count - k);
            let (pass, after) = rest.split_at(take);
            rest = after;
            let first = &pass[0].group.prompt;
            let shared = pass
                .iter()
                .fold(first.len(), |n, r| n.min(first.iter().zip(&r.group.prompt).take_while(|(a, b)| a == b).count()));
            let mut batch = GroupBatch {
                prompt: first[..shared].to_vec(),
                completions: Vec::with_capacity(pass.len()),
                advantages: Vec::with_capacity(pass.len()),
                token_advantages: Vec::new(),
                trainable: Vec::with_capacity(pass.len()),
                sampler_logprobs: Vec::new(),
                sampler_lag,
            };
            for Row { group, index } in pass {
                let (own, completion) = (&group.prompt[shared..], &group.completions[*index]);
                batch.completions.push(own.iter().chain(completion).copied().collect());
                batch.advantages.push(group.advantages[*index]);
                // Per-token terms where any row of the pass has them (0 for the rest).
                if pass.iter().any(|r| !r.group.token_advantages.is_empty()) {
                    let mut terms = group.token_advantages.get(*index).cloned().unwrap_or_default();
                    terms.resize(completion.len(), 0.0);
                    batch.token_advantages.push(std::iter::repeat_n(0.0, own.len()).chain(terms).collect());
                }
                // An empty mask trains every token; a row without one, none (as `Kept` reads them).
                let mut mask = if group.trainable.is_empty() {
                    vec![true; completion.len()]
                } else {
                    group.trainable.get(*index).cloned().unwrap_or_default()
                };
                mask.resize(completion.len(), false);
                batch.trainable.push(std::iter::repeat_n(false, own.len()).chain(mask).collect());
                if known {
                    let logprobs = &group.sampler_logprobs[*index];
                    batch
                        .sampler_logprobs
                        .push(std::iter::repeat_n(0.0, own.len()).chain(logprobs.iter().copied()).collect());
                }
            }
            passes.push(batch);
        }
    }
    passes
}

/// A group's micro-batches (a range of them) and whether they share one pass of its prompt.
type Span = (std::ops::Range<usize>, bool);

/// One group's micro-batches, as [`Learner::train_micro_batches`] takes them.
struct Micro {
    span: std::ops::Range<usize>,
    shared: bool,
}

/// The loss figures of an update, summed over its epochs; and over the first epoch, the
/// tokens of lagged groups and how many of them the importance weight's cap truncated.
#[derive(Default)]
struct Sums {
    loss: f32,
    kl: f32,
    entropy: f32,
    clip: f32,
    truncated: f32,
    lagged_tokens: f32,
    /// The sampler gap's sum over tokens, its largest, and its tokens.
    gap: f32,
    gap_max: f32,
    gap_tokens: f32,
    gap_worst: Option<GapToken>,
}

/// What the loss of a micro-batch needs beyond its token stats, by micro-batch.
struct LossInputs<'a> {
    groups: &'a [GroupBatch],
    old: &'a [Option<Tensor>],
    reference: &'a [Option<Tensor>],
    behaviour: &'a [Option<Tensor>],
    settings: &'a UpdateSettings,
    step_tokens: usize,
    step_sequences: usize,
    /// Micro-batches of the step over every rank (a clip fraction's share of the mean).
    micro_batches: usize,
}

impl LossInputs<'_> {
    /// Micro-batch k's loss (the tensor to differentiate) and its parts, with, for a group
    /// sampled by older weights, (tokens truncated, tokens) of its importance weights, and
    /// (`first_epoch`: before any update) for one sampled by these weights with the sampler's
    /// log-probs known, its gap to them.
    #[allow(clippy::type_complexity)]
    fn loss(
        &self,
        k: usize,
        token_stats: &TokenStats,
        first_epoch: bool,
    ) -> candle_core::Result<(Tensor, (LossParts, (Option<(f32, f32)>, Option<GapSums>)))> {
        let (group, settings) = (&self.groups[k], self.settings);
        let lengths: Vec<usize> = group.completions.iter().map(Vec::len).collect();
        let width = token_stats.logp.dim(1)?;
        let (aggregation, tokens, sequences, max_tokens) =
            (settings.aggregation, self.step_tokens, self.step_sequences, settings.max_tokens);
        let weights = if group.trainable.is_empty() {
            token_weights(&lengths, width, aggregation, tokens, sequences, max_tokens)
        } else {
            masked_token_weights(&group.trainable, width, aggregation, tokens, sequences, max_tokens)
        };
        let device = token_stats.logp.device();
        let weights = Tensor::from_vec(weights, (lengths.len(), width), device)?;
        let gap = match (group.sampler_lag, first_epoch) {
            (0, true) => group
                .sampled_logprobs(device)?
                .map(|sampled| gap_sums(&token_stats.logp, &sampled, &weights, &group.completions))
                .transpose()?,
            _ => None,
        };
        // `[G]`, or `[G, width]` with per-token terms; a row's weight is `[G, width]` either way.
        let advantages = group.advantages_tensor(width, device)?;
        let by_token = if advantages.rank() == 1 { advantages.unsqueeze(1)? } else { advantages.clone() };
        let old_logp = match &self.old[k] {
            Some(old) => old.clone(),
            None => token_stats.logp.detach(),
        };
        // Sampled by older weights: each token's advantage carries the truncated importance
        // weight (a weight ≥ 0 commutes with the clipped minimum).
        let (advantages, cut) = match &self.behaviour[k] {
            Some(behaviour) if settings.rollout_correction.is_on() => {
                let active = weights.gt(0.0)?.to_dtype(weights.dtype())?;
                let (weight, cut) = settings.rollout_correction.weights(&old_logp, behaviour, &active)?;
                let tokens = active.sum_all()?.to_scalar::<f32>()?;
                (weight.broadcast_mul(&by_token)?, Some((cut, tokens)))
            }
            Some(behaviour) => {
                let ratio = (&old_logp - behaviour)?.exp()?;
                let weight = ratio.clamp(0.0, settings.tis_cap)?;
                let active = weights.gt(0.0)?.to_dtype(weights.dtype())?;
                let cut = (ratio.gt(settings.tis_cap)?.to_dtype(weights.dtype())? * &active)?
                    .sum_all()?
                    .to_scalar::<f32>()?;
                let tokens = active.sum_all()?.to_scalar::<f32>()?;
                (weight.broadcast_mul(&by_token)?, Some((cut, tokens)))
            }
            None => (advantages, None),
        };
        let parts = grpo_loss(
            &token_stats.logp,
            &old_logp,
            self.reference[k].as_ref(),
            Some(&token_stats.entropy),
            &advantages,
            &weights,
            &settings.loss,
        )?;
        Ok((parts.loss.clone(), (parts, (cut, gap))))
    }
}

/// One micro-batch's sampler gap: |Δ log-prob| summed over its trained tokens, the largest,
/// and the tokens.
#[derive(Clone, Copy, Debug)]
struct GapSums {
    sum: f32,
    max: f32,
    tokens: f32,
    worst: Option<GapToken>,
}

/// The gap between the trainer's log-probs `logp` and the sampler's `sampled` over the tokens
/// whose loss weight is above 0 (padding and a ledger's environment tokens are not sampled).
/// The three figures come back to the host together (one device sync, not three); where the
/// gap is above 0, the token of the largest (`completions`: the rows' tokens) too.
fn gap_sums(
    logp: &Tensor,
    sampled: &Tensor,
    weights: &Tensor,
    completions: &[Vec<u32>],
) -> candle_core::Result<GapSums> {
    let active = weights.gt(0.0)?.to_dtype(candle_core::DType::F32)?;
    let logp = logp.detach().to_dtype(candle_core::DType::F32)?;
    let gap = ((&logp - sampled)?.abs()? * &active)?;
    let figures = Tensor::stack(&[gap.sum_all()?, gap.max_all()?, active.sum_all()?], 0)?.to_vec1::<f32>()?;
    let worst = if figures[1] > 0.0 {
        let (width, at) = (gap.dim(1)?, gap.flatten_all()?.argmax(0)?.to_scalar::<u32>()? as usize);
        let (row, position) = (at / width, at % width);
        let value = |t: &Tensor| -> candle_core::Result<f32> { t.get(row)?.get(position)?.to_scalar::<f32>() };
        completions
            .get(row)
            .and_then(|c| c.get(position))
            .map(|&token| -> candle_core::Result<GapToken> {
                Ok(GapToken { token, position, trainer: value(&logp)?, sampler: value(sampled)? })
            })
            .transpose()?
    } else {
        None
    };
    Ok(GapSums { sum: figures[0], max: figures[1], tokens: figures[2], worst })
}

#[cfg(test)]
mod tests {
    use super::GroupBatch;

    fn group(prompt: usize, lengths: &[usize]) -> GroupBatch {
        GroupBatch {
            prompt: vec![1; prompt],
            completions: lengths.iter().map(|&n| vec![2; n]).collect(),
            advantages: (0..lengths.len()).map(|i| i as f32).collect(),
            token_advantages: Vec::new(),
            trainable: Vec::new(),
            sampler_logprobs: Vec::new(),
            sampler_lag: 0,
        }
    }

    #[test]
    fn one_long_completion_trains_apart() {
        // The default job's shape: a 113-token prompt, one completion ran to 64 tokens.
        let g = group(113, &[64, 5, 6, 7, 5, 6, 5, 8]);
        assert_eq!(g.length_parts(false), vec![vec![1, 4, 6, 2, 5, 3, 7], vec![0]]);
        assert_eq!(g.length_parts(true), g.length_parts(false));
        let split = g.split(0, true, false);
        assert_eq!(split.iter().map(|b| b.completions.len()).collect::<Vec<_>>(), [7, 1]);
        // Rows keep their advantages.
        assert_eq!(split[1].advantages, [0.0]);
        assert_eq!(split[0].advantages, [1.0, 4.0, 6.0, 2.0, 5.0, 3.0, 7.0]);
        // With micro-batches of 4 rows as well.
        let sizes: Vec<usize> = g.split(4, true, false).iter().map(|b| b.completions.len()).collect();
        assert_eq!(sizes, [4, 3, 1]);
    }

    #[test]
    fn similar_lengths_stay_one_batch() {
        let g = group(113, &[12, 15, 9, 20, 14, 11, 18, 16]);
        assert_eq!(g.length_parts(false).len(), 1);
        assert_eq!(g.length_parts(true).len(), 1);
        // Off, or a short prompt with wildly different lengths: as asked.
        assert_eq!(g.split(0, false, false)[0].completions, g.completions);
        assert_eq!(group(0, &[1, 200]).length_parts(false), vec![vec![0], vec![1]]);
    }

    #[test]
    fn passes_pack_rows_of_many_groups_behind_their_shared_prompt() {
        use super::pack;
        // Two groups share a chat template's first tokens (1, 1, 7, ...), a third starts
        // elsewhere; the second is a multi-turn group (its third token is the environment's).
        let a = GroupBatch { prompt: vec![1, 1, 7, 8], ..group(0, &[2, 5]) };
        let mut b = GroupBatch { prompt: vec![1, 1, 9], ..group(0, &[3]) };
        b.trainable = vec![vec![true, true, false]];
        let c = GroupBatch { prompt: vec![4, 4], ..group(0, &[1, 1, 1]) };
        let passes = pack(&[a, b, c.clone()], 64);
        assert_eq!(passes.len(), 2, "one pass per first token");
        let ab = &passes[0];
        assert_eq!(ab.prompt, [1, 1], "the prompts' common beginning, once");
        // Sorted by length: a's short row (4 + 2), b's row (3 + 3), a's long row (4 + 5).
        assert_eq!(ab.completions, [vec![7, 8, 2, 2], vec![9, 2, 2, 2], vec![7, 8, 2, 2, 2, 2, 2]]);
        assert_eq!(ab.advantages, [0.0, 0.0, 1.0]);
        assert_eq!(
            ab.trainable,
            [
                vec![false, false, true, true],
                vec![false, true, true, false],
                vec![false, false, true, true, true, true, true]
            ]
        );
        assert!(ab.sampler_logprobs.is_empty(), "unknown stays unknown");
        assert_eq!(passes[1].prompt, c.prompt);
        assert_eq!(passes[1].completions, c.completions);
        // Known log-probs travel with their tokens, zeros before them; near-equal passes.
        let mut known = group(3, &[2, 2, 2, 2, 2]);
        known.sampler_logprobs = vec![vec![-1.0, -2.0]; 5];
        let passes = pack(&[known], 2);
        assert_eq!(passes.iter().map(|p| p.completions.len()).collect::<Vec<_>>(), [2, 2, 1]);
        assert_eq!(passes[0].prompt, [1, 1, 1]);
        assert_eq!(passes[0].sampler_logprobs[0], [-1.0, -2.0]);
        // A row whose sampler log-probs do not cover it makes its group's unknown; a lag
        // packs apart.
        let mut partial = GroupBatch { prompt: vec![1, 1, 5], ..group(0, &[2, 2]) };
        partial.sampler_logprobs = vec![vec![-1.0, -1.0], vec![-1.0]];
        let mut lagged = GroupBatch { prompt: vec![1, 1, 6], ..group(0, &[2]) };
        lagged.sampler_lag = 1;
        let passes = pack(&[partial, lagged], 64);
        assert_eq!(passes.len(), 2);
        assert!(passes.iter().all(|p| p.sampler_logprobs.is_empty()));
        assert_eq!(passes.iter().map(|p| p.sampler_lag).collect::<Vec<_>>(), [0, 1]);
    }

    #[test]
    fn per_token_advantages_travel_with_their_tokens() {
        use super::pack;
        // b's rows carry turn terms; a's none (0 in a pass with b), and each row's advantage
        // is added at every token.
        let a = GroupBatch { prompt: vec![1, 1, 7], ..group(0, &[2]) };
        let mut b = GroupBatch { prompt: vec![1, 1, 9, 9], ..group(0, &[3, 1]) };
        b.token_advantages = vec![vec![0.5, 0.5, -2.0], vec![3.0]];
        let passes = pack(&[a.clone(), b.clone()], 64);
        assert_eq!(passes.len(), 1);
        let pass = &passes[0];
        // Sorted by length (stable): a's row (1 + 2), b's short row (2 + 1), b's long row (2 + 3).
        assert_eq!(pass.completions, [vec![7, 2, 2], vec![9, 9, 2], vec![9, 9, 2, 2, 2]]);
        assert_eq!(pass.token_advantages, [vec![0.0; 3], vec![0.0, 0.0, 3.0], vec![0.0, 0.0, 0.5, 0.5, -2.0]]);
        let device = candle_core::Device::Cpu;
        let tensor = pass.advantages_tensor(5, &device).unwrap().to_vec2::<f32>().unwrap();
        // Row advantages: a's 0; b's short row 1, its long row 0.
        assert_eq!(tensor[0], [0.0; 5]);
        assert_eq!(tensor[1], [1.0, 1.0, 4.0, 1.0, 1.0]);
        assert_eq!(tensor[2], [0.0, 0.0, 0.5, 0.5, -2.0]);
        // Without terms: one advantage per row; a micro-batch keeps its rows' terms.
        assert_eq!(pack(&[a], 64)[0].advantages_tensor(5, &device).unwrap().rank(), 1);
        assert_eq!(b.subset(&[1]).token_advantages, [vec![3.0]]);
    }

    #[test]
    fn a_shared_prompt_makes_a_cut_cheaper() {
        // Unshared, cutting off the 30-token completion costs the 113-token prompt again
        // (145 + 70 + 145 + 30 > 145 + 8 × 30); shared, it does not (32 + 70 + 32 + 30).
        let g = group(113, &[30, 10, 10, 10, 10, 10, 10, 10]);
        assert_eq!(g.length_parts(false).len(), 1);
        assert_eq!(g.length_parts(true), vec![vec![1, 2, 3, 4, 5, 6, 7], vec![0]]);
    }
}
