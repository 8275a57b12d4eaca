//! One training step, in named stages: roll (draw → generate → episodes → score → agents →
//! more draws) → advantages → update → record → metrics. `Trainer::step` reads as that list;
//! each stage below says what it takes and what it gives the next. The values passed between
//! them, and the stages that are functions of their inputs alone, are in `stages.rs`; the
//! ones here touch the engine, the plugins, the learner or the other ranks.

use super::stages::{
    self, Advantaged, BeginNext, Clock, Groups, Measured, Outcome, RewardKl, Rolled, RunFacts, Signal, TaskFacts,
    Updated,
};
use super::{Ahead, Drawn, PhaseMemory, Trainer, draw_tasks, rss_high_water_mib};
use crate::error::bail;
use crate::metrics::{ConversationMessage, PhasePeaks, RolloutRecord, SkippedTaskRecord, StepMetrics};
use crate::observer::{Event, Observer, Phase};
use std::io::Write;
use std::time::Instant;
use wirl_engine::{InFlight, WeightsBarrier};
use wirl_grpo::{GroupBatch, MemoryLimits, UpdateSettings};
use wirl_rollout::collect::{self, Episodes, Sampled};
use wirl_rollout::{GroupAsk, RolloutGroup, SkippedTask, TaskSource, seed_for};
use wirl_sandbox::printable;

/// Requests already sampling (a generation lag's, sent by the previous step), and since when.
type Lagged = (InFlight, Instant);

/// Whether the run was told to stop (checked between and inside stages).
type Stopped<'a> = &'a (dyn Fn() -> bool + Sync);

impl Trainer {
    /// One GRPO step: its metrics, or `None` when a stop came before its first update
    /// (generating, scoring, or training its first epoch), which abandons it unrecorded.
    /// Its values in turn: the groups rolled and scored, advantaged, the update, then the
    /// record and the figures (on rank 0, of every rank's groups).
    pub(super) fn step(
        &mut self,
        step: usize,
        rollouts: &mut impl Write,
        observer: &mut dyn Observer,
    ) -> crate::error::Result<Option<StepMetrics>> {
        let started = Instant::now();
        let stop = self.control.clone();
        let stopped = move || stop.is_stopped();
        let mut clock = Clock::default();
        let mut memory = PhaseMemory::start(self.state.peak_rss);
        let Some(rolled) = self.roll(step, &stopped, observer, &mut clock, &mut memory)? else {
            return Ok(None);
        };
        let advantaged = self.advantages(&rolled.groups, rolled.sampler_lag, false)?;
        let Some(updated) = self.update(step, &advantaged, &stopped, observer, &mut clock)? else {
            return Ok(None);
        };
        let (groups, advantaged) = self.gathered(rolled.groups, advantaged, rolled.sampler_lag)?;
        let peaks = PhasePeaks { train: memory.phase_end(), ..rolled.peaks };
        // The update's freed tensors stay in the allocator for the next update to reuse:
        // handing them back (malloc_trim) made every step fault its memory in again, page
        // by page (docs/BENCHMARKS.md). They count as resident in the next phases, never
        // above the training peak.
        self.state.peak_rss = memory.run_peak;
        self.state.weights_written += updated.stats.weight_writes;
        if self.writes() {
            self.record(step, rollouts, &rolled.skipped, &groups)?;
            self.live.after_step(step, &groups.groups);
        }
        let now = self.policy.engine.prefix_stats().positions();
        let seen = std::mem::replace(&mut self.state.prompt_positions_seen, now);
        let measured = Measured {
            peaks,
            peak_rss: self.state.peak_rss.or_else(rss_high_water_mib),
            clock,
            episodes: rolled.episode_times,
            started,
            prompt_positions: (now.0 - seen.0, now.1 - seen.1),
            rewards_inference: self.side.reward_inference.take(),
        };
        let (skipped, draws) = (&rolled.skipped, rolled.draws);
        let outcome =
            Outcome { step, groups: &groups, advantaged: &advantaged, updated: &updated, skipped, draws, measured };
        Ok(Some(stages::step_metrics(&self.run_facts(), outcome)))
    }

    /// Roll: draw → generate → episodes → score → agents, then under dynamic sampling more
    /// draws until enough groups carry a signal. `None` when a stop came (every rank then
    /// abandons the step): the calls were cut short, their verdicts are not the plugins', so
    /// nothing of the step is learned from or recorded.
    fn roll(
        &mut self,
        step: usize,
        stopped: Stopped,
        observer: &mut dyn Observer,
        clock: &mut Clock,
        memory: &mut PhaseMemory,
    ) -> crate::error::Result<Option<Rolled>> {
        self.give_rewards_the_engine();
        // This step's judges only (not a held-out evaluation's before it).
        self.side.reward_inference.take();
        let Some((drawn, lagged)) = self.draw(step, stopped, clock)? else {
            return self.abandon();
        };
        let Drawn { picked, mut skipped, placeholders, .. } = self.share(drawn);
        for (t, skip) in &skipped {
            let task = &self.live.tasks[*t].spec.name;
            tracing::warn!("step {}, task `{task}`: {}", step + 1, printable(&skip.to_string()));
        }
        let group_size = self.config.grpo.group_size;
        self.phase(observer, step, Phase::Generating { prompts: picked.len(), group_size });
        // Generation's peak is measured from here: the draw before it is not generation's.
        memory.phase_end();
        let sampler_lag = u64::from(lagged.is_some());
        let Some(mut sampled) = self.generate(&picked, lagged, stopped, clock)? else {
            return self.abandon();
        };
        let Some(episodes) = self.episodes(step, &picked, &mut sampled, stopped, observer, clock)? else {
            return self.abandon();
        };
        let episode_times = episodes.times;
        let generate = memory.phase_end();
        self.phase(observer, step, Phase::Scoring);
        self.score(&picked, &mut sampled, &episodes, clock);
        let mut groups = self.assemble(0, picked, sampled, episodes, placeholders);
        self.agents(step, stopped, observer, &mut groups, clock);
        let score = memory.phase_end();
        if stopped() {
            return self.abandon();
        }
        // Every rank rolled its share: abandoned by all if any was stopped.
        if self.agree(false)? {
            return Ok(None);
        }
        let Some(draws) = self.draw_until_signal(step, &mut groups, &mut skipped, stopped, observer, clock)? else {
            return Ok(None);
        };
        let peaks = PhasePeaks { generate, score, train: None };
        Ok(Some(Rolled { groups, skipped, draws, sampler_lag, episode_times, peaks }))
    }

    /// The groups and advantages the record reads: with ranks, rank 0's of every rank's
    /// groups (gathered, advantaged again for their counts); alone, the step's own.
    fn gathered(
        &self,
        groups: Groups,
        advantaged: Advantaged,
        sampler_lag: u64,
    ) -> crate::error::Result<(Groups, Advantaged)> {
        Ok(match self.gather(&groups)? {
            Some(all) => {
                let advantaged = self.advantages(&all, sampler_lag, true)?;
                (all, advantaged)
            }
            None => (groups, advantaged),
        })
    }

    /// What the step's figures need of the run now.
    fn run_facts(&self) -> RunFacts<'_> {
        let tasks = self.live.tasks.iter().zip(&self.live.allocation);
        RunFacts {
            tasks: tasks
                .map(|(task, &groups)| TaskFacts { name: &task.spec.name, pass_reward: task.spec.pass_reward, groups })
                .collect(),
            manifest_generation: self.live.manifest.generation,
            kl_reported: self.config.objective.kl.needs_reference(),
        }
    }

    /// On-policy as a gate (issue 61): where the sampler computes the learner's log-probs to
    /// the bit, a step whose sampled tokens' log-probs differ at all stops the run, naming the
    /// token — a kernel the two sides no longer share, which a report would only average away.
    fn check_sampler_gap(&self, step: usize, update: &wirl_grpo::UpdateStats) -> crate::error::Result<()> {
        let Some(gap) = update.sampler_gap else { return Ok(()) };
        // Sampling on the device computes its log-norm there, in candle's order.
        let device_sampling = self.config.device_sampling;
        if gap.max == 0.0
            || !self.config.grpo.stop_on_sampler_gap
            || device_sampling
            || !self.policy.learner.sampler_is_exact()
        {
            return Ok(());
        }
        let token = match gap.worst {
            Some(t) => format!(
                "token {} at position {} of its completion: the sampler said {}, the learner {}",
                t.token, t.position, t.sampler, t.trainer
            ),
            None => "on another rank".to_string(),
        };
        bail!(
            "step {}: the sampler's and the learner's log-probs of a sampled token differ by {} ({token}); on the \
             CPU in f32 on shared weights they are the same bits, so this is a bug in wirl (please report it with \
             the config). `--set grpo.stop_on_sampler_gap=false` trains on, reporting the gap \
             (sampler_logp_diff_max)",
            step + 1,
            gap.max
        )
    }

    /// DAPO's dynamic sampling (`grpo.dynamic_sampling`): while the step's groups with signal,
    /// over every rank, are fewer than `prompts_per_step` and it has drawn fewer than
    /// `max_draws` times, draw `prompts_per_step` more tasks (from places of their own, the
    /// same on every resume), roll and score them as the first draw's. Every rank makes the
    /// same draws (each rolling its share), so the counts that decide agree. Returns the
    /// draws made; `None` when a stop came (every rank then abandons the step).
    fn draw_until_signal(
        &mut self,
        step: usize,
        groups: &mut Groups,
        skipped: &mut Vec<(usize, SkippedTask)>,
        stopped: Stopped,
        observer: &mut dyn Observer,
        clock: &mut Clock,
    ) -> crate::error::Result<Option<usize>> {
        let g = self.config.grpo.clone();
        if !g.dynamic_sampling {
            return Ok(Some(1));
        }
        let mut draws = 1;
        loop {
            let mut with_signal = [groups.iter().filter(|&(group, t)| self.signal(group, t).is_some()).count() as f32];
            self.ranks.all_reduce_sum_in_place(&mut with_signal)?;
            let with_signal = with_signal[0] as usize;
            if with_signal >= g.prompts_per_step {
                return Ok(Some(draws));
            }
            if draws >= g.max_draws {
                tracing::warn!(
                    "step {}: {with_signal} of {} groups have a signal after {draws} draw{} (grpo.max_draws): \
                     training on those",
                    step + 1,
                    g.prompts_per_step,
                    if draws == 1 { "" } else { "s" }
                );
                return Ok(Some(draws));
            }
            let mut extra = Clock::default();
            let started = Instant::now();
            let drawn = self.draw_now(step, draws, stopped)?;
            extra.draw = started.elapsed().as_secs_f64();
            let Some(drawn) = drawn else { return self.abandon() };
            let Drawn { picked, skipped: more, placeholders, .. } = self.share(drawn);
            skipped.extend(more);
            self.phase(observer, step, Phase::Generating { prompts: picked.len(), group_size: g.group_size });
            let Some(mut sampled) = self.generate(&picked, None, stopped, &mut extra)? else {
                return self.abandon();
            };
            let Some(episodes) = self.episodes(step, &picked, &mut sampled, stopped, observer, &mut extra)? else {
                return self.abandon();
            };
            self.phase(observer, step, Phase::Scoring);
            self.score(&picked, &mut sampled, &episodes, &mut extra);
            groups.append(self.assemble(draws, picked, sampled, episodes, placeholders));
            clock.add(&extra);
            if stopped() {
                return self.abandon();
            }
            if self.agree(false)? {
                return Ok(None);
            }
            draws += 1;
        }
    }

    /// A group's signal (`stages::signal`), against its task's `max_tokens`.
    fn signal(&self, group: &RolloutGroup, t: usize) -> Signal {
        let max_tokens = self.live.tasks[t].spec.sampling.max_tokens;
        stages::signal(group, &self.config.objective, max_tokens, self.side.teacher.is_some())
    }

    /// The KL in the reward (verl's `use_kl_in_reward`), on the groups that train: whether a
    /// group has signal was read from its scores, as wirl's filter always reads them. Not for
    /// rank 0's record of every rank's groups (`gathered`), which counts groups and tokens
    /// only (another reference pass over all of them would buy it nothing).
    fn kl_in_rewards(
        &self,
        groups: &Groups,
        signals: Vec<Signal>,
        trains: &[bool],
        gathered: bool,
    ) -> crate::error::Result<(Vec<Signal>, RewardKl)> {
        let mut reward_kl = RewardKl::default();
        if gathered || self.config.objective.kl_in_reward().is_none() {
            return Ok((signals, reward_kl));
        }
        let signals = signals
            .into_iter()
            .zip(groups.iter())
            .zip(trains)
            .map(|((signal, (group, _)), &trains)| match signal {
                Some((usable, rewards)) if trains => {
                    let (shaped, estimates) = self.kl_shaped(group, &usable, rewards)?;
                    reward_kl.means += estimates.iter().map(|kl| kl.mean()).sum::<f64>();
                    reward_kl.completions += estimates.len();
                    Ok(Some((usable, shaped)))
                }
                other => Ok(other),
            })
            .collect::<crate::error::Result<_>>()?;
        Ok((signals, reward_kl))
    }

    /// `rewards` of a group's `usable` trajectories less β × each one's summed KL estimate
    /// against the reference (`grpo.kl_in_reward`), the sampler's log-probs standing for
    /// π_old (without a lag they are the policy's within 1e-4; with one, the behaviour
    /// policy's); and the estimates.
    fn kl_shaped(
        &self,
        group: &RolloutGroup,
        usable: &[usize],
        rewards: Vec<f32>,
    ) -> crate::error::Result<(Vec<f32>, Vec<wirl_grpo::KlEstimate>)> {
        let trajectories: Vec<_> = usable.iter().map(|&i| &group.trajectories[i]).collect();
        let completions: Vec<Vec<u32>> = trajectories.iter().map(|t| t.tokens.clone()).collect();
        let trained: Vec<Vec<bool>> = if trajectories.iter().any(|t| !t.trainable.is_empty()) {
            trajectories
                .iter()
                .map(|t| if t.trainable.is_empty() { vec![true; t.tokens.len()] } else { t.trainable.clone() })
                .collect()
        } else {
            Vec::new()
        };
        let old: Vec<Vec<f32>> = trajectories.iter().map(|t| t.logprobs.clone()).collect();
        let estimates = self.policy.learner.kl_estimates(
            &group.prompt,
            &completions,
            &trained,
            &old,
            self.config.objective.kl.estimator(),
            self.head_chunk(),
        )?;
        let beta = self.reward_kl_coef();
        let shaped = rewards.iter().zip(&estimates).map(|(reward, kl)| reward - kl.penalty(beta)).collect();
        Ok((shaped, estimates))
    }

    /// β of the KL in the reward this step: `grpo.beta`, or where it adapts
    /// (`grpo.kl_target`), where the steps before took it.
    fn reward_kl_coef(&self) -> f64 {
        self.state.reward_kl.map_or(self.config.objective.kl.beta(), |adaptive| adaptive.value)
    }

    /// After a step's update under `grpo.kl_in_reward`: the β its rewards were shaped with
    /// and the mean, over every rank's shaped completions, of each one's mean KL per token;
    /// with `grpo.kl_target`, β moves by it for the next step (verl's adaptive controller,
    /// which `apply_kl_penalty` moves once a step's rewards are shaped: the step keeps the β
    /// it was shaped with either way). Called once the update is done, so that a step given up
    /// before it leaves β where it was, as a resumed run finds it.
    fn adapt_reward_kl(&mut self, local: RewardKl) -> crate::error::Result<Option<(f64, f64)>> {
        if self.config.objective.kl_in_reward().is_none() {
            return Ok(None);
        }
        let beta = self.reward_kl_coef();
        let RewardKl { mut means, mut completions } = local;
        if self.ranks.size() > 1 {
            // f32 over the ranks, as the whitening's sums: a relative error of ~1e-7 on a mean.
            let mut sent = [means as f32, completions as f32];
            self.ranks.all_reduce_sum_in_place(&mut sent)?;
            (means, completions) = (f64::from(sent[0]), sent[1].round() as usize);
        }
        if completions == 0 {
            return Ok(None);
        }
        let current = means / completions as f64;
        // A non-finite KL (only from non-finite log-probs) would make β NaN for good: it stays.
        if let (Some(adaptive), true) = (&mut self.state.reward_kl, current.is_finite()) {
            adaptive.update(current, completions);
        }
        Ok(Some((beta, current)))
    }

    /// REINFORCE++'s whitening over the step's trained tokens (`stages::whiten`), its sums
    /// over every rank's groups (`gathered`: `batches` are every rank's already).
    fn whiten(&self, batches: &mut [GroupBatch], gathered: bool) -> crate::error::Result<()> {
        let alone = gathered || self.ranks.size() == 1;
        stages::whiten(batches, self.config.objective.advantage, |values: &mut [f64]| {
            if alone {
                return Ok(());
            }
            // f32 over the ranks: the sums' relative error is f32's, far below the 1e-8 floor's scale.
            let mut sent: Vec<f32> = values.iter().map(|&v| v as f32).collect();
            self.ranks.all_reduce_sum_in_place(&mut sent)?;
            values.iter_mut().zip(sent).for_each(|(v, s)| *v = f64::from(s));
            Ok(())
        })
    }

    /// A step stopped before its update: with ranks, after saying so to the others (who
    /// then abandon it too, at the agreement before the update).
    fn abandon<T>(&self) -> crate::error::Result<Option<T>> {
        self.agree(true)?;
        Ok(None)
    }

    /// This rank's share of the step's groups: a contiguous slice of the drawn ones (rank
    /// r of n takes [r·P/n, (r+1)·P/n) of P), each keeping the seed of its place in the
    /// whole step, so that the ranks together roll what one trainer would. The tasks
    /// skipped and the groups that could not be sampled stay with rank 0, which records them.
    fn share(&self, drawn: Drawn) -> Drawn {
        let (rank, size) = (self.ranks.rank(), self.ranks.size());
        if size == 1 || drawn.shared {
            return drawn;
        }
        let Drawn { picked, skipped, placeholders, .. } = drawn;
        let n = picked.len();
        let mine = rank * n / size..(rank + 1) * n / size;
        let picked = picked.into_iter().enumerate().filter(|(i, _)| mine.contains(i)).map(|(_, ask)| ask).collect();
        if rank == 0 {
            Drawn { picked, skipped, placeholders, shared: true }
        } else {
            Drawn { picked, shared: true, ..Drawn::default() }
        }
    }

    /// Every rank's groups, in rank order, on rank 0 (`None` on the others, and alone).
    fn gather(&self, groups: &Groups) -> crate::error::Result<Option<Groups>> {
        if self.ranks.size() == 1 {
            return Ok(None);
        }
        let mine: Vec<(usize, usize, &RolloutGroup)> =
            groups.iter().zip(&groups.draws).map(|((group, t), &draw)| (t, draw, group)).collect();
        let bytes = serde_json::to_vec(&mine)?;
        let all = wirl_engine::all_gather_bytes(self.ranks.as_ref(), &bytes)?;
        if !self.writes() {
            return Ok(None);
        }
        let mut gathered = Groups::default();
        for (rank, bytes) in all.iter().enumerate() {
            let theirs: Vec<(usize, usize, RolloutGroup)> = serde_json::from_slice(bytes)
                .map_err(|e| crate::Error::Internal(format!("rank {rank}'s groups could not be read: {e}")))?;
            for (t, draw, group) in theirs {
                gathered.push(t, (draw, rank), group);
            }
        }
        // One trainer's order: a draw's groups (every rank's share in turn) before the next's.
        let mut order: Vec<usize> = (0..gathered.groups.len()).collect();
        order.sort_by_key(|&i| gathered.draws[i]);
        let mut sorted = Groups::default();
        let mut slots: Vec<Option<RolloutGroup>> = gathered.groups.into_iter().map(Some).collect();
        for i in order {
            let group = slots[i].take().expect("each group once");
            sorted.push(gathered.owners[i], (gathered.draws[i], gathered.ranks[i]), group);
        }
        Ok(Some(sorted))
    }

    fn phase(&self, observer: &mut dyn Observer, step: usize, phase: Phase) {
        observer.event(Event::Phase { step: step + 1, steps: self.config.grpo.steps, phase });
    }

    /// Draw: this step's tasks — drawn during the previous update (and, with a generation
    /// lag, sampled then too) unless a swap came in between. With them, a lagged sampling
    /// already in flight.
    fn draw(
        &mut self,
        step: usize,
        stopped: Stopped,
        clock: &mut Clock,
    ) -> crate::error::Result<Option<(Drawn, Option<Lagged>)>> {
        let ahead = self.state.ahead.take().filter(|a| a.step == step && a.generation == self.live.manifest.generation);
        if let Some(Ahead { drawn, sampling, .. }) = ahead {
            return Ok(Some((drawn, sampling)));
        }
        let started = Instant::now();
        let drawn = self.draw_now(step, 0, stopped)?;
        clock.draw = started.elapsed().as_secs_f64();
        Ok(drawn.map(|drawn| (drawn, None)))
    }

    /// Draw `draw` of step `step`'s tasks now, on this thread.
    fn draw_now(
        &mut self,
        step: usize,
        draw: usize,
        stopped: &(dyn Fn() -> bool + Sync),
    ) -> crate::error::Result<Option<Drawn>> {
        let context = self.policy.model_config.context();
        let (live, grpo) = (&mut self.live, &self.config.grpo);
        draw_tasks(&mut live.tasks, &live.allocation, &self.policy.tokenizer, context, step, draw, grpo, stopped)
    }

    /// Generate: each picked group's first turn, as its samples finish. A single-turn group
    /// is scored at once (while the rest generate) under `grpo.overlap`; a multi-turn group
    /// goes on to its episode.
    fn generate(
        &mut self,
        picked: &[GroupAsk],
        lagged: Option<Lagged>,
        stopped: Stopped,
        clock: &mut Clock,
    ) -> crate::error::Result<Option<Sampled>> {
        let started = Instant::now();
        let (in_flight, sent) = match lagged {
            Some(lagged) => lagged,
            None => (collect::send(&self.policy.engine, picked), started),
        };
        let score_on_arrival = self.config.grpo.overlap.then_some(self.live.tasks.as_mut_slice());
        let Some(sampled) = collect::receive(in_flight, picked, score_on_arrival, stopped) else {
            return Ok(None);
        };
        let sampled = sampled?;
        clock.score += sampled.score_s;
        clock.generate = started.elapsed().as_secs_f64();
        clock.sampling_span = sent.elapsed().as_secs_f64();
        Ok(Some(sampled))
    }

    /// Episodes: multi-turn groups go on from their first replies, every live episode's next
    /// turn admitted together; the environment scores them.
    fn episodes(
        &self,
        step: usize,
        picked: &[GroupAsk],
        sampled: &mut Sampled,
        stopped: Stopped,
        observer: &mut dyn Observer,
        clock: &mut Clock,
    ) -> crate::error::Result<Option<Episodes>> {
        let started = Instant::now();
        let episodic = picked.iter().filter(|ask| self.live.tasks[ask.task].spec.max_turns > 1).count();
        if episodic > 0 {
            self.phase(observer, step, Phase::Episodes { groups: episodic });
        }
        let engine = self.rolling_engine();
        let Some(episodes) = collect::run_episode_groups(engine, &self.live.tasks, picked, sampled, stopped) else {
            return Ok(None);
        };
        clock.episodes = started.elapsed().as_secs_f64();
        Ok(Some(episodes?))
    }

    /// Score: the single-turn groups not scored yet (all of them without `grpo.overlap`) by
    /// their task's reward plugins, a task's groups together.
    fn score(&mut self, picked: &[GroupAsk], sampled: &mut Sampled, episodes: &Episodes, clock: &mut Clock) {
        let started = Instant::now();
        collect::score_rest(&mut self.live.tasks, picked, sampled, episodes);
        clock.score += started.elapsed().as_secs_f64();
    }

    /// The step's groups in picked order (sampled and scored, or run as episodes), then the
    /// placeholders of tasks whose server failed.
    fn assemble(
        &self,
        draw: usize,
        picked: Vec<GroupAsk>,
        sampled: Sampled,
        episodes: Episodes,
        placeholders: Vec<(usize, RolloutGroup)>,
    ) -> Groups {
        let owners: Vec<usize> = picked.iter().map(|ask| ask.task).collect();
        let mut groups = Groups::default();
        let from = (draw, self.ranks.rank());
        for (t, group) in owners.into_iter().zip(collect::assemble(&self.live.tasks, picked, sampled, episodes)) {
            groups.push(t, from, group);
        }
        for (t, group) in placeholders {
            groups.push(t, from, group);
        }
        groups
    }

    /// The engine as the rolling path calls it.
    /// Let the tasks' `wirl:rl@0.2.0` rewards call the engine being trained (LLM judges),
    /// each scoring call within its reward's budget. Set every step, so that tasks swapped in
    /// meanwhile have it too.
    pub(super) fn give_rewards_the_engine(&mut self) {
        let engine = wirl_rollout::RewardEngine {
            handle: self.policy.engine.clone(),
            tokenizer: self.policy.tokenizer.clone(),
            context: self.policy.model_config.context(),
            seed: self.config.grpo.seed,
            usage: self.side.reward_inference.clone(),
        };
        for task in &mut self.live.tasks {
            task.scorers.set_engine(Some(engine.clone()));
            task.scorers.set_judges(&self.side.judges);
        }
    }

    fn rolling_engine(&self) -> collect::Engine<'_> {
        collect::Engine {
            handle: &self.policy.engine,
            tokenizer: &self.policy.tokenizer,
            context: self.policy.model_config.context(),
        }
    }

    /// Agents: each produces its groups itself, calling the engine; one after another, after
    /// the rest of the step's generation, so that every batch is reproducible.
    fn agents(
        &self,
        step: usize,
        stopped: Stopped,
        observer: &mut dyn Observer,
        groups: &mut Groups,
        clock: &mut Clock,
    ) {
        let started = Instant::now();
        let g = &self.config.grpo;
        // With ranks, rank 0 runs the agents (their groups are not split: one call makes them).
        let agents_here = self.writes();
        for (t, task) in self.live.tasks.iter().enumerate() {
            let TaskSource::Agent { agent, limits } = &task.source else { continue };
            if !agents_here {
                continue;
            }
            if self.live.allocation[t] == 0 || stopped() {
                continue;
            }
            self.phase(observer, step, Phase::Agent { task: t });
            let call = wirl_rollout::AgentCall {
                agent,
                engine: &self.policy.engine,
                tokenizer: &self.policy.tokenizer,
                context: self.policy.model_config.context(),
                groups: self.live.allocation[t],
                group_size: g.group_size,
                sampling: task.spec.sampling,
                seed: seed_for(g.seed, (step * g.prompts_per_step + t) as u64 ^ (1 << 62)),
                cursor: (step * self.live.allocation[t]) as u64,
                limits: *limits,
                failures: task.spec.failures,
                task_name: &task.spec.name,
            };
            for group in wirl_rollout::agent_groups(&call) {
                groups.push(t, (0, self.ranks.rank()), group);
            }
        }
        clock.agents = started.elapsed().as_secs_f64();
    }

    /// Advantages over each group's usable trajectories (masked ones carry no gradient); a
    /// group with fewer than two cannot compare, one whose rewards are all equal carries no
    /// signal. Under dynamic sampling only the first `prompts_per_step` groups with signal
    /// train, in the order one trainer draws them (draw by draw, rank by rank within a
    /// draw). `gathered`: `groups` are every rank's (rank 0's record), else this rank's own.
    fn advantages(&self, groups: &Groups, sampler_lag: u64, gathered: bool) -> crate::error::Result<Advantaged> {
        // Each group's usable trajectories and rewards, once, where it has a signal.
        let signals: Vec<_> = groups.iter().map(|(group, t)| self.signal(group, t)).collect();
        let has_signal: Vec<bool> = signals.iter().map(Option::is_some).collect();
        let trains = self.trained(groups, &has_signal, gathered)?;
        let (signals, reward_kl) = self.kl_in_rewards(groups, signals, &trains, gathered)?;
        let distilling = self.side.teacher.is_some();
        let objective = &self.config.objective;
        let tasks = self.live.tasks.len();
        let stages::Batched { mut batches, kept_of_task, unusable_of_task } =
            stages::batches(groups, signals, &trains, tasks, objective, sampler_lag, distilling);
        self.whiten(&mut batches, gathered)?;
        // The teacher's pass: for the groups this rank trains (not rank 0's record of all).
        let distill = match (&self.side.teacher, gathered) {
            (Some(teacher), false) => Some(teacher_pass(teacher, &mut batches)?),
            _ => None,
        };
        Ok(Advantaged { batches, kept_of_task, unusable_of_task, sampler_lag, reward_kl, distill })
    }

    /// Per group (`signal`: whether it has one), whether it may train: all of them, or under
    /// dynamic sampling the first `prompts_per_step` with signal in draw-then-rank order
    /// (each rank counts its own by draw; the counts are summed over the ranks so that every
    /// rank knows its place).
    fn trained(&self, groups: &Groups, signal: &[bool], gathered: bool) -> crate::error::Result<Vec<bool>> {
        let g = &self.config.grpo;
        if !g.dynamic_sampling {
            return Ok(vec![true; signal.len()]);
        }
        let ranks = self.ranks.size();
        let mut counts = stages::signal_cells(groups, signal, ranks, g.max_draws);
        if !gathered {
            self.ranks.all_reduce_sum_in_place(&mut counts)?;
        }
        Ok(stages::first_with_signal(groups, signal, &counts, ranks, g.prompts_per_step))
    }

    /// The bytes of logits the head computes at once (`grpo.head_chunk_mib`; 0: no limit).
    fn head_chunk(&self) -> u64 {
        match self.config.grpo.head_chunk_mib {
            0 => u64::MAX,
            mib => mib.saturating_mul(1 << 20),
        }
    }

    /// The learner's settings for `step` (its learning rate by the schedule).
    fn update_settings(&self, step: usize) -> UpdateSettings {
        let g = &self.config.grpo;
        UpdateSettings {
            learning_rate: wirl_grpo::optim::learning_rate(g.learning_rate, step, g.warmup_steps, g.steps, g.schedule),
            loss: self.config.objective.loss_settings(),
            inner_epochs: g.inner_epochs,
            aggregation: self.config.objective.aggregation,
            max_grad_norm: g.max_grad_norm,
            max_tokens: self.config.sampling.max_tokens,
            memory: MemoryLimits {
                recompute_above: g.recompute_above_mib.saturating_mul(1 << 20),
                keep_layers: g.keep_activations_mib.saturating_mul(1 << 20),
                head_chunk: self.head_chunk(),
            },
            micro_batch_rows: g.micro_batch_rows,
            split_by_length: g.split_by_length,
            rows_per_pass: self.config.rows_per_pass_on(self.policy.learner.policy.net().device()),
            tis_cap: self.config.objective.correction.tis_cap,
            rollout_correction: self.config.objective.correction.rollout,
        }
    }

    /// Update: the learner's step on the advantaged batches, with the next step begun
    /// meanwhile (`stages::begin_next`) — with a generation lag its groups are sampled during
    /// this update by these weights (the update's write waits for them at the barrier); else,
    /// under `grpo.overlap`, its tasks are drawn. Either is kept as `RunState::ahead`; a swap
    /// at the next boundary makes it stale (dropped: the step draws and samples afresh).
    /// Then the sampler's gap is checked and the KL in the reward's β moves.
    fn update(
        &mut self,
        step: usize,
        advantaged: &Advantaged,
        stopped: Stopped,
        observer: &mut dyn Observer,
        clock: &mut Clock,
    ) -> crate::error::Result<Option<Updated>> {
        let started = Instant::now();
        let settings = self.update_settings(step);
        let g = self.config.grpo.clone();
        let context = self.policy.model_config.context();
        let steps = g.steps;
        let mut progress = |group, groups| {
            observer.event(Event::Phase { step: step + 1, steps, phase: Phase::Training { group, groups } })
        };
        let next = step + 1;
        let begin = stages::begin_next(&g, next, stopped());
        if begin == BeginNext::DrawAndSample {
            let drawn = self.draw_now(next, 0, stopped);
            // On an error (or a stop) the next step draws again and meets it itself.
            if let Ok(Some(drawn)) = drawn {
                // With ranks, each samples only its share of the next step.
                let drawn = self.share(drawn);
                let in_flight = collect::send(&self.policy.engine, &drawn.picked);
                let sampling = Some((in_flight, Instant::now()));
                self.state.ahead =
                    Some(Ahead { step: next, generation: self.live.manifest.generation, drawn, sampling });
            }
        }
        let (update, drawn_next) = std::thread::scope(|scope| {
            let drawing = (begin == BeginNext::Draw).then(|| {
                let (tasks, allocation, tokenizer) =
                    (&mut self.live.tasks, &self.live.allocation, &self.policy.tokenizer);
                scope.spawn(move || draw_tasks(tasks, allocation, tokenizer, context, next, 0, &g, stopped))
            });
            let update = self.policy.learner.update(
                &advantaged.batches,
                &settings,
                Some(&self.policy.engine as &dyn WeightsBarrier),
                stopped,
                &mut progress,
            );
            let drawn = drawing.map(|handle| handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)));
            (update, drawn)
        });
        if let Some(Ok(Some(drawn))) = drawn_next {
            self.state.ahead =
                Some(Ahead { step: next, generation: self.live.manifest.generation, drawn, sampling: None });
        }
        let Some(stats) = update? else {
            return Ok(None);
        };
        clock.train = started.elapsed().as_secs_f64();
        self.check_sampler_gap(step, &stats)?;
        let reward_kl = self.adapt_reward_kl(advantaged.reward_kl)?;
        Ok(Some(Updated { stats, learning_rate: settings.learning_rate, reward_kl, distill: advantaged.distill }))
    }

    /// Record: the tasks skipped, then every trajectory, in `rollouts.jsonl`.
    fn record(
        &self,
        step: usize,
        rollouts: &mut impl Write,
        skipped: &[(usize, SkippedTask)],
        groups: &Groups,
    ) -> crate::error::Result<()> {
        for (t, skip) in skipped {
            let record = SkippedTaskRecord {
                step: step + 1,
                task_name: self.live.tasks[*t].spec.name.clone(),
                skipped_task: skip.index,
                task: skip.id.clone(),
                reason: skip.reason.clone(),
            };
            serde_json::to_writer(&mut *rollouts, &record)?;
            writeln!(rollouts)?;
        }
        let hashes: Vec<_> = self.live.tasks.iter().map(crate::tasks::plugin_hashes).collect();
        for (group, t) in groups.iter() {
            for (sample, (trajectory, score)) in group.trajectories.iter().zip(&group.scores).enumerate() {
                let record = RolloutRecord {
                    step: step + 1,
                    status: score.status,
                    task_name: group.task_name.clone(),
                    task: group.task.id.clone(),
                    turns: trajectory.turns,
                    conversation: trajectory
                        .conversation
                        .iter()
                        .map(|m| ConversationMessage { role: m.role.clone(), content: m.content.clone() })
                        .collect(),
                    sample,
                    completion: trajectory.text.clone(),
                    // The model's tokens (a multi-turn ledger's environment tokens left out).
                    tokens: trajectory.model_tokens(),
                    reward: score.reward,
                    turn_rewards: score.turn_rewards.clone(),
                    parts: score.parts.clone(),
                    failures: score.failures.clone(),
                    notes: score.notes.clone(),
                    plugins: hashes[t].clone(),
                    weights_version: self.state.weights_base + trajectory.weights_version,
                    manifest_generation: self.live.manifest.generation,
                };
                serde_json::to_writer(&mut *rollouts, &record)?;
                writeln!(rollouts)?;
            }
        }
        Ok(())
    }
}

/// The teacher's log-probs over `batches`' completions, its credit added to their tokens;
/// the figures of the pass.
fn teacher_pass(
    teacher: &crate::distill::Teacher,
    batches: &mut [GroupBatch],
) -> crate::error::Result<crate::distill::DistillFigures> {
    let mut figures = crate::distill::DistillFigures::default();
    let started = std::time::Instant::now();
    for batch in batches {
        let of_batch = teacher.credit(batch)?;
        figures.kl_sum += of_batch.kl_sum;
        figures.tokens += of_batch.tokens;
    }
    figures.seconds = started.elapsed().as_secs_f64();
    Ok(figures)
}
