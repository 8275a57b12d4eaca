#!/usr/bin/env bash
# The CUDA engine on the GPU machine, beside transformers on the same GPU. Run there, from
# the repository root, with the CUDA build (scripts/build-cuda) and the default model in
# DIR (default .gpu; the model may come in parts, to fit a transfer limit):
#   DIR/wirl.xz  DIR/part-*  ->  bash benches/gpu.sh [DIR]
# Prints greedy text on CUDA (bf16) and CPU (f32) for comparison, then tokens/s for batch-1
# decode (256 tokens) and group sampling (8 x 128 from one prompt), wirl and transformers.
set -uo pipefail
bench=$(cd "$(dirname "$0")" && pwd)
cd "${1:-.gpu}"
[ -f wirl ] || { xz -d -k -f wirl.xz && chmod +x wirl; }
[ -f model.gguf ] || cat part-* > model.gguf
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
export LD_LIBRARY_PATH=$(ls -d "$site"/nvidia/*/lib "$site"/nvidia/*/*/lib 2>/dev/null | tr '\n' :)/usr/local/nvidia/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
prompt="The capital of France is"
echo "== greedy, 32 tokens: CUDA bf16"
./wirl generate --device cuda --model model.gguf --prompt "$prompt" --temperature 0 --max-tokens 32
echo "== greedy, 32 tokens: CPU f32 (same binary)"
./wirl generate --device cpu --model model.gguf --prompt "$prompt" --temperature 0 --max-tokens 32
echo "== batch-1 decode, 256 tokens, CUDA (3 runs)"
for i in 1 2 3; do
    ./wirl generate --device cuda --model model.gguf --prompt "$prompt" --temperature 0 --max-tokens 256 --ignore-eos >/dev/null
done
echo "== group sampling, 8 x 128, CUDA (3 runs)"
for i in 1 2 3; do
    ./wirl generate --device cuda --model model.gguf --prompt "$prompt" -n 8 --temperature 1 --max-tokens 128 --ignore-eos --seed $i >/dev/null
done
echo "== group sampling, 64 x 128, CUDA"
./wirl generate --device cuda --model model.gguf --prompt "$prompt" -n 64 --temperature 1 --max-tokens 128 --ignore-eos --seed 1 >/dev/null
echo "== transformers on the same GPU"
[ -d hf ] || ./wirl model export model.gguf hf >/dev/null
HF_HUB_OFFLINE=1 python3 "$bench/gpu_peer.py" "$PWD/hf"
