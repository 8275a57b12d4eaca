"""Reward plugins as the reward functions of Python trainers (TRL, verl, OpenRLHF)."""

import asyncio
import functools
import json
import math

from . import _checks, _native
from ._native import PluginError

__all__ = ["AsyncReward", "Reward", "Score"]

# What TRL passes a reward function besides the dataset's columns.
_TRL_EXTRAS = frozenset({"trainer_state", "log_extra", "log_metric", "environments"})


class Score:
    """One call's result: ``reward`` (None when the call failed), ``verdict`` (``ok``, or what
    ended the call: ``deadline``, ``memory``, ``fuel``, ``stack_overflow``, ``trap``,
    ``output_too_large``, ``print_limit``, ``non_finite``, ``instantiate``, ``interrupted``,
    ``infrastructure`` (a grader's code worker was lost: the host's failure), or
    the plugin's own ``guest_error``), its ``message``, the plugin's named ``parts`` and
    ``note``, and the call's ``micros``."""

    __slots__ = ("reward", "verdict", "message", "parts", "note", "micros")

    def __init__(self, reward, verdict, message, parts, note, micros):
        self.reward = reward
        self.verdict = verdict
        self.message = message
        self.parts = dict(parts)
        self.note = note
        self.micros = micros

    @property
    def ok(self):
        return self.verdict == "ok"

    def __repr__(self):
        if self.ok:
            return f"Score(reward={self.reward!r}, parts={self.parts!r}, note={self.note!r})"
        return f"Score(verdict={self.verdict!r}, message={self.message!r})"


def _messages(prompt):
    """A TRL prompt (plain text or a conversation) as the task's messages."""
    if prompt is None:
        return []
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    if isinstance(prompt, (list, tuple)):
        messages = []
        for message in prompt:
            if not isinstance(message, dict) or "role" not in message:
                raise ValueError(f"a conversational prompt is a list of {{role, content}} dicts, not {message!r:.80}")
            messages.append({"role": str(message["role"]), "content": _content(message.get("content"))})
        return messages
    raise ValueError(f"a prompt is a string or a list of messages, not {type(prompt).__name__}")


def _content(content):
    """A message's content as text: a string, or the text parts of a multimodal list."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


def _completion_text(completion, index=0):
    """A completion as text: a string, or what the assistant said in a conversational one
    (its messages joined by newlines; tool results and user turns in it are not the model's
    answer and are not scored)."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if isinstance(completion, (list, tuple)):
        said = []
        for message in completion:
            if not isinstance(message, dict) or "role" not in message:
                raise _checks.WrongType(
                    f"completion {index}: a conversational completion is a list of {{role, content}} dicts, "
                    f"not {message!r:.80}"
                )
            if message["role"] == "assistant":
                said.append(_content(message.get("content")))
        return "\n".join(said)
    raise _checks.WrongType(f"completion {index}: a str or a list of messages, not {type(completion).__name__}")


def _metadata(row, prompt):
    """The task's metadata: a ``metadata`` column as it is, else the row's columns as one JSON
    object (with the prompt when it is plain text: a grader of code needs it)."""
    if "metadata" in row:
        value = row["metadata"]
        if value is None or isinstance(value, str):
            return value
        return json.dumps(value, default=str)
    fields = dict(row)
    if isinstance(prompt, str):
        fields.setdefault("prompt", prompt)
    return json.dumps(fields, default=str) if fields else None


def _text_or_none(value):
    """A reference answer as text; a dataset's empty cell (None, NaN, pandas' NA) is no
    answer, not the text "nan"."""
    if _checks.is_missing(value):
        return None
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


class Reward:
    """A reward plugin, callable as TRL's ``GRPOTrainer`` calls a reward function.

    ``plugin`` is a built-in (``"builtin:math-answer"``, see :func:`wirl.builtins`) or a
    component file. ``config`` is the plugin's config (a dict of JSON values). Limits per call:
    ``deadline_ms`` (default 1000), ``memory_mib`` (64), ``fuel`` (none); ``weight`` multiplies
    every reward. A grader (a plugin that runs code) needs ``code_runner`` (a runner component;
    ``wirl.plugin_path("code_runner")``), optionally ``code_workers`` processes.

    ``reward(prompts=..., completions=..., **columns)`` returns one float per completion, or
    None where the call failed (TRL leaves it out of the mean): a failed call is never a
    reward of 0. ``reward.last_scores`` then holds each call's :class:`Score` (its verdict).
    The dataset's ``answer_column`` is the reference answer, an ``id`` column the task id, a
    ``metadata`` column the plugin's metadata (else the row's other columns, as JSON).
    A batch is scored on ``threads`` threads (default: the cores) without the GIL.

    A ``wirl:rl@0.2.0`` judge (``"builtin:judge"``, or a plugin that calls ``generate``)
    asks the model at ``inference_url``, an OpenAI-compatible server (``wirl serve``, vLLM,
    SGLang: its ``http://…/v1`` base), as ``inference_model`` (default: the first model the
    server lists at ``/v1/models``), with ``inference_api_key`` if
    it needs one. Each completion's scoring may make ``inference_calls`` calls (default 8)
    generating ``inference_tokens`` tokens in all (8192), each request within
    ``inference_timeout_s`` (120). Without a URL such a call is refused to the plugin, and
    its completions fail with the reason.
    """

    def __init__(
        self,
        plugin,
        config=None,
        *,
        deadline_ms=None,
        memory_mib=None,
        fuel=None,
        weight=1.0,
        reuse_instance=False,
        code_runner=None,
        code_workers=0,
        code_deadline_ms=None,
        code_memory_mib=None,
        threads=None,
        answer_column="answer",
        name=None,
        failed_score=0.0,
        inference_url=None,
        inference_model=None,
        inference_api_key=None,
        inference_calls=8,
        inference_tokens=8192,
        inference_timeout_s=120.0,
    ):
        plugin = _checks.reference(plugin, "plugin")
        if code_runner is not None:
            code_runner = _checks.reference(code_runner, "code_runner")
        if config is not None and not isinstance(config, dict):
            raise ValueError(f"config must be a dict, not {type(config).__name__}")
        self._args = {
            "plugin": plugin,
            "config": config,
            "deadline_ms": _checks.whole(deadline_ms, "deadline_ms", 1, _checks.MAX_DEADLINE_MS),
            "memory_mib": _checks.whole(memory_mib, "memory_mib", 1, _checks.MAX_MEMORY_MIB),
            "fuel": _checks.whole(fuel, "fuel", 1, 2**63 - 1),
            "reuse_instance": _checks.flag(reuse_instance, "reuse_instance"),
            "code_runner": code_runner,
            "code_workers": _checks.whole(code_workers, "code_workers", 0, _checks.MAX_WORKERS, optional=False),
            "code_deadline_ms": _checks.whole(code_deadline_ms, "code_deadline_ms", 1, _checks.MAX_DEADLINE_MS),
            "code_memory_mib": _checks.whole(code_memory_mib, "code_memory_mib", 1, _checks.MAX_MEMORY_MIB),
            "threads": _checks.whole(threads, "threads", 1, _checks.MAX_THREADS),
            "inference_url": _checks.text_or_none(inference_url, "inference_url"),
            "inference_model": _checks.text_or_none(inference_model, "inference_model"),
            "inference_api_key": _checks.text_or_none(inference_api_key, "inference_api_key"),
            "inference_calls": _checks.whole(inference_calls, "inference_calls", 1, 10_000, optional=False),
            "inference_tokens": _checks.whole(inference_tokens, "inference_tokens", 1, 2**31, optional=False),
            "inference_timeout_s": _checks.finite(inference_timeout_s, "inference_timeout_s"),
        }
        if not 0 < self._args["inference_timeout_s"] <= 3600:
            raise ValueError(f"inference_timeout_s must be from 0 to 3600 seconds, not {inference_timeout_s}")
        self.weight = _checks.finite(weight, "weight")
        self.failed_score = _checks.finite(failed_score, "failed_score")
        self.answer_column = _checks.text_or_none(answer_column, "answer_column")
        _checks.text_or_none(name, "name")
        self._native = _load(self._args)
        self.sha256 = self._native.sha256
        self.code_runner_sha256 = self._native.code_runner_sha256
        self.world = self._native.world
        # TRL names the reward's column in its logs after this.
        self.__name__ = name or self._native.name
        self.last_scores = []

    def __repr__(self):
        return f"{type(self).__name__}({self._args['plugin']!r}, sha256={self.sha256[:12]}…)"

    # -- scoring -------------------------------------------------------------------------

    def score(self, tasks, completions, *, step=0, steps=0):
        """Score ``completions[i]`` for ``tasks[i]`` (wirl's task records: ``id``,
        ``messages``, ``answer``, ``metadata``; dicts or JSON text). One :class:`Score` each.
        ``step`` of ``steps`` is where the training run stands (0 of 0: outside training),
        told to a ``wirl:rl@0.2.0`` plugin (a 0.1.0 plugin is not)."""
        step, steps = _checks.progress(step, steps)
        tasks = _checks.batch(tasks, "tasks")
        completions = _checks.batch(completions, "completions")
        if len(tasks) != len(completions):
            raise ValueError(f"{len(tasks)} tasks for {len(completions)} completions")
        items = []
        for index, (task, completion) in enumerate(zip(tasks, completions)):
            if isinstance(task, (str, bytes)):
                task = json.loads(task)
            if not isinstance(task, dict):
                raise ValueError(f"task {index}: a dict with id, messages, answer, metadata, not {type(task).__name__}")
            task = {
                "id": str(task.get("id", index)),
                "messages": _messages(task.get("messages") or []),
                "answer": _text_or_none(task.get("answer")),
                "metadata": task.get("metadata") if isinstance(task.get("metadata"), (str, type(None))) else json.dumps(task["metadata"]),
            }
            items.append({"task": task, "completion": _completion_text(completion, index)})
        scores = [Score(*s) for s in self._native.score(json.dumps(items), step, steps)]
        self.last_scores = scores
        return scores

    def __call__(self, prompts=None, completions=None, completion_ids=None, **columns):
        """TRL's reward function: one float per completion (times ``weight``), None where the
        call failed (the verdicts are in ``last_scores``)."""
        if completions is None:
            raise ValueError("completions= is required (TRL passes prompts=, completions= and the dataset's columns)")
        completions = _checks.batch(completions, "completions")
        count = len(completions)
        if prompts is not None:
            prompts = _checks.batch(prompts, "prompts")
            if len(prompts) != count:
                raise ValueError(f"{len(prompts)} prompts for {count} completions")
        data = {key: value for key, value in columns.items() if key not in _TRL_EXTRAS}
        for key, value in data.items():
            if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__") or len(value) != count:
                shown = f"{len(value)} values" if isinstance(value, (list, tuple)) else type(value).__name__
                raise ValueError(f"column {key!r}: expected a list of {count} values (one per completion), got {shown}")
            data[key] = list(value)
        tasks = []
        for index in range(count):
            row = {key: value[index] for key, value in data.items()}
            prompt = prompts[index] if prompts is not None else None
            answer = row.pop(self.answer_column, None) if self.answer_column else None
            tasks.append(
                {
                    "id": str(row.pop("id", index)),
                    "messages": _messages(prompt),
                    "answer": _text_or_none(answer),
                    "metadata": _metadata(row, prompt),
                }
            )
        step, steps = _trl_progress(columns.get("trainer_state"))
        scores = self.score(tasks, completions, step=step, steps=steps)
        return [self._weighted(s) for s in scores]

    def _weighted(self, score):
        """The score's reward times ``weight``; None where the call failed or the product is
        not finite (``weight=1e308`` times a reward of 2), the score then saying so."""
        if score.reward is None:
            return None
        value = score.reward * self.weight
        if not math.isfinite(value):
            score.message = f"the reward {score.reward!r} times weight {self.weight!r} is not finite"
            score.reward, score.verdict = None, "non_finite"
            return None
        return value

    def compute_score(self, data_source, solution_str, ground_truth, extra_info=None, **_):
        """verl's ``compute_score``: ``{"score": float, "failed": 0.0 | 1.0}``. verl cannot
        leave a sample out, so a failed call scores ``failed_score`` and says so in
        ``failed`` (its verdict in ``last_scores``)."""
        extra = dict(extra_info) if isinstance(extra_info, dict) else {}
        extra.setdefault("data_source", data_source)
        task = {
            "id": str(extra.get("index", extra.get("id", 0))),
            "messages": [],
            "answer": _text_or_none(ground_truth),
            "metadata": json.dumps(extra, default=str),
        }
        if not isinstance(solution_str, str):
            raise _checks.WrongType(f"solution_str must be a str, not {type(solution_str).__name__}")
        (score,) = self.score([task], [solution_str])
        value = self._weighted(score)
        if value is None:
            return {"score": self.failed_score, "failed": 1.0}
        return {"score": value, "failed": 0.0}

    def openrlhf(self, queries, prompts, labels):
        """OpenRLHF's ``reward_func(queries, prompts, labels)``: ``{"rewards", "scores",
        "extra_logs"}`` (tensors when torch is there). A query is prompt + response; a failed
        call scores ``failed_score``, counted in ``extra_logs["wirl_failed"]``."""
        queries = _checks.batch(queries, "queries")
        prompts = _checks.batch(prompts, "prompts")
        labels = _checks.batch(labels, "labels")
        if not len(queries) == len(prompts) == len(labels):
            raise ValueError(
                f"{len(queries)} queries, {len(prompts)} prompts and {len(labels)} labels: OpenRLHF passes one of each per sample"
            )
        tasks, responses = [], []
        for index, (query, prompt, label) in enumerate(zip(queries, prompts, labels)):
            if not isinstance(query, str) or not isinstance(prompt, str):
                raise _checks.WrongType(f"sample {index}: query and prompt must be str, not {type(query).__name__} and {type(prompt).__name__}")
            response = query[len(prompt) :] if query.startswith(prompt) else query
            tasks.append({"id": str(index), "messages": _messages(prompt), "answer": _text_or_none(label), "metadata": None})
            responses.append(response)
        scores = self.score(tasks, responses)
        weighted = [self._weighted(s) for s in scores]
        rewards = [self.failed_score if value is None else value for value in weighted]
        failed = [0.0 if s.ok else 1.0 for s in scores]
        try:
            import torch

            rewards, failed = torch.tensor(rewards), torch.tensor(failed)
        except ImportError:
            pass
        return {"rewards": rewards, "scores": rewards, "extra_logs": {"wirl_failed": failed}}

    # -- pickling: the plugin's reference, config and limits; loaded again on the other side --

    def __reduce__(self):
        state = (
            self._args,
            self.weight,
            self.failed_score,
            self.answer_column,
            self.__name__,
            self.sha256,
            self.code_runner_sha256,
        )
        return (_restore, (type(self), state))


def _load(args):
    config = args["config"]
    return _native.NativeReward(
        args["plugin"],
        None if config is None else json.dumps(config),
        deadline_ms=args["deadline_ms"],
        memory_mib=args["memory_mib"],
        fuel=args["fuel"],
        reuse_instance=args["reuse_instance"],
        code_runner=args["code_runner"],
        code_workers=args["code_workers"],
        code_deadline_ms=args["code_deadline_ms"],
        code_memory_mib=args["code_memory_mib"],
        threads=args["threads"],
        inference_url=args["inference_url"],
        inference_model=args["inference_model"],
        inference_api_key=args["inference_api_key"],
        inference_calls=args["inference_calls"],
        inference_tokens=args["inference_tokens"],
        inference_timeout_ms=max(1, round(args["inference_timeout_s"] * 1000)),
    )


def _restore(cls, state):
    args, weight, failed_score, answer_column, name, sha256, runner_sha256 = state
    reward = cls(
        args["plugin"],
        args["config"],
        weight=weight,
        failed_score=failed_score,
        answer_column=answer_column,
        name=name,
        **{k: v for k, v in args.items() if k not in ("plugin", "config")},
    )
    unchanged(args["plugin"], "reward", sha256, reward.sha256)
    unchanged(args["code_runner"], "reward's code runner", runner_sha256, reward.code_runner_sha256)
    return reward


def _trl_progress(state):
    """Where a TRL run stands, from the ``trainer_state`` TRL passes reward functions: the
    step being trained (``global_step`` counts the finished ones) of ``max_steps``; 0 of 0
    without one, or with values that are not counts."""
    step, steps = getattr(state, "global_step", None), getattr(state, "max_steps", None)
    counts = all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**62 for v in (step, steps))
    return (step + 1, steps) if counts else (0, 0)


def unchanged(reference, what, then, now):
    """Refuse an object unpickled with other bytes than it was made with: the other side of
    a pickle must score with the same plugin, not whatever is at that path now."""
    if then != now:
        raise PluginError(
            f"{reference} changed since this {what} was pickled (sha256 {str(now)[:12]}… now, {str(then)[:12]}… then): "
            f"an object is the plugin it was made with; make it anew from the new file"
        )


class AsyncReward(Reward):
    """A :class:`Reward` whose call is awaited (TRL runs async reward functions concurrently,
    and its async trainer expects them): the batch runs on a thread of the event loop's
    executor, the loop stays free."""

    async def __call__(self, prompts=None, completions=None, completion_ids=None, **columns):
        call = functools.partial(Reward.__call__, self, prompts, completions, completion_ids, **columns)
        return await asyncio.get_running_loop().run_in_executor(None, call)
