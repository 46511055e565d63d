"""Datasets by name, so a recipe picks its data with one string (`dataset_name: synthetic`) plus keyword arguments;
every builder returns rows of `data.rows.TASK_FEATURES`. `load_split` is how the entry scripts read a recipe's data;
`prompts_in_box_convention` gives its prompts the system turn of the run's box convention."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Sequence
from typing import Any

import datasets

from data.benchmarks import load_benchmark, load_saved_split
from data.synthetic import build_synthetic
from data.task import in_box_convention
from tools import DEFAULT_TOOLS

DATASETS: dict[str, Callable[..., datasets.Dataset]] = {
    "synthetic": build_synthetic,
    # benchmark and RL-set readers: `get_dataset(name, path=..., split=..., skip_bad_rows=False)`
    **{
        name: functools.partial(load_benchmark, name)
        for name in ("vstar", "hrbench", "mme_realworld", "deepeyes", "mini_o3", "cof_rl")
    },
}


def get_dataset(name: str, **kwargs) -> datasets.Dataset:
    """Build the dataset registered as `name` with `kwargs`; an unknown name fails with the list of known ones."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known: {sorted(DATASETS)}")
    return DATASETS[name](**kwargs)


def synthetic_world(script_args: Any) -> dict[str, Any]:
    """`build_synthetic`'s world keywords from a recipe's `synthetic_*` fields (a `configs.ScriptArguments`): the one
    mapping from recipe to synthetic world, used by SFT, RL and the demo alike."""
    return {
        "min_size": script_args.synthetic_image_size[0],
        "max_size": script_args.synthetic_image_size[1],
        "object_fraction": tuple(script_args.synthetic_object_fraction),
        "question_types": tuple(script_args.synthetic_question_types),
        "region_hint": script_args.synthetic_region_hint,
    }


def load_split(script_args: Any, split: str) -> datasets.Dataset:
    """One split of the recipe's dataset (a `configs.ScriptArguments`): from a `save_to_disk` folder, or built by a
    registered builder from each of `dataset_path`'s files in turn, concatenated."""
    name = script_args.dataset_name
    if os.path.isdir(name):
        return load_saved_split(name, split)
    if name == "synthetic":
        return get_dataset(
            name, n=script_args.num_samples, seed=script_args.dataset_seed, split=split, **synthetic_world(script_args)
        )
    paths = script_args.dataset_path
    if isinstance(paths, str | os.PathLike) or paths is None:
        return get_dataset(name, path=paths, split=split)
    parts = [get_dataset(name, path=path, split=split) for path in paths]  # DeepEyes-47k ships three files
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def prompts_in_box_convention(dataset: Any, box_convention: str, tools: Sequence[str] = DEFAULT_TOOLS) -> Any:
    """`dataset` with each row's `prompt` saying `box_convention`'s frame and the run's `tools` in its system turn
    (`data.task.in_box_convention`). A `Dataset` has only its `prompt` column replaced (its images are not rewritten); an
    `IterableDataset` is mapped lazily; a dict of them (TRL's several eval sets), each; None, or a dataset without a
    `prompt` column, is returned as it is."""
    if isinstance(dataset, dict):
        return {name: prompts_in_box_convention(split, box_convention, tools) for name, split in dataset.items()}
    if dataset is None or "prompt" not in (dataset.column_names or ()):
        return dataset
    if isinstance(dataset, datasets.Dataset):
        prompts = list(dataset["prompt"])
        converted = [in_box_convention(prompt, box_convention, tools) for prompt in prompts]
        if converted == prompts:
            return dataset
        feature = dataset.features["prompt"]
        return dataset.remove_columns("prompt").add_column("prompt", converted, feature=feature)
    convert = lambda prompt: {"prompt": in_box_convention(prompt, box_convention, tools)}  # noqa: E731
    return dataset.map(convert, input_columns="prompt")
