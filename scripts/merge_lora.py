"""Merge a LoRA adapter into its base model: RL, evaluation and vLLM start from full checkpoints.

    python -m scripts.merge_lora --adapter outputs/Qwen2.5-VL-3B-Instruct-SFT-LoRA \\
        --output_dir outputs/Qwen2.5-VL-3B-Instruct-SFT
    python -m scripts.merge_lora --adapter outputs/Qwen2.5-VL-3B-Instruct-MAPO-LoRA \\
        --output_dir outputs/Qwen2.5-VL-3B-Instruct-MAPO

The base is the one the adapter was trained on (`adapter_config.json`) unless `--base` names another; a relative base
path (an RL run's `outputs/...-SFT`) is read against the folder the adapter's run was started in, found from the
`output_dir` its `recipe.yaml` records, not against the working directory. The processor (the repo's chat template and
pixel budget) and `tool_config.json` (the tool settings, and after RL the rollout budget, that RL and evaluation take
over) come from the adapter's folder, where `sft.py` and `rl.py` saved them.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
from pathlib import Path

from peft import PeftConfig, PeftModel
from transformers import AutoProcessor

from tools import RECORD_NAME
from utils.models import load_model
from utils.recipes import RESOLVED_RECIPE_NAME, load_recipe


def run_root(adapter: Path) -> Path | None:
    """The folder the adapter's run was started in: the adapter's absolute path without the run's `output_dir` at
    its end (from its `recipe.yaml`: the command line's `--output_dir`, else the recipe's). None when the folder holds
    no recipe, the run named an absolute `output_dir`, or the adapter no longer sits where the run wrote it."""
    recipe = adapter / RESOLVED_RECIPE_NAME
    if not recipe.is_file():
        return None
    text = recipe.read_text(encoding="utf-8")
    output_dir = load_recipe(recipe).values.get("output_dir")
    command = re.search(r"^# Command line: (.*)$", text, re.MULTILINE)
    argv = shlex.split(command.group(1))[1:] if command else []
    for i, arg in enumerate(argv):
        if arg == "--output_dir" and i + 1 < len(argv):
            output_dir = argv[i + 1]
        elif arg.startswith("--output_dir="):
            output_dir = arg.split("=", 1)[1]
    if not output_dir or Path(output_dir).is_absolute():
        return None
    parts = Path(os.path.normpath(output_dir)).parts
    resolved = adapter.resolve().parts
    if resolved[-len(parts) :] != parts:
        return None
    return Path(*resolved[: -len(parts)])


def resolve_base(adapter: Path, base: str) -> str:
    """`base` as `adapter_config.json` names it, a relative path read against the adapter's run (`run_root`). A hub
    name stays as it is; a relative path found only in the working directory fails: it may be another model."""
    if Path(base).is_absolute():
        return base
    root = run_root(adapter)
    if root is not None and (root / base).is_dir():
        return str(root / base)
    if Path(base).is_dir():
        where = (
            f"under {root}, where the adapter's run started"
            if root
            else "where the adapter's run started (no recipe.yaml records it)"
        )
        raise FileNotFoundError(
            f"--adapter {adapter}: adapter_config.json names the base {base!r}, a relative path not found {where}; "
            f"the {Path(base).resolve()} of the working directory may be another model: give --base"
        )
    return base  # a hub name


def merge_lora(adapter: Path, output_dir: Path, base: str | None = None, dtype: str = "bfloat16") -> Path:
    """Write `adapter` merged into its base, with the adapter's processor and tool record, to `output_dir`."""
    for name in ("adapter_config.json", RECORD_NAME):
        if not (adapter / name).is_file():
            raise FileNotFoundError(
                f"--adapter {adapter}: no {name} (expected the output_dir of a LoRA SFT or RL run)"
            )
    if (output_dir / "config.json").exists():
        raise FileExistsError(f"--output_dir {output_dir} already holds a model; choose an empty folder")
    base = base or resolve_base(adapter, PeftConfig.from_pretrained(adapter).base_model_name_or_path)
    model = PeftModel.from_pretrained(load_model(base, dtype=dtype), adapter).merge_and_unload()
    model.save_pretrained(output_dir)
    AutoProcessor.from_pretrained(adapter).save_pretrained(output_dir)  # as saved: template and pixel budget
    shutil.copy(adapter / RECORD_NAME, output_dir / RECORD_NAME)
    return output_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapter", type=Path, required=True, help="the output_dir of a LoRA SFT or RL run")
    parser.add_argument("--output_dir", type=Path, required=True, help="where the merged checkpoint goes")
    parser.add_argument("--base", help="the base model (default: the one adapter_config.json names)")
    parser.add_argument("--dtype", default="bfloat16", help="the merged weights' dtype (default: bfloat16)")
    args = parser.parse_args(argv)
    print(f"merged into {merge_lora(args.adapter, args.output_dir, args.base, args.dtype)}")


if __name__ == "__main__":
    main()
