//! Multi-turn episodes and the token ledger.
//!
//! The host owns the ledger of every episode: the token ids and log-probs of each model turn
//! exactly as sampled, and the environment's messages rendered by the chat template and
//! appended as new tokens that carry no loss (`trainable` false). The next turn is sampled
//! from the ledger itself, so the trainer's tokens are the sampler's: nothing is ever
//! re-tokenized. What the template adds is checked each turn: its rendering of the longer
//! conversation must extend the previous one (append-only) and contain the model's reply as
//! sampled; otherwise the run stops with [`TemplateDrift`] rather than pad over it.
//!
//! All live episodes' turn k are admitted to the engine together, seeded by (group, sample,
//! turn), so runs are reproducible.

use crate::group::{SamplingSpec, Trajectory};
use crate::score::{FailurePolicy, OnFailure, Scored, Status};
use std::collections::BTreeMap;
use wirl_engine::{ChatMessage, EngineHandle, GenerateRequest, Tokenizer};
use wirl_sandbox::{EnvironmentPlugin, Message, StepResult, Task, printable};

/// What runs a task's episodes: an environment plugin (each episode an instance of its own),
/// or an OpenEnv server (each a session of its own). A failure is (kind, message).
pub trait EpisodeSource {
    /// Its name in notes and logs.
    fn name(&self) -> String;
    fn start(&self, task: &Task) -> Result<Box<dyn EpisodeSteps + Send>, (String, String)>;

    /// `count` episodes of `task`: one after another, unless the source can start them side by
    /// side (a remote server: one that never answers then costs one timeout, not `count`).
    fn start_many(&self, task: &Task, count: usize) -> Vec<Result<Box<dyn EpisodeSteps + Send>, (String, String)>> {
        (0..count).map(|_| self.start(task)).collect()
    }
}

/// One running episode.
pub trait EpisodeSteps {
    /// The model's reply: what follows, or the episode's end with its score.
    fn step(&mut self, reply: &str) -> Result<StepResult, (String, String)>;
}

fn failed(failure: wirl_sandbox::Failure) -> (String, String) {
    (failure.kind.name().to_string(), failure.to_string())
}

impl EpisodeSource for EnvironmentPlugin {
    fn name(&self) -> String {
        self.plugin().name().to_string()
    }

    fn start(&self, task: &Task) -> Result<Box<dyn EpisodeSteps + Send>, (String, String)> {
        self.start_episode(task).map(|episode| Box::new(episode) as Box<dyn EpisodeSteps + Send>).map_err(failed)
    }
}

impl EpisodeSteps for wirl_sandbox::Episode {
    fn step(&mut self, reply: &str) -> Result<StepResult, (String, String)> {
        wirl_sandbox::Episode::step(self, reply).map_err(failed)
    }
}

impl EpisodeSource for crate::openenv::OpenEnvTasks {
    fn name(&self) -> String {
        crate::openenv::OpenEnvTasks::name(self)
    }

    fn start(&self, task: &Task) -> Result<Box<dyn EpisodeSteps + Send>, (String, String)> {
        crate::openenv::OpenEnvTasks::start(self, task).map(|episode| Box::new(episode) as Box<dyn EpisodeSteps + Send>)
    }

    fn start_many(&self, task: &Task, count: usize) -> Vec<Result<Box<dyn EpisodeSteps + Send>, (String, String)>> {
        side_by_side((0..count).collect(), |_| EpisodeSource::start(self, task))
    }
}

impl EpisodeSteps for crate::openenv::OpenEnvEpisode {
    fn step(&mut self, reply: &str) -> Result<StepResult, (String, String)> {
        crate::openenv::OpenEnvEpisode::step(self, reply)
    }
}

pub use crate::error::TemplateDrift;

fn chat(messages: &[Message]) -> Vec<ChatMessage> {
    messages.iter().map(|m| ChatMessage { role: m.role.clone(), content: m.content.clone() }).collect()
}

/// The text the template appends after `before` (rendered with its generation prompt) once
/// the model replied `reply` (its last token `eos`, if it ended on one) and `messages`
/// followed: the end of the model's turn, the messages, the next generation prompt.
pub fn appended_text(
    tokenizer: &Tokenizer,
    before: &[Message],
    reply: &str,
    ended_on_eos: Option<u32>,
    messages: &[Message],
) -> Result<String, TemplateDrift> {
    let render = |conversation: &[Message]| {
        tokenizer.render_chat(&chat(conversation), true).map_err(|e| TemplateDrift(format!("{e}")))
    };
    let prompt = render(before)?;
    let mut after = before.to_vec();
    after.push(Message { role: "assistant".into(), content: reply.to_string() });
    after.extend(messages.iter().cloned());
    let next = render(&after)?;
    let Some(added) = next.strip_prefix(&prompt) else {
        let at = prompt.chars().zip(next.chars()).take_while(|(a, b)| a == b).count();
        return Err(TemplateDrift(format!(
            "it is not append-only: rendering the conversation one turn longer changes its text at character {at} \
             (before: {:?}, after: {:?})",
            excerpt(&prompt, at),
            excerpt(&next, at)
        )));
    };
    // The model's reply as sampled, after whatever the template puts between the generation
    // prompt and the content (only whitespace is allowed there).
    // The rendering holds the reply as [escaped](Tokenizer::escape) text.
    let reply = tokenizer.escape(reply);
    let (added, reply) = (added.trim_start(), reply.trim_start());
    let Some(mut rest) = added.strip_prefix(reply) else {
        // Qwen3's template keeps a reply's reasoning only while it is the last turn.
        let reasoning = reply.contains("</think>") && !added.contains("</think>");
        return Err(TemplateDrift(format!(
            "it renders the model's reply {:?} as {:?}{}",
            printable(&excerpt(reply, 0)),
            printable(&excerpt(added, 0)),
            if reasoning {
                "; it leaves out the reply's reasoning (<think>…</think>) once the conversation goes on, as \
                 Qwen3's template does, so episodes whose replies think cannot be trained turn by turn with it: \
                 turn thinking off for the task (Qwen3: /no_think in its system message), or use a template that \
                 keeps earlier reasoning"
            } else {
                ""
            }
        )));
    };
    // An end-of-turn token the model sampled is in the ledger already.
    if let Some(eos) = ended_on_eos
        && let Ok(text) = tokenizer.decode(&[eos], false)
        && !text.is_empty()
    {
        rest = rest.strip_prefix(text.as_str()).unwrap_or(rest);
    }
    Ok(rest.to_string())
}

fn excerpt(text: &str, at: usize) -> String {
    text.chars().skip(at.saturating_sub(20)).take(60).collect()
}

/// Check, before training, that the template can hold a multi-turn ledger: a probe
/// conversation rendered a turn longer extends the shorter rendering.
pub fn check_template(tokenizer: &Tokenizer) -> Result<(), TemplateDrift> {
    let before = [
        Message { role: "system".into(), content: "Answer briefly.".into() },
        Message { role: "user".into(), content: "What is 2 + 2?".into() },
    ];
    let followed = [Message { role: "user".into(), content: "And 3 + 3?".into() }];
    appended_text(tokenizer, &before, "It is 4.", None, &followed).map(|_| ())
}

/// One group's episodes to run from their first reply on.
pub struct EpisodeGroup<'a> {
    pub environment: &'a dyn EpisodeSource,
    pub task: &'a Task,
    pub prompt: &'a [u32],
    /// The first replies (turn 0), sampled with the rest of the step.
    pub first: Vec<Trajectory>,
    pub sampling: SamplingSpec,
    /// Seeds the later turns: sample j's turn k gets `seed_for(seed, k << 20 | j)`.
    pub seed: u64,
    pub max_turns: usize,
    pub failures: FailurePolicy,
}

/// Where an episode run's time went.
#[derive(Clone, Copy, Debug, Default)]
pub struct EpisodeTimes {
    /// Model turns after the first, summed over episodes.
    pub turns: usize,
    /// Tokens those turns generated (their time per token is `generate_s / tokens`).
    pub tokens: usize,
    /// Waiting for the engine.
    pub generate_s: f64,
    /// The host's own part: the environment's calls (start, step), rendering the template,
    /// tokenizing what it appends, extending the ledgers.
    pub host_s: f64,
}

/// Every group's finished episodes, in order, and where the time went.
pub struct EpisodeRun {
    pub groups: Vec<Vec<EpisodeOutcome>>,
    pub times: EpisodeTimes,
}

/// A finished episode: its ledger as a trajectory and its score.
pub struct EpisodeOutcome {
    pub trajectory: Trajectory,
    pub score: Scored,
}

/// One episode in flight.
struct Live {
    episode: Option<Box<dyn EpisodeSteps + Send>>,
    /// The conversation as the template renders it, the prompt's messages first.
    conversation: Vec<Message>,
    /// How many of `conversation`'s messages are the task's prompt.
    prompt_messages: usize,
    trajectory: Trajectory,
    /// Each model turn's own reward so far (0.2.0 environments'; none for a turn given none).
    turn_rewards: Vec<Option<f32>>,
    outcome: Option<Result<wirl_sandbox::Score, (String, String)>>,
}

/// Run the groups' episodes to their end (the environment's `done`, a failure, or
/// `max_turns` model turns), every live episode's next turn admitted to the engine together.
/// `None` when `stop()` said so. `context` is the model's; an episode that would outgrow it
/// ends as a failure (`context`).
pub fn run_episodes(
    engine: &EngineHandle,
    tokenizer: &Tokenizer,
    context: usize,
    groups: Vec<EpisodeGroup<'_>>,
    stop: &dyn Fn() -> bool,
) -> Option<Result<EpisodeRun, TemplateDrift>> {
    let started = std::time::Instant::now();
    let mut times = EpisodeTimes::default();
    // Episodes start, and later step, side by side: a server that never answers costs the
    // step one timeout, not one per episode.
    let mut lives: Vec<Vec<Live>> = groups
        .iter()
        .map(|group| {
            let started = group.environment.start_many(group.task, group.first.len());
            group.first.iter().zip(started).map(|(first, episode)| Live::start(group, first, episode)).collect()
        })
        .collect();
    // The reply of the latest turn of each live episode: (group, sample, text, eos).
    let mut replies: Vec<(usize, usize, String, Option<u32>)> = Vec::new();
    for (g, group) in groups.iter().enumerate() {
        for (j, first) in group.first.iter().enumerate() {
            replies.push((g, j, first.text.clone(), ended_on_eos(tokenizer, &first.tokens)));
        }
    }
    for turn in 1..=groups.iter().map(|g| g.max_turns).max().unwrap_or(1) {
        // The environment's answer to each reply; episodes that go on get their next prompt.
        let mut requests = Vec::new();
        let mut asking = Vec::new();
        // Each live episode's environment, taken out to be stepped on a thread of its own.
        let stepping: Vec<Stepping> = replies
            .drain(..)
            .map(|(g, j, text, eos)| {
                let live = &mut lives[g][j];
                let episode = if live.outcome.is_none() { live.episode.take() } else { None };
                Stepping { g, j, reply: Reply { text, eos, turn, sample: j }, episode, stepped: None }
            })
            .collect();
        let stepped = side_by_side(stepping, |mut s| {
            s.stepped = s.episode.as_mut().map(|episode| episode.step(&s.reply.text));
            s
        });
        for Stepping { g, j, reply, episode, stepped } in stepped {
            lives[g][j].episode = episode;
            match lives[g][j].answer(&groups[g], reply, stepped, tokenizer, context) {
                Ok(Some(request)) => {
                    requests.push(request);
                    asking.push((g, j));
                }
                Ok(None) => {}
                Err(drift) => return Some(Err(drift)),
            }
        }
        if requests.is_empty() {
            break;
        }
        let generating = std::time::Instant::now();
        let generated = engine.generate_all_until(requests, stop)?;
        times.generate_s += generating.elapsed().as_secs_f64();
        for ((g, j), result) in asking.into_iter().zip(generated) {
            if let Ok(completions) = &result {
                times.tokens += completions.first().map_or(0, |c| c.tokens.len());
            }
            if let Some((text, eos)) = lives[g][j].take_turn(result, tokenizer) {
                times.turns += 1;
                replies.push((g, j, text, eos));
            }
        }
    }
    let mut out = Vec::new();
    for (group, lives) in groups.iter().zip(lives) {
        let name = group.environment.name();
        out.push(lives.into_iter().map(|live| finish(live, &name, group.failures)).collect());
    }
    times.host_s = started.elapsed().as_secs_f64() - times.generate_s;
    Some(Ok(EpisodeRun { groups: out, times }))
}

/// A reply on its way to its episode's environment, and what the step gave.
struct Stepping {
    g: usize,
    j: usize,
    reply: Reply,
    episode: Option<Box<dyn EpisodeSteps + Send>>,
    stepped: Option<Result<StepResult, (String, String)>>,
}

/// A model turn's reply, for the environment: its text, the end-of-sequence token it ended
/// on (if it did), the turn it was, and which sample of its group said it.
struct Reply {
    text: String,
    eos: Option<u32>,
    turn: usize,
    sample: usize,
}

impl Live {
    /// An episode begun (`started`) from a sample's first reply.
    fn start(
        group: &EpisodeGroup<'_>,
        first: &Trajectory,
        started: Result<Box<dyn EpisodeSteps + Send>, (String, String)>,
    ) -> Live {
        let mut trajectory = first.clone();
        trajectory.trainable = vec![true; trajectory.tokens.len()];
        trajectory.turns = 1;
        trajectory.turn_starts = vec![0];
        let (episode, outcome) = match started {
            Ok(episode) => (Some(episode), None),
            Err(failure) => (None, Some(Err(failure))),
        };
        let conversation = group.task.messages.clone();
        Live {
            episode,
            prompt_messages: conversation.len(),
            conversation,
            trajectory,
            turn_rewards: Vec::new(),
            outcome,
        }
    }

    /// The environment's answer to `reply` (`stepped`: what its step gave, none when the
    /// episode had no environment left), appended to the ledger: the request for the model's
    /// next turn, or `None` when the episode ended here (its outcome set).
    fn answer(
        &mut self,
        group: &EpisodeGroup<'_>,
        reply: Reply,
        stepped: Option<Result<StepResult, (String, String)>>,
        tokenizer: &Tokenizer,
        context: usize,
    ) -> Result<Option<GenerateRequest>, TemplateDrift> {
        let Some(stepped) = stepped else { return Ok(None) };
        if self.outcome.is_some() {
            return Ok(None);
        }
        let messages = match stepped {
            Ok(StepResult::Done(score)) => {
                self.outcome = Some(Ok(score));
                return Ok(None);
            }
            Ok(StepResult::Continue { messages, reward }) => {
                self.turn_rewards.push(reward);
                messages
            }
            Err(failure) => {
                self.outcome = Some(Err(failure));
                return Ok(None);
            }
        };
        if reply.turn >= group.max_turns {
            let message = format!("the episode was not over after max_turns = {} model turns", group.max_turns);
            self.outcome = Some(Err(("max_turns".into(), message)));
            return Ok(None);
        }
        // Text far past what the context can hold in tokens is refused before it is rendered
        // and tokenized (a 15 MB observation once took 70 s and 2.3 GB to be called too long).
        let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
        if bytes > context.saturating_mul(MAX_BYTES_PER_TOKEN) {
            let message = format!(
                "the environment answered with {bytes} bytes of text, more than the model's context of {context}                  tokens can hold"
            );
            self.outcome = Some(Err(("context".into(), message)));
            return Ok(None);
        }
        let text = appended_text(tokenizer, &self.conversation, &reply.text, reply.eos, &messages)?;
        let added = tokenizer
            .encode(&text)
            .map_err(|error| TemplateDrift(format!("the appended text does not tokenize: {error}")))?;
        self.conversation.push(Message { role: "assistant".into(), content: reply.text });
        self.conversation.extend(messages);
        let t = &mut self.trajectory;
        t.logprobs.extend(std::iter::repeat_n(0.0, added.len()));
        t.trainable.extend(std::iter::repeat_n(false, added.len()));
        t.tokens.extend(added);
        let ledger = group.prompt.len() + t.tokens.len();
        if ledger + group.sampling.max_tokens > context {
            let message = format!(
                "after {} turns the conversation is {ledger} tokens; with max_tokens = {} it does not fit the \
                 model's context of {context}",
                t.turns, group.sampling.max_tokens
            );
            self.outcome = Some(Err(("context".into(), message)));
            return Ok(None);
        }
        let mut prompt = group.prompt.to_vec();
        prompt.extend_from_slice(&t.tokens);
        let seed = crate::seed::seed_for(group.seed, ((reply.turn as u64) << 20) | reply.sample as u64);
        Ok(Some(GenerateRequest { prompt, n: 1, sampling: group.sampling.seeded(seed) }))
    }

    /// The model's next turn, appended to the ledger: its reply for the environment, or
    /// `None` when the engine failed it (the episode's outcome then).
    fn take_turn(
        &mut self,
        result: wirl_engine::Result<Vec<wirl_engine::Completion>>,
        tokenizer: &Tokenizer,
    ) -> Option<(String, Option<u32>)> {
        let completion = match result {
            Ok(mut completions) if !completions.is_empty() => completions.remove(0),
            Ok(_) => {
                self.outcome = Some(Err(("generation".into(), "the engine returned no completion".into())));
                return None;
            }
            Err(error) => {
                self.outcome = Some(Err(("generation".into(), error.to_string())));
                return None;
            }
        };
        let t = &mut self.trajectory;
        t.turns += 1;
        t.turn_starts.push(t.tokens.len());
        t.trainable.extend(std::iter::repeat_n(true, completion.tokens.len()));
        t.logprobs.extend_from_slice(&completion.logprobs);
        t.tokens.extend_from_slice(&completion.tokens);
        t.finish = completion.finish;
        let eos = ended_on_eos(tokenizer, &completion.tokens);
        t.text = completion.text.clone();
        Some((completion.text, eos))
    }
}

/// The most of a failure's message logged and kept in an episode's record.
const MAX_FAILURE_BYTES: usize = 2000;

/// More bytes than any tokenizer's longest token: text longer than `context` times this
/// cannot fit `context` tokens, whatever the tokenizer.
const MAX_BYTES_PER_TOKEN: usize = 256;

/// The most episodes started or stepped at once: environments answer from other processes
/// (OpenEnv servers) or sandboxed instances, and wait more than they compute.
const EPISODES_AT_ONCE: usize = 16;

/// `work` on every item, up to [`EPISODES_AT_ONCE`] at a time; results in the items' order.
fn side_by_side<T: Send, R: Send>(items: Vec<T>, work: impl Fn(T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.into_iter().map(work).collect();
    }
    let count = items.len();
    let queue = std::sync::Mutex::new(items.into_iter().enumerate());
    let results: Vec<std::sync::Mutex<Option<R>>> = (0..count).map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..count.min(EPISODES_AT_ONCE) {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().unwrap_or_else(|e| e.into_inner()).next();
                    let Some((index, item)) = next else { break };
                    let result = work(item);
                    *results[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|slot| slot.into_inner().unwrap_or_else(|e| e.into_inner()).expect("every item was worked"))
        .collect()
}

fn ended_on_eos(tokenizer: &Tokenizer, tokens: &[u32]) -> Option<u32> {
    tokens.last().copied().filter(|id| tokenizer.eos_ids().contains(id))
}

/// The episode's score: the environment's, or its failure handled by `policy`.
fn finish(live: Live, environment: &str, policy: FailurePolicy) -> EpisodeOutcome {
    let mut trajectory = live.trajectory;
    // What followed the prompt: each model turn and the environment's answers.
    let mut conversation = live.conversation;
    trajectory.conversation = conversation.split_off(live.prompt_messages.min(conversation.len()));
    trajectory.conversation.push(Message { role: "assistant".into(), content: trajectory.text.clone() });
    let mut score = Scored::default();
    // Turns' own rewards, one per model turn (the last one's is the outcome alone), when any
    // turn had one.
    if live.turn_rewards.iter().any(Option::is_some) {
        score.turn_rewards = live.turn_rewards.iter().map(|r| r.unwrap_or(0.0)).collect();
        score.turn_rewards.resize(trajectory.turns, 0.0);
    }
    let failure = match live.outcome {
        Some(Ok(s)) if s.reward.is_finite() && s.parts.iter().all(|(_, v)| v.is_finite()) => {
            score.reward = s.reward;
            score.parts = s.parts.into_iter().collect::<BTreeMap<_, _>>();
            if let Some(note) = s.note {
                score.notes.insert(environment.to_string(), note);
            }
            None
        }
        Some(Ok(s)) => Some(("non_finite".to_string(), format!("the episode's score is not finite ({})", s.reward))),
        Some(Err(failure)) => Some(failure),
        None => Some(("max_turns".to_string(), "the episode never ended".to_string())),
    };
    if let Some((kind, mut message)) = failure {
        // Bounded: what a remote server or a plugin says is logged and stored per episode.
        if message.len() > MAX_FAILURE_BYTES {
            let mut end = MAX_FAILURE_BYTES;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        tracing::warn!("environment {environment}: {}", printable(&message));
        score.failures.push(kind.clone());
        score.notes.insert(environment.to_string(), format!("{kind}: {message}"));
        (score.status, score.reward) = match policy.on_failure {
            OnFailure::Reward => (Status::Failed, policy.failure_reward),
            OnFailure::Mask => (Status::Masked, 0.0),
        };
    }
    EpisodeOutcome { trajectory, score }
}
