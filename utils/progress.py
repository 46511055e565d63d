"""A training run's progress on disk while it runs: `<output_dir>/progress.json`, rewritten after every optimizer step
by the main process (`StepTimes`). `make reproduce` reads it to replace its assumed step time with the measured one
(evaluation/reproduce_time.py); nothing else in a run depends on it."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from transformers import TrainerCallback

PROGRESS_FILE = "progress.json"
KEPT_STEPS = 100  # the step times kept: the recent ones say what the rest of the run will take


class StepTimes(TrainerCallback):
    """Writes `progress.json`: the step reached, the steps the run will make (`max_steps`), and the wall seconds of
    the last `KEPT_STEPS` steps this process ran (a resumed run counts from its resume). Wall time, not TRL's
    `step_time` metric: the plan needs all a step costs (generation, weight sync, logging, saves)."""

    def __init__(self):
        self.last: float | None = None
        self.seconds: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.last, self.seconds = time.monotonic(), []

    def on_step_end(self, args, state, control, **kwargs):
        now = time.monotonic()
        if self.last is not None:
            self.seconds = [*self.seconds, now - self.last][-KEPT_STEPS:]
        self.last = now
        if state.is_world_process_zero and args.output_dir:
            write_progress(Path(args.output_dir), state.global_step, state.max_steps, self.seconds)


def write_progress(output_dir: Path, step: int, max_steps: int, seconds: list[float]) -> Path:
    """`output_dir/progress.json`, replaced whole (a reader never sees half a file)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    record = {"step": step, "max_steps": max_steps, "step_seconds": [round(s, 3) for s in seconds]}
    partial = output_dir / f".{PROGRESS_FILE}.tmp"
    partial.write_text(json.dumps(record) + "\n", encoding="utf-8")
    os.replace(partial, output_dir / PROGRESS_FILE)
    return output_dir / PROGRESS_FILE
