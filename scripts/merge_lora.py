"""Merge a LoRA SFT adapter into its base model: the RL recipes start from a full checkpoint.

    python -m scripts.merge_lora --adapter outputs/Qwen2.5-VL-3B-Instruct-SFT-LoRA \\
        --output_dir outputs/Qwen2.5-VL-3B-Instruct-SFT

The base is the one the adapter was trained on (`adapter_config.json`) unless `--base` names another. The processor
(the repo's chat template and pixel budget) and `tool_config.json` (the tool settings RL and evaluation take over) come
from the adapter's folder, where `sft.py` saved them.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from peft import PeftConfig, PeftModel
from transformers import AutoProcessor

from tools import RECORD_NAME
from utils.models import load_model


def merge_lora(adapter: Path, output_dir: Path, base: str | None = None, dtype: str = "bfloat16") -> Path:
    """Write `adapter` merged into its base, with the adapter's processor and tool record, to `output_dir`."""
    for name in ("adapter_config.json", RECORD_NAME):
        if not (adapter / name).is_file():
            raise FileNotFoundError(f"--adapter {adapter}: no {name} (expected the output_dir of a LoRA SFT run)")
    if (output_dir / "config.json").exists():
        raise FileExistsError(f"--output_dir {output_dir} already holds a model; choose an empty folder")
    base = base or PeftConfig.from_pretrained(adapter).base_model_name_or_path
    model = PeftModel.from_pretrained(load_model(base, dtype=dtype), adapter).merge_and_unload()
    model.save_pretrained(output_dir)
    AutoProcessor.from_pretrained(adapter).save_pretrained(output_dir)  # as saved: template and pixel budget
    shutil.copy(adapter / RECORD_NAME, output_dir / RECORD_NAME)
    return output_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapter", type=Path, required=True, help="the output_dir of a LoRA SFT run")
    parser.add_argument("--output_dir", type=Path, required=True, help="where the merged checkpoint goes")
    parser.add_argument("--base", help="the base model (default: the one adapter_config.json names)")
    parser.add_argument("--dtype", default="bfloat16", help="the merged weights' dtype (default: bfloat16)")
    args = parser.parse_args(argv)
    print(f"merged into {merge_lora(args.adapter, args.output_dir, args.base, args.dtype)}")


if __name__ == "__main__":
    main()
