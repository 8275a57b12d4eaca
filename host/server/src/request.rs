//! OpenAI-style request bodies, read field by field into `ChatRequest` and `CompletionRequest`
//! so that every refusal names its field; `Fields` is the one reader of a body's fields, the
//! served tasks' (`tasks.rs`) included.
//! Fields a client commonly sends and wirl does not use (`user`, `presence_penalty` at 0, …)
//! are ignored; ones whose meaning wirl would silently change are refused.

use crate::ApiError;
use serde_json::{Map, Value};
use wirl_engine::Sampling;
use wirl_engine::sampling::rules;

/// The limits a request is held to (from `wirl serve`'s options).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Completions per request.
    pub max_n: usize,
    /// New tokens per completion.
    pub max_tokens: usize,
    /// Stop strings per request.
    pub max_stop: usize,
}

impl Default for Limits {
    fn default() -> Self {
        crate::ServeSettings::default().limits()
    }
}

/// What both endpoints share: sampling, `n`, streaming, log-probs.
#[derive(Debug)]
pub struct Common {
    pub model: Option<String>,
    pub n: usize,
    pub sampling: Sampling,
    pub stream: bool,
    pub include_usage: bool,
    pub logprobs: bool,
}

/// `POST /v1/chat/completions`, read: what both endpoints share, the conversation, and the
/// token ids its assistant messages carry (`prevent_retokenization`).
pub struct ChatRequest {
    pub common: Common,
    pub messages: Vec<Message>,
    pub spliced_ids: Option<Vec<Option<Vec<u32>>>>,
    /// Variables for the chat template (vLLM's `chat_template_kwargs`: `enable_thinking`).
    pub template_vars: wirl_engine::TemplateVars,
}

impl ChatRequest {
    /// Read field by field; the first refusal names its field.
    pub fn read(body: &[u8], limits: &Limits, vocab: usize) -> Result<Self, ApiError> {
        let body = object(body)?;
        let (logprobs, top) = chat_logprobs(&body)?;
        let mut common = common(&body, limits, logprobs)?;
        common.sampling.top_logprobs = top;
        let (messages, spliced_ids, template_vars) =
            (messages(&body)?, spliced_ids(&body, vocab)?, template_vars(&body)?);
        if spliced_ids.is_some() && !template_vars.is_empty() {
            return Err(ApiError::bad(
                Some("chat_template_kwargs"),
                "is not supported with prevent_retokenization (the spliced turns are checked against the template as \
                 the model's own)",
            ));
        }
        Ok(ChatRequest { common, messages, spliced_ids, template_vars })
    }
}

/// `POST /v1/completions`, read: what both endpoints share and the prompt.
pub struct CompletionRequest {
    pub common: Common,
    pub prompt: Prompt,
}

impl CompletionRequest {
    /// Read field by field; the first refusal names its field.
    pub fn read(body: &[u8], limits: &Limits, vocab: usize) -> Result<Self, ApiError> {
        let body = object(body)?;
        let (logprobs, top) = completion_logprobs(&body)?;
        if body.get("echo").and_then(Value::as_bool) == Some(true) {
            return Err(ApiError::bad(Some("echo"), "is not supported"));
        }
        let mut common = common(&body, limits, logprobs)?;
        common.sampling.top_logprobs = top;
        Ok(CompletionRequest { common, prompt: prompt(&body, vocab)? })
    }
}

/// The body as a JSON object.
pub fn object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::bad(None, "the body must be a JSON object")),
        Err(error) => Err(ApiError::bad(None, &format!("the body is not valid JSON: {error}"))),
    }
}

/// The fields of one JSON object in a request, read by key: the one reader of request
/// fields, for the OpenAI routes and the served tasks' alike. An error names the field as
/// the client wrote it (`generation_args.top_k` for a field of a nested object) and what it
/// must be; an absent field and `null` are both `None`.
pub struct Fields<'a> {
    map: &'a Map<String, Value>,
    /// The path of the object in the body (`generation_args`), or empty at the top.
    within: &'a str,
}

impl<'a> Fields<'a> {
    /// The body's own fields.
    pub fn of(map: &'a Map<String, Value>) -> Self {
        Fields { map, within: "" }
    }

    /// The fields of the object at `within` in the body.
    pub fn within(map: &'a Map<String, Value>, within: &'a str) -> Self {
        Fields { map, within }
    }

    /// `key` as the client wrote it.
    pub fn name(&self, key: &str) -> String {
        if self.within.is_empty() { key.to_string() } else { format!("{}.{key}", self.within) }
    }

    fn bad(&self, key: &str, what: &str) -> ApiError {
        ApiError::bad(Some(&self.name(key)), what)
    }

    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    /// A finite number.
    pub fn number(&self, key: &str) -> Result<Option<f64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                n.as_f64().filter(|x| x.is_finite()).map(Some).ok_or_else(|| self.bad(key, "must be a finite number"))
            }
            Some(_) => Err(self.bad(key, "must be a number")),
        }
    }

    /// An integer, written as one (`5`; OpenAI's fields).
    pub fn integer(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| self.bad(key, "must be an integer")),
            Some(_) => Err(self.bad(key, "must be an integer")),
        }
    }

    /// A whole number, written as an integer or not (`5` or `5.0`: Megatron's
    /// `generation_args` come from Python dicts of floats).
    pub fn whole(&self, key: &str) -> Result<Option<i64>, ApiError> {
        match self.number(key)? {
            Some(x) if x.fract() != 0.0 => Err(self.bad(key, "must be a whole number")),
            other => Ok(other.map(|x| x as i64)),
        }
    }

    /// A count or index from 0 to `max`; `default` when absent.
    pub fn unsigned(&self, key: &str, default: u64, max: u64) -> Result<u64, ApiError> {
        match self.get(key) {
            None => Ok(default),
            Some(value) => value
                .as_u64()
                .filter(|&v| v <= max)
                .ok_or_else(|| self.bad(key, &format!("must be an integer from 0 to {max}"))),
        }
    }

    /// `true` or `false`.
    pub fn boolean(&self, key: &str) -> Result<Option<bool>, ApiError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(_) => Err(self.bad(key, "must be true or false")),
        }
    }
}

/// `n`, sampling, `stream`, `stop`, `seed`, `max_tokens` / `max_completion_tokens`. `logprobs`
/// is read by each endpoint (a boolean in chat, a count in completions).
pub fn common(body: &Map<String, Value>, limits: &Limits, logprobs: bool) -> Result<Common, ApiError> {
    let model = match body.get("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(name)) => Some(name.clone()),
        Some(_) => return Err(ApiError::bad(Some("model"), "must be a string")),
    };
    let n = Fields::of(body).integer("n")?.unwrap_or(1);
    if n < 1 || n as usize > limits.max_n {
        return Err(ApiError::bad(Some("n"), &format!("must be from 1 to {} (this server's limit)", limits.max_n)));
    }
    let mut sampling = Sampling::default();
    let max_tokens = match (Fields::of(body).integer("max_completion_tokens")?, Fields::of(body).integer("max_tokens")?)
    {
        (Some(tokens), _) => Some(("max_completion_tokens", tokens)),
        (None, Some(tokens)) => Some(("max_tokens", tokens)),
        (None, None) => None,
    };
    // The ranges are the engine's (`wirl_engine::sampling::rules`), as for configs.
    sampling.max_tokens = match max_tokens {
        None => limits.max_tokens.min(256),
        Some((field, tokens)) => {
            rules::max_tokens(tokens, limits.max_tokens).map_err(|range| ApiError::bad(Some(field), &range.0))?
        }
    };
    if let Some(t) = Fields::of(body).number("temperature")? {
        sampling.temperature = rules::temperature(t).map_err(|range| ApiError::bad(Some("temperature"), range))?;
    }
    if let Some(p) = Fields::of(body).number("top_p")? {
        sampling.top_p = rules::top_p(p).map_err(|range| ApiError::bad(Some("top_p"), range))?;
    }
    if let Some(k) = Fields::of(body).integer("top_k")? {
        sampling.top_k = rules::top_k(k).map_err(|range| ApiError::bad(Some("top_k"), range))?;
    }
    if let Some(p) = Fields::of(body).number("min_p")? {
        sampling.min_p = rules::min_p(p).map_err(|range| ApiError::bad(Some("min_p"), range))?;
    }
    if let Some(seed) = Fields::of(body).integer("seed")? {
        sampling.seed = Some(seed as u64);
    }
    sampling.stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_string).ok_or_else(|| ApiError::bad(Some("stop"), "must be strings")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad(Some("stop"), "must be a string or an array of strings")),
    };
    if sampling.stop.len() > limits.max_stop || sampling.stop.iter().any(String::is_empty) {
        return Err(ApiError::bad(Some("stop"), &format!("at most {} non-empty strings", limits.max_stop)));
    }
    for field in ["presence_penalty", "frequency_penalty"] {
        if Fields::of(body).number(field)?.is_some_and(|x| x != 0.0) {
            return Err(ApiError::bad(Some(field), "is not supported (only 0)"));
        }
    }
    if body.get("logit_bias").is_some_and(|b| !b.is_null() && b.as_object().is_none_or(|m| !m.is_empty())) {
        return Err(ApiError::bad(Some("logit_bias"), "is not supported"));
    }
    let stream = Fields::of(body).boolean("stream")?.unwrap_or(false);
    let include_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(options)) => {
            Fields::within(options, "stream_options").boolean("include_usage")?.unwrap_or(false)
        }
        Some(_) => return Err(ApiError::bad(Some("stream_options"), "must be an object")),
    };
    Ok(Common { model, n: n as usize, sampling, stream, include_usage, logprobs })
}

/// The most alternatives per position a request may ask for (OpenAI's limit).
pub const MAX_TOP_LOGPROBS: i64 = 20;

/// Chat: `logprobs` (bool) and `top_logprobs` (0 to 20 most likely tokens per position,
/// with `logprobs: true`).
pub fn chat_logprobs(body: &Map<String, Value>) -> Result<(bool, usize), ApiError> {
    let wanted = Fields::of(body).boolean("logprobs")?.unwrap_or(false);
    let top = match Fields::of(body).integer("top_logprobs")? {
        None => 0,
        Some(k) if (0..=MAX_TOP_LOGPROBS).contains(&k) => k as usize,
        Some(_) => return Err(ApiError::bad(Some("top_logprobs"), &format!("must be from 0 to {MAX_TOP_LOGPROBS}"))),
    };
    if top > 0 && !wanted {
        return Err(ApiError::bad(Some("top_logprobs"), "needs `logprobs: true`"));
    }
    Ok((wanted, top))
}

/// Completions: `logprobs` is a count (0 to 20): the sampled token's log-prob, and that many
/// most likely tokens per position.
pub fn completion_logprobs(body: &Map<String, Value>) -> Result<(bool, usize), ApiError> {
    match Fields::of(body).integer("logprobs")? {
        None => Ok((false, 0)),
        Some(k) if (0..=MAX_TOP_LOGPROBS).contains(&k) => Ok((true, k as usize)),
        Some(_) => Err(ApiError::bad(Some("logprobs"), &format!("must be from 0 to {MAX_TOP_LOGPROBS}"))),
    }
}

/// A chat message: role and text (content as a string or as text parts).
pub struct Message {
    pub role: String,
    pub content: String,
}

/// `messages`.
pub fn messages(body: &Map<String, Value>) -> Result<Vec<Message>, ApiError> {
    let Some(Value::Array(items)) = body.get("messages") else {
        return Err(ApiError::bad(Some("messages"), "must be a non-empty array of {role, content}"));
    };
    if items.is_empty() {
        return Err(ApiError::bad(Some("messages"), "must not be empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = format!("messages[{i}]");
            let Value::Object(message) = item else {
                return Err(ApiError::bad(Some(&field), "must be an object {role, content}"));
            };
            let role = match message.get("role").and_then(Value::as_str) {
                Some(role @ ("system" | "developer" | "user" | "assistant" | "tool")) => role.to_string(),
                _ => {
                    return Err(ApiError::bad(
                        Some(&format!("{field}.role")),
                        "must be system, user, assistant or tool",
                    ));
                }
            };
            let content = match message.get("content") {
                Some(Value::String(text)) => text.clone(),
                None | Some(Value::Null) => {
                    return Err(ApiError::bad(
                        Some(&format!("{field}.content")),
                        "is missing or null: every message needs its text (a string or text parts; null content is \
                         for tool calls, which this server does not take)",
                    ));
                }
                Some(Value::Array(parts)) => parts
                    .iter()
                    .map(|part| {
                        match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                            (Some("text"), Some(text)) => Ok(text),
                            _ => Err(ApiError::bad(Some(&format!("{field}.content")), "only text parts are supported")),
                        }
                    })
                    .collect::<Result<Vec<_>, _>>()?
                    .concat(),
                Some(_) => {
                    return Err(ApiError::bad(Some(&format!("{field}.content")), "must be a string or text parts"));
                }
            };
            Ok(Message { role: if role == "developer" { "system".into() } else { role }, content })
        })
        .collect()
}

/// With `prevent_retokenization: true` (Megatron's and NeMo's flag), each assistant
/// message's own token ids (`generation_token_ids`, as its reply carried them), to be used as
/// they are instead of tokenizing its text again; `None` for the other messages.
/// `chat_template_kwargs`: an object of variables for the chat template, none of them one the
/// template gets from the server (`messages`, `add_generation_prompt`, the special tokens).
pub fn template_vars(body: &Map<String, Value>) -> Result<wirl_engine::TemplateVars, ApiError> {
    let vars: wirl_engine::TemplateVars = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => return Ok(Default::default()),
        Some(Value::Object(vars)) => vars.iter().map(|(name, value)| (name.clone(), value.clone())).collect(),
        Some(_) => return Err(ApiError::bad(Some("chat_template_kwargs"), "must be an object of template variables")),
    };
    wirl_engine::check_template_vars(&vars).map_err(|reason| ApiError::bad(Some("chat_template_kwargs"), &reason))?;
    Ok(vars)
}

pub fn spliced_ids(body: &Map<String, Value>, vocab: usize) -> Result<Option<Vec<Option<Vec<u32>>>>, ApiError> {
    if !Fields::of(body).boolean("prevent_retokenization")?.unwrap_or(false) {
        return Ok(None);
    }
    let items = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let ids = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let field = format!("messages[{i}].generation_token_ids");
            match (item.get("role").and_then(Value::as_str), item.get("generation_token_ids")) {
                (_, None | Some(Value::Null)) => Ok(None),
                (Some("assistant"), Some(Value::Array(ids))) if !ids.is_empty() => ids
                    .iter()
                    .map(|id| id.as_u64().filter(|&id| (id as usize) < vocab).map(|id| id as u32))
                    .collect::<Option<Vec<u32>>>()
                    .map(Some)
                    .ok_or_else(|| ApiError::bad(Some(&field), &format!("must be token ids below {vocab}"))),
                _ => Err(ApiError::bad(Some(&field), "must be an assistant message's non-empty token ids")),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    if ids.iter().all(Option::is_none) {
        return Err(ApiError::bad(
            Some("prevent_retokenization"),
            "needs an assistant message carrying its `generation_token_ids` (from the reply that produced it)",
        ));
    }
    Ok(Some(ids))
}

/// A completion's `prompt`: text, or token ids (exact tokens, no tokenizing).
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

pub fn prompt(body: &Map<String, Value>, vocab: usize) -> Result<Prompt, ApiError> {
    match body.get("prompt") {
        Some(Value::String(text)) if !text.is_empty() => Ok(Prompt::Text(text.clone())),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            Ok(Prompt::Text(items[0].as_str().unwrap_or_default().to_string()))
        }
        Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_number) => items
            .iter()
            .map(|id| {
                id.as_u64()
                    .filter(|&id| (id as usize) < vocab)
                    .map(|id| id as u32)
                    .ok_or_else(|| ApiError::bad(Some("prompt"), &format!("token ids must be integers below {vocab}")))
            })
            .collect::<Result<_, _>>()
            .map(Prompt::Tokens),
        _ => Err(ApiError::bad(
            Some("prompt"),
            "must be a non-empty string or an array of token ids (one prompt per request)",
        )),
    }
}
