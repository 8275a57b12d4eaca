//! `wirl serve`'s settings: each declared once, with its default and the reason for it, and
//! its flag where it has one. A config's `[serve]` table is `ServeSettings` (unknown keys
//! refused); the command line's flags (`ServeFlags`, the `flags` feature) replace its values
//! where given; the server's own parts (`ServeConfig`, `Limits`, `TaskLimits`,
//! `ConnectionLimits`) take their defaults from [`ServeSettings::default`].

use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::Duration;

/// Declares every setting once — its doc, its type, its default, and the type of its flag
/// where `wirl serve` has one — and makes of it `ServeSettings` (with `Default`) and, with
/// the `flags` feature, `ServeFlags`: the command line's flags, each with its doc and the
/// default shown, laid over a `[serve]` table by [`ServeFlags::over`].
macro_rules! serve_settings {
    ($(
        $(#[doc = $doc:literal])+
        $name:ident: $ty:ty = $default:expr $(, flag: $flag:ty)?;
    )*) => {
        #[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
        #[serde(deny_unknown_fields, default)]
        pub struct ServeSettings {
            $($(#[doc = $doc])+ pub $name: $ty,)*
        }

        impl Default for ServeSettings {
            fn default() -> Self {
                ServeSettings { $($name: $default,)* }
            }
        }

        impl ServeSettings {
            /// A setting's doc, as declared.
            pub fn doc(key: &str) -> &'static str {
                match key {
                    $(stringify!($name) => concat!($($doc, "\n"),+),)*
                    _ => "",
                }
            }
        }

        /// `wirl serve`'s flags: the settings that have one, each `None` (or `false`) unless given.
        #[cfg(feature = "flags")]
        #[derive(clap::Args, Clone, Debug, Default)]
        pub struct ServeFlags {
            $($(
                #[arg(long, help = flags::help(ServeSettings::doc(stringify!($name)), &ServeSettings::default().$name))]
                pub $name: $flag,
            )?)*
        }

        #[cfg(feature = "flags")]
        impl ServeFlags {
            /// The flags given, as `[serve]` keys over `table` (a flag given wins).
            pub fn over(&self, table: &mut toml::Table) {
                $($(
                    let value: &$flag = &self.$name;
                    if let Some(value) = flags::Given::given(value) {
                        table.insert(stringify!($name).to_string(), value);
                    }
                )?)*
            }
        }
    };
}

serve_settings! {
    /// The address to listen on. Loopback: serving beyond this machine needs an API key.
    host: String = "127.0.0.1".into(), flag: Option<String>;
    /// The port (0: any free one, printed). 8000, as the OpenAI-compatible servers the
    /// peers sample with (vLLM, SGLang's examples) listen on.
    port: u16 = 8000, flag: Option<u16>;
    /// The model's name in /v1/models and responses (default: the file's or directory's).
    name: Option<String> = None, flag: Option<String>;
    /// Run a GGUF model's quantized weights (faster on the CPU; log-probs then differ from
    /// the trainer's f32 ones).
    quantized: bool = false, flag: bool;
    /// A LoRA adapter directory (PEFT's format; a LoRA run's `checkpoints/step-N/adapter`)
    /// merged into the model as it loads (weights loaded later through /v1/load_weights
    /// come as their directory holds them).
    adapter: Option<PathBuf> = None, flag: Option<PathBuf>;
    /// The weights' dtype, `f32` or `bf16` (default: as the model loads, f32): bf16 keeps the
    /// linear layers' matrices in half the bytes and computes in f32 (decoding is faster on
    /// the CPU; log-probs differ from f32's by the rounding of the weights).
    dtype: Option<String> = None, flag: Option<String>;
    /// Where the model runs: `cpu`, `cuda` or `cuda:N` (a build made by scripts/build-cuda;
    /// default: cpu).
    device: Option<String> = None, flag: Option<String>;
    /// Tensor-parallel ranks (threads of this process; on CUDA one GPU each, from the one
    /// `device` names, summing over NCCL); 1: one model.
    tp: u16 = 1, flag: Option<u16>;
    /// Completions per request (`n`): 16 covers a GRPO group; more would let one request hold
    /// the engine's rows.
    max_n: usize = 16, flag: Option<usize>;
    /// New tokens per completion: 4096 covers reasoning traces of the models served here;
    /// the key/value budget bounds what requests in flight hold together.
    max_tokens: usize = 4096, flag: Option<usize>;
    /// Stop strings per request (OpenAI allows 4).
    max_stop: usize = 4;
    /// Requests generating at once; more are answered 503 with Retry-After. 64: what the
    /// engine's lanes batch well on one machine.
    max_concurrent: usize = 64, flag: Option<usize>;
    /// Seconds a request may take; then 504 and its generation cancelled.
    timeout_s: u64 = 300, flag: Option<u64>;
    /// Prompts longer than this many tokens are prefilled in slices between other requests'
    /// decode steps, so that a long prompt does not hold every client.
    prefill_chunk: usize = 128, flag: Option<usize>;
    /// Connections open at once; more are closed when accepted (file descriptors are finite).
    max_connections: usize = 1024, flag: Option<usize>;
    /// Seconds a request's headers may take (and an idle connection may wait); its body gets
    /// three times as long, then 408: half-sent requests do not hold a connection.
    header_timeout_s: u64 = 10, flag: Option<u64>;
    /// MiB of key/value cache the requests in flight may come to hold (each counted at its
    /// prompt plus max_tokens); beyond it 503, and a request that alone needs more, 400.
    kv_budget_mib: usize = 2048, flag: Option<usize>;
    /// MiB of keys and values kept for later requests that start the same way (a shared
    /// system prompt, a conversation's earlier turns); 0 keeps none.
    prefix_cache_mib: u64 = 256, flag: Option<u64>;
    /// The largest request body, in bytes: 1 MiB holds long conversations, and stops a flood.
    max_body_bytes: usize = 1 << 20, flag: Option<usize>;
    /// Episodes open at once (/v1/episodes); more are answered 503.
    max_episodes: usize = 256, flag: Option<usize>;
    /// Seconds an episode may sit idle before it is closed.
    episode_idle_s: u64 = 600, flag: Option<u64>;
    /// Groups (or rollouts, prompts) per task request, tasks per draw, groups per score.
    max_groups: usize = 256;
    /// Completions per scored group; rollouts per group.
    max_group_size: usize = 64;
    /// Let clients load weights (POST /v1/load_weights, /update_weights) from checkpoints and
    /// models under this directory (off when none).
    weights_dir: Option<PathBuf> = None, flag: Option<PathBuf>;
    /// The environment variable holding the API key (a key itself does not belong in a file).
    api_key_env: Option<String> = None;
}

/// The flags' help and their values as `[serve]` keys.
#[cfg(feature = "flags")]
mod flags {
    /// A setting's doc as one paragraph, with its default where it has one to show.
    pub fn help<T: serde::Serialize>(doc: &str, default: &T) -> String {
        let text = doc.split('\n').map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" ");
        match toml::Value::try_from(default) {
            Ok(toml::Value::Boolean(_)) | Err(_) => text,
            Ok(toml::Value::String(s)) => format!("{text} [default: {s}]"),
            Ok(value) => format!("{text} [default: {value}]"),
        }
    }

    /// A flag's value as a `[serve]` key's, if it was given.
    pub trait Given {
        fn given(&self) -> Option<toml::Value>;
    }

    impl<T: serde::Serialize> Given for Option<T> {
        fn given(&self) -> Option<toml::Value> {
            // Only a count past i64 cannot be a TOML integer: the largest is as good.
            self.as_ref().map(|value| toml::Value::try_from(value).unwrap_or(toml::Value::Integer(i64::MAX)))
        }
    }

    impl Given for bool {
        fn given(&self) -> Option<toml::Value> {
            self.then_some(toml::Value::Boolean(true))
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

    /// The flags come from the same declarations as the settings: each has its key's name,
    /// its default in the help, and a flag given replaces the table's value (and only then).
    #[cfg(feature = "flags")]
    #[test]
    fn each_flag_is_its_setting_with_its_default_and_wins_over_the_table() {
        use clap::{CommandFactory, Parser};
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            flags: ServeFlags,
        }
        let command = Cli::command();
        let help = |id: &str| {
            let argument = command.get_arguments().find(|a| a.get_id() == id).unwrap_or_else(|| panic!("no --{id}"));
            argument.get_help().map(ToString::to_string).unwrap_or_default()
        };
        assert!(help("max_n").ends_with("[default: 16]"), "{}", help("max_n"));
        assert!(help("host").ends_with("[default: 127.0.0.1]"), "{}", help("host"));
        assert!(help("max_body_bytes").ends_with("[default: 1048576]"), "{}", help("max_body_bytes"));
        assert!(!help("quantized").contains("default") && !help("weights_dir").contains("[default"));
        // Settings without a flag (set in `[serve]` only) have none.
        assert!(command.get_arguments().all(|a| a.get_id() != "max_stop" && a.get_id() != "api_key_env"));
        let cli = Cli::parse_from(["serve", "--max-n", "3", "--quantized", "--weights-dir", "/w"]);
        let mut table: toml::Table = toml::from_str("max_n = 9\nport = 1\nmax_tokens = 7").unwrap();
        cli.flags.over(&mut table);
        let settings: ServeSettings = toml::Value::Table(table).try_into().unwrap();
        assert_eq!((settings.max_n, settings.port, settings.max_tokens), (3, 1, 7));
        assert_eq!((settings.quantized, settings.weights_dir), (true, Some(PathBuf::from("/w"))));
        // Nothing given: the table alone.
        let mut table: toml::Table = toml::from_str("max_n = 9").unwrap();
        ServeFlags::default().over(&mut table);
        assert_eq!(table.len(), 1);
    }
}
