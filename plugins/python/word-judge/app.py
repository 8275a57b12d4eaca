# wirl-world: reward-plugin@0.2.0
"""A `wirl:rl@0.2.0` judge in Python for tests, as plugins/tests/word-judge in Rust: it asks
the model about every completion of a group in one `generate` call (greedy, `max_tokens` from
its config, default 6) and rewards each with the number of words of the model's reply, kept as
its note; it also reports the step it is scored at (part `step`). A refused call (no model, a
spent budget) fails every completion with the host's reason. With `likelihood = true` it asks
instead how likely the model finds each completion as the reply to the task (`logprobs`), as
plugins/tests/likelihood: the mean log-prob per token, parts `total` and `tokens`.
"""

import struct

from wirl import Message, Reward, Score, config, generate, logprobs, progress, reward_group  # noqa: F401


def _f32(x):
    """`x` rounded to f32, as the Rust guest's sums round."""
    return struct.unpack("f", struct.pack("f", x))[0]


@reward_group
def judge(task, completions):
    if config("likelihood", False):
        scores = []
        for scored in logprobs([(task.messages, completion) for completion in completions]):
            total = 0.0
            for logprob in scored.logprobs:
                total = _f32(total + logprob)
            count = len(scored.tokens)
            mean = _f32(total / count) if count else 0.0
            scores.append(Score.of(mean, "".join(scored.tokens), total=total, tokens=float(count)))
        return scores
    max_tokens = config("max_tokens", 6)
    asked = " ".join(m.content for m in task.messages)
    conversations = [[Message("user", f"{asked} {completion}")] for completion in completions]
    replies = generate(conversations, max_tokens=max_tokens, temperature=0.0)
    step = progress().step
    scores = []
    for reply in replies:
        words = float(len(reply.text.split()))
        scores.append(Score.of(words, reply.text, judge_words=words, step=float(step)))
    return scores
