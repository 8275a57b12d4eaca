//! The differential corpus (`tests/corpus.jsonl`, labelled by Math-Verify itself through
//! `scripts/math-verify-corpus.py` in the peers' venv): how often this verifier agrees, per
//! class of answer. The floor below is what the verifier reached when the corpus was last
//! regenerated; a change that loses agreement fails here, with the cases it lost.
//!
//! `MATH_VERIFY_CORPUS=FILE` reports on another corpus instead (Math-Verify's own test cases,
//! as `benches/math-verify.sh` labels them), without the floor.

use math_verify::{Settings, judge};
use std::collections::BTreeMap;

/// Agreement the verifier must keep, over the whole corpus.
const FLOOR: f64 = 0.97;

#[test]
fn agrees_with_math_verify_on_the_corpus() {
    let other = std::env::var_os("MATH_VERIFY_CORPUS");
    let corpus = match &other {
        Some(path) => std::fs::read_to_string(path).expect("MATH_VERIFY_CORPUS names a readable file"),
        None => include_str!("corpus.jsonl").to_string(),
    };
    let settings = Settings::default();
    let mut by_class: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut disagreements = Vec::new();
    let mut total = (0, 0);
    for line in corpus.lines().filter(|l| !l.trim().is_empty()) {
        let case: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        let (class, gold, pred) =
            (case["class"].as_str().unwrap(), case["gold"].as_str().unwrap(), case["pred"].as_str().unwrap());
        let expected = case["math_verify"].as_bool().unwrap();
        let judgement = judge(gold, pred, &settings);
        let agrees = judgement.correct() == expected;
        let entry = by_class.entry(class.to_string()).or_default();
        entry.1 += 1;
        total.1 += 1;
        if agrees {
            entry.0 += 1;
            total.0 += 1;
        } else {
            disagreements.push(format!(
                "{class}: gold {gold:?} pred {pred:?}: Math-Verify {expected}, wirl {} ({})",
                judgement.correct(),
                judgement.verdict.name()
            ));
        }
    }
    for (class, (agree, n)) in &by_class {
        eprintln!("{class:16} {agree:5} / {n:5}");
    }
    for d in &disagreements {
        eprintln!("{d}");
    }
    let rate = total.0 as f64 / total.1 as f64;
    eprintln!("agreement {} / {} = {:.4}", total.0, total.1, rate);
    if other.is_some() {
        return;
    }
    assert!(total.1 > 1000, "the corpus has {} cases", total.1);
    assert!(rate >= FLOOR, "agreement {rate:.4} is under {FLOOR}; the disagreements are listed above");
}
