//! `wirl score`: JSONL completions scored by a reward plugin, each line as it is read. A bad
//! line (not UTF-8, not JSON, not a task, a failed verdict) is named by its number and field,
//! written as such, and passed over: the other lines are still scored.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};
use wirl_sandbox::{FailureKind, RewardPlugin, Task};

/// What the lines came to.
#[derive(Default)]
pub struct Summary {
    pub lines: usize,
    pub scored: usize,
    pub bad_input: usize,
    pub failures: BTreeMap<FailureKind, usize>,
    pub reward_sum: f64,
    /// Each part's sum and count.
    pub parts: BTreeMap<String, (f64, usize)>,
    /// Each call's duration, sorted.
    pub durations: Vec<Duration>,
    pub total: Duration,
}

impl Summary {
    /// The `q` quantile of the calls' durations.
    pub fn percentile(&self, q: f64) -> Option<Duration> {
        let last = self.durations.len().checked_sub(1)?;
        Some(self.durations[(last as f64 * q).round() as usize])
    }
}

/// Score each line of `input` with `reward` and write its record to `output`; `answers`:
/// score each task's own reference answer (a line may then be a task alone). `bad_line` is
/// told each line that could not be scored as input, with its message.
pub fn score_lines(
    reward: &mut RewardPlugin,
    input: impl BufRead,
    mut output: impl Write,
    answers: bool,
    bad_line: &mut dyn FnMut(&str),
) -> anyhow::Result<Summary> {
    let mut summary = Summary::default();
    let started = Instant::now();
    for (index, line) in input.split(b'\n').enumerate() {
        let number = index + 1;
        let line = line.map_err(|e| anyhow::anyhow!("reading input line {number}: {e}"))?;
        if line.trim_ascii().is_empty() {
            continue;
        }
        summary.lines += 1;
        // A line that is not UTF-8 is bad input like any other: named, and the rest scored.
        let parsed = std::str::from_utf8(&line)
            .map_err(|e| format!("not UTF-8 text ({e})"))
            .and_then(|line| parse_line(line, answers));
        let record = match parsed {
            Ok((task, completion)) => summary.score(reward, number, &task, &completion),
            Err(problem) => {
                let message = format!("line {number}: {problem}");
                bad_line(&message);
                summary.bad_input += 1;
                serde_json::json!({ "line": number, "input_error": message })
            }
        };
        serde_json::to_writer(&mut output, &record)?;
        writeln!(output)?;
    }
    output.flush()?;
    summary.durations.sort();
    summary.total = started.elapsed();
    Ok(summary)
}

impl Summary {
    /// One line's call, counted; its record.
    fn score(&mut self, reward: &mut RewardPlugin, number: usize, task: &Task, completion: &str) -> serde_json::Value {
        let call_started = Instant::now();
        let verdict = reward.score(task, completion);
        let took = call_started.elapsed();
        self.durations.push(took);
        let micros = took.as_micros() as u64;
        match verdict {
            Ok(score) => {
                self.scored += 1;
                self.reward_sum += f64::from(score.reward);
                for (name, value) in &score.parts {
                    let entry = self.parts.entry(name.clone()).or_default();
                    entry.0 += f64::from(*value);
                    entry.1 += 1;
                }
                let parts: serde_json::Map<String, serde_json::Value> =
                    score.parts.iter().map(|(name, value)| (name.clone(), (*value).into())).collect();
                serde_json::json!({
                    "line": number, "task_id": task.id, "reward": score.reward,
                    "parts": parts, "note": score.note, "micros": micros,
                })
            }
            Err(failure) => {
                *self.failures.entry(failure.kind).or_default() += 1;
                serde_json::json!({ "line": number, "task_id": task.id, "failure": failure, "micros": micros })
            }
        }
    }
}

/// A task and completion from one input line, or what is wrong with the line. With
/// `answers`, a line may be a task alone, and the completion is the task's answer.
fn parse_line(line: &str, answers: bool) -> Result<(Task, String), String> {
    let value: serde_json::Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    let object = value.as_object().ok_or("expected a JSON object with fields `task` and `completion`")?;
    let task = match object.get("task") {
        Some(task) => task.clone(),
        None if answers => value.clone(),
        None => return Err("missing field `task`".into()),
    };
    let task: Task = serde_json::from_value(task).map_err(|e| format!("field `task`: {e}"))?;
    if answers {
        let answer =
            task.answer.clone().ok_or_else(|| format!("task {} has no `answer` to score (--answers)", task.id))?;
        return Ok((task, answer));
    }
    let completion = match object.get("completion") {
        None => return Err("missing field `completion`".into()),
        Some(serde_json::Value::String(text)) => text.clone(),
        Some(other) => return Err(format!("field `completion`: expected a string, found {other}")),
    };
    Ok((task, completion))
}

/// Whether two paths name one file (also through links or `.`/`..`).
pub fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
