"""Train the tiny CLIP verifier on synthetic (crop, referent label) pairs (`tiny.clip`): `make clip`.

python -m scripts.train_clip --output_dir outputs/tiny/clip_trained --steps 300
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from tiny.clip import KIT_CLIP, train_clip
from tools.config import CLIP_RESIZE


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, required=True)
    parser.add_argument("--init", type=Path, default=KIT_CLIP, help="CLIP to start from")
    parser.add_argument("--seconds", type=float, default=60.0, help="training time budget (ignored with --steps)")
    parser.add_argument("--steps", type=int, default=None, help="train for exactly this many steps (reproducible)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=4e-3, help="peak learning rate")
    parser.add_argument(
        "--clip_resize", choices=CLIP_RESIZE, default="pad", help="how crops fit CLIP's input: the RL recipe's value"
    )
    args = parser.parse_args()
    metrics = train_clip(
        args.output_dir,
        init=args.init,
        seconds=args.seconds,
        steps=args.steps,
        seed=args.seed,
        lr=args.lr,
        resize=args.clip_resize,
    )
    print(json.dumps(metrics, indent=2))


if __name__ == "__main__":
    main()
