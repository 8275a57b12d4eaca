//! Answer extraction and comparison, free of WIT types so that it is unit-tested natively.

/// The final answer found in a completion.
#[derive(Debug, PartialEq)]
pub struct Extracted {
    pub text: String,
    /// Whether it came from `<answer>` tags or `\boxed{}` rather than a bare number.
    pub tagged: bool,
}

/// The last `<answer>…</answer>`, else the last `\boxed{…}`, else the last number.
pub fn final_answer(completion: &str) -> Option<Extracted> {
    if let Some(text) = last_tagged(completion) {
        return Some(Extracted { text: text.trim().to_string(), tagged: true });
    }
    if let Some(text) = last_boxed(completion) {
        return Some(Extracted { text: text.trim().to_string(), tagged: true });
    }
    last_number(completion).map(|text| Extracted { text: text.to_string(), tagged: false })
}

fn last_tagged(text: &str) -> Option<&str> {
    const OPEN: &str = "<answer>";
    const CLOSE: &str = "</answer>";
    let close = text.rfind(CLOSE)?;
    let open = text[..close].rfind(OPEN)?;
    Some(&text[open + OPEN.len()..close])
}

fn last_boxed(text: &str) -> Option<&str> {
    const OPEN: &str = "\\boxed{";
    let mut search_end = text.len();
    // The last \boxed{ whose braces close; nested braces (\frac{1}{2}) are kept.
    while let Some(start) = text[..search_end].rfind(OPEN) {
        let body = start + OPEN.len();
        let mut depth = 1usize;
        for (i, c) in text[body..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(&text[body..body + i]);
                    }
                }
                _ => {}
            }
        }
        search_end = start;
    }
    None
}

/// The last number: an optional minus sign, digits with optional thousands commas, an
/// optional decimal part.
fn last_number(text: &str) -> Option<&str> {
    let bytes = text.as_bytes();
    let mut end = bytes.len();
    while end > 0 {
        // Find the last digit before `end`.
        let mut last_digit = None;
        for i in (0..end).rev() {
            if bytes[i].is_ascii_digit() {
                last_digit = Some(i);
                break;
            }
        }
        let last = last_digit?;
        let mut start = last;
        // Walk back over digits, one decimal point, and commas followed by three digits.
        let mut seen_point = false;
        while start > 0 {
            let prev = bytes[start - 1];
            if prev.is_ascii_digit() {
                start -= 1;
            } else if prev == b'.' && !seen_point && start >= 2 && bytes[start - 2].is_ascii_digit() {
                seen_point = true;
                start -= 1;
            } else if prev == b',' && start >= 2 && bytes[start - 2].is_ascii_digit() && group_of_three(bytes, start) {
                start -= 1;
            } else {
                break;
            }
        }
        if start > 0 && bytes[start - 1] == b'-' {
            start -= 1;
        }
        let candidate = &text[start..=last];
        if candidate.bytes().any(|b| b.is_ascii_digit()) {
            return Some(candidate);
        }
        end = start;
    }
    None
}

/// Whether exactly three digits start at `at` (then a non-digit or the end).
fn group_of_three(bytes: &[u8], at: usize) -> bool {
    bytes.len() >= at + 3
        && bytes[at..at + 3].iter().all(u8::is_ascii_digit)
        && bytes.get(at + 3).is_none_or(|b| !b.is_ascii_digit())
}

/// Equal as numbers within `tolerance`, or else as normalised text.
pub fn answers_match(found: &str, expected: &str, tolerance: f64) -> bool {
    match (parse_number(found), parse_number(expected)) {
        (Some(a), Some(b)) => (a - b).abs() <= tolerance,
        _ => normalise(found) == normalise(expected),
    }
}

/// A number written plainly (`-1,234.5`, `1e3`), as a fraction (`3/4`), with a leading `$`
/// or a trailing `%` or `.`.
pub fn parse_number(text: &str) -> Option<f64> {
    let t = text.trim().trim_end_matches('.').trim();
    let t = t.strip_prefix('$').unwrap_or(t).trim();
    let t = t.strip_suffix('%').unwrap_or(t).trim();
    if t.is_empty() {
        return None;
    }
    if let Some((num, den)) = t.split_once('/') {
        let (num, den) = (plain_number(num)?, plain_number(den)?);
        return (den != 0.0).then(|| num / den);
    }
    plain_number(t)
}

fn plain_number(text: &str) -> Option<f64> {
    let t: String = text.trim().chars().filter(|&c| c != ',').collect();
    // Rust also parses "inf" and "NaN"; an answer never means those.
    if !t.bytes().any(|b| b.is_ascii_digit()) || t.bytes().any(|b| b.is_ascii_alphabetic() && b != b'e' && b != b'E') {
        return None;
    }
    t.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// Lower case, `\text{}` and `$` removed, whitespace collapsed, a trailing period dropped.
pub fn normalise(text: &str) -> String {
    let t = text.replace("\\text{", "").replace(['$', '{', '}'], "");
    let t = t.trim().trim_end_matches('.');
    t.split_whitespace().collect::<Vec<_>>().join(" ").to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Option<(String, bool)> {
        final_answer(text).map(|e| (e.text, e.tagged))
    }

    #[test]
    fn extraction_prefers_tags_then_boxed_then_last_number() {
        assert_eq!(answer("so 3 <answer> 42 </answer> then 7"), Some(("42".into(), true)));
        assert_eq!(answer("<answer>1</answer> no, <answer>2</answer>"), Some(("2".into(), true)));
        assert_eq!(answer("it is \\boxed{\\frac{1}{2}} or 5"), Some(("\\frac{1}{2}".into(), true)));
        assert_eq!(answer("3 + 4 = 7."), Some(("7".into(), false)));
        assert_eq!(answer("total -1,234.5 dollars"), Some(("-1,234.5".into(), false)));
        assert_eq!(answer("items 1, 2, 3"), Some(("3".into(), false)));
        assert_eq!(answer("version 2.5."), Some(("2.5".into(), false)));
        assert_eq!(answer("nothing here"), None);
        assert_eq!(answer("<answer>open but never closed"), None);
        assert_eq!(answer(""), None);
    }

    #[test]
    fn comparison_is_numeric_then_textual() {
        assert!(answers_match("42.0", "42", 1e-6));
        assert!(answers_match("1,000", "1000", 1e-6));
        assert!(answers_match("$5", "5", 1e-6));
        assert!(answers_match("3/4", "0.75", 1e-6));
        assert!(!answers_match("41", "42", 1e-6));
        assert!(answers_match("41.9", "42", 0.2));
        assert!(answers_match("Paris.", "paris", 1e-6));
        assert!(answers_match("\\text{yes}", "Yes", 1e-6));
        assert!(!answers_match("about 42", "42", 1e-6));
        assert!(!answers_match("inf", "inf1", 1e-6));
    }
}
