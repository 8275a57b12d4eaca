#!/usr/bin/env bash
# A multi-turn step before and after, in the same run: examples/train/multiturn.toml (4 × 6
# episodes of up to 3 turns), STEPS steps with no held-out evaluation, built at BEFORE (a
# worktree sharing the target directory) and from the working tree (AFTER), the runs
# alternating A, B, A, B, ... (ROUNDS rounds). Prints per run and step: the first turns'
# time (time_s.generate) and the later turns' (time_s.episodes), per model turn (the first
# turns are 24 a step, the later ones `episode_turns`; every turn may write up to 16
# tokens), the training time, the whole step, and the prompt positions taken from the
# prefix cache and computed; then per side the medians and B/A.
# CONFIG=examples/train/agent.toml compares the calculator agent's step instead (its calls
# are time_s.agents).
#   bash benches/multiturn.sh BEFORE_COMMIT        # STEPS=2 ROUNDS=2
# Run on an idle machine.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
before=${1:?give the commit to compare against}
steps=${STEPS:-2}
rounds=${ROUNDS:-2}
config=${CONFIG:-examples/train/multiturn.toml}
cd "$root"
# shellcheck source=benches/ab-build.sh
source "$root/benches/ab-build.sh"
ab_build "$before"
for round in $(seq "$rounds"); do
    for side in A B; do
        run=$work/$side-$round
        "$work/wirl-$side" train "$config" --steps "$steps" --eval-tasks 0 --run-dir "$run" \
            >"$run.log" 2>&1 || { tail -20 "$run.log" >&2; exit 1; }
        python3 - "$run/metrics.jsonl" "$side" <<'PY'
import json, sys
for r in (json.loads(line) for line in open(sys.argv[1])):
    t = r["time_s"]
    print(json.dumps({"side": sys.argv[2], "step": r["step"], "first_turns_s": round(t["generate"], 2),
                      "later_turns_s": round(t["episodes"], 2), "later_turns": r["episode_turns"],
                      "agents_s": round(t["agents"], 2),
                      "first_s_per_turn": round(t["generate"] / 24, 4),
                      "later_s_per_turn": round(t["episodes"] / max(r["episode_turns"], 1), 4),
                      # Per generated token (recorded since 2026-11-26; absent before: None).
                      "first_s_per_token": (round(t["generate"] / (r["completion_tokens"] - r["episode_tokens"]), 5)
                                            if r.get("completion_tokens", 0) > r.get("episode_tokens", 0) else None),
                      "later_s_per_token": (round(t["episodes"] / r["episode_tokens"], 5)
                                            if r.get("episode_tokens") else None),
                      "train_s": round(t["train"], 2), "total_s": round(t["total"], 2),
                      "backward_s": round(t["backward"], 2), "peak_train_mib": r["peak_rss_mib_by_phase"].get("train"),
                      "cached": r.get("prompt_positions_cached", 0), "computed": r.get("prompt_positions_computed"),
                      "reward": round(r["reward_mean"], 4)}))
PY
    done
done | tee "$work/runs.jsonl"
python3 - "$work/runs.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
med = {}
for side in "AB":
    mine = [r for r in rows if r["side"] == side]
    med[side] = {k: statistics.median(r[k] for r in mine)
                 for k in ["first_s_per_turn", "later_s_per_turn", "first_turns_s", "later_turns_s", "agents_s", "train_s",
                           "total_s"]}
    m = med[side]
    ratio = m["later_s_per_turn"] / m["first_s_per_turn"] if m["first_s_per_turn"] else float("nan")
    tokens = [(r["first_s_per_token"], r["later_s_per_token"]) for r in mine if r["later_s_per_token"]]
    if tokens:
        first, later = statistics.median(f for f, _ in tokens), statistics.median(l for _, l in tokens)
        print(f"{side}: per generated token first {first * 1000:.1f} ms, later {later * 1000:.1f} ms "
              f"(later/first {later / first:.2f})")
    print(f"{side}: per turn first {m['first_s_per_turn']:.3f} s, later {m['later_s_per_turn']:.3f} s "
          f"(later/first {ratio:.2f}); step: first turns {m['first_turns_s']:.1f} s, later turns "
          f"{m['later_turns_s']:.1f} s, agents {m['agents_s']:.1f} s, train {m['train_s']:.1f} s, total {m['total_s']:.1f} s")
print("B/A: " + ", ".join(f"{k} {med['B'][k] / med['A'][k]:.3f}" for k in med["A"] if med["A"][k]))
PY
