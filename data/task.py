"""The task the agent is trained and evaluated on, one definition shared by SFT, RL and evaluation: how a
completion's answer and format are read (the rewards built on them: `rewards/outcome.py`), and, re-exported from
`data.prompt`, what the agent is told (`build_prompt`, `system_prompt`, `in_box_convention`).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from data.prompt import OPTION_LETTERS
from data.prompt import SYSTEM_PROMPT as SYSTEM_PROMPT  # re-exported
from data.prompt import SYSTEM_PROMPTS as SYSTEM_PROMPTS  # re-exported
from data.prompt import USER_SUFFIX as USER_SUFFIX  # re-exported
from data.prompt import build_prompt as build_prompt  # re-exported
from data.prompt import format_question as format_question  # re-exported
from data.prompt import in_box_convention as in_box_convention  # re-exported
from data.prompt import system_prompt as system_prompt  # re-exported

MAX_ANSWER_CHARS = 1000  # answers this long or longer score 0, against answer-spraying (DeepEyes: `>= 1000`)


# --------------------------------------------------------------------------------------------------- answer parsing
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
_BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")
_THINK_RE = re.compile(r"^\s*<think>(?:(?!<think>).)*?</think>", re.DOTALL)


def message_text(message: dict | str) -> str:
    """Text of a chat message whose content is a string or a list of typed parts."""
    if isinstance(message, str):
        return message
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text") or "" for part in content if isinstance(part, dict))


def final_text(completion: list[dict] | str) -> str:
    """Text of the last assistant turn of a (multi-turn) completion."""
    if isinstance(completion, str):
        return completion
    for message in reversed(completion):
        if message.get("role") == "assistant":
            return message_text(message)
    return ""


def tag_contents(text: str, open_tag: str, close_tag: str) -> list[str]:
    """The text inside each `open_tag`...`close_tag` of `text`, as `re.findall` finds them with the pattern
    `re.escape(open_tag) + "(.*?)" + re.escape(close_tag)` and `re.DOTALL` (the repo's tag regexes before issue 59),
    in time linear in `text`: that regex scanned to the end for every opening tag left open (quadratic on a flood of
    them, minutes at 40,000), where the first open tag without a close ends the search, as no later one has one."""
    found, position = [], 0
    while (start := text.find(open_tag, position)) != -1:
        end = text.find(close_tag, start + len(open_tag))
        if end == -1:
            break
        found.append(text[start + len(open_tag) : end])
        position = end + len(close_tag)
    return found


def extract_answer(text: str) -> str | None:
    """The final answer in `text`: the last `<answer>...</answer>`, else the last `\\boxed{...}`, else None.

    The repo's one answer rule (rewards, judge, evaluation and the SFT converters). The *last* block, because a
    completion that revises itself ends on the answer it settles on, and because the upstream rewards read it so
    (DeepEyes' `verl/utils/reward_score/vl_agent.py` takes `predict_str.split("<answer>")[-1]`).
    """
    found = tag_contents(text, ANSWER_OPEN, ANSWER_CLOSE)
    if found:
        return found[-1].strip()
    boxed = _BOXED_RE.findall(text)
    if boxed:
        return boxed[-1].strip()
    return None


def normalize(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace (SQuAD-style answer normalisation)."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def parse_choice(prediction: str, options: Sequence[str]) -> int | None:
    """Index of the option that `prediction` names, by letter ("B", "(B)", "B. red") or by option text; else None."""
    if not options:
        return None
    pred = prediction.strip()
    letters = OPTION_LETTERS[: len(options)]
    match = re.fullmatch(r"\(?([A-Ha-h])\)?(?:[.:)]\s*(.*))?", pred, re.DOTALL)
    if match and match.group(1).upper() in letters:
        return letters.index(match.group(1).upper())
    norm = normalize(pred)
    hits = [i for i, opt in enumerate(options) if normalize(opt) == norm]
    return hits[0] if len(hits) == 1 else None


def is_correct(prediction: str | None, answer: str, options: Sequence[str] = ()) -> bool:
    """Whether `prediction` matches `answer`.

    Multiple choice (`options` given, `answer` an option letter): the prediction must name that option, by letter or
    by its text. Open answers: normalised string equality. Predictions of `MAX_ANSWER_CHARS` characters or more are
    wrong, as DeepEyes' reward (`vl_agent.py`: `len(answer_text) >= 1000`) and `rewards.judge` count them.
    """
    if prediction is None or len(prediction) >= MAX_ANSWER_CHARS:
        return False
    if options:
        choice = parse_choice(prediction, options)
        gold = parse_choice(answer, options)
        return choice is not None and choice == gold
    return normalize(prediction) == normalize(answer)


def is_answer_block(text: str) -> bool:
    """Whether `text` is one `<answer>...</answer>` from end to end, as the lazy pattern's `fullmatch` had it: the tags
    at its two ends (they cannot overlap), anything between."""
    return text.startswith(ANSWER_OPEN) and text.endswith(ANSWER_CLOSE)


def is_well_formed_turn(message: dict, is_last: bool) -> bool:
    """An assistant turn in the task's format: `<think>...</think>`, then a tool call (an intermediate turn) or one
    `<answer>...</answer>` (the last turn)."""
    text = message_text(message)
    reasoning = message.get("reasoning_content")
    if reasoning is not None:  # TRL's response parser already moved `<think>...</think>` out of the content
        if not reasoning.strip() or "<think>" in text or "</think>" in text:
            return False
        rest = text.strip()
    else:
        think = _THINK_RE.match(text)
        if think is None or text.count("<think>") != 1 or text.count("</think>") != 1:
            return False
        rest = text[think.end() :].strip()
    has_call = bool(message.get("tool_calls"))
    if is_last:  # the final turn answers and calls nothing
        # one block: `is_answer_block` alone would also take "<answer>A</answer><answer>C</answer>"
        one = rest.count(ANSWER_OPEN) == 1 and rest.count(ANSWER_CLOSE) == 1
        return not has_call and one and is_answer_block(rest)
    return has_call and rest == ""  # an intermediate turn thinks, then calls (the call is parsed out of content)
