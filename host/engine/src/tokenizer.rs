//! Tokenizer and chat template: from `tokenizer.json` + `tokenizer_config.json`, or built
//! from a GGUF file's metadata.

use crate::{Error, Result};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A chat message to render with the model's template.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same tokenizer reading special-token strings as plain text: for message content,
    /// which must never become control tokens (see [`Tokenizer::escape`]).
    plain: tokenizers::Tokenizer,
    /// What [`Tokenizer::escape`] replaces in message content: every special token's text
    /// (longest first), then the escape's own opening character.
    escapable: Vec<String>,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Token ids that end generation.
    eos_ids: Vec<u32>,
    /// The tokenizer.json document (kept to write an HF directory back out).
    json: String,
    /// Where the tokenizer (and its template) came from, for messages.
    origin: String,
    /// Why the chat template is refused from now on, once a render of it passed a limit
    /// (its thread may still be running or stopped; it is not run again).
    template_refused: Arc<Mutex<Option<String>>>,
    /// Variables every render of the chat template sees beside the messages, as
    /// transformers' `apply_chat_template(..., **kwargs)` passes them (TRL's and vLLM's
    /// `chat_template_kwargs`): `enable_thinking = false` turns Qwen3's reasoning off.
    template_vars: TemplateVars,
}

/// Chat template variables by name (JSON values: strings, numbers, booleans, lists, tables).
pub type TemplateVars = std::collections::BTreeMap<String, serde_json::Value>;

/// What a template's own variables are called: not for a caller to set.
const RESERVED_TEMPLATE_VARS: [&str; 5] =
    ["messages", "add_generation_prompt", "bos_token", "eos_token", "raise_exception"];

/// `vars` as chat template variables: refused (naming it) a name the render itself sets.
pub fn check_template_vars(vars: &TemplateVars) -> std::result::Result<(), String> {
    match vars.keys().find(|name| RESERVED_TEMPLATE_VARS.contains(&name.as_str())) {
        Some(name) => Err(format!(
            "`{name}` is the template's own variable (it gets the conversation, the generation prompt and the special \
             tokens from wirl); choose other names"
        )),
        None => Ok(()),
    }
}

impl Tokenizer {
    /// From the text of `tokenizer.json`, with the chat template and special tokens of
    /// `tokenizer_config.json` (if any).
    pub fn from_json(json: String, config: Option<&serde_json::Value>, origin: &str) -> Result<Self> {
        let inner = json.parse::<tokenizers::Tokenizer>().map_err(|e| Error::Format {
            file: origin.to_string(),
            message: format!("not a valid tokenizer.json: {e}"),
        })?;
        let token_text = |key: &str| -> Option<String> {
            let value = config?.get(key)?;
            value.as_str().map(str::to_string).or_else(|| value.get("content")?.as_str().map(str::to_string))
        };
        let chat_template = config.and_then(|c| match c.get("chat_template")? {
            serde_json::Value::String(template) => Some(template.clone()),
            // A list of named templates: take the default one.
            serde_json::Value::Array(list) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string)),
            _ => None,
        });
        let bos_token = token_text("bos_token");
        let eos_token = token_text("eos_token");
        let eos_ids = eos_token.iter().filter_map(|t| inner.token_to_id(t)).collect();
        let mut plain = inner.clone();
        plain.set_encode_special_tokens(true);
        let mut escapable: Vec<String> = inner
            .get_added_tokens_decoder()
            .values()
            .filter(|token| token.special && !token.content.is_empty())
            .map(|token| token.content.clone())
            .collect();
        escapable.sort_by(|a, b| b.len().cmp(&a.len()).then(a.cmp(b)));
        escapable.dedup();
        escapable.push(ESCAPE_OPEN.to_string());
        Ok(Tokenizer {
            inner,
            plain,
            escapable,
            chat_template,
            bos_token,
            eos_token,
            eos_ids,
            json,
            origin: origin.to_string(),
            template_refused: Arc::new(Mutex::new(None)),
            template_vars: TemplateVars::new(),
        })
    }

    /// Set the variables every render of the chat template sees ([`check_template_vars`]).
    pub fn set_template_vars(&mut self, vars: TemplateVars) -> Result<()> {
        check_template_vars(&vars).map_err(Error::Tokenizer)?;
        self.template_vars = vars;
        Ok(())
    }

    pub fn template_vars(&self) -> &TemplateVars {
        &self.template_vars
    }

    /// Build a GPT-2-style byte-level BPE tokenizer from GGUF metadata
    /// (`tokenizer.ggml.*`), as llama.cpp does.
    pub fn from_gguf(
        metadata: &HashMap<String, candle_core::quantized::gguf_file::Value>,
        origin: &str,
    ) -> Result<Self> {
        let error = |message: String| Error::Format { file: origin.to_string(), message };
        let get = |key: &str| metadata.get(key).ok_or_else(|| error(format!("missing metadata key `{key}`")));
        let model = get("tokenizer.ggml.model")?.to_string().map_err(|e| error(e.to_string()))?;
        if model != "gpt2" {
            return Err(error(format!("tokenizer.ggml.model {model:?} is not supported (gpt2 byte-level BPE is)")));
        }
        let strings = |key: &str| -> Result<Vec<String>> {
            get(key)?
                .to_vec()
                .map_err(|e| error(format!("`{key}`: {e}")))?
                .iter()
                .map(|v| v.to_string().cloned().map_err(|e| error(format!("`{key}`: {e}"))))
                .collect()
        };
        let tokens = strings("tokenizer.ggml.tokens")?;
        let merges = strings("tokenizer.ggml.merges")?;
        let types: Vec<i32> = match metadata.get("tokenizer.ggml.token_type") {
            Some(value) => value
                .to_vec()
                .map_err(|e| error(e.to_string()))?
                .iter()
                .map(|v| v.to_i32().map_err(|e| error(e.to_string())))
                .collect::<Result<_>>()?,
            None => vec![1; tokens.len()],
        };
        // A shorter list would leave the last tokens' kinds unsaid: chat markers read as
        // plain text, the prompt tokenized differently, without a word.
        if types.len() != tokens.len() {
            return Err(error(format!(
                "tokenizer.ggml.token_type has {} entries for {} tokens (tokenizer.ggml.tokens): one per token",
                types.len(),
                tokens.len()
            )));
        }
        let pre = metadata.get("tokenizer.ggml.pre").and_then(|v| v.to_string().ok()).map_or("default", |s| s.as_str());
        let byte_level = serde_json::json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
        let pre_tokenizer = match pre {
            // SmolLM's tokenizer splits digits one by one before the byte-level split.
            "smollm" => serde_json::json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level]}),
            "default" | "gpt2" => byte_level,
            other => {
                return Err(error(format!(
                    "tokenizer.ggml.pre {other:?} is not supported yet (smollm and gpt2 are); load the model's HF directory instead"
                )));
            }
        };
        let document = bpe_document(&tokens, &types, merges, pre_tokenizer);
        let token_at = |key: &str| -> Option<String> {
            let id = metadata.get(key)?.to_u32().ok()? as usize;
            tokens.get(id).cloned()
        };
        let mut config = serde_json::Map::new();
        if let Some(template) = metadata.get("tokenizer.chat_template").and_then(|v| v.to_string().ok()) {
            config.insert("chat_template".into(), template.clone().into());
        }
        if let Some(bos) = token_at("tokenizer.ggml.bos_token_id") {
            config.insert("bos_token".into(), bos.into());
        }
        if let Some(eos) = token_at("tokenizer.ggml.eos_token_id") {
            config.insert("eos_token".into(), eos.into());
        }
        Self::from_json(document.to_string(), Some(&serde_json::Value::Object(config)), origin)
    }

    /// Token ids of `text`, special tokens written in it included, nothing added around it;
    /// what [`escape`](Self::escape) marked is plain text (its special-token strings are
    /// tokenized as the characters they are).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encode = |tokenizer: &tokenizers::Tokenizer, text: &str| -> Result<Vec<u32>> {
            // The tokenizer's split patterns come with the model: one that backtracks without
            // end panics in the regex engine, which becomes this text's error.
            crate::contained("tokenizing (the tokenizer's split pattern)", || {
                let encoding = tokenizer.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
                Ok(encoding.get_ids().to_vec())
            })
        };
        if !text.contains(ESCAPE_OPEN) {
            return encode(&self.inner, text);
        }
        let mut ids = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(ESCAPE_OPEN) {
            let after = &rest[at + ESCAPE_OPEN.len_utf8()..];
            let escaped = after.split_once(ESCAPE_CLOSE).and_then(|(index, tail)| {
                let index: usize = index.parse().ok().filter(|_| index.len() <= 4)?;
                Some((self.escapable.get(index)?, tail))
            });
            let Some((escaped, tail)) = escaped else {
                // Not an escape: the character as it is, then on.
                let (head, tail) = rest.split_at(at + ESCAPE_OPEN.len_utf8());
                ids.extend(encode(&self.inner, head)?);
                rest = tail;
                continue;
            };
            if at > 0 {
                ids.extend(encode(&self.inner, &rest[..at])?);
            }
            ids.extend(encode(&self.plain, escaped)?);
            rest = tail;
        }
        if !rest.is_empty() {
            ids.extend(encode(&self.inner, rest)?);
        }
        Ok(ids)
    }

    /// `content` with every special token's text (`<|im_end|>`, `<|im_start|>`, …) marked as
    /// plain text for [`encode`](Self::encode): message content from environments, agents,
    /// datasets and HTTP clients is text, and must not end the turn or open another one in
    /// the model's context. Content without such strings is returned unchanged (and encodes
    /// exactly as before).
    pub fn escape(&self, content: &str) -> String {
        if !self.escapable.iter().any(|s| content.contains(s.as_str())) {
            return content.to_string();
        }
        let mut escaped = String::with_capacity(content.len() + 16);
        let mut rest = content;
        'outer: while !rest.is_empty() {
            for (index, special) in self.escapable.iter().enumerate() {
                if let Some(tail) = rest.strip_prefix(special.as_str()) {
                    escaped.push(ESCAPE_OPEN);
                    escaped.push_str(&index.to_string());
                    escaped.push(ESCAPE_CLOSE);
                    rest = tail;
                    continue 'outer;
                }
            }
            let next = rest.chars().next().map_or(1, char::len_utf8);
            escaped.push_str(&rest[..next]);
            rest = &rest[next..];
        }
        escaped
    }

    /// Text of `ids`, special tokens skipped when `skip_special`.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.inner.decode(ids, skip_special).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// How `other` reads token ids differently from this tokenizer (a teacher's against its
    /// student's): the first difference found, or `None` when every id is the same token.
    pub fn differs_from(&self, other: &Tokenizer) -> Option<String> {
        let (ours, theirs) = (self.inner.get_vocab(true), other.inner.get_vocab(true));
        if ours.len() != theirs.len() {
            return Some(format!("{} tokens against {}", theirs.len(), ours.len()));
        }
        let mut ours: Vec<(&String, &u32)> = ours.iter().collect();
        ours.sort_by_key(|(_, id)| **id);
        for (token, id) in ours {
            match theirs.get(token) {
                Some(their) if their == id => {}
                Some(their) => return Some(format!("token {token:?} is id {their} there and {id} here")),
                None => return Some(format!("token {token:?} (id {id} here) is not in it")),
            }
        }
        None
    }

    /// Ids that end generation: the tokenizer's EOS plus any given by the model config.
    pub fn eos_ids(&self) -> &[u32] {
        &self.eos_ids
    }

    pub fn add_eos_ids(&mut self, ids: impl IntoIterator<Item = u32>) {
        for id in ids {
            if !self.eos_ids.contains(&id) {
                self.eos_ids.push(id);
            }
        }
    }

    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    pub fn tokenizer_json(&self) -> &str {
        &self.json
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// Render `messages` with the model's chat template, as transformers'
    /// `apply_chat_template(..., tokenize=False)` does; special-token strings inside the
    /// messages' content are [escaped](Self::escape), so that [`encode`](Self::encode) keeps
    /// them plain text while the template's own markup stays special.
    ///
    /// The template is a program someone else wrote: it runs on a thread of its own under
    /// [`TemplateLimits`] (instructions, output, memory, time). A render that passes one is
    /// an error naming the model and the limit, and the template is refused from then on.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_chat_with(messages, add_generation_prompt, &TemplateVars::new())
    }

    /// [`render_chat`](Self::render_chat) with `vars` over the tokenizer's own template
    /// variables (a request's `chat_template_kwargs`; [`check_template_vars`]).
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        vars: &TemplateVars,
    ) -> Result<String> {
        self.render_chat_within(messages, add_generation_prompt, vars, &TemplateLimits::for_messages(messages))
    }

    /// [`render_chat_with`](Self::render_chat_with) under the given limits.
    pub fn render_chat_within(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        vars: &TemplateVars,
        limits: &TemplateLimits,
    ) -> Result<String> {
        check_template_vars(vars).map_err(Error::Tokenizer)?;
        let mut all_vars = self.template_vars.clone();
        all_vars.extend(vars.iter().map(|(name, value)| (name.clone(), value.clone())));
        let template = self
            .chat_template
            .clone()
            .ok_or_else(|| Error::Tokenizer("the model has no chat template; use a plain prompt".into()))?;
        if let Some(reason) = self.template_refused.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Err(Error::Tokenizer(format!("the chat template of {} is refused: {reason}", self.origin)));
        }
        let escaped: Vec<ChatMessage> =
            messages.iter().map(|m| ChatMessage { role: m.role.clone(), content: self.escape(&m.content) }).collect();
        let (bos, eos) = (self.bos_token.clone().unwrap_or_default(), self.eos_token.clone().unwrap_or_default());
        let budget = crate::memory_budget::Budget::new(limits.memory_bytes);
        let (send, receive) = std::sync::mpsc::sync_channel(1);
        let (thread_budget, thread_limits) = (budget.clone(), limits.clone());
        std::thread::Builder::new()
            .name("chat-template".into())
            .stack_size(16 << 20)
            .spawn(move || {
                let _budget = thread_budget.enter();
                let call =
                    Render { messages: escaped, add_generation_prompt, bos_token: bos, eos_token: eos, vars: all_vars };
                let rendered = render_template(&template, call, &thread_limits);
                let _ = send.send(rendered);
            })
            .map_err(|e| Error::Tokenizer(format!("cannot start the chat template's thread: {e}")))?;
        let started = std::time::Instant::now();
        let outcome = loop {
            match receive.recv_timeout(std::time::Duration::from_millis(10)) {
                Ok(rendered) => break rendered,
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                    break Err(TemplateFailure::Limit("its thread ended without an answer".into()));
                }
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            }
            if budget.exceeded() {
                break Err(TemplateFailure::Limit(format!(
                    "rendering took more than {} MiB of memory",
                    limits.memory_bytes >> 20
                )));
            }
            if started.elapsed() >= limits.time {
                break Err(TemplateFailure::Limit(format!("rendering took longer than {:?}", limits.time)));
            }
        };
        outcome.map_err(|failure| match failure {
            TemplateFailure::Limit(reason) => {
                *self.template_refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
                Error::Tokenizer(format!(
                    "the chat template of {}: {reason}; it is refused from now on (a chat template must render a \
                     conversation quickly; use a plain prompt, or fix the model's chat template)",
                    self.origin
                ))
            }
            TemplateFailure::Error(message) => Error::Tokenizer(format!("rendering the chat template: {message}")),
        })
    }
}

/// How far a chat template may go in one render.
#[derive(Clone, Debug)]
pub struct TemplateLimits {
    /// minijinja instructions (loops, calls, expressions).
    pub fuel: u64,
    /// Bytes of rendered text.
    pub output_bytes: usize,
    /// Bytes the rendering thread may hold at once (where the binary installs
    /// [`crate::memory_budget::BudgetAllocator`]).
    pub memory_bytes: usize,
    pub time: std::time::Duration,
}

impl TemplateLimits {
    /// Room for `messages`: real templates take some thousands of instructions and write
    /// their messages with some markup around them. The fixed parts bound a hostile
    /// template's loops (~0.1-0.5 s of fuel); the parts that grow with the messages let a
    /// long conversation through.
    pub fn for_messages(messages: &[ChatMessage]) -> Self {
        let bytes: usize = messages.iter().map(|m| m.content.len() + m.role.len()).sum();
        TemplateLimits {
            fuel: 20_000_000u64.saturating_add(1_000u64.saturating_mul(messages.len() as u64)),
            output_bytes: (1usize << 20).saturating_add(bytes.saturating_mul(4)),
            memory_bytes: (256usize << 20).saturating_add(bytes.saturating_mul(16)),
            time: std::time::Duration::from_secs(10),
        }
    }
}

/// Why a render failed: the template's own error, or a limit (after which it is refused).
enum TemplateFailure {
    Error(String),
    Limit(String),
}

/// What one render of a chat template is given.
struct Render {
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    bos_token: String,
    eos_token: String,
    vars: TemplateVars,
}

/// The render itself, on the template's own thread: minijinja with fuel, its output
/// written through a writer that stops at the limit.
fn render_template(
    template: &str,
    call: Render,
    limits: &TemplateLimits,
) -> std::result::Result<String, TemplateFailure> {
    let Render { messages, add_generation_prompt, bos_token, eos_token, vars } = call;
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(false);
    env.set_fuel(Some(limits.fuel));
    // Templates are written for Jinja under Python: `content.split('</think>')`,
    // `content.startswith('<tool_response>')` (Qwen3's) are Python's string methods.
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> std::result::Result<String, minijinja::Error> {
        Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
    });
    let template = generation_tags_as_blocks(template);
    env.add_template("chat", &template).map_err(|e| TemplateFailure::Error(format!("chat template: {e}")))?;
    let context = minijinja::context! {
        messages => messages,
        add_generation_prompt => add_generation_prompt,
        bos_token => bos_token,
        eos_token => eos_token,
        ..minijinja::Value::from_serialize(&vars)
    };
    let mut out = BoundedWriter { bytes: Vec::new(), limit: limits.output_bytes, full: false };
    let rendered = env.get_template("chat").and_then(|t| t.render_captured_to(context, &mut out).map(drop));
    if out.full {
        return Err(TemplateFailure::Limit(format!("it wrote more than {} bytes", limits.output_bytes)));
    }
    match rendered {
        Ok(_) => String::from_utf8(out.bytes).map_err(|e| TemplateFailure::Error(e.to_string())),
        Err(e) if e.kind() == minijinja::ErrorKind::OutOfFuel => {
            Err(TemplateFailure::Limit(format!("it ran more than {} instructions", limits.fuel)))
        }
        Err(e) => Err(TemplateFailure::Error(e.to_string())),
    }
}

/// `template` with transformers' `{% generation %}` … `{% endgeneration %}` (the tags TRL's
/// `assistant_only_loss` needs around the assistant's text; transformers renders their body
/// as it is) as `{% if true %}` … `{% endif %}`, whitespace control kept: minijinja knows no
/// such tag, and a model trained with TRL may carry it in its template.
fn generation_tags_as_blocks(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open]);
        let tag = &rest[open..];
        let Some(close) = tag.find("%}") else {
            break;
        };
        let inner = &tag[2..close];
        let (trim_left, inner) = inner.strip_prefix('-').map_or((false, inner), |i| (true, i));
        let (trim_right, inner) = inner.strip_suffix('-').map_or((false, inner), |i| (true, i));
        let replaced = match inner.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replaced {
            Some(statement) => {
                out.push_str(if trim_left { "{%- " } else { "{% " });
                out.push_str(statement);
                out.push_str(if trim_right { " -%}" } else { " %}" });
            }
            None => out.push_str(&tag[..close + 2]),
        }
        rest = &tag[close + 2..];
    }
    out.push_str(rest);
    out
}

/// Collects rendered text up to `limit` bytes; past it, every write fails.
struct BoundedWriter {
    bytes: Vec<u8>,
    limit: usize,
    full: bool,
}

impl std::io::Write for BoundedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len().saturating_add(buf.len()) > self.limit {
            self.full = true;
            return Err(std::io::Error::other("the chat template's output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Opens an escape in rendered text: a Unicode noncharacter, never meant for interchange.
const ESCAPE_OPEN: char = '\u{FDD0}';
/// Closes it, after the index of the escaped string.
const ESCAPE_CLOSE: char = '\u{FDD1}';

/// Turns a stream of token ids into text pieces that never split a UTF-8 character: a
/// piece is released once the decoded text grows by complete characters.
pub struct TextStream {
    ids: Vec<u32>,
    emitted: usize,
}

impl TextStream {
    pub fn new() -> Self {
        TextStream { ids: Vec::new(), emitted: 0 }
    }

    /// Add one token; return the new complete text, if any.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<Option<String>> {
        self.ids.push(id);
        let text = tokenizer.decode(&self.ids, true)?;
        // A partial character decodes to U+FFFD at the end: wait for the rest of it.
        if text.ends_with('\u{FFFD}') || text.len() <= self.emitted || !text.is_char_boundary(self.emitted) {
            return Ok(None);
        }
        let piece = text[self.emitted..].to_string();
        self.emitted = text.len();
        Ok(Some(piece))
    }
}

impl Default for TextStream {
    fn default() -> Self {
        Self::new()
    }
}

/// A `tokenizer.json` for llama.cpp's byte-level BPE: `tokens` (their kinds in `types`: control
/// (3) and user-defined (4) tokens are matched whole, before BPE), `merges`, the pre-tokenizer.
fn bpe_document(
    tokens: &[String],
    types: &[i32],
    merges: Vec<String>,
    pre_tokenizer: serde_json::Value,
) -> serde_json::Value {
    let added: Vec<serde_json::Value> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, kind))| matches!(kind, 3 | 4))
        .map(|(id, (content, kind))| {
            serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": *kind == 3})
        })
        .collect();
    let vocab: serde_json::Map<String, serde_json::Value> =
        tokens.iter().enumerate().map(|(id, t)| (t.clone(), id.into())).collect();
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges},
    })
}
