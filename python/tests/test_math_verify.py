"""builtin:math-verify where users are: TRL (in place of ``accuracy_reward``), verl's
``compute_score``, OpenRLHF's ``reward_func``; hostile answers end with a verdict."""

import json
import os

import wirl
from conftest import ROOT

EXAMPLES = os.path.join(ROOT, "examples", "score", "math-verify.jsonl")


def test_the_score_examples_get_their_rewards():
    records = [json.loads(line) for line in open(EXAMPLES) if line.strip()]
    reward = wirl.Reward("builtin:math-verify")
    scores = reward.score([r["task"] for r in records], [r["completion"] for r in records])
    assert [s.reward for s in scores] == [r["expected_reward"] for r in records]
    assert all(s.ok for s in scores)


def test_trl_drop_in_for_accuracy_reward():
    # TRL's accuracy_reward reads the dataset's `solution` column; so does this.
    reward = wirl.Reward("builtin:math-verify", answer_column="solution")
    completions = [
        [{"role": "assistant", "content": r"So $x = \boxed{\dfrac{1}{2}}$."}],
        [{"role": "assistant", "content": r"Thus \boxed{\{3, 1, 2\}}"}],
        [{"role": "assistant", "content": r"It is \boxed{(1, 2]}"}],
        [{"role": "assistant", "content": "I give up."}],
    ]
    solution = [r"$0.5$", r"$\{1, 2, 3\}$", r"$(1, 2)$", "$7$"]
    rewards = reward(prompts=[[{"role": "user", "content": "?"}]] * 4, completions=completions, solution=solution)
    assert rewards == [1.0, 1.0, 0.0, 0.0]
    assert [s.note.split(";")[0] for s in reward.last_scores] == ["equal", "equal", "not_equal", "no_answer"]
    assert reward.last_scores[3].parts["no_answer"] == 1.0


def test_verl_compute_score_and_openrlhf():
    reward = wirl.Reward("builtin:math-verify")
    assert reward.compute_score("math", r"The answer is $\frac{\sqrt{2}}{2}$.", r"\frac{1}{\sqrt{2}}") == {"score": 1.0, "failed": 0.0}
    assert reward.compute_score("math", r"\boxed{1,000}", "1000") == {"score": 1.0, "failed": 0.0}
    assert reward.compute_score("math", r"\boxed{1001}", "1000") == {"score": 0.0, "failed": 0.0}
    out = reward.openrlhf([r"Q: x? A: \boxed{x \in [1, 2)}"], ["Q: x? A: "], [r"[1, 2)"])
    assert list(map(float, out["rewards"])) == [1.0]


def test_an_unreadable_gold_is_a_failed_call_not_a_zero():
    reward = wirl.Reward("builtin:math-verify")
    (value,) = reward(prompts=["?"], completions=[r"\boxed{2}"], answer=[r"\frac{1}{"])
    assert value is None
    assert "gold" in reward.last_scores[0].message or "not an expression" in reward.last_scores[0].message


def test_bad_config_fails_every_call_naming_the_key():
    for config, key in [
        ({"float_rounding": 99}, "float_rounding"),
        ({"boxed_priority": -5}, "boxed_priority"),
        ({"gold": "whole"}, "gold"),
        ({"format_weight": 1e30}, "format_weight"),
        ({"float_rounding": "six"}, "float_rounding"),
    ]:
        reward = wirl.Reward("builtin:math-verify", config=config)
        assert reward(prompts=["?", "?"], completions=[r"\boxed{1}", r"\boxed{2}"], answer=["1", "2"]) == [None, None]
        assert all(key in s.message for s in reward.last_scores), (config, reward.last_scores[0].message)


def test_hostile_answers_end_within_the_deadline_and_the_next_is_judged():
    # Each ends in well under the default 1 s deadline on an idle machine (the slowest, reading
    # a 6.9 MB answer, ~0.3 s: BENCHMARKS); the room here is for a loaded test machine.
    reward = wirl.Reward("builtin:math-verify", deadline_ms=5000)
    hostile = [
        "\\boxed{" + "\\frac{1}{" * 10_000 + "1" + "}" * 10_000 + "}",
        "\\boxed{" + "9" * (1 << 20) + "}",
        r"\boxed{9^{9^{9^{9}}}}",
        r"\boxed{(x+1)^{100000}}",
        "\\boxed{\\{" + ",".join(map(str, range(1_000_000))) + "\\}}",
        "\\boxed{" * 100_000,
    ]
    for answer in hostile:
        # A call past the deadline fails (None, verdict `deadline`): 0.0 means it was judged.
        (value,) = reward(prompts=["?"], completions=[answer], answer=[r"9^{9^{9^{9}}} + 1"])
        assert value == 0.0, (answer[:40], reward.last_scores[0])
        assert reward(prompts=["?"], completions=[r"\boxed{0.5}"], answer=[r"\frac12"]) == [1.0]
