"""A dataset's question as this repo asks it: the bare question and its options, the dataset's own option list and
format and tool instructions cut, so a prompt is ours alone (`data.task.build_prompt`) and the SFT converters and the
RL readers of one dataset ask the same words."""

from __future__ import annotations

import re
from collections.abc import Sequence

from data.task import OPTION_LETTERS

# "(A) red" option lines, as V* embeds them in its question text and MME-RealWorld writes its answer choices.
_OPTION = re.compile(r"^\s*\(([A-H])\)\s*(.*?)\s*$")
# "A. red" / "A: red" / "A) red", the other way the zoom-trajectory sets write options (Thyme, CoF's "A." questions)
_LETTER_OPTION = re.compile(r"^\s*([A-H])[.:)]\s+(.*?)\s*$")
_OPTIONS_HEADER = re.compile(r"^\s*(?:options|choices)\s*:?\s*$", re.IGNORECASE)
_QUESTION_PREFIX = re.compile(r"^\s*Question:\s*", re.IGNORECASE)

# CoF's prepare_zoomin_data.py builds the user turn as "<image> Question: {question}" + an answer instruction + its
# tool instruction (USER_PROMPT); its SFT set's user turns are written the same way.
COF_INSTRUCTIONS = ("Answer the question using", "Answer with the option's letter", "Think in the mind first")


def _option_lines(lines: list[str], pattern: re.Pattern) -> tuple[int | None, list[str]]:
    """Where the option lines "A", "B", ... (in letter order) start in `lines`, and their texts."""
    first = next((i for i, line in enumerate(lines) if (m := pattern.match(line)) and m.group(1) == "A"), None)
    options: list[str] = []
    for letter, line in zip(OPTION_LETTERS, lines[first:] if first is not None else []):
        match = pattern.match(line)
        if match is None or match.group(1) != letter:
            break
        options.append(match.group(2))
    return first, options


def split_options(text: str) -> tuple[str, list[str]]:
    """A question that embeds "(A) ..." option lines split into the bare question and the option texts; whatever
    follows the options (V*'s "Answer with the option's letter ...") is dropped. Text without them comes back
    stripped, with no options."""
    lines = text.strip().splitlines()
    first, options = _option_lines(lines, _OPTION)
    if first is None:
        return text.strip(), []
    return "\n".join(lines[:first]).strip(), options


def option_text(choice: str) -> str:
    """An option without its letter: "(B) 457" -> "457"; text without a letter prefix is kept."""
    match = _OPTION.match(choice)
    return match.group(2) if match else choice.strip()


def dataset_question(
    text: str, instructions: Sequence[str] = (), cut_from: Sequence[str] = ()
) -> tuple[str, list[str]]:
    """The bare question and its options from a dataset's own user turn.

    `<image>` tags and a leading "Question:" are removed; the text from the first of `cut_from` on is dropped (a
    trailing format block, e.g. Thyme's "### User Image Path"), and so is every line that starts with one of
    `instructions`; then the options are split off: "(A) ..." lines (`split_options`), else "A. ..." lines (two or
    more, an "Options:" line before them dropped).
    """
    text = text.replace("<image>", "")
    cuts = [text.find(marker) for marker in cut_from if marker in text]
    text = _QUESTION_PREFIX.sub("", text[: min(cuts)] if cuts else text)
    lines = [line for line in text.splitlines() if not line.strip().startswith(tuple(instructions))]
    question, options = split_options("\n".join(lines))
    if options:
        return question, options
    lines = question.splitlines()
    first, letters = _option_lines(lines, _LETTER_OPTION)
    if len(letters) >= 2:
        head = lines[:first]
        if head and _OPTIONS_HEADER.match(head[-1]):
            head = head[:-1]
        return "\n".join(head).strip(), letters
    return question.strip(), []


def cof_question(text: str) -> tuple[str, list[str]]:
    """A CoF question (`extra_info.question`, or a user turn as CoF writes it) and its options."""
    return dataset_question(text, COF_INSTRUCTIONS)
