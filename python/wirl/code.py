"""Model-written Python in a fresh CPython instance per program, and a grader for code tasks."""

import math
import os
import threading

from . import _checks, _native

__all__ = ["CodeRunner", "LANGUAGES", "RunResult", "code_tests_grader", "humaneval_grader", "plugin_path", "run_code", "run_python"]

_PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins")

# The most a call may ask for: the runner made for run_python is configured at these, and
# each call asks for its own limits below them.
MAX_TIMEOUT_S = 600.0
MAX_MEMORY_MIB = 4096

# The languages whose runners the package carries: each name (and its aliases, as
# SandboxFusion names them) and the component.
LANGUAGES = {"python": "code_runner", "javascript": "js_code_runner", "lua": "lua_code_runner", "ruby": "ruby_code_runner"}
_ALIASES = {"python3": "python", "py": "python", "js": "javascript", "nodejs": "javascript", "node": "javascript", "lua5.4": "lua", "rb": "ruby"}


def _language(language):
    if not isinstance(language, str):
        raise TypeError(f"language must be a str, not {type(language).__name__}")
    name = _ALIASES.get(language.lower(), language.lower())
    if name not in LANGUAGES:
        raise ValueError(f"language {language!r}: this package runs {', '.join(sorted(LANGUAGES))} (and {', '.join(sorted(_ALIASES))})")
    return name


def plugin_path(name):
    """The path of a component this package carries: ``code_runner``, ``humaneval_runner``,
    ``humaneval_grader``."""
    path = os.path.join(_PLUGINS, f"{name}.wasm")
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"{path}: this installation of wirl carries no {name}.wasm. It comes with a package built by "
            f"`bash scripts/python-package` in wirl's repository (which builds it with scripts/build-plugins); "
            f"or pass the component's path yourself (runner=...)."
        )
    return path


class RunResult:
    """How a program ended: ``verdict`` (``exited``, ``timed_out``, ``out_of_memory``,
    ``out_of_fuel``, ``output_limit``, ``crashed``; or ``infrastructure`` when the runner could
    not run it at all — a worker process killed from outside, no instance to be had — which
    says nothing of the program), ``exit_code`` (when it exited), ``stdout``, ``stderr`` (at
    most the output limit each; ``truncated`` when cut), ``duration_ms``; ``crash`` says how
    the interpreter crashed, or what became of the runner."""

    __slots__ = ("verdict", "exit_code", "crash", "stdout", "stderr", "truncated", "duration_ms")

    def __init__(self, verdict, exit_code, crash, stdout, stderr, truncated, duration_ms):
        self.verdict = verdict
        self.exit_code = exit_code
        self.crash = crash
        self.stdout = stdout
        self.stderr = stderr
        self.truncated = truncated
        self.duration_ms = duration_ms

    @property
    def ok(self):
        """It ran to its end and exited with status 0."""
        return self.verdict == "exited" and self.exit_code == 0

    def __repr__(self):
        how = {
            "exited": f"exited({self.exit_code})",
            "crashed": f"crashed({self.crash!r})",
            "infrastructure": f"infrastructure({self.crash!r})",
        }.get(self.verdict, self.verdict)
        return f"RunResult({how}, stdout={self.stdout[:60]!r}, stderr={self.stderr[-60:]!r}, {self.duration_ms} ms)"


def _timeout_ms(timeout_s):
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s):
        raise ValueError(f"timeout_s must be a finite number of seconds, not {timeout_s!r}")
    if not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout_s must be above 0 and at most {MAX_TIMEOUT_S:g}, not {timeout_s!r}")
    return max(1, int(timeout_s * 1000))


def _memory_bytes(memory_mib):
    if isinstance(memory_mib, bool) or not isinstance(memory_mib, int) or not 1 <= memory_mib <= MAX_MEMORY_MIB:
        raise ValueError(f"memory_mib must be a whole number from 1 to {MAX_MEMORY_MIB}, not {memory_mib!r}")
    return memory_mib << 20


class CodeRunner:
    """A code-runner component (by default the CPython one this package carries) that runs
    each program in a fresh instance: no files, no network, no environment, no clock beyond
    its limits. ``timeout_s``, ``memory_mib`` and ``max_output_bytes`` are the most a
    program may use (a call may ask for less); ``workers`` runs the programs in that many
    child processes (they scale with cores as subprocesses do); a batch runs on ``threads``
    threads without the GIL."""

    def __init__(
        self,
        runner=None,
        *,
        language="python",
        timeout_s=MAX_TIMEOUT_S,
        memory_mib=MAX_MEMORY_MIB,
        max_output_bytes=1 << 20,
        workers=0,
        threads=None,
    ):
        self.language = _language(language)
        runner = plugin_path(LANGUAGES[self.language]) if runner is None else _checks.reference(runner, "runner")
        _checks.whole(max_output_bytes, "max_output_bytes", 1, 2**32 - 1, optional=False)
        _checks.whole(workers, "workers", 0, _checks.MAX_WORKERS, optional=False)
        _checks.whole(threads, "threads", 1, _checks.MAX_THREADS)
        self.runner = runner
        self._args = (runner, self.language, timeout_s, memory_mib, max_output_bytes, workers, threads)
        self._native = _native.NativeCodeRunner(
            runner,
            deadline_ms=_timeout_ms(timeout_s),
            memory_mib=_memory_bytes(memory_mib) >> 20,
            max_output_bytes=max_output_bytes,
            workers=workers,
            threads=threads,
        )
        self.sha256 = self._native.sha256

    @property
    def workers(self):
        return self._native.workers

    def worker_pids(self):
        return self._native.worker_pids()

    def run(self, code, stdin=None, *, args=(), timeout_s=10.0, memory_mib=512):
        """Run one program; a :class:`RunResult`."""
        return self.run_many([code], stdin=stdin, args=args, timeout_s=timeout_s, memory_mib=memory_mib)[0]

    def run_many(self, codes, stdin=None, *, args=(), timeout_s=10.0, memory_mib=512):
        """Run programs concurrently, each in its own instance; results in order."""
        codes = _checks.batch(codes, "codes")
        for index, code in enumerate(codes):
            if not isinstance(code, str):
                raise TypeError(f"program {index}: code must be a str, not {type(code).__name__}")
        if stdin is not None and not isinstance(stdin, str):
            raise TypeError(f"stdin must be a str, not {type(stdin).__name__}")
        argv = [str(a) for a in _checks.batch(args, "args")]
        programs = [(self.language, code, stdin or "", argv) for code in codes]
        ran = self._native.run(programs, wall_ms=_timeout_ms(timeout_s), memory_bytes=_memory_bytes(memory_mib))
        return [RunResult(*r) for r in ran]

    def __reduce__(self):
        return (_runner_again, (*self._args, self.sha256))


def _runner_again(runner, language, timeout_s, memory_mib, max_output_bytes, workers, threads, sha256):
    from .reward import unchanged

    again = CodeRunner(
        runner,
        language=language,
        timeout_s=timeout_s,
        memory_mib=memory_mib,
        max_output_bytes=max_output_bytes,
        workers=workers,
        threads=threads,
    )
    unchanged(runner, "code runner", sha256, again.sha256)
    return again


_defaults = {}
_default_lock = threading.Lock()


def run_code(code, language="python", stdin=None, *, args=(), timeout_s=10.0, memory_mib=512):
    """Run ``code`` in ``language`` (``python``; ``javascript``, also ``js``/``nodejs``, run
    as ``node`` would; ``lua``, as ``lua`` 5.4 would; ``ruby``, as ``ruby`` 3.4 would) in a
    fresh sandboxed interpreter; a :class:`RunResult`. Never raises for what the program does."""
    name = _language(language)
    with _default_lock:
        if name not in _defaults:
            _defaults[name] = CodeRunner(language=name)
        runner = _defaults[name]
    return runner.run(code, stdin, args=args, timeout_s=timeout_s, memory_mib=memory_mib)


def run_python(code, stdin=None, *, args=(), timeout_s=10.0, memory_mib=512):
    """Run ``code`` in a fresh sandboxed CPython; a :class:`RunResult` (``stdout``,
    ``stderr``, ``exit_code``, ``verdict``). Never raises for what the program does."""
    return run_code(code, "python", stdin, args=args, timeout_s=timeout_s, memory_mib=memory_mib)


def humaneval_grader(*, timeout_ms=3000, memory_mib=256, deadline_ms=300_000, workers=0, threads=None, runner=None, **reward_args):
    """A :class:`wirl.Reward` that grades unit-test code tasks (HumanEval / MBPP shape: task
    metadata ``{"prompt", "test", "entry_point"}``; in TRL, columns ``test`` and
    ``entry_point`` beside a plain-text prompt). The model's code and the tests never share an
    interpreter, so nothing the code does (``exit(0)``, printing "passed", rebinding
    ``AssertionError``, patching the tests) changes the verdict: reward 1 when every test
    passes, else 0, with the reason in the score's note. ``timeout_ms`` and ``memory_mib``
    bound each candidate program; ``deadline_ms`` the whole grading of one completion."""
    from .reward import Reward

    return Reward(
        plugin_path("humaneval_grader"),
        {"timeout_ms": timeout_ms, "memory_mib": memory_mib},
        deadline_ms=deadline_ms,
        code_runner=runner or plugin_path("humaneval_runner"),
        code_workers=workers,
        threads=threads,
        **reward_args,
    )


def code_tests_grader(
    language="python",
    *,
    timeout_ms=6000,
    memory_mib=256,
    partial_credit=False,
    deadline_ms=600_000,
    workers=0,
    threads=None,
    runner=None,
    **reward_args,
):
    """A :class:`wirl.Reward` that judges stdin/stdout code tasks (CodeContests, APPS, TACO,
    LiveCodeBench; ``builtin:code-tests``): the completion's last fenced code block runs once
    per test case, in ``language``'s runner, the case's input on stdin; reward 1 when every
    case prints its expected output (compared line by line, trailing whitespace ignored), else
    0 — or the fraction passed before the first failure with ``partial_credit``. Task
    metadata (in TRL, columns): ``tests`` (``[{"input", "output"}]``), or ``inputs`` and
    ``outputs``, or APPS' ``input_output``; optionally ``time_limit_ms``. ``timeout_ms`` and
    ``memory_mib`` bound each case's run; ``deadline_ms`` the whole grading of a completion."""
    from .reward import Reward

    name = _language(language)
    return Reward(
        "builtin:code-tests",
        {"timeout_ms": timeout_ms, "memory_mib": memory_mib, "language": name, "partial_credit": partial_credit},
        deadline_ms=deadline_ms,
        code_runner=runner or plugin_path(LANGUAGES[name]),
        code_workers=workers,
        threads=threads,
        **reward_args,
    )
