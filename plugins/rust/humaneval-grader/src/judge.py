# The judge: runs the task's own tests in an interpreter where no model-written code ever
# runs. The function under test is a proxy: its answers come from `memo` (what the
# candidate's interpreter returned for each argument list); an argument list not yet asked
# is recorded as pending and answered with a placeholder that cannot be used, so that one
# round finds every call that does not depend on an earlier answer.
import ast
import base64
import json
import marshal
import random
import sys
import traceback



class _WirlPending(BaseException):
    """Raised by a placeholder when the test uses an answer not known yet; a BaseException
    so that a test's `except Exception` does not swallow it."""


class _WirlCandidateRaised(Exception):
    pass


def _unknown_op(*_args, **_kwargs):
    raise _WirlPending()


class _WirlUnknown:
    pass


for _name in (
    "__eq__ __ne__ __lt__ __le__ __gt__ __ge__ __hash__ __bool__ __len__ __iter__ __contains__ "
    "__getitem__ __getattr__ __call__ __add__ __radd__ __sub__ __rsub__ __mul__ __rmul__ __truediv__ "
    "__rtruediv__ __floordiv__ __rfloordiv__ __mod__ __rmod__ __pow__ __rpow__ __neg__ __pos__ "
    "__abs__ __int__ __float__ __index__ __round__ __str__ __repr__ __format__ __and__ __rand__ "
    "__or__ __ror__ __xor__ __rxor__ __lshift__ __rshift__ __invert__ __reversed__ __complex__"
).split():
    setattr(_WirlUnknown, _name, _unknown_op)


_wirl_unknowns = [0, 0]  # placeholders handed out so far; that count when an assert began


def _wirl_begin():
    _wirl_unknowns[1] = _wirl_unknowns[0]


def _wirl_undecided():
    return _wirl_unknowns[0] > _wirl_unknowns[1]


def _name(identifier):
    return ast.Name(identifier, ast.Load())


class _GuardAsserts(ast.NodeTransformer):
    """Wrap every `assert` so that an assertion about an answer not known yet (it used a
    placeholder, or failed on one, as `x is True` does) is skipped this round and checked in
    a later one. In the last round every answer is known and the asserts are the test's own:

        try:
            _wirl_begin()
            assert ...
        except _WirlPending:
            pass
        except AssertionError:
            if not _wirl_undecided():
                raise
    """

    def visit_Assert(self, node):
        begin = ast.Expr(ast.Call(_name("_wirl_begin"), [], []))
        pending = ast.ExceptHandler(type=_name("_WirlPending"), name=None, body=[ast.Pass()])
        decided = ast.UnaryOp(ast.Not(), ast.Call(_name("_wirl_undecided"), [], []))
        reraise = ast.If(test=decided, body=[ast.Raise(exc=None, cause=None)], orelse=[])
        failed = ast.ExceptHandler(type=_name("AssertionError"), name=None, body=[reraise])
        guard = ast.Try(body=[begin, node], handlers=[pending, failed], orelse=[], finalbody=[])
        return ast.copy_location(guard, node)


def _judges_anything(tree):
    """Whether a test can fail: it defines check() or has an assert somewhere."""
    defines_check = any(isinstance(node, ast.FunctionDef) and node.name == "check" for node in tree.body)
    return defines_check or any(isinstance(node, ast.Assert) for node in ast.walk(tree))


def main():
    # Tests that draw random inputs draw the same ones in every round (seeded here, not at
    # import: a runner with this module compiled in reseeds `random` in every instance).
    random.seed(0)
    request = json.loads(sys.stdin.read())
    memo = request["memo"]
    pending = []

    def candidate(*args, **kwargs):
        try:
            key = _wirl_key(args, kwargs)
        except _WirlUnencodable as e:
            raise TypeError(f"the test passed {e}, which cannot be sent to the candidate")
        if key not in memo:
            if key not in pending:
                pending.append(key)
            _wirl_unknowns[0] += 1
            return _WirlUnknown()
        answer = json.loads(memo[key])
        if "ok" in answer:
            return _wirl_dec(answer["ok"])
        raise _WirlCandidateRaised(f"{answer['raise']}: {answer.get('message', '')}")

    namespace = {
        "__name__": "__wirl_judge__",
        "_WirlPending": _WirlPending,
        "_wirl_begin": _wirl_begin,
        "_wirl_undecided": _wirl_undecided,
    }
    # The prompt's and the guarded test's code, as an earlier judge run of this task compiled
    # them (parsing, guarding and compiling the test is most of a judge run); compiled here
    # when the request has none, or one this interpreter cannot read.
    compiled = None
    if request.get("code"):
        try:
            compiled = marshal.loads(base64.b64decode(request["code"]))
        except Exception:
            compiled = None
    fresh = compiled is None
    if fresh:
        tree = ast.parse(request["test"], "<test>")
        if not _judges_anything(tree):
            raise SystemExit(
                "the task's test defines no check(candidate) and asserts nothing: it would pass every completion"
            )
        tree = ast.fix_missing_locations(_GuardAsserts().visit(tree))
        compiled = (compile(request["prompt"], "<prompt>", "exec"), compile(tree, "<test>", "exec"))
    # The task's prompt: the helpers the tests may call, and a docstring-only stand-in for
    # the function under test (never called: the tests get the proxy).
    exec(compiled[0], namespace)
    # Some tests call the function by its own name rather than as `candidate`.
    namespace[request["entry_point"]] = candidate
    # HumanEval's tests define check(candidate), and an error while defining it is the
    # task's (the grader fails the call); MBPP's are bare asserts, judged as they run.
    bare = "check" not in compiled[1].co_names
    if not bare:
        exec(compiled[1], namespace)
    test_lines = request["test"].splitlines()

    failure = None
    try:
        if bare:
            exec(compiled[1], namespace)
        else:
            namespace["check"](candidate)
    except _WirlPending:
        pass
    except AssertionError:
        line = next(
            (f.lineno for f in reversed(traceback.extract_tb(sys.exc_info()[2])) if f.filename == "<test>"), None
        )
        text = test_lines[line - 1].strip() if line and line <= len(test_lines) else ""
        failure = {"reason": "assertion", "detail": f"test line {line}: {text}"[:300]}
    except _WirlCandidateRaised as e:
        reason = "memory" if str(e).startswith("MemoryError") else "exception"
        failure = {"reason": reason, "detail": str(e)[:300]}
    except BaseException as e:
        failure = {"reason": "exception", "detail": f"{type(e).__name__}: {e}"[:300]}

    if pending:
        verdict = {"pending": pending}
    elif failure:
        verdict = {"verdict": "fail", **failure}
    else:
        verdict = {"verdict": "pass"}
    if fresh:
        verdict["code"] = base64.b64encode(marshal.dumps(compiled)).decode()
    sys.stdout.write("__WIRL_JUDGE__" + json.dumps(verdict) + "\n")


# Run as a program (the judge's source whole); imported, it waits to be called: the
# humaneval runner compiles this file into its snapshot and its programs call `main()`.
if __name__ == "__main__":
    main()
