"""Adapters for TRL beyond reward functions (a :class:`wirl.Reward` is one as it is).

``environment_factory(env)``: a wirl environment with episodes as TRL's
``GRPOTrainer(environment_factory=...)``. TRL makes one instance per rollout, calls
``reset(**row)`` with the dataset row (rows from ``env.dataset(n)``), lets the model call the
instance's public methods as tools, and asks ``get_reward()`` at the end. Here the one tool
is ``answer(text)``: the model's answer goes to the episode, and the tool's result is what
the environment says next (its feedback, or that the episode is over); the episode's score
is the reward — ``None`` (left out of TRL's mean) when it did not end or its plugin failed.
"""

from .environment import Environment
from ._native import PluginError

__all__ = ["environment_factory"]


def environment_factory(environment):
    """A class TRL instantiates per rollout, running episodes of ``environment``."""
    if not isinstance(environment, Environment):
        raise TypeError(f"environment_factory takes a wirl.Environment, not {type(environment).__name__}")
    if not environment.episodes:
        raise ValueError(f"{environment.name} has no episodes (describe says so): score its tasks with a wirl.Reward")

    class WirlEpisode:
        __doc__ = f"An episode of the wirl environment {environment.name}."

        def __init__(self):
            self._episode = None
            self._score = None
            self._failure = None

        def reset(self, **row):
            """Begin the episode of the dataset row's task (``prompt``, ``answer``, ``id``,
            ``metadata``, as ``Environment.dataset`` writes them)."""
            task = {
                "id": str(row.get("id", "")),
                "messages": row.get("prompt") or [],
                "answer": row.get("answer"),
                "metadata": row.get("metadata"),
            }
            self._episode = environment.start(task)
            self._score = None
            self._failure = None
            return None

        def answer(self, text: str) -> str:
            """Give your answer to the task; the reply says whether it is over or what follows.

            Args:
                text: your answer
            """
            if self._episode is None or self._episode.done:
                return "The episode is over."
            try:
                result = self._episode.step(text)
            except PluginError as error:
                self._failure = str(error)
                return "The episode ended: the environment failed."
            if result.done:
                self._score = result.score
                return "The episode is over."
            return "\n".join(message["content"] for message in result.messages)

        def get_reward(self):
            """The episode's score; None if it did not end (or failed)."""
            return None if self._score is None else self._score.reward

    WirlEpisode.__name__ = WirlEpisode.__qualname__ = f"WirlEpisode_{environment.name.replace('/', '_').replace('-', '_')}"
    return WirlEpisode
