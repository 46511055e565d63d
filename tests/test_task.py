"""The prompt (its system turn in each box convention), answer parsing and the outcome/format rewards on hand-written
completions."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from data import prompts_in_box_convention
from data.synthetic import build_synthetic
from data.task import (
    SYSTEM_PROMPT,
    SYSTEM_PROMPTS,
    build_prompt,
    extract_answer,
    in_box_convention,
    is_answer_block,
    is_correct,
    parse_choice,
    tag_contents,
)
from rewards import format_reward, gated_outcome_reward, outcome_reward, tool_bonus_reward
from tools import PixelBudget, ToolConfig, ZoomInEnv

OPTIONS = ["red", "green", "blue", "yellow"]


def assistant(content, tool=False):
    message = {"role": "assistant", "content": content}
    if tool:
        message["tool_calls"] = [
            {"type": "function", "function": {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4]}}}
        ]
    return message


TOOL = {"role": "tool", "name": "image_zoom_in_tool", "content": [{"type": "text", "text": "crop"}]}


def test_prompt_has_system_then_user_with_lettered_options():
    system, user = build_prompt("What colour is the star?", OPTIONS)
    assert system == {"role": "system", "content": SYSTEM_PROMPT}
    assert "A. red\nB. green\nC. blue\nD. yellow" in user["content"]
    assert user["content"].startswith("What colour is the star?")


def test_the_system_prompt_says_the_frame_of_the_box_convention():
    assert SYSTEM_PROMPT == SYSTEM_PROMPTS["pixels"] and "in pixels of the image you see" in SYSTEM_PROMPT
    assert "on a 0-1000 grid over the image you see" in SYSTEM_PROMPTS["relative_1000"]
    assert "pixels" not in SYSTEM_PROMPTS["relative_1000"]
    prompt = build_prompt("What colour is the star?", OPTIONS)
    relative = in_box_convention(prompt, "relative_1000")
    assert relative == build_prompt("What colour is the star?", OPTIONS, box_convention="relative_1000")
    assert relative[1] is prompt[1] and in_box_convention(relative, "pixels") == prompt  # only the system turn
    own = [{"role": "system", "content": "My own instructions."}, prompt[1]]  # a dataset author's: left alone
    assert in_box_convention(own, "relative_1000") == own
    with pytest.raises(ValueError, match="box_convention"):
        in_box_convention(prompt, "normalized")


def test_a_datasets_prompts_are_rewritten_and_its_images_kept():
    rows = build_synthetic(2, seed=0, min_size=448, max_size=448)  # stored with the pixels prompt
    assert prompts_in_box_convention(rows, "pixels") is rows  # nothing to rewrite
    relative = prompts_in_box_convention(rows, "relative_1000")
    assert [r["prompt"][0]["content"] for r in relative] == [SYSTEM_PROMPTS["relative_1000"]] * 2
    assert [r["prompt"][1] for r in relative] == [r["prompt"][1] for r in rows]
    assert relative[0]["image"].tobytes() == rows[0]["image"].tobytes() and list(relative["id"]) == list(rows["id"])
    assert prompts_in_box_convention(None, "relative_1000") is None
    splits = prompts_in_box_convention({"a": rows}, "relative_1000")
    assert splits["a"][0]["prompt"] == relative[0]["prompt"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<think>x</think><answer> B </answer>", "B"),
        ("<answer>A</answer> then <answer>C</answer>", "C"),  # the last (tests/test_convert.py: conversion too)
        ("so the answer is \\boxed{blue}", "blue"),
        ("<answer>\\boxed{A}</answer>", "\\boxed{A}"),
        ("no answer here", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


# Issue 59, item 4: the answer and tag regexes before it, kept as the oracles of their linear-time replacements.
ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
BOXED_RE = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}")


def regex_extract_answer(text):
    """`extract_answer` before issue 59, line for line."""
    found = ANSWER_RE.findall(text)
    if found:
        return found[-1].strip()
    boxed = BOXED_RE.findall(text)
    return boxed[-1].strip() if boxed else None


# Tags whole, cut short, nested, doubled, of another kind, among text, newlines and spaces.
TAG_PAIRS = (("<answer>", "</answer>"), ("<think>", "</think>"), ("<tool_call>", "</tool_call>"), ("<code>", "</code>"),
             ("<grounding>", "</grounding>"), ("<a>", "</a>"), ("ab", "ba"), ("aa", "a"))  # fmt: skip
TAG_SOUP = ("<answer>", "</answer>", "<answer", "</answer", "answer>", "<ANSWER>", "<", "/", ">", "a", "b", "ab", "ba",
            "<a>", "</a>", "<think>", "</think>", "<tool_call>", "</tool_call>", "<code>", "</code>", "<grounding>",
            "</grounding>", "\\boxed{", "{", "}", "x", " ", "\n", "\u00e9")  # fmt: skip
soups = st.lists(st.sampled_from(TAG_SOUP), max_size=16).map("".join)


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(soups, st.sampled_from(TAG_PAIRS))
def test_tag_contents_is_what_the_lazy_tag_regex_finds(text, tags):
    """Tags closed, open, nested, overlapping themselves (`aa`...`a`), among any text: the same contents as
    `findall` of the DOTALL lazy pattern the converters and `extract_answer` used. Seen failing with the search for
    the next tag planted to start at the close's start instead of its end."""
    pattern = re.compile(re.escape(tags[0]) + "(.*?)" + re.escape(tags[1]), re.DOTALL)
    assert tag_contents(text, *tags) == pattern.findall(text)


ANSWER_SOUP = ("<answer>", "</answer>", "<answer", "answer>", "\\boxed{", "{", "}", "x", "y", " ", "\n", "<", ">")
answer_soups = st.lists(st.sampled_from(ANSWER_SOUP), max_size=16).map("".join)


@settings(max_examples=1000, derandomize=True, deadline=None)
@given(answer_soups)
def test_extract_answer_is_what_the_answer_regex_finds(text):
    """`extract_answer` runs in every outcome reward and evaluation: its answers must not move. Also the well-formed
    turn's one block, whole (`is_answer_block`), against the pattern's `fullmatch`. Seen failing with the first
    block's answer planted in place of the last, and with `is_answer_block` planted to want
    either tag, not both."""
    assert extract_answer(text) == regex_extract_answer(text)
    for candidate in (text, f"<answer>{text}", f"{text}</answer>", f"<answer>{text}</answer>"):
        assert is_answer_block(candidate) == (ANSWER_RE.fullmatch(candidate) is not None)


@pytest.mark.parametrize(
    ("prediction", "index"),
    [("B", 1), ("(c)", 2), ("D. yellow", 3), ("blue", 2), ("The Blue.", 2), ("E", None), ("purple", None)],
)
def test_parse_choice(prediction, index):
    assert parse_choice(prediction, OPTIONS) == index


def test_is_correct_multiple_choice_by_letter_or_text():
    assert is_correct("C", "C", OPTIONS)
    assert is_correct("blue", "C", OPTIONS)
    assert not is_correct("B", "C", OPTIONS)
    assert not is_correct(None, "C", OPTIONS)


def test_is_correct_open_answers_are_normalised():
    assert is_correct("The WXYZ!", "wxyz")
    assert not is_correct("wxy", "wxyz")


def test_answers_of_1000_characters_or_more_score_zero():
    """DeepEyes' limit (`vl_agent.py`: `len(answer_text) >= 1000`), the judge's too: 999 characters still count."""
    assert not is_correct("wxyz " * 300, "wxyz")
    assert is_correct("w" * 999, "w" * 999) and not is_correct("w" * 1000, "w" * 1000)
    completion = [assistant("<think>t</think><answer>" + "C" * 1001 + "</answer>")]
    assert outcome_reward([completion], answer=["C"], options=[OPTIONS]) == [0.0]


def test_outcome_reward_reads_the_final_turn_of_a_multi_turn_completion():
    right = [assistant("<think>look</think>", tool=True), TOOL, assistant("<think>blue</think><answer>C</answer>")]
    wrong = [assistant("<think>guess</think><answer>A</answer>")]
    boxed = [assistant("<think>t</think> \\boxed{blue}")]
    scores = outcome_reward([right, wrong, boxed], answer=["C", "C", "C"], options=[OPTIONS] * 3)
    assert scores == [1.0, 0.0, 1.0]


def test_outcome_reward_on_open_answers_without_options():
    completions = [[assistant("<answer>4821</answer>")], [assistant("<answer>4812</answer>")]]
    assert outcome_reward(completions, answer=["4821", "4821"]) == [1.0, 0.0]


@pytest.mark.parametrize(
    ("completion", "score"),
    [
        ([assistant("<think>t</think><answer>C</answer>")], 1.0),
        ([assistant("<think>t</think>", tool=True), TOOL, assistant("<think>u</think> <answer>C</answer>")], 1.0),
        ([assistant("<answer>C</answer>")], 0.0),  # no thinking
        ([assistant("<think>t</think>", tool=True), TOOL], 0.0),  # never answers
        ([assistant("<think>t</think> prose", tool=True), TOOL, assistant("<think>u</think><answer>C</answer>")], 0.0),
        ([assistant("<think>t</think><answer>C</answer>", tool=True)], 0.0),  # answers and calls in one turn
        ([assistant("<think>t</think><answer>C</answer> trailing")], 0.0),
        ([assistant("<think>a<think>b</think><answer>C</answer>")], 0.0),
        ([assistant("<think>t</think><answer>A</answer><answer>C</answer>")], 0.0),  # one answer, not two
        ([assistant("<think>t</think><answer>A</answer> <answer>C</answer>")], 0.0),
    ],
)
def test_format_reward(completion, score):
    assert format_reward([completion]) == [score]


def test_format_reward_on_messages_parsed_by_trl():
    """TRL's response parser moves `<think>...</think>` into `reasoning_content`."""

    def parsed(reasoning, content, tool=False):
        message = assistant(content, tool)
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        return message

    good = [parsed("look", "", tool=True), TOOL, parsed("seen", "<answer>A</answer>")]
    no_think = [parsed("look", "", tool=True), TOOL, parsed(None, "<answer>A</answer>")]
    empty_think = [parsed(" ", "<answer>A</answer>")]
    assert format_reward([good, no_think, empty_think]) == [1.0, 0.0, 0.0]


def test_gated_outcome_is_binary_and_needs_a_well_formed_rollout():
    """The paper's R_out is binary (MAPO section 3.3): correct and well formed is 1, anything else 0."""
    completions = [
        [assistant("<think>t</think><answer>C</answer>")],  # right, well formed
        [assistant("<answer>C</answer>")],  # right, no thinking
        [assistant("<think>t</think><answer>A</answer>")],  # wrong, well formed
    ]
    assert gated_outcome_reward(completions, answer=["C"] * 3, options=[OPTIONS] * 3) == [1.0, 0.0, 0.0]
    assert set(gated_outcome_reward(completions, answer=["C"] * 3, options=[OPTIONS] * 3)) <= {0.0, 1.0}


def test_tool_bonus_needs_a_correct_answer_and_a_zoom_that_returned_a_crop():
    envs = [ZoomInEnv(ToolConfig(), PixelBudget(3136, 12544, 28)) for _ in range(3)]
    completions = []
    for env, box in zip(envs, ([0, 0, 50, 50], [50, 50, 10, 10], None)):
        env.reset(image=Image.new("RGB", (400, 300)))
        turns = []
        if box is not None:
            response = {"role": "tool", "name": "image_zoom_in_tool", "content": env.image_zoom_in_tool(box, "x")}
            turns = [assistant("<think>t</think>", tool=True), response]
        completions.append([*turns, assistant("<think>u</think><answer>C</answer>")])
    # a crop and right; a rejected box (no crop) and right; no call and right
    assert tool_bonus_reward(completions, answer=["C"] * 3, environments=envs, options=[OPTIONS] * 3) == [1, 0, 0]
    assert tool_bonus_reward(completions[:1], answer=["A"], environments=envs[:1], options=[OPTIONS]) == [0.0]
