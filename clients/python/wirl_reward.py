"""wirl rewards for Python trainers: a reward function that TRL's ``GRPOTrainer`` takes as it
is, scored by the sandboxed reward plugins of a ``wirl serve --config TRAIN.toml`` server.
Standard library only; copy this file next to your training script.

    from wirl_reward import wirl_reward
    reward = wirl_reward("http://127.0.0.1:8000", task="arithmetic")
    trainer = GRPOTrainer(model=..., reward_funcs=[reward], train_dataset=dataset, ...)

TRL calls ``reward(prompts=..., completions=..., completion_ids=..., **columns)``, each prompt
repeated once per generation. Completions of one prompt go to the server as one group
(``POST /v1/score``); the dataset's ``answer`` column (``answer_column``) is the reference
answer, an ``id`` column the task id, a ``metadata`` column the grader's metadata.

A completion whose plugin failed, under the task's ``on_failure = "mask"``, scores ``None``
(TRL leaves it out of the mean). A server that cannot be reached after ``retries`` raises
``WirlRewardError``: a dead reward is never a reward of 0.
"""

import json
import time
import urllib.error
import urllib.request

__all__ = ["wirl_reward", "WirlRewardError"]


class WirlRewardError(RuntimeError):
    """The reward server could not score: unreachable, or it refused the request."""


def _messages(prompt):
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def _text(completion):
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content") or "" for m in completion)


def _post(url, body, api_key, timeout, retries):
    data = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    last = None
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(min(0.2 * 2 ** (attempt - 1), 5.0))
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            detail = error.read().decode(errors="replace")
            try:
                detail = json.loads(detail)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                pass
            if error.code not in (429, 500, 502, 503, 504):
                raise WirlRewardError(f"{url}: {error.code}: {detail}") from None
            last = f"{error.code}: {detail}"
        except (urllib.error.URLError, OSError) as error:
            last = str(error)
    raise WirlRewardError(f"{url}: {last} (after {retries + 1} tries)")


def wirl_reward(url, task=None, answer_column="answer", api_key=None, timeout=60.0, retries=2, name=None):
    """A TRL reward function scored by the wirl server at ``url`` (``http://HOST:PORT``)."""
    endpoint = url.rstrip("/") + "/v1/score"

    def reward(prompts, completions, **columns):
        answers = columns.get(answer_column)
        ids = columns.get("id")
        metadata = columns.get("metadata")
        # Consecutive completions of the same prompt form a group (TRL repeats each prompt
        # once per generation).
        groups, spans = [], []
        for i, (prompt, completion) in enumerate(zip(prompts, completions)):
            problem = {"messages": _messages(prompt)}
            if answers is not None and answers[i] is not None:
                problem["answer"] = str(answers[i])
            if ids is not None and ids[i] is not None:
                problem["id"] = str(ids[i])
            if metadata is not None and metadata[i] is not None:
                problem["metadata"] = metadata[i] if isinstance(metadata[i], str) else json.dumps(metadata[i])
            if groups and groups[-1]["problem"] == problem:
                groups[-1]["completions"].append(_text(completion))
                spans[-1] += 1
            else:
                groups.append({"problem": problem, "completions": [_text(completion)]})
                spans.append(1)
        if not groups:
            return []
        answer = _post(endpoint, {"task": task, "groups": groups}, api_key, timeout, retries)
        rewards = [r for group in answer["groups"] for r in group["rewards"]]
        if len(rewards) != len(completions):
            raise WirlRewardError(f"{endpoint}: {len(rewards)} rewards for {len(completions)} completions")
        return rewards

    reward.__name__ = name or f"wirl_{task or 'reward'}"
    return reward
