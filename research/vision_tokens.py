"""Does the card reach the language model, and does anything but rope say where? The image tokens, measured.

Issue 51, item 4 (pixels, time-boxed): the tiny policy does not learn to localize a card from pixels
(`research/localization_probe.py`). Before asking why the language model does not read where, this checks what it is
given. On the probe's scenes (448 px, one card, seen as 112 x 112: 16 merged image tokens in a 4 x 4 grid) it runs
the policy's vision tower and merger (`get_image_features`, the language model's input) and reports:

- `card_token_argmax`: how often the token that moved most from the same scene without its card is the token whose
  28 px cell holds the card's centre (`research.card_scenes.token_cell`): the card reaches the right token;
- `covered_token_argmax`: how often that token is one whose cell the card overlaps at all;
- `card_over_rest`: that token's change over the median change of the other 15;
- `blank_spread`: on a blank scene, the largest distance between two image tokens over their mean norm: zero when
  identical pixels give identical tokens wherever they lie, so that where a token lies is carried by rope alone.

    python -m research.vision_tokens --scenes 64
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
import torch
from PIL import Image

from research.card_scenes import BACKGROUND, GRID, SCENE, VIEW, scenes
from tiny.kit import kit_paths
from utils.models import load_model, load_processor


@torch.no_grad()
def image_tokens(model, processor, image: Image.Image) -> torch.Tensor:
    """The merged image tokens the language model receives for `image`, (tokens, hidden), row-major."""
    inputs = processor.image_processor(images=[image], return_tensors="pt")
    out = model.model.get_image_features(inputs["pixel_values"], inputs["image_grid_thw"])
    features = out.pooler_output if hasattr(out, "pooler_output") else out
    return torch.cat(list(features), dim=0) if isinstance(features, (list, tuple)) else features


def covered_tokens(card: Sequence[int]) -> set[int]:
    """The row-major indices of every token whose cell `card` (scene pixels) overlaps."""
    scale, per_row = SCENE / VIEW, VIEW // GRID
    cols = range(int(card[0] / scale // GRID), int((card[2] - 1) / scale // GRID) + 1)
    rows = range(int(card[1] / scale // GRID), int((card[3] - 1) / scale // GRID) + 1)
    return {r * per_row + c for r in rows for c in cols}


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default=str(kit_paths("outputs/tiny")["policy"]))
    parser.add_argument("--scenes", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    model = load_model(args.policy, dtype=torch.float32).eval()
    processor = load_processor(args.policy)
    blank = image_tokens(model, processor, Image.new("RGB", (SCENE, SCENE), (int(BACKGROUND),) * 3))
    spread = torch.cdist(blank, blank).max() / blank.norm(dim=-1).mean()
    hits, covered, ratios = 0, 0, []
    for scene in scenes(args.scenes, args.seed, "pixels", (1, 1), tint=0.0):
        delta = (image_tokens(model, processor, scene["image"]) - blank).norm(dim=-1)
        k = scene["cell"]  # the token whose cell holds the card's centre (`card_scenes.token_cell`)
        hits += int(delta.argmax()) == k
        covered += int(delta.argmax()) in covered_tokens(scene["card"])
        rest = torch.cat([delta[:k], delta[k + 1 :]])
        ratios.append(float(delta[k] / rest.median()))
    result = {
        "tokens": len(blank),
        "card_token_argmax": hits / args.scenes,
        "covered_token_argmax": covered / args.scenes,
        "card_over_rest": float(np.median(ratios)),
        "blank_spread": float(spread),
    }
    print(result)
    return result


if __name__ == "__main__":
    main()
