"""The LLM-judge reward against a fake OpenAI-compatible judge on localhost: verdicts in row order, what the requests
carry, concurrency, timeouts and bad replies as unscorable rows, and the pure parsing of verdicts and settings."""

import json
import logging
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import rl
from data.task import USER_SUFFIX, build_prompt
from rewards import REWARDS, check_judge
from rewards.deepeyes import deepeyes_reward, deepeyes_terms, rollout_text
from rewards.judge import (
    JUDGE_ENV,
    JudgeArguments,
    JudgeSettings,
    deepeyes_template,
    fill_judge_prompt,
    judge_reward,
    judge_settings,
    parse_deepeyes_verdict,
    parse_verdict,
    prompt_question,
)
from tests.fake_judge import DEEPEYES_LIKE_SOURCE, prompt_fields
from tests.fake_judge import FakeJudge as FakeDeepEyesJudge
from tests.peer_oracles import deepeyes_compute_score
from tiny.stages import RL_TYPES
from utils.recipes import load_recipe, parse_args_and_record

REPO = Path(__file__).resolve().parents[1]

# JUDGE_TIMEOUT in these tests: the late reply sleeps past it; every other reply is due well within it even on a
# loaded machine (the suite's own workers share its 2 cores).
TIMEOUT = 2.0
# What the fake judge replies, by the prediction it finds in the prompt: (seconds to wait, reply text).
REPLIES = {
    "red": (0.0, "CORRECT"),
    "blue": (0.0, "INCORRECT"),
    "green": (TIMEOUT + 1.0, "CORRECT"),  # too late: the client gave up
    "grey": (0.0, "maybe?"),
    "slow": (0.0, "Correct."),  # held until a second request is in flight: the concurrency test
    # replies to DeepEyes' prompt (JUDGE_VERDICT=deepeyes)
    "pink": (0.0, "Judgement: 1"),
    "teal": (0.0, "The two differ.\nJudgement: 0"),
    "mauve": (0.0, "They might be the same."),
}
OVERLAP_WAIT = TIMEOUT / 2  # how long a "slow" request waits for a second one (a serial client never sends it)


class FakeJudge(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), JudgeHandler)
        self.requests, self.lock, self.in_flight, self.max_in_flight = [], threading.Lock(), 0, 0
        self.overlapped = threading.Event()  # set once two requests are in flight at the same time

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class JudgeHandler(BaseHTTPRequestHandler):
    def do_POST(self):
        server = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            server.in_flight += 1
            server.max_in_flight = max(server.max_in_flight, server.in_flight)
            if server.in_flight >= 2:
                server.overlapped.set()
        try:
            prompt = body["messages"][-1]["content"]
            # The prediction is the prompt's "Model's answer:" line (the default template) or its last line.
            line = next((x for x in prompt.splitlines() if x.startswith("Model's answer:")), prompt.splitlines()[-1])
            prediction = line.split(":")[-1].strip()
            delay, text = REPLIES.get(prediction, (0.0, "garbage"))
            if prediction == "slow":  # an event, not a sleep: overlap is seen however slow the machine is
                server.overlapped.wait(OVERLAP_WAIT)
            time.sleep(delay)
            reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
            # No longer in flight once the reply is ready: counted until after the write, a request could still be
            # counted when the client, which has its reply, sends the next one (a race in the count, not the client).
            with server.lock:
                server.in_flight -= 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
        except (BrokenPipeError, ConnectionResetError):  # the client timed out and hung up
            pass

    def log_message(self, *args):  # keep pytest's output quiet
        pass


@pytest.fixture
def judge(monkeypatch):
    """A fake judge served in a daemon thread, and the JUDGE_* environment pointing at it."""
    server = FakeJudge()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    for name, value in {
        "JUDGE_BASE_URL": server.base_url,
        "JUDGE_MODEL": "test-judge",
        "JUDGE_API_KEY": "sk-test",
        "JUDGE_TIMEOUT": str(TIMEOUT),
        "JUDGE_CONCURRENCY": "4",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("JUDGE_PROMPT", "JUDGE_VERDICT", "JUDGE_TEMPERATURE", "JUDGE_MAX_TOKENS", "JUDGE_SYSTEM",
                 "JUDGE_UNREADABLE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    yield server
    server.shutdown()
    server.server_close()


def completion(answer: str | None) -> list[dict]:
    """A two-turn completion whose final turn answers `answer` (None: no `<answer>` at all)."""
    final = "<think>done</think>" + (f"<answer>{answer}</answer>" if answer is not None else " no idea")
    call = {"role": "assistant", "content": "<think>look</think>", "tool_calls": [{"name": "image_zoom_in_tool"}]}
    return [
        call,
        {"role": "tool", "content": [{"type": "text", "text": "crop"}]},
        {"role": "assistant", "content": final},
    ]


# ------------------------------------------------------------------------------------------------- against a server
def test_verdicts_come_back_in_row_order_and_failures_are_unscorable(judge, caplog):
    predictions = ["red", "blue", "green", "grey", "red"]
    with caplog.at_level(logging.WARNING, logger="rewards"):
        scores = judge_reward([completion(p) for p in predictions], answer=["red"] * 5)
    assert scores == [1.0, 0.0, None, None, 1.0]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "2 of 5 requests" in warnings[0].getMessage()  # once a batch, with the count


def test_requests_carry_the_model_the_key_and_the_filled_prompt(judge):
    prompt = build_prompt("What colour is the star?")
    assert judge_reward([completion("red")], answer=["crimson"], prompts=[prompt]) == [1.0]
    (request,) = judge.requests
    body = request["body"]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    assert body["model"] == "test-judge" and body["temperature"] == 0 and body["max_tokens"] > 0
    text = body["messages"][-1]["content"]
    assert "Question: What colour is the star?\n" in text  # the user turn, less the format instruction
    assert "Ground-truth answer: crimson" in text and "Model's answer: red" in text
    assert "{" not in text and "Think first" not in text


def test_no_api_key_sends_no_authorization_header(judge, monkeypatch):
    monkeypatch.delenv("JUDGE_API_KEY")
    assert judge_reward([completion("red")], answer=["red"]) == [1.0]
    assert judge.requests[0]["auth"] is None


def test_requests_of_a_batch_overlap(judge):
    assert judge_reward([completion("slow")] * 8, answer=["x"] * 8) == [1.0] * 8
    assert 1 < judge.max_in_flight <= 4  # JUDGE_CONCURRENCY=4


def test_a_missing_or_too_long_answer_scores_zero_without_a_request(judge):
    completions = [completion(None), completion("x" * 1000), completion("x" * 999), completion("red")]
    assert judge_reward(completions, answer=["red"] * 4) == [0.0, 0.0, None, 1.0]  # 999 characters: asked (garbage)
    assert len(judge.requests) == 2
    assert judge_reward([completion(None)], answer=["red"]) == [0.0] and len(judge.requests) == 2


def test_a_custom_prompt_file_is_used(judge, monkeypatch, tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text('Grade {"json": "braces stay"}.\nQ: {question}\nGold: {answer}\nSaid: {prediction}')
    monkeypatch.setenv("JUDGE_PROMPT", str(template))
    assert judge_reward([completion("blue")], answer=["navy"], prompts=[build_prompt("Which?")]) == [0.0]
    text = judge.requests[0]["body"]["messages"][-1]["content"]
    assert text == 'Grade {"json": "braces stay"}.\nQ: Which?\nGold: navy\nSaid: blue'


# A stand-in for a template of DeepEyes' prompt (its text is theirs, not copied here): the test block's shape.
DEEPEYES_LIKE = "[Question]: {question}\n[Standard Answer]: {answer}\nModel's answer: {prediction}\nJudgement:"


def test_the_deepeyes_mode_asks_and_reads_as_deepeyes_judge(judge, monkeypatch, tmp_path):
    """JUDGE_VERDICT=deepeyes: the system message, temperature 0.3 and no token limit of DeepEyes' `compute_score`,
    "Judgement: 1/0" read as it reads them, an unreadable reply scored 0 (ours would leave it unscored); a request
    that fails is still unscored. JUDGE_TEMPERATURE=0 gives their evaluation script's setting."""
    template = tmp_path / "deepeyes.txt"
    template.write_text(DEEPEYES_LIKE)
    monkeypatch.setenv("JUDGE_PROMPT", str(template))
    assert judge_reward([completion(p) for p in ("pink", "teal", "mauve")], answer=["x"] * 3) == [None] * 3
    monkeypatch.setenv("JUDGE_VERDICT", "deepeyes")
    scores = judge_reward([completion(p) for p in ("pink", "teal", "mauve", "green")], answer=["x"] * 4)
    assert scores == [1.0, 0.0, 0.0, None]  # green: too late, no reply to read
    # The batch's requests run concurrently, so they reach the server in any order: pick green's by its content.
    (body,) = [
        r["body"] for r in judge.requests[3:] if r["body"]["messages"][-1]["content"].endswith("green\nJudgement:")
    ]
    assert body["temperature"] == 0.3 and "max_tokens" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert body["messages"][0]["content"] == "You are a helpful assistant."
    assert body["messages"][1]["content"].endswith("Model's answer: green\nJudgement:")
    monkeypatch.setenv("JUDGE_TEMPERATURE", "0")
    assert judge_reward([completion("pink")], answer=["x"]) == [1.0] and judge.requests[-1]["body"]["temperature"] == 0


def test_an_unreachable_judge_leaves_rows_unscored(judge):
    judge.shutdown()
    judge.server_close()  # nothing listens on the port any more: connection refused
    assert judge_reward([completion("red"), completion(None)], answer=["red", "red"]) == [None, 0.0]


def test_an_http_error_leaves_the_row_unscored(judge, monkeypatch):
    monkeypatch.setattr(JudgeHandler, "do_POST", lambda self: self.send_error(500))
    assert judge_reward([completion("red")], answer=["red"]) == [None]


def test_judge_is_registered_and_needs_the_answer_column():
    assert REWARDS["judge"] is judge_reward and judge_reward.required_columns == ("answer",)


# ------------------------------------------------------------------------------------------------------------ pure
@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("CORRECT", 1.0),
        (" correct.\n", 1.0),
        ("**Correct**", 1.0),
        ("INCORRECT", 0.0),
        ("Incorrect!", 0.0),
        ("maybe?", None),
        ("", None),
        ("CORRECT INCORRECT", None),
        ("INCORRECT CORRECT", None),
        ("not correct", None),
        ("The answer is CORRECT", None),
    ],
)
def test_parse_verdict(text, score):
    assert parse_verdict(text) == score


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Judgement: 1", 1.0),
        ("Judgement: 0", 0.0),
        ("The answers agree.\nJudgement: 1", 1.0),
        ("Judgement: 1\nJudgement: 0", 0.0),  # the last "Judgement:" counts
        ("Judgement: 10", 1.0),  # a "1" after it, as DeepEyes reads it
        ("1", 1.0),
        (" 0\n", 0.0),
        ("Judgement: yes", None),
        ("10", None),  # without "Judgement:", exactly "1" or "0"
        ("CORRECT", None),
        ("", None),
    ],
)
def test_parse_deepeyes_verdict(text, score):
    assert parse_deepeyes_verdict(text) == score


def test_the_deepeyes_mode_needs_their_prompt_and_has_their_defaults(tmp_path):
    template = tmp_path / "deepeyes.txt"
    template.write_text(DEEPEYES_LIKE)
    with pytest.raises(ValueError, match=r"JUDGE_VERDICT=deepeyes .* set JUDGE_PROMPT .*vl_agent.py"):
        judge_settings({"JUDGE_VERDICT": "deepeyes"})
    settings = judge_settings({"JUDGE_VERDICT": "deepeyes", "JUDGE_PROMPT": str(template)})
    assert (settings.temperature, settings.max_tokens, settings.system, settings.unreadable_zero) == (
        0.3, None, "You are a helpful assistant.", True)  # fmt: skip
    ours = judge_settings({})
    assert (ours.verdict, ours.temperature, ours.max_tokens, ours.system, ours.unreadable_zero) == (
        "correct_incorrect", 0.0, 16, None, False)  # fmt: skip
    overridden = judge_settings({"JUDGE_VERDICT": "deepeyes", "JUDGE_PROMPT": str(template), "JUDGE_TEMPERATURE": "0",
                                 "JUDGE_MAX_TOKENS": "64", "JUDGE_UNREADABLE": "none", "JUDGE_SYSTEM": "Judge."})  # fmt: skip
    assert (overridden.temperature, overridden.max_tokens, overridden.unreadable_zero, overridden.system) == (
        0.0, 64, False, "Judge.")  # fmt: skip


def test_the_question_is_the_last_user_turn_in_either_content_form():
    system, user = build_prompt("How many cats?", ["1", "2"])
    parts = {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": user["content"]}]}  # TRL's form
    assert (
        prompt_question([system, user]) == prompt_question([system, parts]) == "How many cats?\nOptions:\nA. 1\nB. 2"
    )
    assert prompt_question(None) == "" and prompt_question([system]) == ""


def test_a_placeholder_inside_a_filled_value_is_not_expanded():
    filled = fill_judge_prompt("{question}|{answer}|{prediction}", "q {answer}", "gold", "{question}")
    assert filled == "q {answer}|gold|{question}"


def test_settings_defaults_and_empty_values_mean_unset():
    settings = judge_settings({"JUDGE_API_KEY": "", "JUDGE_TIMEOUT": ""})
    assert settings == JudgeSettings("http://localhost:8000/v1", "judge", None, 30.0, 8, settings.template)
    assert all(p in settings.template for p in ("{question}", "{answer}", "{prediction}"))
    assert judge_settings({"JUDGE_BASE_URL": "http://h:1/v1/", "JUDGE_TIMEOUT": "2.5"}).base_url == "http://h:1/v1"


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"JUDGE_TIMEOUT": "soon"}, "JUDGE_TIMEOUT"),
        ({"JUDGE_TIMEOUT": "0"}, "JUDGE_TIMEOUT"),
        ({"JUDGE_TIMEOUT": "nan"}, "JUDGE_TIMEOUT"),
        ({"JUDGE_CONCURRENCY": "0"}, "JUDGE_CONCURRENCY"),
        ({"JUDGE_CONCURRENCY": "two"}, "JUDGE_CONCURRENCY"),
        ({"JUDGE_BASE_URL": "localhost:8000/v1"}, "JUDGE_BASE_URL"),
        ({"JUDGE_PROMPT": "/nonexistent/judge.txt"}, "JUDGE_PROMPT"),
        ({"JUDGE_VERDICT": "yes_no"}, "JUDGE_VERDICT"),
        ({"JUDGE_TEMPERATURE": "-1"}, "JUDGE_TEMPERATURE"),
        ({"JUDGE_MAX_TOKENS": "0"}, "JUDGE_MAX_TOKENS"),
        ({"JUDGE_UNREADABLE": "one"}, "JUDGE_UNREADABLE"),
    ],
)
def test_a_bad_setting_names_its_variable(environ, variable):
    with pytest.raises(ValueError, match=variable):
        judge_settings(environ)


def test_a_prompt_file_without_a_placeholder_is_refused(tmp_path):
    template = tmp_path / "judge.txt"
    template.write_text("Gold: {answer}\nReply CORRECT or INCORRECT.")
    with pytest.raises(ValueError, match=r"JUDGE_PROMPT.*\{prediction\}"):
        judge_settings({"JUDGE_PROMPT": str(template)})


# ------------------------------------------------------------------------- DeepEyes' reward, held to its code
THINK, ZOOM_ARGS = "look", {"bbox_2d": [1, 2, 30, 40], "label": "the sign"}


def zoom_turn(ok: bool) -> list[dict]:
    """An assistant turn that calls the tool (TRL's parsed form) and the tool's reply: a crop, or an error."""
    call = {"type": "function", "function": {"name": "image_zoom_in_tool", "arguments": ZOOM_ARGS}}
    turn = {"role": "assistant", "reasoning_content": THINK, "content": "", "tool_calls": [call]}
    parts = [{"type": "image", "image": None}, {"type": "text", "text": "Zoomed in on [1, 2, 30, 40]."}] if ok else [
        {"type": "text", "text": "Error: the box is too small. Fix the call, or answer if you can."}]  # fmt: skip
    return [turn, {"role": "tool", "name": "image_zoom_in_tool", "content": parts}]


def final_turn(text: str, parsed: bool) -> dict:
    """The last assistant turn: as written, or as TRL's parser leaves a leading `<think>...</think>` (reasoning)."""
    if parsed and text.startswith("<think>") and "</think>" in text:
        reasoning, content = text.removeprefix("<think>").split("</think>", 1)
        return {"role": "assistant", "reasoning_content": reasoning, "content": content}
    return {"role": "assistant", "content": text}


# Final turns: tags balanced or not, answers inside or outside tags, several blocks, \boxed{}, the length limit.
FINAL_TEXTS = [
    "<think>t</think><answer>B</answer>", "<think>t</think><answer>blue</answer>", "<think>t</think><answer>C</answer>",
    "<answer>B</answer>", "<think>t</think>B", "<think>t</think> The answer is B", "<think>t</think><answer>B",
    "<think>t</think><answer>C</answer><answer>B</answer>", "<think>t</think><answer>B</answer><answer>C</answer>",
    "<think>t<think>u</think><answer>B</answer>", "<think>t</think><answer>\\boxed{B}</answer>",
    "<think>t</think><answer></answer>", "<think>t</think><answer>" + "B" * 1000 + "</answer>",
    "<think>t</think><answer>" + "B" * 999 + "</answer>", "<think>t</think><answer>B</answer></answer>",
    "<answer>B</answer><think>late</think>", "<think>t</think><answer>mauve</answer>", "<think>t",
]  # fmt: skip
STRUCTURES = {"single turn": [], "zoom": zoom_turn(True), "failed zoom": zoom_turn(False),
              "two zooms": zoom_turn(True) + zoom_turn(True)}  # fmt: skip


def deepeyes_completions() -> list[tuple[str, list[dict]]]:
    """72 training completions: every final turn after every structure, in the form TRL's parser leaves or as written
    (alternating)."""
    return [
        (f"{name} / {text[:40]!r}", [*prefix, final_turn(text, parsed=(i + j) % 2 == 0)])
        for i, (name, prefix) in enumerate(STRUCTURES.items())
        for j, text in enumerate(FINAL_TEXTS)
    ]


def deepeyes_reply(body: dict) -> str:
    """The fake judge of the reward tests: DeepEyes' reply format, right when the answer is the standard answer or its
    option text (ignoring case and a final period); "mauve" gets a reply that is no verdict (DeepEyes reads it as 0)."""
    fields = prompt_fields(body["messages"][-1]["content"])
    said = fields["prediction"].strip().lower().rstrip(".")
    if said == "mauve":
        return "Hard to say."
    return f"Judgement: {int(said in (fields['standard'].lower(), 'blue'))}"


@pytest.fixture
def deepeyes_judge(monkeypatch, tmp_path):
    """A fake judge and the JUDGE_* settings of the deepeyes reward: DeepEyes' mode, its prompt read from a stand-in
    of vl_agent.py."""
    source = tmp_path / "vl_agent.py"
    source.write_text(DEEPEYES_LIKE_SOURCE)
    server = FakeDeepEyesJudge(deepeyes_reply).start()
    environ = {"JUDGE_BASE_URL": server.base_url, "JUDGE_MODEL": "fake", "JUDGE_VERDICT": "deepeyes",
               "JUDGE_PROMPT": str(source), "JUDGE_TIMEOUT": str(TIMEOUT), "JUDGE_CONCURRENCY": "4"}  # fmt: skip
    for name in JUDGE_ENV:
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    yield server, source
    server.stop()


def test_the_deepeyes_reward_is_deepeyes_compute_score(deepeyes_judge):
    """On 72 completions, `deepeyes_reward` equals DeepEyes' `compute_score` (tests/peer_oracles.py, a transcription of
    verl/utils/reward_score/vl_agent.py) given the same rollout string and the same judge."""
    server, source = deepeyes_judge
    template = deepeyes_template(source)
    prompt = build_prompt("Which colour is the car?", ["red", "blue", "green", "white"])
    extra_info = {"question": prompt_question(prompt),
                  "get_prompt": lambda p, g, q: fill_judge_prompt(template, q, g, p)}  # fmt: skip
    cases = deepeyes_completions()
    assert len(cases) >= 60
    ours = deepeyes_reward([c for _, c in cases], answer=["B"] * len(cases), prompts=[prompt] * len(cases))
    judge = lambda full_prompt: deepeyes_reply({"messages": [{"content": full_prompt}]})  # noqa: E731
    for (name, completion), score in zip(cases, ours):
        theirs = deepeyes_compute_score(rollout_text(completion), "B", extra_info, judge)
        assert score == pytest.approx(theirs, abs=1e-12), name  # the same sums of the same doubles
    asked = [b for b in server.bodies]
    assert len(asked) == len(cases) - len(STRUCTURES)  # every rollout but the 1,000-character answers
    assert all(
        b["temperature"] == 0.3 and b["messages"][0]["content"] == "You are a helpful assistant." for b in asked
    )


def test_deepeyes_reward_by_hand(deepeyes_judge):
    """R = 0.8 acc + 0.2 format + 1.2 tool, worked out: right after a zoom 2.0; right without one 0.8; right after a
    zoom that returned no crop 0.8; an unclosed answer, judged right, 0.8 - 0.2 + 1.2; 1,000 characters -0.2 and not
    asked; a rollout that zooms and never answers is judged on DeepEyes' "..." (0, no format error)."""
    right = "<think>t</think><answer>B</answer>"
    completions = [
        [*zoom_turn(True), final_turn(right, True)],
        [final_turn(right, True)],
        [*zoom_turn(False), final_turn(right, False)],
        [*zoom_turn(True), final_turn("<think>t</think><answer>B", True)],
        [final_turn("<think>t</think><answer>" + "B" * 1000 + "</answer>", True)],
        [*zoom_turn(True), final_turn("<think>t</think>B", True)],
    ]
    scores = deepeyes_reward(completions, answer=["B"] * 6)
    assert scores == pytest.approx([2.0, 0.8, 0.8, 0.8 - 0.2 + 1.2, -0.2, 0.0], abs=1e-12)
    server, _ = deepeyes_judge
    said = sorted(prompt_fields(b["messages"][-1]["content"])["prediction"] for b in server.bodies)
    assert said == ["...", "B", "B", "B", "B"]


def test_rollout_text_is_deepeyes_decoded_response():
    completion = [*zoom_turn(True), *zoom_turn(False), final_turn("<think>t</think><answer>B</answer>", True)]
    call = '<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 30, 40], "label": "the sign"}}'
    observation = f"<tool_response><|vision_start|><|image_pad|><|vision_end|>\n{USER_SUFFIX}</tool_response>"
    assert rollout_text(completion) == (
        f"<think>look</think>{call}\n</tool_call>{observation}<think>look</think>{call}\n</tool_call>"
        "Error: the box is too small. Fix the call, or answer if you can.<think>t</think><answer>B</answer>"
    )
    terms = deepeyes_terms(rollout_text(completion))
    assert (terms.answer, terms.format_error, terms.images) == ("B", False, 1)


def test_an_unscorable_request_leaves_the_deepeyes_row_unscored(deepeyes_judge, monkeypatch):
    server, _ = deepeyes_judge
    server.stop()
    assert deepeyes_reward([[final_turn("<think>t</think><answer>B</answer>", True)]], answer=["B"]) == [None]


def test_a_deepeyes_source_file_gives_its_prompt_and_a_wrong_one_is_named(tmp_path):
    source = tmp_path / "judge_result.py"
    source.write_text(DEEPEYES_LIKE_SOURCE)
    namespace = {}
    exec(DEEPEYES_LIKE_SOURCE.split("\n\n\n", 1)[1], namespace)  # the prompt functions without the client line
    assert deepeyes_template(source) == namespace["get_prompt"]("{prediction}", "{answer}", "{question}")
    settings = judge_settings({"JUDGE_VERDICT": "deepeyes_eval", "JUDGE_PROMPT": str(source)})
    assert (settings.template, settings.temperature, settings.unreadable_zero) == (
        deepeyes_template(source),
        0.0,
        True,
    )
    other = tmp_path / "other.py"
    other.write_text("def get_prompt(a, b, c):\n    return a\n")
    with pytest.raises(ValueError, match=r"other.py.*\['get_chat_template', 'get_gpt4_score_ICE'\]"):
        judge_settings({"JUDGE_PROMPT": str(other)})
    with pytest.raises(ValueError, match="JUDGE_VERDICT=deepeyes_eval .*eval/judge_result.py"):
        judge_settings({"JUDGE_VERDICT": "deepeyes_eval"})


def test_the_deepeyes_reward_is_registered_and_checked_at_start(monkeypatch):
    assert REWARDS["deepeyes"] is deepeyes_reward and deepeyes_reward.required_columns == ("answer",)
    monkeypatch.setenv("JUDGE_VERDICT", "deepeyes")
    monkeypatch.delenv("JUDGE_PROMPT", raising=False)
    with pytest.raises(ValueError, match="set JUDGE_PROMPT"):
        check_judge(["outcome", "deepeyes"])
    check_judge(["outcome", "format"])  # no judge asked: nothing to check


def test_the_deepeyes_recipe_names_its_reward_and_its_judge():
    values = load_recipe(REPO / "recipes/Qwen2.5-VL-7B-Instruct/rl/config_mapo_deepeyes.yaml").values
    assert values["reward_funcs"] == ["deepeyes"] and values.get("reward_weights", [1.0]) == [1.0]
    assert values["judge_base_url"].startswith("http") and values["judge_verdict"] == "deepeyes"
    assert values["judge_prompt"].endswith("verl/utils/reward_score/vl_agent.py") and values["judge_model"]
    arguments = JudgeArguments(judge_base_url="http://h:1/v1", judge_verdict="deepeyes")
    assert arguments.judge_environ() == {"JUDGE_BASE_URL": "http://h:1/v1", "JUDGE_VERDICT": "deepeyes"}


def test_rl_sets_the_recipes_judge_and_checks_it_before_loading_anything(monkeypatch):
    """`rl.py` exports the recipe's `judge_*` keys as JUDGE_* (what the rewards read) and refuses, before any data or
    weight loads, a judge whose settings do not hold."""
    for name in JUDGE_ENV:
        monkeypatch.setenv(name, "")  # recorded, so that the values rl.py sets are undone after the test
    argv = ["--config", "recipes/tiny/rl/config_judge.yaml", "--reward_funcs", "deepeyes",
            "--judge_base_url", "http://judge.test:9/v1", "--judge_verdict", "deepeyes"]  # fmt: skip
    parsed = parse_args_and_record(RL_TYPES, argv)

    def load_split(*args):
        raise AssertionError("loaded data before checking the judge")

    monkeypatch.setattr(rl, "load_split", load_split)
    with pytest.raises(ValueError, match="JUDGE_VERDICT=deepeyes .*set JUDGE_PROMPT"):
        rl.build_trainer(*parsed)
    assert (os.environ["JUDGE_BASE_URL"], os.environ["JUDGE_VERDICT"]) == ("http://judge.test:9/v1", "deepeyes")
