"""Calls clients/python/wirl_reward.py the way TRL's GRPOTrainer calls a reward function
(keyword arguments: prompts, completions, completion_ids, the dataset's columns,
trainer_state), against the server at argv[1]; prints what it saw as JSON."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "../../clients/python"))
from wirl_reward import WirlRewardError, wirl_reward  # noqa: E402

url = sys.argv[1]
reward = wirl_reward(url, task="arithmetic")
prompts = [[{"role": "user", "content": "What is 1 + 1?"}]] * 2 + [[{"role": "user", "content": "What is 2 + 2?"}]] * 2
completions = [[{"role": "assistant", "content": text}] for text in
               ["<answer>2</answer>", "<answer>3</answer>", "<answer>4</answer>", "no tags"]]
seen = {"name": reward.__name__}
seen["conversational"] = reward(prompts=prompts, completions=completions, completion_ids=[[1, 2]] * 4,
                                answer=["2", "2", "4", "4"], trainer_state=None)
seen["standard"] = reward(prompts=["1+1=", "1+1="], completions=["<answer>2</answer>", "<answer>5</answer>"],
                          answer=[2, 2])
seen["masked"] = wirl_reward(url, task="flaky")(prompts=["x"], completions=["y"], answer=["1"])
try:
    wirl_reward("http://127.0.0.1:9", retries=1, timeout=2)(prompts=["x"], completions=["y"])
    seen["unreachable"] = "no error"
except WirlRewardError as error:
    seen["unreachable"] = str(error)
try:
    wirl_reward(url, task="nonesuch")(prompts=["x"], completions=["y"])
    seen["unknown_task"] = "no error"
except WirlRewardError as error:
    seen["unknown_task"] = str(error)
print(json.dumps(seen))
