//! `{name}`: reward 1 when the completion holds the task's answer, else 0.
//!
//! Build: `{build}`; try it:
//! `{try}`

use wirl_sdk::reward::{Reward, Score, Task, config};

struct Plugin;

impl Reward for Plugin {
    fn score(task: Task, completion: String) -> Result<Score, String> {
        let answer = task.answer.ok_or_else(|| format!("task {} has no answer", task.id))?;
        let ignore_case: bool = config::get_or("ignore_case", false)?;
        let found = if ignore_case {
            completion.to_lowercase().contains(&answer.trim().to_lowercase())
        } else {
            completion.contains(answer.trim())
        };
        let correct = if found { 1.0 } else { 0.0 };
        Ok(Score::new(correct).part("correct", correct).note(format!("looked for {:?}", answer.trim())))
    }
}

wirl_sdk::register_reward!(Plugin);
