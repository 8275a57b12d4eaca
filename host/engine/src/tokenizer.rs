//! Tokenizer and chat template: from `tokenizer.json` + `tokenizer_config.json`, or built
//! from a GGUF file's metadata.

use crate::{Error, Result};
use serde::Serialize;
use std::collections::HashMap;

/// A chat message to render with the model's template.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Token ids that end generation.
    eos_ids: Vec<u32>,
    /// The tokenizer.json document (kept to write an HF directory back out).
    json: String,
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
        Ok(Tokenizer { inner, chat_template, bos_token, eos_token, eos_ids, json })
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
        // Control (3) and user-defined (4) tokens are matched whole, before BPE.
        let added: Vec<serde_json::Value> = tokens
            .iter()
            .zip(&types)
            .enumerate()
            .filter(|(_, (_, kind))| matches!(kind, 3 | 4))
            .map(|(id, (content, kind))| {
                serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": *kind == 3})
            })
            .collect();
        let vocab: serde_json::Map<String, serde_json::Value> =
            tokens.iter().enumerate().map(|(id, t)| (t.clone(), id.into())).collect();
        let document = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": added,
            "normalizer": null,
            "pre_tokenizer": pre_tokenizer,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
            "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                "vocab": vocab, "merges": merges},
        });
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

    /// Token ids of `text`, special tokens written in it included, nothing added around it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = self.inner.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
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
    /// `apply_chat_template(..., tokenize=False)` does.
    pub fn render_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| Error::Tokenizer("the model has no chat template; use a plain prompt".into()))?;
        let mut env = minijinja::Environment::new();
        env.set_trim_blocks(false);
        env.add_function("raise_exception", |message: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
        });
        env.add_template("chat", template).map_err(|e| Error::Tokenizer(format!("chat template: {e}")))?;
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        env.get_template("chat")
            .and_then(|t| t.render(context))
            .map_err(|e| Error::Tokenizer(format!("rendering the chat template: {e}")))
    }
}

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
