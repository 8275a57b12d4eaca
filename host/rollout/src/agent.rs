//! Agent plugins in training: the host side of their `inference` import, and turning the
//! rollouts they return into [`RolloutGroup`]s with exact tokens.
//!
//! An agent sees messages, not tokens. Each `generate` call's completion gets a `generation`
//! handle, under which the host keeps the token ledger it was sampled from: a conversation
//! that continues an earlier generation's (its messages, its reply, then new messages) is
//! extended from that generation's ledger — the reply's sampled ids kept, only the new
//! messages rendered by the chat template and tokenized (no loss) — never re-tokenized. A
//! rollout names its handles in order; the host resolves the last to its ledger, checking
//! that each continues the one before.

use crate::episode::appended_text;
use crate::group::{RolloutGroup, SamplingSpec, Trajectory};
use crate::prompt::prompt_ids;
use crate::score::{FailurePolicy, Scored};
use crate::seed::seed_for;
pub use crate::spec::AgentLimits;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use wirl_engine::{EngineHandle, FinishReason, GenerateRequest, Sampling, TextToScore, Tokenizer};
use wirl_sandbox::{
    AgentPlugin, AgentRolloutGroup, Completion, InferenceHost, Message, ReplyLogprobs, ReplyToScore, RolloutRequest,
    Task, printable,
};

/// One completion the host generated for the agent, with the ledger it came from.
struct Generation {
    conversation: Vec<Message>,
    reply: String,
    /// The whole sequence: the first prompt, then every turn (model and appended).
    tokens: Vec<u32>,
    trainable: Vec<bool>,
    logprobs: Vec<f32>,
    /// Where the first prompt ends in `tokens`.
    prompt_len: usize,
    parent: Option<u64>,
    turns: usize,
    eos: Option<u32>,
    weights_version: u64,
}

/// Whose budget an [`EngineInference`] keeps, as its refusals say it.
#[derive(Clone, Copy, Debug)]
struct Budget {
    who: &'static str,
    calls: &'static str,
    tokens: &'static str,
}

impl Budget {
    const AGENT: Budget = Budget {
        who: "this agent",
        calls: "agent.max_generate_calls per rollout",
        tokens: "agent.max_tokens per rollout",
    };
    const REWARD: Budget = Budget {
        who: "this reward",
        calls: "inference_calls of its [[rewards]] entry, per scoring call",
        tokens: "inference_tokens of its [[rewards]] entry, per scoring call",
    };
}

#[derive(Default)]
struct Ledgers {
    generations: HashMap<u64, Generation>,
    calls: u64,
    tokens: u64,
    next: u64,
}

/// What calls to the model through [`EngineInference`]s cost, summed until taken: an LLM
/// judge's share of a step (its rewards' calls all count into one).
#[derive(Debug, Default)]
pub struct InferenceUsage {
    calls: std::sync::atomic::AtomicU64,
    tokens: std::sync::atomic::AtomicU64,
    waited_ns: std::sync::atomic::AtomicU64,
}

/// [`InferenceUsage`]'s figures since it was last taken.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct InferenceFigures {
    /// `generate` calls the engine answered.
    pub calls: u64,
    /// Tokens it generated for them.
    pub tokens: u64,
    /// Seconds the callers waited for it (calls made side by side each count their wait).
    pub waited_s: f64,
}

impl InferenceUsage {
    fn add(&self, tokens: u64, waited: std::time::Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.calls.fetch_add(1, Relaxed);
        self.tokens.fetch_add(tokens, Relaxed);
        self.waited_ns.fetch_add(u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// The figures so far, and from 0 again.
    pub fn take(&self) -> InferenceFigures {
        use std::sync::atomic::Ordering::Relaxed;
        InferenceFigures {
            calls: self.calls.swap(0, Relaxed),
            tokens: self.tokens.swap(0, Relaxed),
            waited_s: self.waited_ns.swap(0, Relaxed) as f64 * 1e-9,
        }
    }
}

/// The engine behind an agent's `inference.generate`, for one `rollouts` call.
pub struct EngineInference {
    engine: EngineHandle,
    tokenizer: Arc<Tokenizer>,
    context: usize,
    /// The task's sampling: `max_tokens` caps what an agent may ask for.
    sampling: SamplingSpec,
    seed: u64,
    limits: AgentLimits,
    /// Conversations one `generate` call may carry ([`EngineInference::with_max_conversations`]).
    max_conversations: usize,
    /// Whose budget it is, in refusals: the caller and its two config keys.
    budget: Budget,
    ledgers: Mutex<Ledgers>,
    /// Where the calls' cost is counted ([`EngineInference::counting`]); none: nowhere.
    usage: Option<Arc<InferenceUsage>>,
}

impl EngineInference {
    /// `limits` are for the whole call (the per-rollout limits times the rollouts asked).
    pub fn new(
        engine: EngineHandle,
        tokenizer: Arc<Tokenizer>,
        context: usize,
        sampling: SamplingSpec,
        seed: u64,
        limits: AgentLimits,
    ) -> Self {
        EngineInference {
            engine,
            tokenizer,
            context,
            sampling,
            seed,
            limits,
            max_conversations: MAX_CONVERSATIONS_PER_CALL,
            budget: Budget::AGENT,
            ledgers: Mutex::default(),
            usage: None,
        }
    }

    /// Refusals name a reward plugin's budget (`inference_calls`, `inference_tokens` of its
    /// `[[rewards]]` entry), not an agent's: the host of a judge's calls.
    pub fn for_reward(mut self) -> Self {
        self.budget = Budget::REWARD;
        self
    }

    /// Count the calls' tokens and waits into `usage`.
    pub fn counting(mut self, usage: Arc<InferenceUsage>) -> Self {
        self.usage = Some(usage);
        self
    }

    /// At most `max` conversations a call (default [`MAX_CONVERSATIONS_PER_CALL`]).
    pub fn with_max_conversations(mut self, max: usize) -> Self {
        self.max_conversations = max;
        self
    }

    fn ledgers(&self) -> std::sync::MutexGuard<'_, Ledgers> {
        self.ledgers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The prompt of `conversation` (its ledger tokens, trainable flags, log-probs, where
    /// the first prompt ends, parent, turns so far), continuing an earlier generation where
    /// the conversation does.
    fn prompt_of(&self, conversation: &[Message]) -> Result<LedgerPrompt, String> {
        let ledgers = self.ledgers();
        // The latest generation whose conversation and reply this one starts with.
        let parent = ledgers
            .generations
            .iter()
            .filter(|(_, g)| {
                conversation.len() > g.conversation.len()
                    && conversation[..g.conversation.len()] == g.conversation[..]
                    && conversation[g.conversation.len()].role == "assistant"
                    && conversation[g.conversation.len()].content == g.reply
            })
            .max_by_key(|(id, g)| (g.conversation.len(), **id));
        if let Some((&id, g)) = parent {
            let rest = &conversation[g.conversation.len() + 1..];
            let text =
                appended_text(&self.tokenizer, &g.conversation, &g.reply, g.eos, rest).map_err(|e| e.to_string())?;
            let added = self.tokenizer.encode(&text).map_err(|e| format!("tokenizing the conversation: {e}"))?;
            let mut tokens = g.tokens.clone();
            let mut trainable = g.trainable.clone();
            let mut logprobs = g.logprobs.clone();
            trainable.extend(std::iter::repeat_n(false, added.len()));
            logprobs.extend(std::iter::repeat_n(0.0, added.len()));
            tokens.extend(added);
            return Ok((tokens, trainable, logprobs, g.prompt_len, Some(id), g.turns));
        }
        let task = Task { id: String::new(), messages: conversation.to_vec(), answer: None, metadata: None };
        let tokens = prompt_ids(&self.tokenizer, &task).map_err(|e| wirl_engine::error_chain(&e))?;
        let n = tokens.len();
        Ok((tokens, vec![false; n], vec![0.0; n], n, None, 0))
    }

    /// The trajectory that the rollout's named generations form: the last one's ledger,
    /// each continuing the one before. `Err((kind, message))` otherwise.
    pub fn resolve(&self, handles: &[u64]) -> Result<(Vec<u32>, Trajectory), (String, String)> {
        let ledgers = self.ledgers();
        let Some(&last) = handles.last() else {
            return Err(("no_generation".into(), "the rollout names no generation".into()));
        };
        for (k, handle) in handles.iter().enumerate() {
            let Some(g) = ledgers.generations.get(handle) else {
                return Err((
                    "unknown_generation".into(),
                    format!("the rollout names generation {handle}, which the engine never gave this agent"),
                ));
            };
            let expected = if k == 0 { None } else { Some(handles[k - 1]) };
            if g.parent != expected {
                return Err((
                    "broken_generations".into(),
                    format!(
                        "generation {handle} does not continue {} (a rollout's generations must each continue the \
                         conversation of the one before, with its reply)",
                        expected.map_or("a fresh conversation".to_string(), |e| format!("generation {e}"))
                    ),
                ));
            }
        }
        let g = &ledgers.generations[&last];
        let p = g.prompt_len;
        let trajectory = Trajectory {
            tokens: g.tokens[p..].to_vec(),
            logprobs: g.logprobs[p..].to_vec(),
            trainable: g.trainable[p..].to_vec(),
            text: g.reply.clone(),
            finish: FinishReason::Stop,
            weights_version: g.weights_version,
            turns: g.turns,
            turn_starts: Vec::new(),
            conversation: Vec::new(),
        };
        Ok((g.tokens[..p].to_vec(), trajectory))
    }
}

/// A conversation's prompt as the ledger continues it: tokens, which of them were sampled,
/// their log-probs, where the first prompt ends, the parent generation, turns so far.
type LedgerPrompt = (Vec<u32>, Vec<bool>, Vec<f32>, usize, Option<u64>, usize);

impl EngineInference {
    /// This call's number and the tokens each of its conversations may make; `None` for a
    /// call without conversations; or why it is refused. Everything is bounded before
    /// anything is tokenized: the calls and tokens of the rollouts, a call's conversations,
    /// their roles and sizes.
    fn admit(
        &self,
        conversations: &[Vec<Message>],
        sampling: &wirl_sandbox::Sampling,
    ) -> Result<Option<(u64, usize)>, String> {
        let call = self.count_call()?;
        if conversations.is_empty() {
            return Ok(None);
        }
        self.check_call_size(conversations.len())?;
        for (i, conversation) in conversations.iter().enumerate() {
            check_conversation(i, conversation, self.context)?;
        }
        if sampling.max_tokens == 0 {
            return Err("sampling.max_tokens is 0: ask for at least one token".into());
        }
        let left = self.limits.tokens.saturating_sub(self.ledgers().tokens);
        // Each conversation may make its share of what the rollouts have left, no more.
        let share = usize::try_from(left / conversations.len() as u64).unwrap_or(usize::MAX);
        if share == 0 {
            return Err(format!(
                "{} conversations in one call, {left} tokens left ({}): not one token each",
                conversations.len(),
                self.budget.tokens
            ));
        }
        Ok(Some((call, (sampling.max_tokens as usize).min(self.sampling.max_tokens).min(share))))
    }

    /// Count one call (of either kind) against the budget; its number, or why it is refused
    /// (too many calls, the tokens spent).
    fn count_call(&self) -> Result<u64, String> {
        let mut ledgers = self.ledgers();
        ledgers.calls += 1;
        if ledgers.calls > self.limits.generate_calls {
            return Err(format!(
                "{} made more than {} calls to the model ({})",
                self.budget.who, self.limits.generate_calls, self.budget.calls
            ));
        }
        if ledgers.tokens >= self.limits.tokens {
            return Err(format!(
                "{} spent its {} tokens ({})",
                self.budget.who, self.limits.tokens, self.budget.tokens
            ));
        }
        Ok(ledgers.calls)
    }

    /// Whether one call may carry `count` conversations.
    fn check_call_size(&self, count: usize) -> Result<(), String> {
        if count > self.max_conversations {
            return Err(format!(
                "one call carries {count} conversations: at most {} (four per rollout asked for, at least \
                 {MAX_CONVERSATIONS_PER_CALL})",
                self.max_conversations
            ));
        }
        Ok(())
    }

    /// The texts of a `logprobs` call (each reply after its conversation's prompt, the reply's
    /// special-token strings read as text), counted against the tokens left; or why not.
    fn texts_to_score(&self, replies: &[ReplyToScore]) -> Result<Vec<TextToScore>, String> {
        self.check_call_size(replies.len())?;
        let mut texts = Vec::with_capacity(replies.len());
        for (i, asked) in replies.iter().enumerate() {
            check_conversation(i, &asked.conversation, self.context)?;
            if asked.reply.len() > self.context.saturating_mul(MAX_BYTES_PER_TOKEN) {
                return Err(format!("reply {i} is {} bytes: it cannot fit the model's context", asked.reply.len()));
            }
            let task = Task { id: String::new(), messages: asked.conversation.clone(), answer: None, metadata: None };
            let mut ids = prompt_ids(&self.tokenizer, &task).map_err(|e| wirl_engine::error_chain(&e))?;
            let from = ids.len();
            let reply = self
                .tokenizer
                .encode(&self.tokenizer.escape(&asked.reply))
                .map_err(|e| format!("tokenizing reply {i}: {e}"))?;
            ids.extend(reply);
            if ids.len() > self.context {
                return Err(format!(
                    "reply {i} with its conversation is {} tokens, past the model's context of {}",
                    ids.len(),
                    self.context
                ));
            }
            texts.push(TextToScore { ids, from });
        }
        let scored: u64 = texts.iter().map(|t| (t.ids.len() - t.from) as u64).sum();
        let mut ledgers = self.ledgers();
        let left = self.limits.tokens.saturating_sub(ledgers.tokens);
        if scored > left {
            return Err(format!(
                "the replies are {scored} tokens, {left} left to {} ({})",
                self.budget.who, self.budget.tokens
            ));
        }
        ledgers.tokens += scored;
        Ok(texts)
    }

    /// The engine's requests for an admitted call, and each conversation's ledger prompt.
    fn requests(
        &self,
        conversations: &[Vec<Message>],
        sampling: &wirl_sandbox::Sampling,
        call: u64,
        max_tokens: usize,
    ) -> Result<(Vec<GenerateRequest>, Vec<LedgerPrompt>), String> {
        let mut requests = Vec::new();
        let mut prompts = Vec::new();
        for (i, conversation) in conversations.iter().enumerate() {
            let prompt = self.prompt_of(conversation)?;
            if prompt.0.len() + max_tokens > self.context {
                return Err(format!(
                    "conversation {i} is {} tokens; with max_tokens = {max_tokens} it does not fit the model's \
                     context of {}",
                    prompt.0.len(),
                    self.context
                ));
            }
            // Seeded by the agent's seed if it gave one, else by the call, so runs repeat.
            let seed = seed_for(self.seed, sampling.seed.unwrap_or(call << 16) ^ i as u64);
            let engine_sampling = Sampling {
                max_tokens,
                temperature: sampling.temperature,
                top_p: sampling.top_p,
                top_k: sampling.top_k as usize,
                min_p: sampling.min_p,
                stop: sampling.stop.clone(),
                seed: Some(seed),
                ..Default::default()
            };
            engine_sampling.validate().map_err(|e| format!("sampling: {e}"))?;
            requests.push(GenerateRequest { prompt: prompt.0.clone(), n: 1, sampling: engine_sampling });
            prompts.push(prompt);
        }
        Ok((requests, prompts))
    }

    /// Each completion kept in the ledger (under the id the agent is given) and counted
    /// against the rollouts' tokens.
    fn record(
        &self,
        conversations: Vec<Vec<Message>>,
        prompts: Vec<LedgerPrompt>,
        results: Vec<wirl_engine::Result<Vec<wirl_engine::Completion>>>,
    ) -> Result<Vec<Completion>, String> {
        let mut ledgers = self.ledgers();
        let mut out = Vec::new();
        for ((conversation, prompt), result) in conversations.into_iter().zip(prompts).zip(results) {
            let completion = result.map_err(|e| e.to_string())?.into_iter().next().ok_or("no completion")?;
            let (mut tokens, mut trainable, mut logprobs, prompt_len, parent, turns) = prompt;
            ledgers.tokens += completion.tokens.len() as u64;
            trainable.extend(std::iter::repeat_n(true, completion.tokens.len()));
            logprobs.extend_from_slice(&completion.logprobs);
            tokens.extend_from_slice(&completion.tokens);
            let eos = completion.tokens.last().copied().filter(|id| self.tokenizer.eos_ids().contains(id));
            let id = ledgers.next;
            ledgers.next += 1;
            ledgers.generations.insert(
                id,
                Generation {
                    conversation,
                    reply: completion.text.clone(),
                    tokens,
                    trainable,
                    logprobs,
                    prompt_len,
                    parent,
                    turns: turns + 1,
                    eos,
                    weights_version: completion.weights_version,
                },
            );
            out.push(Completion {
                text: completion.text,
                finish_reason: match completion.finish {
                    FinishReason::Stop => wirl_sandbox::FinishReason::Stop,
                    FinishReason::Length => wirl_sandbox::FinishReason::Length,
                },
                generation: id,
            });
        }
        Ok(out)
    }
}

impl InferenceHost for EngineInference {
    fn generate(
        &self,
        conversations: Vec<Vec<Message>>,
        sampling: wirl_sandbox::Sampling,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<Completion>, String>> + Send + '_>> {
        Box::pin(async move {
            let Some((call, max_tokens)) = self.admit(&conversations, &sampling)? else {
                return Ok(Vec::new());
            };
            let (requests, prompts) = self.requests(&conversations, &sampling, call, max_tokens)?;
            let asked = std::time::Instant::now();
            let results = self.engine.generate_all(requests).await;
            if let Some(usage) = &self.usage {
                let tokens: usize = results.iter().flatten().flatten().map(|c| c.tokens.len()).sum();
                usage.add(tokens as u64, asked.elapsed());
            }
            self.record(conversations, prompts, results)
        })
    }

    fn logprobs(
        &self,
        replies: Vec<ReplyToScore>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<ReplyLogprobs>, String>> + Send + '_>> {
        Box::pin(async move {
            self.count_call()?;
            let texts = self.texts_to_score(&replies)?;
            let asked = std::time::Instant::now();
            let results = self.engine.logprobs(texts.clone()).await.map_err(|e| e.to_string())?;
            if let Some(usage) = &self.usage {
                let tokens: usize = texts.iter().map(|t| t.ids.len() - t.from).sum();
                usage.add(tokens as u64, asked.elapsed());
            }
            let mut out = Vec::with_capacity(texts.len());
            for (i, (text, result)) in texts.iter().zip(results).enumerate() {
                let logprobs = result.map_err(|e| format!("reply {i}: {e}"))?;
                // Each token's text as the reply's text grows by it (a token alone may decode
                // otherwise: a word-level tokenizer drops the space before it), so that the
                // texts join into the reply; a token ending inside a character has "" and the
                // next carries the character.
                let mut stream = wirl_engine::TextStream::new();
                let tokens = text.ids[text.from..]
                    .iter()
                    .map(|&id| {
                        stream
                            .push(&self.tokenizer, id)
                            .map(Option::unwrap_or_default)
                            .map_err(|e| format!("reply {i}: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                out.push(ReplyLogprobs { tokens, logprobs });
            }
            Ok(out)
        })
    }
}

/// The fewest conversations one `generate` call may carry; an agent's call for a step's
/// rollouts may carry four per rollout asked for (one each is the common case; a call of a
/// thousand for eight rollouts was gigabytes of prompts and caches at once).
pub const MAX_CONVERSATIONS_PER_CALL: usize = 64;
/// Conversations a call may carry per rollout asked for (best-of-n tool use, drafts).
const CONVERSATIONS_PER_ROLLOUT: u64 = 4;
/// Roles an agent's messages may have (what chat templates know).
pub const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];
/// A conversation's text is refused before tokenizing when it is this many bytes a token of
/// the context: no tokenizer's tokens are that long on average, so it could not fit.
const MAX_BYTES_PER_TOKEN: usize = 64;

/// A conversation an agent gives: not empty, known roles, text that could fit the context.
fn check_conversation(i: usize, conversation: &[Message], context: usize) -> Result<(), String> {
    if conversation.is_empty() {
        return Err(format!("conversation {i} is empty: give at least one message"));
    }
    if let Some(message) = conversation.iter().find(|m| !ROLES.contains(&m.role.as_str())) {
        return Err(format!(
            "conversation {i} has a message with the role {:?}: roles are {}",
            message.role,
            ROLES.join(", ")
        ));
    }
    let bytes: usize = conversation.iter().map(|m| m.content.len()).sum();
    if bytes > context.saturating_mul(MAX_BYTES_PER_TOKEN) {
        return Err(format!(
            "conversation {i} is {bytes} bytes of text: it cannot fit the model's context of {context} tokens"
        ));
    }
    Ok(())
}

/// What an agent task's step needs.
pub struct AgentCall<'a> {
    pub agent: &'a AgentPlugin,
    pub engine: &'a EngineHandle,
    pub tokenizer: &'a Arc<Tokenizer>,
    pub context: usize,
    pub groups: usize,
    pub group_size: usize,
    pub sampling: SamplingSpec,
    pub seed: u64,
    pub cursor: u64,
    pub limits: AgentLimits,
    pub failures: FailurePolicy,
    /// The task's name, for the records.
    pub task_name: &'a str,
}

/// Ask the agent for its groups and resolve them. A rollout whose generations cannot be
/// resolved, or whose outcome is an error, is a failed trajectory with its reason (handled by
/// `failures`); if the whole call fails, each group asked for is one of `group_size`
/// masked trajectories naming the failure. Groups beyond those asked are dropped.
pub fn agent_groups(call: &AgentCall<'_>) -> Vec<RolloutGroup> {
    let rollouts = (call.groups * call.group_size).max(1) as u64;
    let host = Arc::new(
        EngineInference::new(
            call.engine.clone(),
            call.tokenizer.clone(),
            call.context,
            call.sampling,
            call.seed,
            AgentLimits {
                generate_calls: call.limits.generate_calls.saturating_mul(rollouts),
                tokens: call.limits.tokens.saturating_mul(rollouts),
            },
        )
        .with_max_conversations(
            usize::try_from(rollouts.saturating_mul(CONVERSATIONS_PER_ROLLOUT))
                .unwrap_or(usize::MAX)
                .max(MAX_CONVERSATIONS_PER_CALL),
        ),
    );
    let request = RolloutRequest {
        groups: call.groups as u32,
        group_size: call.group_size as u32,
        sampling: wirl_sandbox::Sampling {
            max_tokens: call.sampling.max_tokens as u32,
            temperature: call.sampling.temperature,
            top_p: call.sampling.top_p,
            top_k: call.sampling.top_k as u32,
            min_p: 0.0,
            stop: Vec::new(),
            seed: None,
        },
        seed: call.seed,
        cursor: call.cursor,
    };
    let name = call.agent.plugin().name().to_string();
    let produced = call.agent.rollouts(&request, host.clone());
    let groups: Vec<AgentRolloutGroup> = match produced {
        Ok(groups) => groups,
        Err(failure) => {
            tracing::warn!("agent {name}: {}", printable(&failure.to_string()));
            let message = format!("the agent failed, nothing to train on: {failure}");
            return (0..call.groups)
                .map(|i| {
                    let id = format!("{}/{}", call.task_name, call.cursor + i as u64);
                    RolloutGroup::placeholder(call.task_name, id, call.group_size, failure.kind.name(), &name, &message)
                })
                .collect();
        }
    };
    if groups.len() != call.groups {
        tracing::warn!("agent {name} returned {} groups where {} were asked for", groups.len(), call.groups);
    }
    groups.into_iter().take(call.groups).map(|group| resolve_group(&host, group, &name, call)).collect()
}

/// One agent group as a `RolloutGroup`: the rollouts' ledgers under their longest common
/// prompt (what differs after it is context, no loss), each scored by its outcome. A rollout
/// whose generations do not resolve has no tokens to train on: it is masked whatever the
/// policy; one that resolves but failed is handled by the task's `on_failure`.
fn resolve_group(host: &EngineInference, group: AgentRolloutGroup, agent: &str, call: &AgentCall<'_>) -> RolloutGroup {
    type Verdict = Result<wirl_sandbox::Score, (String, String)>;
    type Resolved = Result<(Vec<u32>, Trajectory, Verdict), (String, String)>;
    let mut resolved: Vec<Resolved> = Vec::new();
    for rollout in group.rollouts {
        resolved.push(host.resolve(&rollout.generations).map(|(prompt, mut trajectory)| {
            let verdict = match rollout.outcome {
                Ok(score) if score.reward.is_finite() && score.parts.iter().all(|(_, v)| v.is_finite()) => Ok(score),
                Ok(score) => {
                    Err(("non_finite".into(), format!("the rollout's score is not finite ({})", score.reward)))
                }
                Err(reason) => Err(("agent_error".into(), reason)),
            };
            trajectory.conversation = rollout.messages;
            (prompt, trajectory, verdict)
        }));
    }
    // The group's prompt: the longest prefix of the shortest prompt that every resolved
    // rollout's ledger starts with.
    let resolved_ok: Vec<&(Vec<u32>, Trajectory, Verdict)> = resolved.iter().filter_map(|r| r.as_ref().ok()).collect();
    let shortest = resolved_ok.iter().map(|(p, _, _)| p.len()).min().unwrap_or(0);
    let common = match resolved_ok.first() {
        Some((first, _, _)) => {
            (0..shortest).take_while(|&i| resolved_ok.iter().all(|(p, _, _)| p[i] == first[i])).count()
        }
        None => 0,
    };
    let prompt = resolved_ok.first().map_or_else(Vec::new, |(p, _, _)| p[..common].to_vec());
    let failed = |kind: String, message: String, policy: Option<FailurePolicy>| {
        tracing::warn!("agent {agent}: {}", printable(&message));
        Scored::failed(&kind, agent, format!("{kind}: {message}"), policy)
    };
    let mut trajectories = Vec::new();
    let mut scores = Vec::new();
    for outcome in resolved {
        match outcome {
            Ok((own_prompt, t, verdict)) => {
                // What of its own prompt lies past the group's becomes context (no loss).
                let extra = own_prompt.len() - common;
                let mut tokens = own_prompt[common..].to_vec();
                tokens.extend(&t.tokens);
                let mut trainable = vec![false; extra];
                trainable.extend(&t.trainable);
                let mut logprobs = vec![0.0; extra];
                logprobs.extend(&t.logprobs);
                trajectories.push(Trajectory { tokens, trainable, logprobs, ..t });
                scores.push(match verdict {
                    Ok(score) => {
                        let mut scored = Scored { reward: score.reward, ..Default::default() };
                        scored.parts = score.parts.into_iter().collect::<BTreeMap<_, _>>();
                        if let Some(note) = score.note {
                            scored.notes.insert(agent.to_string(), note);
                        }
                        scored
                    }
                    Err((kind, message)) => failed(kind, message, Some(call.failures)),
                });
            }
            Err((kind, message)) => {
                trajectories.push(Trajectory::empty());
                scores.push(failed(kind, message, None));
            }
        }
    }
    RolloutGroup { task_name: call.task_name.to_string(), task: group.task, prompt, trajectories, scores }
}
