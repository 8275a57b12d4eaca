//! A `wirl:rl@0.2.0` reward for tests that asks the model how likely it finds each
//! completion, as the reply to the task's conversation, in one `logprobs` call: the reward is
//! the completion's mean log-prob per token, with parts `total` and `tokens`, and the tokens'
//! texts and log-probs as its note (JSON) — values a test can recompute from the engine. A
//! refused call is every completion's `Err`, with the host's reason.

use wirl_sdk::reward_v0_2::{Progress, ReplyToScore, Reward, Score, Task, logprobs};

struct Likelihood;

impl Reward for Likelihood {
    fn score_group(task: Task, completions: Vec<String>, _progress: Progress) -> Vec<Result<Score, String>> {
        let asked: Vec<ReplyToScore> = completions
            .iter()
            .map(|completion| ReplyToScore { conversation: task.messages.clone(), reply: completion.clone() })
            .collect();
        match logprobs(&asked) {
            Ok(scored) => scored
                .into_iter()
                .map(|reply| {
                    let tokens = reply.tokens.len() as f32;
                    let total = reply.total();
                    let mean = if reply.tokens.is_empty() { 0.0 } else { total / tokens };
                    let note = serde_json::json!({ "tokens": reply.tokens, "logprobs": reply.logprobs }).to_string();
                    Ok(Score::new(mean).part("total", total).part("tokens", tokens).note(note))
                })
                .collect(),
            Err(error) => completions.iter().map(|_| Err(error.clone())).collect(),
        }
    }
}

wirl_sdk::register_reward_v0_2!(Likelihood);
