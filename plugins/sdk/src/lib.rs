//! Write wirl plugins in Rust.
//!
//! Enable the feature of the world your plugin implements (`reward`, `environment`,
//! `agent`, `grader`, `code-runner`), implement its trait and register it:
//!
//! ```ignore
//! use wirl_sdk::reward::{Reward, Score, Task};
//!
//! struct Exact;
//!
//! impl Reward for Exact {
//!     fn score(task: Task, completion: String) -> Result<Score, String> {
//!         let answer = task.answer.ok_or("task has no answer")?;
//!         Ok(Score::new(if completion.trim() == answer.trim() { 1.0 } else { 0.0 }))
//!     }
//! }
//!
//! wirl_sdk::register_reward!(Exact);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release`; the `.wasm` is a component.

// The generated bindings name this crate by its absolute path, also from inside it.
extern crate self as wirl_sdk;

#[doc(hidden)]
pub use serde as __serde;
#[doc(hidden)]
pub use serde_json as __serde_json;
#[doc(hidden)]
pub use wit_bindgen as __wit_bindgen;

/// Helpers every world shares: friendlier constructors for the generated WIT types and
/// typed access to the plugin's configuration. Expanded once per world module, because
/// each world has its own generated copy of `wirl:rl/types`.
macro_rules! shared_helpers {
    ($bindings:path) => {
        pub use __b::wirl::rl::types::{Message, Score, Task};
        use $bindings as __b;

        impl Score {
            /// A score with this reward, no parts and no note.
            pub fn new(reward: f32) -> Self {
                Score { reward, parts: Vec::new(), note: None }
            }
            /// Add a named part (`format`, `correct`, …) shown in metrics.
            pub fn part(mut self, name: impl Into<String>, value: f32) -> Self {
                self.parts.push((name.into(), value));
                self
            }
            /// Attach a short remark (what was extracted, why it failed).
            pub fn note(mut self, note: impl Into<String>) -> Self {
                self.note = Some(note.into());
                self
            }
        }

        impl Message {
            /// A message with `role` and `content`.
            pub fn new(role: &str, content: impl Into<String>) -> Self {
                Message { role: role.to_string(), content: content.into() }
            }
            pub fn system(content: impl Into<String>) -> Self {
                Self::new("system", content)
            }
            pub fn user(content: impl Into<String>) -> Self {
                Self::new("user", content)
            }
            pub fn assistant(content: impl Into<String>) -> Self {
                Self::new("assistant", content)
            }
        }

        /// This plugin's settings: the `config` table of its entry in the wirl TOML.
        pub mod config {
            /// The value under `key`, parsed from its JSON text; `Ok(None)` when absent,
            /// `Err` naming the key when it has the wrong type.
            pub fn get<T: $crate::__serde::de::DeserializeOwned>(key: &str) -> Result<Option<T>, String> {
                match super::__b::wirl::rl::config::get(key) {
                    None => Ok(None),
                    Some(json) => $crate::__serde_json::from_str::<T>(&json)
                        .map(Some)
                        .map_err(|e| format!("config key `{key}`: {e} (value: {json})")),
                }
            }
            /// The value under `key`, or `default` when absent.
            pub fn get_or<T: $crate::__serde::de::DeserializeOwned>(key: &str, default: T) -> Result<T, String> {
                Ok(get(key)?.unwrap_or(default))
            }
        }
    };
}

#[cfg(feature = "reward")]
pub mod reward;

#[cfg(feature = "reward-v0-2")]
pub mod reward_v0_2;

#[cfg(feature = "grader")]
pub mod grader;

#[cfg(feature = "environment")]
pub mod environment;

#[cfg(feature = "agent")]
pub mod agent;
