"""What every public call checks at the edge, each error naming the argument and what to give.

A trainer hands a reward function whatever its dataset and its own code made; a value that is
silently reinterpreted (a string scored character by character, a missing answer turned into
the text ``"nan"``) is a wrong reward nobody can see. So arguments are checked here, before
anything is scored, and refused by name.
"""

import math
import os

class WrongType(TypeError, ValueError):
    """An argument of the wrong type: a TypeError, and a ValueError as the package's checks
    raised before they told the two apart (callers catching either still do)."""


# The longest per-call deadline a plugin may be given: an hour is far past any reward or
# episode step, and keeps a typo (or 2**64 - 1) from meaning "never".
MAX_DEADLINE_MS = 3_600_000
# The sandbox's largest instance (the pool's slot size).
MAX_MEMORY_MIB = 4096
# Threads of one batch; far past any machine's cores, short of exhausting the process.
MAX_THREADS = 1024
# Worker processes of one code runner (the sandbox's MAX_WORKERS).
MAX_WORKERS = 64


def reference(value, name):
    """A plugin reference: ``builtin:NAME`` as it is, a path made absolute (so a pickled
    object finds it from another working directory)."""
    if isinstance(value, (bytes, bytearray)):
        raise WrongType(f"{name} must be a str or a path, not bytes: decode it ({name}={bytes(value)[:60]!r}...)")
    try:
        path = os.fspath(value)
    except TypeError:
        raise WrongType(
            f"{name} must be a built-in (\"builtin:math-answer\") or a component file's path, not {type(value).__name__}"
        ) from None
    if not isinstance(path, str):
        raise WrongType(f"{name} must be a str or a path, not {type(path).__name__}")
    if not path.strip():
        raise ValueError(f"{name} is empty: give a built-in (\"builtin:math-answer\", see wirl.builtins()) or a .wasm file")
    if "\0" in path:
        raise ValueError(f"{name} contains a NUL character: {path[:80]!r}")
    return path if path.startswith("builtin:") else os.path.abspath(path)


def whole(value, name, low, high, *, optional=True):
    """A whole number from ``low`` to ``high`` (None when optional)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise WrongType(f"{name} must be a whole number from {low} to {high}, not {value!r:.60}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, not {value}")
    return value


def progress(step, steps):
    """A training run's ``step`` of ``steps``, each a whole number (0 of 0: outside
    training)."""
    return whole(step, "step", 0, 2**62, optional=False), whole(steps, "steps", 0, 2**62, optional=False)


def finite(value, name):
    """A finite number, as a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise WrongType(f"{name} must be a finite number, not {value!r:.60}")
    try:
        number = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be a finite number, not {value}") from None
    if not math.isfinite(number):
        raise ValueError(f"{name} must be a finite number, not {value!r}")
    return number


def flag(value, name):
    if not isinstance(value, bool):
        raise WrongType(f"{name} must be True or False, not {value!r:.60}")
    return value


def text_or_none(value, name):
    if value is not None and not isinstance(value, str):
        raise WrongType(f"{name} must be a str or None, not {type(value).__name__}")
    return value


def batch(value, name):
    """One value per completion, as a list. A str is one text, not a batch of characters: a
    trainer that passed one would be scored a reward per character."""
    if isinstance(value, (str, bytes, bytearray, dict)):
        raise WrongType(
            f"{name} must be a list with one entry per completion, not a single {type(value).__name__}: "
            f"wrap it ({name}=[...])"
        )
    try:
        return list(value)
    except TypeError:
        raise WrongType(f"{name} must be a list with one entry per completion, not {type(value).__name__}") from None


def is_missing(value):
    """None, NaN (float, numpy, Decimal) or pandas' NA/NaT: a dataset's empty cell."""
    if value is None:
        return True
    if isinstance(value, (str, bytes, int)):
        return False
    try:
        return bool(value != value)
    except (TypeError, ValueError):
        return type(value).__name__ in ("NAType", "NaTType")
