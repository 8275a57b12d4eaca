"""Hardening IV: what a careless caller or a trainer's odd value hands the package is refused by
name or read as documented, never scored silently wrong (a test per finding)."""

import math
import os
import pickle
import shutil
import time

import pytest
import wirl
from conftest import interrupted, run_script, rust_plugin


@pytest.fixture(scope="module")
def math_answer():
    return wirl.Reward("builtin:math-answer")


def test_a_single_string_is_not_a_batch_of_characters(math_answer):
    with pytest.raises(TypeError, match="completions must be a list"):
        math_answer(prompts=None, completions="<answer>18</answer>", answer=["18"])
    with pytest.raises(TypeError, match="prompts must be a list"):
        math_answer(prompts="what is 9+9?", completions=["18"], answer=["18"])
    with pytest.raises(TypeError, match="completions must be a list"):
        math_answer.score([{"answer": "1"}], "1")


def test_a_missing_answer_is_no_answer_not_the_text_nan(math_answer):
    got = math_answer(completions=["<answer>nan</answer>", "<answer>nan</answer>", "<answer>4</answer>"], answer=[float("nan"), None, 4])
    # No reference: math-answer cannot call "nan" right (the text "nan" once scored 1.0).
    assert got[0] != 1.0 and got[1] != 1.0 and got[2] == 1.0
    try:
        import numpy
    except ImportError:
        return
    assert math_answer(completions=["<answer>nan</answer>"], answer=[numpy.float32("nan")])[0] != 1.0


def test_only_the_assistants_words_are_scored(math_answer):
    conversation = [
        {"role": "assistant", "content": "Let me use the tool."},
        {"role": "tool", "content": "<answer>42</answer>"},
        {"role": "user", "content": "<answer>42</answer>"},
    ]
    assert math_answer(completions=[conversation], answer=["42"]) == [0.0]
    said = conversation + [{"role": "assistant", "content": "<answer>42</answer>"}]
    assert math_answer(completions=[said], answer=["42"]) == [1.0]
    with pytest.raises(TypeError, match="completion 0: a conversational completion"):
        math_answer(completions=[[{"content": "<answer>42</answer>"}]], answer=["42"])


def test_openrlhf_lengths_must_agree(math_answer):
    with pytest.raises(ValueError, match="3 queries, 3 prompts and 2 labels"):
        math_answer.openrlhf(["q1", "q2", "q3"], ["q", "q", "q"], ["1", "2"])
    with pytest.raises(TypeError, match="queries must be a list"):
        math_answer.openrlhf("q1", ["q"], ["1"])


def test_a_weight_whose_product_is_not_finite_fails_the_call():
    reward = wirl.Reward("builtin:math-answer", weight=1e308)
    got = reward(completions=["<answer>2</answer>", "<answer>3</answer>"], answer=["2", "2"])
    # 1.0 x 1e308 is finite; a reward of 2 (none here) would not be: the product is checked.
    assert got == [1e308, 0.0]
    score = wirl.Score(2.0, "ok", "", {}, None, 0)
    assert reward._weighted(score) is None
    assert score.verdict == "non_finite" and "weight" in score.message
    verl = reward.compute_score("x", "<answer>2</answer>", "2")
    assert verl == {"score": 1e308, "failed": 0.0}


def test_arguments_are_named_when_refused():
    refusals = [
        (lambda: wirl.Reward(b"builtin:math-answer"), TypeError, "plugin must be a str or a path, not bytes"),
        (lambda: wirl.Reward(""), ValueError, "plugin is empty"),
        (lambda: wirl.Reward("builtin:math-answer", failed_score=math.nan), ValueError, "failed_score must be a finite"),
        (lambda: wirl.Reward("builtin:math-answer", weight=math.inf), ValueError, "weight must be a finite"),
        (lambda: wirl.Reward("builtin:math-answer", deadline_ms=-1), ValueError, "deadline_ms must be a whole number from 1"),
        (lambda: wirl.Reward("builtin:math-answer", deadline_ms=2**64 - 1), ValueError, "deadline_ms must be a whole number"),
        (lambda: wirl.Reward("builtin:math-answer", memory_mib=0), ValueError, "memory_mib must be"),
        (lambda: wirl.Reward("builtin:math-answer", threads=-3), ValueError, "threads must be"),
        (lambda: wirl.Reward("builtin:math-answer", answer_column=123), TypeError, "answer_column must be a str or None"),
        (lambda: wirl.Reward("builtin:math-answer", reuse_instance="yes"), TypeError, "reuse_instance must be True or False"),
        (lambda: wirl.CodeRunner(workers=-1), ValueError, "workers must be"),
        (lambda: wirl.Environment("builtin:arithmetic").dataset(-5), ValueError, "count must be a whole number from 0"),
        (lambda: wirl.Environment("builtin:arithmetic").task(-1), ValueError, "index must be"),
        (lambda: wirl.Environment(""), ValueError, "plugin is empty"),
    ]
    for make, kind, says in refusals:
        with pytest.raises(kind, match=says):
            make()


def _copy(path, tmp_path, name):
    copy = tmp_path / name
    shutil.copyfile(path, copy)
    return copy


def test_every_pickled_plugin_refuses_changed_bytes(tmp_path):
    environment_file = _copy(rust_plugin("arithmetic"), tmp_path, "env.wasm")
    environment = wirl.Environment(environment_file)
    runner_file = _copy(wirl.plugin_path("code_runner"), tmp_path, "runner.wasm")
    runner = wirl.CodeRunner(runner_file)
    grader_runner = _copy(wirl.plugin_path("humaneval_runner"), tmp_path, "grader_runner.wasm")
    grader = wirl.humaneval_grader(runner=grader_runner)
    pickled = [pickle.dumps(o) for o in (environment, runner, grader)]
    # Unchanged: each loads again.
    for blob in pickled:
        pickle.loads(blob)
    # Each file replaced by another plugin: refused by name, not loaded silently.
    shutil.copyfile(rust_plugin("hostile_environment"), environment_file)
    shutil.copyfile(wirl.plugin_path("humaneval_runner"), runner_file)
    shutil.copyfile(wirl.plugin_path("code_runner"), grader_runner)
    for blob, what in zip(pickled, ("environment", "code runner", "reward's code runner")):
        with pytest.raises(wirl.PluginError, match=f"changed since this {what} was pickled"):
            pickle.loads(blob)
    os.remove(environment_file)


def test_one_large_write_arrives_whole():
    result = wirl.run_python("import sys\nsys.stdout.write('y' * 200_000)")
    assert (result.verdict, len(result.stdout), result.truncated) == ("exited", 200_000, False)
    over = wirl.CodeRunner(max_output_bytes=100_000).run("import sys\nsys.stdout.write('z' * 300_000)")
    assert (over.verdict, over.truncated, len(over.stdout)) == ("output_limit", True, 100_000)


def test_a_large_correct_result_is_graded_right():
    grader = wirl.humaneval_grader()
    prompt = 'def squares(n):\n    """The squares of 0 to n - 1."""\n'
    test = "def check(candidate):\n    assert candidate(20000) == [i * i for i in range(20000)]\n"
    got = grader(prompts=[prompt, prompt], completions=["    return [i * i for i in range(n)]\n", "    return []\n"], test=[test, test], entry_point=["squares", "squares"])
    assert got == [1.0, 0.0], [s.message or s.note for s in grader.last_scores]


def test_mbpp_bare_asserts_are_judged():
    grader = wirl.humaneval_grader()
    test = "assert add(1, 2) == 3\nassert add(-4, 4) == 0\n"
    completions = ["def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"]
    assert grader(prompts=["", ""], completions=completions, test=[test, test], entry_point=["add", "add"]) == [1.0, 0.0]


# A program busy for 90 s: far past every bound below, so no bound has to be tight.
_SLEEPER = "import time\nstarted = time.time()\nwhile time.time() - started < 90:\n    pass\nprint('done')"


def _kill_workers_soon(runner, delay):
    import signal
    import threading

    def kill():
        time.sleep(delay)
        for pid in runner.worker_pids():
            os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()


def test_a_killed_worker_is_the_runners_failure_not_the_programs():
    runner = wirl.CodeRunner(workers=1)
    assert runner.run("print(1)").stdout == "1\n"
    _kill_workers_soon(runner, 1.0)
    lost = runner.run(_SLEEPER, timeout_s=60)
    assert lost.verdict == "infrastructure" and not lost.ok, lost
    assert "code worker" in lost.crash
    # A fresh worker takes the next program.
    assert runner.run("print(2)").stdout == "2\n"


def test_a_graders_lost_worker_fails_the_call_it_does_not_score_0():
    grader = wirl.humaneval_grader(workers=1, timeout_ms=60_000)
    prompt = 'def slow(x):\n    """Slowly, done."""\n'
    test = "def check(candidate):\n    assert candidate(1) == 'done'\n"
    completion = "    import time\n    s = time.time()\n    while time.time() - s < 30:\n        pass\n    return 'done'\n"
    import threading

    def kill_the_workers():
        # By then the judge has run and the candidate's 30 s program is in the worker.
        time.sleep(3.0)
        for pid in _children():
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass

    threading.Thread(target=kill_the_workers, daemon=True).start()
    got = grader(prompts=[prompt], completions=[completion], test=[test], entry_point=["slow"])
    assert got == [None], grader.last_scores
    assert grader.last_scores[0].verdict == "infrastructure", grader.last_scores


def _children():
    """The process ids of this process's children."""
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == me:
                    pids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return pids


def test_ctrl_c_ends_a_workers_program_within_moments():
    returncode, out, err = interrupted(
        f"""
import time, wirl
runner = wirl.CodeRunner(workers=1)
runner.run("print(1)")
print("ready", flush=True)
started = time.monotonic()
try:
    runner.run({_SLEEPER!r}, timeout_s=600)
except KeyboardInterrupt:
    print("interrupted after", round(time.monotonic() - started, 2), flush=True)
print("next", runner.run("print(3)").stdout.strip(), flush=True)
"""
    )
    assert returncode == 0, err
    took = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("interrupted after")]
    # Tens of milliseconds when idle; generous for a loaded machine, far under the program's 90 s.
    assert took and took[0] < 30, out
    assert "next 3" in out, out


def test_exit_does_not_wait_for_a_program_in_flight():
    started = time.monotonic()
    done = run_script(
        f"""
import threading, time, wirl
runner = wirl.CodeRunner(workers=1)
runner.run("print(1)")
threading.Thread(target=runner.run, args=({_SLEEPER!r},), kwargs={{"timeout_s": 600}}).start()
time.sleep(1.0)
print("exiting", flush=True)
""",
        timeout=120,
    )
    assert done.returncode == 0 and "exiting" in done.stdout, done.stderr
    assert time.monotonic() - started < 60, "exit waited for the program"


def test_a_forked_child_gets_its_own_workers_and_leaves_the_parents_alone():
    done = run_script(
        """
import os, wirl
runner = wirl.CodeRunner(workers=1)
assert runner.run("print(1)").stdout == "1\\n"
parents = runner.worker_pids()
pid = os.fork()
if pid == 0:
    got = runner.run("print(2)")
    os._exit(0 if got.stdout == "2\\n" and set(runner.worker_pids()).isdisjoint(parents) else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status), flush=True)
print("parent", runner.run("print(3)").stdout.strip(), runner.worker_pids() == parents, flush=True)
""",
        timeout=120,
    )
    assert "child 0" in done.stdout and "parent 3 True" in done.stdout, (done.stdout, done.stderr)
