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

/// An environment world's traits (`Environment`, `Episode`) over its own generated types,
/// expanded once per version's module (0.1.0's and 0.2.0's differ in `StepResult`).
#[cfg(any(feature = "environment", feature = "environment-v0-2"))]
macro_rules! environment_traits {
    () => {
        /// A task source. `task` must be deterministic in `(seed, index)` and the configuration.
        pub trait Environment {
            /// Name, size and whether episodes are implemented.
            fn describe() -> Description;

            /// The task at `index` for `seed`.
            fn task(seed: u64, index: u64) -> Result<Task, String>;

            /// Begin a multi-turn episode of `task`. The default says that this environment is
            /// single-turn: its tasks are scored by a reward plugin.
            fn start_episode(task: Task) -> Result<Box<dyn Episode>, String> {
                let _ = task;
                Err("this environment has no episodes: score its tasks with a reward plugin".into())
            }
        }

        /// The state of one running episode.
        pub trait Episode {
            /// Take the model's reply; say whether the episode goes on or is done.
            fn step(&mut self, reply: String) -> Result<StepResult, String>;
        }

        /// Holds an episode behind the `&self` that resource methods get; an episode that
        /// failed to start keeps its error and reports it on the first step.
        #[doc(hidden)]
        pub struct EpisodeCell(pub core::cell::RefCell<Result<Box<dyn Episode>, String>>);

        impl EpisodeCell {
            pub fn step(&self, reply: String) -> Result<StepResult, String> {
                match &mut *self.0.borrow_mut() {
                    Ok(episode) => episode.step(reply),
                    Err(reason) => Err(reason.clone()),
                }
            }
        }
    };
}

/// What `register_environment!` and `register_environment_v0_2!` expand to: `$ty`'s
/// `Environment` (of this crate's module `$world`) exported through that module's bindings'
/// export macro `$export`.
#[doc(hidden)]
#[macro_export]
macro_rules! __register_environment {
    ($ty:ty, $world:ident, $export:ident) => {
        // Native builds (the plugin's unit tests) get no component exports, only a use of
        // the implementation so that it does not read as dead code.
        #[cfg(not(target_family = "wasm"))]
        const _: () = {
            let _ = <$ty as $crate::$world::Environment>::describe;
            let _ = <$ty as $crate::$world::Environment>::task;
            let _ = <$ty as $crate::$world::Environment>::start_episode;
        };
        #[cfg(target_family = "wasm")]
        const _: () = {
            #[doc(hidden)]
            struct __WirlEnvironmentExport;

            #[doc(hidden)]
            struct __WirlEpisode($crate::$world::EpisodeCell);

            impl $crate::$world::__Guest for __WirlEnvironmentExport {
                type Episode = __WirlEpisode;
                fn describe() -> $crate::$world::Description {
                    <$ty as $crate::$world::Environment>::describe()
                }
                fn task_at(seed: u64, index: u64) -> Result<$crate::$world::Task, String> {
                    <$ty as $crate::$world::Environment>::task(seed, index)
                }
            }

            impl $crate::$world::__GuestEpisode for __WirlEpisode {
                fn new(task: $crate::$world::Task) -> Self {
                    __WirlEpisode($crate::$world::EpisodeCell(::core::cell::RefCell::new(
                        <$ty as $crate::$world::Environment>::start_episode(task),
                    )))
                }
                fn step(&self, reply: String) -> Result<$crate::$world::StepResult, String> {
                    self.0.step(reply)
                }
            }

    $crate::$world::bindings::$export!(__WirlEnvironmentExport with_types_in $crate::$world::bindings);
        };
    };
}

#[cfg(feature = "reward")]
pub mod reward;

#[cfg(feature = "reward-v0-2")]
pub mod reward_v0_2;

#[cfg(feature = "environment-v0-2")]
pub mod environment_v0_2;

#[cfg(feature = "grader")]
pub mod grader;

#[cfg(feature = "environment")]
pub mod environment;

#[cfg(feature = "agent")]
pub mod agent;
