"""Session fixtures shared by the whole suite (the tiny offline model kit, its processor and CLIP verifier), and the
fast lane's promise: a test that starts a process carries a marker (`slow`, `process`, `vllm` or `gpu`), checked at
run time.
The suite's layout (lanes, shared runs, markers): docs/testing.md."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from transformers import AutoConfig, PreTrainedModel, Qwen3_5Config, Qwen3_5MoeConfig
from transformers.initialization import TORCH_INIT_FUNCTIONS

from data.synthetic import build_synthetic
from tiny.kit import build_tiny_kit, kit_paths
from utils import models

# `make test` (and .ci/run) export these before Python starts: huggingface_hub reads them once, at import.
OFFLINE = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")

# One thread per core across pytest-xdist's workers (`make test` runs 2): OpenMP threads spin while they wait, so two
# workers of 2 threads each on 2 cores run many times slower, not as fast. Processes the tests start inherit the count.
# TEST_TORCH_THREADS overrides it: the thread count changes how torch blocks its reductions, so running a module with
# 1 and with the default shows which comparisons depend on the summation order (docs/testing.md, "Tolerances").
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = int(os.environ.get("TEST_TORCH_THREADS") or max(1, (os.cpu_count() or 2) // WORKERS))
torch.set_num_threads(THREADS)
os.environ["OMP_NUM_THREADS"] = str(THREADS)


def pytest_configure(config):
    missing = [name for name in OFFLINE if os.environ.get(name) != "1"]
    if missing:
        raise pytest.UsageError(
            f"the test suite runs offline: {', '.join(missing)} must be 1 before Python starts. Run `make test`, or "
            f"`{' '.join(f'{name}=1' for name in OFFLINE)} .venv/bin/python -m pytest tests`."
        )


# transformers' loaders swap these class and module attributes for empty functions while a model loads
# (initialization.no_init_weights / no_tie_weights, docs/internals.md "loader-swaps") and put back what they found,
# without a lock: two threads loading at once can leave the empty ones in place for the rest of the process. Seen once
# (a whole run on one worker): every later model built untied (the 3B on meta counted 4.07B parameters, its head twice)
# and, as silently, uninitialised. Each test must leave them as it found them; the guard names the test that did not.
LOADER_SWAPPED = {
    **{(PreTrainedModel, name): getattr(PreTrainedModel, name) for name in ("init_weights", "tie_weights")},
    **{(torch.nn.init, name): getattr(torch.nn.init, name) for name in TORCH_INIT_FUNCTIONS},
}


def loader_swaps_left() -> list[str]:
    """The attributes `LOADER_SWAPPED` names that no longer hold what they held when the suite started."""
    return [
        f"{owner.__name__}.{name}"
        for (owner, name), value in LOADER_SWAPPED.items()
        if getattr(owner, name) is not value
    ]


@pytest.fixture(autouse=True)
def loader_left_as_found():
    """Fails the test that leaves a loader swap in place, then puts the originals back so no later test inherits it."""
    yield
    left = loader_swaps_left()
    if left:
        for (owner, name), value in LOADER_SWAPPED.items():
            setattr(owner, name, value)
        pytest.fail(f"a model loader's swap was left in place (two loads at once in one process?): {', '.join(left)}")


REPO_ROOT = Path(__file__).resolve().parents[1]
TINY_DIR = REPO_ROOT / "outputs" / "tiny"


@pytest.fixture(scope="session")
def tiny_kit() -> dict[str, Path]:
    """Paths of the tiny kit in `outputs/tiny`, built once; like `make tiny`, rebuilt when one of its sources is newer
    than the `.built` stamp."""
    stamp = TINY_DIR / ".built"
    # The tokenizer is trained on the task's prompt and the tool's call format.
    sources = [REPO_ROOT / "tiny" / "kit.py", REPO_ROOT / "data" / "task.py", REPO_ROOT / "tools" / "zoom_in.py"]
    TINY_DIR.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(TINY_DIR.parent / "tiny.lock"):  # pytest-xdist workers: one builds, the others wait, then read
        if not stamp.exists() or any(stamp.stat().st_mtime < src.stat().st_mtime for src in sources):
            build_tiny_kit(TINY_DIR)
            stamp.touch()
    return kit_paths(TINY_DIR)


@pytest.fixture(scope="session")
def tiny_processor(tiny_kit):
    """The tiny policy's processor, loaded as the recipes load it. Shared: copy it before mutating it."""
    return models.load_processor(tiny_kit["policy"])


@pytest.fixture(scope="session")
def tiny_qwen3_vl_processor(tiny_kit):
    """The tiny Qwen3-VL's processor (16-pixel patches), loaded as the recipes load it. Shared: copy it before
    mutating it."""
    return models.load_processor(tiny_kit["qwen3_vl"])


@pytest.fixture(scope="session")
def tiny_clip(tiny_kit):
    """`(model, preprocess, tokenizer)` of the tiny CLIP verifier, loaded through `models.load_clip`."""
    return models.load_clip(tiny_kit["clip"])


# The files that hold the suite's longest runs, longest first (each file's minutes in a whole `make test`:
# docs/testing.md). `make test` hands whole files to its two workers in collection order (`--no-loadscope-reorder`;
# xdist would otherwise order them by test count), so these start first, side by side, and the short files fill in
# after them, instead of one long file starting last and running alone.
LONGEST_FIRST = (
    "tests/test_vllm_server.py",
    "tests/test_vllm.py",
    "tests/research/test_experiment.py",
    "tests/test_multiprocess.py",
    "tests/test_mapo_trainer.py",
    "tests/test_demo.py",
    "tests/test_reproduce_tiny.py",
    "tests/test_hpo_trainer.py",
    "tests/test_hostile_completions.py",
    "tests/test_hostile_evaluation.py",
)


def pytest_collection_modifyitems(config, items):
    """The files in `LONGEST_FIRST` first (the sort is stable: every file keeps its own order); `gpu` tests need
    CUDA, and on CPU-only machines (CI) they are skipped, with the reason shown by `-ra`."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A test that starts a process (a launch, an engine, a subprocess of any kind) carries one of these; the fast lane,
# `make test-fast`, runs the tests that carry none.
PROCESS_MARKERS = ("slow", "process", "vllm", "gpu")


@pytest.fixture(autouse=True)
def _unmarked_tests_start_no_process(request, monkeypatch):
    """The fast lane's promise, checked rather than trusted: an unmarked test that starts a process fails, naming
    itself and the command."""
    if any(request.node.get_closest_marker(name) for name in PROCESS_MARKERS):
        return

    start = subprocess.Popen.__init__

    def refuse(self, args, *rest, **kwargs):
        # Only what the repo's own code starts: a library's helper process (platform runs `file` for cpuinfo) is not
        # a launch. The first caller outside `subprocess` tells whose it is.
        frame = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename == subprocess.__file__:
            frame = frame.f_back
        caller = Path(frame.f_code.co_filename).resolve() if frame is not None else None
        if caller is not None and caller.is_relative_to(REPO_ROOT) and ".venv" not in caller.parts:
            raise AssertionError(
                f"{request.node.nodeid} starts a process ({args!r}): mark it `process` (quick) or `slow`, see docs/testing.md"
            )
        start(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)


_SESSION_START = time.monotonic()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The suite's wall time on its own line, so its growth is seen in every CI log (budget: docs/testing.md)."""
    minutes = (time.monotonic() - _SESSION_START) / 60
    markers = config.getoption("markexpr") or "all tests"
    terminalreporter.write_line(f"suite wall time: {minutes:.1f} min ({markers})")


@pytest.fixture(autouse=True)
def transformers_own_qwen3_5_configs(request):
    """vLLM's import registers its own `qwen3_5` config classes in AutoConfig for the whole process
    (vllm/transformers_utils/config.py, `_register_config_class`: `AutoConfig.register(..., exist_ok=True)`, vLLM
    0.31); its vision config lacks transformers' `attribute_map`, so transformers' Qwen3.5 cannot be built from it. Every
    test but a vLLM one gets transformers' own back, whatever ran before it in the worker, so a test reading AutoConfig
    directly sees transformers' classes. Production does not rely on the registry: it builds every model from
    `utils.models.native_config` (tests/test_native_config.py)."""
    if request.node.get_closest_marker("vllm") is None:
        for model_type, config in (("qwen3_5", Qwen3_5Config), ("qwen3_5_moe", Qwen3_5MoeConfig)):
            AutoConfig.register(model_type, config, exist_ok=True)
    yield


@pytest.fixture(scope="module")
def synthetic_dir(tmp_path_factory):
    """Four synthetic test rows (448-640 px images) saved as every stage reads them, once per test module: the
    evaluation runs' data."""
    path = tmp_path_factory.mktemp("data") / "synthetic"
    build_synthetic(4, seed=0, split="test", min_size=448, max_size=640).save_to_disk(path)
    return path
