//! `code-tests`: does a completion's program give the expected output on every test case?
//! The stdin/stdout judging of CodeContests, APPS, TACO and LiveCodeBench style tasks, as
//! verl's `sandbox_fusion` reward and their own harnesses do it: the program runs once per
//! case in a fresh instance of the host's code runner, the case's input on stdin; the first
//! case that fails stops the grading.
//!
//! Reward 1 when every case passes, else 0 (or the fraction passed before the first failure,
//! with `partial_credit`); parts `passed` (that fraction) and `cases`; the note says which
//! case failed and how (`wrong answer`, `runtime error`, `timeout`, `memory`, `output limit`,
//! `crashed`). The program is the completion's last fenced code block, else the whole
//! completion.
//!
//! Task metadata (JSON), any of: `{"tests": [{"input", "output"}, ...]}`; `{"inputs": [...],
//! "outputs": [...]}` (verl's `in_outs`); `{"input_output": "<that object as a JSON
//! string>"}` (APPS, TACO). Optional `"language"` (`python`, `javascript`, ...: the runner's)
//! and `"time_limit_ms"` per case.
//!
//! Output is compared as the harnesses do: line by line with trailing whitespace removed and
//! trailing empty lines dropped (`"5\n"` equals `"5"`, `"1 2 \n"` equals `"1 2"`).
//!
//! Config: `timeout_ms` (per case, default 6000), `memory_mib` (default 256), `language`
//! (default `python`), `max_cases` (default 200: a task with more is refused, not cut),
//! `partial_credit` (default false).

use serde::Deserialize;
use serde_json::Value;
use wirl_sdk::grader::{Grader, Limits, Outcome, Program, Score, Task, Termination, config};

struct CodeTests;

impl Grader for CodeTests {
    fn score(task: Task, completion: String) -> Result<Score, String> {
        let settings = Settings::load()?;
        let problem = Problem::from_task(&task, &settings)?;
        Ok(grade(&settings, &problem, &completion, &mut |program, limits| wirl_sdk::grader::run(program, limits)))
    }
}

wirl_sdk::register_grader!(CodeTests);

/// Settings from the plugin's config.
pub struct Settings {
    pub timeout_ms: u32,
    pub memory_mib: u64,
    pub language: String,
    pub max_cases: usize,
    pub partial_credit: bool,
}

impl Settings {
    fn load() -> Result<Self, String> {
        let defaults = Settings::default();
        Ok(Settings {
            timeout_ms: config::get_or("timeout_ms", defaults.timeout_ms)?,
            memory_mib: config::get_or("memory_mib", defaults.memory_mib)?,
            language: config::get_or("language", defaults.language)?,
            max_cases: config::get_or("max_cases", defaults.max_cases)?,
            partial_credit: config::get_or("partial_credit", defaults.partial_credit)?,
        })
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            timeout_ms: 6_000,
            memory_mib: 256,
            language: "python".into(),
            max_cases: 200,
            partial_credit: false,
        }
    }
}

/// One test case.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Case {
    pub input: String,
    pub output: String,
}

/// What the grader needs of a task.
#[derive(Debug, PartialEq)]
pub struct Problem {
    pub cases: Vec<Case>,
    pub language: String,
    pub timeout_ms: u32,
}

impl Problem {
    pub fn from_task(task: &Task, settings: &Settings) -> Result<Self, String> {
        let metadata = task.metadata.as_deref().ok_or_else(|| format!("task {} has no metadata", task.id))?;
        let meta: Value = serde_json::from_str(metadata)
            .map_err(|e| format!("task {}: metadata must be a JSON object with test cases: {e}", task.id))?;
        let cases = cases_of(&meta).map_err(|e| format!("task {}: {e}", task.id))?;
        if cases.is_empty() {
            return Err(format!(
                "task {}: no test cases (metadata `tests`, `inputs`/`outputs` or `input_output`)",
                task.id
            ));
        }
        if cases.len() > settings.max_cases {
            return Err(format!(
                "task {}: {} test cases, more than max_cases = {} (raise it in the plugin's config)",
                task.id,
                cases.len(),
                settings.max_cases
            ));
        }
        let language = meta.get("language").and_then(Value::as_str).unwrap_or(&settings.language).to_string();
        let timeout_ms = match meta.get("time_limit_ms") {
            None | Some(Value::Null) => settings.timeout_ms,
            Some(limit) => {
                limit.as_u64().and_then(|ms| u32::try_from(ms).ok()).filter(|ms| *ms > 0).ok_or_else(|| {
                    format!("task {}: time_limit_ms must be a whole number of milliseconds above 0", task.id)
                })?
            }
        };
        Ok(Problem { cases, language, timeout_ms })
    }
}

/// The cases in any of the shapes the datasets use.
fn cases_of(meta: &Value) -> Result<Vec<Case>, String> {
    if let Some(tests) = meta.get("tests") {
        return serde_json::from_value(tests.clone())
            .map_err(|e| format!("`tests` must be a list of {{\"input\", \"output\"}}: {e}"));
    }
    if let Some(Value::String(text)) = meta.get("input_output") {
        let inner: Value =
            serde_json::from_str(text).map_err(|e| format!("`input_output` must hold JSON text: {e}"))?;
        return cases_of(&inner);
    }
    match (meta.get("inputs"), meta.get("outputs")) {
        (Some(Value::Array(inputs)), Some(Value::Array(outputs))) => {
            if inputs.len() != outputs.len() {
                return Err(format!("{} inputs but {} outputs", inputs.len(), outputs.len()));
            }
            inputs
                .iter()
                .zip(outputs)
                .map(|(input, output)| Ok(Case { input: text(input)?, output: text(output)? }))
                .collect()
        }
        (None, None) => Ok(Vec::new()),
        _ => Err("`inputs` and `outputs` must both be lists".into()),
    }
}

/// A case's input or output: a string, or a list of lines (as some datasets store them).
fn text(value: &Value) -> Result<String, String> {
    match value {
        Value::String(text) => Ok(text.clone()),
        Value::Array(lines) => {
            let lines: Option<Vec<&str>> = lines.iter().map(Value::as_str).collect();
            lines.map(|lines| lines.join("\n") + "\n").ok_or_else(|| "a list input or output must hold strings".into())
        }
        other => Ok(other.to_string()),
    }
}

/// The program in a completion: its last fenced code block (an unclosed one runs to the end,
/// as a reply cut at its token limit does), else the whole completion.
pub fn program_of(completion: &str) -> &str {
    let mut fences: Vec<usize> = completion.match_indices("```").map(|(i, _)| i).collect();
    if fences.is_empty() {
        return completion;
    }
    // An odd count: the last block was never closed.
    if fences.len() % 2 == 1 {
        fences.push(completion.len());
    }
    let (open, close) = (fences[fences.len() - 2], fences[fences.len() - 1]);
    let after_tag = completion[open + 3..close].find('\n').map_or(close, |i| open + 3 + i + 1);
    &completion[after_tag.min(close)..close]
}

/// Output as the harnesses compare it.
pub fn normalized(text: &str) -> Vec<&str> {
    let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    while lines.last().is_some_and(|line| line.is_empty()) {
        lines.pop();
    }
    lines
}

/// Runs a program in a fresh interpreter: the host's code runner, or (in tests) anything else.
pub type Runner<'a> = dyn FnMut(&Program, Limits) -> Outcome + 'a;

/// The verdict on one completion.
pub fn grade(settings: &Settings, problem: &Problem, completion: &str, run: &mut Runner<'_>) -> Score {
    let code = program_of(completion);
    let total = problem.cases.len();
    let scored = |passed: usize, note: String| {
        let fraction = passed as f32 / total as f32;
        let reward = if passed == total {
            1.0
        } else if settings.partial_credit {
            fraction
        } else {
            0.0
        };
        Score::new(reward).part("passed", fraction).part("cases", total as f32).note(note)
    };
    if code.trim().is_empty() {
        return scored(0, "no code in the completion".into());
    }
    let limits = Limits {
        wall_ms: problem.timeout_ms,
        memory_bytes: settings.memory_mib << 20,
        fuel: None,
        max_output_bytes: 0,
    };
    for (index, case) in problem.cases.iter().enumerate() {
        let program = Program {
            language: problem.language.clone(),
            source: code.to_string(),
            stdin: case.input.clone(),
            args: Vec::new(),
        };
        let outcome = run(&program, limits);
        let failure = match &outcome.termination {
            Termination::Exited(0) if normalized(&outcome.stdout) == normalized(&case.output) => None,
            Termination::Exited(0) => Some(format!(
                "wrong answer (expected {:?}, got {:?})",
                shorten(case.output.trim_end()),
                shorten(outcome.stdout.trim_end())
            )),
            Termination::Exited(code) => {
                Some(format!("runtime error (exit {code}): {}", shorten(last_line(&outcome.stderr))))
            }
            Termination::TimedOut | Termination::OutOfFuel => Some(format!("timeout ({} ms)", problem.timeout_ms)),
            Termination::OutOfMemory => Some(format!("memory ({} MiB)", settings.memory_mib)),
            Termination::OutputLimit => Some("output limit".into()),
            Termination::Crashed(how) => Some(format!("crashed: {}", shorten(how))),
        };
        if let Some(failure) = failure {
            return scored(index, format!("case {} of {total}: {failure}", index + 1));
        }
    }
    scored(total, format!("all {total} cases passed"))
}

fn last_line(text: &str) -> &str {
    text.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("")
}

fn shorten(text: &str) -> String {
    const MAX: usize = 120;
    if text.chars().count() <= MAX {
        return text.to_string();
    }
    text.chars().take(MAX).collect::<String>() + "…"
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(metadata: &str) -> Task {
        Task { id: "t".into(), messages: Vec::new(), answer: None, metadata: Some(metadata.into()) }
    }

    fn problem(metadata: &str) -> Result<Problem, String> {
        Problem::from_task(&task(metadata), &Settings::default())
    }

    fn ran(termination: Termination, stdout: &str, stderr: &str) -> Outcome {
        Outcome { termination, stdout: stdout.into(), stderr: stderr.into(), truncated: false, duration_ms: 1 }
    }

    #[test]
    fn every_dataset_shape_reads_to_the_same_cases() {
        let want = vec![Case { input: "1 2\n".into(), output: "3\n".into() }];
        assert_eq!(problem(r#"{"tests": [{"input": "1 2\n", "output": "3\n"}]}"#).unwrap().cases, want);
        assert_eq!(problem(r#"{"inputs": ["1 2\n"], "outputs": ["3\n"]}"#).unwrap().cases, want);
        assert_eq!(
            problem(r#"{"input_output": "{\"inputs\": [\"1 2\\n\"], \"outputs\": [\"3\\n\"]}"}"#).unwrap().cases,
            want
        );
        assert_eq!(problem(r#"{"inputs": [["1 2"]], "outputs": [["3"]]}"#).unwrap().cases, want);
        let read =
            problem(r#"{"tests": [{"input": "", "output": ""}], "language": "javascript", "time_limit_ms": 500}"#);
        assert_eq!(read.map(|p| (p.language, p.timeout_ms)), Ok(("javascript".into(), 500)));
    }

    #[test]
    fn bad_metadata_is_refused_naming_what_is_wrong() {
        for (metadata, says) in [
            ("not json", "JSON object"),
            ("{}", "no test cases"),
            (r#"{"inputs": ["1"], "outputs": []}"#, "1 inputs but 0 outputs"),
            (r#"{"inputs": ["1"]}"#, "both be lists"),
            (r#"{"tests": "x"}"#, "`tests` must be"),
            (r#"{"tests": [{"input": "", "output": ""}], "time_limit_ms": -1}"#, "time_limit_ms"),
        ] {
            let error = problem(metadata).unwrap_err();
            assert!(error.contains(says), "{metadata}: {error}");
        }
        let many = format!(r#"{{"inputs": {0}, "outputs": {0}}}"#, serde_json::json!(vec!["1"; 201]));
        assert!(problem(&many).unwrap_err().contains("max_cases = 200"));
    }

    #[test]
    fn the_program_is_the_last_fenced_block() {
        assert_eq!(program_of("print(1)"), "print(1)");
        assert_eq!(program_of("Here:\n```python\nprint(1)\n```\nand better:\n```py\nprint(2)\n```\n"), "print(2)\n");
        assert_eq!(program_of("```python\nprint(3)\n"), "print(3)\n", "an unclosed block runs to the end");
    }

    #[test]
    fn output_compares_as_the_harnesses_do() {
        assert_eq!(normalized("3\n"), normalized("3"));
        assert_eq!(normalized("1 2 \n\n\n"), normalized("1 2"));
        assert_ne!(normalized("1\n2"), normalized("1 2"));
    }

    #[test]
    fn the_first_failure_stops_and_says_which_and_how() {
        let problem = problem(r#"{"inputs": ["1", "2", "3"], "outputs": ["1", "4", "9"]}"#).unwrap();
        let mut calls = 0;
        let mut squares = |program: &Program, _: Limits| {
            calls += 1;
            let n: i64 = program.stdin.trim().parse().unwrap();
            if n == 2 {
                ran(Termination::Exited(0), "5\n", "")
            } else {
                ran(Termination::Exited(0), &format!("{}\n", n * n), "")
            }
        };
        let score = grade(&Settings::default(), &problem, "```python\nx\n```", &mut squares);
        assert_eq!(calls, 2, "the third case is not run");
        assert_eq!(score.reward, 0.0);
        assert!(score.note.as_deref().unwrap().starts_with("case 2 of 3: wrong answer"), "{:?}", score.note);
        let partial = Settings { partial_credit: true, ..Settings::default() };
        let mut timed_out = |_: &Program, _: Limits| ran(Termination::TimedOut, "", "");
        let score = grade(&partial, &problem, "x", &mut timed_out);
        assert_eq!((score.reward, score.note.as_deref()), (0.0, Some("case 1 of 3: timeout (6000 ms)")));
        let mut right = |program: &Program, _: Limits| {
            let n: i64 = program.stdin.trim().parse().unwrap();
            ran(Termination::Exited(0), &format!("{} \n\n", n * n), "")
        };
        assert_eq!(grade(&partial, &problem, "x", &mut right).reward, 1.0);
        let mut failing = |_: &Program, _: Limits| ran(Termination::Exited(1), "", "Traceback\nValueError: bad\n");
        let score = grade(&Settings::default(), &problem, "x", &mut failing);
        assert_eq!(score.note.as_deref(), Some("case 1 of 3: runtime error (exit 1): ValueError: bad"));
        let mut never = |_: &Program, _: Limits| -> Outcome { panic!("nothing to run") };
        assert_eq!(
            grade(&Settings::default(), &problem, "```python\n```", &mut never).note.as_deref(),
            Some("no code in the completion")
        );
    }
}
