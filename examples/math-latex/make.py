"""Writes examples/math-latex/{train,eval}.jsonl: MATH-style problems of our own whose
answers are LaTeX (fractions, radicals, sets, intervals, points, percentages, matrices,
expressions), as task lines (`wirl tasks`' format: id, messages, answer, metadata).
Seeded: the files are the same on every run.

    python3 examples/math-latex/make.py
"""

import json
import math
import pathlib
import random
from fractions import Fraction

SYSTEM = "Solve the problem. Put the final answer in \\boxed{}, in LaTeX."


def frac(q: Fraction) -> str:
    if q.denominator == 1:
        return str(q.numerator)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def radical(n: int) -> str:
    """sqrt(n) simplified: 5\\sqrt{2} for 50."""
    outside, inside = 1, n
    for k in range(int(math.isqrt(n)), 1, -1):
        if inside % (k * k) == 0:
            outside, inside = outside * k, inside // (k * k)
            break
    if inside == 1:
        return str(outside)
    return f"{outside if outside > 1 else ''}\\sqrt{{{inside}}}"


def problems(rng: random.Random):
    kind = rng.randrange(8)
    if kind == 0:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        c, d = rng.randint(2, 12), rng.randint(2, 12)
        q = Fraction(a, b) + Fraction(c, d)
        return "fraction-sum", f"Compute $\\frac{{{a}}}{{{b}}} + \\frac{{{c}}}{{{d}}}$ as a fraction in lowest terms.", frac(q)
    if kind == 1:
        n = rng.choice([8, 12, 18, 20, 24, 27, 28, 32, 45, 48, 50, 72, 75, 98])
        return "radical", f"Simplify $\\sqrt{{{n}}}$.", radical(n)
    if kind == 2:
        r1, r2 = rng.sample(range(-6, 8), 2)
        b, c = -(r1 + r2), r1 * r2
        poly = f"x^2 {'+' if b >= 0 else '-'} {abs(b)}x {'+' if c >= 0 else '-'} {abs(c)}"
        return "roots", f"Find all solutions of ${poly} = 0$. Give them as a set.", f"\\{{{min(r1, r2)}, {max(r1, r2)}\\}}"
    if kind == 3:
        a, b = rng.randint(2, 5), rng.randint(-9, 9)
        c = rng.randint(-9, 9)
        bound = Fraction(c - b, a)
        op, bracket = rng.choice([("\\ge", "["), ("\\le", "]"), ("<", ")"), (">", "(")])
        if op in ("\\ge", ">"):
            answer = f"{bracket}{frac(bound)}, \\infty)"
        else:
            answer = f"(-\\infty, {frac(bound)}{bracket}"
        return "inequality", f"Solve ${a}x {'+' if b >= 0 else '-'} {abs(b)} {op} {c}$. Write the answer as an interval.", answer
    if kind == 4:
        m1, m2 = rng.sample(range(-4, 5), 2)
        x = rng.randint(-5, 5)
        c1, c2 = rng.randint(-6, 6), 0
        y = m1 * x + c1
        c2 = y - m2 * x
        return "intersection", (
            f"At which point do the lines $y = {m1}x {'+' if c1 >= 0 else '-'} {abs(c1)}$ and "
            f"$y = {m2}x {'+' if c2 >= 0 else '-'} {abs(c2)}$ meet? Give the point $(x, y)$."
        ), f"({x}, {y})"
    if kind == 5:
        part, whole = rng.randint(1, 19), rng.choice([20, 25, 40, 50])
        pct = Fraction(part * 100, whole)
        shown = str(pct.numerator) if pct.denominator == 1 else f"{float(pct):g}"
        return "percent", f"What percent of {whole} is {part}?", f"{shown}\\%"
    if kind == 6:
        a = [[rng.randint(-3, 5) for _ in range(2)] for _ in range(2)]
        b = [[rng.randint(-3, 5) for _ in range(2)] for _ in range(2)]
        s = [[a[i][j] + b[i][j] for j in range(2)] for i in range(2)]
        show = lambda m: "\\begin{pmatrix} " + " \\\\ ".join(" & ".join(map(str, r)) for r in m) + " \\end{pmatrix}"
        return "matrix", f"Compute ${show(a)} + {show(b)}$.", show(s)
    k = rng.randint(2, 6)
    return "expand", f"Expand $(x + {k})^2$.", f"x^2 + {2 * k}x + {k * k}"


def main():
    here = pathlib.Path(__file__).parent
    rng = random.Random(2026)
    for name, count in [("train", 240), ("eval", 60)]:
        with open(here / f"{name}.jsonl", "w") as out:
            for i in range(count):
                kind, question, answer = problems(rng)
                task = {
                    "id": f"math-latex/{name}/{i}",
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                    "answer": answer,
                    "metadata": json.dumps({"kind": kind}),
                }
                out.write(json.dumps(task) + "\n")


if __name__ == "__main__":
    main()
