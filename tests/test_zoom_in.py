"""Crop geometry, rejection rules, label rules, the environment and a property-based fuzz of the tool."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image, ImageDraw
from transformers.utils import get_json_schema

from tools import (
    TOOL_NAME,
    PixelBudget,
    RelativeZoomInEnv,
    ToolConfig,
    ToolError,
    ZoomInEnv,
    box_contains,
    boxes_overlap,
    crop,
    crop_box,
    environment_tools,
    executed_calls,
    make_environment_factory,
    seen_size,
    validate_label,
)
from tools.zoom_in import crop_box as _crop_box
from tools.zoom_in import crop_size

BUDGET = PixelBudget(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 16, factor=28)  # the tiny kit's
RULES = {"min_side": 28, "max_aspect": 100.0}  # ToolConfig's defaults


def crop_box(image_size, bbox_2d, **kwargs):  # noqa: F811 - the tool's, with its default rules unless given
    return _crop_box(image_size, bbox_2d, **(RULES | kwargs))


# ------------------------------------------------------------------------------------------------- geometry
def test_box_is_mapped_from_the_seen_frame_to_the_original():
    # The model saw a 100x50 image of a 1000x500 original: every coordinate scales by 10.
    assert crop_box((1000, 500), [10, 5, 20, 15], seen_size=(100, 50)) == (100, 50, 200, 150)


def test_without_seen_size_the_box_is_in_original_pixels():
    assert crop_box((1000, 500), [10, 5, 60, 45]) == (10, 5, 60, 45)


def test_fractional_boxes_cover_the_requested_region():
    assert crop_box((1000, 1000), [10.2, 10.7, 50.5, 50.1], seen_size=(1000, 1000)) == (10, 10, 51, 51)


def test_box_is_clamped_to_the_image():
    assert crop_box((200, 100), [-50, -10, 150, 500]) == (0, 0, 150, 100)


@pytest.mark.parametrize(
    "box",
    [[50, 10, 50, 20], [60, 10, 50, 20], [10, 30, 20, 30], [300, 10, 400, 20], [-40, 10, -1, 20]],
    ids=["zero-width", "x2<x1", "zero-height", "right-of-image", "left-of-image"],
)
def test_empty_boxes_after_clamping_are_rejected(box):
    with pytest.raises(ToolError, match="empty"):
        crop_box((200, 100), box)


@pytest.mark.parametrize(
    ("box", "match"),
    [
        ([1, 2, 3], "4 numbers"),
        ([1, 2, 3, 4, 5], "4 numbers"),
        ("1,2,3,4", "list of 4"),
        (None, "list of 4"),
        ([1, "2", 3, 4], "only numbers"),
        ([1, True, 3, 4], "only numbers"),
        ([1, 2, float("nan"), 4], "finite"),
        ([1, 2, float("inf"), 4], "finite"),
    ],
)
def test_malformed_boxes_are_rejected(box, match):
    with pytest.raises(ToolError, match=match):
        crop_box((200, 100), box)


def test_tool_error_is_a_value_error():
    assert issubclass(ToolError, ValueError)


def test_too_elongated_box_is_rejected():
    with pytest.raises(ToolError, match="elongated"):
        crop_box((5000, 5000), [0, 0, 4000, 30], max_aspect=100)
    assert crop_box((5000, 5000), [0, 0, 2800, 30], max_aspect=100) == (0, 0, 2800, 30)


def test_small_box_is_expanded_about_its_centre():
    assert crop_box((200, 200), [95, 98, 105, 102], min_side=28) == (86, 86, 114, 114)


def test_expanded_box_is_shifted_inside_the_image():
    # A 4x4 box in the top-left corner grows to 28x28 and is pushed back inside the image.
    assert crop_box((200, 200), [0, 0, 4, 4], min_side=28) == (0, 0, 28, 28)
    assert crop_box((200, 200), [196, 196, 200, 200], min_side=28) == (172, 172, 200, 200)


def test_expansion_is_capped_by_a_small_image():
    assert crop_box((20, 200), [5, 5, 6, 6], min_side=28) == (0, 0, 20, 28)


def test_drawn_target_is_cropped_from_the_original_with_a_box_in_resized_coordinates():
    original = Image.new("RGB", (2400, 1600), "white")
    ImageDraw.Draw(original).rectangle([1800, 1200, 1860, 1260], fill=(255, 0, 0))
    seen = seen_size(original.size, BUDGET)
    sx, sy = seen[0] / original.width, seen[1] / original.height
    # The model points at the red square in its own (downscaled) frame.
    box_seen = [1790 * sx, 1190 * sy, 1870 * sx, 1270 * sy]
    patch = crop(original, box_seen, seen_size=seen, **RULES)
    pixels = list(patch.getdata())
    red = sum(p == (255, 0, 0) for p in pixels)
    assert red >= 61 * 61  # the whole square is in the crop
    assert red / len(pixels) > 0.4  # and the crop is mostly the square, not the wrong region
    # Applying the same box to the original without mapping (DeepEyes #141) misses the square entirely.
    wrong = crop(original, box_seen, **RULES)
    assert all(p != (255, 0, 0) for p in wrong.getdata())


def test_seen_size_matches_the_processor_grid(tiny_processor):
    image = Image.new("RGB", (2000, 1500))
    out = tiny_processor.image_processor(images=[image], return_tensors="pt")
    _, grid_h, grid_w = out["image_grid_thw"][0].tolist()
    patch = tiny_processor.image_processor.patch_size
    assert seen_size(image.size, BUDGET) == (grid_w * patch, grid_h * patch)


# ------------------------------------------------------------------------------------------- box conventions
# The hand-worked example (docs: recipes/README.md, "Qwen3-VL: box coordinates"). A 2240 x 1120 original under the
# real recipes' max_pixels 1003520 is resized by smart_resize (beta = sqrt(2240 * 1120 / 1003520) = sqrt(2.5)):
# with Qwen2.5-VL's factor 28 to 1400 x 700 (floor(1416.7 / 28) * 28, floor(708.4 / 28) * 28), a scale of exactly 1.6;
# with Qwen3-VL's factor 32 to 1408 x 704. The target, [1120, 560, 1568, 784] in original pixels, is
#   pixels (Qwen2.5-VL):        [1120, 560, 1568, 784] / 1.6                      = [700, 350, 980, 490]
#   relative_1000 (Qwen3-VL):   [1120 / 2240, 560 / 1120, 1568 / 2240, 784 / 1120] x 1000 = [500, 500, 700, 700]
# whatever the processor's factor: the relative box does not depend on the seen size.
ORIGINAL, TARGET = (2240, 1120), (1120, 560, 1568, 784)
QWEN2_5_VL_BUDGET = PixelBudget(min_pixels=3136, max_pixels=1003520, factor=28)
QWEN3_VL_BUDGET = PixelBudget(min_pixels=65536, max_pixels=1003520, factor=32)


def zoom(convention: str, budget: PixelBudget, bbox_2d: list[int]) -> tuple[int, int, int, int]:
    env = make_environment_factory(ToolConfig(box_convention=convention), budget)()
    env.reset(image=Image.new("RGB", ORIGINAL))
    env.image_zoom_in_tool(bbox_2d, "the target")
    assert env.calls[-1].ok, env.calls[-1].error
    return env.calls[-1].box


def test_the_same_target_from_a_box_written_in_either_convention():
    assert seen_size(ORIGINAL, QWEN2_5_VL_BUDGET) == (1400, 700)
    assert seen_size(ORIGINAL, QWEN3_VL_BUDGET) == (1408, 704)
    assert zoom("pixels", QWEN2_5_VL_BUDGET, [700, 350, 980, 490]) == TARGET
    assert zoom("relative_1000", QWEN2_5_VL_BUDGET, [500, 500, 700, 700]) == TARGET
    assert zoom("relative_1000", QWEN3_VL_BUDGET, [500, 500, 700, 700]) == TARGET


def test_a_box_read_in_the_wrong_convention_lands_elsewhere():
    """What the setting prevents: Qwen2.5-VL's pixel box read on the 1000-grid (x 2.24, y 1.12), and Qwen3-VL's relative
    box read as pixels of the 1400 x 700 view (x 1.6, y 1.6): neither crop holds the target."""
    assert zoom("relative_1000", QWEN2_5_VL_BUDGET, [700, 350, 980, 490]) == (1568, 392, 2196, 549)
    assert zoom("pixels", QWEN2_5_VL_BUDGET, [500, 500, 700, 700]) == (800, 800, 1120, 1120)
    for box in ((1568, 392, 2196, 549), (800, 800, 1120, 1120)):
        assert not box_contains(box, TARGET)


def test_the_tool_description_says_its_convention():
    """TRL renders the tool's schema from the method's docstring: each convention's environment describes its own."""
    for convention, words in (("pixels", "in pixels of the image you see"), ("relative_1000", "on a 0-1000 grid")):
        env = make_environment_factory(ToolConfig(box_convention=convention), BUDGET)()
        (tool,) = environment_tools(env)
        assert tool.__name__ == TOOL_NAME
        described = get_json_schema(tool)["function"]["parameters"]["properties"]["bbox_2d"]["description"]
        assert words in " ".join(described.split())
    assert isinstance(
        make_environment_factory(ToolConfig(box_convention="relative_1000"), BUDGET)(), RelativeZoomInEnv
    )


# Issue 37: Qwen3-VL's released image_zoom_in_tool (Qwen-Agent) takes `img_idx`, the image to crop. TARGET's crop is
# 448 x 224, shown at that size under both budgets (crop_max_pixels 401408). Its middle, [250, 250, 750, 750] on its
# 0-1000 grid or [112, 56, 336, 168] in its pixels, is (1120 + 112, 560 + 56, 1120 + 336, 560 + 168) in the original;
# the left half of that 224 x 112 crop, [0, 0, 500, 1000] or [0, 0, 112, 112], is (1232, 616, 1344, 728).
MIDDLE, MIDDLE_LEFT = (1232, 616, 1456, 728), (1232, 616, 1344, 728)
BY_CONVENTION = {
    "relative_1000": (QWEN3_VL_BUDGET, [500, 500, 700, 700], [250, 250, 750, 750], [0, 0, 500, 1000]),
    "pixels": (QWEN2_5_VL_BUDGET, [700, 350, 980, 490], [112, 56, 336, 168], [0, 0, 112, 112]),
}


@pytest.mark.parametrize("convention", BY_CONVENTION)
def test_img_idx_zooms_into_an_image_shown_its_box_composed_into_the_original(convention):
    budget, target, middle, left = BY_CONVENTION[convention]
    config = ToolConfig(box_convention=convention, accept_img_idx=True, crop_max_pixels=401408)
    env = make_environment_factory(config, budget)()
    env.reset(image=Image.new("RGB", ORIGINAL))
    (tool,) = environment_tools(env)  # called as TRL calls it: tool(**arguments)
    tool(bbox_2d=target, label="the target")  # absent: the original
    assert env.calls[-1].crop.size == (448, 224)
    tool(bbox_2d=middle, label="the middle", img_idx=1)
    tool(bbox_2d=left, label="its left half", img_idx=2)
    tool(bbox_2d=target, label="the target", img_idx=0.0)
    assert [call.box for call in env.calls] == [TARGET, MIDDLE, MIDDLE_LEFT, TARGET]
    assert env.calls[1].arguments == {"bbox_2d": middle, "label": "the middle", "img_idx": 1}
    for bad, says in ((5, "img_idx 5 names no image shown: use 0 (the original image) to 4"), (1.5, "whole number"),
                      ("1", "whole number"), (True, "whole number"),
                      # issue 59, item 1: Python's JSON reads these; `int()` raised ValueError / OverflowError
                      (float("nan"), "whole number"), (float("inf"), "whole number"), (-float("inf"), "whole number"),
                      (10**400, "names no image shown")):  # fmt: skip
        reply = tool(bbox_2d=middle, label="the middle", img_idx=bad)
        assert says in reply[-1]["text"] and reply[-1]["text"].startswith("Error:") and not env.calls[-1].ok
    assert len(env.shown) == 5  # failed calls show no image


@pytest.mark.parametrize("convention", BY_CONVENTION)
def test_a_negative_img_idx_counts_from_the_last_image_shown(convention):
    """Issue 49, item 6: Qwen-Agent crops `images[img_idx]`, a Python list, so -1 is the last image shown and -n the
    n-th from the end; it was an error here. With the original and TARGET's crop shown, -1 is the crop (its middle:
    MIDDLE) and -2 the original; -3 names no image."""
    budget, target, middle, _ = BY_CONVENTION[convention]
    env = make_environment_factory(ToolConfig(box_convention=convention, accept_img_idx=True), budget)()
    env.reset(image=Image.new("RGB", ORIGINAL))
    (tool,) = environment_tools(env)
    tool(bbox_2d=target, label="the target")
    tool(bbox_2d=middle, label="the middle", img_idx=-1)
    tool(bbox_2d=target, label="the target", img_idx=-3)  # 3 images shown now: -3 is the original
    assert [call.box for call in env.calls] == [TARGET, MIDDLE, TARGET]
    reply = tool(bbox_2d=middle, label="the middle", img_idx=-5)
    assert reply[-1]["text"].startswith("Error: img_idx -5 names no image shown: use 0 (the original image) to 3")
    assert "or -1 for the last" in reply[-1]["text"] and not env.calls[-1].ok


def test_the_tool_describes_img_idx_only_when_it_takes_it():
    for accept in (False, True):
        env = make_environment_factory(ToolConfig(box_convention="relative_1000", accept_img_idx=accept), BUDGET)()
        (tool,) = environment_tools(env)
        parameters = get_json_schema(tool)["function"]["parameters"]
        assert parameters["required"] == ["bbox_2d", "label"] and ("img_idx" in parameters["properties"]) is accept
        assert "on a 0-1000 grid" in " ".join(parameters["properties"]["bbox_2d"]["description"].split())
    described = " ".join(parameters["properties"]["img_idx"]["description"].split())
    assert "0 (the default) is the original image, and i the image the i-th successful zoom returned" in described


def test_an_environment_of_another_convention_than_its_config_is_refused():
    with pytest.raises(ValueError, match="make_environment_factory"):
        ZoomInEnv(ToolConfig(box_convention="relative_1000"), BUDGET)
    with pytest.raises(ValueError, match="box_convention"):
        ToolConfig(box_convention="normalized")


# ---------------------------------------------------------------------------------------------------- labels
@pytest.mark.parametrize(
    ("label", "match"),
    [(None, "short text"), (3, "short text"), ("   ", "empty"), ("w " * 13, "too long"), ("x" * 81, "too long")],
)
def test_bad_labels_are_rejected(label, match):
    with pytest.raises(ToolError, match=match):
        validate_label(label, max_words=12, max_chars=80)


def test_label_limits_are_configurable_and_whitespace_is_collapsed():
    assert validate_label("  red \n star ", 12, 80) == "red star"
    assert validate_label("w " * 12, 12, 80) == " ".join(["w"] * 12)
    with pytest.raises(ToolError):
        validate_label("one two three", max_words=2, max_chars=80)
    env = ZoomInEnv(ToolConfig(max_label_words=2), BUDGET)  # the environment applies its config's limits
    env.reset(image=Image.new("RGB", (200, 200)))
    env.image_zoom_in_tool([0, 0, 50, 50], "one two three")
    assert "too long" in env.calls[-1].error


# ------------------------------------------------------------------------------------------------ environment
@pytest.fixture
def env():
    environment = ZoomInEnv(ToolConfig(), BUDGET)
    image = Image.new("RGB", (2000, 1500), "white")
    ImageDraw.Draw(image).ellipse([1000, 700, 1060, 760], fill=(0, 0, 255))
    environment.reset(image=image, prompt=[], answer="A")
    return environment


def test_env_returns_crop_and_text_and_records_the_call(env):
    w, h = env.seen_size
    result = env.image_zoom_in_tool([w * 0.45, h * 0.42, w * 0.55, h * 0.55], "blue circle")
    assert [part["type"] for part in result] == ["image", "text"]
    crop_image = result[0]["image"]
    pixels = crop_image.width * crop_image.height
    assert BUDGET.min_pixels <= pixels <= BUDGET.max_pixels  # resized to the processor's budget
    assert crop_image.width % 28 == 0 and crop_image.height % 28 == 0
    (call,) = env.calls
    assert call.ok and call.turn == 1 and call.label == "blue circle" and call.crop is crop_image
    assert call.box[0] <= 1000 and call.box[2] >= 1060  # recorded in original pixels
    assert call.arguments == {"bbox_2d": [w * 0.45, h * 0.42, w * 0.55, h * 0.55], "label": "blue circle"}


def test_the_response_is_the_crop_and_its_box_never_the_label(env):
    """Echoing the label beside the crop would hand the model its own claim as text: "walk the talk" forbids it."""
    result = env.image_zoom_in_tool([10, 10, 60, 50], "blue circle")
    assert result[1] == {"type": "text", "text": "Zoomed in on [10, 10, 60, 50]."}
    assert "blue" not in result[1]["text"] and "circle" not in result[1]["text"]


def test_crops_have_their_own_pixel_budget():
    """A crop is resized to crop_max_pixels while the prompt image (the frame of bbox_2d) keeps the image budget."""
    crop_budget = 28 * 28 * 4
    env = ZoomInEnv(ToolConfig(crop_max_pixels=crop_budget), BUDGET)
    env.reset(image=Image.new("RGB", (2000, 1500)))
    assert env.seen_size == seen_size((2000, 1500), BUDGET)  # unchanged by the crop budget
    (image, _) = env.image_zoom_in_tool([0, 0, env.seen_size[0], env.seen_size[1]], "everything")
    assert image["image"].width * image["image"].height <= crop_budget
    env_default = ZoomInEnv(ToolConfig(), BUDGET)
    env_default.reset(image=Image.new("RGB", (2000, 1500)))
    (image, _) = env_default.image_zoom_in_tool([0, 0, env.seen_size[0], env.seen_size[1]], "everything")
    assert image["image"].width * image["image"].height > crop_budget  # the image's budget when not set


def test_a_crop_under_the_floor_is_upscaled_keeping_its_aspect_ratio():
    """crop_min_pixels, Mini-o3's floor: on a 2000x1500 original seen at 112x84 (the tiny budget), [0, 0, 4, 3] crops
    the 72x54 region (x 2000/112 = 17.86). Natively it is shown at 84x56 (smart_resize rounds 72/28 and 54/28: 6
    tokens); under a 6,272-pixel floor smart_resize scales it by sqrt(6272 / 3888) = 1.270 and rounds each side up
    to 28: 112x84 (12 tokens), the region's 4:3 kept, resampled bicubic from the region itself."""
    original = Image.effect_noise((2000, 1500), 64).convert("RGB")
    shown = {}
    for floor in (None, 28 * 28 * 8):
        env = ZoomInEnv(ToolConfig(crop_min_pixels=floor), BUDGET)
        env.reset(image=original)
        (image, _) = env.image_zoom_in_tool([0, 0, 4, 3], "the corner")
        assert env.seen_size == (112, 84) and env.calls[-1].box == (0, 0, 72, 54)
        shown[floor] = image["image"]
    assert shown[None].size == (84, 56)
    assert shown[28 * 28 * 8].size == (112, 84)
    region = original.crop((0, 0, 72, 54))
    assert shown[28 * 28 * 8].tobytes() == region.resize((112, 84), Image.Resampling.BICUBIC).tobytes()
    # a crop already over the floor is shown as before
    env = ZoomInEnv(ToolConfig(crop_min_pixels=28 * 28 * 8), BUDGET)
    env.reset(image=original)
    (image, _) = env.image_zoom_in_tool([0, 0, 112, 84], "everything")
    assert image["image"].size == (112, 84)


def test_a_floor_near_the_ceiling_never_passes_it():
    """smart_resize's upscale rounds both sides up, which near the ceiling passes it (a 10x300 crop under a 12,544
    floor: 28x616); the crop is brought back under the ceiling, at a size the processor keeps (28x448 = 12,544)."""
    budget = ToolConfig(crop_min_pixels=28 * 28 * 16).crop_budget(BUDGET)
    assert crop_size((10, 300), budget) == (28, 448)
    assert seen_size((28, 448), BUDGET) == (28, 448)  # the processor's own resize leaves it as it is
    for size in [(50, 60), (3, 290), (112, 112), (500, 20)]:
        width, height = crop_size(size, budget)
        assert width * height <= budget.max_pixels and width % 28 == height % 28 == 0, size


def test_a_number_too_large_for_a_float_is_an_error_observation(env):
    result = env.image_zoom_in_tool([0, 0, 10**400, 10], "huge")
    assert result[0]["text"].startswith("Error:") and "too large" in env.calls[-1].error


def test_env_turns_a_bad_call_into_an_error_observation(env):
    result = env.image_zoom_in_tool([10, 10, 5, 5], "anything")
    assert [part["type"] for part in result] == ["text"]
    assert result[0]["text"].startswith("Error:")
    (call,) = env.calls
    assert not call.ok and call.crop is None and "empty" in call.error


def test_reset_clears_previous_calls(env):
    env.image_zoom_in_tool([0, 0, 50, 50], "corner")
    env.reset(image=Image.new("RGB", (600, 400)))
    assert env.calls == [] and env.seen_size == seen_size((600, 400), BUDGET)


def test_reset_without_an_image_names_the_column():
    with pytest.raises(TypeError, match="'image'"):
        ZoomInEnv(ToolConfig(), BUDGET).reset(prompt=[])


def _tool_message(content):
    return {"role": "tool", "name": TOOL_NAME, "content": content}


def test_executed_calls_drop_calls_whose_response_was_rolled_back(env):
    first = env.image_zoom_in_tool([0, 0, 50, 50], "first")
    env.image_zoom_in_tool([50, 50, 100, 100], "second")  # ran, but TRL dropped its response as overlong
    completion = [
        {"role": "assistant", "content": "<think>a</think>", "tool_calls": [{}]},
        _tool_message(first),
        {"role": "assistant", "content": "<think>b</think>", "tool_calls": [{}]},
    ]
    assert [c.label for c in executed_calls(env, completion)] == ["first"]


def test_executed_calls_skip_messages_trl_rejected_before_running_the_tool(env):
    result = env.image_zoom_in_tool([0, 0, 50, 50], "only")
    completion = [
        _tool_message("{'error': \"missing 1 required positional argument: 'label'\"}"),
        _tool_message(result),
    ]
    first, second = executed_calls(env, completion)
    assert (first.turn, first.ok, first.label) == (1, False, None) and "missing" in first.error
    assert first.arguments is None  # no assistant turn here to say what was asked
    assert (second.turn, second.ok, second.label) == (2, True, "only")


def test_executed_calls_keep_the_arguments_of_calls_trl_rejected(env):
    asked = {"name": TOOL_NAME, "arguments": {"bbox_2d": [1, 2, 3, 4]}}
    completion = [
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": asked}]},
        _tool_message("{'error': \"missing 1 required positional argument: 'label'\"}"),
    ]
    (call,) = executed_calls(env, completion)
    assert call.arguments == {"bbox_2d": [1, 2, 3, 4]} and call.name == TOOL_NAME and not call.ok


class ZoomAndCountEnv(ZoomInEnv):
    """The zoom-in tool beside a second, toy tool, as a subclass adding one would expose both to TRL."""

    def count_objects(self, color: str) -> str:
        """Count the objects of one color in the image.

        Args:
            color: The color to count, e.g. "blue".
        """
        return "1"


def test_executed_calls_keep_only_the_zoom_calls_beside_a_second_tool():
    env = ZoomAndCountEnv(ToolConfig(), BUDGET)
    env.reset(image=Image.new("RGB", (2000, 1500), "white"))
    assert [tool.__name__ for tool in environment_tools(env)] == ["count_objects", TOOL_NAME]
    zoom = {"name": TOOL_NAME, "arguments": {"bbox_2d": [0, 0, 50, 50], "label": "corner"}}
    count = {"name": "count_objects", "arguments": {"color": "blue"}}
    misspelt_zoom = {"name": "image_zoom", "arguments": zoom["arguments"]}
    both = [{"type": "function", "function": zoom}, {"type": "function", "function": count}]
    completion = [
        {"role": "assistant", "content": "<think>a</think>", "tool_calls": both},
        _tool_message(env.image_zoom_in_tool(**zoom["arguments"])),
        {"role": "tool", "name": "count_objects", "content": env.count_objects("blue")},
        {"role": "assistant", "content": "<think>b</think>", "tool_calls": [{"type": "function", "function": count}]},
        {"role": "tool", "name": "count_objects", "content": "{'error': 'count_objects() got an unexpected keyword'}"},
        {
            "role": "assistant",
            "content": "<think>c</think>",
            "tool_calls": [{"type": "function", "function": misspelt_zoom}],
        },
        {"role": "tool", "name": "image_zoom", "content": "{'error': 'Tool image_zoom not found.'}"},
    ]
    first, misspelt = executed_calls(env, completion)
    assert (first.turn, first.ok, first.label, first.name) == (1, True, "corner", TOOL_NAME)
    # A call to a tool the environment does not have is still a failed zoom-in call: a misspelt name dodges nothing.
    assert (misspelt.turn, misspelt.ok, misspelt.name) == (2, False, "image_zoom") and "not found" in misspelt.error
    assert misspelt.arguments == zoom["arguments"]  # the rejected call keeps what was asked


# ------------------------------------------------------------------------------------------------- fuzzing
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=3),
    max_leaves=10,
)
# Integers of up to 500 digits: JSON allows any number, and one past ~1.8e308 does not fit a float (hypothesis'
# unbounded `st.integers()` stays under 2**128, so it would never find that).
huge = st.builds(lambda digits, sign: sign * 10**digits, st.integers(0, 500), st.sampled_from((1, -1)))
numbers = st.integers(-5000, 5000) | huge | st.floats(allow_nan=True, allow_infinity=True)
boxes = st.lists(numbers, min_size=0, max_size=6) | json_values


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bbox=boxes, label=json_values | st.text(max_size=100))
def test_fuzz_tool_never_raises_and_returns_a_crop_inside_the_image_or_an_error(env, bbox, label):
    n_before = len(env.calls)
    result = env.image_zoom_in_tool(bbox, label)
    call = env.calls[-1]
    assert len(env.calls) == n_before + 1
    if call.ok:
        assert result[0]["type"] == "image" and result[0]["image"] is call.crop
        left, top, right, bottom = call.box
        assert 0 <= left < right <= env.image.width and 0 <= top < bottom <= env.image.height
        assert not any(isinstance(v, float) and not math.isfinite(v) for v in bbox)
    else:
        assert [part["type"] for part in result] == ["text"] and result[0]["text"].startswith("Error:")


def test_box_predicates_by_hand():
    assert boxes_overlap((0, 0, 10, 10), (9, 9, 20, 20))
    assert not boxes_overlap((0, 0, 10, 10), (10, 0, 20, 10))  # ends are exclusive: touching edges share no area
    assert box_contains((0, 0, 10, 10), (0, 0, 10, 10)) and box_contains((0, 0, 10, 10), (2, 3, 4, 5))
    assert not box_contains((0, 0, 10, 10), (5, 5, 11, 6))
