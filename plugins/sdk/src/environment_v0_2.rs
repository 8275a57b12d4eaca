//! The `environment-plugin` world of `wirl:rl@0.2.0` (`wit/0.2.0/`): 0.1.0's task source and
//! episodes, with a reward for each turn the episode goes on from, which the trainer credits
//! to that turn's tokens (docs/PLUGINS.md, "Per-turn rewards").
//!
//! ```ignore
//! use wirl_sdk::environment_v0_2::{Episode, StepResult, Turn};
//!
//! struct Steps;
//!
//! impl Episode for Steps {
//!     fn step(&mut self, reply: String) -> Result<StepResult, String> {
//!         // A tool call that parses earns 0.1 now; the episode goes on.
//!         let reward = if reply.contains("<tool>") { 0.1 } else { 0.0 };
//!         Ok(StepResult::Continue(Turn::new(vec![]).reward(reward)))
//!     }
//! }
//! ```

#[doc(hidden)]
pub mod bindings {
    // Under a world name of this SDK's own, as `reward_v0_2`'s: wit-bindgen names the export
    // macro after the world, and 0.1.0's environment world has the same name.
    wit_bindgen::generate!({
        inline: "package wirl:sdk; world environment-plugin-v0-2 { include wirl:rl/environment-plugin@0.2.0; }",
        path: "../../wit/0.2.0",
        world: "wirl:sdk/environment-plugin-v0-2",
        generate_all,
        pub_export_macro: true,
        export_macro_name: "__export_environment_plugin_v0_2",
        default_bindings_module: "::wirl_sdk::environment_v0_2::bindings",
        runtime_path: "::wirl_sdk::__wit_bindgen::rt",
    });
}

shared_helpers!(self::bindings);

pub use bindings::exports::wirl::rl::environment::{Description, StepResult, Turn};
#[doc(hidden)]
pub use bindings::exports::wirl::rl::environment::{Guest as __Guest, GuestEpisode as __GuestEpisode};

impl Turn {
    /// The episode goes on with `messages` appended; the turn has no reward of its own.
    pub fn new(messages: Vec<Message>) -> Self {
        Turn { messages, reward: None }
    }

    /// The model turn just taken earned `reward` (credited to its tokens).
    pub fn reward(mut self, reward: f32) -> Self {
        self.reward = Some(reward);
        self
    }
}

environment_traits!();

/// Export `$ty` (which implements [`Environment`]) as this component's environment.
#[macro_export]
macro_rules! register_environment_v0_2 {
    ($ty:ty) => {
        $crate::__register_environment!($ty, environment_v0_2, __export_environment_plugin_v0_2);
    };
}
