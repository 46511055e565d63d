"""Recipes (recipes/README.md): `--config recipe.yaml` with the bases it names (`base:`), the command line over it
and the starting checkpoint's record (`tool_config.json`) under both; the merged recipe each run saves. Every entry
script parses with `parse_args_and_record`, so SFT, RL and evaluation read a recipe the same way."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import trl
import yaml

from tools import PixelBudget, ToolConfig, read_record, record_mismatches, refuse_mismatch, warn_on_mismatch
from tools.config import FAMILY_TOOL_SETTINGS
from utils.checks import check_family
from utils.models import model_type

logger = logging.getLogger(__name__)


BASE_KEY = "base"
RESOLVED_RECIPE_NAME = "recipe.yaml"
# The real RL recipes' shared base: the pixel budgets the trained models run under.
REAL_RECIPE_BASE = Path(__file__).resolve().parent.parent / "recipes" / "mapo_paper.yaml"
QWEN_MIN_PIXELS, QWEN_FACTOR = 56 * 56, 28  # Qwen2.5-VL's image processor: min_pixels, patch 14 x merge 2


def real_recipe_budget(
    max_pixels: int | None = None, crop_min_pixels: int | None = None
) -> tuple[ToolConfig, PixelBudget]:
    """The tool and pixel budget of the real RL recipes (`recipes/mapo_paper.yaml`) at Qwen2.5-VL's min pixels and
    factor, for replaying calls outside a run at the sizes training shows; `max_pixels` and `crop_min_pixels` replace
    the recipes', and `max_pixels` caps the crops' (ceiling and floor)."""
    recipe = yaml.safe_load(REAL_RECIPE_BASE.read_text(encoding="utf-8"))
    pixels = max_pixels or recipe["max_pixels"]
    crop_max = min(recipe["crop_max_pixels"], pixels)
    crop_min = crop_min_pixels or recipe.get("crop_min_pixels")
    crop_min = crop_min and min(crop_min, crop_max)
    tool = ToolConfig(max_pixels=pixels, crop_max_pixels=crop_max, crop_min_pixels=crop_min)
    return tool, PixelBudget(QWEN_MIN_PIXELS, pixels, QWEN_FACTOR)


@dataclass
class Recipe:
    """A recipe with its bases merged: `values` as TrlParser reads them, and which file set each one."""

    path: Path
    values: dict[str, Any]
    origin: dict[str, Path]
    files: list[Path]  # every file read, bases first, in the order they were merged


def load_recipe(path: str | os.PathLike) -> Recipe:
    """Read a recipe YAML and the base recipes it names, merged into one flat mapping.

    `base: <file>` or `base: [<file>, ...]`, relative to the recipe: the bases are read first, in order (each with its
    own bases), and every key the recipe sets replaces the base's value whole (lists and mappings are not merged). A
    missing base file or a cycle fails with the chain that led to it.
    """
    return _load_recipe(Path(path), ())


def _load_recipe(path: Path, chain: tuple[Path, ...]) -> Recipe:
    if path.resolve() in (p.resolve() for p in chain):
        raise ValueError(f"recipe bases form a cycle: {' -> '.join(map(str, (*chain, path)))}")
    if not path.is_file():
        named_by = f" (named by `{BASE_KEY}:` in {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"recipe {path} does not exist{named_by}")
    values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(values, dict):
        raise ValueError(f"recipe {path} must be a YAML mapping of field: value, got {type(values).__name__}")
    bases = values.pop(BASE_KEY, None)
    bases = [bases] if isinstance(bases, str) else bases if bases is not None else []
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise ValueError(f"{path}: `{BASE_KEY}:` must be a recipe file or a list of them, got {bases!r}")
    merged, origin, files = {}, {}, []
    for base in bases:
        parent = _load_recipe(Path(os.path.normpath(path.parent / base)), (*chain, path))
        merged.update(parent.values)
        origin.update(parent.origin)
        files += parent.files
    merged.update(values)
    origin.update(dict.fromkeys(values, path))
    return Recipe(path, merged, origin, list(dict.fromkeys([*files, path])))


def flag_values(flags: Sequence[str]) -> dict[str, Any]:
    """The recipe fields a command line's `--key value ...` flags set (`--key=value` too; a flag followed by another
    flag or by nothing is `true`; several values make a list), typed as YAML and JSON read them: what the entry
    scripts' parser will set, for readers of a recipe that do not parse it (the reproduction's plan and report, the
    memory estimate)."""
    values: dict[str, Any] = {}
    key = None
    for flag in flags:
        if flag.startswith("--"):
            key, sep, value = flag[2:].partition("=")
            values[key] = _typed(value) if sep else True
            if sep:
                key = None
        elif key is not None:
            given = values[key]
            values[key] = (
                _typed(flag) if given is True else [*(given if isinstance(given, list) else [given]), _typed(flag)]
            )
    return values


def _typed(value: str) -> Any:
    """A command-line value as the recipe parser reads it: JSON first (`2e-6` is a float there, a string in YAML)."""
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return yaml.safe_load(value)


def format_recipe(recipe: Recipe, header: Sequence[str] = ()) -> str:
    """The merged recipe as one flat YAML file, its keys grouped by the file that set them: what a run really used,
    rerunnable with `--config` on its own (it names no base)."""
    lines = [f"# {line}" for line in header]
    for source in recipe.files:
        keys = {k: v for k, v in recipe.values.items() if recipe.origin[k] == source}
        if keys:
            lines += ["", f"# from {source}"]
            for key, value in keys.items():  # one line per key; lists and mappings of scalars inline, as written
                flow = None if isinstance(value, list | dict) else False
                lines.append(yaml.safe_dump({key: value}, sort_keys=False, default_flow_style=flow).rstrip())
    return "\n".join(lines) + "\n"


class RecipeParser(trl.TrlParser):
    """`TrlParser` whose `--config` recipe may name base recipes (`load_recipe`); everything else is TRL's."""

    def parse_args_and_config(self, args: Iterable[str] | None = None, **kwargs) -> tuple:
        args = list(sys.argv[1:] if args is None else args)
        if "--config" not in args:
            return super().parse_args_and_config(args, **kwargs)
        index = args.index("--config")
        recipe = load_recipe(args[index + 1])
        del args[index : index + 2]
        values = dict(recipe.values)
        env = values.pop("env", {})  # as TrlParser: the recipe's `env` mapping goes into os.environ
        if not isinstance(env, dict):
            raise ValueError(f"{recipe.path}: `env` must be a mapping of variable: value")
        os.environ.update({key: str(value) for key, value in env.items()})
        unknown = self.set_defaults_with_config(**values)[::2]  # ["--key", "value", ...]
        if unknown:
            where = ", ".join(f"{key[2:]} (set in {recipe.origin[key[2:]]})" for key in unknown)
            raise ValueError(
                f"Unknown arguments from config file {recipe.path}: {where}; no dataclass of this script has them."
            )
        return super().parse_args_and_config(args, **kwargs)


def parse_args_and_record(
    dataclass_types: Iterable[type],
    argv: Sequence[str] | None = None,
    *,
    save_recipe: bool = False,
    unrecorded: str | os.PathLike | None = None,
    unrecorded_keys: Sequence[str] = (),
) -> tuple:
    """`TrlParser(dataclass_types).parse_args_and_config(argv)`, with recipe bases and the starting checkpoint's
    record as defaults.

    Precedence: the command line; the recipe (`--config`, bases merged: `load_recipe`); the record of the checkpoint
    `model_name_or_path` names (`tool_config.json`: its tool settings and, after RL, its rollout budget); for the
    `unrecorded_keys` the record lacks, their values in the recipe `unrecorded` (logged); the model family's own
    `box_convention` and `accept_img_idx` (`_family_settings`); the dataclass defaults. A value that differs from the
    record warns with both values (`box_convention` fails instead: `tools.config.refuse_mismatch`). With
    `save_recipe`, the first process writes the merged recipe and the command line to `<output_dir>/recipe.yaml`.
    """
    dataclass_types = tuple(dataclass_types)
    argv = list(sys.argv[1:] if argv is None else argv)
    parsed = RecipeParser(dataclass_types).parse_args_and_config(list(argv))
    checkpoint = next(p.model_name_or_path for p in parsed if hasattr(p, "model_name_or_path"))
    record = read_record(checkpoint)
    recorded = {} if record is None else {**record["tool"], **record["rollout"]}
    fallback = {}
    if unrecorded is not None:
        recipe_values = load_recipe(unrecorded).values
        fallback = {k: recipe_values[k] for k in unrecorded_keys if k in recipe_values and recorded.get(k) is None}
    family = _family_settings(dataclass_types, argv, checkpoint, recorded)
    fallback = family | fallback
    if recorded or fallback:
        parser = RecipeParser(dataclass_types)
        parser.set_defaults_with_config(**fallback, **recorded)  # keys no dataclass has are ignored
        parsed = parser.parse_args_and_config(list(argv))
        values = {name: value for p in parsed for name, value in vars(p).items()}
        if record is not None:
            mismatches = record_mismatches(record, values)
            refuse_mismatch(checkpoint, mismatches)  # the box convention: an error at start, naming both values
            warn_on_mismatch(checkpoint, mismatches)
        taken = {k: v for k, v in fallback.items() if values.get(k) == v and k not in family}
        if taken:
            logger.warning(
                "%s has no training record of %s: using %s's (%s)",
                checkpoint,
                ", ".join(taken),
                unrecorded,
                ", ".join(f"{k}={v}" for k, v in taken.items()),
            )
    if "--config" in argv:
        recipe = load_recipe(argv[argv.index("--config") + 1])
        if len(recipe.files) > 1:
            logger.info("recipe %s: merged from (last wins) %s", recipe.path, ", ".join(map(str, recipe.files)))
        output_dir = next((p.output_dir for p in parsed if hasattr(p, "output_dir")), None)
        if save_recipe and output_dir and int(os.environ.get("RANK", "0")) == 0:
            save_resolved_recipe(recipe, output_dir, argv)
    return parsed


def _family_settings(
    dataclass_types: Sequence[type], argv: Sequence[str], checkpoint: str | None, recorded: dict[str, Any]
) -> dict[str, Any]:
    """The model family's own tool settings (`tools.config.FAMILY_TOOL_SETTINGS`) for those neither the command line,
    the recipe nor the checkpoint's record sets, logged. A command line or recipe that sets another `box_convention`
    than the family's warns, naming both: a model not trained to it writes its family's convention all the same. A
    model of a family the repo does not support fails here, for every entry script (`utils.checks.check_family`);
    one whose config cannot be read (offline, no shipped copy) is logged and takes the defaults."""
    known = {f.name for cls in dataclass_types for f in fields(cls)}
    if checkpoint is None or "box_convention" not in known:
        return {}
    kind = model_type(checkpoint)
    if kind is not None:
        check_family(checkpoint, kind)
    own = FAMILY_TOOL_SETTINGS.get(kind, {})
    recipe = load_recipe(argv[argv.index("--config") + 1]) if "--config" in argv else None
    taken = {}
    for name in FAMILY_TOOL_SETTINGS["qwen3_vl"]:
        flag = next((i for i, a in enumerate(argv) if a == f"--{name}" or a.startswith(f"--{name}=")), None)
        if flag is not None or (recipe is not None and name in recipe.values):
            if name == "box_convention" and name in own:
                given, where = (
                    (argv[flag].split("=", 1)[1] if "=" in argv[flag] else argv[flag + 1], "the command line")
                    if flag is not None
                    else (recipe.values[name], f"recipe {recipe.origin[name]}")
                )
                if given != own[name]:
                    warnings.warn(
                        f"box_convention: {where} sets {given!r} for {checkpoint}, a {kind} model, whose own "
                        f"convention is {own[name]!r}; a model not trained to write boxes in {given!r} will write "
                        f"them in {own[name]!r}",
                        stacklevel=3,
                    )
        elif name in own and name not in recorded:
            taken[name] = own[name]
        elif name not in recorded:
            logger.warning(
                "%s: no recipe, command line or record of %s sets it and its config cannot be read (offline, no "
                "copy under recipes/model_configs/): the default",
                name,
                checkpoint,
            )
    if taken:  # a warning where the family's value is not the dataclass default it would otherwise have had
        defaults = {f.name: f.default for cls in dataclass_types for f in fields(cls) if f.name in taken}
        level = logging.INFO if all(defaults[name] == value for name, value in taken.items()) else logging.WARNING
        logger.log(
            level,
            "no recipe, command line or record of %s sets %s: its family's own (model_type %s)",
            checkpoint,
            ", ".join(f"{name}={value!r}" for name, value in taken.items()),
            kind,
        )
    return taken


def save_resolved_recipe(recipe: Recipe, output_dir: str | os.PathLike, argv: Sequence[str]) -> Path:
    """`<output_dir>/recipe.yaml`: the merged recipe, and the command line that ran it, for reproducing the run."""
    path = Path(output_dir) / RESOLVED_RECIPE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    script = os.path.basename(sys.argv[0]) or "python"
    header = [
        f"The recipe {script} ran: {recipe.path}, merged from (last wins) {', '.join(map(str, recipe.files))}.",
        f"Command line: {script} {' '.join(argv)}",
        f"Rerun: {script} --config {path} <the command line's flags but --config>",
    ]
    path.write_text(format_recipe(recipe, header), encoding="utf-8")
    return path
