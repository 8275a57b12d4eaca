//! The program a completion becomes: the task's prompt followed by the model's code.

/// The candidate program for `completion`: a fenced code block is taken out of a chat
/// reply; code that defines `entry_point` itself follows the prompt whole (redefining the
/// prompt's docstring-only stand-in), anything else continues the prompt as its body.
pub fn candidate_program(prompt: &str, completion: &str, entry_point: &str) -> String {
    let code = fenced_code(completion).unwrap_or(completion);
    if defines(code, entry_point) {
        let mut program = String::with_capacity(prompt.len() + code.len() + 2);
        program.push_str(prompt);
        program.push_str("\n\n");
        program.push_str(code);
        program
    } else {
        format!("{prompt}{code}")
    }
}

/// The first ```` ``` ```` block's contents (after an optional language tag), or none. An
/// unclosed block runs to the end of the text, as a reply cut off at its token limit does.
pub fn fenced_code(text: &str) -> Option<&str> {
    let start = text.find("```")?;
    let rest = &text[start + 3..];
    let body_start = rest.find('\n').map_or(rest.len(), |i| i + 1);
    let body = &rest[body_start..];
    let end = body.find("```").unwrap_or(body.len());
    Some(&body[..end])
}

/// Whether `code` has a top-level `def NAME(`.
fn defines(code: &str, name: &str) -> bool {
    code.lines().any(|line| {
        line.strip_prefix("def ").or_else(|| line.strip_prefix("async def ")).is_some_and(|rest| {
            rest.trim_start().strip_prefix(name).is_some_and(|after| after.trim_start().starts_with('('))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROMPT: &str = "def add(a, b):\n    \"\"\"Sum.\"\"\"\n";

    #[test]
    fn a_continuation_follows_the_prompt() {
        assert_eq!(candidate_program(PROMPT, "    return a + b\n", "add"), format!("{PROMPT}    return a + b\n"));
    }

    #[test]
    fn a_whole_function_in_a_chat_reply_redefines_the_stand_in() {
        let reply = "Here it is:\n```python\ndef add(a, b):\n    return a + b\n```\nDone.";
        let program = candidate_program(PROMPT, reply, "add");
        assert!(program.starts_with(PROMPT), "{program}");
        assert!(program.ends_with("def add(a, b):\n    return a + b\n"), "{program}");
        assert!(!program.contains("Done."));
    }

    #[test]
    fn a_body_in_a_fence_continues_the_prompt() {
        assert_eq!(
            candidate_program(PROMPT, "```\n    return a + b\n```", "add"),
            format!("{PROMPT}    return a + b\n")
        );
    }

    #[test]
    fn an_unclosed_fence_runs_to_the_end() {
        assert_eq!(fenced_code("```python\ndef f():\n    return 1"), Some("def f():\n    return 1"));
        assert_eq!(fenced_code("no code"), None);
    }

    #[test]
    fn only_the_entry_point_counts_as_a_definition() {
        assert!(defines("def add(a, b):", "add"));
        assert!(!defines("def add_one(a):", "add"));
        assert!(!defines("    def add(a, b):", "add"));
    }
}
