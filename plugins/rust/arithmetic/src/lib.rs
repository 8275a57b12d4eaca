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

use wirl_sdk::environment::{Description, Environment, Message, Task, config};

mod generate;

pub use generate::{Kind, Problem, Settings};

pub const SYSTEM_PROMPT: &str = "Answer with the final number inside <answer></answer> tags.";
pub const QUESTION_PREFIX: &str = "State the final answer to the following arithmetic problem: ";
const SHOTS: [(&str, &str); 2] = [("2 + 3 =", "5"), ("14 + 7 =", "21")];

struct Arithmetic;

impl Environment for Arithmetic {
    fn describe() -> Description {
        let kind = load_settings().map(|s| s.kind.name()).unwrap_or("misconfigured");
        Description { name: format!("arithmetic/{kind}"), size: None, episodes: false }
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

wirl_sdk::register_environment!(Arithmetic);
