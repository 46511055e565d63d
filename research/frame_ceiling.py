"""How much of the words world can a policy frame when it cannot tell which frame it writes boxes in?

Qwen2.5-VL writes `bbox_2d` in pixels of the resized image it sees (`tools.seen_size`), so the box that frames the
"bottom right" cell depends on that image's width and height. The tiny policy does not learn where image tokens lie
(`research/reports/tiny_world.md`, "Where the tiny policy looks"), and in the demo's world (600-900 px sides) the two
frames it sees, 112 x 84 and 84 x 112, hold the same 12 image tokens: nothing but their positions tells them apart.
Such a policy can at best write one box per named cell. This counts, per cell, how many rows the best such box frames
(`rewards.grounding.frames_target`, through the tool's own `crop_box`), the box taken among the gold boxes the SFT
data writes for that cell in any frame: a ceiling on greedy target-seen for a frame-blind policy, a lower bound on
the best box there is. Square images have one frame, and there the ceiling is 1.

    python -m research.frame_ceiling --image_size 600 900 --rows 512
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Iterable, Sequence

from data.synthetic import REGIONS, build_synthetic, region_of
from data.trajectories import region_box, seen_box
from rewards.grounding import frames_target
from tiny.kit import kit_paths
from tools import ToolConfig, ToolError
from tools.config import PixelBudget
from tools.zoom_in import crop_box, seen_size
from utils.models import load_processor, pixel_budget


def frame_blind_ceiling(
    rows: Iterable[tuple[tuple[int, int], Sequence[int]]], budget: PixelBudget, margin: int
) -> dict[str, dict]:
    """Per named cell, for `rows` of (image size, target box in original pixels): `rows`, the `frames` the cell's rows
    are seen in, `best_box` (in the model's frame) and `framed`, the rows it frames. Boxes go through the tool's
    `crop_box` with `ToolConfig`'s defaults, so clamping to a smaller frame counts as the tool counts it."""
    config = ToolConfig()
    by_cell: dict[int, list[tuple[tuple[int, int], tuple[int, int], Sequence[int]]]] = defaultdict(list)
    for size, target in rows:
        frame = seen_size(size, budget)
        by_cell[region_of(target, *size)].append((size, frame, target))
    out = {}
    for cell, cell_rows in sorted(by_cell.items()):
        candidates = {tuple(region_box(seen_box(t, s, f), f, margin)) for s, f, t in cell_rows}

        def framed(box: tuple[int, ...], cell_rows=cell_rows) -> int:
            hits = 0
            for size, frame, target in cell_rows:
                try:
                    box_ = crop_box(size, list(box), seen_size=frame, min_side=config.min_side,
                                    max_aspect=config.max_aspect)  # fmt: skip
                except ToolError:
                    continue
                hits += frames_target(box_, target, size)
            return hits

        best = max(sorted(candidates), key=framed)
        out[REGIONS[cell]] = {
            "rows": len(cell_rows),
            "frames": sorted({f for _, f, _ in cell_rows}),
            "best_box": list(best),
            "framed": framed(best),
        }
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--image_size", type=int, nargs=2, default=[600, 900], help="the range each side is drawn from"
    )
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--margin", type=int, default=6, help="the SFT recipe's gold_box_margin")
    parser.add_argument("--policy", default=str(kit_paths("outputs/tiny")["policy"]), help="whose pixel budget")
    args = parser.parse_args(argv)
    budget = pixel_budget(load_processor(args.policy))
    data = build_synthetic(args.rows, seed=args.seed, min_size=args.image_size[0], max_size=args.image_size[1],
                           region_hint=True).select_columns(["image", "target_bbox"])  # fmt: skip
    cells = frame_blind_ceiling(((r["image"].size, r["target_bbox"]) for r in data), budget, args.margin)
    for name, cell in cells.items():
        print(
            f"{name:>12}: {cell['framed']:3d} / {cell['rows']:3d} framed by {cell['best_box']}, frames {cell['frames']}"
        )
    total = sum(c["framed"] for c in cells.values()) / sum(c["rows"] for c in cells.values())
    print(f"frame-blind ceiling on target-seen: {total:.3f}")
    return cells


if __name__ == "__main__":
    main()
