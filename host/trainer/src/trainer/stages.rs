//! The step's values, and the stages between them that are functions of their inputs alone:
//! which groups carry a signal, which of them train, each one's batch for the learner, the
//! step-wide whitening, what of the next step is begun during the update, and the step's
//! figures. `Trainer::step` (step.rs) calls them between the stages that touch the engine,
//! the plugins, the learner and the other ranks; each is tested here on groups made by hand.
//!
//! The values, in the step's order: `Drawn` (trainer.rs) → `Sampled`/`Episodes` (rollout) →
//! [`Rolled`] (its [`Groups`] scored) → [`Advantaged`] → [`Updated`] → the record and
//! [`step_metrics`]; and what of the next step the update begins ([`begin_next`]).

use crate::distill::DistillFigures;
use crate::metrics::{PhasePeaks, SkippedTaskEntry, StepMetrics, StepTimes, TaskMetrics};
use std::collections::BTreeMap;
use std::time::Instant;
use wirl_engine::FinishReason;
use wirl_grpo::{AdvantageMode, GroupBatch, Objective, UpdateStats};
use wirl_rollout::{EpisodeTimes, RolloutGroup, SkippedTask};

/// The step's scored groups, each with the task (index in the run) it belongs to, the draw
/// it came from (0: the step's own; more under `grpo.dynamic_sampling`) and the rank that
/// rolled it.
#[derive(Default)]
pub(super) struct Groups {
    pub(super) groups: Vec<RolloutGroup>,
    pub(super) owners: Vec<usize>,
    pub(super) draws: Vec<usize>,
    pub(super) ranks: Vec<usize>,
}

impl Groups {
    pub(super) fn push(&mut self, task: usize, (draw, rank): (usize, usize), group: RolloutGroup) {
        self.groups.push(group);
        self.owners.push(task);
        self.draws.push(draw);
        self.ranks.push(rank);
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&RolloutGroup, usize)> {
        self.groups.iter().zip(self.owners.iter().copied())
    }

    pub(super) fn append(&mut self, other: Groups) {
        self.groups.extend(other.groups);
        self.owners.extend(other.owners);
        self.draws.extend(other.draws);
        self.ranks.extend(other.ranks);
    }
}

/// A group's signal: its usable trajectories and their rewards, where they differ (or the
/// advantages whiten over the step).
pub(super) type Signal = Option<(Vec<usize>, Vec<f32>)>;

/// This rank's (or, summed, the step's) completions whose rewards carry the KL penalty: the
/// sum of each one's mean estimate per token, and how many.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RewardKl {
    pub(super) means: f64,
    pub(super) completions: usize,
}

/// The step's groups rolled and scored (every draw's), and what the later stages need of
/// how: the tasks skipped, the draws made, whether they were sampled a step behind.
pub(super) struct Rolled {
    pub(super) groups: Groups,
    pub(super) skipped: Vec<(usize, SkippedTask)>,
    /// 1, or more under `grpo.dynamic_sampling`.
    pub(super) draws: usize,
    /// 1 when the step's own draw was sampled by the weights before the previous update.
    pub(super) sampler_lag: u64,
    pub(super) episode_times: EpisodeTimes,
    /// Peak resident memory while generating and while scoring.
    pub(super) peaks: PhasePeaks,
}

/// The learner's batches, and per task how many groups were kept and how many could not be.
pub(super) struct Advantaged {
    pub(super) batches: Vec<GroupBatch>,
    pub(super) kept_of_task: Vec<usize>,
    pub(super) unusable_of_task: Vec<usize>,
    /// Whether the groups were sampled by the weights before the previous update (a lag).
    pub(super) sampler_lag: u64,
    /// Under `grpo.kl_in_reward`: the KL of the completions whose rewards it shaped.
    pub(super) reward_kl: RewardKl,
    /// Under `[distill]`: the student's reverse KL to the teacher over the trained tokens.
    pub(super) distill: Option<DistillFigures>,
}

/// What the update gave: its figures, the learning rate it used, and what it settled of the
/// objective's controllers.
pub(super) struct Updated {
    pub(super) stats: UpdateStats,
    pub(super) learning_rate: f64,
    /// Under `grpo.kl_in_reward`: the β the step's rewards were shaped with, and the mean KL
    /// per token of the shaped completions (every rank's).
    pub(super) reward_kl: Option<(f64, f64)>,
    /// Under `[distill]`: the teacher's pass over this rank's trained groups.
    pub(super) distill: Option<DistillFigures>,
}

/// Seconds spent by stage.
#[derive(Default)]
pub(super) struct Clock {
    pub(super) draw: f64,
    pub(super) generate: f64,
    /// Since the requests were sent (with a lag, by the previous step).
    pub(super) sampling_span: f64,
    pub(super) episodes: f64,
    pub(super) score: f64,
    pub(super) agents: f64,
    pub(super) train: f64,
}

impl Clock {
    /// Add an extra draw's stages (its generation after the step's, its scoring besides).
    pub(super) fn add(&mut self, other: &Clock) {
        self.draw += other.draw;
        self.generate += other.generate;
        self.episodes += other.episodes;
        self.score += other.score;
    }
}

/// Where a step's time and memory went.
pub(super) struct Measured {
    pub(super) peaks: PhasePeaks,
    /// The process's peak resident memory so far.
    pub(super) peak_rss: Option<u64>,
    pub(super) clock: Clock,
    pub(super) episodes: EpisodeTimes,
    pub(super) started: Instant,
    /// Prompt positions the engine took from its prefix cache, and computed, since the
    /// previous step's record.
    pub(super) prompt_positions: (u64, u64),
    /// What the step's rewards asked of the engine (LLM judges).
    pub(super) rewards_inference: wirl_rollout::InferenceFigures,
}

/// The turn terms of a group's `usable` episodes (per episode, per model turn), when any of
/// them had turn rewards (`wirl:rl@0.2.0` environments); an episode given none has 0 for
/// each of its turns. See `wirl_grpo::credit`.
fn turn_terms(group: &RolloutGroup, usable: &[usize], mode: AdvantageMode) -> Option<Vec<Vec<f32>>> {
    if usable.iter().all(|&i| group.scores[i].turn_rewards.is_empty()) {
        return None;
    }
    let rewards: Vec<Vec<f32>> = usable
        .iter()
        .map(|&i| {
            let mut rewards = group.scores[i].turn_rewards.clone();
            rewards.resize(group.trajectories[i].turn_starts.len(), 0.0);
            rewards
        })
        .collect();
    Some(wirl_grpo::turn_advantages(&rewards, mode))
}

/// The trajectories of `group` that take part in advantages (scored, or failed with a
/// reward), when at least two do and it has a prompt: fewer cannot be compared.
fn usable(group: &RolloutGroup) -> Option<Vec<usize>> {
    let usable: Vec<usize> = (0..group.scores.len()).filter(|&i| group.scores[i].status.usable()).collect();
    (usable.len() >= 2 && !group.prompt.is_empty()).then_some(usable)
}

/// A group's usable trajectories and their rewards (shaped: `objective.overlong`, against
/// its task's `max_tokens`) when they can train it: not all rewards equal — or the
/// advantages whiten over the step, its turns' own rewards tell them apart, or a teacher
/// (`distilling`) gives every token a signal.
pub(super) fn signal(group: &RolloutGroup, objective: &Objective, max_tokens: usize, distilling: bool) -> Signal {
    let usable = usable(group)?;
    let rewards: Vec<f32> = usable
        .iter()
        .map(|&i| {
            let length = group.trajectories[i].tokens.len();
            let shaping = objective
                .overlong
                .map_or(0.0, |o| wirl_grpo::overlong_penalty(length, max_tokens, o.buffer, o.penalty as f32));
            group.scores[i].reward + shaping
        })
        .collect();
    let turns_differ = || {
        turn_terms(group, &usable, objective.advantage).is_some_and(|terms| terms.iter().flatten().any(|&a| a != 0.0))
    };
    (objective.advantage.whitened() || rewards.iter().any(|&r| r != rewards[0]) || distilling || turns_differ())
        .then_some((usable, rewards))
}

/// Under dynamic sampling: this rank's groups with signal counted per (draw, rank) cell,
/// `draw × ranks + rank`, over `max_draws` draws — summed over the ranks, every rank knows
/// each group's place in the step.
pub(super) fn signal_cells(groups: &Groups, signal: &[bool], ranks: usize, max_draws: usize) -> Vec<f32> {
    let mut counts = vec![0f32; max_draws * ranks];
    for ((&draw, &rank), &signal) in groups.draws.iter().zip(&groups.ranks).zip(signal) {
        counts[draw * ranks + rank] += f32::from(u8::from(signal));
    }
    counts
}

/// Per group, whether it trains under dynamic sampling: it has a signal and is among the
/// first `prompts_per_step` with one in the order one trainer draws them — draw by draw,
/// rank by rank within a draw (`counts`: [`signal_cells`] summed over the ranks).
pub(super) fn first_with_signal(
    groups: &Groups,
    signal: &[bool],
    counts: &[f32],
    ranks: usize,
    prompts_per_step: usize,
) -> Vec<bool> {
    // Each cell's groups with signal come after every earlier cell's.
    let mut before = vec![0usize; counts.len()];
    for c in 1..counts.len() {
        before[c] = before[c - 1] + counts[c - 1] as usize;
    }
    let mut seen = vec![0usize; counts.len()];
    groups
        .draws
        .iter()
        .zip(&groups.ranks)
        .zip(signal)
        .map(|((&draw, &rank), &signal)| {
            let c = draw * ranks + rank;
            let place = before[c] + seen[c];
            seen[c] += usize::from(signal);
            signal && place < prompts_per_step
        })
        .collect()
}

/// How each group turned into the learner's batches.
pub(super) struct Batched {
    pub(super) batches: Vec<GroupBatch>,
    pub(super) kept_of_task: Vec<usize>,
    pub(super) unusable_of_task: Vec<usize>,
}

/// The learner's batch of each group that trains (`trains`, with its `signals`, its rewards
/// as the KL in the reward left them), in order; per task (of `tasks`), the groups kept and
/// those that could not compare (fewer than two usable trajectories, or no prompt).
/// `sampler_lag` is the step's own draw's (an extra draw's groups were sampled by this
/// step's weights); `distilling`: a group of equal rewards trains on the teacher's signal.
pub(super) fn batches(
    groups: &Groups,
    signals: Vec<Signal>,
    trains: &[bool],
    tasks: usize,
    objective: &Objective,
    sampler_lag: u64,
    distilling: bool,
) -> Batched {
    let mut kept_of_task = vec![0usize; tasks];
    let mut unusable_of_task = vec![0usize; tasks];
    let batches = groups
        .iter()
        .zip(&groups.draws)
        .zip(trains)
        .zip(signals)
        .filter_map(|((((group, t), &draw), &trains), signal)| {
            if usable(group).is_none() {
                unusable_of_task[t] += 1;
                return None;
            }
            let (usable, rewards) = signal?;
            if !trains {
                return None;
            }
            let sampler_lag = if draw == 0 { sampler_lag } else { 0 };
            let batch = group_batch(group, &usable, &rewards, objective, sampler_lag, distilling)?;
            kept_of_task[t] += 1;
            Some(batch)
        })
        .collect();
    Batched { batches, kept_of_task, unusable_of_task }
}

/// One group's batch: its `usable` completions with their advantages from `rewards`, their
/// turns' terms, which tokens train, and the sampler's log-probs. `None` when nothing tells
/// its completions apart.
fn group_batch(
    group: &RolloutGroup,
    usable: &[usize],
    rewards: &[f32],
    objective: &Objective,
    sampler_lag: u64,
    distilling: bool,
) -> Option<GroupBatch> {
    let turns = turn_terms(group, usable, objective.advantage);
    let advantages = match (wirl_grpo::group_advantages(rewards, objective.advantage), &turns) {
        (Some(advantages), _) => advantages,
        // Equal outcomes, turns told apart by their own rewards; or distillation's tokens
        // told apart by the teacher.
        (None, Some(_)) => vec![0.0; rewards.len()],
        (None, None) if distilling => vec![0.0; rewards.len()],
        (None, None) => return None,
    };
    let multi_turn = usable.iter().any(|&i| !group.trajectories[i].trainable.is_empty());
    let truncated = |i: usize| objective.mask_truncated && group.trajectories[i].finish == FinishReason::Length;
    Some(GroupBatch {
        prompt: group.prompt.clone(),
        completions: usable.iter().map(|&i| group.trajectories[i].tokens.clone()).collect(),
        advantages,
        token_advantages: turns.map(|terms| turn_advantages(group, usable, terms)).unwrap_or_default(),
        trainable: if multi_turn || usable.iter().any(|&i| truncated(i)) {
            trainable_tokens(group, usable, truncated)
        } else {
            Vec::new()
        },
        // The sampler's log-probs: the behaviour policy's with a lag; without one, the old
        // log-probs of μ > 1 when the sampler shares the weights (not from a converted copy,
        // bf16 on a GPU: the learner then runs the old pass), and either way what the
        // trainer's own log-probs are compared with.
        sampler_logprobs: usable.iter().map(|&i| group.trajectories[i].logprobs.clone()).collect(),
        sampler_lag,
    })
}

/// Each turn's term on its tokens, for the usable rows (the environment's tokens after a
/// turn carry no loss).
fn turn_advantages(group: &RolloutGroup, usable: &[usize], terms: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    usable
        .iter()
        .zip(terms)
        .map(|(&i, terms)| {
            let t = &group.trajectories[i];
            let mut by_token = vec![0.0; t.tokens.len()];
            for (span, term) in t.turn_spans().into_iter().zip(terms) {
                by_token[span].fill(term);
            }
            by_token
        })
        .collect()
}

/// Which tokens of the usable rows train: a multi-turn ledger's model turns; a truncated
/// completion's none (`truncated`: under `mask_truncated`).
fn trainable_tokens(group: &RolloutGroup, usable: &[usize], truncated: impl Fn(usize) -> bool) -> Vec<Vec<bool>> {
    usable
        .iter()
        .map(|&i| {
            let t = &group.trajectories[i];
            if truncated(i) {
                vec![false; t.tokens.len()]
            } else if t.trainable.is_empty() {
                vec![true; t.tokens.len()]
            } else {
                t.trainable.clone()
            }
        })
        .collect()
}

/// REINFORCE++ (`AdvantageMode::whitened`): every trained token of the step carries its
/// sequence's advantage; whiten them together. `summed` adds a vector of sums over the
/// other ranks' batches (nothing to add alone, or when `batches` are every rank's already).
pub(super) fn whiten(
    batches: &mut [GroupBatch],
    mode: AdvantageMode,
    mut summed: impl FnMut(&mut [f64]) -> crate::error::Result<()>,
) -> crate::error::Result<()> {
    if !mode.whitened() {
        return Ok(());
    }
    let rows = |batch: &GroupBatch| -> Vec<usize> {
        (0..batch.completions.len())
            .map(|i| match batch.trainable.get(i) {
                Some(mask) => mask.iter().filter(|&&t| t).count(),
                None => batch.completions[i].len(),
            })
            .collect()
    };
    let mut whitening = wirl_grpo::Whitening::default();
    for batch in batches.iter() {
        for (&a, tokens) in batch.advantages.iter().zip(rows(batch)) {
            whitening.add(a, tokens);
        }
    }
    summed(&mut whitening.sums)?;
    for batch in batches.iter() {
        for (&a, tokens) in batch.advantages.iter().zip(rows(batch)) {
            whitening.centre(a, tokens);
        }
    }
    let mut squares = [whitening.squares];
    summed(&mut squares)?;
    whitening.squares = squares[0];
    for batch in batches.iter_mut() {
        batch.advantages.iter_mut().for_each(|a| *a = whitening.apply(*a));
    }
    Ok(())
}

/// What of step `next` this step's update begins: with a generation lag, its tasks drawn and
/// sampled by the weights being updated; under `grpo.overlap`, its tasks drawn; nothing
/// after the last step — or, for a lag, once the run was told to stop (`stopped`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BeginNext {
    Nothing,
    Draw,
    DrawAndSample,
}

pub(super) fn begin_next(grpo: &crate::config::GrpoSection, next: usize, stopped: bool) -> BeginNext {
    if next >= grpo.steps {
        BeginNext::Nothing
    } else if grpo.generation_lag > 0 && !stopped {
        BeginNext::DrawAndSample
    } else if grpo.overlap {
        BeginNext::Draw
    } else {
        BeginNext::Nothing
    }
}

/// Reward and length figures over some groups' completions (rewards over the usable ones).
pub(super) struct Figures {
    masked: usize,
    scored: usize,
    reward_mean: f32,
    reward_std: f32,
    pass_rate: f32,
    parts: BTreeMap<String, f32>,
    failures: BTreeMap<String, usize>,
    tokens: usize,
    tokens_mean: f32,
    tokens_max: usize,
}

impl Figures {
    /// Over `groups`, each with the reward at which its trajectories pass.
    pub(super) fn of<'a>(groups: impl Iterator<Item = (&'a RolloutGroup, f32)>) -> Figures {
        let groups: Vec<(&RolloutGroup, f32)> = groups.collect();
        let passed = groups
            .iter()
            .flat_map(|(g, pass)| g.scores.iter().filter(move |s| s.status.usable() && s.reward >= *pass))
            .count();
        let groups: Vec<&RolloutGroup> = groups.into_iter().map(|(g, _)| g).collect();
        let all: Vec<&wirl_rollout::Scored> = groups.iter().flat_map(|g| &g.scores).collect();
        let masked = all.iter().filter(|s| !s.status.usable()).count();
        let rewards: Vec<f32> = all.iter().filter(|s| s.status.usable()).map(|s| s.reward).collect();
        let n = rewards.len().max(1) as f32;
        let mean = rewards.iter().sum::<f32>() / n;
        let std = (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f32>() / n).sqrt();
        let mut parts: BTreeMap<String, f32> = BTreeMap::new();
        for s in all.iter().filter(|s| s.status.usable()) {
            for (name, value) in &s.parts {
                *parts.entry(name.clone()).or_default() += value / n;
            }
        }
        let mut failures: BTreeMap<String, usize> = BTreeMap::new();
        for s in &all {
            for kind in &s.failures {
                *failures.entry(kind.clone()).or_default() += 1;
            }
        }
        let lengths: Vec<usize> = groups.iter().flat_map(|g| g.trajectories.iter().map(|t| t.model_tokens())).collect();
        let tokens: usize = lengths.iter().sum();
        Figures {
            masked,
            scored: rewards.len(),
            reward_mean: mean,
            reward_std: std,
            pass_rate: passed as f32 / n,
            parts,
            failures,
            tokens,
            tokens_mean: tokens as f32 / lengths.len().max(1) as f32,
            tokens_max: lengths.iter().max().copied().unwrap_or(0),
        }
    }
}

/// What the step's figures need of one of the run's tasks.
pub(super) struct TaskFacts<'a> {
    pub(super) name: &'a str,
    /// The reward at which a trajectory passes.
    pub(super) pass_reward: f32,
    /// Its groups per step (0: not trained on now).
    pub(super) groups: usize,
}

/// What the step's figures need of the run.
pub(super) struct RunFacts<'a> {
    pub(super) tasks: Vec<TaskFacts<'a>>,
    pub(super) manifest_generation: u64,
    /// Whether the loss has a KL term against the reference whose value is reported.
    pub(super) kl_reported: bool,
}

/// What one step made, as its record reads it: the recorded groups (every rank's, on rank 0)
/// and what they gave; the update; the tasks skipped; the draws made; where time went.
pub(super) struct Outcome<'a> {
    pub(super) step: usize,
    pub(super) groups: &'a Groups,
    pub(super) advantaged: &'a Advantaged,
    pub(super) updated: &'a Updated,
    pub(super) skipped: &'a [(usize, SkippedTask)],
    pub(super) draws: usize,
    pub(super) measured: Measured,
}

/// Each trained task's figures of the step.
fn task_metrics(run: &RunFacts, outcome: &Outcome) -> BTreeMap<String, TaskMetrics> {
    let mut per_task = BTreeMap::new();
    for (t, task) in run.tasks.iter().enumerate() {
        if task.groups == 0 {
            continue;
        }
        let own = Figures::of(outcome.groups.iter().filter(|(_, o)| *o == t).map(|(g, _)| (g, task.pass_reward)));
        per_task.insert(
            task.name.to_string(),
            TaskMetrics {
                groups: task.groups,
                groups_kept: outcome.advantaged.kept_of_task[t],
                reward_mean: own.reward_mean,
                pass_rate: own.pass_rate,
                completion_tokens_mean: own.tokens_mean,
                tasks_skipped: outcome.skipped.iter().filter(|(o, _)| *o == t).count(),
                trajectories_masked: own.masked,
                groups_unusable: outcome.advantaged.unusable_of_task[t],
            },
        );
    }
    per_task
}

/// The step's figures, overall and per task, and where its time went.
///
/// Over ~80 lines on purpose: the figures of `StepMetrics`, field by field, from the step's
/// values; a record written out reads best whole.
pub(super) fn step_metrics(run: &RunFacts, outcome: Outcome) -> StepMetrics {
    let figures = Figures::of(outcome.groups.iter().map(|(g, t)| (g, run.tasks[t].pass_reward)));
    let per_task = task_metrics(run, &outcome);
    let Outcome { step, advantaged, updated, skipped, draws, measured, .. } = outcome;
    let update = &updated.stats;
    let step_tokens: usize = advantaged.batches.iter().flat_map(|b| b.completions.iter().map(Vec::len)).sum();
    StepMetrics {
        step: step + 1,
        manifest_generation: run.manifest_generation,
        learning_rate: updated.learning_rate,
        reward_mean: figures.reward_mean,
        reward_std: figures.reward_std,
        parts: figures.parts,
        pass_rate: figures.pass_rate,
        groups_kept: advantaged.batches.len(),
        draws,
        groups_unusable: advantaged.unusable_of_task.iter().sum(),
        trajectories_masked: figures.masked,
        trajectories_scored: figures.scored,
        loss: update.loss,
        kl: if step_tokens > 0 && run.kl_reported { update.kl } else { 0.0 },
        entropy: update.entropy,
        clip_fraction: update.clip_fraction,
        kl_coef: updated.reward_kl.map(|(beta, _)| beta),
        reward_kl: updated.reward_kl.map(|(_, kl)| kl),
        distill_kl: updated.distill.filter(|d| d.tokens > 0).map(|d| d.kl_sum / d.tokens as f64),
        grad_norm: update.grad_norm,
        updates_skipped: update.updates_skipped,
        groups_recomputed: update.groups_recomputed,
        sampler_lag: advantaged.sampler_lag,
        tis_truncated: update.tis_truncated,
        sampler_logp_diff_mean: update.sampler_gap.map(|gap| f64::from(gap.mean)),
        sampler_logp_diff_max: update.sampler_gap.map(|gap| f64::from(gap.max)),
        peak_rss_mib: measured.peak_rss,
        peak_rss_mib_by_phase: measured.peaks,
        tasks_skipped: skipped
            .iter()
            .map(|(t, s)| SkippedTaskEntry {
                task_name: run.tasks[*t].name.to_string(),
                index: s.index,
                task: s.id.clone(),
                reason: s.reason.clone(),
            })
            .collect(),
        completion_tokens_mean: figures.tokens_mean,
        completion_tokens_max: figures.tokens_max,
        failures: figures.failures,
        generate_tokens_per_s: figures.tokens as f64
            / (measured.clock.sampling_span + measured.episodes.generate_s).max(1e-9),
        episode_turns: measured.episodes.turns,
        completion_tokens: figures.tokens,
        episode_tokens: measured.episodes.tokens,
        prompt_positions_cached: measured.prompt_positions.0,
        prompt_positions_computed: measured.prompt_positions.1,
        judge_calls: measured.rewards_inference.calls,
        judge_tokens: measured.rewards_inference.tokens,
        time_s: StepTimes {
            generate: measured.clock.generate,
            episodes: measured.clock.episodes,
            episodes_host: measured.episodes.host_s,
            agents: measured.clock.agents,
            score: measured.clock.score,
            judge: measured.rewards_inference.waited_s,
            draw: measured.clock.draw,
            teacher: updated.distill.map_or(0.0, |d| d.seconds),
            train: measured.clock.train,
            total: measured.started.elapsed().as_secs_f64(),
            reference_forward: update.time.reference_forward,
            policy_forward: update.time.policy_forward,
            backward: update.time.backward,
            optimizer: update.time.optimizer,
        },
        tasks: per_task,
    }
}

#[cfg(test)]
mod tests;
