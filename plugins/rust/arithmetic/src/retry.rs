//! The retry episode's logic, apart from the bindings so that it is unit-tested natively.

/// What the environment says to one reply.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    Solved { attempt: u32 },
    Failed { attempts: u32 },
    TryAgain { feedback: String },
}

/// One episode's state: the answer and the attempts made and allowed.
pub struct Attempts {
    expected: i64,
    made: u32,
    allowed: u32,
}

impl Attempts {
    pub fn new(expected: i64, allowed: u32) -> Self {
        Attempts { expected, made: 0, allowed }
    }

    /// Judge a reply: its last `<answer>…</answer>` (else its last integer).
    pub fn answer(&mut self, reply: &str) -> Verdict {
        self.made += 1;
        let given = final_integer(reply);
        if given == Some(self.expected) {
            return Verdict::Solved { attempt: self.made };
        }
        if self.made >= self.allowed {
            return Verdict::Failed { attempts: self.made };
        }
        let feedback = match given {
            None => "I could not find your answer. Give the final number inside <answer></answer> tags.".to_string(),
            Some(n) if n > self.expected => {
                format!("{n} is too high. Try again: the final number inside <answer></answer> tags.")
            }
            Some(n) => format!("{n} is too low. Try again: the final number inside <answer></answer> tags."),
        };
        Verdict::TryAgain { feedback }
    }
}

/// The integer in the last `<answer>` block, else the last integer of the text.
pub fn final_integer(text: &str) -> Option<i64> {
    if let Some(start) = text.rfind("<answer>") {
        let inner = &text[start + "<answer>".len()..];
        let inner = inner.find("</answer>").map_or(inner, |end| &inner[..end]);
        return last_integer(inner);
    }
    last_integer(text)
}

fn last_integer(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    let mut end = bytes.len();
    while end > 0 && !bytes[end - 1].is_ascii_digit() {
        end -= 1;
    }
    if end == 0 {
        return None;
    }
    let mut start = end;
    while start > 0 && bytes[start - 1].is_ascii_digit() {
        start -= 1;
    }
    if start > 0 && bytes[start - 1] == b'-' {
        start -= 1;
    }
    text[start..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_found_tagged_or_bare() {
        assert_eq!(final_integer("<answer>12</answer>"), Some(12));
        assert_eq!(final_integer("so 3 + 4 = 7, <answer> -7 </answer> then 9"), Some(-7));
        assert_eq!(final_integer("it is 41, no 42"), Some(42));
        assert_eq!(final_integer("<answer>none</answer>"), None);
        assert_eq!(final_integer(""), None);
        assert_eq!(final_integer("99999999999999999999999"), None);
    }

    #[test]
    fn an_episode_gives_feedback_until_solved_or_out_of_attempts() {
        let mut episode = Attempts::new(7, 3);
        assert!(
            matches!(episode.answer("<answer>9</answer>"), Verdict::TryAgain { feedback } if feedback.contains("too high"))
        );
        assert!(matches!(episode.answer("no idea"), Verdict::TryAgain { feedback } if feedback.contains("<answer>")));
        assert_eq!(episode.answer("<answer>7</answer>"), Verdict::Solved { attempt: 3 });
        let mut episode = Attempts::new(7, 2);
        assert!(
            matches!(episode.answer("<answer>5</answer>"), Verdict::TryAgain { feedback } if feedback.contains("too low"))
        );
        assert_eq!(episode.answer("<answer>6</answer>"), Verdict::Failed { attempts: 2 });
        assert_eq!(Attempts::new(-3, 1).answer("<answer>-3</answer>"), Verdict::Solved { attempt: 1 });
    }
}
