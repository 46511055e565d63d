"""The inputs of `make reproduce`'s plan (scripts/reproduce.py): every DATA_ROOT path a stage still to run reads, checked
before the first stage starts, each named with the release and the download that fills it."""

from __future__ import annotations

from pathlib import Path

from evaluation.reproduce_state import Stage


def missing_inputs(stages: list[Stage], states: dict[str, str]) -> list[str]:
    """The DATA_ROOT paths the stages still to run read and that do not exist, each with the release to put there."""
    seen, lines = set(), []
    for s in stages:
        for path, release in s.inputs.items():
            if states[s.name] != "done" and not path.exists() and path not in seen:
                seen.add(path)
                lines.append(
                    f"  {path}  <- {release}: hf download {release} --repo-type dataset "
                    f"--local-dir {data_folder(path, release)}"
                )
    return lines


def data_folder(path: Path, release: str) -> Path:
    """The folder a release downloads into: the path's first part under DATA_ROOT named after it."""
    name = release.split("/")[-1]
    return next((p for p in [path, *path.parents] if p.name == name), path)
