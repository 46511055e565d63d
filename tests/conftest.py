"""Session fixtures shared by the whole suite: the tiny offline model kit and its processor and CLIP verifier."""

import os

# Before anything imports huggingface_hub, which reads these once, at import time.
for _key, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}.items():
    os.environ.setdefault(_key, _value)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import models  # noqa: E402
from tiny_models import build_tiny_kit, kit_paths  # noqa: E402

torch.set_num_threads(2)

REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_DIR = REPO_ROOT / "outputs" / "tiny"


@pytest.fixture(scope="session")
def tiny_kit() -> dict[str, Path]:
    """Paths of the tiny kit in `outputs/tiny`, built once; like `make tiny`, rebuilt when `tiny_models.py` or
    `task.py` is newer than the `.built` stamp."""
    stamp = TINY_DIR / ".built"
    sources = [REPO_ROOT / "tiny_models.py", REPO_ROOT / "task.py"]  # the tokenizer is trained on task.py's prompt
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
