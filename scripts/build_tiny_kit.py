"""Build the tiny offline model kit (`tiny.kit`) that tests, CI and the demo run on: `make tiny`.

python -m scripts.build_tiny_kit --output_dir outputs/tiny [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tiny.kit import build_tiny_kit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/tiny"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for name, path in build_tiny_kit(args.output_dir, args.seed).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
