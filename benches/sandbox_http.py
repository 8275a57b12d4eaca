"""`/run_code` under load, beside the baseline users fall back to: the same programs through
`wirl sandbox serve` (SandboxFusion's request, each program a fresh WebAssembly instance in a
worker process) and in a `python3` subprocess each with rlimits (address space, CPU time,
files), at 1 and 32 concurrent clients, in one run on one machine. Programs: HumanEval's 164
(prompt + canonical solution + test + check) and a short one (`print(sum(range(10)))`).
Other languages (`--other nodejs=RUNNER.wasm --other lua=RUNNER.wasm`): a short program in
each, beside `node` / `lua5.4` subprocesses with the same limits (node's heap by its own
flag: V8 reserves more address space than RLIMIT_AS allows), where those are installed.
Prints one JSON line per side and load, then the same-run ratios.

  python3 benches/sandbox_http.py --wirl target/release/wirl --runner RUNNER.wasm \\
      --humaneval examples/humaneval/HumanEval.jsonl [--workers 2] [--clients 1 32] \\
      [--other nodejs=JS_RUNNER.wasm] [--other lua=LUA_RUNNER.wasm] [--other ruby=RUBY_RUNNER.wasm]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

SHORT = "print(sum(range(10)))\n"
# The same short program in the other languages, and the command each is run with outside.
OTHER_SHORT = {
    "nodejs": "console.log([...Array(10).keys()].reduce((a, b) => a + b, 0))\n",
    "lua": "local s = 0\nfor i = 0, 9 do s = s + i end\nprint(s)\n",
    "ruby": "puts (0..9).sum\n",
}
BASELINE = {
    "nodejs": ["node", "--max-old-space-size=512", "-e"],
    "lua": ["lua5.4", "-e"],
    "ruby": ["ruby", "--disable-gems", "-e"],
}


def humaneval(path):
    programs = []
    with open(path) as lines:
        for line in lines:
            task = json.loads(line)
            meta = json.loads(task["metadata"])
            programs.append(f"{meta['prompt']}{task['answer']}\n\n{meta['test']}\n\ncheck({meta['entry_point']})\n")
    return programs


def start_server(wirl, runners, workers):
    flags = [flag for pair in runners for flag in ("--runner", pair)]
    server = subprocess.Popen(
        [wirl, "sandbox", "serve", "--port", "0", *flags, "--run-workers", str(workers)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in server.stderr:
        if "http://" in line:
            address = line.split("http://")[1].split()[0]
            # Keep reading its stderr so that it never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
            return server, f"http://{address}"
    server.kill()
    raise SystemExit("wirl sandbox serve did not start")


def via_wirl(url, language="python"):
    def run(source):
        body = json.dumps({"code": source, "language": language, "run_timeout": 10, "memory_limit_MB": 512}).encode()
        request = urllib.request.Request(f"{url}/run_code", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            return json.load(response)["status"] == "Success"

    return run


def limited(address_space=True):
    # What a careful subprocess sandbox sets: memory, CPU time, file size, no core dumps.
    if address_space:
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
    resource.setrlimit(resource.RLIMIT_CPU, (10, 10))
    resource.setrlimit(resource.RLIMIT_FSIZE, (32 << 20, 32 << 20))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def via_subprocess(command):
    address_space = command[0] != "node"

    def run(source):
        done = subprocess.run(
            [*command, source],
            input="",
            capture_output=True,
            text=True,
            timeout=10,
            preexec_fn=lambda: limited(address_space),
            cwd="/tmp",
        )
        return done.returncode == 0

    return run


def measure(run, programs, clients, reps):
    latencies = []
    passed = 0
    lock = threading.Lock()

    def one(source):
        nonlocal passed
        started = time.perf_counter()
        ok = run(source)
        took = time.perf_counter() - started
        with lock:
            latencies.append(took)
            passed += ok

    work = programs * reps
    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, work))
    wall = time.perf_counter() - started
    latencies.sort()
    return {
        "programs": len(work),
        "passed": passed,
        "programs_per_s": round(len(work) / wall, 1),
        "p50_ms": round(1000 * statistics.median(latencies), 2),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--wirl", required=True)
    parser.add_argument("--runner", required=True)
    parser.add_argument("--humaneval", required=True)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--other", action="append", default=[], metavar="LANG=WASM")
    args = parser.parse_args()
    # (kind, language, sources, the baseline's command or None where it is not installed)
    suites = [
        ("humaneval", "python", humaneval(args.humaneval), [args.python, "-I", "-c"]),
        ("short", "python", [SHORT] * 100, [args.python, "-I", "-c"]),
    ]
    for pair in args.other:
        language = pair.split("=", 1)[0]
        baseline = BASELINE[language] if shutil.which(BASELINE[language][0]) else None
        if baseline is None:
            print(f"no {BASELINE[language][0]} here: {language} is measured without its baseline", file=sys.stderr)
        suites.append((f"short-{language}", language, [OTHER_SHORT[language]] * 100, baseline))
    server, url = start_server(args.wirl, [f"python={args.runner}", *args.other], args.workers)
    results = {}
    try:
        for kind, language, sources, baseline in suites:
            sides = {"wirl": via_wirl(url, language)}
            if baseline is not None:
                sides["subprocess"] = via_subprocess(baseline)
            # Warm both: the server's workers, the page cache of the interpreter.
            for run in sides.values():
                measure(run, sources[:8], 2, 1)
            for clients in args.clients:
                for side, run in sides.items():
                    figures = measure(run, sources, clients, args.reps)
                    figures.update({"side": side, "programs_kind": kind, "clients": clients})
                    results[(side, kind, clients)] = figures
                    print(json.dumps(figures), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
    for kind, language, _, baseline in suites:
        for clients in args.clients:
            w = results[("wirl", kind, clients)]
            line = (
                f"{kind}, {clients} client(s): wirl {w['programs_per_s']}/s p50 {w['p50_ms']} ms p99 {w['p99_ms']} ms "
                f"({w['passed']}/{w['programs']} passed)"
            )
            if baseline is not None:
                p = results[("subprocess", kind, clients)]
                line += (
                    f" | {baseline[0]} subprocess {p['programs_per_s']}/s p50 {p['p50_ms']} ms p99 {p['p99_ms']} ms "
                    f"({p['passed']}/{p['programs']}) | throughput {w['programs_per_s'] / p['programs_per_s']:.2f}x, "
                    f"p50 {w['p50_ms'] / p['p50_ms']:.2f}x"
                )
            print(line)


if __name__ == "__main__":
    main()
