"""The time estimate of `make reproduce`'s plan (scripts/reproduce.py): hours per stage from the `throughput`
assumptions of `recipes/reproduce.yaml`, and the rows of the RL data they read."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


class Throughput:
    """Hours per stage from `recipes/reproduce.yaml`'s `throughput` assumptions (each says where it comes from): a
    planning figure, printed beside each stage by the dry run."""

    def __init__(self, assumed: dict, chosen: dict, rl_backend: str):
        self.assumed, self.chosen, self.backend = assumed, chosen, rl_backend
        self.scale = assumed.get("gpu_scale", {}).get(chosen.get("name", ""), 1.0)

    def _known(self, *keys: str) -> bool:
        return all(key in self.assumed for key in keys) and self.chosen["accelerate"] not in ("cpu", "multi_cpu")

    def evaluation(self, rows: int) -> float | None:
        if not self._known("eval_seconds_per_sample"):
            return None
        seconds = self.assumed["eval_seconds_per_sample"]["transformers"]
        return rows * seconds / self.chosen.get("eval_processes", 1) / self.scale / 3600

    def sft(self, recipe: dict, convert_dir: Path) -> float | None:
        if not self._known("sft_tokens_per_s", "sft_tokens_per_row"):
            return None
        stats = convert_dir / "stats.json"
        rows = json.loads(stats.read_text())["rows_converted"] if stats.is_file() else self.assumed.get("sft_rows")
        if not rows:
            return None
        gpus = self.chosen["num_processes"]
        per_step = recipe.get("per_device_train_batch_size", 8) * recipe.get("gradient_accumulation_steps", 1) * gpus
        steps = recipe.get("max_steps", -1)
        seen = steps * per_step if steps and steps > 0 else rows * recipe.get("num_train_epochs", 1)
        tokens = seen * self.assumed["sft_tokens_per_row"]
        return tokens / (self.assumed["sft_tokens_per_s"] * gpus * self.scale) / 3600

    def rl(self, recipe: dict, rows: int | None) -> float | None:
        if not self._known("rl_rollout_tokens", "generate_tokens_per_s", "train_tokens_per_s") or not rows:
            return None
        gpus = self.chosen["num_processes"]
        rollouts = recipe["per_device_train_batch_size"] * recipe.get("gradient_accumulation_steps", 1) * gpus
        prompts = rollouts // recipe.get("num_generations", 8)
        steps = recipe.get("max_steps", -1)
        steps = steps if steps and steps > 0 else math.ceil(rows / prompts) * recipe.get("num_train_epochs", 1)
        tokens = rollouts * self.assumed["rl_rollout_tokens"]
        generate = self.assumed["generate_tokens_per_s"][self.backend]
        seconds = tokens / (generate * gpus * self.scale) + tokens / (self.assumed["train_tokens_per_s"] * gpus)
        return steps * seconds / 3600


def parquet_rows(path: Path) -> int | None:
    """A parquet file's row count from its footer (no data read), or None when it is not there or not parquet."""
    try:
        return pq.ParquetFile(path).metadata.num_rows if path.is_file() else None
    except (OSError, pa.ArrowInvalid):
        return None


def rl_rows(spec: dict, files: list[Path]) -> int | None:
    """Rows of the RL files: counted where downloaded, else the release's published count (`~22k` -> 22,000)."""
    total = 0
    for path, entry in zip(files, spec["rl_data"]["files"]):
        rows = parquet_rows(path)
        if rows is None:
            published = re.fullmatch(r"~?(\d+(?:\.\d+)?)k", str(entry["rows"]))
            if published is None:
                return None
            rows = int(float(published.group(1)) * 1000)
        total += rows
    return total
