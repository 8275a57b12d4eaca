#!/usr/bin/env bash
# wirl on a lent GPU at the sizes users train there, beside what they run there today, in one
# call (issue 45, deliverable 4). Run on the GPU machine from the repository root, with DIR
# staged as for scripts/gpu-check (the CUDA build `wirl.xz` and the default model in parts,
# plus `hostile.wasm` for the length reward and TRL's wheels installed to PYTHONPATH):
#   PYTHONPATH=T bash benches/gpu-scale.sh DIR OUT
# Results: a JSON file per part in OUT and OUT/scale.json (all of them, with the same-run
# ratios); copy the figures to docs/BENCHMARKS.md with the device and date.
#
# Parts (PARTS, default "decode big steps"; each is skipped, saying so, once the call's
# budget TOTAL_S — 530 s by default — would be passed, and each run is bounded by RUN_LIMIT_S):
#   decode   Qwen3-shaped random models (benches/qwen3_shaped.py, built there by
#            transformers in bf16; SIZES, default "0.6B 1.7B 4B 8B"; the vocabulary of the
#            default model's tokenizer): `wirl generate` 64 rows x 256 tokens sampled at
#            temperature 1 and batch 1 x 256 greedy, beside transformers `generate` on the same
#            directory (benches/gpu_scale_peer.py); the batch-1 step's share of the HBM's
#            bandwidth (the weights' bytes per token). DEVICE_SAMPLER=1 adds wirl's rows with
#            `--device-sampling`.
#   big      the big job (64 prompts x 8, 256 tokens, the default model, BIG_STEPS steps):
#            wirl with f32 products and with bf16 ones (`model.train_dtype=bf16`), TRL's
#            GRPOTrainer in f32 and with bf16=True, every side on the same tasks (`wirl tasks`
#            from the default job's environment, given to TRL in order).
#   steps    GRPO steps on the 0.6B and 4B shapes (STEP_SIZES), LoRA (rank 16, all seven
#            projections) and every weight, 4 prompts x 8 x 64 tokens, a length reward (a
#            random model never answers), beside TRL + PEFT with bf16=True
#            (benches/trl_peft_peer.py --device cuda --bf16).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$(cd "${1:?usage: gpu-scale.sh DIR OUT}" && pwd)
out=${2:?usage: gpu-scale.sh DIR OUT}
mkdir -p "$out" && out=$(cd "$out" && pwd)
parts=${PARTS:-decode big steps}
sizes=${SIZES:-0.6B 1.7B 4B 8B}
step_sizes=${STEP_SIZES:-0.6B 4B}
steps=${STEPS:-3}
big_steps=${BIG_STEPS:-3}
budget=${TOTAL_S:-530}
run_limit=${RUN_LIMIT_S:-150}
started=$SECONDS
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)" in
    *H200*) hbm_default=4.8e12 ;;
    *) hbm_default=3.35e12 ;;
esac
hbm=${HBM_BYTES_PER_S:-$hbm_default}

cd "$dir"
[ -x wirl ] || { xz -d -k -f wirl.xz && chmod +x wirl; }
[ -f model.gguf ] || cat part-* > model.gguf
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$(ls -d "$site"/nvidia/*/lib "$site"/nvidia/*/*/lib 2>/dev/null | tr '\n' :)/usr/local/nvidia/lib64
export WIRL_CACHE_DIR=$dir/cache
wirl=$dir/wirl
work=$dir/scale # models and run directories: large, kept out of OUT
mkdir -p "$work"
[ -d "$dir/hf" ] || "$wirl" model export "$dir/model.gguf" "$dir/hf" > /dev/null 2>&1
bounded() { timeout -k 5 "$run_limit" "$@"; }
left() { echo $((budget - (SECONDS - started))); }
# Whether a run of about `$1` seconds still fits the call's budget; if not, its JSON says so.
fits() { # seconds name
    if [ "$(left)" -lt "$1" ]; then
        echo "{\"check\": \"$2\", \"skipped\": \"out of the call's budget ($budget s)\"}" > "$out/$2.json"
        cat "$out/$2.json"
        return 1
    fi
}
json_line() { grep '^{' "$1" | tail -n1; }
rate_of() { sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p' "$1" | tail -n1; }
model_of() { # size: a Qwen3-shaped bf16 model directory, built once
    local m=$work/qwen3-$1
    [ -f "$m/config.json" ] ||
        python3 "$root/benches/qwen3_shaped.py" "$dir/hf" "$m" --size "$1" --dtype bf16 --device cuda 2> "$out/build-$1.log"
    echo "$m"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1

if [[ " $parts " == *" decode "* ]]; then
    for size in $sizes; do
        name=decode-$size
        fits 60 "$name" || continue
        echo "== $name: wirl 64 x 256 and 1 x 256, then transformers"
        m=$(model_of "$size")
        gen() { bounded "$wirl" generate --device cuda --dtype bf16 --model "$m" --prompt "The capital of France is" \
            --ignore-eos "$@" > /dev/null; }
        gen -n 64 --max-tokens 16 --temperature 1 --seed 0 2> "$out/$name-warm.log" # kernels, the allocator
        gen -n 64 --max-tokens 256 --temperature 1 --seed 1 2> "$out/$name-rows.log"
        gen -n 1 --max-tokens 256 --temperature 0 2> "$out/$name-one.log"
        sampler=""
        if [ "${DEVICE_SAMPLER:-0}" = 1 ]; then
            gen -n 64 --max-tokens 256 --temperature 1 --seed 1 --device-sampling 2> "$out/$name-rows-device.log"
            sampler=$(rate_of "$out/$name-rows-device.log")
        fi
        bounded python3 "$root/benches/gpu_scale_peer.py" "$m" > "$out/$name-peer.out" 2> "$out/$name-peer.log"
        python3 - "$name" "$m" "$(rate_of "$out/$name-rows.log")" "$(rate_of "$out/$name-one.log")" "$sampler" \
            "$(json_line "$out/$name-peer.out")" "$hbm" > "$out/$name.json" <<'PY'
import glob, json, os, sys
name, model, rows, one, sampler, peer, hbm = sys.argv[1:]
num = lambda s: float(s) if s else None
rows, one, sampler, hbm = num(rows), num(one), num(sampler), float(hbm)
peer = json.loads(peer) if peer else {}
weights = sum(os.path.getsize(f) for f in glob.glob(f"{model}/*.safetensors"))  # bf16: every byte read per token
ratio = lambda a, b: round(a / b, 2) if a and b else None
print(json.dumps({
    "check": name, "pass": bool(rows and one), "weights_gib": round(weights / 2**30, 2),
    "wirl_64x256_tok_s": rows, "wirl_1x256_tok_s": one, "wirl_64x256_device_sampling_tok_s": sampler,
    "transformers_64x256_tok_s": peer.get("rows_tok_s"), "transformers_1x256_tok_s": peer.get("bs1_tok_s"),
    "ratio_64x256": ratio(rows, peer.get("rows_tok_s")), "ratio_1x256": ratio(one, peer.get("bs1_tok_s")),
    "step_ms_64_rows": round(1000 * 64 / rows, 2) if rows else None,
    "bs1_hbm_fraction": round(weights * one / hbm, 3) if one else None,
}))
PY
        cat "$out/$name.json"
        # Keep the shapes the steps part trains; the others only take disk.
        [[ " $step_sizes " == *" $size "* ]] || rm -rf "$m"
    done
fi

if [[ " $parts " == *" big "* ]]; then
    echo "== big: 64 prompts x 8, 256 tokens, $big_steps steps: wirl f32 and bf16 products, TRL f32 and bf16"
    "$wirl" tasks --plugin builtin:arithmetic --count $((64 * big_steps)) --config kind=chain_sum --config min_terms=2 \
        --config max_terms=2 --config min_digits=1 --config max_digits=1 > "$work/big-tasks.jsonl" 2> /dev/null
    big_flags=(--set grpo.prompts_per_step=64 --set grpo.group_size=8 --set sampling.max_tokens=256)
    for variant in f32 bf16; do
        name=big-wirl-$variant
        fits 60 "$name" || continue
        rm -rf "$work/$name"
        if bounded "$wirl" train --model "$dir/model.gguf" --device cuda --steps "$big_steps" --eval-tasks 0 \
            --run-dir "$work/$name" "${big_flags[@]}" --set model.train_dtype="$variant" > "$out/$name.log" 2>&1; then
            python3 - "$name" "$work/$name" > "$out/$name.json" <<'PY'
import json, statistics, sys
name, run = sys.argv[1:]
lines = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
steps = [l["time_s"]["total"] for l in lines]
print(json.dumps({"check": name, "pass": True, "step_s": [round(s, 3) for s in steps],
                  "step_s_median_after_first": round(statistics.median(steps[1:] or steps), 3),
                  "phases_s_last": lines[-1]["time_s"]}))
PY
        else
            echo "{\"check\": \"$name\", \"pass\": false, \"log_tail\": $(tail -n 8 "$out/$name.log" | python3 -c 'import json,sys; print(json.dumps(sys.stdin.read()))')}" > "$out/$name.json"
        fi
        cat "$out/$name.json"
    done
    for variant in f32 bf16; do
        name=big-trl-$variant
        fits 90 "$name" || continue
        flags=()
        [ "$variant" = bf16 ] && flags=(--bf16)
        bounded python3 "$root/benches/gpu_trl.py" --model "$dir/hf" --tasks "$work/big-tasks.jsonl" --steps "$big_steps" \
            --prompts 64 --generations 8 --max-tokens 256 "${flags[@]}" > "$out/$name.out" 2> "$out/$name.log"
        json_line "$out/$name.out" > "$out/$name.json"
        [ -s "$out/$name.json" ] || echo "{\"check\": \"$name\", \"pass\": false}" > "$out/$name.json"
        cat "$out/$name.json"
    done
fi

if [[ " $parts " == *" steps "* ]]; then
    # shellcheck source=benches/length-job.sh
    source "$root/benches/length-job.sh"
    reward=${REWARD:-$dir/hostile.wasm}
    "$wirl" tasks --plugin builtin:arithmetic --count 64 --config kind=chain_sum --config min_terms=2 \
        --config max_terms=2 --config min_digits=1 --config max_digits=1 > "$work/step-tasks.jsonl" 2> /dev/null
    for size in $step_sizes; do
        for mode in lora full; do
            name=steps-$size-$mode
            fits 90 "$name" || continue
            echo "== $name: wirl then TRL + PEFT (bf16)"
            m=$(model_of "$size")
            length_job "$work/$name.toml" "$m" "$reward" "$steps" "$mode" 'train_dtype = "bf16"'
            rm -rf "$work/run-$name"
            bounded "$wirl" train "$work/$name.toml" --device cuda --run-dir "$work/run-$name" > "$out/$name-wirl.log" 2>&1
            bounded python3 "$root/benches/trl_peft_peer.py" --model "$m" --tasks "$work/step-tasks.jsonl" --steps "$steps" \
                --device cuda --bf16 "${peer_lora[@]}" > "$out/$name-peer.out" 2> "$out/$name-peer.log"
            python3 - "$name" "$work/run-$name" "$(json_line "$out/$name-peer.out")" > "$out/$name.json" <<'PY'
import json, os, statistics, sys
name, run, peer = sys.argv[1:]
peer = json.loads(peer) if peer else {}
after_first = lambda steps: round(statistics.median(steps[1:] or steps), 3) if steps else None
wirl_steps = []
if os.path.exists(f"{run}/metrics.jsonl"):
    wirl_steps = [json.loads(l)["time_s"]["total"] for l in open(f"{run}/metrics.jsonl")]
ours, theirs = after_first(wirl_steps), after_first(peer.get("step_s", []))
print(json.dumps({"check": name, "pass": bool(ours and theirs), "wirl_step_s": [round(s, 3) for s in wirl_steps],
                  "peer_step_s": peer.get("step_s"), "wirl_median_after_first": ours,
                  "peer_median_after_first": theirs, "peer_peak_gpu_mib": peer.get("peak_gpu_mib"),
                  "ratio": round(ours / theirs, 3) if ours and theirs else None}))
PY
            cat "$out/$name.json"
        done
    done
fi

python3 - "$out" > "$out/scale.json" <<'PY'
import glob, json, os, sys
out = sys.argv[1]
results = {}
for path in sorted(glob.glob(f"{out}/*.json")):
    if os.path.basename(path) != "scale.json":
        try:
            results[os.path.basename(path)[:-5]] = json.load(open(path))
        except ValueError:
            results[os.path.basename(path)[:-5]] = {"unreadable": True}
device = open(f"{out}/device.txt").read().strip()
print(json.dumps({"device": device, "results": results}, indent=1))
PY
echo "== $out/scale.json ($((SECONDS - started)) s)"
