"""scripts/gpu_check_summary.py on a hand-made output folder: the recipes table reports training's and generation's
peak memory apart, and a stage that did not run leaves its row empty."""

import json

from scripts import gpu_check_summary


def test_the_recipes_table_reports_both_peaks(tmp_path):
    (tmp_path / "stages.tsv").write_text("tiny_kit\t0\t30\nzero3\t0\t70\nzero2\t1\t5\n")
    run = {
        "ok": True,
        "steps": [{"step_s": 9.0}, {"step_s": 2.0}, {"step_s": 2.5}],
        "median_step_s_after_first": 2.25,
        "peak_memory_gib": 3.5,
        "generation_peak_memory_gib": 5.25,
    }
    (tmp_path / "zero3.json").write_text(json.dumps(run))
    _, text = gpu_check_summary.summarise(tmp_path)
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in text.splitlines() if line.startswith("| zero")}
    assert rows["zero3"] == "| zero3 | ok | 3 | 2.25 s | 3.50 GiB | 5.25 GiB | yes |"
    assert rows["zero2"].startswith("| zero2 | ") and rows["zero2"].endswith("| | | | | |")
    assert "| fsdp2 | did not run | | | | | |" in text
