# wirl-world: code-runner-plugin
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

from wit_world import exports
from wit_world.exports.code_runner import Outcome, Program, Limits, Termination_Exited

# Exit status of a program that raised (what CPython's own `main` returns).
UNCAUGHT_EXCEPTION = 1
# Exit status for a program in a language this runner does not speak (as a shell's "not found").
UNSUPPORTED_LANGUAGE = 127


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
    except BaseException:
        # A SyntaxError lands here too, with the offending line, as `python3` prints it.
        try:
            traceback.print_exc()
        except BaseException:
            pass
        return UNCAUGHT_EXCEPTION


class CodeRunner(exports.CodeRunner):
    def run(self, program: Program, limits: Limits) -> Outcome:
        if program.language.lower() not in ("python", "python3", "py"):
            message = f"this runner speaks python, not {program.language!r}\n"
            return Outcome(Termination_Exited(UNSUPPORTED_LANGUAGE), "", message, False, 0)
        sys.stdin = io.StringIO(program.stdin)
        sys.argv = ["<program>", *program.args]
        status = _run(program.source)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:
                pass
        # Output went to the component's stdout and stderr, which the host captured.
        return Outcome(Termination_Exited(status), "", "", False, 0)
