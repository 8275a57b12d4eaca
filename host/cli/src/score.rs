//! `wirl score`: score JSONL completions with a reward plugin.
//!
//! Input line: `{"task": {...}, "completion": "..."}`. Output line: the score and its parts,
//! or the failure, with the call's duration. Bad input lines are reported by line number and
//! field, and the other lines are still scored.

use crate::PluginArgs;
use std::collections::BTreeMap;
use std::io::{BufRead, BufWriter, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use wirl_sandbox::{FailureKind, RewardPlugin, Task};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    plugin: PluginArgs,
    /// JSONL input; standard input when absent.
    #[arg(long)]
    input: Option<std::path::PathBuf>,
    /// JSONL output; standard output when absent.
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    /// Score each task's own reference `answer` as its completion: input lines may then be
    /// tasks alone (a dataset file). Checks a grader against its dataset.
    #[arg(long)]
    answers: bool,
}

/// `wirl score`: each input line scored and written as it is read. Over ~80 lines on purpose:
/// one loop whose every kind of bad line (not UTF-8, not JSON, not a task, a failed verdict)
/// is named and passed over in place, which reads best beside the good path.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let (Some(input), Some(output)) = (&args.input, &args.output)
        && same_file(input, output)
    {
        anyhow::bail!(
            "--output {} is the --input file: writing it would empty it before it is read; choose another path",
            output.display()
        );
    }
    let (_sandbox, plugin) = args.plugin.load()?;
    let mut reward = RewardPlugin::new(plugin.clone())?;
    let input: Box<dyn BufRead> = match &args.input {
        Some(path) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).map_err(|e| anyhow::anyhow!("cannot open --input {}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    };
    let mut output: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| anyhow::anyhow!("cannot create --output {}: {e}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };

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
            .and_then(|line| parse_line(line, args.answers));
        let record = match parsed {
            Ok((task, completion)) => {
                let call_started = Instant::now();
                let verdict = reward.score(&task, &completion);
                let took = call_started.elapsed();
                summary.durations.push(took);
                let micros = took.as_micros() as u64;
                match verdict {
                    Ok(score) => {
                        summary.scored += 1;
                        summary.reward_sum += f64::from(score.reward);
                        for (name, value) in &score.parts {
                            let entry = summary.parts.entry(name.clone()).or_default();
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
                        *summary.failures.entry(failure.kind).or_default() += 1;
                        serde_json::json!({
                            "line": number, "task_id": task.id, "failure": failure, "micros": micros,
                        })
                    }
                }
            }
            Err(problem) => {
                let message = format!("line {number}: {problem}");
                eprintln!("error: {message}");
                summary.bad_input += 1;
                serde_json::json!({ "line": number, "input_error": message })
            }
        };
        serde_json::to_writer(&mut output, &record)?;
        writeln!(output)?;
    }
    output.flush()?;
    summary.print(plugin.name(), plugin.sha256(), started.elapsed());
    let unscored = summary.lines - summary.scored;
    if unscored == 0 {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("{unscored} of {} lines were not scored", summary.lines);
        Ok(ExitCode::from(1))
    }
}

/// Whether two paths name one file (also through links or `.`/`..`).
fn same_file(a: &std::path::Path, b: &std::path::Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
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

#[derive(Default)]
struct Summary {
    lines: usize,
    scored: usize,
    bad_input: usize,
    failures: BTreeMap<FailureKind, usize>,
    reward_sum: f64,
    parts: BTreeMap<String, (f64, usize)>,
    durations: Vec<Duration>,
}

impl Summary {
    fn print(&mut self, plugin: &str, sha256: &str, total: Duration) {
        let failed: usize = self.failures.values().sum();
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "plugin      {plugin} (sha256 {})", &sha256[..12]);
        let _ = writeln!(err, "scored      {} of {} lines", self.scored, self.lines);
        let kinds: Vec<String> = self.failures.iter().map(|(kind, n)| format!("{} {n}", kind.name())).collect();
        let _ = writeln!(
            err,
            "failed      {failed}{}",
            if kinds.is_empty() { String::new() } else { format!("  ({})", kinds.join(", ")) }
        );
        let _ = writeln!(err, "bad input   {}", self.bad_input);
        if self.scored > 0 {
            let _ = writeln!(err, "reward      mean {:.4}", self.reward_sum / self.scored as f64);
            for (name, (sum, n)) in &self.parts {
                let _ = writeln!(err, "  {name:<9} mean {:.4}", sum / *n as f64);
            }
        }
        self.durations.sort();
        if let (Some(p50), Some(p99)) = (percentile(&self.durations, 0.5), percentile(&self.durations, 0.99)) {
            let _ = writeln!(err, "per call    p50 {p50:?}  p99 {p99:?}");
        }
        let _ = writeln!(err, "total       {total:.2?}");
    }
}

fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let at = ((sorted.len() - 1) as f64 * q).round() as usize;
    Some(sorted[at])
}
