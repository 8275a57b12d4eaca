//! Where the answer is in a completion, found as Math-Verify finds it, by priority: the last
//! `\boxed{}` (or `\fbox{}`, or `<answer>` tags), "final answer is …", "answer: …", then the
//! last LaTeX block (`$…$`, `$$…$$`, `\[…\]`, `\(…\)`, a bare `\frac{a}{b}`) or plain number
//! or expression. Within a priority the candidate that ends last wins; the first candidate
//! that parses is the answer. Every scan is a single pass over the text (no regular
//! expressions that could backtrack on model output).

/// One place an answer might be.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    /// Lower is tried first.
    pub priority: u32,
    /// Byte offsets of the candidate in the completion.
    pub start: usize,
    pub end: usize,
    /// The text to parse (LaTeX or a plain expression).
    pub text: String,
    /// Whether it was marked as the answer (boxed or tagged).
    pub marked: bool,
}

/// Priorities, as Math-Verify's (TRL's `accuracy_reward` sets the boxed one to 0).
#[derive(Debug, Clone, Copy)]
pub struct Priorities {
    /// `\boxed{}`, `\fbox{}` and `<answer>` tags; `None` turns them off.
    pub boxed: Option<u32>,
}

impl Default for Priorities {
    fn default() -> Self {
        Priorities { boxed: Some(0) }
    }
}

const FINAL_ANSWER: u32 = 50;
const ANSWER_COLON: u32 = 100;
const ANSWER_WORD: u32 = 200;
const PLAIN: u32 = 300;

/// Every candidate answer in `text`, best first (by priority, then the one ending last).
pub fn candidates(text: &str, priorities: Priorities) -> Vec<Candidate> {
    let mut found = Vec::new();
    if let Some(p) = priorities.boxed {
        boxed(text, p, &mut found);
        tagged(text, p, &mut found);
    }
    let envs = latex_envs(text);
    let mut numbers = Vec::new();
    plain_numbers(text, PLAIN, &mut numbers);
    anchored(text, &envs, &numbers, &mut found);
    found.extend(envs);
    found.extend(numbers);
    found.sort_by(|a, b| a.priority.cmp(&b.priority).then(b.end.cmp(&a.end)).then(a.start.cmp(&b.start)));
    found
}

/// `\boxed{…}` and `\fbox{…}`, braces balanced in one pass. Several boxes separated only by
/// `,`/"and"/"or" are one answer of several values (`\boxed{1}, \boxed{2}`).
fn boxed(text: &str, priority: u32, found: &mut Vec<Candidate>) {
    let bytes = text.as_bytes();
    let mut boxes: Vec<(usize, usize, usize)> = Vec::new(); // (start, content start, end)
    let mut open: Vec<(usize, Option<usize>)> = Vec::new(); // brace stack: (content start, box start)
    let mut i = 0;
    while i < bytes.len() {
        let at_box = [&b"\\boxed"[..], &b"\\fbox"[..]].iter().find(|m| bytes[i..].starts_with(m)).map(|m| m.len());
        if let Some(len) = at_box {
            let mut j = i + len;
            while j < bytes.len() && bytes[j] == b' ' {
                j += 1;
            }
            if j < bytes.len() && bytes[j] == b'{' {
                open.push((j + 1, Some(i)));
                i = j + 1;
                continue;
            }
        }
        match bytes[i] {
            b'{' => open.push((i + 1, None)),
            b'}' => {
                if let Some((content, Some(start))) = open.pop() {
                    boxes.push((start, content, i));
                }
            }
            _ => {}
        }
        i += 1;
    }
    // A box never closed: Math-Verify takes up to the text's end.
    for (content, start) in open.iter().filter_map(|(c, s)| s.map(|s| (*c, s))) {
        boxes.push((start, content, bytes.len()));
    }
    // Outermost boxes only (a box inside another is part of it), in order.
    boxes.sort_by(|a, b| a.0.cmp(&b.0).then(b.2.cmp(&a.2)));
    let mut outer: Vec<(usize, usize, usize)> = Vec::new();
    for b in boxes {
        if outer.last().is_some_and(|o| b.0 < o.2) {
            continue;
        }
        outer.push(b);
    }
    let mut k = 0;
    while k < outer.len() {
        // Join boxes separated only by separators.
        let mut last = k;
        while last + 1 < outer.len()
            && outer[last].2 < outer[last + 1].0
            && only_separators(&text[outer[last].2 + 1..outer[last + 1].0])
            && last - k < 5
        {
            last += 1;
        }
        let joined: Vec<&str> = outer[k..=last].iter().map(|&(_, c, e)| &text[c..e]).collect();
        let body = if joined.len() == 1 { joined[0].to_string() } else { joined.join(", ") };
        found.push(Candidate {
            priority,
            start: outer[k].0,
            end: (outer[last].2 + 1).min(text.len()),
            text: body,
            marked: true,
        });
        k = last + 1;
    }
}

/// Whether the text between two answers only separates them: commas, "and", "or", spacing
/// commands, math delimiters.
fn only_separators(between: &str) -> bool {
    let mut rest = between.to_string();
    for noise in ["\\qquad", "\\quad", "\\text", "\\(", "\\)", "\\[", "\\]", "\\,", "$", "{", "}", ",", ".", ";"] {
        rest = rest.replace(noise, " ");
    }
    rest.split_whitespace().all(|w| w == "and" || w == "or")
}

/// `<answer>…</answer>`: its content, searched again (a box or a LaTeX block inside it wins).
fn tagged(text: &str, priority: u32, found: &mut Vec<Candidate>) {
    const OPEN: &str = "<answer>";
    const CLOSE: &str = "</answer>";
    let Some(close) = text.rfind(CLOSE) else { return };
    let Some(open) = text[..close].rfind(OPEN) else { return };
    let inner = &text[open + OPEN.len()..close];
    let text = match candidates(inner, Priorities { boxed: None }).into_iter().find(|c| c.priority < PLAIN) {
        Some(c) => c.text,
        None => strip_math_delimiters(inner.trim()).to_string(),
    };
    found.push(Candidate { priority, start: open, end: close + CLOSE.len(), text, marked: true });
}

/// The inside of `$…$`, `$$…$$`, `\[…\]` or `\(…\)` around a whole answer.
pub fn strip_math_delimiters(s: &str) -> &str {
    for (a, b) in [("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$")] {
        if let Some(inner) = s.strip_prefix(a).and_then(|r| r.strip_suffix(b))
            && !inner.trim().is_empty()
        {
            return inner;
        }
    }
    s
}

/// "final answer is X", "answer: X", "answer … X": the LaTeX block or number that follows
/// (found among `envs` and `numbers`, each sorted by start). Only the last anchors are
/// looked at, so a text of nothing but "answer" costs no more than a short one.
fn anchored(text: &str, envs: &[Candidate], numbers: &[Candidate], found: &mut Vec<Candidate>) {
    const LAST_ANCHORS: usize = 16;
    let lower = text.to_ascii_lowercase();
    // "final answer … is X" (the "is" within 100 bytes).
    for pos in lower.rmatch_indices("final answer").map(|(p, _)| p).take(LAST_ANCHORS) {
        let after = pos + "final answer".len();
        let window_end = floor_char(&lower, (after + 100).min(lower.len()));
        if let Some(is) = lower[after..window_end].find(" is").map(|p| p + after + 3)
            && let Some(c) = first_value(envs, numbers, is, 50, FINAL_ANSWER)
        {
            found.push(c);
        }
    }
    // "answer:" / "answer" followed within 50 bytes by a LaTeX block or a number (for a
    // number, the one after the last `=` within 100 bytes: `answer: x = 5` is 5). Both
    // compete as Math-Verify's patterns do: the one ending last wins.
    for pos in lower.rmatch_indices("answer").map(|(p, _)| p).take(LAST_ANCHORS) {
        let after = pos + "answer".len();
        let colon = lower[after..].trim_start_matches(['*', ' ']).starts_with(':');
        let priority = if colon { ANSWER_COLON } else { ANSWER_WORD };
        if let Some(c) = first_value(envs, &[], after, 50, priority) {
            found.push(c);
        }
        let window_end = floor_char(text, (after + 100).min(text.len()));
        let start = match text[after..window_end].rfind('=') {
            Some(eq) => after + eq + 1,
            None => after,
        };
        if let Some(c) = first_value(&[], numbers, start, 50, priority) {
            found.push(c);
        }
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The first LaTeX block or number starting within `window` bytes after `from`.
fn first_value(
    envs: &[Candidate],
    numbers: &[Candidate],
    from: usize,
    window: usize,
    priority: u32,
) -> Option<Candidate> {
    let first_at = |list: &[Candidate]| {
        let i = list.partition_point(|c| c.start < from);
        list.get(i).filter(|c| c.start < from + window).cloned()
    };
    let pick = match (first_at(envs), first_at(numbers)) {
        (Some(e), Some(n)) => {
            if e.start <= n.start {
                e
            } else {
                n
            }
        }
        (Some(e), None) => e,
        (None, Some(n)) => n,
        (None, None) => return None,
    };
    Some(Candidate { priority, ..pick })
}

/// LaTeX blocks: `$$…$$`, `\[…\]`, `$…$` (one line), `\(…\)`, and bare `\frac{a}{b}` of
/// numbers; with blocks joined by ",", "and", "or" into one answer of several values.
fn latex_envs(text: &str) -> Vec<Candidate> {
    let bytes = text.as_bytes();
    let mut envs: Vec<Candidate> = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let escaped = i > 0 && bytes[i - 1] == b'\\';
        let (open_len, close): (usize, &[u8]) = if !escaped && bytes[i..].starts_with(b"$$") {
            (2, b"$$")
        } else if bytes[i..].starts_with(b"\\[") {
            (2, b"\\]")
        } else if bytes[i..].starts_with(b"\\(") {
            (2, b"\\)")
        } else if !escaped && bytes[i] == b'$' && !(i > 0 && bytes[i - 1].is_ascii_digit()) {
            (1, b"$")
        } else if bytes[i..].starts_with(b"\\frac{") || bytes[i..].starts_with(b"-\\frac{") {
            if let Some(end) = numeric_frac_end(bytes, i) {
                envs.push(Candidate { priority: PLAIN, start: i, end, text: text[i..end].to_string(), marked: false });
                i = end;
                continue;
            }
            i += 1;
            continue;
        } else {
            i += 1;
            continue;
        };
        let body = i + open_len;
        let single_line = close == b"$" || close == b"\\)";
        let mut j = body;
        let mut end = None;
        while j < bytes.len() {
            if single_line && bytes[j] == b'\n' {
                break;
            }
            if bytes[j..].starts_with(close) && bytes[j - 1] != b'\\' && j > body {
                end = Some(j);
                break;
            }
            j += 1;
        }
        match end {
            Some(e) => {
                let mut stop = e + close.len();
                // A percent sign after the block belongs to it.
                let mut content = text[body..e].to_string();
                let rest = &text[stop..];
                let trimmed = rest.trim_start();
                for pct in ["\\%", "%", "percent"] {
                    if trimmed.starts_with(pct) {
                        stop += rest.len() - trimmed.len() + pct.len();
                        content.push_str("\\%");
                        break;
                    }
                }
                envs.push(Candidate { priority: PLAIN, start: i, end: stop, text: content, marked: false });
                i = stop;
            }
            None => i = body,
        }
    }
    join_adjacent(text, envs)
}

/// `\frac{12}{5}` of plain numbers at `i` (optionally negative): its end.
fn numeric_frac_end(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + if bytes[i] == b'-' { 1 } else { 0 } + "\\frac".len();
    for _ in 0..2 {
        if bytes.get(j) != Some(&b'{') {
            return None;
        }
        j += 1;
        let start = j;
        if bytes.get(j) == Some(&b'-') {
            j += 1;
        }
        while j < bytes.len() && (bytes[j].is_ascii_digit() || bytes[j] == b'.' || bytes[j] == b',') {
            j += 1;
        }
        if j == start || bytes.get(j) != Some(&b'}') {
            return None;
        }
        j += 1;
    }
    Some(j)
}

/// Blocks separated only by ",", "and", "or" become one candidate of several values.
fn join_adjacent(text: &str, envs: Vec<Candidate>) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut run = 0;
    for env in envs {
        if let Some(last) = out.last_mut()
            && run < 5
            && only_separators(&text[last.end..env.start])
            && !text[last.end..env.start].trim().is_empty()
        {
            last.text = format!("{}, {}", last.text, env.text);
            last.end = env.end;
            run += 1;
            continue;
        }
        run = 0;
        out.push(env);
    }
    out
}

/// Plain numbers and simple expressions (`1,000.5`, `$100`, `2,74`, `.4`, `50%`, `3/4`,
/// `2*(3+4)`), anchored as Math-Verify anchors them: at the start, after white space or
/// `=`, optionally after a currency sign. One pass over the bytes.
fn plain_numbers(text: &str, priority: u32, found: &mut Vec<Candidate>) {
    const CURRENCIES: [&str; 7] = ["$", "€", "£", "¥", "₹", "₽", "₩"];
    let bytes = text.as_bytes();
    let mut k = 0;
    while k < bytes.len() {
        let anchored = k == 0 || matches!(bytes[k - 1], b' ' | b'\t' | b'\n' | b'\r' | b'=' | b'*' | b'$' | b'(');
        if !anchored {
            k += 1;
            continue;
        }
        let currency = CURRENCIES.iter().find(|c| text[k..].starts_with(**c)).map_or(0, |c| c.len());
        let first = k + currency;
        if !(currency > 0 || matches!(bytes[k], b'0'..=b'9' | b'-' | b'.' | b'(')) {
            k += 1;
            continue;
        }
        // The longest run of expression characters.
        let mut end = first;
        while end < bytes.len() {
            let step = match bytes[end] {
                b'0'..=b'9' | b' ' | b'.' | b',' | b'+' | b'-' | b'*' | b'/' | b'^' | b'(' | b')' => 1,
                _ if text[end..].starts_with('×') || text[end..].starts_with('÷') => 2,
                _ => 0,
            };
            if step == 0 {
                break;
            }
            end += step;
        }
        // Trim what cannot end an answer: spaces, a full stop, commas, an operator.
        while end > first && matches!(bytes[end - 1], b' ' | b'.' | b',' | b'(' | b'-' | b'+' | b'*' | b'/' | b'^') {
            end -= 1;
        }
        let body = &text[first..end];
        if !body.bytes().any(|b| b.is_ascii_digit()) {
            k = end.max(k + 1);
            continue;
        }
        let mut value = normalize_plain_number(body);
        // A percent sign after it belongs to it.
        let mut stop = end;
        let after = &text[end..floor_char(text, (end + 12).min(text.len()))];
        let trimmed = after.trim_start();
        for pct in ["%", "percent", "pct"] {
            if trimmed.len() >= pct.len() && trimmed.as_bytes()[..pct.len()].eq_ignore_ascii_case(pct.as_bytes()) {
                stop = end + (after.len() - trimmed.len()) + pct.len();
                value.push('%');
                break;
            }
        }
        found.push(Candidate { priority, start: k, end: stop, text: value, marked: false });
        k = end.max(k + 1);
    }
}

/// A plain number as the parser reads it: thousands separators (`1,000`, `1 000`) dropped,
/// a decimal comma (`2,74`, `1000,99`) made a point; an expression left as it is.
pub fn normalize_plain_number(body: &str) -> String {
    let trimmed = body.trim();
    let is_number_text = trimmed.chars().all(|c| c.is_ascii_digit() || " ,.-".contains(c));
    if !is_number_text {
        return trimmed.to_string();
    }
    let digits_only: String = trimmed.chars().filter(|c| !c.is_whitespace()).collect();
    // One comma followed by other than three digits (or by three with a point before it) is
    // a decimal comma.
    // (`1, 2` with a space is two values, not 1.2.)
    if digits_only.matches(',').count() == 1 && !digits_only.contains('.') && !trimmed.contains(char::is_whitespace) {
        let (int, frac) = digits_only.split_once(',').expect("one comma");
        if frac.len() != 3 || int.trim_start_matches('-').len() > 3 || int.trim_start_matches('-').starts_with('0') {
            return format!("{int}.{frac}");
        }
    }
    // Thousands separators: spaces and commas between groups of three.
    let groups: Vec<&str> = trimmed.split([',', ' ']).filter(|g| !g.is_empty()).collect();
    if groups.len() > 1 && groups[1..].iter().all(|g| g.len() == 3 || g.len() > 3 && g.as_bytes()[3] == b'.') {
        return groups.concat();
    }
    if groups.len() > 1 {
        // Not thousands: several numbers (`3, 4`).
        return groups.join(", ");
    }
    digits_only
}

#[cfg(test)]
mod tests {
    use super::*;

    fn best(text: &str) -> String {
        candidates(text, Priorities::default()).first().map(|c| c.text.clone()).unwrap_or_default()
    }

    #[test]
    fn boxed_wins_and_the_last_is_taken() {
        assert_eq!(best("so $x=2$ and \\boxed{3} then \\boxed{\\frac{1}{2}}."), "\\frac{1}{2}");
        assert_eq!(best("\\boxed{1}, \\boxed{2}"), "1, 2");
        assert_eq!(best("\\boxed{\\boxed{4}}"), "\\boxed{4}");
        assert_eq!(best("<answer>$\\frac{3}{4}$</answer>"), "\\frac{3}{4}");
    }

    #[test]
    fn plain_numbers_and_latex_blocks() {
        assert_eq!(best("The total is $1,000.99"), "1000.99");
        assert_eq!(best("Soucis : 2,74 $ a.."), "2.74");
        assert_eq!(best("it is .4"), ".4");
        assert_eq!(best("we get $\\frac{10}{9}$ here"), "\\frac{10}{9}");
        assert_eq!(best("the answer is 50%"), "50%");
        assert_eq!(best("7,425,000"), "7425000");
        assert_eq!(best("1 000"), "1000");
        assert_eq!(normalize_plain_number("2,74"), "2.74");
        assert_eq!(normalize_plain_number("1, 2"), "1, 2");
    }

    #[test]
    fn scans_of_hostile_text_stay_bounded() {
        let hostile = "\\boxed{".repeat(200_000);
        // One outermost box, not 200,000 nested copies of the text (that ran out of memory).
        assert_eq!(candidates(&hostile, Priorities::default()).len(), 1);
        let dollars = "$a".repeat(200_000);
        // One candidate per `$a$` block, none overlapping.
        assert_eq!(candidates(&dollars, Priorities::default()).len(), 100_000);
        // Words with nothing after them: no candidate, and only the last anchors looked at.
        let answers = "answer ".repeat(50_000);
        assert!(candidates(&answers, Priorities::default()).is_empty());
    }
}
