//! The verifier on whole completions: the score examples users read
//! (`examples/score/math-verify.jsonl`, each line with the reward to expect), and answers
//! built to hang a computer-algebra system or a parser — each must come back with a verdict,
//! and the next answer must still be judged right.

use math_verify::hostile::hostile_answers;
use math_verify::{Settings, Verdict, judge};

#[test]
fn score_examples_get_their_expected_rewards() {
    let examples = include_str!("../../../../examples/score/math-verify.jsonl");
    for line in examples.lines() {
        let case: serde_json::Value = serde_json::from_str(line).unwrap();
        let gold = case["task"]["answer"].as_str().unwrap();
        let completion = case["completion"].as_str().unwrap();
        let expected = case["expected_reward"].as_f64().unwrap() == 1.0;
        let judgement = judge(gold, completion, &Settings::default());
        assert_eq!(judgement.correct(), expected, "{gold:?} vs {completion:?}: {judgement:?}");
    }
}

#[test]
fn hostile_answers_end_with_a_verdict_and_the_next_answer_is_fine() {
    // Their time is the bench's (benches/math-verify.sh); here, each ends with a verdict.
    for (what, answer) in hostile_answers() {
        let judgement = judge("9^{9^{9^{9}}} + 1", &answer, &Settings::default());
        assert!(!judgement.correct(), "{what}: {judgement:?}");
        assert!(
            matches!(judgement.verdict, Verdict::TooLarge | Verdict::Unparsed | Verdict::NotEqual | Verdict::NoAnswer),
            "{what}: {judgement:?}"
        );
        assert!(judge("\\frac{1}{2}", "\\boxed{0.5}", &Settings::default()).correct(), "after {what}");
    }
    let tower = judge("9^{9^{9^{9}}}", "\\boxed{9^{9^{9^{9}}} + 1}", &Settings::default());
    assert_eq!(tower.verdict, Verdict::TooLarge, "{tower:?}");
}
