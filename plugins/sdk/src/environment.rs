//! The `environment-plugin` world: a deterministic task source, optionally with multi-turn
//! episodes.

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "environment-plugin",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "__export_environment_plugin",
        default_bindings_module: "::wirl_sdk::environment::bindings",
        runtime_path: "::wirl_sdk::__wit_bindgen::rt",
    });
}

shared_helpers!(self::bindings);

pub use bindings::exports::wirl::rl::environment::{Description, StepResult};
#[doc(hidden)]
pub use bindings::exports::wirl::rl::environment::{Guest as __Guest, GuestEpisode as __GuestEpisode};

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
    /// Take the model's reply; say whether the episode goes on (with new messages) or is done.
    fn step(&mut self, reply: String) -> Result<StepResult, String>;
}

/// Holds an episode behind the `&self` that resource methods get; an episode that failed
/// to start keeps its error and reports it on the first step.
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

/// Export `$ty` (which implements [`Environment`]) as this component's environment.
#[macro_export]
macro_rules! register_environment {
    ($ty:ty) => {
        // Native builds (the plugin's unit tests) get no component exports, only a use of
        // the implementation so that it does not read as dead code.
        #[cfg(not(target_family = "wasm"))]
        const _: () = {
            let _ = <$ty as $crate::environment::Environment>::describe;
            let _ = <$ty as $crate::environment::Environment>::task;
            let _ = <$ty as $crate::environment::Environment>::start_episode;
        };
        #[cfg(target_family = "wasm")]
        const _: () = {
            #[doc(hidden)]
            struct __WirlEnvironmentExport;

            #[doc(hidden)]
            struct __WirlEpisode($crate::environment::EpisodeCell);

            impl $crate::environment::__Guest for __WirlEnvironmentExport {
                type Episode = __WirlEpisode;
                fn describe() -> $crate::environment::Description {
                    <$ty as $crate::environment::Environment>::describe()
                }
                fn task_at(seed: u64, index: u64) -> Result<$crate::environment::Task, String> {
                    <$ty as $crate::environment::Environment>::task(seed, index)
                }
            }

            impl $crate::environment::__GuestEpisode for __WirlEpisode {
                fn new(task: $crate::environment::Task) -> Self {
                    __WirlEpisode($crate::environment::EpisodeCell(::core::cell::RefCell::new(
                        <$ty as $crate::environment::Environment>::start_episode(task),
                    )))
                }
                fn step(&self, reply: String) -> Result<$crate::environment::StepResult, String> {
                    self.0.step(reply)
                }
            }

            $crate::environment::bindings::__export_environment_plugin!(__WirlEnvironmentExport with_types_in $crate::environment::bindings);
        };
    };
}
