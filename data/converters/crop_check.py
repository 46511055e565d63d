"""The check of every converted call against the crop the release ships for it (`crop_disagreement`): a row whose crop
disagrees is skipped as `crop_mismatch`, the check that catches a wrong convention on data no test anticipated; and,
where a release's convention is not certain, the choice per row of the candidate reading whose crops agree
(`Readings`)."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np
from PIL import Image

from data.converters.common import Box, SkipRow
from data.rows import Trajectory

# The crop check (`crop_disagreement`). Aspect ratios may differ by this fraction, plus the rounding of a pixel per side
# and, where a release resizes its crops to multiples of a patch (`resize_step`), half a step per side.
ASPECT_TOLERANCE = 0.1
# Content: both crops downscaled to at most CONTENT_GRID x CONTENT_GRID cells of grey, their correlation at least
# MIN_CORRELATION. On the tests' textured scenes a box off by 3 px still correlates 0.81-0.94 with the true crop, one
# 1.5x too large 0.02-0.64, one with x and y swapped below 0.4. Crops under MIN_CONTENT_SIDE px a side are checked by
# aspect alone; flat crops (grey std under FLAT_STD) by their mean grey, within FLAT_MEAN_DIFF.
CONTENT_GRID = 16
MIN_CORRELATION = 0.75
MIN_CONTENT_SIDE = 8
FLAT_STD, FLAT_MEAN_DIFF = 2.0, 20.0


def _trim_margins(image: Image.Image, light: int = 245) -> Image.Image:
    """A matplotlib figure less its light margins (DeepEyesV2 shows crops through `plt.imshow`; with the axes off the
    figure is the crop on white)."""
    grey = np.asarray(image.convert("L"))
    rows, cols = np.flatnonzero((grey < light).any(axis=1)), np.flatnonzero((grey < light).any(axis=0))
    if not len(rows) or not len(cols):
        return image
    return image.crop((int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1))


def _grey_cells(image: Image.Image, grid: int) -> np.ndarray:
    return np.asarray(image.convert("L").resize((grid, grid), Image.Resampling.BOX), dtype=np.float64).ravel()


def crop_disagreement(
    original: Image.Image, box: Box, shipped: Image.Image, *, resize_step: int = 1, figure: bool = False
) -> tuple[str | None, bool]:
    """Whether the crop of `original` at `box` (what the converted call will show) is the crop the release ships:
    (why not, or None; whether content was compared). `resize_step`: the release resized its crops to multiples of
    that patch; `figure`: it shows a matplotlib figure of the crop, whose light margins are trimmed first."""
    ours = original.crop(box)
    theirs = _trim_margins(shipped) if figure else shipped
    (w, h), (sw, sh) = ours.size, theirs.size
    slack = ASPECT_TOLERANCE + 1 / w + 1 / h + (resize_step / 2 + 1) * (1 / sw + 1 / sh)
    ratio = (w / h) / (sw / sh)
    if abs(ratio - 1) > slack:
        return f"aspect {w}x{h} vs the release's {sw}x{sh} crop", False
    if min(w, h, sw, sh) < MIN_CONTENT_SIDE:
        return None, False
    grid = min(CONTENT_GRID, w, h, sw, sh)
    a, b = _grey_cells(ours, grid), _grey_cells(theirs, grid)
    if a.std() < FLAT_STD or b.std() < FLAT_STD:
        differ = abs(a.mean() - b.mean()) > FLAT_MEAN_DIFF
        return (f"flat crops of mean grey {a.mean():.0f} vs {b.mean():.0f}" if differ else None), True
    correlation = float(np.corrcoef(a, b)[0, 1])
    if correlation < MIN_CORRELATION:
        return f"content correlation {correlation:.2f} < {MIN_CORRELATION} with the release's {sw}x{sh} crop", True
    return None, True


class Readings:
    """The candidate readings of a convention a release leaves uncertain (PixelReasoner's padding, CoF's enlargement:
    docs/data.md), one chosen per row by the crops the release ships. `read(row)` calls `row(reading)` for each
    reading in turn and keeps the first that converts (every crop agreeing: no `crop_mismatch`), recording it in the
    trajectory's `reading` (`stats.json` counts rows per reading). The readings that converted the most rows so far go
    first, ties in the order given, so a release read one way costs one pass per row. A row no reading converts is
    skipped: on the skip of the first reading whose crops did not disagree (its crops agreed as far as they went, so
    its reason is the row's), else as `crop_mismatch` naming each reading's disagreement."""

    def __init__(self, names: Sequence[str]):
        if len(set(names)) != len(names) or not names:
            raise ValueError(f"readings must be distinct names, at least one; got {list(names)}")
        self.names = tuple(names)
        self.rows = Counter()  # rows converted under each reading

    def read(self, row: Callable[[str], Trajectory]) -> Trajectory:
        order = sorted(self.names, key=lambda name: -self.rows[name])  # stable: ties keep the order given
        skips: dict[str, SkipRow] = {}
        for name in order:
            try:
                trajectory = row(name)
            except SkipRow as skip:
                skips[name] = skip
                continue
            self.rows[name] += 1
            return dataclasses.replace(trajectory, reading=name)
        agreed = [skip for skip in skips.values() if skip.reason != "crop_mismatch"]
        if agreed:
            raise agreed[0]
        raise SkipRow("crop_mismatch", "under no reading: " + "; ".join(f"{n}: {s.detail}" for n, s in skips.items()))
