//! `builtin:judge`: an LLM judge (`wirl:rl@0.2.0`). It shows the model a prompt made from a
//! template (the task, the completion, the reference answer), reads a verdict from the reply
//! by a rule the config gives, and rewards the completion with it. In `mode = "each"` (the
//! default) every completion is judged in a conversation of its own, all of a group's in one
//! call to the engine; in `mode = "group"` one conversation shows the whole group and the
//! judge gives each completion its verdict (a RULER-style ranking).
//!
//! A reply with no verdict the rule can read — the judge rambled past `max_tokens`, or
//! answered in another form — fails its completion with the reason; it is never a 0.
//!
//! With `read = "probability"` (mode `each`, `labels` given) nothing is sampled: the judge's
//! verdict is the model's probability of each label as its whole reply (`inference.logprobs`),
//! the reward the labels' values weighted by those probabilities — a generative verifier's
//! `P("Yes")`, smooth where a sampled verdict is 0 or 1.
//! The config's keys are documented in docs/PLUGINS.md, "builtin:judge".

use regex::Regex;
use std::collections::BTreeMap;
use wirl_sdk::reward_v0_2::{
    Completion, FinishReason, Message, Progress, ReplyToScore, Reward, Sampling, Score, Task, config, generate,
    logprobs,
};

/// The default template of `mode = "each"`, and with a reference answer.
const EACH: &str = "Grade the response to the task below.\n\n[Task]\n{question}\n\n[Response]\n{completion}\n\n\
Rate the response from 0 to 10 for how well it does the task. Explain briefly, then end your reply with a \
line of the form `Score: N`.";
const EACH_WITH_ANSWER: &str = "Grade the response to the task below against the reference answer.\n\n\
[Task]\n{question}\n\n[Reference answer]\n{answer}\n\n[Response]\n{completion}\n\nRate the response from 0 \
to 10 for how well it agrees with the reference answer. Explain briefly, then end your reply with a line \
of the form `Score: N`.";
/// The default templates of `mode = "group"`.
const GROUP: &str = "Below are {count} responses to the same task. Grade each one.\n\n[Task]\n{question}\n\n\
[Responses]\n{completions}\n\nRate each response from 0 to 10 for how well it does the task, comparing them \
with each other. Explain briefly, then end your reply with one line per response of the form `[i]: N`.";
const GROUP_WITH_ANSWER: &str = "Below are {count} responses to the same task. Grade each one against the \
reference answer.\n\n[Task]\n{question}\n\n[Reference answer]\n{answer}\n\n[Responses]\n{completions}\n\n\
Rate each response from 0 to 10 for how well it agrees with the reference answer, comparing them with each \
other. Explain briefly, then end your reply with one line per response of the form `[i]: N`.";

/// The default templates of `read = "probability"` (`{labels}`: the labels, listed before the
/// template is parsed).
const LABEL: &str = "Grade the response to the task below.\n\n[Task]\n{question}\n\n[Response]\n{completion}\n\n\
Is the response correct? Reply with one word, {labels}, and nothing else.";
const LABEL_WITH_ANSWER: &str = "Grade the response to the task below against the reference answer.\n\n\
[Task]\n{question}\n\n[Reference answer]\n{answer}\n\n[Response]\n{completion}\n\nDoes the response agree with \
the reference answer? Reply with one word, {labels}, and nothing else.";

/// The default rules: the last `Score: N`; per response, `[i]: N`.
const EACH_PATTERN: &str = r"(?i)score\s*[:=]\s*\**\s*(-?[0-9]+(?:\.[0-9]+)?)";
const GROUP_PATTERN: &str = r"(?m)^\W*\[?([0-9]+)\]?\s*[:=\-]\s*\**\s*(-?[0-9]+(?:\.[0-9]+)?)";

/// The most of a reply kept in a score's note or a failure's reason.
const SHOWN: usize = 400;

/// Conversations (or replies to score) asked in one call: the host's most a call may carry
/// (wirl's `MAX_CONVERSATIONS_PER_CALL`). A larger group is asked in several calls, each
/// counted against the reward's `inference_calls`.
const PER_CALL: usize = 64;

/// `generate`, the conversations asked [`PER_CALL`] at a time; the replies in order.
fn generate_all(conversations: &[Vec<Message>], sampling: &Sampling) -> Result<Vec<Completion>, String> {
    let mut replies = Vec::with_capacity(conversations.len());
    for chunk in conversations.chunks(PER_CALL) {
        replies.extend(generate(chunk, sampling)?);
    }
    Ok(replies)
}

/// `logprobs`, the replies asked [`PER_CALL`] at a time; the results in order.
fn logprobs_all(asked: &[ReplyToScore]) -> Result<Vec<wirl_sdk::reward_v0_2::ReplyLogprobs>, String> {
    let mut scored = Vec::with_capacity(asked.len());
    for chunk in asked.chunks(PER_CALL) {
        scored.extend(logprobs(chunk)?);
    }
    Ok(scored)
}

struct Judge;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    Each,
    Group,
}

/// What a template shows where it names it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Field {
    /// The task's last user message.
    Question,
    /// Every message of the task, `role: content`.
    Conversation,
    /// The task's reference answer.
    Answer,
    /// The completion judged (`each`).
    Completion,
    /// The group's completions, numbered `[1]`, `[2]`, … (`group`).
    Completions,
    /// How many completions the group has (`group`).
    Count,
}

#[derive(Debug, PartialEq)]
enum Piece {
    Text(String),
    Field(Field),
}

/// A template, parsed once: `{name}` fields, `{{` and `}}` for braces.
#[derive(Debug)]
struct Template(Vec<Piece>);

impl Template {
    fn parse(text: &str, mode: Mode) -> Result<Template, String> {
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut rest = text;
        while let Some(at) = rest.find(['{', '}']) {
            literal.push_str(&rest[..at]);
            let tail = &rest[at..];
            if tail.starts_with("{{") || tail.starts_with("}}") {
                literal.push_str(&tail[..1]);
                rest = &tail[2..];
                continue;
            }
            if tail.starts_with('}') {
                return Err("config key `template`: a lone `}` (write `}}` for a brace)".into());
            }
            let Some(end) = tail.find('}') else {
                return Err("config key `template`: a `{` that is never closed (write `{{` for a brace)".into());
            };
            let name = &tail[1..end];
            let field = match name {
                "question" => Field::Question,
                "conversation" => Field::Conversation,
                "answer" => Field::Answer,
                "completion" => Field::Completion,
                "completions" => Field::Completions,
                "count" => Field::Count,
                other => {
                    return Err(format!(
                        "config key `template`: unknown field `{{{other}}}`; the fields are {{question}}, \
                         {{conversation}}, {{answer}}, {{completion}} (mode \"each\"), {{completions}} and \
                         {{count}} (mode \"group\")"
                    ));
                }
            };
            let wrong = match mode {
                Mode::Each => matches!(field, Field::Completions | Field::Count),
                Mode::Group => field == Field::Completion,
            };
            if wrong {
                let wanted = if mode == Mode::Each { "{completion}" } else { "{completions}" };
                return Err(format!(
                    "config key `template`: `{{{name}}}` is not a field of mode \"{}\"; it shows {wanted}",
                    if mode == Mode::Each { "each" } else { "group" }
                ));
            }
            if !literal.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut literal)));
            }
            pieces.push(Piece::Field(field));
            rest = &tail[end + 1..];
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            pieces.push(Piece::Text(literal));
        }
        let shown = if mode == Mode::Each { Field::Completion } else { Field::Completions };
        if !pieces.contains(&Piece::Field(shown)) {
            let name = if mode == Mode::Each { "{completion}" } else { "{completions}" };
            return Err(format!("config key `template`: it never shows the judged text: put {name} in it"));
        }
        Ok(Template(pieces))
    }

    /// The prompt for `task` and `judged` (one completion, or the group's).
    fn render(&self, task: &Task, judged: &[String]) -> Result<String, String> {
        let mut out = String::new();
        for piece in &self.0 {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Field(Field::Question) => out.push_str(&question(task)),
                Piece::Field(Field::Conversation) => {
                    let lines: Vec<String> =
                        task.messages.iter().map(|m| format!("{}: {}", m.role, m.content)).collect();
                    out.push_str(&lines.join("\n\n"));
                }
                Piece::Field(Field::Answer) => match &task.answer {
                    Some(answer) => out.push_str(answer),
                    None => {
                        return Err(format!(
                            "the template shows {{answer}} but task `{}` has no reference answer",
                            task.id
                        ));
                    }
                },
                Piece::Field(Field::Completion) => out.push_str(&judged[0]),
                Piece::Field(Field::Completions) => {
                    let numbered: Vec<String> =
                        judged.iter().enumerate().map(|(i, c)| format!("[{}]\n{c}", i + 1)).collect();
                    out.push_str(&numbered.join("\n\n"));
                }
                Piece::Field(Field::Count) => out.push_str(&judged.len().to_string()),
            }
        }
        Ok(out)
    }
}

/// The task's last user message (its question), or its last message of any role.
fn question(task: &Task) -> String {
    task.messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .or(task.messages.last())
        .map_or_else(String::new, |m| m.content.clone())
}

/// How a verdict's text becomes a reward.
struct Verdicts {
    pattern: Regex,
    /// Words to values (lower case): `{ yes = 1, no = 0 }`; empty: the verdict is a number.
    labels: BTreeMap<String, f32>,
    /// A number's range, mapped onto 0..1; a verdict outside it is not one.
    range: Option<(f32, f32)>,
}

impl Verdicts {
    /// The value of a verdict's text and the reward it gives.
    fn value(&self, text: &str) -> Result<(f32, f32), String> {
        let text = text.trim();
        let value = if self.labels.is_empty() {
            text.parse::<f32>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| format!("the verdict `{}` is not a number", shown(text)))?
        } else {
            *self.labels.get(&text.to_lowercase()).ok_or_else(|| {
                let known: Vec<&str> = self.labels.keys().map(String::as_str).collect();
                format!("the verdict `{}` is none of the labels {known:?}", shown(text))
            })?
        };
        match self.range {
            Some((low, high)) if !(low..=high).contains(&value) => {
                Err(format!("the verdict {value} is outside the range [{low}, {high}]"))
            }
            Some((low, high)) => Ok((value, (value - low) / (high - low))),
            None => Ok((value, value)),
        }
    }
}

/// How a verdict is read from the model.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Read {
    /// Sample a reply and read the verdict in it by the rule.
    Reply,
    /// Ask how likely each label is as the whole reply.
    Probability,
}

struct Settings {
    mode: Mode,
    read: Read,
    /// The labels as the config spells them (their case kept: the text the model is asked
    /// the probability of), with their values.
    label_texts: Vec<(String, f32)>,
    system: Option<String>,
    template: Template,
    verdicts: Verdicts,
    sampling: Sampling,
}

impl Settings {
    fn read(task: &Task) -> Result<Settings, String> {
        let mode = match config::get_or("mode", "each".to_string())?.as_str() {
            "each" => Mode::Each,
            "group" => Mode::Group,
            other => return Err(format!("config key `mode`: \"{other}\" is not a mode; use \"each\" or \"group\"")),
        };
        let read = match config::get_or("read", "reply".to_string())?.as_str() {
            "reply" => Read::Reply,
            "probability" if mode == Mode::Each => Read::Probability,
            "probability" => {
                return Err("config key `read`: \"probability\" judges one completion at a time (mode \"each\")".into());
            }
            other => {
                return Err(format!(
                    "config key `read`: \"{other}\" is not a way to read; use \"reply\" or \"probability\""
                ));
            }
        };
        let raw_labels: BTreeMap<String, f32> = config::get_or("labels", BTreeMap::new())?;
        if let Some((word, value)) = raw_labels.iter().find(|(_, v)| !v.is_finite()) {
            return Err(format!("config key `labels`: `{word}` = {value} is not a finite number"));
        }
        let label_texts: Vec<(String, f32)> = raw_labels.iter().map(|(k, v)| (k.trim().to_string(), *v)).collect();
        if read == Read::Probability {
            if label_texts.len() < 2 {
                return Err("config key `labels`: read = \"probability\" needs at least two labels, such as \
                            { Yes = 1, No = 0 }"
                    .into());
            }
            if let Some((word, _)) = label_texts.iter().find(|(word, _)| word.is_empty()) {
                return Err(format!("config key `labels`: the label `{word}` is empty"));
            }
        }
        let has_answer = task.answer.is_some();
        let listed = label_texts.iter().map(|(word, _)| format!("\"{word}\"")).collect::<Vec<_>>().join(" or ");
        let default_template = match (mode, read, has_answer) {
            (Mode::Each, Read::Probability, false) => {
                LABEL.replace("{labels}", &listed.replace('{', "{{").replace('}', "}}"))
            }
            (Mode::Each, Read::Probability, true) => {
                LABEL_WITH_ANSWER.replace("{labels}", &listed.replace('{', "{{").replace('}', "}}"))
            }
            (Mode::Each, _, false) => EACH.to_string(),
            (Mode::Each, _, true) => EACH_WITH_ANSWER.to_string(),
            (Mode::Group, _, false) => GROUP.to_string(),
            (Mode::Group, _, true) => GROUP_WITH_ANSWER.to_string(),
        };
        let template_text: Option<String> = config::get("template")?;
        let template = Template::parse(template_text.as_deref().unwrap_or(&default_template), mode)?;
        let default_pattern = if mode == Mode::Each { EACH_PATTERN } else { GROUP_PATTERN };
        let pattern_text: Option<String> = config::get("pattern")?;
        let pattern = Regex::new(pattern_text.as_deref().unwrap_or(default_pattern))
            .map_err(|e| format!("config key `pattern`: not a regular expression: {e}"))?;
        let wanted_groups = if mode == Mode::Each { 1 } else { 2 };
        if pattern.captures_len() - 1 < wanted_groups {
            return Err(if mode == Mode::Each {
                "config key `pattern`: it needs a group, `( )`, around the verdict".to_string()
            } else {
                "config key `pattern`: mode \"group\" needs two groups, the response's number and its verdict"
                    .to_string()
            });
        }
        let labels = raw_labels.into_iter().map(|(k, v)| (k.trim().to_lowercase(), v)).collect::<BTreeMap<_, _>>();
        let range: Option<[f32; 2]> = config::get("range")?;
        let range = match range {
            Some([low, high]) if low.is_finite() && high.is_finite() && low < high => Some((low, high)),
            Some([low, high]) => {
                return Err(format!("config key `range`: [{low}, {high}] must be two finite numbers, low < high"));
            }
            // Numbers are 0 to 10 unless the config says; labels are their own values.
            None if labels.is_empty() => Some((0.0, 10.0)),
            None => None,
        };
        let max_tokens: u32 = config::get_or("max_tokens", if mode == Mode::Each { 512 } else { 1024 })?;
        if max_tokens == 0 {
            return Err("config key `max_tokens`: it must be at least 1".into());
        }
        let temperature: f32 = config::get_or("temperature", 0.0)?;
        if !(0.0..=100.0).contains(&temperature) {
            return Err(format!("config key `temperature` = {temperature}: it must be from 0 to 100"));
        }
        let sampling = Sampling {
            max_tokens,
            temperature,
            top_p: 1.0,
            top_k: 0,
            min_p: 0.0,
            stop: config::get_or("stop", Vec::new())?,
            seed: None,
        };
        Ok(Settings {
            mode,
            read,
            label_texts,
            system: config::get("system")?,
            template,
            verdicts: Verdicts { pattern, labels, range },
            sampling,
        })
    }

    fn conversation(&self, prompt: String) -> Vec<Message> {
        let mut messages: Vec<Message> = self.system.iter().map(|s| Message::system(s.clone())).collect();
        messages.push(Message::user(prompt));
        messages
    }
}

/// At most [`SHOWN`] bytes of `text`, cut at a character.
fn shown(text: &str) -> String {
    if text.len() <= SHOWN {
        return text.to_string();
    }
    let mut end = SHOWN;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// Why a reply gave no verdict: the rule, whether the reply was cut, and what it said.
fn unreadable(why: &str, reply: &Completion, settings: &Settings) -> String {
    let cut = if reply.finish_reason == FinishReason::Length {
        format!(
            " (the reply was cut at max_tokens = {}: raise it, or ask for a shorter reply)",
            settings.sampling.max_tokens
        )
    } else {
        String::new()
    };
    format!("{why}{cut}; the judge said: {}", shown(&reply.text))
}

/// One completion's verdict from its own reply: the rule's last match.
fn judged_alone(reply: &Completion, settings: &Settings) -> Result<Score, String> {
    let verdicts = &settings.verdicts;
    let Some(found) = verdicts.pattern.captures_iter(&reply.text).last() else {
        return Err(unreadable(
            &format!("the judge's reply has no verdict matching `{}`", verdicts.pattern.as_str()),
            reply,
            settings,
        ));
    };
    let text = found.get(1).map_or("", |m| m.as_str());
    let (value, reward) = verdicts.value(text).map_err(|why| unreadable(&why, reply, settings))?;
    Ok(Score::new(reward).part("judge", value).note(shown(&reply.text)))
}

/// Each completion's verdict from the group's one reply: per response number, the last.
fn judged_together(reply: &Completion, count: usize, settings: &Settings) -> Vec<Result<Score, String>> {
    let verdicts = &settings.verdicts;
    let mut found: BTreeMap<usize, String> = BTreeMap::new();
    for captures in verdicts.pattern.captures_iter(&reply.text) {
        let index = captures.get(1).and_then(|m| m.as_str().trim().parse::<usize>().ok());
        if let (Some(index), Some(verdict)) = (index, captures.get(2)) {
            found.insert(index, verdict.as_str().to_string());
        }
    }
    (1..=count)
        .map(|i| {
            let Some(text) = found.get(&i) else {
                return Err(unreadable(
                    &format!(
                        "the judge's reply gives response [{i}] no verdict matching `{}`",
                        verdicts.pattern.as_str()
                    ),
                    reply,
                    settings,
                ));
            };
            let (value, reward) = verdicts.value(text).map_err(|why| unreadable(&why, reply, settings))?;
            Ok(Score::new(reward).part("judge", value).note(shown(&reply.text)))
        })
        .collect()
}

/// `read = "probability"`: each completion's verdict from the model's probability of each
/// label as its whole reply, in one `logprobs` call for the group. The reward is the labels'
/// values weighted by their probabilities among the labels (the `judge` part); the share of
/// the model's probability the labels hold is the `label_mass` part (near 0: the model meant
/// none of them — the template should ask for a label alone).
fn judged_by_probability(prompts: Vec<Vec<Message>>, settings: &Settings) -> Vec<Result<Score, String>> {
    let labels = &settings.label_texts;
    let asked: Vec<ReplyToScore> = prompts
        .iter()
        .flat_map(|conversation| {
            labels.iter().map(|(word, _)| ReplyToScore { conversation: conversation.clone(), reply: word.clone() })
        })
        .collect();
    let scored = match logprobs_all(&asked) {
        Ok(scored) if scored.len() == asked.len() => scored,
        Ok(scored) => {
            let error = format!("the model scored {} replies of {}", scored.len(), asked.len());
            return prompts.iter().map(|_| Err(error.clone())).collect();
        }
        Err(error) => return prompts.iter().map(|_| Err(error.clone())).collect(),
    };
    scored
        .chunks(labels.len())
        .map(|per_label| {
            // In f64, from the largest: the labels' probabilities may all be tiny.
            let logs: Vec<f64> = per_label.iter().map(|r| r.logprobs.iter().map(|&l| f64::from(l)).sum()).collect();
            let top = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            if !top.is_finite() {
                return Err("the model gives every label no probability".to_string());
            }
            let weights: Vec<f64> = logs.iter().map(|l| (l - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            let value: f64 = weights.iter().zip(labels).map(|(w, (_, v))| w / total * f64::from(*v)).sum();
            let mass = top.exp() * total;
            let note = labels
                .iter()
                .zip(&logs)
                .map(|((word, _), l)| format!("P({word}) = {:.4}", l.exp()))
                .collect::<Vec<_>>()
                .join(", ");
            Ok(Score::new(value as f32).part("judge", value as f32).part("label_mass", mass as f32).note(note))
        })
        .collect()
}

impl Reward for Judge {
    fn score_group(task: Task, completions: Vec<String>, _progress: Progress) -> Vec<Result<Score, String>> {
        let fail = |error: String| completions.iter().map(|_| Err(error.clone())).collect();
        let settings = match Settings::read(&task) {
            Ok(settings) => settings,
            Err(error) => return fail(error),
        };
        match settings.mode {
            Mode::Each => {
                let prompts: Result<Vec<Vec<Message>>, String> = completions
                    .iter()
                    .map(|c| settings.template.render(&task, std::slice::from_ref(c)).map(|p| settings.conversation(p)))
                    .collect();
                if settings.read == Read::Probability {
                    return match prompts {
                        Ok(prompts) => judged_by_probability(prompts, &settings),
                        Err(error) => fail(error),
                    };
                }
                let replies = match prompts.and_then(|p| generate_all(&p, &settings.sampling)) {
                    Ok(replies) if replies.len() == completions.len() => replies,
                    Ok(replies) => {
                        return fail(format!(
                            "the model gave {} replies for {} prompts",
                            replies.len(),
                            completions.len()
                        ));
                    }
                    Err(error) => return fail(error),
                };
                replies.iter().map(|reply| judged_alone(reply, &settings)).collect()
            }
            Mode::Group => {
                let prompt = match settings.template.render(&task, &completions) {
                    Ok(prompt) => prompt,
                    Err(error) => return fail(error),
                };
                match generate(&[settings.conversation(prompt)], &settings.sampling) {
                    Ok(replies) if replies.len() == 1 => judged_together(&replies[0], completions.len(), &settings),
                    Ok(replies) => fail(format!("the model gave {} replies for one prompt", replies.len())),
                    Err(error) => fail(error),
                }
            }
        }
    }
}

wirl_sdk::register_reward_v0_2!(Judge);
