"""An OpenEnv environment for wirl's tests, served by openenv-core's own server (create_app:
HTTP and the /ws sessions), as any OpenEnv environment is.

Guess the digit: reset(seed) picks a digit from the seed; each step takes a message, scores
1 and ends when its first digit is right, else says "higher" or "lower" and goes on; after
three wrong guesses it ends with 0.

    python tests/openenv/guess_server.py --port 8000
"""

import argparse
import re

import uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    message: str = Field(..., description="the guess, as text")


class GuessObservation(Observation):
    prompt: str = Field(default="", description="what the player is told")


# `--die-after N`: the process exits at its Nth step (a server that crashes mid-training).
DIE_AFTER = None
STEPS = 0


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        self._target = 0
        self._guesses = 0
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._target = (seed or 0) % 10
        self._guesses = 0
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(prompt="Guess my digit (0 to 9). Reply with one digit.", done=False, reward=None)

    def step(self, action, timeout_s=None, **kwargs):
        global STEPS
        STEPS += 1
        if DIE_AFTER is not None and STEPS >= DIE_AFTER:
            import os

            os._exit(1)
        self._guesses += 1
        self._state.step_count += 1
        found = re.search(r"\d", action.message)
        if found and int(found.group()) == self._target:
            return GuessObservation(prompt="Right.", done=True, reward=1.0)
        if self._guesses >= 3:
            return GuessObservation(prompt=f"No: it was {self._target}.", done=True, reward=0.0)
        hint = "higher" if not found or int(found.group()) < self._target else "lower"
        return GuessObservation(prompt=f"No: {hint}. Guess again.", done=False, reward=0.0)

    @property
    def state(self):
        return self._state


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=256)

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--exit-with-stdin", action="store_true", help="exit when stdin closes (the test that started it ended)")
    parser.add_argument("--die-after", type=int, default=None, help="exit at this step, as a crash would")
    args = parser.parse_args()
    DIE_AFTER = args.die_after
    if args.exit_with_stdin:
        import os
        import sys
        import threading

        threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
