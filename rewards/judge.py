"""`judge` reward: R_out from an LLM judge behind an OpenAI-compatible chat endpoint, for open-ended answers.

Standard library only: one request per row, concurrent within a batch; a row the judge cannot score is None (advantage
0). Settings are environment variables (`JUDGE_ENV`), which a recipe sets with `JudgeArguments`' keys; the verdict
modes, ours (`correct_incorrect`) and DeepEyes' (`deepeyes` for its training reward, `deepeyes_eval` for its
evaluation; their prompt is read from a DeepEyes source file given as `JUDGE_PROMPT`, not copied here), and which to
use: docs/data.md.
"""

from __future__ import annotations

import ast
import http.client
import json
import logging
import math
import os
import re
import string
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data.task import MAX_ANSWER_CHARS, USER_SUFFIX, extract_answer, final_text, message_text
from utils.registry import reads_columns

logger = logging.getLogger(__name__)


# The judge's settings, environment variables read at each call (a launcher points a run at its endpoint without a
# recipe key), and their defaults; an empty value counts as unset.
JUDGE_ENV: dict[str, str] = {
    "JUDGE_BASE_URL": "http://localhost:8000/v1",  # OpenAI-compatible API root; POST {base}/chat/completions
    "JUDGE_MODEL": "judge",  # the served model name (`vllm serve <model> --served-model-name judge`)
    "JUDGE_API_KEY": "",  # sent as `Authorization: Bearer <key>` when set
    "JUDGE_TIMEOUT": "30",  # seconds per request; a request that takes longer leaves its row unscored
    "JUDGE_CONCURRENCY": "8",  # requests in flight at once for one batch
    "JUDGE_PROMPT": "",  # a prompt template file, or a DeepEyes .py file (`deepeyes_template`); unset: JUDGE_TEMPLATE
    "JUDGE_VERDICT": "correct_incorrect",  # how the reply is read, and the defaults below: a key of VERDICT_MODES
    "JUDGE_TEMPERATURE": "",  # sampling temperature; unset: the verdict mode's
    "JUDGE_MAX_TOKENS": "",  # the reply's token limit, or "none" (the request names none); unset: the mode's
    "JUDGE_SYSTEM": "",  # a system message sent before the prompt; unset: the mode's (none for ours)
    "JUDGE_UNREADABLE": "",  # a reply that is no verdict: "none" (the row is unscored) or "zero"; unset: the mode's
}
JUDGE_PLACEHOLDERS = ("{question}", "{answer}", "{prediction}")
JUDGE_MAX_TOKENS = 16  # the reply is one word; a little room for punctuation or a trailing newline
JUDGE_TEMPLATE = """You are grading an answer to a question about an image. Decide whether the model's answer means \
the same as the ground-truth answer; ignore differences of wording, case, punctuation and formatting.

Question: {question}
Ground-truth answer: {answer}
Model's answer: {prediction}

Reply with exactly one word: CORRECT or INCORRECT."""


@dataclass(frozen=True)
class VerdictMode:
    """How a verdict mode asks and reads: its reply parser and the defaults of its request settings."""

    parse: Callable[[str], float | None]
    temperature: float
    max_tokens: int | None  # None: the request names no limit
    system: str | None
    unreadable_zero: bool  # a reply that is no verdict scores 0 (else the row is unscored)
    needs_prompt: bool  # its prompt is upstream's, given as JUDGE_PROMPT


@dataclass(frozen=True)
class JudgeSettings:
    """The judge endpoint and how to ask it; see `JUDGE_ENV` and `judge_settings`."""

    base_url: str
    model: str
    api_key: str | None
    timeout: float
    concurrency: int
    template: str
    verdict: str = "correct_incorrect"
    temperature: float = 0.0
    max_tokens: int | None = JUDGE_MAX_TOKENS
    system: str | None = None
    unreadable_zero: bool = False


@dataclass(kw_only=True)
class JudgeArguments:
    """The LLM judge as recipe keys (`ScriptArguments` for RL rewards, `EvalArguments` for evaluation): each key set
    sets its `JUDGE_*` variable (`judge_environ`); a key left unset leaves the environment's value, or the default."""

    judge_base_url: str | None = field(
        default=None,
        metadata={"help": "LLM judge: its OpenAI-compatible API root (POST {base}/chat/completions); JUDGE_BASE_URL."},
    )
    judge_model: str | None = field(default=None, metadata={"help": "LLM judge: the served model name; JUDGE_MODEL."})
    judge_prompt: str | None = field(
        default=None,
        metadata={
            "help": "LLM judge: a prompt template file ({question}, {answer}, {prediction}), or a DeepEyes source file "
            "whose get_prompt is read (verl/utils/reward_score/vl_agent.py to train, eval/judge_result.py to "
            "evaluate); JUDGE_PROMPT."
        },
    )
    judge_verdict: str | None = field(
        default=None,
        metadata={"help": "LLM judge: how it is asked and its reply read, a key of rewards.judge.VERDICT_MODES; "
                  "JUDGE_VERDICT."},
    )  # fmt: skip

    def judge_environ(self) -> dict[str, str]:
        """The `JUDGE_*` variables the keys set."""
        names = {"judge_base_url": "JUDGE_BASE_URL", "judge_model": "JUDGE_MODEL", "judge_prompt": "JUDGE_PROMPT",
                 "judge_verdict": "JUDGE_VERDICT"}  # fmt: skip
        return {env: str(getattr(self, key)) for key, env in names.items() if getattr(self, key) is not None}


def deepeyes_template(path: Path) -> str:
    """The judge prompt of a DeepEyes source file (github.com/Visual-Agent/DeepEyes: `verl/utils/reward_score/
    vl_agent.py` for its training reward, `eval/judge_result.py` or `eval/judge_result_hrbench.py` for its
    evaluation), as a template: its `get_prompt(predict_str, ground_truth, question)` called with the placeholders, so
    the instructions, in-context examples and test block are theirs, read from the user's clone and never copied into
    this repo. Only the three prompt functions run (without builtins), not the module, which opens a client at import.
    A file without them fails with a ValueError naming it."""
    wanted = ("get_chat_template", "get_gpt4_score_ICE", "get_prompt")
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as err:
        raise ValueError(f"JUDGE_PROMPT: {str(path)!r} is not Python: {err}") from err
    functions = [node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name in wanted]
    missing = sorted(set(wanted) - {node.name for node in functions})
    if missing:
        raise ValueError(f"JUDGE_PROMPT: {str(path)!r} defines no {missing}: not a DeepEyes judge file")
    namespace: dict[str, Any] = {"__builtins__": {}}
    try:
        exec(compile(ast.Module(body=functions, type_ignores=[]), str(path), "exec"), namespace)
        template = namespace["get_prompt"]("{prediction}", "{answer}", "{question}")
    except Exception as err:
        raise ValueError(f"JUDGE_PROMPT: the prompt functions of {str(path)!r} failed: {err!r}") from err
    if not isinstance(template, str):
        raise ValueError(f"JUDGE_PROMPT: get_prompt of {str(path)!r} returned {type(template).__name__}, not text")
    return template


def _read(env: dict[str, str], name: str, wants: str, convert: Callable[[str], Any], valid: Callable[[Any], bool]):
    """`convert(env[name])` if it converts and is `valid`, else a ValueError naming the variable and what it wants."""
    try:
        value = convert(env[name])
    except ValueError:
        value = _INVALID
    if value is _INVALID or not valid(value):
        raise ValueError(f"{name} must be {wants}, got {env[name]!r}")
    return value


_INVALID = object()


def _token_limit(text: str) -> Any:
    """`JUDGE_MAX_TOKENS`: "none" (the request names no limit) or a whole number of tokens."""
    return None if text.lower() == "none" else int(text) if text.isdigit() else _INVALID


def judge_settings(environ: Mapping[str, str]) -> JudgeSettings:
    """The `JudgeSettings` that `environ` (e.g. `os.environ`) gives, defaults from `JUDGE_ENV` and the verdict mode. A
    bad value fails with a `ValueError` naming its variable (a base URL that is not http(s), a `JUDGE_PROMPT` file that
    does not exist or lacks `{answer}` or `{prediction}`, a number out of range...)."""
    env = {name: environ.get(name) or default for name, default in JUDGE_ENV.items()}
    base_url = env["JUDGE_BASE_URL"].rstrip("/")
    if not base_url.startswith(("http://", "https://")):
        raise ValueError(f"JUDGE_BASE_URL must be an http(s) URL, got {base_url!r}")
    positive = "a positive number of seconds"
    timeout = _read(env, "JUDGE_TIMEOUT", positive, float, lambda t: math.isfinite(t) and t > 0)
    concurrency = _read(env, "JUDGE_CONCURRENCY", "an integer of at least 1", int, lambda n: n >= 1)
    template = JUDGE_TEMPLATE
    if env["JUDGE_PROMPT"]:
        path = Path(env["JUDGE_PROMPT"])
        if not path.is_file():
            raise ValueError(f"JUDGE_PROMPT: no prompt template file at {str(path)!r}")
        template = deepeyes_template(path) if path.suffix == ".py" else path.read_text(encoding="utf-8")
        # Without the ground truth or the prediction the judge would grade nothing; the question is optional.
        missing = [p for p in JUDGE_PLACEHOLDERS[1:] if p not in template]
        if missing:
            raise ValueError(f"JUDGE_PROMPT: the template {str(path)!r} lacks the placeholder(s) {missing}")
    if env["JUDGE_VERDICT"] not in VERDICT_MODES:
        raise ValueError(f"JUDGE_VERDICT must be one of {sorted(VERDICT_MODES)}, got {env['JUDGE_VERDICT']!r}")
    mode = VERDICT_MODES[env["JUDGE_VERDICT"]]
    if mode.needs_prompt and not env["JUDGE_PROMPT"]:
        source = (
            "eval/judge_result.py"
            if env["JUDGE_VERDICT"] == "deepeyes_eval"
            else "verl/utils/reward_score/vl_agent.py"
        )
        raise ValueError(
            f"JUDGE_VERDICT={env['JUDGE_VERDICT']} reads the reply to DeepEyes' own prompt: set JUDGE_PROMPT (or the "
            f"recipe's judge_prompt) to {source} of a clone of github.com/Visual-Agent/DeepEyes, whose get_prompt is "
            "read, or to a template file of it with {question}, {answer} and {prediction}"
        )
    temperature, max_tokens, unreadable_zero = mode.temperature, mode.max_tokens, mode.unreadable_zero
    if env["JUDGE_TEMPERATURE"]:
        temperature = _read(env, "JUDGE_TEMPERATURE", "a number >= 0", float, lambda t: math.isfinite(t) and t >= 0)
    if env["JUDGE_MAX_TOKENS"]:
        wants = "a positive integer or 'none'"
        max_tokens = _read(env, "JUDGE_MAX_TOKENS", wants, _token_limit, lambda n: n is None or n > 0)
    if env["JUDGE_UNREADABLE"]:
        unreadable_zero = _read(env, "JUDGE_UNREADABLE", "'none' or 'zero'", {"none": False, "zero": True}.get,
                                lambda z: z is not None)  # fmt: skip
    system = env["JUDGE_SYSTEM"] or mode.system
    api_key = env["JUDGE_API_KEY"] or None
    return JudgeSettings(base_url, env["JUDGE_MODEL"], api_key, timeout, concurrency, template, env["JUDGE_VERDICT"],
                         temperature, max_tokens, system, unreadable_zero)  # fmt: skip


def parse_verdict(text: str) -> float | None:
    """The judge's reply as a score: 1.0 for CORRECT, 0.0 for INCORRECT (any case, surrounding whitespace and
    punctuation allowed, e.g. "**Correct.**"), None for anything else: empty, both words, a sentence, garbage."""
    word = text.strip(string.whitespace + string.punctuation).lower()
    return {"correct": 1.0, "incorrect": 0.0}.get(word)


def parse_deepeyes_verdict(text: str) -> float | None:
    """DeepEyes' reading of its judge's reply (github.com/Visual-Agent/DeepEyes, `verl/utils/reward_score/vl_agent.py`,
    `compute_score`; `eval/judge_result.py` reads the same): after the last "Judgement:", 1.0 if a "1" is in the rest,
    else 0.0 if a "0" is; without "Judgement:", the reply must be exactly "1" or "0". None for anything else (DeepEyes
    scores that 0: `JUDGE_UNREADABLE=zero`, the `deepeyes` mode's default)."""
    reply = text.strip()
    if "Judgement:" in reply:
        rest = reply.split("Judgement:")[-1].strip()
        return 1.0 if "1" in rest else 0.0 if "0" in rest else None
    return {"1": 1.0, "0": 0.0}.get(reply)


# The verdict modes, by `JUDGE_VERDICT`: ours; DeepEyes' training judge (`vl_agent.py`, `compute_score`: its system
# message, temperature 0.3, no max_tokens, an unreadable reply scored 0); its evaluation judge (`eval/judge_result.py`:
# the same at temperature 0). DeepEyes' prompts are given as JUDGE_PROMPT.
VERDICT_MODES = {
    "correct_incorrect": VerdictMode(parse_verdict, 0.0, JUDGE_MAX_TOKENS, None, False, False),
    "deepeyes": VerdictMode(parse_deepeyes_verdict, 0.3, None, "You are a helpful assistant.", True, True),
    "deepeyes_eval": VerdictMode(parse_deepeyes_verdict, 0.0, None, "You are a helpful assistant.", True, True),
}


_PLACEHOLDER_RE = re.compile(r"\{(question|answer|prediction)\}")


def fill_judge_prompt(template: str, question: str, answer: str, prediction: str) -> str:
    """`template` with its placeholders filled in one pass: other braces in the template stay as written (no
    `str.format`), and a placeholder inside a filled value (a prediction that writes "{answer}") is not expanded."""
    values = {"question": question, "answer": answer, "prediction": prediction}
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], template)


def prompt_question(prompt: list[dict] | str | None) -> str:
    """The question a `prompt` row asks: its last user turn's text, less the format instruction (`USER_SUFFIX`), which
    is for the policy, not the judge; "" without a prompt."""
    if prompt is None or isinstance(prompt, str):
        return prompt or ""
    users = [m for m in prompt if m.get("role") == "user"]
    return message_text(users[-1]).removesuffix(USER_SUFFIX).strip() if users else ""


def ask_judge(settings: JudgeSettings, prompt: str) -> tuple[float | None, str | None]:
    """One chat request to the judge: (`parse_verdict` of its reply, None), or (None, why) when the request timed out,
    failed to connect, got an HTTP error or a malformed body, or the reply is no verdict. Never raises for these."""
    messages = [{"role": "system", "content": settings.system}] if settings.system else []
    messages.append({"role": "user", "content": prompt})
    body = {"model": settings.model, "messages": messages, "temperature": settings.temperature}
    if settings.max_tokens is not None:
        body["max_tokens"] = settings.max_tokens
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    request = urllib.request.Request(
        f"{settings.base_url}/chat/completions", data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout) as response:
            content = json.load(response)["choices"][0]["message"]["content"]
    # OSError covers URLError, HTTPError and timeouts; ValueError a body that is not JSON; the rest a JSON body
    # without choices[0].message.content.
    except (OSError, http.client.HTTPException, ValueError, KeyError, IndexError, TypeError) as error:
        return None, f"{type(error).__name__}: {error}"
    verdict = VERDICT_MODES[settings.verdict].parse(content) if isinstance(content, str) else None
    if verdict is None and settings.unreadable_zero:  # DeepEyes' rule: a reply that is no verdict scores 0
        return 0.0, None
    return verdict, None if verdict is not None else f"no verdict in the reply {content!r}"


@reads_columns("answer")
def judge_reward(completions: list, answer: list[str], prompts: list | None = None, **kwargs) -> list[float | None]:
    """R_out from an LLM judge (docs/data.md): 1.0 when the judge says the final `<answer>` (fallback `\\boxed{}`)
    matches the row's `answer`, else 0.0. The prompt template's `{question}` is the last user turn of TRL's `prompts`.

    A completion with no extractable answer, or one of `MAX_ANSWER_CHARS` characters or more (DeepEyes' rule against
    answer-spraying), scores 0.0 without a request. A row whose request times out, fails or gets no verdict is None
    (unscorable: advantage 0), with one warning a batch giving the count. Scores are in row order.
    """
    settings = judge_settings(os.environ)
    prompts = prompts if prompts is not None else [None] * len(completions)
    predictions = [extract_answer(final_text(c)) for c in completions]
    asked = [i for i, p in enumerate(predictions) if p is not None and len(p) < MAX_ANSWER_CHARS]
    filled = [
        fill_judge_prompt(settings.template, prompt_question(prompts[i]), answer[i], predictions[i]) for i in asked
    ]
    scores: list[float | None] = [0.0] * len(completions)
    if not asked:
        return scores
    with ThreadPoolExecutor(max_workers=min(settings.concurrency, len(asked))) as pool:
        replies = list(pool.map(lambda p: ask_judge(settings, p), filled))
    for i, (verdict, _) in zip(asked, replies):
        scores[i] = verdict
    failures = [why for _, why in replies if why is not None]
    if failures:
        why = f"{len(failures)} of {len(asked)} requests to {settings.base_url} got no verdict (first: {failures[0]})"
        logger.warning("judge: %s; those rows are unscored", why)
    return scores
