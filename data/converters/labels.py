"""The label of every converted call: the dataset's own where it has one (CoF), else a short noun phrase derived from
the thought before the call, else from the question (the rule and its examples: docs/data.md, "Labels"); every label
held to the tool's limits."""

from __future__ import annotations

import re
from typing import Any

from data.converters.common import SkipRow
from tools import ToolConfig, ToolError, validate_label

LABEL_SOURCES = ("dataset", "thought", "question")
MAX_DERIVED_WORDS = 6
_ARTICLE = r"(?:the|a|an|this|that|these|those)"
_LOOK = (
    r"(?:zoom(?:ing)?\s+in(?:to)?(?:\s+on)?|zoom(?:ing)?\s+on|look(?:ing)?\s+(?:more\s+|closely\s+|more\s+closely\s+)?"
    r"at|focus(?:ing)?\s+on|examin(?:e|ing)|inspect(?:ing)?|check(?:ing)?|crop(?:ping)?|locat(?:e|ing)|find(?:ing)?|"
    r"identify(?:ing)?|read(?:ing)?)"
)
# A phrase is read to its first punctuation, but at most `MAX_PHRASE_CHARS`: the question's rule tries a phrase at every
# article, so "the the the ..." read each to its end (quadratic: 0.85 s at 4,000 words, ~85 s at 40,000, issue 59).
# The cap changes no label the tool can take: `_noun_phrase` keeps at most `MAX_DERIVED_WORDS` words before a stop word,
# and a label is at most `ToolConfig.max_label_chars` (80) long, far inside 256 characters.
MAX_PHRASE_CHARS = 256
_PHRASE = rf"({_ARTICLE}\s+[^.,;:!?()\[\]{{}}\n\"]{{1,{MAX_PHRASE_CHARS}}})"
_FROM_THOUGHT = re.compile(rf"\b{_LOOK}\s+{_PHRASE}", re.IGNORECASE)
_FROM_QUESTION = re.compile(rf"\b(?={_PHRASE})", re.IGNORECASE)  # a lookahead: phrases inside phrases are tried too
_DO_QUESTION = re.compile(r"^\s*(?:what|which|where|who|how)\s+(?:does|do|did)\b", re.IGNORECASE)
_HOW_MANY = re.compile(r"\bhow\s+many\s+([^.,;:!?()\[\]{}\n\"]+)", re.IGNORECASE)  # counted things: "the apples"
# A noun phrase ends before one of these: what follows places or qualifies it, and the label names the thing.
_STOP_WORDS = frozenset(
    "to for in on at of so and or but which that who where when because with from near by is are was were be "
    "if as than then it its there here into onto under above below behind between closely carefully again more "
    "further now first say says show shows read reads look looks mean means contain contains have has do does did "
    "can could will would should".split()
)
# Phrases that name the picture, not a thing in it...
_GENERIC_HEADS = frozenset(
    "image picture photo photograph figure region area view crop question answer options option following "
    "correct details detail part top bottom left right center centre middle side corner colour color shape size "
    "number name text word words brand type kind time price title letter material position".split()
)  # ...or an attribute asked about ("the colour of the umbrella": the umbrella is what to look at)


def _noun_phrase(text: str) -> str | None:
    words = text.split()
    kept = [words[0].lower()]
    for word in words[1:]:
        if word.lower() in _STOP_WORDS:
            break
        kept.append(word)
    if kept[0] in ("this", "that", "these", "those"):
        kept[0] = "the"
    if not 2 <= len(kept) <= MAX_DERIVED_WORDS or {kept[1].lower(), kept[-1].lower()} & _GENERIC_HEADS:
        return None
    return " ".join(kept)


def derive_label(thought: str, question: str) -> tuple[str, str] | None:
    """The label of a call without one, and its `label_source`, or None: (1) in the thought, the noun phrase after a
    looking verb; (2) in the question, what "how many" counts, else its first noun phrase. A noun phrase starts with
    an article or demonstrative and ends before a word of `_STOP_WORDS`; it has 2 to `MAX_DERIVED_WORDS` words and
    names neither the picture itself nor an attribute. A heuristic: check a conversion's preview."""
    rules = (("thought", thought, _FROM_THOUGHT, ""), ("question", question, _HOW_MANY, "the "),
             ("question", question, _FROM_QUESTION, ""))  # fmt: skip
    # Where the question's closing spaces and question marks start: a phrase ending there ends the question (found
    # once, not by copying the rest of the question for each of its phrases).
    question_end = len((question or "").rstrip(" ?"))
    for source, text, pattern, article in rules:
        for match in pattern.finditer(text or ""):
            candidate = article + match.group(1)
            if source == "question" and _DO_QUESTION.match(text) and match.end(1) >= question_end:
                candidate = candidate.rsplit(maxsplit=1)[0]  # "What does the man hold?": the last word is the verb
            phrase = _noun_phrase(candidate)
            if phrase:
                return phrase, source
    return None


def call_label(label: Any, thought: str, question: str, tool: ToolConfig) -> tuple[str, str]:
    """The call's label and `label_source`: the dataset's `label` when it has one (within the tool's limits, else
    `SkipRow("label_too_long")`), else `derive_label`'s (else, or over the limits, `SkipRow("no_label")`). The limits
    are `tool`'s, checked by the tool's own `validate_label`, so no label the tool would reject on replay is kept."""
    if isinstance(label, str) and label.strip():
        try:
            return validate_label(label, tool.max_label_words, tool.max_label_chars), "dataset"
        except ToolError:
            raise SkipRow("label_too_long", label) from None
    derived = derive_label(thought, question)
    if derived is not None:
        try:
            return validate_label(derived[0], tool.max_label_words, tool.max_label_chars), derived[1]
        except ToolError:
            pass
    raise SkipRow("no_label", f"thought {thought[:60]!r}, question {question[:60]!r}")
