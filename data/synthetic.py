"""Synthetic visual-search data that cannot be answered at the model's resolution without zooming in: one large,
cluttered image per row holding a small target, and a question about it (why it is hard without zooming and
unambiguous with it: docs/data.md, "The synthetic world")."""

from __future__ import annotations

import argparse
import io
import math
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache

import datasets
import numpy as np
from PIL import Image, ImageDraw, ImageFont

from data.rows import TASK_FEATURES
from data.task import OPTION_LETTERS, build_prompt
from tools import box_contains

# Saturated and far apart (every pair differs by >= 80 in some channel, each has a channel <= 100), so neither the
# pale background (all channels >= 160) nor another target colour can be mistaken for one of them.
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (230, 25, 35),
    "green": (30, 160, 50),
    "blue": (30, 70, 220),
    "yellow": (245, 210, 0),
    "orange": (245, 130, 0),
    "purple": (130, 40, 170),
    "pink": (250, 100, 190),
    "brown": (130, 80, 30),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "star", "diamond", "cross", "hexagon")
# Common 3-4 letter words, none of them a colour or shape name, so a sign never reads like an answer to another
# question type.
WORDS: tuple[str, ...] = (
    "CAT", "DOG", "SUN", "MAP", "KEY", "BOX", "CUP", "HAT", "PEN", "BUS", "JAM", "FOX", "OWL", "ANT", "BEE",
    "FISH", "BIRD", "TREE", "LAMP", "BOAT", "DOOR", "MOON", "FROG", "KITE", "SHOE", "CAKE", "BELL", "RAIN",
    "SNOW", "LION", "WOLF", "BEAR", "MILK", "SALT", "ROAD", "SHIP", "FARM", "WIND", "LEAF", "SOAP",
)  # fmt: skip
QUESTION_TYPES: tuple[str, ...] = ("colour", "shape", "text", "position", "count")
# The image's 3x3 regions, row by row, as a question names them with `region_hint` ("Look in the top left of the
# image."): the words the tiny tokenizer was trained on.
REGION_GRID = 3
REGIONS: tuple[str, ...] = (
    "top left", "top", "top right", "left", "center", "right", "bottom left", "bottom", "bottom right",
)  # fmt: skip

# Object size as a fraction of the image's short side. At the tiny model's budget (~112x112) this is under 3 px;
# at 1500 px and more it is >= 22 px, enough to tell a hexagon from a circle and to read a sign.
DEFAULT_OBJECT_FRACTION = (0.015, 0.025)
DEFAULT_IMAGE_SIZE = (1500, 3000)  # the range each image side is drawn from, in pixels

_SUPERSAMPLE = 4  # shapes are drawn 4x larger and box-filtered down: PIL's polygons are not antialiased
_DIRECTIONS = ("left", "right", "above", "below")
SIGN_LABEL = "the sign"  # the referent of every reading question: what is written is the answer
_SIGN_FILL, _SIGN_BORDER, _SIGN_INK = (250, 250, 245), (120, 120, 120), (20, 20, 20)

Box = tuple[int, int, int, int]  # x1, y1, x2, y2 in pixels, exclusive end


# ------------------------------------------------------------------------------------------------- drawing helpers
def _unit_polygon(shape: str) -> list[tuple[float, float]]:
    """Vertices in [-1, 1]^2, y pointing down; shapes are upright so a square is never a rotated diamond."""
    if shape == "square":
        return [(-0.85, -0.85), (0.85, -0.85), (0.85, 0.85), (-0.85, 0.85)]
    if shape == "triangle":
        return [(0.0, -1.0), (1.0, 0.8), (-1.0, 0.8)]
    if shape == "diamond":  # narrower than tall, to read as a diamond and not a tilted square
        return [(0.0, -1.0), (0.7, 0.0), (0.0, 1.0), (-0.7, 0.0)]
    if shape == "cross":
        a = 0.32  # half the arm width
        quadrant = [(a, -1.0), (a, -a), (1.0, -a)]  # from the top arm's right edge round to the right arm's top
        return [p for k in range(4) for p in _rotate90(quadrant, k)]
    if shape == "star":  # five points, alternating outer and inner radius, the first straight up
        radii = [1.0 if k % 2 == 0 else 0.42 for k in range(10)]
        return [(r * math.sin(k * math.pi / 5), -r * math.cos(k * math.pi / 5)) for k, r in enumerate(radii)]
    if shape == "hexagon":
        return [(math.cos(k * math.pi / 3), math.sin(k * math.pi / 3)) for k in range(6)]
    raise ValueError(f"unknown shape {shape!r}; known: {SHAPES}")


def _rotate90(points: list[tuple[float, float]], times: int) -> list[tuple[float, float]]:
    for _ in range(times):
        points = [(-y, x) for x, y in points]
    return points


def _draw_shape(draw: ImageDraw.ImageDraw, shape: str, box: tuple[float, float, float, float], fill) -> None:
    x1, y1, x2, y2 = box
    if shape == "circle":
        draw.ellipse(box, fill=fill)
        return
    cx, cy, rx, ry = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
    draw.polygon([(cx + u * rx, cy + v * ry) for u, v in _unit_polygon(shape)], fill=fill)


@lru_cache(maxsize=64)
def _font(size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.load_default(size=size)  # Pillow's bundled FreeType font: no font files needed offline


def render_object(content: str, size: int, colour: str | None = None) -> Image.Image:
    """An RGBA sprite of one object, `size` pixels tall, with a transparent surround: a shape of `SHAPES` (`size` x
    `size`, `colour` a key of `COLOURS`), or a short string drawn in black on a small white sign with a grey border."""
    if content in SHAPES:
        if colour not in COLOURS:
            raise ValueError(f"a {content} needs a colour from {sorted(COLOURS)}, got {colour!r}")
        big = size * _SUPERSAMPLE
        mask = Image.new("L", (big, big), 0)
        _draw_shape(ImageDraw.Draw(mask), content, (0, 0, big - 1, big - 1), 255)
        # Colour everywhere, shape only in alpha: edges blend with whatever the sprite is pasted on, no dark fringe.
        sprite = Image.new("RGBA", (size, size), (*COLOURS[colour], 0))
        sprite.putalpha(mask.reduce(_SUPERSAMPLE))
        return sprite
    font = _font(max(8, round(size * 0.75)))
    left, top, right, bottom = font.getbbox(content)
    pad = max(2, size // 5)
    sign = Image.new("RGBA", (right - left + 2 * pad, size), (*_SIGN_FILL, 255))
    draw = ImageDraw.Draw(sign)
    draw.rectangle((0, 0, sign.width - 1, size - 1), outline=_SIGN_BORDER, width=max(1, size // 16))
    draw.text((pad - left, (size - (bottom - top)) // 2 - top), content, font=font, fill=_SIGN_INK)
    return sign


def object_label(content: str, colour: str | None = None) -> str:
    """A name that fully describes one object: "red star", "text FISH" or "digits 4821". It is how questions name
    the objects they relate ("Is the red star left of the blue circle?"); it is not a zoom label, since it can hold
    the answer to a question about that object."""
    if content in SHAPES:
        return f"{colour} {content}"
    return f"{'digits' if content.isdigit() else 'text'} {content}"


def referent_label(shape: str | None = None, colour: str | None = None, plural: bool = False) -> str:
    """The zoom label of a question's referent: the object named only by what the question itself says ("the
    diamond" for "What colour is the diamond?", "the green object" for "What shape is the green object?", "the
    yellow squares" for a count), so the label never gives the answer away. `SIGN_LABEL` names a sign."""
    if shape is None:
        if colour is None:
            raise ValueError("a referent needs a shape, a colour or both")
        return f"the {colour} object{'s' if plural else ''}"
    noun = _plural(shape) if plural else shape
    return f"the {colour} {noun}" if colour else f"the {noun}"


def render_background(
    width: int, height: int, rng: np.random.Generator, avoid_shapes: tuple[str, ...] = ()
) -> Image.Image:
    """A pale, low-saturation, cluttered RGB background: smooth colour gradients, faint lines, blobs and shapes, every
    channel >= 160 (no pixel near a `COLOURS` entry) and no shape of `avoid_shapes` (no faint copy of a target). No
    per-pixel noise: it would add nothing at the model's resolution and make the PNGs larger and slower to encode."""
    grid = rng.uniform(205, 248, size=(int(rng.integers(3, 8)), int(rng.integers(3, 8)), 3))
    image = Image.fromarray(grid.astype(np.uint8)).resize((width, height), Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    short, density = min(width, height), width * height / 2000**2

    def pale() -> tuple[int, int, int]:
        grey = rng.uniform(175, 235)
        return tuple(int(np.clip(grey + t, 160, 255)) for t in rng.uniform(-12, 12, size=3))

    for _ in range(int(80 * density)):
        x1, x2 = rng.uniform(0, width, size=2)
        y1, y2 = rng.uniform(0, height, size=2)
        draw.line((x1, y1, x2, y2), fill=pale(), width=int(rng.integers(1, 6)))
    for _ in range(int(150 * density)):
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        rx, ry = rng.uniform(0.005, 0.05, size=2) * short
        draw.ellipse((x - rx, y - ry, x + rx, y + ry), fill=pale())
    clutter_shapes = [s for s in SHAPES if s not in avoid_shapes]
    for _ in range(int(120 * density)):
        x, y, r = rng.uniform(0, width), rng.uniform(0, height), rng.uniform(0.005, 0.02) * short
        _draw_shape(draw, str(rng.choice(clutter_shapes)), (x - r, y - r, x + r, y + r), pale())
    return image


# ------------------------------------------------------------------------------------------------------- questions
@dataclass(frozen=True)
class _Question:
    question: str
    answer: str
    wrong: tuple[str, ...]  # three wrong options, used for multiple choice
    label: str
    source: str
    targets: tuple[tuple[str, str | None], ...]  # (content, colour) per object
    layout: str  # "single", "cluster", or a direction of the first target relative to the second
    decoy_ok: Callable[[str, str], bool]  # (shape, colour) -> whether a decoy of that kind keeps the answer unique
    confusers: bool = False  # also place look-alikes sharing one attribute right next to the targets


def _pick(rng: np.random.Generator, items, k: int, exclude=()) -> list:
    pool = [x for x in items if x not in exclude]
    return [pool[j] for j in rng.choice(len(pool), size=k, replace=False)]


def _plural(shape: str) -> str:
    return shape + ("es" if shape.endswith("s") else "s")


def _colour_question(rng: np.random.Generator, multiple_choice: bool) -> _Question:
    shape, colour = _pick(rng, SHAPES, 1)[0], _pick(rng, COLOURS, 1)[0]
    template = ("What colour is the {}?", "What is the colour of the small {}?")[int(rng.integers(2))]
    return _Question(
        question=template.format(shape),
        answer=colour,
        wrong=tuple(_pick(rng, COLOURS, 3, exclude=[colour])),
        label=referent_label(shape),
        source="synthetic/colour",
        targets=((shape, colour),),
        layout="single",
        # Avoiding the answer's colour is not needed for a unique answer, but then that colour marks the target
        # alone, so its pixels show where the target is (the tests check `target_bbox` that way).
        decoy_ok=lambda s, c: s != shape and c != colour,
    )


def _shape_question(rng: np.random.Generator, multiple_choice: bool) -> _Question:
    shape, colour = _pick(rng, SHAPES, 1)[0], _pick(rng, COLOURS, 1)[0]
    template = ("What shape is the {} object?", "Which shape is drawn in {}?")[int(rng.integers(2))]
    return _Question(
        question=template.format(colour),
        answer=shape,
        wrong=tuple(_pick(rng, SHAPES, 3, exclude=[shape])),
        label=referent_label(colour=colour),
        source="synthetic/shape",
        targets=((shape, colour),),
        layout="single",
        decoy_ok=lambda s, c: c != colour,
    )


def _text_question(rng: np.random.Generator, multiple_choice: bool) -> _Question:
    if rng.random() < 0.5:
        length = int(rng.integers(3, 5))
        text = "".join(str(d) for d in rng.integers(0, 10, size=length))
        wrong: set[str] = set()
        while len(wrong) < 3:  # near misses (one or two digits changed): a blurry glimpse cannot rule them out
            digits = list(text)
            for pos in rng.choice(length, size=int(rng.integers(1, 3)), replace=False):
                digits[pos] = str((int(digits[pos]) + int(rng.integers(1, 10))) % 10)
            wrong.add("".join(digits))
        wrong_options = tuple(sorted(wrong))
    else:
        text = _pick(rng, WORDS, 1)[0]
        wrong_options = tuple(_pick(rng, [w for w in WORDS if len(w) == len(text)], 3, exclude=[text]))
    return _Question(
        question="What is written on the small sign?",
        answer=text,
        wrong=wrong_options,
        label=SIGN_LABEL,
        source="synthetic/text",
        targets=((text, None),),
        layout="single",
        decoy_ok=lambda s, c: True,  # decoys are shapes, never signs
    )


def _position_question(rng: np.random.Generator, multiple_choice: bool) -> _Question:
    shape_a, shape_b = _pick(rng, SHAPES, 2)
    colour_a, colour_b = _pick(rng, COLOURS, 2)
    name_a, name_b = object_label(shape_a, colour_a), object_label(shape_b, colour_b)
    direction = _DIRECTIONS[int(rng.integers(4))]
    if multiple_choice:  # four options need a question that all four directions answer
        question = f"Where is the {name_a} relative to the {name_b}?"
    elif direction in ("left", "right"):
        question = f"Is the {name_a} left or right of the {name_b}?"
    else:
        question = f"Is the {name_a} above or below the {name_b}?"
    targets = ((shape_a, colour_a), (shape_b, colour_b))
    return _Question(
        question=question,
        answer=direction,
        wrong=tuple(d for d in _DIRECTIONS if d != direction),
        label=f"the {name_a} and the {name_b}",
        source="synthetic/position",
        targets=targets,
        layout=direction,
        decoy_ok=lambda s, c: (s, c) not in targets,
        confusers=True,
    )


def _count_question(rng: np.random.Generator, multiple_choice: bool) -> _Question:
    shape, colour = _pick(rng, SHAPES, 1)[0], _pick(rng, COLOURS, 1)[0]
    count = int(rng.integers(2, 7))
    return _Question(
        question=f"How many {colour} {_plural(shape)} are there?",
        answer=str(count),
        wrong=tuple(str(w) for w in sorted(_pick(rng, range(max(1, count - 3), count + 4), 3, exclude=[count]))),
        label=referent_label(shape, colour, plural=True),
        source="synthetic/count",
        targets=((shape, colour),) * count,
        layout="cluster",
        decoy_ok=lambda s, c: (s, c) != (shape, colour),
        confusers=True,
    )


_QUESTION_BUILDERS: dict[str, Callable[[np.random.Generator, bool], _Question]] = {
    "colour": _colour_question,
    "shape": _shape_question,
    "text": _text_question,
    "position": _position_question,
    "count": _count_question,
}


def chance_accuracy(source: str, options: Sequence[str] = ()) -> float:
    """Accuracy of the best blind guess on one row: 1/len(options) for multiple choice, else one over the answers the
    question type allows (an open position question names its two directions; a sign holds one of 40 words half the
    time and random digits otherwise, so the best blind guess, any word, is right 1/80 of the time)."""
    if options:
        return 1.0 / len(options)
    kind = source.removeprefix("synthetic/")
    open_answers = {"colour": len(COLOURS), "shape": len(SHAPES), "count": 5, "position": 2, "text": 2 * len(WORDS)}
    if kind not in open_answers:
        raise ValueError(f"chance_accuracy: unknown synthetic source {source!r}; known: {sorted(open_answers)}")
    return 1.0 / open_answers[kind]


# ------------------------------------------------------------------------------------------------------- placement
def is_free(box: Box, occupied: Sequence[Box], gap: int = 0) -> bool:
    """Whether `box` keeps at least `gap` pixels from every box in `occupied` (scenes here; CLIP training crops)."""
    x1, y1, x2, y2 = box
    return all(x2 + gap <= a1 or a2 + gap <= x1 or y2 + gap <= b1 or b2 + gap <= y1 for a1, b1, a2, b2 in occupied)


def _union(boxes: list[Box]) -> Box:
    return min(b[0] for b in boxes), min(b[1] for b in boxes), max(b[2] for b in boxes), max(b[3] for b in boxes)


def _grow(box: Box, by: int, frame: Box) -> Box:
    """`box` widened by `by` on every side, cut to `frame`."""
    return (
        max(box[0] - by, frame[0]),
        max(box[1] - by, frame[1]),
        min(box[2] + by, frame[2]),
        min(box[3] + by, frame[3]),
    )


def region_cell(index: int, width: int, height: int) -> Box:
    """The pixel box of `REGIONS[index]` in a `width` x `height` image: one cell of its `REGION_GRID` x `REGION_GRID`
    partition (cells tile the image exactly; integer edges)."""
    row, col = divmod(index, REGION_GRID)
    return (
        col * width // REGION_GRID,
        row * height // REGION_GRID,
        (col + 1) * width // REGION_GRID,
        (row + 1) * height // REGION_GRID,
    )


def region_of(box: Sequence[float], width: int, height: int) -> int:
    """The index in `REGIONS` of the cell holding the centre of `box` (x1, y1, x2, y2) in a `width` x `height` image."""
    col = min(int((box[0] + box[2]) / 2 * REGION_GRID // width), REGION_GRID - 1)
    row = min(int((box[1] + box[3]) / 2 * REGION_GRID // height), REGION_GRID - 1)
    return row * REGION_GRID + col


def _random_box(rng: np.random.Generator, width: int, height: int, region: Box) -> Box | None:
    """A uniformly placed `width` x `height` box inside `region`, or None if it does not fit."""
    x1, y1, x2, y2 = region
    if x2 - x1 < width or y2 - y1 < height:
        return None
    x = int(rng.integers(x1, x2 - width, endpoint=True))
    y = int(rng.integers(y1, y2 - height, endpoint=True))
    return x, y, x + width, y + height


def _place_pair(rng: np.random.Generator, sprites: list[Image.Image], direction: str, frame: Box) -> list[Box] | None:
    """Boxes for two sprites, the first `direction` of the second, or None if this draw left the frame."""
    size = max(s.height for s in sprites)
    first = _random_box(rng, *sprites[0].size, frame)
    if first is None:
        return None
    # Centres >= 2 sizes apart along the axis and <= 0.25 size across it: exactly one of the four directions holds.
    along, across = rng.uniform(2.0, 4.0) * size, rng.uniform(-0.25, 0.25) * size
    along *= 1 if direction in ("left", "above") else -1  # the second sprite goes the opposite way
    dx, dy = (along, across) if direction in ("left", "right") else (across, along)
    width, height = sprites[1].size
    x = round((first[0] + first[2] - width) / 2 + dx)
    y = round((first[1] + first[3] - height) / 2 + dy)
    second = (x, y, x + width, y + height)
    return [first, second] if box_contains(frame, second) and is_free(second, [first], size // 2) else None


def _place_group(rng: np.random.Generator, sprites: list[Image.Image], frame: Box) -> list[Box] | None:
    """Boxes for one sprite anywhere, or several in a window just big enough for them, so the target box (and the
    zoom it asks for) stays small; None if this draw did not fit them."""
    size = max(s.height for s in sprites)
    side = size * (1 + 3 * math.ceil(math.sqrt(len(sprites))))
    window = _random_box(rng, side, side, frame) if len(sprites) > 1 else frame
    boxes: list[Box] = []
    for sprite in sprites:
        for _ in range(50):
            box = _random_box(rng, *sprite.size, window)
            if box is not None and is_free(box, boxes, size // 2):
                boxes.append(box)
                break
        else:
            return None
    return boxes


def _place_targets(rng: np.random.Generator, sprites: list[Image.Image], layout: str, frame: Box) -> list[Box]:
    for _ in range(100):
        boxes = (
            _place_pair(rng, sprites, layout, frame) if layout in _DIRECTIONS else _place_group(rng, sprites, frame)
        )
        if boxes is not None:
            return boxes
    raise RuntimeError(f"could not place {len(sprites)} targets ({layout}) in {frame}")


def _place_decoys(
    rng: np.random.Generator,
    image: Image.Image,
    kinds: list[tuple[str, str]],
    count: int,
    region: Box,
    occupied: list[Box],
    object_size: Callable[[], int],
    gap: int = 0,
) -> None:
    """Paste up to `count` decoys of `kinds` (shape, colour) into `region`, clear of `occupied` (which they join).

    Best effort: a crowded region gets fewer, since a decoy is not worth an unbounded search."""
    if not kinds:
        return
    for _ in range(count):
        shape, colour = kinds[int(rng.integers(len(kinds)))]
        sprite = render_object(shape, object_size(), colour)
        for _ in range(30):
            box = _random_box(rng, *sprite.size, region)
            if box is not None and is_free(box, occupied, max(gap, sprite.height // 2)):
                image.paste(sprite, box[:2], sprite)
                occupied.append(box)
                break


# -------------------------------------------------------------------------------------------------------- examples
def _split_key(split: str) -> int:
    return zlib.crc32(split.encode())  # stable across processes, unlike the salted built-in hash()


def _make_example(
    index: int,
    split: str,
    seed: int,
    min_size: int,
    max_size: int,
    mc_fraction: float,
    object_fraction: tuple[float, float],
    question_types: tuple[str, ...],
    region_hint: bool,
) -> dict:
    rng = np.random.default_rng([seed, _split_key(split), index])
    width, height = (int(v) for v in rng.integers(min_size, max_size, size=2, endpoint=True))
    size_lo, size_hi = (max(12, round(f * min(width, height))) for f in object_fraction)

    def object_size() -> int:
        return int(rng.integers(size_lo, size_hi, endpoint=True))

    multiple_choice = bool(rng.random() < mc_fraction)
    # Cycling the types balances them exactly, even in a handful of rows.
    q = _QUESTION_BUILDERS[question_types[index % len(question_types)]](rng, multiple_choice)

    avoid = tuple(c for c, _ in q.targets if c in SHAPES)
    image = render_background(width, height, rng, avoid_shapes=avoid)
    sprites = [render_object(content, object_size(), colour) for content, colour in q.targets]
    frame = (size_hi, size_hi, width - size_hi, height - size_hi)  # leaves room for the bbox margin
    question, target_frame = q.question, frame
    if region_hint:  # drawn only here, so rows without hints stay bit-identical
        region = int(rng.integers(len(REGIONS)))
        # Inset by the bbox margin's room, so the target box, margin included, lies inside the named cell.
        target_frame = _grow(region_cell(region, width, height), -size_hi, frame)
        question = f"{question} Look in the {REGIONS[region]} of the image."
    boxes = _place_targets(rng, sprites, q.layout, target_frame)
    for sprite, box in zip(sprites, boxes):
        image.paste(sprite, box[:2], sprite)
    group = _union(boxes)

    allowed = [(s, c) for s in SHAPES for c in COLOURS if q.decoy_ok(s, c)]
    occupied = list(boxes)
    if q.confusers:  # sharing the colour or the shape, so neither alone finds the target at low resolution
        sharing = [(s, c) for s, c in allowed if any(s == ts or c == tc for ts, tc in q.targets)]
        near = _grow(group, 3 * size_hi, frame)
        _place_decoys(rng, image, sharing, int(rng.integers(1, 4)), near, occupied, object_size)
    _place_decoys(rng, image, allowed, int(rng.integers(10, 26)), frame, occupied, object_size, gap=size_hi)

    margin = max(4, size_hi // 4)  # < size_hi, the frame's inset: the box never needs clipping
    bbox = [group[0] - margin, group[1] - margin, group[2] + margin, group[3] + margin]

    options: list[str] = []
    answer = q.answer
    if multiple_choice:
        candidates = [q.answer, *q.wrong]
        order = rng.permutation(len(candidates))
        options = [candidates[j] for j in order]
        answer = OPTION_LETTERS[int(np.flatnonzero(order == 0)[0])]

    buffer = io.BytesIO()
    # Lossless, and byte-for-byte the same for a given Pillow and zlib. zlib level 1: encoding was most of building a
    # row (27 of 37 ms at Pillow's default 6; 16 ms at 1, 2026-12-06) for files ~1.45x larger that decode as fast.
    image.save(buffer, format="PNG", compress_level=1)
    return {
        "id": f"{split}-{index:06d}",
        "source": q.source,
        "prompt": build_prompt(question, options),
        "image": {"bytes": buffer.getvalue(), "path": None},
        "answer": answer,
        "options": options,
        "target_bbox": bbox,
        "target_label": q.label,
    }


def build_synthetic(
    n: int,
    seed: int = 0,
    split: str = "train",
    *,
    min_size: int = DEFAULT_IMAGE_SIZE[0],
    max_size: int = DEFAULT_IMAGE_SIZE[1],
    mc_fraction: float = 0.5,
    object_fraction: tuple[float, float] = DEFAULT_OBJECT_FRACTION,
    question_types: Sequence[str] = QUESTION_TYPES,
    region_hint: bool = False,
) -> datasets.Dataset:
    """`n` visual-search rows, identical for identical arguments, down to the PNG bytes.

    Image sides are drawn from [`min_size`, `max_size`]; objects are `object_fraction` of the short side, about
    `object_fraction * sqrt(max_pixels)` at the model's resolution: the defaults suit the tiny model (~112x112
    budget); for real runs' ~1M pixels pass a smaller fraction (e.g. (0.004, 0.008)), or the target is visible without
    zooming. `mc_fraction` of the rows are multiple choice (four shuffled options, `answer` the letter); rows cycle
    through `question_types`. With `region_hint` the targets, box included, lie inside one cell of the 3x3 grid
    (`REGIONS`) and the question names it: for policies that cannot localize from pixels (the random tiny one). Rows
    are held in memory (~0.5 MB each): build large sets once with the CLI and `load_from_disk` them.
    """
    if not 0 < min_size <= max_size:
        raise ValueError(f"need 0 < min_size <= max_size, got {min_size}, {max_size}")
    if not 0.0 <= mc_fraction <= 1.0:
        raise ValueError(f"mc_fraction must be in [0, 1], got {mc_fraction}")
    if len(object_fraction) != 2 or not 0 < object_fraction[0] <= object_fraction[1] <= 0.25:
        raise ValueError(f"object_fraction must be (low, high) with 0 < low <= high <= 0.25; got {object_fraction}")
    question_types = tuple(question_types)
    unknown = [t for t in question_types if t not in _QUESTION_BUILDERS]
    if unknown or not question_types:
        raise ValueError(f"question_types must be a non-empty subset of {QUESTION_TYPES}; got {list(question_types)}")
    # A count's cluster spans up to 10 object sides (`_place_group`) and must fit its cell less a side each way.
    if region_hint and "count" in question_types and 12 * object_fraction[1] > 1 / REGION_GRID:
        raise ValueError(
            f"region_hint: a count question's cluster does not fit one of the {REGION_GRID}x{REGION_GRID} cells "
            f"with object_fraction {object_fraction}; need high <= {1 / (12 * REGION_GRID):.4f}, or leave 'count' "
            "out of question_types"
        )
    rows = [
        _make_example(i, split, seed, min_size, max_size, mc_fraction, object_fraction, question_types, region_hint)
        for i in range(n)
    ]
    return datasets.Dataset.from_list(rows, features=TASK_FEATURES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split(":")[0])
    parser.add_argument("--n", type=int, required=True, help="number of rows")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--split", default="train", help="name mixed into the seed: different splits never overlap")
    parser.add_argument("--output_dir", required=True, help="where to save_to_disk the dataset")
    parser.add_argument("--min_size", type=int, default=DEFAULT_IMAGE_SIZE[0])
    parser.add_argument("--max_size", type=int, default=DEFAULT_IMAGE_SIZE[1])
    parser.add_argument("--mc_fraction", type=float, default=0.5)
    parser.add_argument("--object_fraction", type=float, nargs=2, default=DEFAULT_OBJECT_FRACTION)
    parser.add_argument("--region_hint", action="store_true", help="questions name the 3x3 cell holding the target")
    args = parser.parse_args()
    world = {name: getattr(args, name) for name in ("min_size", "max_size", "mc_fraction", "region_hint")}
    dataset = build_synthetic(args.n, args.seed, args.split, object_fraction=tuple(args.object_fraction), **world)
    dataset.save_to_disk(args.output_dir)
    print(f"saved {len(dataset)} rows to {args.output_dir}")


if __name__ == "__main__":
    main()
