"""Writes examples/code-io/{train,eval}.jsonl: small stdin/stdout programming problems of our
own (read numbers or words, print one answer), each with test cases that a reference solution
computed here, as task lines (`wirl tasks`' format: id, messages, answer, metadata) whose
metadata holds `tests` and `language` for builtin:code-tests. The model answers in Lua.
Seeded: the files are the same on every run.

    python3 examples/code-io/make.py
"""

import json
import pathlib
import random

SYSTEM = "Write a complete Lua 5.4 program that reads standard input and prints the answer. Reply with the program in one ```lua code block."

# (statement, input generator, reference solution over the input text)
PROBLEMS = [
    ("Read two integers a and b on one line and print a + b.",
     lambda r: f"{r.randint(-1000, 1000)} {r.randint(-1000, 1000)}\n",
     lambda s: str(sum(map(int, s.split())))),
    ("Read two integers a and b on one line and print a * b.",
     lambda r: f"{r.randint(-300, 300)} {r.randint(-300, 300)}\n",
     lambda s: str(int(s.split()[0]) * int(s.split()[1]))),
    ("Read an integer n, then n integers on the next line; print the largest of them.",
     lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")([r.randint(-99, 99) for _ in range(r.randint(1, 8))]),
     lambda s: str(max(map(int, s.split()[1:])))),
    ("Read an integer n, then n integers on the next line; print their sum.",
     lambda r: (lambda xs: f"{len(xs)}\n{' '.join(map(str, xs))}\n")([r.randint(-99, 99) for _ in range(r.randint(1, 8))]),
     lambda s: str(sum(map(int, s.split()[1:])))),
    ("Read a word and print it reversed.",
     lambda r: "".join(r.choice("abcdefghij") for _ in range(r.randint(1, 9))) + "\n",
     lambda s: s.strip()[::-1]),
    ("Read a word and print YES if it reads the same backwards, otherwise NO.",
     lambda r: (lambda w: w + (w[::-1] if r.random() < 0.5 else "x"))("".join(r.choice("abc") for _ in range(r.randint(1, 4)))) + "\n",
     lambda s: "YES" if s.strip() == s.strip()[::-1] else "NO"),
    ("Read a non-negative integer n (at most 20) and print n factorial.",
     lambda r: f"{r.randint(0, 20)}\n",
     lambda s: str(__import__("math").factorial(int(s)))),
    ("Read an integer n and print EVEN if it is even, otherwise ODD.",
     lambda r: f"{r.randint(-50, 50)}\n",
     lambda s: "EVEN" if int(s) % 2 == 0 else "ODD"),
    ("Read a line of words separated by spaces and print how many words it has.",
     lambda r: " ".join("w" * r.randint(1, 3) for _ in range(r.randint(1, 7))) + "\n",
     lambda s: str(len(s.split()))),
    ("Read a positive integer n (at most 30) and print the n-th Fibonacci number, where F(1) = F(2) = 1.",
     lambda r: f"{r.randint(1, 30)}\n",
     lambda s: str((lambda n: (lambda f: f(f, n))(lambda f, k: 1 if k <= 2 else f(f, k - 1) + f(f, k - 2)))(int(s)))),
]


def task(split: str, index: int, rng: random.Random) -> dict:
    statement, make_input, solve = PROBLEMS[index % len(PROBLEMS)]
    tests = []
    for _ in range(4):
        given = make_input(rng)
        tests.append({"input": given, "output": solve(given) + "\n"})
    return {
        "id": f"code-io/{split}/{index}",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": statement}],
        "answer": "",
        "metadata": json.dumps({"language": "lua", "tests": tests}),
    }


def main() -> None:
    here = pathlib.Path(__file__).parent
    rng = random.Random(0)
    for split, count in [("train", 40), ("eval", 10)]:
        with open(here / f"{split}.jsonl", "w") as out:
            for index in range(count):
                out.write(json.dumps(task(split, index, rng)) + "\n")


if __name__ == "__main__":
    main()
