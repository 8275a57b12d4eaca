#!/usr/bin/env python3
"""The differential corpus of builtin:math-verify: gold/prediction pairs labelled by
Math-Verify itself (PyPI `math-verify`, in the peers' venv: ../shared/peers/setup.sh).

    ~/.cache/wirl-peers/venv/bin/python scripts/math-verify-corpus.py > plugins/rust/math-verify/tests/corpus.jsonl
    ... scripts/math-verify-corpus.py --tests DIR   # Math-Verify's own test cases instead
                                                    # (DIR: a checkout's tests/; not committed)

Generated pairs (seeded, so the file is the same on every run): right answers rewritten the
ways models and textbooks write them (0.5 / \\frac12 / 50\\%, 1,000 / 1000, reordered sets,
[1,2) / 1 \\le x < 2, (x+1)^2 / x^2+2x+1, pmatrix / bmatrix, x = 3 / 3) and near-misses of
each (another value, another order where order matters, an open end for a closed one), each
inside a completion the ways models end one (\\boxed{}, "The answer is $…$", a bare value).
Each line: {"class", "gold", "pred", "math_verify"} where math_verify is
verify(parse(gold), parse(pred)) with TRL's extraction config
(LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()), float_rounding 6.
"""
import argparse
import ast
import json
import pathlib
import random
import sys

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

CONFIG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def oracle(gold: str, pred: str) -> bool:
    return bool(verify(parse(gold, CONFIG), parse(pred, CONFIG), float_rounding=6))


def frac(a, b):
    return rf"\frac{{{a}}}{{{b}}}"


def generated(rng: random.Random):
    """(class, gold answer, [(prediction answer, note)]) triples; the answers are LaTeX."""
    for _ in range(40):
        n = rng.randint(1000, 9_999_999)
        s = f"{n:,}"
        yield "thousands", str(n), [s, s.replace(",", "{,}"), s.replace(",", "\\,"), str(n + rng.choice([1, 10, 1000])), f"{n}.0"]
    for _ in range(30):
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        v = a + b / 100
        yield "decimals", f"{v:.2f}", [f"{v:.2f}".replace(".", ","), f"{v:.4f}", f"{v + 0.01:.2f}", f"\\${v:.2f}", f"{v:.2f} \\text{{ dollars}}"]
    for _ in range(40):
        a, b = rng.randint(1, 30), rng.randint(2, 30)
        if a % b == 0:
            continue
        yield "fractions", frac(a, b), [f"{a}/{b}", rf"\dfrac{{{a}}}{{{b}}}", frac(2 * a, 2 * b), f"{a / b:.6f}", f"{a / b:.3f}", frac(a + 1, b), frac(b, a)]
    for _ in range(20):
        p = rng.choice([5, 10, 12.5, 20, 25, 40, 50, 75])
        yield "percent", f"{p}\\%", [f"{p / 100}", frac(int(p * 2), 200) if p * 2 == int(p * 2) else str(p / 100), f"{p}", f"{p + 5}\\%", f"{p / 100 + 0.1}"]
    for _ in range(30):
        a, b = rng.randint(2, 9), rng.choice([2, 3, 5, 6, 7])
        yield "radicals", rf"{a}\sqrt{{{b}}}", [rf"\sqrt{{{a * a * b}}}", rf"{a} \sqrt{b}", rf"\sqrt{{{b}}} \cdot {a}", rf"{a + 1}\sqrt{{{b}}}", rf"\sqrt{{{a * b}}}", f"{a * b ** 0.5:.6f}"]
    for _ in range(20):
        a, b = rng.randint(1, 7), rng.randint(2, 8)
        yield "pi", rf"\frac{{{a}\pi}}{{{b}}}", [rf"{frac(a, b)}\pi", rf"\frac{{{a}}}{{{b}}} \pi", rf"{a}\pi/{b}", rf"\frac{{{a + 1}\pi}}{{{b}}}", f"{3.141592653589793 * a / b:.6f}"]
    for _ in range(40):
        xs = rng.sample(range(-20, 40), rng.randint(2, 5))
        shuffled = xs[:]
        rng.shuffle(shuffled)
        other = xs[:-1] + [xs[-1] + 1]
        yield "sets", r"\{" + ", ".join(map(str, xs)) + r"\}", [
            r"\{" + ", ".join(map(str, shuffled)) + r"\}",
            ", ".join(map(str, shuffled)),
            r"\{" + ", ".join(map(str, other)) + r"\}",
            r"\{" + ", ".join(map(str, xs[:-1])) + r"\}",
        ]
    for _ in range(30):
        xs = [rng.randint(-9, 9) for _ in range(rng.randint(2, 4))]
        rev = list(reversed(xs))
        yield "tuples", "(" + ", ".join(map(str, xs)) + ")", [
            "(" + ",".join(map(str, xs)) + ")",
            r"\left(" + ", ".join(map(str, xs)) + r"\right)",
            "(" + ", ".join(map(str, rev)) + ")" if rev != xs else "(" + ", ".join(map(str, xs + [0])) + ")",
            "(" + ", ".join(map(str, xs[:-1] + [xs[-1] + 2])) + ")",
        ]
    for _ in range(40):
        a = rng.randint(-10, 5)
        b = a + rng.randint(1, 10)
        lo, hi = rng.choice(["[", "("]), rng.choice(["]", ")"])
        le = {"[": r"\le", "(": "<"}[lo]
        ge = {"]": r"\le", ")": "<"}[hi]
        flip = {"[": "(", "(": "["}[lo]
        yield "intervals", f"{lo}{a}, {b}{hi}", [
            f"{lo}{a},{b}{hi}",
            rf"x \in {lo}{a}, {b}{hi}",
            rf"{a} {le} x {ge} {b}",
            f"{flip}{a}, {b}{hi}",
            f"{lo}{a}, {b + 1}{hi}",
            rf"\left{lo}{a}, {b}\right{hi}",
        ]
    for _ in range(20):
        a = rng.randint(-10, 10)
        yield "unbounded", rf"[{a}, \infty)", [rf"x \ge {a}", rf"x \geq {a}", rf"[{a},\infty)", rf"x > {a}", rf"({a}, \infty)", rf"x \in [{a}, +\infty)"]
    for _ in range(30):
        a = rng.randint(-20, 20)
        yield "equations", f"x = {a}", [str(a), f"x={a}", f"{a} = x", f"x = {a + 1}", f"y = {a}"]
    for _ in range(30):
        a, b = rng.randint(1, 5), rng.randint(1, 9)
        yield "expressions", f"(x+{b})^2", [f"x^2 + {2 * b}x + {b * b}", f"(x + {b})(x + {b})", f"x^2 + {b * b}", f"(y+{b})^2", f"x^{{2}}+{2 * b}x+{b * b}"]
        yield "expressions", f"{a}x + {b}", [f"{b} + {a}x", f"{a} \\cdot x + {b}", f"{a}x - {b}", f"{a + 1}x + {b}"]
    for _ in range(20):
        m = [[rng.randint(-5, 9) for _ in range(2)] for _ in range(2)]
        body = r" \\ ".join(" & ".join(map(str, r)) for r in m)
        changed = r" \\ ".join(" & ".join(map(str, r)) for r in [m[0], [m[1][0], m[1][1] + 1]])
        yield "matrices", rf"\begin{{pmatrix}} {body} \end{{pmatrix}}", [
            rf"\begin{{bmatrix}} {body} \end{{bmatrix}}",
            rf"\begin{{pmatrix}}{body}\end{{pmatrix}}",
            rf"\begin{{pmatrix}} {changed} \end{{pmatrix}}",
        ]
    for _ in range(15):
        a = rng.randint(2, 9)
        yield "plus-minus", rf"{a} \pm \sqrt{{2}}", [rf"{a} + \sqrt{{2}}, {a} - \sqrt{{2}}", rf"{a} - \sqrt{{2}}, {a} + \sqrt{{2}}", rf"{a} + \sqrt{{2}}", rf"{a + 1} \pm \sqrt{{2}}"]
    for word in ["yes", "no", "even", "odd", "Monday", "impossible"]:
        yield "text", rf"\text{{{word}}}", [rf"\text{{{word}}}", rf"\text{{{word.upper()}}}", r"\text{maybe}"]
    for _ in range(20):
        a = rng.randint(10, 90)
        yield "degrees-units", str(a), [rf"{a}^\circ", rf"{a}^{{\circ}}", rf"{a} \text{{ cm}}", rf"{a}\text{{ meters}}", rf"{a + 1}^\circ"]


WRAPS = [
    lambda x: rf"So the final result is $\boxed{{{x}}}$.",
    lambda x: rf"Therefore, \boxed{{{x}}}",
    lambda x: f"The answer is ${x}$.",
    lambda x: rf"We conclude that \[ {x} \]",
    lambda x: f"Final answer: ${x}$",
]


def own_tests(directory: pathlib.Path):
    """Math-Verify's own (gold, pred) pairs: the tuples of its parametrized tests."""
    for path in sorted(directory.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Tuple) and len(node.elts) == 3 and all(isinstance(e, ast.Constant) for e in node.elts):
                gold, pred, expected = (e.value for e in node.elts)
                if isinstance(gold, str) and isinstance(pred, str) and expected in (0, 1, True, False):
                    yield path.stem, gold, pred


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tests", type=pathlib.Path, help="Math-Verify's tests/ directory: label its own cases instead")
    ap.add_argument("--seed", type=int, default=5)
    args = ap.parse_args()
    rows = []
    if args.tests:
        for cls, gold, pred in own_tests(args.tests):
            rows.append((cls, gold, pred))
    else:
        rng = random.Random(args.seed)
        for cls, gold, preds in generated(rng):
            for pred in preds:
                wrap = rng.choice(WRAPS)
                rows.append((cls, f"${gold}$", wrap(pred)))
    for cls, gold, pred in rows:
        try:
            label = oracle(gold, pred)
        except Exception as e:  # Math-Verify raising is a case it cannot judge: left out
            print(f"skipped ({type(e).__name__}): {gold!r} vs {pred!r}", file=sys.stderr)
            continue
        print(json.dumps({"class": cls, "gold": gold, "pred": pred, "math_verify": label}, ensure_ascii=False))


if __name__ == "__main__":
    main()
