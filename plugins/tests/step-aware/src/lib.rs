//! A `wirl:rl@0.2.0` reward that rewards each completion with the step it is scored at, times
//! its config's `scale` (default 1), with the step, the planned steps and the group's size as
//! parts: what a test needs to see that the host tells 0.2.0 plugins the run's progress, reads
//! their config through 0.2.0's interface and scores a group in one call.

use wirl_sdk::reward_v0_2::{Progress, Reward, Score, Task, config};

struct StepAware;

impl Reward for StepAware {
    fn score_group(_task: Task, completions: Vec<String>, progress: Progress) -> Vec<Result<Score, String>> {
        let scale: f32 = match config::get_or("scale", 1.0) {
            Ok(scale) => scale,
            Err(error) => return completions.iter().map(|_| Err(error.clone())).collect(),
        };
        let group = completions.len() as f32;
        completions
            .iter()
            .map(|_| {
                Ok(Score::new(scale * progress.step as f32)
                    .part("step", progress.step as f32)
                    .part("steps", progress.steps as f32)
                    .part("group", group))
            })
            .collect()
    }
}

wirl_sdk::register_reward_v0_2!(StepAware);
