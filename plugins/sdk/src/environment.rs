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

environment_traits!();

/// Export `$ty` (which implements [`Environment`]) as this component's environment.
#[macro_export]
macro_rules! register_environment {
    ($ty:ty) => {
        $crate::__register_environment!($ty, environment, __export_environment_plugin);
    };
}
