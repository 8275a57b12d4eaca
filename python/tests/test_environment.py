"""wirl.Environment: deterministic tasks, episodes, failures named."""

import pickle

import pytest
import wirl
from conftest import rust_plugin


def test_builtin_environment_tasks_are_deterministic_and_scored_by_the_reward():
    environment = wirl.Environment("builtin:arithmetic", seed=7)
    assert environment.name and environment.size is None
    rows = environment.dataset(4)
    assert rows == environment.dataset(4) and rows != environment.dataset(4, seed=8)
    reward = wirl.Reward("builtin:math-answer")
    completions = [f"<answer>{row['answer']}</answer>" for row in rows]
    columns = {key: [row[key] for row in rows] for key in ("answer", "id", "metadata")}
    assert reward(prompts=[row["prompt"] for row in rows], completions=completions, **columns) == [1.0] * 4
    again = pickle.loads(pickle.dumps(environment))
    assert again.task(3) == environment.task(3)


def test_episode_steps_to_a_score():
    environment = wirl.Environment("builtin:arithmetic")
    task = environment.task(0)
    episode = environment.start(task)
    result = episode.step(f"<answer>{task['answer']}</answer>")
    while not result.done:
        result = episode.step(f"<answer>{task['answer']}</answer>")
    assert result.score.reward == 1.0
    with pytest.raises(wirl.PluginError, match="over"):
        episode.step("more")


def test_a_0_2_0_environment_rewards_its_turns():
    # plugins/tests/turn-rewards: each turn the episode goes on from earns its reply's length
    # (none for the turn `silent`); the outcome is its config's.
    environment = wirl.Environment(rust_plugin("turn_rewards"), {"turns": 3, "silent": 1, "outcome": 0.5})
    episode = environment.start(environment.task(0))
    first = episode.step("four")
    assert (first.done, first.reward, [m["content"] for m in first.messages]) == (False, 4.0, ["Say more."])
    assert episode.step("and more").reward is None
    last = episode.step("done")
    assert (last.done, last.score.reward, last.reward) == (True, 0.5, None)
    # A 0.1.0 environment's turns carry none.
    arithmetic = wirl.Environment("builtin:arithmetic", {"attempts": 2})
    task = arithmetic.task(0)
    wrong = arithmetic.start(task).step(f"<answer>{int(task['answer']) + 1}</answer>")
    assert (wrong.done, wrong.reward) == (False, None)


def test_failing_environment_names_its_verdict():
    environment = wirl.Environment(rust_plugin("hostile_environment"), {"fail_mod": 2})
    assert environment.task(2)["answer"] == "1"
    with pytest.raises(wirl.PluginError, match="task 3: guest_error"):
        environment.task(3)
    with pytest.raises(wirl.PluginError, match="reward-plugin"):
        wirl.Environment("builtin:math-answer")


def test_trl_environment_factory_runs_episodes_as_trl_calls_them():
    import inspect

    from wirl.trl import environment_factory

    environment = wirl.Environment("builtin:arithmetic", {"attempts": 2})
    factory = environment_factory(environment)
    # What TRL checks: a `reset`, a `get_reward`, the other public methods as tools.
    members = [name for name, _ in inspect.getmembers(factory, predicate=inspect.isfunction)]
    assert {"reset", "get_reward", "answer"} <= set(members)
    row = environment.dataset(1)[0]
    right, wrong = factory(), factory()
    assert right.reset(**row) is None and wrong.reset(**row) is None
    assert right.answer(f"<answer>{row['answer']}</answer>") == "The episode is over."
    assert right.get_reward() == 1.0
    feedback = wrong.answer("<answer>-999</answer>")
    assert feedback != "The episode is over." and wrong.get_reward() is None
    assert wrong.answer("<answer>-999</answer>") == "The episode is over."
    assert wrong.get_reward() == 0.0
    with pytest.raises(ValueError, match="no episodes"):
        environment_factory(wirl.Environment(rust_plugin("hostile_environment")))
