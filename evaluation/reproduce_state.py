"""The state of `make reproduce`'s plan (scripts/reproduce.py): its stages, the records each leaves in its folder of
the run (`RUN_DIR/<stage>/.done`), and what each stage's state is at a start (done, changed, stale, forced, resumed,
to run). Read from the run folder only: this module runs nothing."""

from __future__ import annotations

import json
import re
import shlex
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.reproduce_time import Work
from repairs.resume import last_complete_checkpoint
from utils.recipes import flag_values, load_recipe

MARKER = ".done"  # RUN_DIR/<stage>/.done: the record of a stage that exited 0
STARTED = ".started"  # RUN_DIR/<stage>/.started: the record of its last start
FORCED = ".forced"  # RUN_DIR/.forced: the stages forced to rerun and not yet done in their round (`forced_round`)
REPO = Path(__file__).resolve().parents[1]  # the commands run from the repo root: their recipes are relative to it
WEIGHT_FILES = ("model*.safetensors", "adapter_model.*", "pytorch_model*.bin")  # a training stage's saved weights


@dataclass
class Stage:
    """One step of the plan: its command as a user types it (`python ...` or `accelerate launch ...`, from the repo
        root), the DATA_ROOT paths it reads (path -> release), the stages whose outputs it reads, and for training stages
        the recipe and the command's recipe flags the memory estimate reads. `gate`: a check of what earlier stages wrote,
        run before this stage starts (None: pass; else why it must not start); `work`: its steps or rows and the assumed
    seconds each (`evaluation.reproduce_time`), `kind` what measures it (`train`: its progress.json; `eval`: its
    samples; None: nothing)."""

    name: str
    argv: list[str]
    output: Path
    inputs: dict[Path, str] = field(default_factory=dict)
    reads: tuple[str, ...] = ()
    recipe: str | None = None
    recipe_args: list[str] = field(default_factory=list)
    resumable: bool = False  # SFT and RL: a complete checkpoint-* is continued, not thrown away
    gate: Callable[[], str | None] | None = None
    work: Work | None = None
    kind: str | None = None
    roots: dict[str, Path] = field(default_factory=dict)  # {"RUN_DIR": ..., "DATA_ROOT": ...}: what records abstract

    @property
    def hours(self) -> float | None:
        return None if self.work is None else self.work.hours

    @property
    def marker(self) -> dict | None:
        """The record the stage wrote when it exited 0 (`.done`), or None."""
        return read_record(self.output / MARKER)

    @property
    def started(self) -> dict | None:
        """The record the stage wrote when it last started (`.started`), or None."""
        return read_record(self.output / STARTED)

    def checkpoint(self) -> Path | None:
        """The complete checkpoint an interrupted training stage resumes from."""
        found = last_complete_checkpoint(self.output) if self.resumable and self.marker is None else None
        return Path(found) if found else None

    def command(self) -> list[str]:
        """The command to run now: a training stage interrupted after a checkpoint continues from it."""
        return [*self.argv, "--resume_from_checkpoint", "true"] if self.checkpoint() else self.argv

    def resolved(self) -> dict:
        """Every field the stage's command sets, after bases and flags: its `--config` recipe with its bases merged
        and the command's flags over it; for a stage without a recipe, its flags. What a change is read from."""
        values = flag_values(self.argv[script_end(self.argv) :])
        config = values.pop("config", None)
        return (load_recipe(REPO / config).values if isinstance(config, str) else {}) | values

    def differs(self, record: dict | None) -> list[str]:
        """The fields in which a record (`.done` or `.started`) differs from the plan, each with both values (the
        launcher's too: processes, accelerate config), or `command` when the record has another command and no recipe
        to compare (a record from before recipes were kept). Empty: the same."""
        if record is None or "command" not in record:  # no record, or a marker by hand: taken as it is
            return []
        before, now = portable(record["command"], self.roots), portable(self.argv, self.roots)
        launched = before[: script_end(before)], now[: script_end(now)]
        fields = (
            [f"launcher: {shlex.join(launched[0])} -> {shlex.join(launched[1])}"] if launched[0] != launched[1] else []
        )
        if "recipe" in record:
            return fields + changed_fields(portable(record["recipe"], self.roots), self.record()["recipe"])
        return fields + ([] if before[len(launched[0]) :] == now[len(launched[1]) :] else ["command"])

    def record(self) -> dict:
        """What a record of this stage keeps of it: its command and resolved recipe with the run's folders written
        `$RUN_DIR/...` and `$DATA_ROOT/...` (`portable`), and where those were."""
        return {
            "command": portable(self.argv, self.roots),
            "recipe": portable(self.resolved(), self.roots),
            "roots": {name: str(path) for name, path in self.roots.items()},
        }

    def moved(self) -> bool:
        """The stage started under other folders than the plan's: the run folder (or the data) moved since."""
        started = self.started or {}
        return "roots" in started and started["roots"] != self.record()["roots"]

    def weights(self) -> list[str]:
        """What a training stage's folder holds that took GPU hours to make: its `checkpoint-*` folders and saved
        weights. The plan deletes none of it unless DISCARD names the stage."""
        if not self.resumable or not self.output.is_dir():
            return []
        found = {p.name for p in self.output.glob("checkpoint-*") if p.is_dir()}
        found |= {p.name for pattern in WEIGHT_FILES for p in self.output.glob(pattern) if p.is_file()}
        return sorted(found, key=_natural)


def portable(value, roots: dict[str, Path]):
    """`value` (a command, a recipe, any JSON) with each path under a root written from the root's name
    (`$RUN_DIR/sft`, `$DATA_ROOT/vstar_bench`), the longest root first: what records keep, so that a run folder copied
    elsewhere, or its data, still matches its plan. A record of absolute paths reads the same where it was made."""
    if isinstance(value, str):
        for name, root in sorted(roots.items(), key=lambda item: -len(str(item[1]))):
            if value == str(root) or value.startswith(f"{root}/"):
                return f"${name}{value[len(str(root)) :]}"
        return value
    if isinstance(value, list):
        return [portable(item, roots) for item in value]
    if isinstance(value, dict):
        return {key: portable(item, roots) for key, item in value.items()}
    return value


def script_end(argv: list[str]) -> int:
    """Where a command's own flags start: after its script (`x.py`) or its module (`-m pkg.mod`)."""
    for i, arg in enumerate(argv):
        if arg.endswith(".py") or (i and argv[i - 1] == "-m"):
            return i + 1
    return len(argv)


def changed_fields(old: dict, new: dict) -> list[str]:
    """`field: old -> new` for each field set differently (or only) in one of two resolved recipes, sorted."""
    missing = "(unset)"
    return [
        f"{key}: {json.dumps(old.get(key, missing))} -> {json.dumps(new.get(key, missing))}"
        for key in sorted(set(old) | set(new))
        if old.get(key, missing) != new.get(key, missing)
    ]


def _natural(name: str) -> tuple:
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name))


def read_record(path: Path) -> dict | None:
    return json.loads(path.read_text(encoding="utf-8") or "{}") if path.is_file() else None


def write_record(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


# ------------------------------------------------------------------------------------------------------ the rounds
def readers(stages: list[Stage], names: set[str]) -> set[str]:
    """`names` and every stage that reads one of them, directly or through others."""
    found = set(names)
    for s in stages:  # in plan order: a stage's inputs come before it
        if found & set(s.reads):
            found.add(s.name)
    return found


def forced_round(run_dir: Path, stages: list[Stage], force: set[str], discard: set[str]) -> dict[str, dict]:
    """The stages forced to rerun, each with the round it was asked in: those `RUN_DIR/.forced` keeps from an earlier
    FORCE or DISCARD whose run did not finish, and those asked now (`force`, `discard`: DISCARD forces too) with every
    stage that reads them. A forced stage reruns once in its round: a rerun of the same command, or of none, goes on
    with the round (a stage that finished in it is done; one that started in it resumes) instead of starting again;
    the round ends with the plan (`end_round`). `discard`: may delete what the stage's folder held before the round."""
    pending = read_record(run_dir / FORCED) or {}
    new = uuid.uuid4().hex[:12]
    for name in sorted(readers(stages, force | discard)):
        entry = pending.setdefault(name, {"round": new, "discard": False})
        entry["discard"] = entry["discard"] or name in discard
    return pending


def keep_round(run_dir: Path, pending: dict[str, dict]) -> None:
    """`RUN_DIR/.forced`: the round, kept before the first stage runs, so that an interrupted run goes on with it."""
    if pending:
        write_record(run_dir / FORCED, pending)


def end_round(run_dir: Path) -> None:
    """The plan finished: every forced stage ran in its round; a later FORCE starts a new one."""
    (run_dir / FORCED).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------------ the states
def stage_states(stages: list[Stage], pending: dict[str, dict] | set[str]) -> dict[str, str]:
    """Per stage: `done` (its marker's command is the plan's and its inputs were not rerun since), `changed` (the
    marker, or the start of an interrupted run, holds another command), `stale` (a stage it reads was rerun after it,
    or will be), `forced` (in the forced round, not finished in it: rerun from an empty folder), `resume from
    checkpoint-N` (an SFT or RL stage interrupted after a complete checkpoint, forced in this round or not), `resume`
    (a forced evaluation started in this round: it keeps its samples), `would delete` (forced, but its folder holds
    checkpoints or weights from before the round that no DISCARD names), `moved` (an evaluation interrupted before
    its run folder moved: evaluate.py resumes only under its first paths, so it starts again; it holds no
    checkpoint), or `to run`. `pending`: the round
    (`forced_round`), or a set of stage names forced in a round of their own."""
    if isinstance(pending, set):
        pending = {name: {"round": "-", "discard": False} for name in readers(stages, pending)}
    states: dict[str, str] = {}
    by_name = {s.name: s for s in stages}
    for s in stages:
        record, started, reads = s.marker, s.started, [states[name] for name in s.reads]
        entry = pending.get(s.name)
        if entry is not None and (record or {}).get("round") != entry["round"]:
            states[s.name] = _forced_state(s, entry, started)
        elif record is None:
            checkpoint = s.checkpoint()
            if checkpoint and s.differs(started):
                states[s.name] = "changed"  # resuming would continue another recipe's run (its schedule, its rate)
            elif s.kind == "eval" and s.moved():
                states[s.name] = "moved"  # evaluate.py resumes only under the paths it started with
            else:
                states[s.name] = f"resume from {checkpoint.name}" if checkpoint else "to run"
        elif s.differs(record):
            states[s.name] = "changed"
        elif any(state != "done" for state in reads) or any(
            record.get("inputs", {}).get(name, run_id(by_name[name])) != run_id(by_name[name]) for name in s.reads
        ):
            states[s.name] = "stale"
        else:
            states[s.name] = "done"
    return states


def _forced_state(s: Stage, entry: dict, started: dict | None) -> str:
    """The state of a stage forced in round `entry` and not finished in it."""
    if started is not None and started.get("round") == entry["round"] and not s.differs(started):
        checkpoint = s.checkpoint()
        if checkpoint:
            return f"resume from {checkpoint.name}"
        if s.kind == "eval":
            return "resume"
        return "forced"  # started in this round and left nothing to resume from: what is there is this round's
    return "would delete" if s.weights() and not entry["discard"] else "forced"


def run_id(stage: Stage) -> str | None:
    return (stage.marker or {}).get("id")


def blocked(stages: list[Stage], states: dict[str, str]) -> list[str]:
    """What stops the run before it starts: a changed or stale stage, with the marker's command and the plan's; a
    forced stage whose folder holds checkpoints or weights no DISCARD names. The advice names FORCE for the stages
    whose folders hold nothing of value and DISCARD for the others."""
    lines = []
    for s in stages:
        if states[s.name] == "changed":
            record = s.marker or s.started
            what = "done" if s.marker else f"interrupted at {s.checkpoint().name}"
            lines.append(f"{s.name} is {what} with another command or recipe than the plan's:")
            if portable(record["command"], s.roots) != s.record()["command"]:
                lines += [
                    f"  {'done' if s.marker else 'ran'}: {shlex.join(record['command'])}",
                    f"  plan: {shlex.join(s.argv)}",
                ]
            lines += [f"  {field}" for field in s.differs(record)]
        elif states[s.name] == "stale":
            lines.append(f"{s.name} is done, but {', '.join(s.reads)} changed or will run again since")
        elif states[s.name] == "would delete":
            lines.append(
                f"{s.name} is forced, which reruns it from step 0 and deletes {s.output}: it holds "
                f"{', '.join(s.weights())}; say so by name with DISCARD={s.name} (or copy the folder away first)"
            )
    if lines:
        later = [s.name for s in stages if states[s.name] in ("changed", "stale")]
        keep = [s.name for s in stages if (s.name in later or states[s.name] == "would delete") and s.weights()]
        rest = [name for name in later if name not in readers(stages, set(keep))]
        roots = [name for name in rest if name not in readers(stages, set(rest) - {name})]
        asked = " ".join(
            [*([f"FORCE={','.join(roots)}"] if roots else []), *([f"DISCARD={','.join(keep)}"] if keep else [])]
        )
        lines.append(
            f"{asked} reruns {'them' if len(roots) + len(keep) > 1 else 'it'} from an empty folder, with the stages "
            "after that read them"
            + ("; DISCARD deletes the checkpoints and weights of the stages it names" if keep else "")
            + "; or choose another RUN_DIR."
        )
    return lines
