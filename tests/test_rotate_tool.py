"""The rotate tool (tools/rotate.py): a turned image is a new image, a later zoom's box is read in the frame the model
saw and lands on the same pixels of the original, and every bad call is an observation, never an exception."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from tools import PixelBudget, ToolConfig, make_environment_factory
from tools.rotate import quarter_turns, turned, unturn_box

# Images and boxes in multiples of 28 under a budget that holds them whole: nothing is resized, so pixels compare.
BUDGET = PixelBudget(28 * 28, 28 * 28 * 400, 28)


def environment(image: Image.Image, **config):
    env = make_environment_factory(ToolConfig(tools=["zoom_in", "rotate"], accept_img_idx=True, **config), BUDGET)()
    env.reset(image=image)
    return env


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def shown_image(observation: list[dict]) -> Image.Image:
    assert observation[0]["type"] == "image", observation
    return observation[0]["image"]


@pytest.mark.parametrize("angle", [90, 180, 270, -90, 450, 90.0])
def test_a_turn_returns_the_image_turned_counter_clockwise(angle):
    image = noise(280, 168)
    env = environment(image)
    out = shown_image(env.image_rotate_tool(angle))
    expected = image.rotate(angle % 360, expand=True)  # PIL's rotate: counter-clockwise, as DeepEyes' tool
    assert np.array_equal(np.asarray(out), np.asarray(expected))
    assert env.last_error is None and len(env.shown) == 2 and env.calls == []  # a rotation is no zoom-in call


def test_a_zoom_on_a_turned_image_reads_its_box_in_the_turned_frame():
    image = noise(280, 168)
    env = environment(image)
    env.image_rotate_tool(90)  # image 1: 168 wide, 280 high
    crop = shown_image(env.image_zoom_in_tool([0, 0, 56, 84], "the corner", img_idx=1))
    seen = image.transpose(Image.Transpose.ROTATE_90)
    assert np.array_equal(np.asarray(crop), np.asarray(seen.crop((0, 0, 56, 84))))
    # The turned image's top-left corner is the original's top-right: the call's box is in the original's pixels.
    assert env.calls[-1].box == (280 - 84, 0, 280, 56)


def test_turns_and_zooms_compose_in_any_order():
    """A chain of turns and zooms, each on the image the last call returned, shows what the same chain shows when it
    is applied to the pixels the model saw, step by step."""
    rng = np.random.default_rng(1)
    for trial in range(20):
        image = noise(28 * int(rng.integers(6, 12)), 28 * int(rng.integers(6, 12)), seed=trial)
        env = environment(image, min_side=1)
        seen = image  # what the model saw last, built by hand
        for _ in range(4):
            if rng.random() < 0.5:
                angle = int(rng.choice([90, 180, 270]))
                out = shown_image(env.image_rotate_tool(angle, img_idx=-1))
                seen = seen.rotate(angle, expand=True)
            else:
                w, h = seen.size
                x1, y1 = 28 * int(rng.integers(0, w // 28)), 28 * int(rng.integers(0, h // 28))
                x2, y2 = (
                    x1 + 28 * int(rng.integers(1, (w - x1) // 28 + 1)),
                    y1 + 28 * int(rng.integers(1, (h - y1) // 28 + 1)),
                )
                out = shown_image(env.image_zoom_in_tool([x1, y1, x2, y2], "a patch", img_idx=-1))
                seen = seen.crop((x1, y1, x2, y2))
            assert np.array_equal(np.asarray(out), np.asarray(seen)), trial


@pytest.mark.parametrize("turns", [0, 1, 2, 3])
def test_unturn_box_inverts_a_turn(turns):
    size = (7, 4)
    box = (1, 0, 3, 2)  # on the unturned image
    image = Image.fromarray(np.arange(28, dtype=np.uint8).reshape(4, 7))
    image_box = np.asarray(image.crop(box))
    view = turned(image, turns)
    # The box as it lies on the turned image: where the turned pixels of the box went.
    marked = np.zeros((4, 7), dtype=np.uint8)
    marked[box[1] : box[3], box[0] : box[2]] = 1
    ys, xs = np.nonzero(np.asarray(turned(Image.fromarray(marked), turns)))
    on_view = (int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1)
    assert unturn_box(on_view, size, turns) == box
    assert np.array_equal(np.asarray(turned(Image.fromarray(image_box), turns)), np.asarray(view.crop(on_view)))


BAD_ANGLES = [45, 1.5, "90", None, True, [90], {"angle": 90}, [[90]], math.nan, math.inf, -math.inf, 1e20, 10**40 + 1]
BAD_INDICES = [2, -3, 1.5, math.nan, math.inf, "0", [0], True, 10**40]


@pytest.mark.parametrize("angle", BAD_ANGLES, ids=repr)
def test_a_bad_angle_is_an_observation(angle):
    env = environment(noise(280, 168))
    out = env.image_rotate_tool(angle)
    assert [part["type"] for part in out] == ["text"] and out[0]["text"].startswith("Error: angle must be")
    assert env.last_error is not None and len(env.shown) == 1


@pytest.mark.parametrize("img_idx", BAD_INDICES, ids=repr)
def test_a_bad_image_index_is_an_observation(img_idx):
    env = environment(noise(280, 168))
    out = env.image_rotate_tool(90, img_idx)
    assert [part["type"] for part in out] == ["text"] and out[0]["text"].startswith("Error: img_idx")
    assert env.last_error is not None and len(env.shown) == 1


def test_quarter_turns_reads_whole_multiples_of_90_only():
    assert [quarter_turns(a) for a in (0, 90, 180, 270, 360, -90, 90.0, 90 * 10**40 + 90)] == [0, 1, 2, 3, 0, 3, 1, 1]
