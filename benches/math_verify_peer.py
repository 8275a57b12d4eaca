"""benches/math-verify.sh's driver, run in the peers' venv (math-verify installed): one run
of Math-Verify and of wirl's builtin:math-verify (and builtin:math-answer) over the same
pairs, and over answers built to hang a verifier.

    python benches/math_verify_peer.py WIRL_BINARY CORPUS.jsonl [--hostile] [--hostile-timeout S]

Prints JSON lines: per system, agreement with Math-Verify's verdicts (made in this run), the
disagreements by class, per-answer p50/p99 and answers per second; then, per hostile answer,
wirl's time and verdict beside Math-Verify's, twice, each in a child process killed at the
timeout: as a single-threaded script runs it (its signal timeouts, 5 s, on) and as a
multi-threaded trainer must (verl: `parsing_timeout=None, timeout_seconds=None`).
"""

import argparse
import json
import logging
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter

from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

# Its timeouts log the whole answer (megabytes here); the bench reports them itself.
logging.getLogger("math_verify").setLevel(logging.CRITICAL)

CONFIG = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]


def math_verify(gold, pred):
    return bool(verify(parse(gold, CONFIG), parse(pred, CONFIG), float_rounding=6))


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def wirl_score(binary, plugin, pairs):
    """Scores the pairs with `wirl score`: per-answer micros, rewards, and the wall time."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, (gold, pred) in enumerate(pairs):
            task = {"id": str(i), "messages": [], "answer": gold}
            f.write(json.dumps({"task": task, "completion": pred}) + "\n")
        path = f.name
    try:
        start = time.perf_counter()
        out = subprocess.run([binary, "score", "--plugin", plugin, "--input", path], capture_output=True, text=True)
        wall = time.perf_counter() - start
    finally:
        os.unlink(path)
    rows = {}
    for line in out.stdout.splitlines():
        row = json.loads(line)
        rows[row["line"] - 1] = row
    return [rows.get(i) for i in range(len(pairs))], wall, out.stderr


def agreement(name, labels, verdicts, classes):
    agree = sum(1 for a, b in zip(labels, verdicts) if a == b)
    by_class = Counter(c for c, a, b in zip(classes, labels, verdicts) if a != b)
    return {"system": name, "agree": agree, "of": len(labels), "rate": round(agree / len(labels), 4), "disagree_by_class": dict(by_class)}


def hostile_answers():
    frac = "\\boxed{" + "\\frac{1}{" * 10_000 + "1" + "}" * 10_000 + "}"
    return [
        ("frac nested 10,000 deep", frac),
        ("1 MB of digits", "\\boxed{" + "9" * (1 << 20) + "}"),
        ("a power tower", r"\boxed{9^{9^{9^{9}}}}"),
        ("a huge polynomial power", r"\boxed{(x+1)^{100000}}"),
        ("a huge factorial", r"\boxed{100000!}"),
        ("a million-element set", "\\boxed{\\{" + ",".join(map(str, range(1_000_000))) + "\\}}"),
        ("unclosed boxes", "\\boxed{" * 100_000),
        ("dollar signs", "$1" * 200_000),
        ("answer words", "the answer is " * 50_000),
        ("parentheses", "(" * 200_000 + ")" * 200_000),
        ("a long sum", "\\boxed{" + "+".join(["x"] * 100_000) + "}"),
    ]


HOSTILE_GOLD = r"$9^{9^{9^{9}}} + 1$"


def _child(pred, queue, threaded):
    start = time.perf_counter()
    try:
        if threaded:
            # As verl and every multi-threaded caller must run it: its signal-based timeouts
            # off (they raise outside the main thread), so nothing bounds it.
            gold = parse(HOSTILE_GOLD, CONFIG, parsing_timeout=None)
            result = bool(verify(gold, parse(pred, CONFIG, parsing_timeout=None), float_rounding=6, timeout_seconds=None))
        else:
            result = math_verify(HOSTILE_GOLD, pred)
    except BaseException as e:  # noqa: BLE001 - report whatever it raised
        result = f"raised {type(e).__name__}"
    queue.put((time.perf_counter() - start, result))


def math_verify_bounded(pred, timeout, threaded):
    queue = multiprocessing.Queue()
    child = multiprocessing.Process(target=_child, args=(pred, queue, threaded))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
        return None, "did not finish"
    took, result = queue.get()
    return took, result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("wirl")
    ap.add_argument("corpus")
    ap.add_argument("--hostile", action="store_true")
    ap.add_argument("--hostile-timeout", type=float, default=60.0)
    args = ap.parse_args()
    cases = [json.loads(line) for line in open(args.corpus) if line.strip()]
    pairs = [(c["gold"], c["pred"]) for c in cases]
    classes = [c["class"] for c in cases]

    # Math-Verify: its verdicts now (the labels) and its time per answer, one process.
    times, labels = [], []
    start = time.perf_counter()
    for gold, pred in pairs:
        t = time.perf_counter()
        labels.append(math_verify(gold, pred))
        times.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    peer = {
        "system": "math-verify", "answers": len(pairs), "p50_ms": round(percentile(times, 0.5) * 1e3, 3),
        "p99_ms": round(percentile(times, 0.99) * 1e3, 3), "answers_per_s": round(len(pairs) / wall, 1),
    }
    print(json.dumps(peer))
    stale = sum(1 for c, l in zip(cases, labels) if "math_verify" in c and c["math_verify"] != l)
    if stale:
        print(json.dumps({"note": f"{stale} committed labels differ from this run's Math-Verify: regenerate the corpus"}))

    for plugin in ["builtin:math-verify", "builtin:math-answer"]:
        rows, wall, stderr = wirl_score(args.wirl, plugin, pairs)
        verdicts = [bool(r and r["reward"] == 1.0) for r in rows]
        micros = [r["micros"] for r in rows if r]
        summary = agreement(plugin, labels, verdicts, classes)
        summary.update({
            "p50_ms": round(percentile(micros, 0.5) / 1e3, 3), "p99_ms": round(percentile(micros, 0.99) / 1e3, 3),
            "answers_per_s": round(len(pairs) / wall, 1), "wall_s_with_start": round(wall, 2),
            "failed_calls": sum(1 for r in rows if r is None),
        })
        if plugin == "builtin:math-verify":
            summary["throughput_vs_math_verify"] = round(summary["answers_per_s"] / peer["answers_per_s"], 1)
        print(json.dumps(summary))

    if args.hostile:
        hostile = hostile_answers()
        rows, _, _ = wirl_score(args.wirl, "builtin:math-verify", [(HOSTILE_GOLD, p) for _, p in hostile])
        for (what, pred), row in zip(hostile, rows):
            took, result = math_verify_bounded(pred, args.hostile_timeout, threaded=False)
            took_threaded, result_threaded = math_verify_bounded(pred, args.hostile_timeout, threaded=True)
            print(json.dumps({
                "hostile": what, "bytes": len(pred),
                "wirl_ms": round(row["micros"] / 1e3, 1) if row else None,
                "wirl_verdict": row["note"].split(";")[0] if row else "failed",
                "math_verify_s": None if took is None else round(took, 3),
                "math_verify": result if isinstance(result, str) else bool(result),
                "math_verify_no_signal_timeout_s": None if took_threaded is None else round(took_threaded, 3),
                "math_verify_no_signal_timeout": result_threaded if isinstance(result_threaded, str) else bool(result_threaded),
                "killed_after_s": args.hostile_timeout,
            }))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
