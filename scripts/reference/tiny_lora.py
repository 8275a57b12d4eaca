"""Reference values from PEFT for wirl's LoRA adapters: the tiny Qwen3 of
`tests/fixtures/tiny-qwen3/` (tiny_families.py) with a LoRA adapter that PEFT made and saved.

Writes `tests/fixtures/tiny-qwen3-lora/`: the adapter as PEFT saves it (`adapter_config.json`,
`adapter_model.safetensors`) and `reference.json` (logits of the base + adapter, and greedy
continuations, as tiny_families.py writes them). PEFT starts B at zero (the adapter then
changes nothing); here A and B are drawn from N(0, 0.3) so that the adapter moves the logits.

    ~/.cache/wirl-peers/venv/bin/python scripts/reference/tiny_lora.py [FAMILY]

FAMILY is qwen3 (the default) or phi3 (`tests/fixtures/tiny-phi3-lora/`: PEFT's adapter on
Phi-3's fused `qkv_proj` and `gate_up_proj`).

With `--check DIR OUT.json [FAMILY]`: load the adapter directory DIR (one wirl wrote) onto the
tiny model with PEFT and write the logits of the fixed sequences to OUT.json, for wirl to compare
with its own (PEFT reads what wirl writes).
"""
import json
import os
import sys

import peft
import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tiny_families import ROOT, SEQUENCES, reference  # noqa: E402

# Each family's adapter targets every projection its layers have, by PEFT's module names.
TARGETS = {
    "qwen3": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    # Phi-3's q/k/v and gate/up are fused matrices: PEFT adapts each as one module.
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],
}
FAMILY = "qwen3"
BASE = os.path.join(ROOT, "tests", "fixtures", "tiny-qwen3")
OUT = os.path.join(ROOT, "tests", "fixtures", "tiny-qwen3-lora")


def choose(family):
    global FAMILY, BASE, OUT
    if family not in TARGETS:
        sys.exit(f"unknown family {family!r}: choose from {list(TARGETS)}")
    FAMILY = family
    BASE = os.path.join(ROOT, "tests", "fixtures", f"tiny-{family}")
    OUT = os.path.join(ROOT, "tests", "fixtures", f"tiny-{family}-lora")


def base():
    return transformers.AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()


def make():
    config = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                             target_modules=TARGETS[FAMILY],
                             task_type="CAUSAL_LM")
    model = peft.get_peft_model(base(), config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_" in name:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.3)
    model.save_pretrained(OUT)
    # The model card PEFT writes is boilerplate, and the base's path is this machine's.
    os.remove(os.path.join(OUT, "README.md"))
    config_path = os.path.join(OUT, "adapter_config.json")
    with open(config_path) as f:
        saved = json.load(f)
    saved["base_model_name_or_path"] = f"tests/fixtures/tiny-{FAMILY}"
    with open(config_path, "w") as f:
        json.dump(saved, f, indent=2)
    values = reference(model)
    values["peft"] = peft.__version__
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(values, f)
    print("->", OUT, file=sys.stderr)


def check(adapter, out):
    model = peft.PeftModel.from_pretrained(base(), adapter).eval()
    logits = []
    for ids in SEQUENCES:
        with torch.no_grad():
            logits.append({"ids": ids, "values": model(torch.tensor([ids])).logits[0].tolist()})
    with open(out, "w") as f:
        json.dump({"peft": peft.__version__, "logits": logits}, f)


if __name__ == "__main__":
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--check":
        choose(sys.argv[4] if len(sys.argv) == 5 else "qwen3")
        check(sys.argv[2], sys.argv[3])
    else:
        choose(sys.argv[1] if len(sys.argv) == 2 else "qwen3")
        make()
