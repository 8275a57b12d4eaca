//! The one rolling path: problems asked as groups → sampled through the engine's batching
//! actor → multi-turn groups run as episodes → the rest scored by their task's reward
//! plugins → `RolloutGroup`s. `wirl train` (a step's stages, one call each, timed and
//! reported between), its held-out evaluation, `wirl eval` and a served task's `/rollouts`
//! all roll through it, so that a problem is sampled, run and scored the same way whichever
//! asks.
//!
//! One seeding rule: a group's samples, and its episode's later turns, are seeded by
//! `seed_for(run seed, slot)`, where the slot is the group's place in its caller's stream
//! (training: `step × prompts_per_step + i`; evaluation: the held-out problem's index;
//! the server: the rollout's first index + i). A group's samples so do not depend on the
//! batch it ran in.

use crate::episode::{EpisodeGroup, EpisodeOutcome, EpisodeTimes, TemplateDrift, run_episodes};
use crate::group::{RolloutGroup, SamplingSpec, Trajectory};
use crate::prompt::SkippedTask;
use crate::score::Scored;
use crate::seed::seed_for;
use crate::task::LoadedTask;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;
use wirl_engine::{EngineHandle, Finished, GenerateRequest, InFlight, Tokenizer};
use wirl_sandbox::{Progress, Task};

/// One group to roll: a problem of task `task` (an index into the tasks the stages are
/// given), its prompt's ids, how many samples and how they are sampled.
#[derive(Clone, Debug)]
pub struct GroupAsk {
    pub task: usize,
    pub problem: Task,
    pub prompt: Vec<u32>,
    pub size: usize,
    pub sampling: SamplingSpec,
    /// Seeds its samples and its episode's later turns.
    pub seed: u64,
    /// Where the run stands, told to 0.2.0 reward plugins (outside training unless
    /// [`GroupAsk::at`] says otherwise).
    pub progress: Progress,
}

impl GroupAsk {
    /// The group at `slot` of a run seeded `run_seed` (the seeding rule above).
    pub fn new(
        task: usize,
        problem: Task,
        prompt: Vec<u32>,
        size: usize,
        sampling: SamplingSpec,
        run_seed: u64,
        slot: u64,
    ) -> Self {
        GroupAsk {
            task,
            problem,
            prompt,
            size,
            sampling,
            seed: seed_for(run_seed, slot),
            progress: Progress::OUTSIDE_TRAINING,
        }
    }

    /// The same group, asked at training step `progress`.
    pub fn at(self, progress: Progress) -> Self {
        GroupAsk { progress, ..self }
    }

    /// The engine's request for the group's first turn.
    pub fn request(&self) -> GenerateRequest {
        GenerateRequest { prompt: self.prompt.clone(), n: self.size, sampling: self.sampling.seeded(self.seed) }
    }
}

/// Greedy sampling with a task's token budget (held-out evaluation).
pub fn greedy(sampling: SamplingSpec) -> SamplingSpec {
    SamplingSpec { temperature: 0.0, top_p: 1.0, top_k: 0, ..sampling }
}

/// Every task's held-out problems (from `first_index`, `count` each, in task order) as
/// greedy groups of one, seeded by their place in that list; and, by task, the slots left
/// out (a source that could not give one, a prompt that does not fit the context).
pub fn held_out_asks(
    tasks: &mut [LoadedTask],
    first_index: u64,
    count: usize,
    tokenizer: &Tokenizer,
    context: usize,
    run_seed: u64,
) -> (Vec<GroupAsk>, Vec<(usize, SkippedTask)>) {
    let (mut asks, mut left_out) = (Vec::new(), Vec::new());
    for (t, task) in tasks.iter_mut().enumerate() {
        let sampling = greedy(task.spec.sampling);
        let name = &task.spec.name;
        let room = sampling.max_tokens;
        let (held_out, skipped) =
            crate::held_out_prompts(name, &mut task.source, first_index, 0, count, tokenizer, room, context);
        for (problem, prompt) in held_out {
            let slot = asks.len() as u64;
            asks.push(GroupAsk::new(t, problem, prompt, 1, sampling, run_seed, slot));
        }
        left_out.extend(skipped.into_iter().map(|skip| (t, skip)));
    }
    (asks, left_out)
}

/// What the engine, its tokenizer and its context are, for the stages that call it.
#[derive(Clone, Copy)]
pub struct Engine<'a> {
    pub handle: &'a EngineHandle,
    pub tokenizer: &'a Tokenizer,
    /// The model's context, in tokens: an episode that would outgrow it ends as a failure.
    pub context: usize,
}

/// Why a roll failed (a plugin's failure is not one: it is a verdict, in the groups).
#[derive(Debug)]
pub enum RollError {
    /// The engine failed a request.
    Generation(wirl_engine::Error),
    /// The chat template cannot hold a multi-turn ledger.
    Template(TemplateDrift),
}

impl std::fmt::Display for RollError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RollError::Generation(error) => write!(f, "generation failed: {}", wirl_engine::error_chain(error)),
            RollError::Template(drift) => drift.fmt(f),
        }
    }
}

impl std::error::Error for RollError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            RollError::Generation(error) => Some(error),
            RollError::Template(drift) => Some(drift),
        }
    }
}

/// Every group's first turn, by ask; and the verdicts of those scored on arrival.
pub struct Sampled {
    generated: Vec<Option<Vec<Trajectory>>>,
    scored: Vec<Option<Vec<Scored>>>,
    /// Seconds spent scoring on arrival.
    pub score_s: f64,
}

/// The multi-turn groups' episodes, by ask index, and where their time went.
#[derive(Default)]
pub struct Episodes {
    outcomes: BTreeMap<usize, Vec<EpisodeOutcome>>,
    pub times: EpisodeTimes,
}

/// Send every ask's first turn to the engine, admitted to its batch together.
pub fn send(engine: &EngineHandle, asks: &[GroupAsk]) -> InFlight {
    engine.send_all(asks.iter().map(GroupAsk::request).collect())
}

/// Receive the first turns as they finish. With `score_on_arrival`, a single-turn group is
/// scored at once, while the rest still sample. `None` when `stop()` said so first.
pub fn receive(
    mut in_flight: InFlight,
    asks: &[GroupAsk],
    mut score_on_arrival: Option<&mut [LoadedTask]>,
    stop: &dyn Fn() -> bool,
) -> Option<Result<Sampled, RollError>> {
    let mut sampled = Sampled {
        generated: asks.iter().map(|_| None).collect(),
        scored: asks.iter().map(|_| None).collect(),
        score_s: 0.0,
    };
    loop {
        match in_flight.next_finished(stop) {
            Finished::Request(i, result) => {
                let trajectories: Vec<Trajectory> = match result {
                    Ok(completions) => completions.into_iter().map(Trajectory::from).collect(),
                    Err(error) => return Some(Err(RollError::Generation(error))),
                };
                let ask = &asks[i];
                if let Some(tasks) = score_on_arrival.as_deref_mut()
                    && !tasks[ask.task].runs_episodes()
                {
                    let started = Instant::now();
                    let owner = &mut tasks[ask.task];
                    let texts: Vec<String> = trajectories.iter().map(|t| t.text.clone()).collect();
                    sampled.scored[i] =
                        Some(owner.scorers.score_group(&ask.problem, &texts, owner.spec.failures, ask.progress));
                    sampled.score_s += started.elapsed().as_secs_f64();
                }
                sampled.generated[i] = Some(trajectories);
            }
            Finished::All => return Some(Ok(sampled)),
            Finished::Stopped => return None,
        }
    }
}

/// Run the multi-turn groups' episodes from their first replies, every live episode's next
/// turn admitted together; their environment scores them. `None` when `stop()` said so.
pub fn run_episode_groups(
    engine: Engine<'_>,
    tasks: &[LoadedTask],
    asks: &[GroupAsk],
    sampled: &mut Sampled,
    stop: &dyn Fn() -> bool,
) -> Option<Result<Episodes, RollError>> {
    let episodic: Vec<usize> = (0..asks.len()).filter(|&i| tasks[asks[i].task].runs_episodes()).collect();
    if episodic.is_empty() {
        return Some(Ok(Episodes::default()));
    }
    let mut runs = Vec::new();
    for &i in &episodic {
        let ask = &asks[i];
        let owner = &tasks[ask.task];
        let Some(environment) = owner.source.episodes() else {
            unreachable!("LoadedTask::load refuses a multi-turn task without an environment")
        };
        runs.push(EpisodeGroup {
            environment,
            task: &ask.problem,
            prompt: &ask.prompt,
            first: sampled.generated[i].take().unwrap_or_default(),
            sampling: ask.sampling,
            seed: ask.seed,
            max_turns: owner.spec.max_turns,
            failures: owner.spec.failures,
        });
    }
    let ran = match run_episodes(engine.handle, engine.tokenizer, engine.context, runs, stop)? {
        Ok(ran) => ran,
        Err(drift) => return Some(Err(RollError::Template(drift))),
    };
    Some(Ok(Episodes { outcomes: episodic.into_iter().zip(ran.groups).collect(), times: ran.times }))
}

/// Score the single-turn groups not scored on arrival, a task's groups together: at once
/// where its graders run programs in worker processes.
pub fn score_rest(tasks: &mut [LoadedTask], asks: &[GroupAsk], sampled: &mut Sampled, episodes: &Episodes) {
    let unscored: Vec<usize> =
        (0..asks.len()).filter(|i| sampled.scored[*i].is_none() && !episodes.outcomes.contains_key(i)).collect();
    let owners: BTreeSet<usize> = unscored.iter().map(|&i| asks[i].task).collect();
    for t in owners {
        let members: Vec<usize> = unscored.iter().copied().filter(|&i| asks[i].task == t).collect();
        let texts: Vec<Vec<String>> = members
            .iter()
            .map(|&i| sampled.generated[i].iter().flatten().map(|trajectory| trajectory.text.clone()).collect())
            .collect();
        let groups: Vec<(&Task, &[String], Progress)> = members
            .iter()
            .zip(&texts)
            .map(|(&i, texts)| (&asks[i].problem, texts.as_slice(), asks[i].progress))
            .collect();
        let owner = &mut tasks[t];
        for (i, scores) in members.iter().zip(owner.scorers.score_groups(&groups, owner.spec.failures)) {
            sampled.scored[*i] = Some(scores);
        }
    }
}

/// The groups, in ask order: sampled and scored, or run as episodes.
pub fn assemble(
    tasks: &[LoadedTask],
    asks: Vec<GroupAsk>,
    mut sampled: Sampled,
    mut episodes: Episodes,
) -> Vec<RolloutGroup> {
    asks.into_iter()
        .enumerate()
        .map(|(i, ask)| {
            let (trajectories, scores) = match (episodes.outcomes.remove(&i), sampled.generated[i].take()) {
                (Some(outcomes), _) => outcomes.into_iter().map(|o| (o.trajectory, o.score)).unzip(),
                (None, Some(trajectories)) => {
                    (trajectories, sampled.scored[i].take().expect("score_rest scores every single-turn group"))
                }
                (None, None) => unreachable!("every group is either an episode group or sampled"),
            };
            let task_name = tasks[ask.task].spec.name.clone();
            RolloutGroup { task_name, task: ask.problem, prompt: ask.prompt, trajectories, scores }
        })
        .collect()
}

/// From the first turns on: episodes, scores, groups.
pub fn finish(
    engine: Engine<'_>,
    tasks: &mut [LoadedTask],
    asks: Vec<GroupAsk>,
    mut sampled: Sampled,
    stop: &dyn Fn() -> bool,
) -> Option<Result<Vec<RolloutGroup>, RollError>> {
    let episodes = match run_episode_groups(engine, tasks, &asks, &mut sampled, stop)? {
        Ok(episodes) => episodes,
        Err(error) => return Some(Err(error)),
    };
    score_rest(tasks, &asks, &mut sampled, &episodes);
    Some(Ok(assemble(tasks, asks, sampled, episodes)))
}

/// Roll `asks` from start to end: every group sampled, run and scored. `None` when `stop()`
/// said so first.
pub fn collect_groups(
    engine: Engine<'_>,
    tasks: &mut [LoadedTask],
    asks: Vec<GroupAsk>,
    stop: &dyn Fn() -> bool,
) -> Option<Result<Vec<RolloutGroup>, RollError>> {
    let sampled = match receive(send(engine.handle, &asks), &asks, None, stop)? {
        Ok(sampled) => sampled,
        Err(error) => return Some(Err(error)),
    };
    finish(engine, tasks, asks, sampled, stop)
}
