//! `wirl serve`'s settings: one type, each default here with its reason. A config's
//! `[serve]` table is this type (unknown keys refused); the command line's flags, where given,
//! replace its values; the server's own parts (`ServeConfig`, `Limits`, `TaskLimits`,
//! `ConnectionLimits`) take their defaults from [`ServeSettings::default`].

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServeSettings {
    /// The address to listen on. Loopback: serving beyond this machine needs an API key.
    pub host: String,
    /// The port (0: any free one, printed). 8000, as the OpenAI-compatible servers the
    /// peers sample with (vLLM, SGLang's examples) listen on.
    pub port: u16,
    /// The model's name in /v1/models and responses (default: the file's or directory's).
    pub name: Option<String>,
    /// Run a GGUF model's quantized weights.
    pub quantized: bool,
    /// A LoRA adapter directory (PEFT's format) merged into the model's weights as it loads
    /// (weights loaded later through /v1/load_weights come as their directory holds them).
    pub adapter: Option<PathBuf>,
    /// The weights' dtype, `f32` or `bf16` (default: as the model loads, f32).
    pub dtype: Option<String>,
    /// `cpu`, `cuda` or `cuda:N` (default: cpu).
    pub device: Option<String>,
    /// Tensor-parallel ranks (1: one model).
    pub tp: u16,
    /// Completions per request (`n`): 16 covers a GRPO group; more would let one request hold
    /// the engine's rows.
    pub max_n: usize,
    /// New tokens per completion: 4096 covers reasoning traces of the models served here;
    /// the key/value budget bounds what requests in flight hold together.
    pub max_tokens: usize,
    /// Stop strings per request (OpenAI allows 4).
    pub max_stop: usize,
    /// Requests generating at once; more are answered 503 with Retry-After. 64: what the
    /// engine's lanes batch well on one machine.
    pub max_concurrent: usize,
    /// Seconds a request may take; then 504 and its generation cancelled.
    pub timeout_s: u64,
    /// Prompts longer than this many tokens are prefilled in slices between other requests'
    /// decode steps, so that a long prompt does not hold every client.
    pub prefill_chunk: usize,
    /// Connections open at once; more are closed when accepted (file descriptors are finite).
    pub max_connections: usize,
    /// Seconds a request's headers may take (and an idle connection may wait); its body gets
    /// three times as long, then 408: half-sent requests do not hold a connection.
    pub header_timeout_s: u64,
    /// MiB of key/value cache the requests in flight may come to hold (each counted at its
    /// prompt plus max_tokens); beyond it 503, and a request that alone needs more, 400.
    pub kv_budget_mib: usize,
    /// MiB of keys and values kept for later requests that start the same way; 0 keeps none.
    pub prefix_cache_mib: u64,
    /// The largest request body: 1 MiB holds long conversations, and stops a flood.
    pub max_body_bytes: usize,
    /// Episodes open at once (/v1/episodes); more are answered 503.
    pub max_episodes: usize,
    /// Seconds an episode may sit idle before it is closed.
    pub episode_idle_s: u64,
    /// Groups (or rollouts, prompts) per task request, tasks per draw, groups per score.
    pub max_groups: usize,
    /// Completions per scored group; rollouts per group.
    pub max_group_size: usize,
    /// Where clients may load weights from (POST /v1/load_weights); off when none.
    pub weights_dir: Option<PathBuf>,
    /// The environment variable holding the API key (a key itself does not belong in a file).
    pub api_key_env: Option<String>,
}

impl Default for ServeSettings {
    fn default() -> Self {
        ServeSettings {
            host: "127.0.0.1".into(),
            port: 8000,
            name: None,
            quantized: false,
            adapter: None,
            dtype: None,
            device: None,
            tp: 1,
            max_n: 16,
            max_tokens: 4096,
            max_stop: 4,
            max_concurrent: 64,
            timeout_s: 300,
            prefill_chunk: 128,
            max_connections: 1024,
            header_timeout_s: 10,
            kv_budget_mib: 2048,
            prefix_cache_mib: 256,
            max_body_bytes: 1 << 20,
            max_episodes: 256,
            episode_idle_s: 600,
            max_groups: 256,
            max_group_size: 64,
            weights_dir: None,
            api_key_env: None,
        }
    }
}

/// The most `prefix_cache_mib` may be (1 TiB): a larger number is a typo, not a budget.
const MAX_PREFIX_CACHE_MIB: u64 = 1 << 20;

/// A `wirl serve` setting out of its range; the message names it as its flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidSetting(pub String);

impl ServeSettings {
    /// Every value in range; the error names the key (`--key` on the command line).
    pub fn check(&self) -> Result<(), InvalidSetting> {
        let counts = [
            ("max_n", self.max_n),
            ("max_tokens", self.max_tokens),
            ("max_stop", self.max_stop),
            ("max_concurrent", self.max_concurrent),
            ("prefill_chunk", self.prefill_chunk),
            ("max_connections", self.max_connections),
            ("kv_budget_mib", self.kv_budget_mib),
            ("max_body_bytes", self.max_body_bytes),
            ("max_episodes", self.max_episodes),
            ("max_groups", self.max_groups),
            ("max_group_size", self.max_group_size),
            ("tp", usize::from(self.tp)),
        ];
        for (key, value) in counts {
            if value == 0 {
                return Err(InvalidSetting(format!("{} must be at least 1", flag(key))));
            }
        }
        for (key, seconds) in [
            ("timeout_s", self.timeout_s),
            ("header_timeout_s", self.header_timeout_s),
            ("episode_idle_s", self.episode_idle_s),
        ] {
            if seconds == 0 {
                return Err(InvalidSetting(format!("{} must be at least 1 second", flag(key))));
            }
        }
        if self.prefix_cache_mib > MAX_PREFIX_CACHE_MIB {
            return Err(InvalidSetting(format!(
                "{} {}: at most {MAX_PREFIX_CACHE_MIB} (1 TiB); 0 keeps none",
                flag("prefix_cache_mib"),
                self.prefix_cache_mib
            )));
        }
        if let Some(dtype) = &self.dtype
            && !["f32", "bf16"].contains(&dtype.as_str())
        {
            return Err(InvalidSetting(format!("{} {dtype:?}: expected \"f32\" or \"bf16\"", flag("dtype"))));
        }
        Ok(())
    }

    /// What one request may ask for.
    pub fn limits(&self) -> crate::Limits {
        crate::Limits { max_n: self.max_n, max_tokens: self.max_tokens, max_stop: self.max_stop }
    }

    /// The task endpoints' limits.
    pub fn task_limits(&self) -> crate::TaskLimits {
        crate::TaskLimits {
            max_groups: self.max_groups,
            max_group_size: self.max_group_size,
            max_sessions: self.max_episodes,
            session_idle: Duration::from_secs(self.episode_idle_s),
        }
    }

    /// The accept loop's limits.
    pub fn connection_limits(&self) -> crate::ConnectionLimits {
        crate::ConnectionLimits {
            max_connections: self.max_connections,
            header_timeout: Duration::from_secs(self.header_timeout_s),
            drain: crate::DRAIN,
        }
    }

    /// The router's configuration, with what the settings cannot hold: the model's name as
    /// served, the API key, the weights directory as resolved, the model's load options.
    pub fn serve_config(
        &self,
        model_name: String,
        api_key: Option<String>,
        weights_dir: Option<PathBuf>,
        load_options: wirl_engine::LoadOptions,
    ) -> crate::ServeConfig {
        crate::ServeConfig {
            model_name,
            api_key,
            limits: self.limits(),
            max_body_bytes: self.max_body_bytes,
            max_concurrent: self.max_concurrent,
            request_timeout: Duration::from_secs(self.timeout_s),
            body_timeout: Duration::from_secs(3 * self.header_timeout_s),
            task_limits: self.task_limits(),
            weights_dir,
            load_options,
            code: None,
        }
    }
}

/// A key as its flag: `max_n` → `--max-n`.
fn flag(key: &str) -> String {
    format!("--{}", key.replace('_', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_table_fills_what_it_leaves_from_the_defaults_and_refuses_unknown_keys() {
        let settings: ServeSettings = toml::from_str("max_n = 2\nname = \"m\"").unwrap();
        assert_eq!((settings.max_n, settings.name.as_deref(), settings.max_tokens), (2, Some("m"), 4096));
        assert!(toml::from_str::<ServeSettings>("max_m = 2").unwrap_err().to_string().contains("max_m"));
        let zero = ServeSettings { max_episodes: 0, ..Default::default() };
        assert_eq!(zero.check().unwrap_err().0, "--max-episodes must be at least 1");
        let big = ServeSettings { prefix_cache_mib: 1 << 30, ..Default::default() };
        assert!(big.check().unwrap_err().0.contains("--prefix-cache-mib"));
        assert!(ServeSettings::default().check().is_ok());
    }
}
