"""Environment plugins: their tasks, and multi-turn episodes."""

import json

from . import _checks, _native
from ._native import PluginError

__all__ = ["Environment", "Episode", "StepResult"]


class StepResult:
    """What followed a reply: ``done`` with its ``score`` (a :class:`wirl.Score`), or the
    ``messages`` the model sees next (tool output, the user's next turn) and the ``reward`` of
    the turn just taken (a ``wirl:rl@0.2.0`` environment's turn reward; None when it gives
    none, and always from a 0.1.0 environment)."""

    __slots__ = ("done", "messages", "score", "reward")

    def __init__(self, done, messages, score, reward=None):
        self.done = done
        self.messages = messages
        self.score = score
        self.reward = reward

    def __repr__(self):
        if self.done:
            return f"StepResult(done, score={self.score!r})"
        return f"StepResult(continue, messages={self.messages!r}, reward={self.reward!r})"


class Episode:
    """One multi-turn episode of one task, its state in a sandboxed instance of its own."""

    def __init__(self, native, task):
        self._native = native
        self.task = task
        self.done = False

    def step(self, reply):
        """Give the model's reply; a :class:`StepResult`. A failed call (the plugin looped,
        trapped, refused the reply) raises :class:`wirl.PluginError` naming its verdict, and
        ends the episode."""
        if self.done:
            raise PluginError("this episode is over: start another (Environment.start)")
        if not isinstance(reply, str):
            raise TypeError(f"a reply is a str, not {type(reply).__name__}")
        result, verdict, message = self._native.step(reply)
        if result is None:
            self.done = True
            raise PluginError(f"step failed: {verdict}: {message}")
        result = json.loads(result)
        if "Done" in result:
            from .reward import Score

            score = result["Done"]
            self.done = True
            return StepResult(True, [], Score(score["reward"], "ok", "", score["parts"], score["note"], 0))
        turn = result["Continue"]
        return StepResult(False, turn["messages"], None, turn["reward"])


class Environment:
    """An environment plugin (``builtin:arithmetic`` or a ``.wasm`` file): deterministic tasks
    by (seed, index), and episodes where it does multi-turn. ``config`` is the plugin's config;
    ``deadline_ms``, ``memory_mib``, ``fuel`` bound each call."""

    def __init__(self, plugin, config=None, *, deadline_ms=None, memory_mib=None, fuel=None, seed=0):
        plugin = _checks.reference(plugin, "plugin")
        if config is not None and not isinstance(config, dict):
            raise ValueError(f"config must be a dict, not {type(config).__name__}")
        _checks.whole(deadline_ms, "deadline_ms", 1, _checks.MAX_DEADLINE_MS)
        _checks.whole(memory_mib, "memory_mib", 1, _checks.MAX_MEMORY_MIB)
        _checks.whole(fuel, "fuel", 1, 2**63 - 1)
        _checks.whole(seed, "seed", 0, 2**64 - 1, optional=False)
        self._args = (plugin, config, deadline_ms, memory_mib, fuel, seed)
        self.seed = seed
        self._native = _native.NativeEnvironment(
            plugin, None if config is None else json.dumps(config), deadline_ms=deadline_ms, memory_mib=memory_mib, fuel=fuel
        )
        self.sha256 = self._native.sha256
        self.name, self.size, self.episodes = self._native.describe()

    def __repr__(self):
        return f"Environment({self.name!r}, size={self.size}, episodes={self.episodes})"

    def task(self, index, seed=None):
        """The task at ``index`` (for ``seed``, default the environment's): a dict with
        ``id``, ``messages``, ``answer``, ``metadata``."""
        _checks.whole(index, "index", 0, 2**64 - 1, optional=False)
        _checks.whole(seed, "seed", 0, 2**64 - 1)
        task, verdict, message = self._native.task_at(self.seed if seed is None else seed, index)
        if task is None:
            raise PluginError(f"task {index}: {verdict}: {message}")
        return json.loads(task)

    def tasks(self, count, seed=None, start=0):
        _checks.whole(count, "count", 0, 2**64 - 1, optional=False)
        _checks.whole(start, "start", 0, 2**64 - 1, optional=False)
        return [self.task(index, seed) for index in range(start, start + count)]

    def dataset(self, count, seed=None, start=0):
        """Rows for a trainer's dataset: ``prompt`` (the task's messages, conversational),
        ``answer``, ``id``, ``metadata``: what :class:`wirl.Reward` reads back."""
        return [
            {"prompt": task["messages"], "answer": task["answer"], "id": task["id"], "metadata": task["metadata"]}
            for task in self.tasks(count, seed, start)
        ]

    def start(self, task):
        """Begin an episode of ``task`` (a dict from :meth:`task`)."""
        native, verdict, message = self._native.start(json.dumps(task))
        if native is None:
            raise PluginError(f"episode of {task.get('id')!r} did not start: {verdict}: {message}")
        return Episode(native, task)

    def __reduce__(self):
        plugin, config, deadline_ms, memory_mib, fuel, seed = self._args
        return (_environment_again, (plugin, config, deadline_ms, memory_mib, fuel, seed, self.sha256))


def _environment_again(plugin, config, deadline_ms, memory_mib, fuel, seed, sha256):
    from .reward import unchanged

    again = Environment(plugin, config, deadline_ms=deadline_ms, memory_mib=memory_mib, fuel=fuel, seed=seed)
    unchanged(plugin, "environment", sha256, again.sha256)
    return again
