"""The official `openai` package against `wirl serve`: models, chat (n, logprobs, seed),
streaming, completions, and a refused request. Prints one JSON object of what it saw.

    python openai_client.py BASE_URL [API_KEY]
"""

import json
import sys

import openai

base_url = sys.argv[1]
client = openai.OpenAI(base_url=base_url, api_key=sys.argv[2] if len(sys.argv) > 2 else "unused")
seen = {}

models = client.models.list()
model = models.data[0].id
seen["models"] = [m.id for m in models.data]

question = {
    "model": model,
    "messages": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2 + 3?"}],
    "n": 2,
    "max_tokens": 16,
    "temperature": 0.7,
    "seed": 5,
}
chat = client.chat.completions.create(**question, logprobs=True)
seen["chat_choices"] = len(chat.choices)
seen["chat_text"] = chat.choices[0].message.content
seen["chat_logprobs"] = len(chat.choices[0].logprobs.content)
extra = chat.choices[0].model_extra or {}
seen["chat_token_ids"] = len(extra.get("token_ids") or [])
seen["chat_usage"] = chat.usage.completion_tokens
seen["prompt_token_ids"] = len((chat.model_extra or {}).get("prompt_token_ids") or [])

again = client.chat.completions.create(**question)
seen["seeded_equal"] = [c.message.content for c in again.choices] == [c.message.content for c in chat.choices]

pieces = []
finish = None
usage = None
for chunk in client.chat.completions.create(
    model=model,
    messages=[{"role": "user", "content": "Say hello."}],
    max_tokens=12,
    stream=True,
    stream_options={"include_usage": True},
):
    if chunk.usage is not None:
        usage = chunk.usage.completion_tokens
    for choice in chunk.choices:
        if choice.delta.content:
            pieces.append(choice.delta.content)
        if choice.finish_reason:
            finish = choice.finish_reason
seen["stream_text"] = "".join(pieces)
seen["stream_finish"] = finish
seen["stream_usage"] = usage

completion = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, logprobs=1, temperature=0)
seen["completion_text"] = completion.choices[0].text
seen["completion_logprobs"] = len(completion.choices[0].logprobs.token_logprobs)

# Alternatives: greedy, so the sampled token is each position's most likely one.
greedy = client.chat.completions.create(model=model, messages=question["messages"], max_tokens=6, temperature=0,
                                        logprobs=True, top_logprobs=3)
content = greedy.choices[0].logprobs.content
seen["top_logprobs_counts"] = [len(item.top_logprobs) for item in content]
seen["top_is_sampled"] = all(item.top_logprobs[0].token == item.token and
                             abs(item.top_logprobs[0].logprob - item.logprob) < 1e-5 for item in content)
seen["top_sorted"] = all(a.logprob >= b.logprob for item in content for a, b in zip(item.top_logprobs, item.top_logprobs[1:]))
text = client.completions.create(model=model, prompt="The capital of France is", max_tokens=4, logprobs=2, temperature=0)
seen["completion_top"] = [len(alternatives) for alternatives in text.choices[0].logprobs.top_logprobs]

try:
    client.chat.completions.create(model=model, messages=[{"role": "user", "content": "x"}], n=1000)
    seen["refused"] = None
except openai.BadRequestError as error:
    seen["refused"] = {"status": error.status_code, "param": (error.body or {}).get("param")}

print(json.dumps(seen))
