"""What the agent is told, one definition shared by SFT, RL and evaluation: the system prompt of a run's box
convention and tools (`system_prompt`: the task, each enabled tool's sentences, how to answer) and the user turn
(`build_prompt`; the image is attached by TRL, and the tools' JSON schemas are rendered by the chat template from
their signatures, as TRL does during RL). Datasets store the `pixels` prompt of the default tools: the box convention
and the tools are the run's, not the data's, and `in_box_convention` says the run's in the system turn where SFT, RL
and evaluation read the prompt. How a reply is read: `data.task` (which re-exports these)."""

from __future__ import annotations

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

# What a run with its tools withheld (`evaluate.py --no_tools`) says instead (`without_tools`).
NO_TOOLS_SENTENCE = "No tool is available in this conversation: answer from the image as you see it."
NO_TOOLS_USER_SUFFIX = "Think first, then answer. Format strictly as: <think>...</think> <answer>...</answer>"

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


def without_tools(prompt: Sequence[dict]) -> list[dict]:
    """`prompt` with the tools withheld (`evaluate.py --no_tools`, issue 64): a system turn `system_prompt` wrote says
    that no tool is available in place of the tools' sentences, and a user turn ending in the tool-use format
    instruction (`USER_SUFFIX`) asks for the answer alone; a dataset author's own turns are returned as they are."""
    withheld = []
    for message in prompt:
        content, role = message.get("content"), message.get("role")
        if role == "system" and isinstance(content, str) and is_system_prompt(content):
            message = {**message, "content": f"{PROMPT_HEAD} {NO_TOOLS_SENTENCE} {PROMPT_TAIL}"}
        elif role == "user" and isinstance(content, str) and content.endswith(USER_SUFFIX):
            message = {**message, "content": content[: -len(USER_SUFFIX)] + NO_TOOLS_USER_SUFFIX}
        withheld.append(message)
    return withheld
