"""The tiny offline model kit, importable by its old name: it lives in `tiny/kit.py`."""

from tiny.kit import *  # noqa: F403
from tiny.kit import build_tiny_kit, kit_paths

__all__ = ["build_tiny_kit", "kit_paths"]
