//! The model a `wirl:rl@0.2.0` reward (an LLM judge) asks when the package scores: the
//! package has no engine, so its `inference.generate` goes to an OpenAI-compatible server
//! (`wirl serve`, vLLM, SGLang, any `/v1/chat/completions`) named when the reward is made.
//! Each scoring call has its own budget, as in `wirl train`: at most `calls` generate calls
//! and `tokens` generated tokens, each conversation asking at most its share of what is left.

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use wirl_sandbox::{Completion, FinishReason, InferenceHost, Message, Sampling};

/// The most bytes of a server's answer read (a chat completion's JSON).
const MAX_ANSWER_BYTES: u64 = 16 << 20;

/// Where a reward's judge calls go, and what one scoring call may ask.
pub(crate) struct OpenAiServer {
    /// `…/chat/completions`.
    endpoint: String,
    /// The model asked for; none: the server's first in `/models`, asked once.
    model: Mutex<Option<String>>,
    api_key: Option<String>,
    agent: ureq::Agent,
    pub calls: u64,
    pub tokens: u64,
}

impl OpenAiServer {
    /// A client of the server at `url` (its `/v1` base, or the endpoint itself); refused
    /// with the reason when the URL cannot be one.
    pub fn new(
        url: &str,
        model: Option<String>,
        api_key: Option<String>,
        timeout: Duration,
        calls: u64,
        tokens: u64,
    ) -> Result<Self, String> {
        let url = url.trim().trim_end_matches('/');
        if url.starts_with("https://") {
            return Err(format!(
                "inference_url {url}: https is not supported by this build; use an http:// server \
                 (`wirl serve`, vLLM or SGLang on this machine or behind a local proxy)"
            ));
        }
        if !url.starts_with("http://") || url.len() <= "http://".len() {
            return Err(format!("inference_url {url:?}: not an http:// URL of an OpenAI-compatible server"));
        }
        let endpoint =
            if url.ends_with("/chat/completions") { url.to_string() } else { format!("{url}/chat/completions") };
        let agent: ureq::Agent =
            ureq::Agent::config_builder().timeout_global(Some(timeout)).http_status_as_error(false).build().into();
        Ok(OpenAiServer { endpoint, model: Mutex::new(model), api_key, agent, calls, tokens })
    }

    /// The model to ask: the one named, else the first the server lists at `/models`.
    fn model(&self) -> Result<String, String> {
        let mut model = self.model.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(name) = &*model {
            return Ok(name.clone());
        }
        let listing = format!("{}/models", self.endpoint.trim_end_matches("/chat/completions"));
        let mut request = self.agent.get(&listing);
        if let Some(key) = &self.api_key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        let asked = request
            .call()
            .map_err(|e| format!("GET {listing}: {e}"))?
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_string();
        let answer: serde_json::Value =
            asked.ok().and_then(|text| serde_json::from_str(&text).ok()).unwrap_or_default();
        let first = answer["data"][0]["id"]
            .as_str()
            .ok_or_else(|| format!("GET {listing}: the server lists no model; name one with inference_model"))?;
        *model = Some(first.to_string());
        Ok(first.to_string())
    }

    /// One chat completion of `messages`: its text, why it ended and the tokens it took.
    fn complete(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        max_tokens: u64,
    ) -> Result<(String, FinishReason, u64), String> {
        let mut body = serde_json::json!({
            "model": self.model()?,
            "messages": messages.iter().map(|m| serde_json::json!({"role": m.role, "content": m.content})).collect::<Vec<_>>(),
            "max_tokens": max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        });
        // Not in OpenAI's API, but in vLLM's, SGLang's and wirl's: sent only when set.
        if sampling.top_k > 0 {
            body["top_k"] = sampling.top_k.into();
        }
        if sampling.min_p > 0.0 {
            body["min_p"] = sampling.min_p.into();
        }
        if !sampling.stop.is_empty() {
            body["stop"] = sampling.stop.clone().into();
        }
        if let Some(seed) = sampling.seed {
            body["seed"] = seed.into();
        }
        let mut request = self.agent.post(&self.endpoint).header("content-type", "application/json");
        if let Some(key) = &self.api_key {
            request = request.header("authorization", format!("Bearer {key}"));
        }
        let at = &self.endpoint;
        let mut response = request.send(body.to_string().as_bytes()).map_err(|e| format!("POST {at}: {e}"))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER_BYTES)
            .read_to_string()
            .map_err(|e| format!("POST {at}: reading the answer: {e}"))?;
        let answer: serde_json::Value = serde_json::from_str(&text).map_err(|_| {
            format!("POST {at}: {status}: the answer is not JSON: {}", text.chars().take(300).collect::<String>())
        })?;
        if !(200..300).contains(&status) {
            let why = answer.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or("(no message)");
            return Err(format!("POST {at}: {status}: {why}"));
        }
        let choice = &answer["choices"][0];
        let content = choice["message"]["content"]
            .as_str()
            .ok_or_else(|| format!("POST {at}: the answer has no choices[0].message.content"))?;
        let finish = match choice["finish_reason"].as_str() {
            Some("length") => FinishReason::Length,
            _ => FinishReason::Stop,
        };
        // A server that does not say what it generated is charged the most it may have.
        let generated = answer["usage"]["completion_tokens"].as_u64().unwrap_or(max_tokens);
        Ok((content.to_string(), finish, generated))
    }
}

/// One scoring call's way to the server, with what is left of its budget.
pub(crate) struct OpenAiInference {
    server: Arc<OpenAiServer>,
    /// Calls made and tokens generated so far in this scoring call.
    spent: Mutex<(u64, u64)>,
}

impl OpenAiInference {
    pub fn new(server: Arc<OpenAiServer>) -> Self {
        OpenAiInference { server, spent: Mutex::new((0, 0)) }
    }

    fn generate_now(&self, conversations: Vec<Vec<Message>>, sampling: Sampling) -> Result<Vec<Completion>, String> {
        let server = &self.server;
        if conversations.is_empty() {
            return Ok(Vec::new());
        }
        let per_conversation = {
            let mut spent = self.spent.lock().unwrap_or_else(|e| e.into_inner());
            if spent.0 >= server.calls {
                return Err(format!(
                    "this reward may call the model {} times per scoring call (inference_calls); raise it",
                    server.calls
                ));
            }
            let left = server.tokens.saturating_sub(spent.1);
            let share = left / conversations.len() as u64;
            if share == 0 {
                return Err(format!(
                    "this scoring call's token budget (inference_tokens = {}) has {left} tokens left for {} \
                     conversations; raise inference_tokens",
                    server.tokens,
                    conversations.len()
                ));
            }
            spent.0 += 1;
            share.min(u64::from(sampling.max_tokens))
        };
        let mut out = Vec::with_capacity(conversations.len());
        for messages in &conversations {
            let (text, finish_reason, generated) = server.complete(messages, &sampling, per_conversation)?;
            self.spent.lock().unwrap_or_else(|e| e.into_inner()).1 += generated;
            out.push(Completion { text, finish_reason, generation: 0 });
        }
        Ok(out)
    }
}

impl InferenceHost for OpenAiInference {
    fn generate(
        &self,
        conversations: Vec<Vec<Message>>,
        sampling: Sampling,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Vec<Completion>, String>> + Send + '_>> {
        // Blocking HTTP, bounded by the client's timeout per request: the package's scoring
        // threads are its own, not an async runtime's.
        Box::pin(std::future::ready(self.generate_now(conversations, sampling)))
    }
}
