//! `exact-match`: reward 1 when the completion is the task's answer, else 0.
//!
//! Both sides are trimmed of surrounding whitespace. Config: `ignore_case` (default false).

use wirl_sdk::reward::{Reward, Score, Task, config};

struct ExactMatch;

impl Reward for ExactMatch {
    fn score(task: Task, completion: String) -> Result<Score, String> {
        let expected = task.answer.as_deref().ok_or_else(|| format!("task {} has no answer", task.id))?;
        let ignore_case: bool = config::get_or("ignore_case", false)?;
        let (got, want) = (completion.trim(), expected.trim());
        let equal = if ignore_case { got.to_lowercase() == want.to_lowercase() } else { got == want };
        let correct = if equal { 1.0 } else { 0.0 };
        Ok(Score::new(correct).part("correct", correct))
    }
}

wirl_sdk::register_reward!(ExactMatch);
