//! A component for `wirl:rl@2.0.0`, a major version this host does not speak.

wit_bindgen::generate!({ world: "reward-plugin", path: "wit" });

struct Future;

impl exports::wirl::rl::reward::Guest for Future {
    fn score(completion: String) -> f32 {
        completion.len() as f32
    }
}

export!(Future);
