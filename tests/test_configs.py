"""Every recipe dataclass is findable from `configs` (`RECIPE_DATACLASSES`), and the fields composed into
`MAPOConfig` from their own dataclasses (HPO's, the gradient probes') still parse from the same flat recipe keys."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from trl import ModelConfig

import configs
from configs import RECIPE_DATACLASSES, MAPOConfig, ScriptArguments
from hpo.config import HPOArguments
from tools import ToolConfig
from utils.probes import GradientProbeArguments
from utils.recipes import parse_args_and_record

REPO = Path(__file__).resolve().parents[1]


def parsed_tuples() -> set[str]:
    """The names of the dataclasses the entry scripts hand `parse_args_and_record`, read from their source."""
    names = set()
    for script in ("rl.py", "sft.py", "evaluate.py"):
        for node in ast.walk(ast.parse((REPO / script).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "parse_args_and_record":
                names |= {element.id for element in node.args[0].elts}
    return names


def test_every_dataclass_a_recipe_sets_is_findable_from_configs():
    assert parsed_tuples() == {
        "ScriptArguments", "MAPOConfig", "ModelConfig", "ToolConfig", "SFTConfig", "TrajectoryArguments",
        "EvalArguments",
    }  # fmt: skip
    ours = [getattr(configs, name) for name in parsed_tuples() - {"ModelConfig"}]  # TRL's own
    composed = {
        base for cls in ours for base in cls.__mro__ if dataclasses.is_dataclass(base) and base.__module__.split(".")[0]
        in {"configs", "tools", "rewards", "data", "hpo", "utils"}
    }  # fmt: skip
    assert composed <= set(RECIPE_DATACLASSES), sorted(c.__name__ for c in composed - set(RECIPE_DATACLASSES))
    assert {GradientProbeArguments, HPOArguments} <= set(MAPOConfig.__mro__)


def test_the_composed_fields_parse_from_their_flat_keys(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"output_dir: {tmp_path / 'out'}\nuse_cpu: true\nhpo_omega: 0.25\nhpo_solver: geomloss\n"
        "variance_probe_steps: 3\ngradient_variance_batches: 4\nsemantic_beta: 0.2\ntools: [zoom_in, rotate]\n",
        encoding="utf-8",
    )
    _, args, _, tool = parse_args_and_record(
        (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig), ["--config", str(recipe)]
    )
    assert (args.hpo_omega, args.hpo_solver, args.semantic_beta) == (0.25, "geomloss", 0.2)
    assert (args.variance_probe_steps, args.gradient_variance_batches) == (3, 4)
    assert tool.tools == ["zoom_in", "rotate"]
    names = {f.name for f in dataclasses.fields(MAPOConfig)}
    assert {f.name for f in dataclasses.fields(HPOArguments)} | {"variance_probe_rows"} <= names
