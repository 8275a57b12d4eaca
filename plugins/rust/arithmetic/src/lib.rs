//! `arithmetic`: deterministic procedural arithmetic tasks with a few-shot chat prompt.
//!
//! Kinds: `chain_sum` (terms joined by `+` and `-`) and `basic_arithmetic` (`+ - * /` with
//! the usual precedence; every division is exact). The task at `(seed, index)` depends on
//! nothing else but the configuration, so runs are reproducible and held-out sets are just
//! other indices.
//!
//! Config (all optional): `kind` (`"chain_sum"`), `min_terms` / `max_terms` (2 / 2),
//! `min_digits` / `max_digits` (1 / 1), `allow_negative` (true: chain sums may go below 0),
//! `shots` (true: two worked examples before the question, which the small default model
//! needs to use the answer tags at all).
//!
//! Episodes (multi-turn, `max_turns` > 1 in a wirl config): the model answers; a wrong answer
//! is told whether it is too high or too low (a missing one, how to give it) and the model
//! tries again, up to `attempts` (3) answers. The episode's reward is 1 / the attempt that
//! got it right (1, 0.5, 0.33, …), 0 if none did; parts `correct` and `attempts`.

use wirl_sdk::environment::{Description, Environment, Episode, Message, Score, StepResult, Task, config};

mod generate;
mod retry;

pub use generate::{Kind, Problem, Settings};

pub const SYSTEM_PROMPT: &str = "Answer with the final number inside <answer></answer> tags.";
pub const QUESTION_PREFIX: &str = "State the final answer to the following arithmetic problem: ";
const SHOTS: [(&str, &str); 2] = [("2 + 3 =", "5"), ("14 + 7 =", "21")];

struct Arithmetic;

impl Environment for Arithmetic {
    fn describe() -> Description {
        let kind = load_settings().map(|s| s.kind.name()).unwrap_or("misconfigured");
        Description { name: format!("arithmetic/{kind}"), size: None, episodes: true }
    }

    fn start_episode(task: Task) -> Result<Box<dyn Episode>, String> {
        let answer = task.answer.as_deref().ok_or_else(|| format!("task {} has no answer", task.id))?;
        let expected: i64 =
            answer.parse().map_err(|_| format!("task {}: answer {answer:?} is not an integer", task.id))?;
        let attempts: u32 = config::get_or("attempts", 3)?;
        if attempts == 0 {
            return Err("config `attempts` must be at least 1".into());
        }
        Ok(Box::new(Retry { state: retry::Attempts::new(expected, attempts) }))
    }

    fn task(seed: u64, index: u64) -> Result<Task, String> {
        let settings = load_settings()?;
        let shots: bool = config::get_or("shots", true)?;
        let problem = settings.problem(seed, index);
        let mut messages = vec![Message::system(SYSTEM_PROMPT)];
        if shots {
            for (question, answer) in SHOTS {
                messages.push(Message::user(format!("{QUESTION_PREFIX}{question}")));
                messages.push(Message::assistant(format!("<answer>{answer}</answer>")));
            }
        }
        messages.push(Message::user(format!("{QUESTION_PREFIX}{} =", problem.expression)));
        let metadata = serde_json::json!({
            "kind": settings.kind.name(),
            "expression": problem.expression,
        });
        Ok(Task {
            id: format!("arithmetic/{seed}/{index}"),
            messages,
            answer: Some(problem.answer.to_string()),
            metadata: Some(metadata.to_string()),
        })
    }
}

fn load_settings() -> Result<Settings, String> {
    let kind: String = config::get_or("kind", "chain_sum".to_string())?;
    let settings = Settings {
        kind: Kind::parse(&kind)?,
        min_terms: config::get_or("min_terms", 2)?,
        max_terms: config::get_or("max_terms", 2)?,
        min_digits: config::get_or("min_digits", 1)?,
        max_digits: config::get_or("max_digits", 1)?,
        allow_negative: config::get_or("allow_negative", true)?,
    };
    settings.validate()?;
    Ok(settings)
}

/// An episode: the answer checked, feedback given, until right or out of attempts.
struct Retry {
    state: retry::Attempts,
}

impl Episode for Retry {
    fn step(&mut self, reply: String) -> Result<StepResult, String> {
        Ok(match self.state.answer(&reply) {
            retry::Verdict::Solved { attempt } => StepResult::Done(
                Score::new(1.0 / attempt as f32)
                    .part("correct", 1.0)
                    .part("attempts", attempt as f32)
                    .note(format!("solved at attempt {attempt}")),
            ),
            retry::Verdict::Failed { attempts } => StepResult::Done(
                Score::new(0.0)
                    .part("correct", 0.0)
                    .part("attempts", attempts as f32)
                    .note(format!("not solved in {attempts} attempts")),
            ),
            retry::Verdict::TryAgain { feedback } => StepResult::Continue(vec![Message::user(feedback)]),
        })
    }
}

wirl_sdk::register_environment!(Arithmetic);
