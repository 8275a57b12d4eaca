# wirl-world: reward-plugin
"""`math-answer` in Python: is the model's final answer to a math task right?

The same rules and scores as plugins/rust/math-answer (a test holds every build of it to
identical scores): the final answer is the last `<answer>…</answer>` block, else the last
`\\boxed{…}`, else the last number. It is right when it equals the task's answer as a number
(within `tolerance`) or, failing that, as normalised text. Parts: `format`, `correct`.
Config: `tolerance` (default 1e-6), `format_weight` (default 0).
"""

import re

from wirl import Reward, Score, Task, Unscorable, config, reward  # noqa: F401 (Reward is the export)

# Rust's `char::is_whitespace`, so that trimming agrees with the Rust build.
WHITESPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B)) + "\u2028\u2029\u202f\u205f\u3000"
# Rust's `f64::from_str` grammar (finite numbers; letters other than e are refused first).
NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z")


def is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def last_tagged(text: str):
    close = text.rfind("</answer>")
    if close < 0:
        return None
    open_ = text.rfind("<answer>", 0, close)
    return None if open_ < 0 else text[open_ + len("<answer>"):close]


def last_boxed(text: str):
    search_end = len(text)
    while True:
        start = text.rfind("\\boxed{", 0, search_end)
        if start < 0:
            return None
        body = start + len("\\boxed{")
        depth = 1
        for i in range(body, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[body:i]
        search_end = start


def group_of_three(text: str, at: int) -> bool:
    return (
        len(text) >= at + 3
        and all(is_digit(c) for c in text[at:at + 3])
        and (len(text) == at + 3 or not is_digit(text[at + 3]))
    )


def last_number(text: str):
    end = len(text)
    while end > 0:
        last = next((i for i in range(end - 1, -1, -1) if is_digit(text[i])), None)
        if last is None:
            return None
        start, seen_point = last, False
        while start > 0:
            prev = text[start - 1]
            if is_digit(prev):
                start -= 1
            elif prev == "." and not seen_point and start >= 2 and is_digit(text[start - 2]):
                seen_point = True
                start -= 1
            elif prev == "," and start >= 2 and is_digit(text[start - 2]) and group_of_three(text, start):
                start -= 1
            else:
                break
        if start > 0 and text[start - 1] == "-":
            start -= 1
        candidate = text[start:last + 1]
        if any(is_digit(c) for c in candidate):
            return candidate
        end = start
    return None


def final_answer(completion: str):
    """(text, tagged) of the final answer, or None."""
    for found in (last_tagged(completion), last_boxed(completion)):
        if found is not None:
            return found.strip(WHITESPACE), True
    number = last_number(completion)
    return None if number is None else (number, False)


def plain_number(text: str):
    t = text.strip(WHITESPACE).replace(",", "")
    if not any(is_digit(c) for c in t) or any(c.isascii() and c.isalpha() and c not in "eE" for c in t):
        return None
    if not NUMBER.match(t):
        return None
    value = float(t)
    return value if value not in (float("inf"), float("-inf")) else None


def parse_number(text: str):
    t = text.strip(WHITESPACE).rstrip(".").strip(WHITESPACE)
    t = t[1:] if t.startswith("$") else t
    t = t.strip(WHITESPACE)
    t = t[:-1] if t.endswith("%") else t
    t = t.strip(WHITESPACE)
    if not t:
        return None
    if "/" in t:
        num, den = t.split("/", 1)
        num, den = plain_number(num), plain_number(den)
        if num is None or den is None or den == 0.0:
            return None
        return num / den
    return plain_number(t)


def normalise(text: str) -> str:
    t = text.replace("\\text{", "")
    for c in "${}":
        t = t.replace(c, "")
    t = t.strip(WHITESPACE).rstrip(".")
    return " ".join(_split_ws(t)).lower()


def _split_ws(text: str):
    return [part for part in re.split("[" + re.escape(WHITESPACE) + "]+", text) if part]


def answers_match(found: str, expected: str, tolerance: float) -> bool:
    a, b = parse_number(found), parse_number(expected)
    if a is not None and b is not None:
        return abs(a - b) <= tolerance
    return normalise(found) == normalise(expected)


@reward
def score(task: Task, completion: str) -> Score:
    tolerance = float(config("tolerance", 1e-6))
    format_weight = float(config("format_weight", 0.0))
    if task.answer is None:
        raise Unscorable(f"task {task.id} has no answer to compare with")
    found = final_answer(completion)
    if found is None:
        return Score.of(0.0, note="no answer found", format=0.0, correct=0.0)
    text, tagged = found
    format_ = 1.0 if tagged else 0.0
    correct = 1.0 if answers_match(text, task.answer, tolerance) else 0.0
    return Score.of(correct + format_weight * format_, note=f"answer: {text[:80]}", format=format_, correct=correct)
