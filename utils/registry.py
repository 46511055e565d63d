"""What a recipe picks by string (`reward_funcs`, `semantic_verifier`): a registered name, or an import path
`package.module:name` imported when the recipe is parsed, so code outside the repo (and `research/`, which runs
`rl.py` as a subprocess) plugs in without editing it. `reads_columns` declares the dataset columns one reads, so a
dataset that lacks one fails at start."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import TypeVar

T = TypeVar("T", bound=Callable)


def reads_columns(*columns: str) -> Callable[[T], T]:
    """Mark a reward function or a verifier factory with the dataset columns it reads besides TRL's `prompt`
    (`required_columns`, read by `rewards.check_columns`)."""

    def mark(obj: T) -> T:
        obj.required_columns = tuple(columns)
        return obj

    return mark


def required_columns(obj: object) -> tuple[str, ...]:
    """The columns `obj` declared with `reads_columns` (none if it declared nothing)."""
    return tuple(getattr(obj, "required_columns", ()))


def resolve(spec: str, registry: Mapping[str, T], field: str) -> T:
    """`registry[spec]`, or the callable an import path `package.module:name` names (`name` may be dotted); a
    `ValueError` naming the recipe `field` and what is wrong otherwise."""
    if spec in registry:
        return registry[spec]
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(
            f"{field}: unknown {spec!r}; known: {sorted(registry)}, or an import path 'package.module:name'"
        )
    try:
        obj = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"{field}: {spec!r}: module {module_name!r} does not import ({error})") from error
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{field}: {spec!r}: {obj.__name__!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{field}: {spec!r} is a {type(obj).__name__}, not a function or class")
    return obj
