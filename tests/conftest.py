"""Session fixtures shared by the whole suite: the tiny offline model kit and its processor and CLIP verifier."""

import os
from pathlib import Path

import pytest
import torch

from tiny.kit import build_tiny_kit, kit_paths
from utils import models

# `make test` (and .ci/run) export these before Python starts: huggingface_hub reads them once, at import.
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")

torch.set_num_threads(2)


def pytest_configure(config):
    missing = [name for name in OFFLINE if os.environ.get(name) != "1"]
    if missing:
        raise pytest.UsageError(
            f"the test suite runs offline: {', '.join(missing)} must be 1 before Python starts. Run `make test`, or "
            f"`{' '.join(f'{name}=1' for name in OFFLINE)} .venv/bin/python -m pytest tests`."
        )


REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_DIR = REPO_ROOT / "outputs" / "tiny"


@pytest.fixture(scope="session")
def tiny_kit() -> dict[str, Path]:
    """Paths of the tiny kit in `outputs/tiny`, built once; like `make tiny`, rebuilt when one of its sources is newer
    than the `.built` stamp."""
    stamp = TINY_DIR / ".built"
    # The tokenizer is trained on the task's prompt and the tool's call format.
    sources = [REPO_ROOT / "tiny" / "kit.py", REPO_ROOT / "data" / "task.py", REPO_ROOT / "tools" / "zoom_in.py"]
    if not stamp.exists() or any(stamp.stat().st_mtime < src.stat().st_mtime for src in sources):
        build_tiny_kit(TINY_DIR)
        stamp.touch()
    return kit_paths(TINY_DIR)


@pytest.fixture(scope="session")
def tiny_processor(tiny_kit):
    """The tiny policy's processor, loaded as the recipes load it. Shared: copy it before mutating it."""
    return models.load_processor(tiny_kit["policy"])


@pytest.fixture(scope="session")
def tiny_clip(tiny_kit):
    """`(model, preprocess, tokenizer)` of the tiny CLIP verifier, loaded through `models.load_clip`."""
    return models.load_clip(tiny_kit["clip"])


def pytest_collection_modifyitems(config, items):
    """`gpu` tests need CUDA; on CPU-only machines (CI) they are skipped, with the reason shown by `-ra`."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
