//! A `wirl:rl@0.2.0` judge for tests: it asks the model about every completion of a group in
//! one `generate` call (greedy, `max_tokens` from its config, default 6) and rewards each
//! with the number of words of the model's reply, which it keeps as its note — a value the
//! test can recompute from the engine. A refused call (no model, a spent budget) is every
//! completion's `Err`, with the host's reason.

use wirl_sdk::reward_v0_2::{Message, Progress, Reward, Sampling, Score, Task, config, generate};

struct Judge;

impl Reward for Judge {
    fn score_group(task: Task, completions: Vec<String>, _progress: Progress) -> Vec<Result<Score, String>> {
        let fail = |error: String| completions.iter().map(|_| Err(error.clone())).collect();
        let max_tokens: u32 = match config::get_or("max_tokens", 6) {
            Ok(max_tokens) => max_tokens,
            Err(error) => return fail(error),
        };
        let asked = task.messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join(" ");
        let conversations: Vec<Vec<Message>> =
            completions.iter().map(|completion| vec![Message::user(format!("{asked} {completion}"))]).collect();
        let sampling =
            Sampling { max_tokens, temperature: 0.0, top_p: 1.0, top_k: 0, min_p: 0.0, stop: Vec::new(), seed: None };
        match generate(&conversations, &sampling) {
            Ok(replies) => replies
                .into_iter()
                .map(|reply| {
                    let words = reply.text.split_whitespace().count() as f32;
                    Ok(Score::new(words).part("judge_words", words).note(reply.text))
                })
                .collect(),
            Err(error) => fail(error),
        }
    }
}

wirl_sdk::register_reward_v0_2!(Judge);
