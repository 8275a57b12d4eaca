"""A bounded load generator for OpenAI-compatible servers: C concurrent clients send N
streamed chat completions (the same prompts and settings to every server) and it prints one
JSON line: aggregate generated tokens/s, latency p50/p99, time to first token p50/p99.

    python3 benches/serve_load.py URL --clients 8 --requests 32 --max-tokens 64
    python3 benches/serve_load.py URL --clients 8 --requests 32 --long-prompt-words 1400

With --long-prompt-words, one more request with a long prompt (1,400 words ≈ 4,000 tokens of
the default model) is sent just before the clients start; the figures are the short
requests', with the long one's latency and prompt size beside them (head-of-line blocking
shows as the short requests' first-token latency).

Tokens are counted as the streamed content chunks (one per sampled token on both wirl and
llama-cpp-python's server). Standard library only."""
import argparse
import http.client
import json
import statistics
import threading
import time
import urllib.parse

QUESTIONS = [f"What is {a} + {b}? Explain your steps, then give the answer." for a, b in
             [(12, 7), (3, 45), (18, 29), (51, 6), (77, 14), (9, 98), (23, 23), (64, 11)]]


def one(url, index, max_tokens, model):
    parsed = urllib.parse.urlparse(url)
    body = json.dumps({
        "model": model,
        "messages": [{"role": "user", "content": QUESTIONS[index % len(QUESTIONS)]}],
        "max_tokens": max_tokens, "temperature": 0.8, "top_p": 1.0, "seed": index, "stream": True,
    })
    started = time.perf_counter()
    connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
    connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"{response.status}: {response.read()[:300]!r}")
    first, tokens = None, 0
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        for choice in chunk.get("choices", []):
            if (choice.get("delta") or {}).get("content"):
                tokens += 1
                if first is None:
                    first = time.perf_counter() - started
    connection.close()
    return {"latency": time.perf_counter() - started, "ttft": first if first is not None else float("nan"),
            "tokens": tokens}


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--model", default=None, help="default: the first of the server's /v1/models")
    parser.add_argument("--name", default="server")
    parser.add_argument("--long-prompt-words", type=int, default=0)
    args = parser.parse_args()
    if args.model is None:
        parsed = urllib.parse.urlparse(args.url)
        connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
        connection.request("GET", "/v1/models")
        args.model = json.load(connection.getresponse())["data"][0]["id"]
    results, errors, lock = [], [], threading.Lock()
    next_index = iter(range(args.requests))

    def client():
        while True:
            with lock:
                index = next(next_index, None)
            if index is None:
                return
            try:
                result = one(args.url, index, args.max_tokens, args.model)
                with lock:
                    results.append(result)
            except Exception as error:  # noqa: BLE001 - reported below
                with lock:
                    errors.append(str(error))

    long = {}

    def long_request():
        parsed = urllib.parse.urlparse(args.url)
        words = " ".join(f"word{i % 50}" for i in range(args.long_prompt_words))
        body = json.dumps({"model": args.model, "messages": [{"role": "user", "content": words}],
                           "max_tokens": 8, "temperature": 0.8, "seed": 0})
        began = time.perf_counter()
        try:
            connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=900)
            connection.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            long["status"] = response.status
            long["prompt_tokens"] = json.loads(answer).get("usage", {}).get("prompt_tokens") \
                if response.status == 200 else answer[:300].decode(errors="replace")
        except Exception as error:  # noqa: BLE001 - reported below
            long["status"] = str(error)
        long["latency_s"] = round(time.perf_counter() - began, 2)

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(args.clients)]
    long_thread = threading.Thread(target=long_request) if args.long_prompt_words else None
    if long_thread:
        long_thread.start()
        time.sleep(0.2)  # the long prompt is being computed when the short ones arrive
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if long_thread:
        long_thread.join()
    if not results:
        raise SystemExit(f"{args.name}: every request failed: {errors[:3]}")
    tokens = sum(r["tokens"] for r in results)
    latency = [r["latency"] for r in results]
    ttft = [r["ttft"] for r in results if r["tokens"] > 0]
    print(json.dumps({
        "server": args.name, "clients": args.clients, "requests": len(results), "errors": len(errors),
        "first_error": errors[0] if errors else None, "wall_s": round(wall, 2), "tokens": tokens,
        "tokens_per_s": round(tokens / wall, 1),
        "latency_p50_s": round(percentile(latency, 50), 3), "latency_p99_s": round(percentile(latency, 99), 3),
        "ttft_p50_s": round(percentile(ttft, 50), 3), "ttft_p99_s": round(percentile(ttft, 99), 3),
        "ttft_mean_s": round(statistics.fmean(ttft), 3),
        "tokens_per_request": [r["tokens"] for r in results],
        **({"long_prompt": long} if long_thread else {}),
    }))


if __name__ == "__main__":
    main()
