#!/usr/bin/env python3
"""The peer of benches/objectives.sh: ../shared/peers/grpo_trl.py (TRL's GRPOTrainer on the
default job's model, task and sizes) with GRPOConfig's objective keys set from the first
argument, a JSON object — e.g. '{"loss_type": "cispo", "epsilon_high": 5.0}' — and the rest
of the arguments passed to it (--steps, --seed, --save-dir, --beta ...).

    python benches/trl_objective.py '{"importance_sampling_level": "sequence", "loss_type": "grpo"}' --steps 10
"""
import functools
import json
import os
import runpy
import sys

import trl

keys = json.loads(sys.argv[1])
trl.GRPOConfig = functools.partial(trl.GRPOConfig, **keys)
peer = os.environ.get("PEER_SCRIPT") or os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "peers", "grpo_trl.py")
sys.argv = [peer] + sys.argv[2:]
sys.path.insert(0, os.path.dirname(os.path.abspath(peer)))
runpy.run_path(peer, run_name="__main__")
