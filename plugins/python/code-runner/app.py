# wirl-world: code-runner-plugin
# wirl-python-packages: pytest==8.3.5 pluggy==1.5.0 iniconfig==2.0.0 packaging==24.2
"""wirl's Python code runner: CPython inside a component, one untrusted program per instance.

The host makes a fresh instance for every program (nothing a program does can reach the
next one), gives it no files, network, environment or subprocesses, and enforces the
wall-clock, fuel, memory and output limits from outside the interpreter. The program's
prints go to the component's stdout and stderr, which the host captures (bounded); this
module only sets up stdin and argv, runs the program as `__main__` and reports its exit
status the way `python3 program.py` would.

componentize-py snapshots the interpreter after importing this module, and there is no
standard library on a filesystem at run time: every module a program may import must be
imported here, at build time.
"""

import sys
import io
import traceback
import types

# The standard library that programs may import (what test code and solutions use). Each
# costs snapshot size, not run time.
import abc, array, base64, binascii, bisect, calendar, cmath, collections, collections.abc  # noqa: E401,F401
import contextlib, copy, csv, dataclasses, datetime, decimal, difflib, enum, fractions  # noqa: E401,F401
import functools, hashlib, heapq, itertools, json, keyword, math, numbers, operator  # noqa: E401,F401
import pprint, queue, random, re, statistics, string, struct, textwrap, time, typing  # noqa: E401,F401
import unicodedata, uuid, weakref, zlib, ast, inspect, locale, warnings, os  # noqa: E401,F401

# pytest, for SandboxFusion's `pytest` language: the program is a test file and pytest runs
# it. Every module of pytest's own is imported here, into the snapshot (at run time nothing
# can be imported that was not). A runner built without it (the humaneval runner) says so.
try:
    import importlib
    import pkgutil

    import _pytest
    import pytest

    for _module in pkgutil.walk_packages(_pytest.__path__, "_pytest."):
        # Only what a WASI CPython lacks fails here (pdb for --pdb, faulthandler's timers);
        # the plugins that need it are turned off in PYTEST_ARGS.
        try:
            importlib.import_module(_module.name)
        except ImportError:
            pass
except ImportError:
    pytest = None

from wit_world import exports
from wit_world.exports.code_runner import Outcome, Program, Limits, Termination_Exited

# Exit status of a program that raised (what CPython's own `main` returns).
UNCAUGHT_EXCEPTION = 1
# Exit status for a program in a language this runner does not speak (as a shell's "not found").
UNSUPPORTED_LANGUAGE = 127


class _ProcessExit(BaseException):
    """`os._exit(status)` in flight: WASI 0.2's exit carries only success or failure, so
    the runner ends the program itself, with the status the program gave."""

    def __init__(self, status: int):
        super().__init__(status)
        self.status = status


def _os_exit(status):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    raise _ProcessExit(int(status) & 0xFF)


os._exit = _os_exit


def _exit_status(exit: SystemExit) -> int:
    """What `sys.exit(code)` means as a process exit status, as CPython decides it."""
    code = exit.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if code >= 0 else code
    # sys.exit("message") prints the message and exits 1.
    try:
        print(code, file=sys.stderr)
    except Exception:
        pass
    return 1


def _run(source: str) -> int:
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    try:
        code = compile(source, "<program>", "exec")
        exec(code, main.__dict__)
        return 0
    except SystemExit as exit:
        return _exit_status(exit)
    except _ProcessExit as exit:
        return exit.status
    except BaseException:
        # A SyntaxError lands here too, with the offending line, as `python3` prints it.
        try:
            traceback.print_exc()
        except BaseException:
            pass
        return UNCAUGHT_EXCEPTION


# Where a pytest program is written (the run's own directory is the instance's `/`), and
# pytest's arguments: as `pytest test_program.py` runs it, less what WASI cannot have —
# fd-level capture (no dup), pdb, faulthandler, the cache directory, the log file on
# /dev/null — with temporary directories kept inside the run's directory.
PYTEST_FILE = "/test_program.py"
PYTEST_ARGS = [
    "--capture=sys",
    "--basetemp=/.pytest-tmp",
    "-p", "no:cacheprovider",
    "-p", "no:faulthandler",
    "-p", "no:debugging",
    "-p", "no:pastebin",
    "-p", "no:logging",
    "-p", "no:stepwise",
    "-o", "console_output_style=classic",
]
# pytest's own "usage error" exit status, for a run that cannot start.
PYTEST_USAGE_ERROR = 4


def _run_pytest(source: str) -> int:
    if pytest is None:
        print("this runner was built without pytest (it runs plain python only)", file=sys.stderr)
        return PYTEST_USAGE_ERROR
    try:
        with open(PYTEST_FILE, "w", encoding="utf-8") as file:
            file.write(source)
    except OSError as error:
        print(f"pytest runs need the run's own directory (POST /run_code gives one): {error}", file=sys.stderr)
        return PYTEST_USAGE_ERROR
    sys.argv = ["pytest"]
    sys.dont_write_bytecode = True
    try:
        return int(pytest.main([*PYTEST_ARGS, PYTEST_FILE]))
    except SystemExit as exit:
        return _exit_status(exit)
    except _ProcessExit as exit:
        return exit.status
    except BaseException:
        traceback.print_exc()
        return UNCAUGHT_EXCEPTION


class CodeRunner(exports.CodeRunner):
    def run(self, program: Program, limits: Limits) -> Outcome:
        language = program.language.lower()
        if language not in ("python", "python3", "py", "pytest"):
            message = f"this runner speaks python and pytest, not {program.language!r}\n"
            return Outcome(Termination_Exited(UNSUPPORTED_LANGUAGE), "", message, False, 0)
        sys.stdin = io.StringIO(program.stdin)
        sys.argv = ["<program>", *program.args]
        status = _run_pytest(program.source) if language == "pytest" else _run(program.source)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        # Output went to the component's stdout and stderr, which the host captured.
        return Outcome(Termination_Exited(status), "", "", False, 0)
