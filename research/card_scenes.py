"""The localization probe's scenes (`research/localization_probe.py`, `research/vision_tokens.py`): 448 px, a pale
background and square cards of distinct colours, seen by the tiny policy at 112 px as 16 image tokens in a 4 x 4 grid
of 28 px cells."""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

from data.synthetic import COLOURS, REGIONS, is_free, region_of
from data.trajectories import grid_box, region_box

SCENE, VIEW = 448, 112  # the kit's processor turns a 448 x 448 image into 112 x 112: 8 x 8 patches, 16 tokens
GRID, GRID_BOX, MARGIN = 28, 42, 6  # a merged token's cell; the pixels cue's gold box; the words cue's margin
BACKGROUND = 215.0  # the grey of every scene before its tint and cards


def scenes(n: int, seed: int, cue: str, cards: tuple[int, int], tint: float) -> list[dict]:
    """`n` scenes; the first card drawn is the one asked for. Boxes: `card` in scene pixels, `gold` in the view."""
    rng, colours, out = np.random.default_rng(seed), list(COLOURS), []
    ramp = np.linspace(-tint / 2, tint / 2, SCENE)
    for _ in range(n):
        pixels = np.full((SCENE, SCENE, 3), BACKGROUND)
        pixels[..., 0] += ramp[None, :]
        pixels[..., 2] += ramp[:, None]
        chosen = [colours[j] for j in rng.choice(len(colours), int(rng.integers(cards[0], cards[1] + 1)), False)]
        boxes: list[tuple[int, int, int, int]] = []
        for colour in chosen:
            while True:
                side = int(rng.integers(24, 41))
                x, y = (int(v) for v in rng.integers(0, SCENE - side, size=2))
                if is_free((x, y, x + side, y + side), boxes, 8):
                    boxes.append((x, y, x + side, y + side))
                    pixels[y : y + side, x : x + side] = COLOURS[colour]
                    break
        card = list(boxes[0])
        scale = SCENE / VIEW
        seen = [*(math.floor(v / scale) for v in card[:2]), *(math.ceil(v / scale) for v in card[2:])]
        question = f"Where is the {chosen[0]} card?"
        if cue == "words":
            question += f" Look in the {REGIONS[region_of(seen, VIEW, VIEW)]} of the image."
            gold = region_box(seen, (VIEW, VIEW), MARGIN)
        else:
            gold = grid_box(seen, (VIEW, VIEW), GRID, GRID_BOX)
        image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
        out.append({"image": image, "question": question, "gold": gold, "card": card, "cell": token_cell(seen)})
    return out


def token_cell(view_box: list[int]) -> int:
    """The row-major index (0-15) of the 28 px image token's cell of the view that holds the centre of `view_box`."""
    cx, cy = (view_box[0] + view_box[2]) / 2, (view_box[1] + view_box[3]) / 2
    return int(cy // GRID) * (VIEW // GRID) + int(cx // GRID)
