"""The task the agent is trained and evaluated on, one definition shared by SFT, RL and evaluation: its prompt
(`build_prompt`; the image is attached by TRL, and the tool's JSON schema is rendered by the chat template from the
tool's signature, as TRL does during RL), and how a completion's answer and format are read (the rewards built on
them: `rewards/outcome.py`). Datasets store the `pixels` prompt: the box convention is the model's, not the data's,
and `in_box_convention` says the run's in the system turn where SFT, RL and evaluation read the prompt.
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

from tools.registry import DEFAULT_TOOLS, TOOLS, get_tools
from tools.zoom_in import BOX_WORDS

PROMPT_HEAD = (
    "You are a visual search agent. The image you see is downscaled, so small details may be unreadable.\n"
    "Reason inside <think>...</think>."
)
PROMPT_TAIL = (
    "When you are sure, give the final answer inside <answer>...</answer>: the option letter for multiple choice, "
    "otherwise a short phrase."
)


def system_prompt(box_convention: str = "pixels", tools: Sequence[str] = DEFAULT_TOOLS) -> str:
    """The system prompt of a run: the task, each enabled tool's sentences (`Tool.prompt`, in the recipe's order of
    `tools`), then how to answer."""
    return " ".join([PROMPT_HEAD, *(tool.prompt(box_convention) for tool in get_tools(tools)), PROMPT_TAIL])


SYSTEM_PROMPTS = {convention: system_prompt(convention) for convention in BOX_WORDS}  # the default tools'
SYSTEM_PROMPT = SYSTEM_PROMPTS["pixels"]  # what datasets store (`build_prompt`), Qwen2.5-VL's convention

USER_SUFFIX = (
    "Think first, call image_zoom_in_tool if needed, then answer. Format strictly as: "
    "<think>...</think> <tool_call>...</tool_call> (if tools needed) <answer>...</answer>"
)

MAX_ANSWER_CHARS = 1000  # answers this long or longer score 0, against answer-spraying (DeepEyes: `>= 1000`)
OPTION_LETTERS = "ABCDEFGH"


def format_question(question: str, options: Sequence[str] = ()) -> str:
    """The user turn's text: the question, its lettered options (if any) and the format instruction."""
    lines = [question.strip()]
    if options:
        lines.append("Options:")
        lines += [f"{OPTION_LETTERS[i]}. {opt}" for i, opt in enumerate(options)]
    lines.append(USER_SUFFIX)
    return "\n".join(lines)


def build_prompt(
    question: str, options: Sequence[str] = (), box_convention: str = "pixels", tools: Sequence[str] = DEFAULT_TOOLS
) -> list[dict]:
    """The conversational `prompt` column: system prompt (of `box_convention` and `tools`), then the user question
    (the image is added by TRL)."""
    return [
        {"role": "system", "content": system_prompt(box_convention, tools)},
        {"role": "user", "content": format_question(question, options)},
    ]


def is_system_prompt(text: str, tools: Sequence[str] = DEFAULT_TOOLS) -> bool:
    """Whether `text` is a system prompt `system_prompt` writes, of any box convention and any registered tools (or
    `tools`): the task, tools' sentences, how to answer; a dataset author's own system turn is not."""
    head, tail = f"{PROMPT_HEAD} ", f" {PROMPT_TAIL}"
    if not (text.startswith(head) and text.endswith(tail)) or len(text) < len(head) + len(tail):
        return False
    sentences = {t.prompt(c) for t in [*TOOLS.values(), *get_tools(tools)] for c in SYSTEM_PROMPTS}
    middle = text[len(head) : len(text) - len(tail)]
    while middle:
        sentence = next((s for s in sentences if middle == s or middle.startswith(f"{s} ")), None)
        if sentence is None:
            return False
        middle = middle[len(sentence) + 1 :]
    return True


def in_box_convention(prompt: Sequence[dict], box_convention: str, tools: Sequence[str] = DEFAULT_TOOLS) -> list[dict]:
    """`prompt` (a conversational prompt) with its system turn saying `box_convention`'s frame and the run's `tools`
    (`system_prompt`), when that turn is one `system_prompt` wrote (`is_system_prompt`: every prompt `build_prompt`
    made, whatever its convention and tools); a prompt with a system turn of its own is the dataset author's, and is
    returned as it is."""
    if box_convention not in SYSTEM_PROMPTS:
        raise ValueError(f"box_convention must be one of {tuple(SYSTEM_PROMPTS)}; got {box_convention!r}")
    wanted = system_prompt(box_convention, tools)
    return [
        {**message, "content": wanted}
        if message.get("role") == "system"
        and isinstance(message.get("content"), str)
        and is_system_prompt(message["content"], tools)
        else message
        for message in prompt
    ]


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
