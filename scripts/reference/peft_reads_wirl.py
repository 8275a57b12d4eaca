"""PEFT reads the adapters wirl writes: a LoRA run's checkpoint adapter, loaded by PEFT onto
its base, gives the logits of the model `wirl model merge` wrote from the same two.

    wirl model export smollm2-135m-instruct base-hf
    wirl train lora.toml --run-dir run            # a config with [lora]
    wirl model merge base-hf run/checkpoints/step-000003/adapter merged
    ~/.cache/wirl-peers/venv/bin/python scripts/reference/peft_reads_wirl.py base-hf \
        run/checkpoints/step-000003/adapter merged

Prints the largest logit difference (PEFT vs merged) and the adapter's own effect (PEFT vs
the base), so that a PEFT that silently ignored the adapter would show.
"""
import sys, torch, transformers, peft
base_dir, adapter, merged_dir = sys.argv[1:4]
ids = torch.tensor([[1, 504, 3458, 314, 253, 1345, 29, 216, 33, 31, 32, 30]])
base = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
with torch.no_grad():
    b = base(ids).logits
model = peft.PeftModel.from_pretrained(base, adapter).eval()
merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
with torch.no_grad():
    p = model(ids).logits
    m = merged(ids).logits
print("PEFT(base + wirl's adapter) vs wirl-merged, max |diff|:", (p - m).abs().max().item())
print("adapter's effect on the logits, max |diff| vs base:", (p - b).abs().max().item())
