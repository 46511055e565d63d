"""The state of `make reproduce`'s plan (scripts/reproduce.py): its stages, the records each leaves in its folder of
the run (`RUN_DIR/<stage>/.done`), and what each stage's state is at a start (done, changed, stale, forced, resumed,
to run). Read from the run folder only: this module runs nothing."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from evaluation.reproduce_time import Work
from repairs.resume import last_complete_checkpoint

MARKER = ".done"


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

    @property
    def hours(self) -> float | None:
        return None if self.work is None else self.work.hours

    @property
    def marker(self) -> dict | None:
        path = self.output / MARKER
        return json.loads(path.read_text(encoding="utf-8") or "{}") if path.is_file() else None

    def checkpoint(self) -> Path | None:
        """The complete checkpoint an interrupted training stage resumes from."""
        found = last_complete_checkpoint(self.output) if self.resumable and self.marker is None else None
        return Path(found) if found else None

    def command(self) -> list[str]:
        """The command to run now: a training stage interrupted after a checkpoint continues from it."""
        return [*self.argv, "--resume_from_checkpoint", "true"] if self.checkpoint() else self.argv


# ------------------------------------------------------------------------------------------------------ the states
def stage_states(stages: list[Stage], force: set[str]) -> dict[str, str]:
    """Per stage: `done` (its marker's command is the plan's and its inputs were not rerun since), `changed` (the
    marker holds another command), `stale` (a stage it reads was rerun after it, or will be), `forced` (`force` names
    it or a stage it reads is forced), `resume from checkpoint-N`, or `to run`."""
    states: dict[str, str] = {}
    by_name = {s.name: s for s in stages}
    for s in stages:
        record, reads = s.marker, [states[name] for name in s.reads]
        if s.name in force or "forced" in reads:
            states[s.name] = "forced"
        elif record is None:
            checkpoint = s.checkpoint()
            states[s.name] = f"resume from {checkpoint.name}" if checkpoint else "to run"
        elif record.get("command", s.argv) != s.argv:  # a marker by hand, without a command, is taken as it is
            states[s.name] = "changed"
        elif any(state != "done" for state in reads) or any(
            record.get("inputs", {}).get(name, run_id(by_name[name])) != run_id(by_name[name]) for name in s.reads
        ):
            states[s.name] = "stale"
        else:
            states[s.name] = "done"
    return states


def run_id(stage: Stage) -> str | None:
    return (stage.marker or {}).get("id")


def blocked(stages: list[Stage], states: dict[str, str]) -> list[str]:
    """What stops the run before it starts: a changed or stale stage, with the marker's command and the plan's."""
    lines = []
    for s in stages:
        if states[s.name] == "changed":
            lines += [
                f"{s.name} is done with another command than the plan's:",
                f"  done: {shlex.join(s.marker['command'])}",
                f"  plan: {shlex.join(s.argv)}",
            ]
        elif states[s.name] == "stale":
            lines.append(f"{s.name} is done, but {', '.join(s.reads)} changed or will run again since")
    if lines:
        later = [s.name for s in stages if states[s.name] in ("changed", "stale")]
        lines.append(
            f"FORCE={later[0]} reruns it from an empty folder, with the stages after it that read it "
            f"(FORCE={','.join(later)} names each); or choose another RUN_DIR."
        )
    return lines
