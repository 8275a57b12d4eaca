//! `humaneval-grader`: does a completion pass its HumanEval task's tests?
//!
//! Reward 1 when every test passes, else 0 with the reason (`syntax error`, `assertion`,
//! `exception`, `timeout`, `memory`, `output limit`, `exited early`, `crashed`). Task
//! metadata: `{"prompt", "test", "entry_point"}` (examples/humaneval/HumanEval.jsonl).
//!
//! # Why the verdict cannot be forged
//! Model-written code and the tests never share an interpreter. Everything inside the
//! interpreter that runs model code is reachable by it (frames, `sys.settrace`, `gc`, code
//! constants, `atexit`, builtins), and so is everything that interpreter reports: exit
//! status, stdout, a secret. So nothing it reports is believed except, per argument list,
//! the value its function returned — and those values are then judged elsewhere:
//!
//! 1. **judge** (a fresh interpreter, no model code): runs the prompt and the task's test
//!    with `candidate` as a proxy. Unknown argument lists are recorded; a placeholder stands
//!    in for their answers, so one round finds every call that does not depend on another.
//! 2. **candidate** (a fresh interpreter): prompt + completion + a driver that calls the
//!    function on those argument lists and prints the results, encoded as plain data (exact
//!    builtin types only).
//! 3. **judge** again, answering from the results: with every answer known, the test's own
//!    asserts decide. New argument lists (a call that depends on an earlier answer) go back
//!    to step 2.
//!
//! The candidate program never sees the tests or the expected values, only arguments; a
//! forged or early `exit(0)`, a rebound `AssertionError`, a printed "passed" or an `atexit`
//! hook can at most claim return values, and claimed values pass only if they are right.
//! Each program runs in its own instance of the host's code-runner, in a store apart from
//! this grader's, under the runner's time, memory and output limits.
//!
//! Config: `timeout_ms` (per candidate run, default 3000, as HumanEval's harness),
//! `memory_mib` (default 256), `max_rounds` (default 10).

use serde::Deserialize;
use wirl_sdk::grader::{Grader, Limits, Outcome, Program, Score, Task, Termination, config};

mod program;

pub use program::{candidate_program, fenced_code};

const CODEC: &str = include_str!("codec.py");
const JUDGE: &str = include_str!("judge.py");
const DRIVER: &str = include_str!("candidate.py");
/// The module a humaneval runner has compiled in: codec, judge and driver, imported once at
/// its build (scripts/build-plugins), so that a run does not compile ~7 KB of Python again.
const COMPILED_IN: &str = "wirl_humaneval_judge";
const JUDGE_MARK: &str = "__WIRL_JUDGE__";
const RESULTS_MARK: &str = "__WIRL_RESULTS__";
/// The judge runs trusted code only; its limits are generous and fixed.
const JUDGE_WALL_MS: u32 = 30_000;

struct HumanEval;

impl Grader for HumanEval {
    fn score(task: Task, completion: String) -> Result<Score, String> {
        Self::score_group(task, vec![completion]).pop().expect("one result per completion")
    }

    fn score_group(task: Task, completions: Vec<String>) -> Vec<Result<Score, String>> {
        let prepared = Settings::load().and_then(|settings| Ok((settings, Problem::from_task(&task)?)));
        let (settings, problem) = match prepared {
            Ok(prepared) => prepared,
            Err(e) => return completions.iter().map(|_| Err(e.clone())).collect(),
        };
        let mut run = |program: &Program, limits: Limits| wirl_sdk::grader::run(program, limits);
        grade_group(&settings, &problem, &completions, &mut run)
    }
}

wirl_sdk::register_grader!(HumanEval);

/// Settings from the plugin's config.
pub struct Settings {
    pub timeout_ms: u32,
    pub memory_mib: u64,
    pub max_rounds: u32,
}

impl Settings {
    fn load() -> Result<Self, String> {
        Ok(Settings {
            timeout_ms: config::get_or("timeout_ms", 3_000)?,
            memory_mib: config::get_or("memory_mib", 256)?,
            max_rounds: config::get_or("max_rounds", 10)?,
        })
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings { timeout_ms: 3_000, memory_mib: 256, max_rounds: 10 }
    }
}

/// What the grader needs of a task.
#[derive(Deserialize)]
pub struct Problem {
    pub prompt: String,
    pub test: String,
    pub entry_point: String,
}

impl Problem {
    pub fn from_task(task: &Task) -> Result<Self, String> {
        let metadata = task.metadata.as_deref().ok_or_else(|| format!("task {} has no metadata", task.id))?;
        serde_json::from_str(metadata).map_err(|e| {
            format!("task {}: metadata must be a JSON object with prompt, test and entry_point: {e}", task.id)
        })
    }
}

/// Runs a program in a fresh interpreter: the host's code runner, or (in tests) anything else.
pub type Runner<'a> = dyn FnMut(&Program, Limits) -> Outcome + 'a;

/// A judge run's output: what it said and, where it compiled the task's prompt and guarded
/// test itself, that code (marshalled, base64) for the task's later judge runs to load
/// instead of parsing and compiling the test again. Only judge runs produce or read it: no
/// model-written code runs where it is made or used.
#[derive(Deserialize)]
struct JudgeOutput {
    #[serde(flatten)]
    says: JudgeSays,
    code: Option<String>,
}

/// What a judge run said.
#[derive(Deserialize)]
#[serde(untagged)]
enum JudgeSays {
    Pending { pending: Vec<String> },
    Verdict { verdict: String, reason: Option<String>, detail: Option<String> },
}

/// A verdict on one completion, or why it could not be graded at all.
pub fn grade_group(
    settings: &Settings,
    problem: &Problem,
    completions: &[String],
    run: &mut Runner<'_>,
) -> Vec<Result<Score, String>> {
    // Whether the runner has the judge compiled in: assumed, and found out by the first run.
    let mut judging = Judging { compiled_in: true, code: None };
    // The first judge round knows no answers, so it asks the same of every completion.
    let first = match judge(problem, &serde_json::Map::new(), &mut judging, run) {
        Ok(says) => says,
        Err(e) => return completions.iter().map(|_| Err(format!("the task's tests do not run: {e}"))).collect(),
    };
    completions
        .iter()
        .map(|completion| Ok(grade_one(settings, problem, completion, &first, &mut judging, run)))
        .collect()
}

/// What the judge runs of one task share: whether the runner has the judge compiled in, and
/// the task's code as the first judge run compiled it.
struct Judging {
    compiled_in: bool,
    code: Option<String>,
}

fn grade_one(
    settings: &Settings,
    problem: &Problem,
    completion: &str,
    first: &JudgeSays,
    judging: &mut Judging,
    run: &mut Runner<'_>,
) -> Score {
    let program = candidate_program(&problem.prompt, completion, &problem.entry_point);
    let mut memo = serde_json::Map::new();
    let mut pending = match first {
        JudgeSays::Verdict { verdict, reason, detail } => return verdict_score(verdict, reason, detail),
        JudgeSays::Pending { pending } => pending.clone(),
    };
    for _ in 0..settings.max_rounds {
        match call_candidate(settings, problem, &program, &pending, judging.compiled_in, run) {
            Ok(results) => {
                for (key, answer) in results {
                    // Only answers to what the judge asked are taken.
                    if pending.contains(&key) {
                        memo.insert(key, serde_json::Value::String(answer));
                    }
                }
            }
            Err((reason, detail)) => return fail(reason, &detail),
        }
        if let Some(missing) = pending.iter().find(|key| !memo.contains_key(*key)) {
            return fail("exited early", &format!("no result for the call with arguments {}", shorten(missing)));
        }
        match judge(problem, &memo, judging, run) {
            Ok(JudgeSays::Verdict { verdict, reason, detail }) => return verdict_score(&verdict, &reason, &detail),
            Ok(JudgeSays::Pending { pending: next }) => pending = next,
            Err(e) => return fail("judge", &format!("the tests could not judge the results: {e}")),
        }
    }
    fail("too many rounds", &format!("calls kept depending on earlier answers past {} rounds", settings.max_rounds))
}

fn judge(
    problem: &Problem,
    memo: &serde_json::Map<String, serde_json::Value>,
    judging: &mut Judging,
    run: &mut Runner<'_>,
) -> Result<JudgeSays, String> {
    let request = serde_json::json!({
        "prompt": problem.prompt, "test": problem.test, "entry_point": problem.entry_point, "memo": memo,
        "code": judging.code,
    });
    let compiled_in = &mut judging.compiled_in;
    let limits = Limits { wall_ms: JUDGE_WALL_MS, memory_bytes: 0, fuel: None, max_output_bytes: 0 };
    let mut outcome = None;
    if *compiled_in {
        let source = format!("import {COMPILED_IN}\n{COMPILED_IN}.main()\n");
        let tried = run(&Program::python(source, request.to_string()), limits);
        // A plain code runner: the judge's source goes whole, from now on.
        if matches!(tried.termination, Termination::Exited(1))
            && tried.stderr.contains(&format!("No module named '{COMPILED_IN}'"))
        {
            *compiled_in = false;
        } else {
            outcome = Some(tried);
        }
    }
    let outcome = match outcome {
        Some(outcome) => outcome,
        None => run(&Program::python(format!("{CODEC}\n{JUDGE}"), request.to_string()), limits),
    };
    match (&outcome.termination, last_marked(&outcome.stdout, JUDGE_MARK)) {
        (Termination::Exited(0), Some(line)) => {
            let output: JudgeOutput =
                serde_json::from_str(line).map_err(|e| format!("unreadable judge output ({e}): {}", shorten(line)))?;
            judging.code = judging.code.take().or(output.code);
            Ok(output.says)
        }
        (termination, _) => Err(format!("{} ({})", describe(termination), last_line(&outcome.stderr))),
    }
}

/// Run the candidate on `calls`; its answers by argument list, or why it gave none.
fn call_candidate(
    settings: &Settings,
    problem: &Problem,
    program: &str,
    calls: &[String],
    compiled_in: bool,
    run: &mut Runner<'_>,
) -> Result<Vec<(String, String)>, (&'static str, String)> {
    let source = if compiled_in {
        format!("{program}\n\nimport {COMPILED_IN} as _wirl_judge\n_wirl_judge._wirl_call_all(globals())\n")
    } else {
        format!("{program}\n\n{CODEC}\n{DRIVER}")
    };
    let request = serde_json::json!({ "entry_point": problem.entry_point, "calls": calls });
    let limits = Limits {
        wall_ms: settings.timeout_ms,
        memory_bytes: settings.memory_mib << 20,
        fuel: None,
        max_output_bytes: 0,
    };
    let outcome = run(&Program::python(source, request.to_string()), limits);
    let stderr = last_line(&outcome.stderr);
    match &outcome.termination {
        Termination::Exited(status) => match last_marked(&outcome.stdout, RESULTS_MARK) {
            Some(line) => serde_json::from_str(line).map_err(|e| ("exited early", format!("unreadable results: {e}"))),
            None if stderr.contains("SyntaxError") || stderr.contains("IndentationError") => {
                Err(("syntax error", stderr))
            }
            None if *status == 0 => {
                Err(("exited early", "the program ended before its function was called (status 0)".into()))
            }
            None => Err(("exception", stderr)),
        },
        Termination::TimedOut => Err(("timeout", format!("ran past {} ms", settings.timeout_ms))),
        Termination::OutOfFuel => Err(("timeout", "ran out of fuel".into())),
        Termination::OutOfMemory => Err(("memory", format!("needed more than {} MiB", settings.memory_mib))),
        Termination::OutputLimit => Err(("output limit", "printed more than the runner allows".into())),
        Termination::Crashed(how) => Err(("crashed", how.clone())),
    }
}

fn verdict_score(verdict: &str, reason: &Option<String>, detail: &Option<String>) -> Score {
    if verdict == "pass" {
        return Score::new(1.0).part("passed", 1.0).note("passed");
    }
    let reason = match reason.as_deref() {
        Some("assertion") => "assertion",
        Some("exception") => "exception",
        Some("memory") => "memory",
        _ => "judge",
    };
    fail(reason, detail.as_deref().unwrap_or(""))
}

fn fail(reason: &str, detail: &str) -> Score {
    Score::new(0.0).part("passed", 0.0).note(format!("{reason}: {}", shorten(detail)))
}

/// The text after the last line that starts with `mark`.
fn last_marked<'a>(stdout: &'a str, mark: &str) -> Option<&'a str> {
    stdout.lines().rev().find_map(|line| line.strip_prefix(mark))
}

fn last_line(text: &str) -> String {
    text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string()
}

fn shorten(text: &str) -> String {
    const MAX: usize = 300;
    if text.len() <= MAX {
        return text.to_string();
    }
    let mut end = MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn describe(termination: &Termination) -> String {
    match termination {
        Termination::Exited(status) => format!("exited with status {status}"),
        Termination::TimedOut => "timed out".into(),
        Termination::OutOfFuel => "ran out of fuel".into(),
        Termination::OutOfMemory => "ran out of memory".into(),
        Termination::OutputLimit => "printed too much".into(),
        Termination::Crashed(how) => format!("crashed: {how}"),
    }
}
