//! Answers built to hang a computer-algebra system or a backtracking parser: a `\frac`
//! nested 10,000 deep, 1 MB of digits, a tower of powers, `(x+1)^{100000}`, a
//! million-element set, unclosed boxes... The tests judge each within a bound, and
//! `benches/math-verify.sh` times them beside Math-Verify.

/// Answers that hang or exhaust a CAS or a backtracking parser.
pub fn hostile_answers() -> Vec<(&'static str, String)> {
    vec![
        ("frac nested 10,000 deep", format!("\\boxed{{{}1{}}}", "\\frac{1}{".repeat(10_000), "}".repeat(10_000))),
        ("1 MB of digits", format!("\\boxed{{{}}}", "9".repeat(1 << 20))),
        ("a power tower", "\\boxed{9^{9^{9^{9}}}}".to_string()),
        ("a huge polynomial power", "\\boxed{(x+1)^{100000}}".to_string()),
        ("a huge factorial", "\\boxed{100000!}".to_string()),
        (
            "a million-element set",
            format!("\\boxed{{\\{{{}\\}}}}", (0..1_000_000).map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
        ),
        ("unclosed boxes", "\\boxed{".repeat(100_000)),
        ("dollar signs", "$1".repeat(200_000)),
        ("answer words", "the answer is ".repeat(50_000)),
        ("parentheses", "(".repeat(200_000) + &")".repeat(200_000)),
        ("a long sum", format!("\\boxed{{{}}}", vec!["x"; 100_000].join("+"))),
    ]
}
