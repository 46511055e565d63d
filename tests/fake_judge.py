"""A fake OpenAI-compatible judge on localhost for tests (never the network), and a stand-in of a DeepEyes judge source
file: the shape `rewards.judge.deepeyes_template` reads (three prompt functions beside module code that must not run),
with text of our own, not DeepEyes'."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The shape of DeepEyes' `get_prompt` (instructions, in-context examples, the test block), in words of our own. The
# module line above the functions would fail if it ran, as DeepEyes' client does without its server.
DEEPEYES_LIKE_SOURCE = '''
client = OpenAI(base_url=UNREACHABLE)


def get_chat_template():
    return "Say whether the two answers agree: Judgement 1 if so, else 0.\\n\\n"


def get_gpt4_score_ICE():
    example_1 = """
[Question]: What is red?
[Standard Answer]: A. The apple.
[Model_answer] : apple
Judgement: 1
"""
    return [example_1]


def get_prompt(predict_str, ground_truth, question):
    examples = get_gpt4_score_ICE()
    chat_template = get_chat_template()
    demo_prompt = chat_template
    for example in examples:
        demo_prompt += example + '\\n\\n'
    test_prompt = f"""
[Question]: {question}
[Standard Answer]: {ground_truth}
[Model_answer] : {predict_str}
Judgement:"""
    full_prompt = f'{demo_prompt}{test_prompt}'
    return full_prompt
'''


def prompt_fields(prompt: str) -> dict[str, str]:
    """The question, standard answer and model answer of the last test block of a `DEEPEYES_LIKE_SOURCE` prompt."""
    block = prompt.rsplit("\n[Question]: ", 1)[1]
    question, rest = block.split("\n[Standard Answer]: ", 1)
    standard, rest = rest.split("\n[Model_answer] : ", 1)
    return {"question": question, "standard": standard, "prediction": rest.removesuffix("\nJudgement:")}


class FakeJudge(ThreadingHTTPServer):
    """Answers POST /v1/chat/completions with `reply(request body)`, records every body; serve with `start()`."""

    daemon_threads = True

    def __init__(self, reply: Callable[[dict], str]):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.reply, self.bodies, self.lock = reply, [], threading.Lock()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def start(self) -> FakeJudge:
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.server.lock:
            self.server.bodies.append(body)
        text = self.server.reply(body)
        reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(reply)))
        self.end_headers()
        self.wfile.write(reply)

    def log_message(self, *args):  # keep pytest's output quiet
        pass
