"""The inputs of `make reproduce`'s plan (scripts/reproduce.py): every DATA_ROOT path a stage still to run reads, checked
before the first stage starts: there (else named with the release and the download that fills it), and readable
(`unreadable_inputs`: no Git LFS pointer in place of a file, every parquet footer, a first row and its image read as
the stage will read them). A plan stops on either before anything runs, not at stage 11 of 16."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from data.benchmarks import BENCHMARKS, first_row
from data.converters import FORMATS
from data.converters.common import SkipRow
from evaluation.agent import open_image
from evaluation.reproduce_state import Stage, script_end
from tools import ToolConfig
from utils.recipes import flag_values

LFS_POINTER = b"version https://git-lfs.github.com/spec/v1"  # how every Git LFS pointer file begins
MAX_FILES = 100_000  # files looked at under one input folder (a release's shards and images; V*'s ~400)
SAMPLE_ROWS = 20  # rows of a release read for one that converts (the others may be skipped by design)
FILE_READERS = tuple(name for name in BENCHMARKS if name != "synthetic")  # the readers of downloaded files


def missing_inputs(stages: list[Stage], states: dict[str, str]) -> list[str]:
    """The DATA_ROOT paths the stages still to run read and that do not exist, each with the release to put there."""
    seen, lines = set(), []
    for s in stages:
        for path, release in s.inputs.items():
            if states[s.name] != "done" and not path.exists() and path not in seen:
                seen.add(path)
                lines.append(
                    f"  {path}  <- {release}: hf download {release} --repo-type dataset "
                    f"--local-dir {data_folder(path, release)}"
                )
    return lines


def data_folder(path: Path, release: str) -> Path:
    """The folder a release downloads into: the path's first part under DATA_ROOT named after it."""
    name = release.split("/")[-1]
    return next((p for p in [path, *path.parents] if p.name == name), path)


def unreadable_inputs(stages: list[Stage], states: dict[str, str]) -> list[str]:
    """Every input a stage still to run reads, opened before the first stage: no file under it a Git LFS pointer (a
    clone made without `git lfs pull`), every parquet file's footer read, and its first row read as the stage reads
    it, image decoded (a benchmark's and the RL data's through their readers, the cold start's through its
    converter). One line per input that fails, naming the file and what is wrong, with its release."""
    seen, lines = set(), []
    for s in stages:
        if states[s.name] == "done":
            continue
        for path, release in s.inputs.items():
            if path in seen or not path.exists():  # missing: `missing_inputs` names it
                continue
            seen.add(path)
            problem = file_problem(path) or sample_problem(s, path)
            if problem is not None:
                lines.append(f"  {problem}  <- {release}")
    return lines


def lfs_pointer(path: Path) -> bool:
    """Whether `path` is a Git LFS pointer file: the few lines a clone without `git lfs pull` leaves for the file."""
    try:
        with path.open("rb") as file:
            return file.read(len(LFS_POINTER)) == LFS_POINTER
    except OSError:
        return False


def file_problem(path: Path) -> str | None:
    """What is wrong with the files of an input (a file, or a folder's first `MAX_FILES`): a Git LFS pointer, or a
    parquet file whose footer does not read."""
    files = (
        [path] if path.is_file() else sorted(p for p in itertools.islice(path.rglob("*"), MAX_FILES) if p.is_file())
    )
    for file in files:
        if lfs_pointer(file):
            return (
                f"{file}: a Git LFS pointer ({file.stat().st_size} bytes), not the file: run `git lfs pull` in its "
                "clone, or download the release with hf download"
            )
        if file.suffix == ".parquet":
            try:
                pq.read_metadata(file)
            except (OSError, pa.ArrowException) as err:
                return f"{file}: not a readable parquet file ({type(err).__name__}: {str(err)[:200]})"
    return None


def sample_problem(s: Stage, path: Path) -> str | None:
    """What is wrong with the first row of an input, read as stage `s` reads it (its `--benchmark` or `--dataset_name`
    reader, or its converter `--format`) and its image decoded; None for a stage that reads no rows of it."""
    flags = flag_values(s.argv[script_end(s.argv) :])
    reader = flags.get("benchmark") or flags.get("dataset_name")
    try:
        if isinstance(reader, str) and reader in FILE_READERS:
            open_image(first_row(reader, path)["image"])
        elif flags.get("format") in FORMATS:
            return converted_sample(flags["format"], path)
    except (OSError, ValueError, Image.DecompressionBombError) as err:  # BadRowError and LayoutError are ValueErrors
        return f"{path}: its first row does not read: {type(err).__name__}: {str(err)[:300]}"
    return None


def converted_sample(fmt: str, path: Path) -> str | None:
    """A release's first row that converts, its image decoded; a file the converter cannot read is named. Rows skipped
    for what they hold (too many calls, a crop that differs) are the conversion's to count, not a broken input."""
    for item in itertools.islice(FORMATS[fmt](path, ToolConfig()), SAMPLE_ROWS):
        if isinstance(item, SkipRow):
            if item.reason == "unreadable_file":
                return f"{item.where}: {item}"
            continue
        item.image.load()
        return None
    return None
