//! `calculator-agent`: a tool-using agent. The model is asked a multi-digit arithmetic
//! question and may call a calculator by writing `<calc>EXPRESSION</calc>`; the agent
//! evaluates the expression, answers with the result as a user message, and lets the model
//! continue, up to `max_tool_calls` times (2). The rollout is scored when the model gives
//! `<answer>N</answer>` (or stops calling the tool): 1 for the right number, else 0; parts
//! `correct` and `tool_calls`. With config `answer = "last_number"` a reply without the
//! tags is read by its last integer instead (a model as small as the default one answers
//! "4*3 + 6 equals 18." and never writes the tags, so with `"tags"`, the default, no group
//! of it differs and nothing trains).
//!
//! Every rollout of a step's turn k is generated in one `generate` call, so the engine batches
//! them. Tasks are deterministic in (seed, cursor + group): `{a} {op} {b} {op} {c}` with
//! 2-digit operands (config `digits`, 2).

use wirl_sdk::agent::{
    Agent, Completion, Message, Rollout, RolloutGroup, RolloutRequest, Sampling, Score, Task, config, generate,
};

mod calc;

pub use calc::evaluate;

pub const SYSTEM_PROMPT: &str = "You can use a calculator: write <calc>EXPRESSION</calc> and you will get the result. \
                                 Give the final number inside <answer></answer> tags.";

struct CalculatorAgent;

/// One rollout in progress.
struct Run {
    messages: Vec<Message>,
    generations: Vec<u64>,
    tool_calls: u32,
    /// Over: the model answered, or stopped calling the tool.
    done: bool,
}

impl Agent for CalculatorAgent {
    fn rollouts(request: RolloutRequest) -> Result<Vec<RolloutGroup>, String> {
        let max_tool_calls: u32 = config::get_or("max_tool_calls", 2)?;
        let digits: u32 = config::get_or("digits", 2)?;
        if !(1..=6).contains(&digits) {
            return Err(format!("config `digits` = {digits}: it must be between 1 and 6"));
        }
        let reading: String = config::get_or("answer", "tags".to_string())?;
        let read: fn(&str) -> Option<i64> = match reading.as_str() {
            "tags" => answer,
            "last_number" => answer_or_last_number,
            other => return Err(format!("config `answer` = {other:?}: it must be \"tags\" or \"last_number\"")),
        };
        let tasks: Vec<Task> =
            (0..request.groups as u64).map(|i| task(request.seed, request.cursor + i, digits)).collect();
        let mut runs: Vec<Run> = tasks
            .iter()
            .flat_map(|task| {
                (0..request.group_size).map(|_| Run {
                    messages: task.messages.clone(),
                    generations: Vec::new(),
                    tool_calls: 0,
                    done: false,
                })
            })
            .collect();
        for _turn in 0..=max_tool_calls {
            let live: Vec<usize> = (0..runs.len()).filter(|&i| !runs[i].done).collect();
            if live.is_empty() {
                break;
            }
            let conversations: Vec<Vec<Message>> = live.iter().map(|&i| runs[i].messages.clone()).collect();
            let completions: Vec<Completion> = generate(&conversations, &sampling(&request.sampling))?;
            for (&i, completion) in live.iter().zip(completions) {
                let run = &mut runs[i];
                run.generations.push(completion.generation);
                run.messages.push(Message::assistant(completion.text.clone()));
                match tool_call(&completion.text) {
                    Some(expression) if run.tool_calls < max_tool_calls && !completion.text.contains("<answer>") => {
                        run.tool_calls += 1;
                        let result = match evaluate(&expression) {
                            Ok(value) => format!("Calculator: {expression} = {value}"),
                            Err(error) => format!("Calculator error: {error}"),
                        };
                        run.messages.push(Message::user(result));
                    }
                    _ => run.done = true,
                }
            }
        }
        let mut runs = runs.into_iter();
        Ok(tasks
            .into_iter()
            .map(|task| {
                let expected: i64 = task.answer.as_deref().and_then(|a| a.parse().ok()).unwrap_or(i64::MIN);
                let rollouts = (&mut runs)
                    .take(request.group_size as usize)
                    .map(|run| {
                        let reply = run.messages.last().map(|m| m.content.clone()).unwrap_or_default();
                        let correct = read(&reply) == Some(expected);
                        let score = Score::new(if correct { 1.0 } else { 0.0 })
                            .part("correct", if correct { 1.0 } else { 0.0 })
                            .part("tool_calls", run.tool_calls as f32);
                        Rollout { messages: run.messages, generations: run.generations, outcome: Ok(score) }
                    })
                    .collect();
                RolloutGroup { task, rollouts }
            })
            .collect())
    }
}

/// The model's sampling, as asked, with no seed of the agent's (the host seeds each call).
fn sampling(asked: &Sampling) -> Sampling {
    Sampling { seed: None, ..asked.clone() }
}

/// The task at `index`: three operands, `+`, `-` or `*`, deterministic in `(seed, index)`.
pub fn task(seed: u64, index: u64, digits: u32) -> Task {
    let mut state = seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xC0FF_EE00;
    let mut next = |bound: u64| {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % bound
    };
    let low = 10u64.pow(digits - 1);
    let span = 10u64.pow(digits) - low;
    let mut operand = || low + next(span);
    let (a, b, c) = (operand(), operand(), operand());
    let ops = ["+", "-", "*"];
    let (p, q) = (ops[next(3) as usize], ops[next(3) as usize]);
    let expression = format!("{a} {p} {b} {q} {c}");
    let answer = evaluate(&expression).expect("generated expressions evaluate");
    Task {
        id: format!("calculator/{seed}/{index}"),
        messages: vec![Message::system(SYSTEM_PROMPT), Message::user(format!("What is {expression}?"))],
        answer: Some(answer.to_string()),
        metadata: None,
    }
}

/// The expression of the last `<calc>…</calc>` in `text`.
pub fn tool_call(text: &str) -> Option<String> {
    let start = text.rfind("<calc>")? + "<calc>".len();
    let end = text[start..].find("</calc>").map_or(text.len(), |e| start + e);
    Some(text[start..end].trim().to_string())
}

/// The integer in the last `<answer>…</answer>`.
pub fn answer(text: &str) -> Option<i64> {
    let start = text.rfind("<answer>")? + "<answer>".len();
    let end = text[start..].find("</answer>").map_or(text.len(), |e| start + e);
    text[start..end].trim().parse().ok()
}

/// The `<answer>` tag's integer if the text has the tag, else its last integer: a run of
/// digits, negative where a `-` stands right before it and no digit before that (`= -4` is
/// −4, `4-8` ends in 8).
pub fn answer_or_last_number(text: &str) -> Option<i64> {
    if text.contains("<answer>") {
        return answer(text);
    }
    let end = text.rfind(|c: char| c.is_ascii_digit())? + 1;
    let digits = text[..end].trim_end_matches(|c: char| c.is_ascii_digit()).len();
    let before = &text[..digits];
    let signed = before.ends_with('-') && !before[..before.len() - 1].ends_with(|c: char| c.is_ascii_digit());
    text[if signed { digits - 1 } else { digits }..end].parse().ok()
}

wirl_sdk::register_agent!(CalculatorAgent);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_deterministic_and_answered_by_the_calculator() {
        let a = task(1, 7, 2);
        assert_eq!(a.id, task(1, 7, 2).id);
        assert_eq!(a.messages[1].content, task(1, 7, 2).messages[1].content);
        assert_ne!(a.messages[1].content, task(1, 8, 2).messages[1].content);
        let expression = a.messages[1].content.trim_start_matches("What is ").trim_end_matches('?');
        assert_eq!(evaluate(expression).unwrap().to_string(), a.answer.unwrap());
    }

    #[test]
    fn tool_calls_and_answers_are_found() {
        assert_eq!(tool_call("let me see <calc> 12 * 3 </calc>").as_deref(), Some("12 * 3"));
        assert_eq!(tool_call("no tool"), None);
        assert_eq!(answer("so <answer>-36</answer>"), Some(-36));
        assert_eq!(answer("<answer>x</answer>"), None);
    }

    #[test]
    fn the_last_number_is_read_where_the_tags_are_missing() {
        assert_eq!(answer_or_last_number("4*3 + 6 equals 18."), Some(18));
        assert_eq!(answer_or_last_number("it is -36"), Some(-36));
        assert_eq!(answer_or_last_number("3 - 7 = -4"), Some(-4));
        assert_eq!(answer_or_last_number("-5"), Some(-5));
        assert_eq!(answer_or_last_number("the range 4-8"), Some(8));
        assert_eq!(answer_or_last_number("no number"), None);
        // The tags win, even when a number follows them or they hold none.
        assert_eq!(answer_or_last_number("<answer>7</answer> (not 9)"), Some(7));
        assert_eq!(answer_or_last_number("<answer>x</answer> 9"), None);
        // Past i64: no answer, not a panic.
        assert_eq!(answer_or_last_number("99999999999999999999"), None);
    }
}
