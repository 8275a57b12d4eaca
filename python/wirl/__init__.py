"""wirl's WebAssembly sandbox in Python, in process.

- :class:`Reward` — a reward plugin (``builtin:math-answer`` or a ``.wasm`` file) as the reward
  function TRL's ``GRPOTrainer`` takes (``reward_funcs=[wirl.Reward(...)]``), with verl's
  ``compute_score`` and OpenRLHF's ``reward_func`` as methods; :class:`AsyncReward` for
  trainers that await their rewards.
- :func:`run_python`, :func:`run_code` (Python, JavaScript) and :class:`CodeRunner` —
  model-written code, each program in a fresh interpreter instance (CPython, SpiderMonkey)
  inside a component, under time, memory and output limits;
  :func:`humaneval_grader` — a grader whose verdict the model's code cannot forge;
  :func:`code_tests_grader` — stdin/stdout test cases (CodeContests, APPS, LiveCodeBench).
- :class:`Environment` — an environment plugin's tasks and multi-turn episodes.

Every call ends: a plugin that loops, allocates without end, traps or returns NaN fails that
call with a named verdict (``deadline``, ``memory``, ``trap``, ``non_finite``, ...), and the
next call works. Calls run on threads of their own with the GIL released.
"""

from . import _native
from ._native import WIT_PACKAGE, WIT_VERSION, WIT_VERSIONS, PluginError
from .code import LANGUAGES, CodeRunner, RunResult, code_tests_grader, humaneval_grader, plugin_path, run_code, run_python
from .environment import Environment, Episode, StepResult
from .reward import AsyncReward, Reward, Score

__version__ = _native.VERSION

__all__ = [
    "AsyncReward",
    "CodeRunner",
    "LANGUAGES",
    "Environment",
    "Episode",
    "PluginError",
    "Reward",
    "RunResult",
    "Score",
    "StepResult",
    "WIT_PACKAGE",
    "WIT_VERSION",
    "WIT_VERSIONS",
    "builtins",
    "code_tests_grader",
    "humaneval_grader",
    "plugin_path",
    "run_code",
    "run_python",
]


def builtins():
    """The plugins built into wirl: ``[(reference, what it is, sha256), ...]``."""
    return _native.builtins()


def _register_worker_command():
    # Code runners with workers start children of this interpreter, which import this very
    # package (from wherever it was imported here) and serve their parent.
    import os
    import sys

    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = f"import sys; sys.path.insert(0, {parent!r}); import wirl._worker as w; w.main()"
    _native.set_worker_command(sys.executable, ["-c", source])


_register_worker_command()


def _interrupt_at_exit():
    # Before the interpreter joins its threads at exit: a thread in a batch of programs or
    # reward calls would otherwise hold the exit until its calls end (up to their timeout).
    import threading

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        register(_native.interrupt_all)


_interrupt_at_exit()
