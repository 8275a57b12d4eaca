# wirl-world: agent-plugin
"""`check-agent` in Python: an agent that has the model check its own answer.

The model is asked a sum of two to four 1- or 2-digit numbers (deterministic in the
request's seed and cursor). After its reply the agent asks it to check the work and give the
final number again; the rollout is scored on that second answer: reward 1 if right, else 0,
with parts `correct` and `changed` (whether the check changed the answer). Both turns of a
step's rollouts are generated in one `generate` call each, so the engine batches them.

The agent sees messages only; each completion's `generation` handle goes into the rollout,
and the host trains on the exact tokens it sampled for those generations.

Config: `max_terms` (3).
"""

import json
import random
import re
from typing import List, Optional

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.exports.agent import Rollout, RolloutGroup, RolloutRequest
from wit_world.imports import config as _config
from wit_world.imports import inference
from wit_world.imports.types import Message, Sampling, Score, Task

SYSTEM = "Answer with the final number inside <answer></answer> tags."
CHECK = "Check your work step by step. Then give the final number again inside <answer></answer> tags."
ANSWER = re.compile(r"<answer>\s*(-?\d+)\s*</answer>")


def setting(key: str, default):
    text = _config.get(key)
    return default if text is None else json.loads(text)


def task(seed: int, index: int, max_terms: int) -> Task:
    rng = random.Random(seed * 1_000_003 + index)
    terms = [rng.randint(1, 99) for _ in range(rng.randint(2, max_terms))]
    question = " + ".join(str(t) for t in terms)
    return Task(
        id=f"check/{seed}/{index}",
        messages=[Message("system", SYSTEM), Message("user", f"What is {question}?")],
        answer=str(sum(terms)),
        metadata=None,
    )


def final_answer(text: str) -> Optional[int]:
    found = ANSWER.findall(text)
    return int(found[-1]) if found else None


class Agent(exports.Agent):
    def rollouts(self, request: RolloutRequest) -> List[RolloutGroup]:
        max_terms = setting("max_terms", 3)
        if not isinstance(max_terms, int) or not 2 <= max_terms <= 8:
            raise Err(f"config `max_terms` = {max_terms!r}: it must be an integer from 2 to 8")
        sampling = Sampling(
            request.sampling.max_tokens,
            request.sampling.temperature,
            request.sampling.top_p,
            request.sampling.top_k,
            request.sampling.min_p,
            list(request.sampling.stop),
            None,
        )
        tasks = [task(request.seed, request.cursor + i, max_terms) for i in range(request.groups)]
        conversations = [list(t.messages) for t in tasks for _ in range(request.group_size)]
        first = inference.generate(conversations, sampling)
        for conversation, completion in zip(conversations, first):
            conversation.append(Message("assistant", completion.text))
            conversation.append(Message("user", CHECK))
        second = inference.generate(conversations, sampling)
        groups = []
        for g, t in enumerate(tasks):
            rollouts = []
            for j in range(request.group_size):
                k = g * request.group_size + j
                conversation = conversations[k] + [Message("assistant", second[k].text)]
                before, after = final_answer(first[k].text), final_answer(second[k].text)
                correct = 1.0 if after is not None and str(after) == t.answer else 0.0
                score = Score(correct, [("correct", correct), ("changed", float(before != after))], None)
                rollouts.append(Rollout(conversation, [first[k].generation, second[k].generation], Ok(score)))
            groups.append(RolloutGroup(t, rollouts))
        return groups
