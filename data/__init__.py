"""Datasets by name, so a recipe picks its data with one string (`dataset_name: synthetic`) plus keyword arguments.

Every builder returns a `datasets.Dataset` with the columns the trainers and evaluation read: `prompt`
(conversational, from `task.build_prompt`), `image`, `answer`, `options` (empty for open questions), `target_bbox`,
`target_label`, `source` and `id`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import datasets

from data.benchmarks import load_benchmark
from data.synthetic import build_synthetic

DATASETS: dict[str, Callable[..., datasets.Dataset]] = {
    "synthetic": build_synthetic,
    # benchmark and DeepEyes readers: `get_dataset(name, path=..., split=..., skip_bad_rows=False)`
    **{name: functools.partial(load_benchmark, name) for name in ("vstar", "hrbench", "mme_realworld", "deepeyes")},
}


def get_dataset(name: str, **kwargs) -> datasets.Dataset:
    """Build the dataset registered as `name` with `kwargs`; an unknown name fails with the list of known ones."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}")
    return DATASETS[name](**kwargs)
