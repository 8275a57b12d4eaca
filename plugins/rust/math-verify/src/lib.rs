//! `math-verify`: is the model's answer to a math task the task's answer, judged as
//! Math-Verify (the verifier TRL's `accuracy_reward`, open-r1 and most GRPO recipes use)
//! judges it — LaTeX, sets, tuples, intervals, inequalities, equations, matrices, units and
//! percentages — without sympy and bounded by construction.
//!
//! Pipeline: [`extract`] finds the answer (the last `\boxed{}` first, then "final answer
//! is", "answer:", the last LaTeX block or number), [`parse`] reads it into an [`Expr`],
//! [`equiv`] compares it with the task's answer read the same way. Every step is linear or
//! close to it in the answer's length, with caps (length, depth, digits, set sizes) past
//! which the verdict is `too_large`, never a long computation.
//!
//! Config (WIT level, the `[[rewards]]` table): `float_rounding` (decimal places floats are
//! rounded to, 0..=15, default 6), `boxed_priority` (0: boxed answers first, as TRL sets it;
//! -1: boxes not looked for; default 0), `format_weight` (added × 1 when the answer was boxed
//! or tagged, default 0), `gold` (`"answer"`: the task's answer is an answer, read whole,
//! default; `"extract"`: it is a solution text, its answer found as a completion's is),
//! `allow_set_relation_comp` (a gold interval accepts `x \ge 1`; default false, as in
//! Math-Verify).

pub mod equiv;
pub mod expr;
pub mod extract;
pub mod hostile;
pub mod number;
pub mod parse;

pub use expr::Expr;

/// Why a completion scored what it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Equal,
    NotEqual,
    /// No answer found in the completion.
    NoAnswer,
    /// An answer was found but is not an expression this verifier reads.
    Unparsed,
    /// The answer (or the comparison) is past the caps.
    TooLarge,
    /// The task's own answer could not be read.
    GoldUnparsed,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Equal => "equal",
            Verdict::NotEqual => "not_equal",
            Verdict::NoAnswer => "no_answer",
            Verdict::Unparsed => "unparsed",
            Verdict::TooLarge => "too_large",
            Verdict::GoldUnparsed => "gold_unparsed",
        }
    }
}

/// How the verifier reads and compares.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub compare: equiv::Options,
    pub priorities: extract::Priorities,
    /// Whether the gold is an answer to read whole (else a text to extract from).
    pub gold_is_answer: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            compare: equiv::Options::default(),
            priorities: extract::Priorities::default(),
            gold_is_answer: true,
        }
    }
}

/// One answer read from a text: the parsed value (when one parsed) and the text of the
/// first candidate (compared as a string, as Math-Verify's fallback is).
#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub parsed: Option<Expr>,
    pub text: Option<String>,
    pub marked: bool,
    /// Why nothing parsed, when nothing did.
    pub failure: Option<parse::ParseError>,
}

/// The answer in a completion (or a solution text).
pub fn read_completion(text: &str, settings: &Settings) -> Reading {
    let mut reading = Reading::default();
    for candidate in extract::candidates(text, settings.priorities) {
        if reading.text.is_none() {
            reading.text = Some(candidate.text.trim().to_string());
            reading.marked = candidate.marked;
        }
        match parse::parse(&candidate.text) {
            Ok(expr) => {
                reading.parsed = Some(expr);
                reading.marked = candidate.marked;
                reading.failure = None;
                return reading;
            }
            Err(e) => {
                // A cap hit is remembered over a plain failure: it is the more useful reason.
                if !matches!(reading.failure, Some(parse::ParseError::TooLarge(_))) {
                    reading.failure = Some(e);
                }
            }
        }
    }
    reading
}

/// The task's answer: read whole (without `$` delimiters) when it parses and the settings say
/// it is an answer; else found as in a completion.
pub fn read_gold(text: &str, settings: &Settings) -> Reading {
    if settings.gold_is_answer && !text.contains("\\boxed") && !text.contains("<answer>") {
        let whole = extract::strip_math_delimiters(text.trim()).trim();
        // A plain number reads as a completion's would (`1,22` is 1.22, `1 000` is 1000).
        let number = whole.chars().all(|c| c.is_ascii_digit() || " ,.-".contains(c));
        let owned;
        let whole = if number {
            owned = extract::normalize_plain_number(whole);
            owned.as_str()
        } else {
            whole
        };
        if let Ok(expr) = parse::parse(whole) {
            return Reading { parsed: Some(expr), text: Some(whole.to_string()), marked: false, failure: None };
        }
    }
    read_completion(text, settings)
}

/// The judgement of one completion against one gold answer.
#[derive(Debug, Clone)]
pub struct Judgement {
    pub verdict: Verdict,
    pub gold: Reading,
    pub pred: Reading,
    /// Why the comparison stopped, when it did (`too_large`).
    pub detail: Option<String>,
}

impl Judgement {
    pub fn correct(&self) -> bool {
        self.verdict == Verdict::Equal
    }
}

/// Whether `completion` answers `gold`: Math-Verify's `verify(parse(gold), parse(pred))`.
pub fn judge(gold: &str, completion: &str, settings: &Settings) -> Judgement {
    judge_read(&read_gold(gold, settings), completion, settings)
}

/// [`judge`] with the gold already read (once for a group of completions of one task).
pub fn judge_read(gold: &Reading, completion: &str, settings: &Settings) -> Judgement {
    let gold = gold.clone();
    let pred = read_completion(completion, settings);
    let mut judgement = Judgement { verdict: Verdict::NotEqual, gold, pred, detail: None };
    // The texts as strings first (Math-Verify's string fallback), then the values.
    if let (Some(g), Some(p)) = (&judgement.gold.text, &judgement.pred.text)
        && !g.is_empty()
        && g == p
    {
        judgement.verdict = Verdict::Equal;
        return judgement;
    }
    let (Some(g), Some(p)) = (&judgement.gold.parsed, &judgement.pred.parsed) else {
        judgement.verdict = if judgement.gold.parsed.is_none() {
            Verdict::GoldUnparsed
        } else if judgement.pred.text.is_none() {
            Verdict::NoAnswer
        } else if matches!(judgement.pred.failure, Some(parse::ParseError::TooLarge(_))) {
            Verdict::TooLarge
        } else {
            Verdict::Unparsed
        };
        judgement.detail = judgement.pred.failure.as_ref().map(|e| format!("{e:?}"));
        return judgement;
    };
    match equiv::equal(g, p, &settings.compare) {
        Ok(true) => judgement.verdict = Verdict::Equal,
        Ok(false) => judgement.verdict = Verdict::NotEqual,
        Err(equiv::TooLarge(why)) => {
            judgement.verdict = Verdict::TooLarge;
            judgement.detail = Some(why);
        }
    }
    judgement
}

#[cfg(target_arch = "wasm32")]
mod plugin {
    use super::{Reading, Settings, equiv, extract, judge_read, read_gold};
    use wirl_sdk::reward::{Reward, Score, Task, config};

    struct MathVerify;

    impl Reward for MathVerify {
        fn score(task: Task, completion: String) -> Result<Score, String> {
            let (settings, format_weight) = load()?;
            let gold = gold_of(&task, &settings)?;
            Ok(score_one(&settings, format_weight, &gold, &completion))
        }

        fn score_group(task: Task, completions: Vec<String>) -> Vec<Result<Score, String>> {
            // The task's answer is read once for the group.
            let loaded = load().and_then(|(settings, weight)| Ok((gold_of(&task, &settings)?, settings, weight)));
            match loaded {
                Ok((gold, settings, weight)) => {
                    completions.iter().map(|c| Ok(score_one(&settings, weight, &gold, c))).collect()
                }
                Err(e) => completions.iter().map(|_| Err(e.clone())).collect(),
            }
        }
    }

    fn load() -> Result<(Settings, f32), String> {
        let float_rounding: i64 = config::get_or("float_rounding", 6)?;
        if !(0..=15).contains(&float_rounding) {
            return Err(format!("config key float_rounding is {float_rounding}; give 0 to 15 decimal places"));
        }
        let boxed: i64 = config::get_or("boxed_priority", 0)?;
        let boxed = match boxed {
            -1 => None,
            0..=1000 => Some(boxed as u32),
            other => return Err(format!("config key boxed_priority is {other}; give -1 (off) or 0 to 1000")),
        };
        let gold: String = config::get_or("gold", "answer".to_string())?;
        let gold_is_answer = match gold.as_str() {
            "answer" => true,
            "extract" => false,
            other => return Err(format!("config key gold is {other:?}; give \"answer\" or \"extract\"")),
        };
        let set_relation: bool = config::get_or("allow_set_relation_comp", false)?;
        let format_weight: f32 = config::get_or("format_weight", 0.0)?;
        if !format_weight.is_finite() || format_weight.abs() > 1e6 {
            return Err(format!("config key format_weight is {format_weight}; give a finite number within ±1e6"));
        }
        let settings = Settings {
            compare: equiv::Options {
                float_rounding: float_rounding as u32,
                set_relation,
                ..equiv::Options::default()
            },
            priorities: extract::Priorities { boxed },
            gold_is_answer,
        };
        Ok((settings, format_weight))
    }

    /// The task's answer, read; a task whose answer cannot be read fails its calls.
    fn gold_of(task: &Task, settings: &Settings) -> Result<Reading, String> {
        let gold = task.answer.as_deref().ok_or_else(|| format!("task {} has no answer to compare with", task.id))?;
        let reading = read_gold(gold, settings);
        if reading.parsed.is_none() {
            return Err(format!(
                "task {}: its answer {:?} is not an expression math-verify reads ({})",
                task.id,
                truncate(gold, 80),
                reading.failure.as_ref().map_or("no answer found".to_string(), |e| format!("{e:?}"))
            ));
        }
        Ok(reading)
    }

    fn score_one(settings: &Settings, format_weight: f32, gold: &Reading, completion: &str) -> Score {
        let judgement = judge_read(gold, completion, settings);
        let correct = if judgement.correct() { 1.0 } else { 0.0 };
        let format = if judgement.pred.marked { 1.0 } else { 0.0 };
        let mut note = judgement.verdict.name().to_string();
        if let Some(answer) = &judgement.pred.text {
            note.push_str(&format!("; answer: {}", truncate(answer, 80)));
        }
        if let Some(detail) = &judgement.detail {
            note.push_str(&format!("; {}", truncate(detail, 120)));
        }
        let mut score = Score::new(correct + format_weight * format).part("correct", correct).part("format", format);
        // Why not, as a part of its own (`too_large`, `unparsed`, ...): its mean over a run is
        // the share of answers that failed that way.
        if !judgement.correct() {
            score = score.part(judgement.verdict.name(), 1.0);
        }
        score.note(note)
    }

    fn truncate(text: &str, max_chars: usize) -> &str {
        match text.char_indices().nth(max_chars) {
            Some((at, _)) => &text[..at],
            None => text,
        }
    }

    wirl_sdk::register_reward!(MathVerify);
}
