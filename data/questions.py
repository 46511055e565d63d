"""A dataset's question as this repo asks it: the bare question and its options, the dataset's own option list and
format and tool instructions cut, so a prompt is ours alone (`data.task.build_prompt`) and the SFT converters and the
RL readers of one dataset ask the same words."""

from __future__ import annotations

import re
from collections.abc import Sequence

from data.task import OPTION_LETTERS

# "(A) red" option lines, as V* embeds them in its question text and MME-RealWorld writes its answer choices; the
# heads of the patterns `^\s*\(([A-H])\)\s*(.*?)\s*$` and (below) `^\s*([A-H])[.:)]\s+(.*?)\s*$`, whose lazy text
# and trailing `\s*` took time quadratic in the spaces inside a line: `_option` reads the text.
_OPTION = re.compile(r"\s*\(([A-H])\)\s*")
# "A. red" / "A: red" / "A) red", the other way the zoom-trajectory sets write options (Thyme, CoF's "A." questions)
_LETTER_OPTION = re.compile(r"\s*([A-H])[.:)]\s+")
# Possessive: `\s*:?\s*$` split a run of spaces between its two `\s*` every way before it failed.
_OPTIONS_HEADER = re.compile(r"^\s*(?:options|choices)\s*+:?\s*+$", re.IGNORECASE)
_QUESTION_PREFIX = re.compile(r"^\s*Question:\s*", re.IGNORECASE)

# CoF's prepare_zoomin_data.py builds the user turn as "<image> Question: {question}" + an answer instruction + its
# tool instruction (USER_PROMPT); its SFT set's user turns are written the same way.
COF_INSTRUCTIONS = ("Answer the question using", "Answer with the option's letter", "Think in the mind first")


def _option(line: str, head: re.Pattern) -> tuple[str, str] | None:
    """`line`'s letter and text if it is an option line whose letter and spaces `head` matches, else None: the text
    is the rest without its trailing whitespace, on one line (the full patterns' `(.*?)\\s*$`, `.` not a newline)."""
    match = head.match(line)
    if match is None:
        return None
    text = line[match.end() :].rstrip()  # `str.isspace` and re's `\s` agree on every code point
    return None if "\n" in text else (match.group(1), text)


def _option_lines(lines: list[str], head: re.Pattern) -> tuple[int | None, list[str]]:
    """Where the option lines "A", "B", ... (in letter order) start in `lines`, and their texts."""
    first = next((i for i, line in enumerate(lines) if (o := _option(line, head)) and o[0] == "A"), None)
    options: list[str] = []
    for letter, line in zip(OPTION_LETTERS, lines[first:] if first is not None else []):
        option = _option(line, head)
        if option is None or option[0] != letter:
            break
        options.append(option[1])
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
    option = _option(choice, _OPTION)
    return option[1] if option else choice.strip()


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
