"""`make reproduce` opens every input before its first stage (evaluation/reproduce_inputs.py): on the tiny set's
release-shaped data (tests/test_reproduce_tiny.py writes it), a Git LFS pointer in place of a file, a parquet file
cut short or an image that does not decode stops the plan with the file named, nothing run; the dry run lists them."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from data import convert
from evaluation.reproduce_inputs import lfs_pointer
from scripts import reproduce
from tiny.releases import write_releases
from tools import ToolConfig

POINTER = (
    "version https://git-lfs.github.com/spec/v1\n"
    "oid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 1863416301\n"
)
RL_FILE = Path("DeepEyes-Datasets-47k") / "data_0.1.2_visual_toolbox_v2.parquet"


SPEC = yaml.safe_load(reproduce.SETS_FILE.read_text(encoding="utf-8"))


def cut_short(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# each: what is done to the release, and the file the refusal must name
BREAKAGES = {
    "lfs_rl_data": (lambda root: (root / RL_FILE).write_text(POINTER), RL_FILE, "a Git LFS pointer (135 bytes)"),
    "lfs_hrbench": (
        lambda root: (root / "HR-Bench" / "hr_bench_8k.tsv").write_text(POINTER),
        Path("HR-Bench") / "hr_bench_8k.tsv",
        "a Git LFS pointer",
    ),  # fmt: skip
    "cut_mme_lite": (
        lambda root: cut_short(root / "MME-RealWorld-lite-lmms-eval" / "data" / "train-00000-of-00001.parquet"),
        Path("MME-RealWorld-lite-lmms-eval") / "data" / "train-00000-of-00001.parquet",
        "not a readable parquet file",
    ),  # fmt: skip
    "vstar_image": (
        lambda root: (root / "vstar_bench" / "direct_attributes" / "sa_0.jpg").write_bytes(b"not a JPEG"),
        Path("vstar_bench"),
        "its first row does not read",
    ),  # fmt: skip
    "cut_coldstart": (
        lambda root: cut_short(root / "Mini-o3-Coldstart-Dataset" / "data" / "train-00000-of-00001.parquet"),
        Path("Mini-o3-Coldstart-Dataset") / "data" / "train-00000-of-00001.parquet",
        "not a readable parquet file",
    ),  # fmt: skip
}


def test_lfs_pointer_files_are_told_from_their_files(tmp_path):
    (tmp_path / "pointer").write_text(POINTER)
    (tmp_path / "text").write_text("version 1\n")
    assert lfs_pointer(tmp_path / "pointer") and not lfs_pointer(tmp_path / "text")
    assert not lfs_pointer(tmp_path / "absent")


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_an_unreadable_input_stops_the_plan_before_stage_1_naming_the_file(tmp_path, capsys, breakage):
    """Git LFS pointers in place of the RL parquet used to be "all present" and fail at stage 11 of 16."""
    data, run = tmp_path / "data", tmp_path / "run"
    write_releases(data, SPEC)
    argv = ["--recipe_set", "tiny", "--data_root", str(data), "--run_dir", str(run)]  # every benchmark
    reproduce.main([*argv, "--dry_run"])  # whole, every input opens
    assert "inputs opened: each present one reads" in capsys.readouterr().out
    damage, named, why = BREAKAGES[breakage]
    damage(data)
    reproduce.main([*argv, "--dry_run"])
    out = capsys.readouterr().out
    assert "unreadable inputs:\n" in out and f"  {data / named}" in out and why in out
    with pytest.raises(SystemExit) as refused:
        reproduce.main(argv)
    message = str(refused.value)
    assert message.startswith(f"unreadable inputs under DATA_ROOT={data} (nothing was run):\n  {data / named}")
    assert why in message
    assert not run.exists() or not [p for p in run.iterdir() if p.is_dir()]  # no stage started


def test_the_dry_run_says_which_rl_file_is_a_pointer(tmp_path, capsys):
    data = tmp_path / "data"
    write_releases(data, SPEC)
    (data / RL_FILE).write_text(POINTER)
    reproduce.main(["--recipe_set", "tiny", "--data_root", str(data), "--run_dir", str(tmp_path / "run"), "--dry_run"])
    assert f"  {data / RL_FILE}: a Git LFS pointer, not the file;" in capsys.readouterr().out


def test_the_tiny_set_writes_its_own_release_shaped_data(tmp_path, capsys):
    """`make reproduce RECIPE_SET=tiny` needs no download: an empty DATA_ROOT is said to be written by the run
    (DRY), and what the run writes (tiny/releases.py) is every input the plan reads, each opening, the cold start
    converting whole; written once."""
    data = tmp_path / "data"
    argv = ["--recipe_set", "tiny", "--data_root", str(data), "--run_dir", str(tmp_path / "run"), "--dry_run"]
    stages = reproduce.main(argv)
    assert "missing inputs (the run writes its own, release-shaped: tiny/releases.py):" in capsys.readouterr().out
    written = write_releases(data, SPEC)
    assert len(written) == 7 and write_releases(data, SPEC) == []
    states = {s.name: "to run" for s in stages}
    assert reproduce.missing_inputs(stages, states) == [] and reproduce.unreadable_inputs(stages, states) == []
    trajectories, stats = convert.convert("mini_o3_coldstart", data / "Mini-o3-Coldstart-Dataset", ToolConfig())
    assert stats["rows_read"] == stats["rows_converted"] == 16
