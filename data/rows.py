"""The row schema, in one place: the columns every dataset row has (`ROW_FEATURES`), a task row's (synthetic,
benchmarks, RL sets: `TASK_FEATURES`) and a converted SFT trajectory's (`python -m data.convert`: `Trajectory`, saved
as `TRAJECTORY_FEATURES` by `as_row`); and a downloaded file's rows before they are validated into it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import datasets
import numpy as np
import pyarrow.parquet as pq
from PIL import Image

from data.task import build_prompt

ROW_FEATURES = {
    "id": datasets.Value("string"),
    "source": datasets.Value("string"),
    "prompt": datasets.List({"role": datasets.Value("string"), "content": datasets.Value("string")}),
    "image": datasets.Image(),
    "answer": datasets.Value("string"),
    "options": datasets.List(datasets.Value("string")),
}
# A task row has one target: its box in original pixels and its label.
TASK_FEATURES = datasets.Features(
    {
        **ROW_FEATURES,
        "target_bbox": datasets.List(datasets.Value("int32"), length=4),
        "target_label": datasets.Value("string"),
    }
)
# A converted trajectory has, in place of a target, its calls and the thought before its answer.
TRAJECTORY_FEATURES = datasets.Features(
    {
        **ROW_FEATURES,
        "gold_calls": datasets.List(
            {
                "box": datasets.List(datasets.Value("int32"), length=4),
                "thought": datasets.Value("string"),
                "label": datasets.Value("string"),
                "label_source": datasets.Value("string"),
            }
        ),
        "final_thought": datasets.Value("string"),
    }
)


@dataclass
class Trajectory:
    """One converted row, and what its conversion checked (the counts `stats.json` sums)."""

    id: str
    source: str
    image: Image.Image
    question: str
    answer: str
    calls: list[dict] = field(default_factory=list)  # `gold_calls`: box (original pixels), thought, label, its source
    final_thought: str = ""
    options: list[str] = field(default_factory=list)
    crops_checked: int = 0  # calls whose crop was checked against the release's own (all of them)
    content_checked: int = 0  # of those, the ones large enough to compare by content, not by aspect alone
    failed_calls: int = 0  # calls (or code turns that raised) after which the release shows no image: dropped
    release_crops: list[tuple[int, int]] = field(default_factory=list)  # each call's crop as the release ships it
    image_bytes: bytes | None = None  # `image` as the release encodes it: saved as is, never decoded and re-encoded
    reading: str = ""  # the reading of an uncertain convention the row's crops chose (`crop_check.Readings`), if any


def as_row(trajectory: Trajectory) -> dict:
    """A `Trajectory` as a dataset row (`TRAJECTORY_FEATURES`)."""
    return {
        "id": trajectory.id,
        "source": trajectory.source,
        "prompt": build_prompt(trajectory.question, trajectory.options),
        "image": {"bytes": trajectory.image_bytes, "path": None} if trajectory.image_bytes else trajectory.image,
        "answer": trajectory.answer,
        "options": list(trajectory.options),
        "gold_calls": [{**call, "box": list(call["box"])} for call in trajectory.calls],
        "final_thought": trajectory.final_thought,
    }


def percentiles(values) -> dict[str, float]:
    """min, p50, p90, p99 and max of per-row counts (numpy's linear interpolation), as the stats files give them; {}
    for none."""
    if not len(values):
        return {}
    points = np.percentile(np.asarray(values, dtype=np.float64), [0, 50, 90, 99, 100])
    return {name: round(float(v), 1) for name, v in zip(("min", "p50", "p90", "p99", "max"), points, strict=True)}


def parquet_records(path: Path) -> Iterator[dict]:
    """The records of a parquet file, one row group at a time: releases and benchmarks embed their images. Not
    `iter_batches`, whose read-ahead held ~1.7 MB a row of a 400-row release of 0.65 MB JPEGs (docs/benchmarks.md,
    "Converting a release"); one row group read without threads or pre-buffering stays bounded."""
    file = pq.ParquetFile(path, pre_buffer=False)
    for group in range(file.num_row_groups):
        for batch in file.read_row_group(group, use_threads=False).to_batches(max_chunksize=64):
            yield from batch.to_pylist()


class BadRowError(ValueError):
    """A benchmark or RL-set row that cannot be used. The message names the file, the row and the field to fix."""

    def __init__(self, file: str | os.PathLike, row: int, field: str, reason: str):
        self.file, self.row, self.field, self.reason = str(file), row, field, reason
        super().__init__(f"{file}: row {row}: field {field!r}: {reason}")


class RawRow(NamedTuple):
    """One row of a downloaded file as read, before validation (`data.benchmarks`): `values` uses our column names,
    `fields` maps them to the file's."""

    file: Path
    row: int
    values: dict[str, Any]
    fields: dict[str, str]


def expect_file(path: Path, what: str) -> Path:
    if not path.exists():
        raise FileNotFoundError(f"{path} not found; expected {what}")
    return path
