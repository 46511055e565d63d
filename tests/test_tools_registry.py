"""A tool is one module (tools/registry.py): the default tools keep every text byte for byte, a recipe line enables
another, and a third tool written in a test is one module plus one recipe line."""

from __future__ import annotations

import sys
import textwrap

import pytest
from PIL import Image
from trl import ModelConfig

from data.task import SYSTEM_PROMPTS, build_prompt, in_box_convention, system_prompt
from repairs.rollout import run_tool_calls
from repairs.token_budget import token_budget
from tools import (
    PixelBudget,
    ToolConfig,
    calls_per_tool,
    environment_tools,
    executed_calls,
    get_tools,
    make_environment_factory,
    registry,
)
from utils.recipes import parse_args_and_record

# The system prompts before tools were modules (data/task.py at 2da112e), spelled out: the default must not move a byte.
BEFORE = {
    "pixels": "You are a visual search agent. The image you see is downscaled, so small details may be unreadable.\n"
    "Reason inside <think>...</think>. To look closer, call image_zoom_in_tool with bbox_2d = [x1, y1, x2, y2] in "
    "pixels of the image you see, and label = a few words naming what you expect to see in that box. You may zoom "
    "several times. When you are sure, give the final answer inside <answer>...</answer>: the option letter for "
    "multiple choice, otherwise a short phrase.",
    "relative_1000": "You are a visual search agent. The image you see is downscaled, so small details may be "
    "unreadable.\nReason inside <think>...</think>. To look closer, call image_zoom_in_tool with bbox_2d = [x1, y1, "
    "x2, y2] on a 0-1000 grid over the image you see ((0, 0) its top-left, (1000, 1000) its bottom-right corner), and "
    "label = a few words naming what you expect to see in that box. You may zoom several times. When you are sure, "
    "give the final answer inside <answer>...</answer>: the option letter for multiple choice, otherwise a short "
    "phrase.",
}
BUDGET = PixelBudget(28 * 28, 28 * 28 * 400, 28)


def test_the_default_tools_system_prompt_is_byte_identical_to_before():
    assert SYSTEM_PROMPTS == BEFORE
    for convention, text in BEFORE.items():
        assert system_prompt(convention) == system_prompt(convention, ["zoom_in"]) == text
        assert build_prompt("q", box_convention=convention)[0]["content"] == text


def test_the_system_prompt_follows_the_enabled_tools_and_in_box_convention_rewrites_to_them():
    two = system_prompt("pixels", ["zoom_in", "rotate"])
    assert two.startswith(BEFORE["pixels"].split(" When you are sure")[0])
    assert "call image_rotate_tool with angle = 90, 180 or 270" in two and two.endswith("otherwise a short phrase.")
    stored = build_prompt("q")  # what datasets store: the default tools, in pixels
    rewritten = in_box_convention(stored, "relative_1000", ["zoom_in", "rotate"])
    assert rewritten[0]["content"] == system_prompt("relative_1000", ["zoom_in", "rotate"])
    assert in_box_convention(rewritten, "pixels")[0]["content"] == BEFORE["pixels"]  # and back
    own = [{"role": "system", "content": "my own"}]
    assert in_box_convention(own, "pixels", ["zoom_in", "rotate"]) == own


def test_a_recipe_names_known_tools_and_zoom_in_among_them():
    assert ToolConfig().tools == ["zoom_in"]
    assert ToolConfig(tools="zoom_in").tools == ["zoom_in"]
    for bad, words in (
        (["zoom_in", "nope"], "unknown tool 'nope'"),
        (["rotate"], "must include zoom_in"),
        (["zoom_in", "zoom_in"], "twice"),
        (["zoom_in", "no_such_module:TOOL"], "cannot import"),
        (["zoom_in", "tools.registry:DEFAULT_TOOLS"], "not a tools.Tool"),
    ):
        with pytest.raises(ValueError, match=words):
            ToolConfig(tools=bad)


def test_the_default_environment_is_the_one_before_and_two_tools_add_the_method():
    config = ToolConfig()
    env = make_environment_factory(config, BUDGET)()
    assert [tool.__name__ for tool in environment_tools(env)] == ["image_zoom_in_tool"]
    assert type(env).__name__ == "ZoomInEnv"
    two = make_environment_factory(ToolConfig(tools=["zoom_in", "rotate"]), BUDGET)()
    assert [tool.__name__ for tool in environment_tools(two)] == ["image_rotate_tool", "image_zoom_in_tool"]


def test_the_token_budget_of_the_default_tools_is_unchanged_and_rotate_costs_at_most_a_crop(tiny_processor):
    kwargs = dict(max_completion_length=320, max_tool_calling_iterations=2, context_length=128000)
    zoom = token_budget(tiny_processor, ToolConfig(), **kwargs)
    two = token_budget(tiny_processor, ToolConfig(tools=["zoom_in", "rotate"], accept_img_idx=True), **kwargs)
    # A round costs the dearer tool's call and response; the rotate schema and sentence lengthen the prompt.
    assert two.call_turn + two.crop_response >= zoom.call_turn + zoom.crop_response
    assert two.prompt_text > zoom.prompt_text


def test_rotate_and_zoom_calls_are_told_apart_and_only_zoom_calls_are_scored():
    env = make_environment_factory(ToolConfig(tools=["zoom_in", "rotate"], accept_img_idx=True), BUDGET)()
    env.reset(image=Image.new("RGB", (280, 168), "red"))
    calls = [
        {"type": "function", "function": {"name": "image_rotate_tool", "arguments": {"angle": 90}}},
        {"type": "function", "function": {"name": "image_rotate_tool", "arguments": {"angel": 90}}},  # TRL refuses
        {"type": "function", "function": {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [0, 0, 56, 56],
                                                                                      "label": "a", "img_idx": 1}}},
    ]  # fmt: skip
    completion = [{"role": "assistant", "content": "", "tool_calls": calls}, *run_tool_calls(env, calls)]
    assert isinstance(completion[2]["content"], str)  # the misspelt argument: TRL's error text, no exception
    zoom = executed_calls(env, completion)
    assert [(call.turn, call.name, call.ok) for call in zoom] == [(1, "image_zoom_in_tool", True)]
    assert zoom[0].label == "a"
    # The trainer logs every other tool's calls, the refused one included (`MAPOTrainer._semantic_reward`).
    assert calls_per_tool(completion, get_tools(["zoom_in", "rotate"])) == {"tools/rotate_calls_per_rollout": 2.0}


# ---------------------------------------------------------------------------------------------------- a third tool
TOY_MODULE = '''
"""A toy tool: answers with the image's size, as text."""

from tools import Tool, register_tool


def image_size_tool(self, unit: str) -> str:
    """Tell the original image's size.

    Args:
        unit: The unit to say it in, "pixels".
    """
    self.last_error = None
    return f"The image is {self.image.size[0]} x {self.image.size[1]} {unit}."


TOY = register_tool(
    Tool(
        name="image_size",
        function="image_size_tool",
        method=lambda config: image_size_tool,
        prompt=lambda box_convention: "To learn the image's size, call image_size_tool with unit = pixels.",
        budget_arguments=lambda env: {"unit": "pixels"},
        short_arguments={"unit": "pixels"},
    )
)
'''


def test_a_third_tool_is_one_module_and_one_recipe_line(tmp_path, monkeypatch):
    (tmp_path / "toy_tool.py").write_text(textwrap.dedent(TOY_MODULE), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "TOOLS", dict(registry.TOOLS))  # the toy registers into a copy
    monkeypatch.setitem(sys.modules, "toy_tool", None)
    monkeypatch.delitem(sys.modules, "toy_tool")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("tools: [zoom_in, rotate, 'toy_tool:TOY']\n", encoding="utf-8")  # the one recipe line
    config, _ = parse_args_and_record((ToolConfig, ModelConfig), ["--config", str(recipe)])
    assert [tool.name for tool in get_tools(config.tools)] == ["zoom_in", "rotate", "image_size"]
    assert "image_size" in registry.TOOLS  # registered on import: from now on a recipe may name it by its name
    assert "call image_size_tool with unit = pixels. When you are sure" in system_prompt("pixels", config.tools)
    env = make_environment_factory(config, BUDGET)()
    assert "image_size_tool" in [tool.__name__ for tool in environment_tools(env)]
    env.reset(image=Image.new("RGB", (280, 168)))
    call = {"type": "function", "function": {"name": "image_size_tool", "arguments": {"unit": "pixels"}}}
    assert run_tool_calls(env, [call]) == [
        {"role": "tool", "name": "image_size_tool", "content": "The image is 280 x 168 pixels."}
    ]
