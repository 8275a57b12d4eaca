//! The `agent-plugin` world: turn tasks into scored rollout groups, calling the model being
//! trained through [`generate`].
//!
//! The agent sees messages, never tokens: each completion comes with a `generation` handle,
//! and a rollout lists the handles of the completions that became the model's turns, in
//! order, each continuing the conversation of the one before (its messages, its reply, then
//! whatever the agent adds). The host resolves them to the exact token ids and log-probs it
//! sampled; the trainer learns from those, never from re-tokenized text.

#[doc(hidden)]
pub mod bindings {
    wit_bindgen::generate!({
        world: "agent-plugin",
        path: "../../wit",
        pub_export_macro: true,
        export_macro_name: "__export_agent_plugin",
        default_bindings_module: "::wirl_sdk::agent::bindings",
        runtime_path: "::wirl_sdk::__wit_bindgen::rt",
    });
}

shared_helpers!(self::bindings);

#[doc(hidden)]
pub use bindings::exports::wirl::rl::agent::Guest as __Guest;
pub use bindings::exports::wirl::rl::agent::{Rollout, RolloutGroup, RolloutRequest};
pub use bindings::wirl::rl::types::{Completion, FinishReason, Sampling};

/// One completion per conversation from the model being trained (each conversation ends
/// where the model writes the next assistant turn). `Err` when the host refuses: the agent
/// used up its generate calls or tokens, or a conversation does not fit the context.
pub fn generate(conversations: &[Vec<Message>], sampling: &Sampling) -> Result<Vec<Completion>, String> {
    bindings::wirl::rl::inference::generate(conversations, sampling)
}

/// An agent. `rollouts` must give `request.groups` groups of `request.group_size` rollouts;
/// with the same `seed` and `cursor` it should give the same tasks.
pub trait Agent {
    fn rollouts(request: RolloutRequest) -> Result<Vec<RolloutGroup>, String>;
}

/// Export `$ty` (which implements [`Agent`]) as this component's agent.
#[macro_export]
macro_rules! register_agent {
    ($ty:ty) => {
        #[cfg(not(target_family = "wasm"))]
        const _: () = {
            let _ = <$ty as $crate::agent::Agent>::rollouts;
        };
        #[cfg(target_family = "wasm")]
        const _: () = {
            #[doc(hidden)]
            struct __WirlAgentExport;

            impl $crate::agent::__Guest for __WirlAgentExport {
                fn rollouts(
                    request: $crate::agent::RolloutRequest,
                ) -> Result<Vec<$crate::agent::RolloutGroup>, String> {
                    <$ty as $crate::agent::Agent>::rollouts(request)
                }
            }

    $crate::agent::bindings::__export_agent_plugin!(__WirlAgentExport with_types_in $crate::agent::bindings);
        };
    };
}
