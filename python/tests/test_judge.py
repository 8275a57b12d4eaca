"""A wirl:rl@0.2.0 judge in the package: with no engine of its own, `builtin:judge` asks an
OpenAI-compatible server named when the reward is made (here a scripted one on loopback that
records what it was asked), within the reward's budget; every way the server can fail is the
completion's failure with the reason, never a reward of 0."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import wirl


class Scripted:
    """An OpenAI-compatible server answering each chat completion with the next reply (cycling),
    or with ``replies(body)`` when it is a function (requests come from several threads)."""

    def __init__(self, replies, status=200, finish_reason="stop", raw=None, hang=False):
        self.replies = replies if callable(replies) else list(replies)
        # Released when the server closes: a hanging handler ends with the test.
        self.released = threading.Event()
        self.asked = []
        self.headers = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                scripted.asked.append((self.path, body))
                scripted.headers.append({"authorization": self.headers.get("authorization")})
                if hang:
                    scripted.released.wait(60)
                    return
                if raw is not None:
                    answer = None
                elif status != 200:
                    answer = {"error": {"message": "the judge is overloaded"}}
                else:
                    if callable(scripted.replies):
                        text = scripted.replies(body)
                    else:
                        text = scripted.replies[(len(scripted.asked) - 1) % len(scripted.replies)]
                    answer = {
                        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
                        "usage": {"completion_tokens": len(text.split())},
                    }
                data = raw if raw is not None else json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                data = json.dumps({"object": "list", "data": [{"id": "scripted", "object": "model"}]}).encode()
                scripted.asked.append((self.path, None))
                self.send_response(200 if self.path == "/v1/models" else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    servers = []

    def start(replies, **kwargs):
        s = Scripted(replies, **kwargs)
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.close()


PROMPTS = ["What is 2 + 2?", "What is 3 + 3?"]


def test_the_judge_asks_the_server_named_and_reads_its_verdicts(server):
    def verdict(body):
        right = "[Response]\n4\n" in body["messages"][-1]["content"]
        return "Right. Score: 9" if right else "Wrong.\nScore: 1"

    judge = server(verdict)
    reward = wirl.Reward("builtin:judge", inference_url=judge.url, inference_model="judge-7b", inference_api_key="k")
    assert reward.world == "reward-plugin"
    rewards = reward(prompts=PROMPTS, completions=["4", "7"], answer=["4", "6"])
    assert rewards == pytest.approx([0.9, 0.1])
    assert [s.parts["judge"] for s in reward.last_scores] == [9.0, 1.0]
    assert len(judge.asked) == 2
    # In the order the completions were given (the batch is scored on several threads).
    asked = sorted(zip(judge.asked, judge.headers), key=lambda a: "[Response]\n4\n" not in a[0][1]["messages"][-1]["content"])
    for ((path, body), headers), prompt, completion in zip(asked, PROMPTS, ["4", "7"]):
        assert path == "/v1/chat/completions"
        assert body["model"] == "judge-7b"
        assert (body["temperature"], body["max_tokens"]) == (0.0, 512)
        assert headers["authorization"] == "Bearer k"
        content = body["messages"][-1]["content"]
        assert f"[Task]\n{prompt}\n" in content and f"[Response]\n{completion}\n" in content, content
        assert "[Reference answer]" in content


def test_a_call_is_held_to_the_rewards_budget(server):
    judge = server(["Score: 5"])
    reward = wirl.Reward("builtin:judge", inference_url=judge.url, inference_tokens=100)
    assert reward(prompts=PROMPTS[:1], completions=["4"]) == [0.5]
    # No model named: the server's first, asked once.
    assert judge.asked[0] == ("/v1/models", None)
    assert judge.asked[1][1]["model"] == "scripted"
    assert judge.asked[1][1]["max_tokens"] == 100, "the judge's 512 cut to the budget"
    # A plugin's config may ask for fewer.
    reward = wirl.Reward("builtin:judge", {"max_tokens": 16}, inference_url=judge.url)
    reward(prompts=PROMPTS[:1], completions=["4"])
    assert judge.asked[-1][1]["max_tokens"] == 16


def test_every_failure_is_the_completions_with_the_reason(server):
    # No verdict in the reply; a reply cut at the budget.
    rambling = server(["blah blah"], finish_reason="length")
    reward = wirl.Reward("builtin:judge", inference_url=rambling.url)
    assert reward(prompts=PROMPTS[:1], completions=["4"]) == [None]
    score = reward.last_scores[0]
    assert score.verdict == "guest_error"
    assert "no verdict matching" in score.message and "cut at max_tokens" in score.message, score.message
    # The server fails.
    overloaded = server(["Score: 5"], status=503)
    reward = wirl.Reward("builtin:judge", inference_url=overloaded.url)
    assert reward(prompts=PROMPTS[:1], completions=["4"]) == [None]
    assert "503: the judge is overloaded" in reward.last_scores[0].message
    # Nobody listens.
    gone = server(["Score: 5"])
    gone.close()
    reward = wirl.Reward("builtin:judge", inference_url=gone.url, inference_timeout_s=5)
    assert reward(prompts=PROMPTS[:1], completions=["4"]) == [None]
    assert gone.url in reward.last_scores[0].message
    # No server named: the plugin is told there is no model.
    reward = wirl.Reward("builtin:judge")
    assert reward(prompts=PROMPTS[:1], completions=["4"]) == [None]
    assert "no model to call here" in reward.last_scores[0].message
    # Log-probs of given text: a chat API gives them only of what it samples.
    listening = server(["Score: 5"])
    reward = wirl.Reward("builtin:judge", {"read": "probability", "labels": {"Yes": 1, "No": 0}},
                         inference_url=listening.url)
    assert reward(prompts=PROMPTS[:1], completions=["4"]) == [None]
    assert "no log-probs of given text" in reward.last_scores[0].message, reward.last_scores[0].message
    assert listening.asked == [], "nothing was sent"


def test_a_hostile_server_fails_the_completion_and_never_hangs_it(server):
    # Answers that are not a chat completion.
    for raw, expected in [
        (b"<html>not json</html>", "the answer is not JSON"),
        (b'{"choices": []}', "no choices[0].message.content"),
        (b'{"choices": [{"message": {"content": 7}}]}', "no choices[0].message.content"),
        (b"[" * 100_000, "the answer is not JSON"),
    ]:
        hostile = server(["unused"], raw=raw)
        reward = wirl.Reward("builtin:judge", inference_url=hostile.url, inference_model="m")
        assert reward(prompts=PROMPTS[:1], completions=["4"]) == [None]
        assert expected in reward.last_scores[0].message, reward.last_scores[0].message
    # A server that never answers: each completion fails at the timeout, in parallel.
    silent = server(["unused"], hang=True)
    reward = wirl.Reward("builtin:judge", inference_url=silent.url, inference_model="m", inference_timeout_s=1)
    assert reward(prompts=PROMPTS, completions=["4", "6"]) == [None, None]
    for score in reward.last_scores:
        assert score.verdict == "guest_error" and "timeout" in score.message.lower(), score.message


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"inference_url": "https://api.example.com/v1"}, "https is not supported"),
        ({"inference_url": "ftp://x"}, "not an http:// URL"),
        ({"inference_url": "http://127.0.0.1:1/v1", "inference_calls": 0}, "inference_calls"),
        ({"inference_url": "http://127.0.0.1:1/v1", "inference_tokens": -1}, "inference_tokens"),
        ({"inference_url": "http://127.0.0.1:1/v1", "inference_timeout_s": float("nan")}, "inference_timeout_s"),
        ({"inference_url": "http://127.0.0.1:1/v1", "inference_timeout_s": 1e9}, "inference_timeout_s"),
        ({"inference_url": 7}, "inference_url"),
    ],
)
def test_a_bad_server_setting_is_refused_when_the_reward_is_made(kwargs, error):
    with pytest.raises((ValueError, TypeError)) as caught:
        wirl.Reward("builtin:judge", **kwargs)
    assert error in str(caught.value)
