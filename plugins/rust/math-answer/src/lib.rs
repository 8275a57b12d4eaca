//! `math-answer`: is the model's final answer to a math task right?
//!
//! The final answer is the last `<answer>…</answer>` block, else the last `\boxed{…}`, else
//! the last number in the completion. It is right when it equals the task's answer as a
//! number (within `tolerance`) or, failing that, as normalised text. Parts: `format` (1 when
//! the answer was tagged or boxed) and `correct`. Reward: `correct + format_weight * format`.
//!
//! Config: `tolerance` (absolute, default 1e-6), `format_weight` (default 0).

use wirl_sdk::reward::{Reward, Score, Task, config};

mod extract;

pub use extract::{Extracted, answers_match, final_answer};

struct MathAnswer;

impl Reward for MathAnswer {
    fn score(task: Task, completion: String) -> Result<Score, String> {
        let settings = Settings::load()?;
        score_one(&settings, &task, &completion)
    }

    fn score_group(task: Task, completions: Vec<String>) -> Vec<Result<Score, String>> {
        match Settings::load() {
            Ok(settings) => completions.iter().map(|c| score_one(&settings, &task, c)).collect(),
            Err(e) => completions.iter().map(|_| Err(e.clone())).collect(),
        }
    }
}

struct Settings {
    tolerance: f64,
    format_weight: f32,
}

impl Settings {
    fn load() -> Result<Self, String> {
        Ok(Settings {
            tolerance: config::get_or("tolerance", 1e-6)?,
            format_weight: config::get_or("format_weight", 0.0)?,
        })
    }
}

fn score_one(settings: &Settings, task: &Task, completion: &str) -> Result<Score, String> {
    let expected = task.answer.as_deref().ok_or_else(|| format!("task {} has no answer to compare with", task.id))?;
    let Some(found) = final_answer(completion) else {
        return Ok(Score::new(0.0).part("format", 0.0).part("correct", 0.0).note("no answer found"));
    };
    let format = if found.tagged { 1.0 } else { 0.0 };
    let correct = if answers_match(&found.text, expected, settings.tolerance) { 1.0 } else { 0.0 };
    Ok(Score::new(correct + settings.format_weight * format)
        .part("format", format)
        .part("correct", correct)
        .note(format!("answer: {}", truncate(&found.text, 80))))
}

fn truncate(text: &str, max_chars: usize) -> &str {
    match text.char_indices().nth(max_chars) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}

wirl_sdk::register_reward!(MathAnswer);
