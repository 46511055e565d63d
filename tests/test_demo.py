"""`make demo` end to end, shrunk: every stage runs through the real entry points and the summary is written."""

import json
import sys

import pytest

import demo

pytestmark = pytest.mark.slow


def test_demo_runs_every_stage_and_writes_the_summary(tiny_kit, tmp_path, monkeypatch):
    argv = ["demo.py", "--output_dir", str(tmp_path), "--train_rows", "4", "--test_rows", "2"]
    argv += ["--clip_steps", "3", "--sft_steps", "2", "--rl_steps", "1"]
    monkeypatch.setattr(sys, "argv", argv)
    demo.main()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["eval"]) == {"base", "sft", "rl"}
    assert summary["clip_verifier"]["steps"] == 3
    for stage in ("base", "sft", "rl"):
        assert (tmp_path / "eval" / stage / "report.html").exists()
        assert json.loads((tmp_path / "eval" / stage / "metrics.json").read_text())["n"] == 2
    assert (tmp_path / "rl" / "model.safetensors").exists()
    assert set(summary["seconds"]) >= {"SFT cold start", "MAPO RL", "total"}
