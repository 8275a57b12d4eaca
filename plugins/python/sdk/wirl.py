"""Write wirl reward plugins in Python.

    # wirl-world: reward-plugin
    from wirl import Reward, Score, Task, reward

    @reward
    def score(task: Task, completion: str) -> Score:
        right = completion.strip() == (task.answer or "").strip()
        return Score.of(1.0 if right else 0.0, correct=1.0 if right else 0.0)

`Reward` must be imported into your module: it is the class componentize-py exports, and it
calls the function you decorated. Raise `Unscorable("why")` when a completion cannot be
scored (wirl records the reason and gives the configured failure reward); any other
exception is reported the same way, with its type and message. `config(key, default)` reads
the plugin's settings from the wirl config.

Build with scripts/build-plugins (componentize-py; this directory is on the module path).
Only the standard library that the plugin imports at module level is in the component.

A plugin whose first line names `wirl:rl@0.2.0` (`# wirl-world: reward-plugin@0.2.0`) is
built against wit/0.2.0: the same functions, and also `progress()` (the training step its
group is scored at, 0 of 0 outside training), `generate(conversations, ...)` (the model:
an LLM judge, within its `[[rewards]]` entry's budget) and `logprobs([(conversation, reply)])`
(how likely the model finds given replies).
"""

import json
import traceback
from typing import Callable, List, Optional

from componentize_py_types import Err, Ok, Result
from wit_world import exports
from wit_world.imports import config as _config
from wit_world.imports.types import Message, Score, Task

try:  # wirl:rl@0.2.0's reward world: the run's progress and the model.
    from wit_world.imports import inference as _inference
    from wit_world.imports.run import Progress
    from wit_world.imports.types import Sampling

    WIT_VERSION = "0.2.0"
except ImportError:
    _inference = None
    Progress = None
    Sampling = None
    WIT_VERSION = "0.1.0"

__all__ = [
    "Message", "Reward", "Score", "Task", "Unscorable", "WIT_VERSION", "config", "generate", "logprobs", "progress",
    "reward", "reward_group",
]


class Unscorable(Exception):
    """Raise with the reason when a completion cannot be scored."""


def _score_of(reward: float, note: Optional[str] = None, **parts: float) -> Score:
    """A score with this reward, named parts (`correct=1.0`) in the order given, and a note."""
    return Score(float(reward), [(name, float(value)) for name, value in parts.items()], note)


Score.of = staticmethod(_score_of)

_MISSING = object()


def config(key: str, default=_MISSING):
    """The plugin's setting `key` (parsed from its JSON text), or `default` when absent."""
    text = _config.get(key)
    if text is None:
        if default is _MISSING:
            raise Unscorable(f"config key `{key}` is not set")
        return default
    try:
        return json.loads(text)
    except ValueError as e:
        raise Unscorable(f"config key `{key}`: {e} (value: {text})")


_progress = None


def progress():
    """Where the run stands for the group being scored (`step`, `steps`; both 0 outside
    training). wirl:rl@0.2.0 plugins only."""
    if WIT_VERSION != "0.2.0":
        raise Unscorable("progress() needs wirl:rl@0.2.0: name `reward-plugin@0.2.0` on the wirl-world line")
    return _progress


def generate(conversations, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
             min_p: float = 0.0, stop=(), seed: Optional[int] = None):
    """One completion of the model per conversation (a list of `Message`s ending where the
    model writes the next assistant turn): an LLM judge's verdicts. In `wirl train` the model
    being trained, within the budget of this reward's `[[rewards]]` entry; raises
    `Unscorable` with the host's reason when refused (budget spent, no model here).
    wirl:rl@0.2.0 plugins only."""
    if _inference is None:
        raise Unscorable("generate() needs wirl:rl@0.2.0: name `reward-plugin@0.2.0` on the wirl-world line")
    sampling = Sampling(max_tokens, float(temperature), float(top_p), top_k, float(min_p), list(stop), seed)
    try:
        return _inference.generate([list(c) for c in conversations], sampling)
    except Err as refused:
        raise Unscorable(f"the model: {refused.value}")


def logprobs(replies):
    """How likely the model finds each reply: `replies` is a list of `(conversation, reply)`
    pairs (a conversation is a list of `Message`s; the reply is read as the assistant's next
    turn). Returns one result per reply with `.tokens` (each token's text; they join into the
    reply) and `.logprobs` (each token's natural-log probability). Within the same budget as
    `generate` (the replies' tokens count as generated ones); raises `Unscorable` with the
    host's reason when refused (the budget, the context, no model, a server that only
    samples). wirl:rl@0.2.0 plugins only."""
    if _inference is None:
        raise Unscorable("logprobs() needs wirl:rl@0.2.0: name `reward-plugin@0.2.0` on the wirl-world line")
    asked = [_inference.ReplyToScore(list(conversation), reply) for conversation, reply in replies]
    try:
        return _inference.logprobs(asked)
    except Err as refused:
        raise Unscorable(f"the model: {refused.value}")


_scorer: Optional[Callable[[Task, str], Score]] = None
_group_scorer: Optional[Callable[[Task, List[str]], List[Score]]] = None


def reward(function: Callable[[Task, str], Score]) -> Callable[[Task, str], Score]:
    """Make `function(task, completion) -> Score` this plugin's reward."""
    global _scorer
    _scorer = function
    return function


def reward_group(function: Callable[[Task, List[str]], List[Score]]) -> Callable[[Task, List[str]], List[Score]]:
    """Optionally, score a whole group at once (to share work across it)."""
    global _group_scorer
    _group_scorer = function
    return function


def _reason(error: BaseException) -> str:
    if isinstance(error, Unscorable):
        return str(error)
    frame = traceback.extract_tb(error.__traceback__)[-1:] or None
    where = f" (at line {frame[0].lineno} of {frame[0].filename})" if frame else ""
    return f"{type(error).__name__}: {error}{where}"


def _call(task: Task, completion: str) -> Score:
    if _scorer is None:
        raise Unscorable("this plugin defines no reward: decorate a function with @wirl.reward")
    return _scorer(task, completion)


class Reward(exports.Reward):
    """The export componentize-py looks for; it calls the decorated function."""

    def score_completion(self, task: Task, completion: str) -> Score:
        try:
            return _call(task, completion)
        except Exception as error:
            raise Err(_reason(error))

    def score_group(self, task: Task, completions: List[str], progress=None) -> List[Result[Score, str]]:
        global _progress
        _progress = progress  # 0.2.0 tells the step; 0.1.0 calls without it
        if _group_scorer is not None:
            try:
                return [Ok(score) for score in _group_scorer(task, completions)]
            except Exception as error:
                return [Err(_reason(error)) for _ in completions]
        results: List[Result[Score, str]] = []
        for completion in completions:
            try:
                results.append(Ok(_call(task, completion)))
            except Exception as error:
                results.append(Err(_reason(error)))
        return results
