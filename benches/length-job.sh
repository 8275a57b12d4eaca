# Sourced by benches/qwen3-0.6b.sh and benches/gpu-scale.sh: the GRPO job they time beside
# TRL + PEFT — wirl's arithmetic prompts (with their few-shot turns), a length reward (a
# random-weight model never answers; GRPO needs rewards that differ within a group), 4
# prompts x 8 completions of 64 tokens, lr 1e-4, KL beta 0.04, no held-out pass.
#   length_job FILE MODEL_DIR REWARD_WASM STEPS MODE [MORE_MODEL_KEYS]
# MODE: full (every weight), lora (rank 16, alpha 32, all seven projections), lora-bf16
# (the same on a bf16 base). Sets peer_lora to the peer's matching flags.
length_job() {
    local file=$1 model=$2 reward=$3 steps=$4 mode=$5 model_keys=${6:-} lora=""
    peer_lora=()
    case "$mode" in
        lora) lora=$'[lora]\nrank = 16\nalpha = 32' && peer_lora=(--lora-rank 16 --lora-alpha 32) ;;
        lora-bf16)
            lora=$'[lora]\nrank = 16\nalpha = 32\nbase_dtype = "bf16"'
            peer_lora=(--lora-rank 16 --lora-alpha 32 --base-dtype bf16)
            ;;
    esac
    cat > "$file" <<TOML
[model]
path = "$model"
$model_keys
[environment]
plugin = "builtin:arithmetic"
config = { kind = "chain_sum", min_terms = 2, max_terms = 2, min_digits = 1, max_digits = 1 }
[[rewards]]
plugin = "$reward"
[sampling]
max_tokens = 64
[grpo]
steps = $steps
prompts_per_step = 4
group_size = 8
learning_rate = 1e-4
beta = 0.04
[eval]
tasks = 0
$lora
TOML
}
