"""wirl.Reward: TRL's calling convention, verdicts, threads, pickling, adapters."""

import asyncio
import json
import os
import pickle
import shutil
import subprocess
import threading
import time

import pytest
import wirl
from conftest import ROOT, interrupted, run_script, rust_plugin

MATH = os.path.join(ROOT, "examples", "score", "math.jsonl")


def lines(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def test_builtin_scores_equal_wirl_score():
    records = lines(MATH)
    reward = wirl.Reward("builtin:math-answer")
    scores = reward.score([r["task"] for r in records], [r["completion"] for r in records])
    assert [s.reward for s in scores] == [r["expected_reward"] for r in records]
    # The same file through `wirl score`, the binary's own scoring, where it is built.
    binary = os.path.join(ROOT, "target", "debug", "wirl")
    if not os.path.exists(binary):
        binary = shutil.which("wirl")
    if binary:
        out = subprocess.run([binary, "score", "--plugin", "builtin:math-answer", "--input", MATH], capture_output=True, text=True)
        theirs = [json.loads(line) for line in out.stdout.splitlines()]
        assert [t["reward"] for t in theirs] == [s.reward for s in scores]
        assert [t["parts"] for t in theirs] == [s.parts for s in scores]


def test_trl_convention_conversational_and_plain():
    reward = wirl.Reward("builtin:math-answer", weight=2.0)
    records = lines(MATH)
    prompts = [r["task"]["messages"] for r in records]
    completions = [[{"role": "assistant", "content": r["completion"]}] for r in records]
    got = reward(
        prompts=prompts,
        completions=completions,
        completion_ids=[[1, 2]] * len(records),
        answer=[r["task"]["answer"] for r in records],
        trainer_state=object(),
        log_metric=lambda *a: None,
        log_extra=lambda *a: None,
    )
    assert got == [2.0 * r["expected_reward"] for r in records]
    assert reward.__name__ == "math_answer"
    plain = wirl.Reward("builtin:math-answer")(prompts=["1+1?"], completions=["<answer>2</answer>"], answer=[2])
    assert plain == [1.0]


def test_bad_columns_are_named():
    reward = wirl.Reward("builtin:math-answer")
    with pytest.raises(ValueError, match="column 'answer'"):
        reward(prompts=["a", "b"], completions=["1", "2"], answer=["1"])
    with pytest.raises(ValueError, match="2 prompts for 1 completions"):
        reward(prompts=["a", "b"], completions=["1"])
    with pytest.raises(ValueError, match="completions"):
        reward(prompts=["a"])
    for weight in (float("nan"), float("inf"), "1", True):
        with pytest.raises(ValueError, match="weight"):
            wirl.Reward("builtin:math-answer", weight=weight)


def test_loading_errors_name_the_plugin(tmp_path):
    with pytest.raises(wirl.PluginError, match="builtin:nope"):
        wirl.Reward("builtin:nope")
    missing = tmp_path / "missing.wasm"
    with pytest.raises(wirl.PluginError, match="missing.wasm"):
        wirl.Reward(missing)
    garbage = tmp_path / "garbage.wasm"
    garbage.write_bytes(b"\0asm" + os.urandom(64))
    with pytest.raises(wirl.PluginError, match="garbage.wasm"):
        wirl.Reward(garbage)
    fifo = tmp_path / "fifo.wasm"
    os.mkfifo(fifo)
    with pytest.raises(wirl.PluginError, match="fifo.wasm"):
        wirl.Reward(fifo)
    with pytest.raises(wirl.PluginError, match="environment-plugin"):
        wirl.Reward("builtin:arithmetic")
    with pytest.raises(ValueError, match="memory_mib"):
        wirl.Reward("builtin:math-answer", memory_mib=1 << 40)
    with pytest.raises(ValueError, match="config"):
        wirl.Reward("builtin:math-answer", config=[1])
    with pytest.raises(ValueError, match="threads"):
        wirl.Reward("builtin:math-answer", threads=0)


@pytest.mark.parametrize(
    "completion, verdict",
    [
        ("loop", "deadline"),
        ("sleep:60000", "deadline"),
        ("memory-bomb", "memory"),
        ("stack-overflow", "stack_overflow"),
        ("panic", "trap"),
        ("huge-output", "output_too_large"),
        ("print-forever", "print_limit"),
        ("nan", "non_finite"),
        ("inf", "non_finite"),
        ("guest-error", "guest_error"),
    ],
)
def test_hostile_plugin_fails_with_its_verdict_and_the_next_call_works(hostile, completion, verdict):
    # The huge output needs room to be made (100 MiB) before it can be refused.
    reward = wirl.Reward(hostile, deadline_ms=300, memory_mib=512 if completion == "huge-output" else 32)
    started = time.monotonic()
    assert reward(completions=[completion]) == [None]
    assert time.monotonic() - started < 5
    assert reward.last_scores[0].verdict == verdict, reward.last_scores[0]
    assert reward(completions=["fine"]) == [4.0]


def test_ten_thousand_calls_from_sixteen_threads():
    reward = wirl.Reward("builtin:math-answer", threads=2)
    errors, results = [], []

    def caller(seed):
        try:
            for i in range(25):
                n = seed * 1000 + i
                got = reward(prompts=["?"] * 25, completions=[f"<answer>{n + k % 2}</answer>" for k in range(25)], answer=[str(n)] * 25)
                results.append(got == [1.0 if k % 2 == 0 else 0.0 for k in range(25)])
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=caller, args=(t,)) for t in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors
    assert len(results) == 16 * 25 and all(results)


def test_pickling_round_trips(tmp_path, hostile):
    reward = wirl.Reward("builtin:math-answer", weight=0.5, deadline_ms=500, name="math")
    again = pickle.loads(pickle.dumps(reward))
    assert (again.sha256, again.weight, again.__name__) == (reward.sha256, 0.5, "math")
    assert again(completions=["<answer>3</answer>"], answer=["3"]) == [0.5]
    asynchronous = pickle.loads(pickle.dumps(wirl.AsyncReward("builtin:math-answer")))
    assert isinstance(asynchronous, wirl.AsyncReward)
    # A file that changed between pickling and loading is refused, not silently swapped.
    copy = tmp_path / "copy.wasm"
    shutil.copy(hostile, copy)
    pickled = pickle.dumps(wirl.Reward(copy))
    shutil.copy(rust_plugin("exact_match"), copy)
    with pytest.raises(wirl.PluginError, match="changed since"):
        pickle.loads(pickled)


def test_async_reward_leaves_the_event_loop_free(hostile):
    # While the batches run on the executor's threads, the loop goes on ticking.
    reward = wirl.AsyncReward(hostile, deadline_ms=5000, threads=1)

    async def main():
        ticks = 0
        calls = asyncio.gather(*[reward(completions=["sleep:300"]) for _ in range(4)])
        while not calls.done():
            ticks += 1
            await asyncio.sleep(0.01)
        return await calls, ticks

    results, ticks = asyncio.run(main())
    assert results == [[300.0]] * 4
    assert ticks > 1


def test_verl_and_openrlhf_adapters(hostile):
    reward = wirl.Reward("builtin:math-answer")
    assert reward.compute_score("arithmetic", "<answer>7</answer>", "7", {"index": 3}) == {"score": 1.0, "failed": 0.0}
    assert reward.compute_score("arithmetic", "<answer>8</answer>", "7") == {"score": 0.0, "failed": 0.0}
    broken = wirl.Reward(hostile, deadline_ms=200, failed_score=-1.0)
    assert broken.compute_score("x", "loop", None) == {"score": -1.0, "failed": 1.0}
    assert broken.last_scores[0].verdict == "deadline"
    out = reward.openrlhf(["Q: 1+1 <answer>2</answer>", "Q: 1+1 <answer>3</answer>"], ["Q: 1+1 ", "Q: 1+1 "], ["2", "2"])
    assert [float(x) for x in out["rewards"]] == [1.0, 0.0]
    assert [float(x) for x in out["extra_logs"]["wirl_failed"]] == [0.0, 0.0]


def test_keyboard_interrupt_mid_batch(hostile):
    # A batch of endless calls, Ctrl-C after a second: KeyboardInterrupt within moments (the
    # calls in flight interrupted), and the next call works.
    returncode, out, err = interrupted(
        f"""
import time, wirl
reward = wirl.Reward({hostile!r}, deadline_ms=60000, threads=2)
print("ready", flush=True)
started = time.monotonic()
try:
    reward(completions=["loop"] * 50)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - started, 1), flush=True)
print("next", reward(completions=["fine"]), flush=True)
"""
    )
    assert returncode == 0, err
    said = [line for line in out.splitlines() if line.startswith("interrupted after")]
    assert said and float(said[0].split()[-1]) < 5, out
    assert "next [4.0]" in out


def test_interpreter_exit_with_calls_in_flight(hostile):
    started = time.monotonic()
    done = run_script(
        f"""
import threading, time, wirl
reward = wirl.Reward({hostile!r}, deadline_ms=60000, threads=2)
threading.Thread(target=reward, kwargs={{"completions": ["loop"] * 8}}, daemon=True).start()
time.sleep(0.5)
print("leaving")
""",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "leaving" in done.stdout
    assert time.monotonic() - started < 30


def test_forked_children_keep_their_deadlines(hostile):
    # A fork has no epoch ticker thread: the reward loads again in the child.
    done = run_script(
        f"""
import multiprocessing as mp, wirl
reward = wirl.Reward({hostile!r}, deadline_ms=300)
reward(completions=["fine"])
def call(c):
    out = reward(completions=[c])
    return out, reward.last_scores[0].verdict
with mp.get_context("fork").Pool(2) as pool:
    print(pool.map(call, ["loop", "fine"]))
""",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "[([None], 'deadline'), ([4.0], 'ok')]" in done.stdout


def test_a_0_2_0_plugin_is_told_the_step_trl_trains():
    """A wirl:rl@0.2.0 reward (the step-aware test guest: reward = scale × step) learns the step
    from ``trainer_state`` as TRL passes it, or from ``score(step=, steps=)``; outside
    training it is 0 of 0. A 0.1.0 reward scores the same either way."""
    from conftest import rust_plugin

    reward = wirl.Reward(rust_plugin("step_aware"), config={"scale": 2})

    class State:
        global_step, max_steps = 4, 10

    got = reward(prompts=["a", "b"], completions=["x", "y"], trainer_state=State())
    assert got == [10.0, 10.0], "step 5 (4 finished) times 2"
    assert reward.last_scores[0].parts == {"step": 5.0, "steps": 10.0, "group": 1.0}
    assert reward(prompts=["a"], completions=["x"]) == [0.0]
    for state in (object(), type("S", (), {"global_step": -1, "max_steps": 3})(), type("S", (), {"global_step": True, "max_steps": 3})()):
        assert reward(prompts=["a"], completions=["x"], trainer_state=state) == [0.0]
    (score,) = reward.score([{"id": "t", "messages": []}], ["x"], step=3, steps=7)
    assert (score.reward, score.parts["steps"]) == (6.0, 7.0)
    for bad in (-1, 2**70, 1.5, "3", None):
        with pytest.raises((ValueError, TypeError)):
            reward.score([{"id": "t", "messages": []}], ["x"], step=bad, steps=7)
    old = wirl.Reward("builtin:math-answer")
    assert old(prompts=["1+1?"], completions=["<answer>2</answer>"], answer=[2], trainer_state=State()) == [1.0]
