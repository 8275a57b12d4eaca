//! The `reward-plugin` world: score completions of a task.

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "reward-plugin",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "__export_reward_plugin",
        default_bindings_module: "::wirl_sdk::reward::bindings",
        runtime_path: "::wirl_sdk::__wit_bindgen::rt",
    });
}

shared_helpers!(self::bindings);

#[doc(hidden)]
pub use bindings::exports::wirl::rl::reward::Guest as __Guest;

/// A reward function. Implement `score`; `score_group` scores a group by calling it per
/// completion unless you override it (to share work across the group, say).
pub trait Reward {
    /// Score one completion of `task`. `Err` is your verdict that it cannot be scored: wirl
    /// records the reason and gives the configured failure reward.
    fn score(task: Task, completion: String) -> Result<Score, String>;

    /// Score every completion of one group of `task`, in order.
    fn score_group(task: Task, completions: Vec<String>) -> Vec<Result<Score, String>> {
        completions.into_iter().map(|c| Self::score(task.clone(), c)).collect()
    }
}

/// Export `$ty` (which implements [`Reward`]) as this component's reward function.
#[macro_export]
macro_rules! register_reward {
    ($ty:ty) => {
        // Native builds (the plugin's unit tests) get no component exports, only a use of
        // the implementation so that it does not read as dead code.
        #[cfg(not(target_family = "wasm"))]
        const _: () = {
            let _ = <$ty as $crate::reward::Reward>::score;
            let _ = <$ty as $crate::reward::Reward>::score_group;
        };
        #[cfg(target_family = "wasm")]
        const _: () = {
            #[doc(hidden)]
            struct __WirlRewardExport;

            impl $crate::reward::__Guest for __WirlRewardExport {
                fn score_completion(
                    task: $crate::reward::Task,
                    completion: String,
                ) -> Result<$crate::reward::Score, String> {
                    <$ty as $crate::reward::Reward>::score(task, completion)
                }
                fn score_group(
                    task: $crate::reward::Task,
                    completions: Vec<String>,
                ) -> Vec<Result<$crate::reward::Score, String>> {
                    <$ty as $crate::reward::Reward>::score_group(task, completions)
                }
            }

            $crate::reward::bindings::__export_reward_plugin!(__WirlRewardExport with_types_in $crate::reward::bindings);
        };
    };
}
