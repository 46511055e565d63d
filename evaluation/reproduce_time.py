"""The time of `make reproduce`'s plan (scripts/reproduce.py): each stage's work (steps or rows) and the seconds a unit
of it takes, first from the `throughput` assumptions of `recipes/reproduce.yaml`, then from what the run measures (a
training stage's `progress.json`, an evaluation's recorded samples), and the plan's remaining time from both, written
to `RUN_DIR/estimate.json` for the dry run, the console and `reproduce.md`."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from evaluation.run import PART_GLOB, SAMPLES_FILE
from utils.progress import PROGRESS_FILE
from utils.recipes import flag_values

WEEK_HOURS = 7 * 24  # the budget a reproduction is planned for: one node for a week
ESTIMATE_FILE = "estimate.json"  # RUN_DIR/estimate.json: the plan's time, assumed and measured, per stage


@dataclass(frozen=True)
class Work:
    """A stage's work: `units` (optimizer steps, or evaluated rows) at `seconds` of wall time each (None: unknown)."""

    units: int
    seconds: float | None

    @property
    def hours(self) -> float | None:
        return None if self.seconds is None else self.units * self.seconds / 3600


class Throughput:
    """Each stage's `Work` from `recipes/reproduce.yaml`'s `throughput` assumptions (each says where it comes from): a
    planning figure, printed beside each stage by the dry run. CPU sets have none: their seconds are None."""

    def __init__(self, assumed: dict, chosen: dict, backend: str):
        # a set's own `throughput` over the file's: the only figures a CPU set is estimated with (the file's are GPUs')
        self.assumed, self.chosen, self.backend = assumed | chosen.get("throughput", {}), chosen, backend
        self.scale = self.assumed.get("gpu_scale", {}).get(chosen.get("name", ""), 1.0)
        self.own = "throughput" in chosen or chosen["accelerate"] not in ("cpu", "multi_cpu")

    def _known(self, *keys: str) -> bool:
        return all(key in self.assumed for key in keys) and self.own

    def evaluation(self, rows: int) -> Work:
        """`rows` evaluated data-parallel over the set's `eval_processes`, on the plan's backend."""
        if not self._known("eval_seconds_per_sample"):
            return Work(rows, None)
        seconds = self.assumed["eval_seconds_per_sample"][self.backend]
        return Work(rows, seconds / self.chosen.get("eval_processes", 1) / self.scale)

    def sft(self, recipe: dict, convert_dir: Path) -> Work | None:
        """SFT's optimizer steps: `max_steps`, else the converted rows (`stats.json`, else the release's) for its
        epochs; each step's rows at the assumed tokens a row and tokens a second."""
        stats = convert_dir / "stats.json"
        rows = json.loads(stats.read_text())["rows_converted"] if stats.is_file() else self.assumed.get("sft_rows")
        gpus = self.chosen["num_processes"]
        per_step = recipe.get("per_device_train_batch_size", 8) * recipe.get("gradient_accumulation_steps", 1) * gpus
        steps = recipe.get("max_steps", -1)
        if not (steps and steps > 0):
            if not rows:
                return None
            steps = math.ceil(rows / per_step) * recipe.get("num_train_epochs", 1)
        if not self._known("sft_tokens_per_s", "sft_tokens_per_row"):
            return Work(steps, None)
        tokens = per_step * self.assumed["sft_tokens_per_row"]
        return Work(steps, tokens / (self.assumed["sft_tokens_per_s"] * gpus * self.scale))

    def rl(self, recipe: dict, rows: int | None) -> Work | None:
        """RL's optimizer steps (`max_steps`, else the RL rows' prompts for its epochs), each generating and training
        on a step's rollouts at the assumed mean rollout length and tokens a second."""
        gpus = self.chosen["num_processes"]
        rollouts = recipe["per_device_train_batch_size"] * recipe.get("gradient_accumulation_steps", 1) * gpus
        prompts = max(1, rollouts // recipe.get("num_generations", 8))
        steps = recipe.get("max_steps", -1)
        if not (steps and steps > 0):
            if not rows:
                return None
            steps = math.ceil(rows / prompts) * recipe.get("num_train_epochs", 1)
        if not self._known("rl_rollout_tokens", "generate_tokens_per_s", "train_tokens_per_s"):
            return Work(steps, None)
        tokens = rollouts * self.assumed["rl_rollout_tokens"]
        generate = self.assumed["generate_tokens_per_s"][self.backend]
        seconds = tokens / (generate * gpus * self.scale) + tokens / (self.assumed["train_tokens_per_s"] * gpus)
        return Work(steps, seconds)


def save_flags(recipe: dict, flags: list[str], work: Work | None, hours: float) -> list[str]:
    """The flags that make a training stage save a checkpoint at least every `hours` of its estimated wall time:
    `--save_steps` the steps that take, when the recipe saves less often (and `--save_strategy steps`, with a
    `--save_total_limit` of 2 where the recipe keeps every one, when it does not save by steps). None when the stage's
    step time is not estimated, or when the command line's `flags` set their own saving. They depend on the recipe and
    the step time only, never on the data's rows, so the stage's command does not change once its data is counted."""
    given = flag_values(flags)
    if work is None or work.seconds is None or {"save_steps", "save_strategy"} & set(given):
        return []
    every = max(1, int(hours * 3600 // work.seconds))
    steps = recipe.get("save_strategy", "steps") == "steps"
    if steps and isinstance(recipe.get("save_steps", 500), int) and recipe.get("save_steps", 500) <= every:
        return []
    added = [] if steps else ["--save_strategy", "steps"]
    added += ["--save_steps", str(every)]
    return added + ([] if recipe.get("save_total_limit") else ["--save_total_limit", "2"])


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


# ------------------------------------------------------------------------------------------------------ measured
@dataclass(frozen=True)
class Measured:
    """What a running (or finished) stage measured: `done` of `units`, at `seconds` of wall time a unit."""

    done: int
    units: int
    seconds: float

    @property
    def hours_left(self) -> float:
        return max(0, self.units - self.done) * self.seconds / 3600


def training_measure(output: Path) -> Measured | None:
    """A training stage's step time from its `progress.json` (`utils.progress.StepTimes`): the mean wall seconds of
    the steps this process ran, its first left out when there are others (it also loads data, compiles, warms up)."""
    path = output / PROGRESS_FILE
    try:
        progress = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not written yet, or being replaced
        return None
    seconds = progress.get("step_seconds") or []
    timed = seconds[1:] or seconds
    if not timed or not progress.get("max_steps"):
        return None
    return Measured(progress["step"], progress["max_steps"], sum(timed) / len(timed))


class RowMeter:
    """An evaluation's wall seconds a row, from how its recorded samples (`samples.jsonl` and the data-parallel parts)
    grow between two looks: counted from the first look that finds any, so the model's load is not counted."""

    def __init__(self, output: Path, units: int):
        self.output, self.units = output, units
        self.first: tuple[float, int] | None = None

    def rows(self) -> int:
        """Rows done: records written over the records a row makes (`records_per_row`)."""
        files = [self.output / SAMPLES_FILE, *self.output.glob(PART_GLOB)]
        return sum(_complete_lines(path) for path in files) // records_per_row(self.output)

    def look(self, now: float | None = None) -> Measured | None:
        now, rows = time.monotonic() if now is None else now, self.rows()
        if rows and self.first is None:
            self.first = (now, rows)
            return None
        if self.first is None or rows <= self.first[1] or now <= self.first[0]:
            return None
        return Measured(rows, self.units, (now - self.first[0]) / (rows - self.first[1]))


def records_per_row(output: Path) -> int:
    """How many `samples.jsonl` records an evaluation writes a benchmark row, from its `eval_args.json`: its `samples`
    (k of Avg@k), twice when its options are also shuffled (`option_shuffle_seed`: both orders run); 1 before the
    run has written it."""
    try:
        args = json.loads((output / "eval_args.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not written yet
        return 1
    return max(1, int(args.get("samples") or 1)) * (1 if args.get("option_shuffle_seed") is None else 2)


def _complete_lines(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:  # not there (yet), or a part merged and deleted meanwhile
        return 0


# ------------------------------------------------------------------------------------------------------ remaining
def remaining(
    plan: dict[str, tuple[str | None, Work | None]], todo: list[str], measured: dict[str, Measured]
) -> dict[str, float | None]:
    """Hours left per stage still to run (`todo`), given each stage's kind and planned `Work` (`plan`: name -> (kind,
    work); kinds `train` and `eval`) and what the run measured so far: a stage measured, its own units left at its own
    rate; an evaluation not yet measured, its rows at the latest measured evaluation's rate (the same harness,
    backend and processes); otherwise the plan's assumption (None when it has none)."""
    evals = [m for name, m in measured.items() if plan[name][0] == "eval"]
    left = {}
    for name in todo:
        kind, work = plan[name]
        if name in measured:
            left[name] = measured[name].hours_left
        elif kind == "eval" and evals and work is not None:
            left[name] = work.units * evals[-1].seconds / 3600
        else:
            left[name] = None if work is None else work.hours
    return left


def total_line(hours: float, backend: str, source: str) -> str:
    """The plan's total as the dry run and each re-estimate print it, with the backend that gives it and, over a week,
    what to change."""
    line = f"~{hours:.0f} h ({hours / 24:.1f} days) with RL's rollouts and the evaluations on {backend} ({source})"
    if hours > WEEK_HOURS:
        fix = "RL_BACKEND=vllm (colocated) or fewer" if backend != "vllm" else "Fewer"
        line += f"\nOVER A WEEK ({WEEK_HOURS} h): {fix} RL steps (--rl_args '--max_steps N') bring it under"
    return line


class Clock:
    """The plan's time while it runs: each stage's planned `Work` (`plan`, every stage; `todo`, those still to run),
    replaced by what a stage measures as it runs (`look`) and when it ends (`finish`); every change rewrites
    `RUN_DIR/estimate.json` and calls `on_first` the first time a stage is measured (the run then rewrites
    reproduce.md and says the new total)."""

    def __init__(
        self, run_dir: Path, plan: dict[str, tuple[str | None, Work | None]], todo: list[str], backend: str,
        on_first: Callable[[str, Measured], None] | None = None,
    ):  # fmt: skip
        self.run_dir, self.plan, self.todo, self.backend, self.on_first = run_dir, plan, list(todo), backend, on_first
        self.measured = self._earlier()

    def _earlier(self) -> dict[str, Measured]:
        """What an earlier run of the plan measured (its estimate.json): a restarted plan keeps its figures."""
        try:
            earlier = json.loads((self.run_dir / ESTIMATE_FILE).read_text(encoding="utf-8"))
            return {
                name: Measured(**entry["measured"])
                for name, entry in earlier["stages"].items()
                if name in self.plan and entry.get("measured")
            }
        except (OSError, ValueError, KeyError, TypeError):  # none yet, or not one this plan wrote
            return {}

    def meter(self, name: str, output: Path):
        """What measures stage `name` while it runs: a callable returning its `Measured` so far, or None."""
        kind, work = self.plan[name]
        if kind == "train":
            return lambda: training_measure(output)
        if kind == "eval" and work is not None:
            return RowMeter(output, work.units).look
        return lambda: None

    def look(self, name: str, measured: Measured | None) -> None:
        if measured is None or measured == self.measured.get(name):
            return
        first = name not in self.measured
        self.measured[name] = measured
        self.write()
        if first and self.on_first is not None:
            self.on_first(name, measured)

    def finish(self, name: str, measured: Measured | None) -> None:
        """Stage `name` ended: its last measure kept (its rate informs the stages after it), nothing of it left."""
        if measured is not None:
            self.measured[name] = Measured(measured.units, measured.units, measured.seconds)
        self.todo = [other for other in self.todo if other != name]
        self.write()

    def left(self) -> dict[str, float | None]:
        return remaining(self.plan, self.todo, self.measured)

    def write(self) -> Path:
        """`RUN_DIR/estimate.json`: per stage the plan's hours, what it measured (units done, of, seconds a unit)
        and the hours left; the total left (stages with no estimate left out, and named) against the week."""
        left = self.left()
        record = {
            "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "backend": self.backend,
            "stages": {
                name: {
                    "planned_hours": None if work is None else work.hours,
                    "measured": None if name not in self.measured else vars(self.measured[name]),
                    "hours_left": left.get(name, 0.0),
                }
                for name, (_, work) in self.plan.items()
            },
            "hours_left": sum(hours for hours in left.values() if hours is not None),
            "unknown": [name for name, hours in left.items() if hours is None],
            "week_hours": WEEK_HOURS,
        }
        path = self.run_dir / ESTIMATE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        return path
