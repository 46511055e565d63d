"""`research.gradient_claims`' analysis and report on a synthetic measurement (no model: the statistics, pooling,
verdicts and words), and the committed report held to its results.json: every number of its headline, and the README's
and docs/demo.md's quote of its verdicts."""

import argparse
import json

import numpy as np
import pytest
import yaml

from research import gradient_arms
from research import gradient_claims as gc
from research.report import unbacked_numbers
from tests.tolerance import FLOAT64, HAND_TERMS, tolerance
from tiny import stages

REPORT = stages.REPO / gc.REPORT
RESULTS = REPORT.with_suffix("") / "results.json"

# Float64 figures worked by hand or by a short chain of sums: HAND_TERMS rounded operations on the longest chain
# (tests/tolerance.py), of terms of order 1
FLOAT64_HAND = tolerance(FLOAT64, terms=HAND_TERMS, scale=1.0)


def synthetic(prompts: int, seed: int, first: int = 0, frames: float = 0.3, group: int = 4) -> dict:
    """A measurement as `gc.measure` returns it, drawn at random: score vectors that lean towards a fixed direction on
    rollouts that framed the target (a walk verdict of 1, at the rate `frames`), and replays whose advantages are what
    `reference_advantages` gives on the recorded columns (so `gc.check_replays` passes)."""
    rng = np.random.default_rng(seed)
    n = prompts * group
    steps = rng.integers(1, 4, size=n)
    step_rollout = np.repeat(np.arange(n), steps)
    walk = [[None if rng.random() < 0.2 else float(rng.random() < frames) for _ in range(k - 1)] for k in steps]
    zoom = [[v is not None and rng.random() < 0.9 for v in calls] for calls in walk]
    seen = np.array([1.0 in calls for calls in walk])
    well = (rng.random(n) < 0.9).astype(float)
    x = rng.normal(size=(len(step_rollout), 8))
    x[:, 0] += 1.5 * (well * seen)[step_rollout]
    r = gc.Rollouts(step_rollout, np.repeat(np.arange(prompts), group), rng.integers(5, 20, size=n).astype(float),
                    well, seen, rng.random(n), walk, zoom, x @ x.T)  # fmt: skip
    recipe = {"semantic_lambda": 0.95, "no_tool_semantic": 0.0, "semantic_beta": 0.4}
    reader = np.asarray(gc.reader_outcome(well, seen, r.draws, gc.READER_HIT_P, gc.READER_MISS_P))
    walk_sem = gc.semantics(gc.walk_scores(walk), 0.95, 0.0)
    replays = {}
    for name, fields in gc.ESTIMATORS.items():
        mapo = fields["advantage_estimator"] not in ("grpo", "hpo")
        sem = (rng.random(n) * 0.3 if "clip" in name else walk_sem) if mapo else np.zeros(n)
        outcome = r.q_star if name == "oracle" else reader
        for s in ("group", "none"):
            adv = gc.episode_advantages(outcome, sem, group, 0.4 if mapo else 0.0, s)[step_rollout]
            if "hpo" in name:  # HPO's advantages vary within a rollout: the steps' path
                adv = adv + 0.1 * rng.normal(size=len(adv))
            replays[(name, s)] = gc.Replayed(adv, outcome, sem, s, 0.4 if mapo else 0.0, rng.random(5))
    return {"checkpoint": "sft-round2", "seed": seed, "first_prompt": first, "rollouts": r, "replays": replays,
            "group": group, "batch_prompts": 2, "recipe_scaling": "group", "parameters": 7, "recipe": recipe,
            "timings": {"all": 1.0}}  # fmt: skip


SETUP = {"date": "today", "command": "test", "start": "x", "sft_steps": 0, "parameters": 7, "timings": {"all": 1.0},
         "minutes": 0.1, "cpu_minutes": 0.2, "load": 1.0, "cores": 1, "gate": None}  # fmt: skip


@pytest.fixture(scope="module")
def analysed():
    patch = pytest.MonkeyPatch()
    patch.setattr(gradient_arms, "PERMUTATIONS", 3)  # the randomised controls' draws: their count changes no code path
    try:
        ms = [synthetic(24, 0), synthetic(16, 2, first=24)]
        results = gc.analyse(ms, folds=4, bootstrap=12, log=lambda *_: None)
        alone = gc.analyse(ms[:1], folds=4, bootstrap=12, log=lambda *_: None)
        twice = gc.analyse([ms[0], ms[0]], folds=4, bootstrap=2, log=lambda *_: None)
        second = gc.analyse(ms[1:], folds=4, bootstrap=2, log=lambda *_: None)
        replications = [
            gc.analyse_replication(synthetic(16, 5), 4, 12, results["batch_sizes"]),
            gc.analyse_replication(synthetic(16, 6, frames=0.0), 4, 12, results["batch_sizes"]),  # no Q* at all
        ]
    finally:
        patch.undo()
    return ms, results, (alone, second), twice, replications


def test_the_primary_figures_add_up_and_pooling_weighs_runs_by_prompts(analysed):
    _, results, (alone, second), twice, _ = analysed
    assert results["batch_sizes"] == [2, gc.RECIPE_PROMPTS] and results["prompts"] == 40
    assert [r["prompt_range"] for r in results["runs"]] == [[0, 23], [24, 39]]
    for s in ("group", "none"):
        for n in results["batch_sizes"]:
            a = results["prop2"]["a"][s][f"b{n}"]
            # information + density = walk - C_zoom, value by value (paired differences of the same gains)
            assert a["information"]["value"] + a["density"]["value"] == pytest.approx(
                a["walk_minus_zoom"]["value"], **FLOAT64_HAND
            )
            assert a["information"]["z"] == pytest.approx(
                a["information"]["value"] / a["information"]["se"], **FLOAT64_HAND
            )
            assert a["information"]["lo"] <= a["information"]["hi"]
            # the verdict follows the rule stated before the numbers
            info, wg = (gc.gs.Difference(a[k]["value"], a[k]["se"]) for k in ("information", "walk_minus_grpo"))
            assert a["verdict"] == gc.gs.prop2a_verdict(info, wg, a["walk_gain"])
    # a run pooled with itself is the run: every point figure is the same
    for key, entry in alone["table"].items():
        for x in gc.DIRECTIONS:
            for figure in ("gain_b2", "gain_b32", "cosine", "with_gradient"):
                assert twice["table"][key][x][figure] == pytest.approx(entry[x][figure], rel=1e-9, nan_ok=True, abs=0)
    assert twice["prop1"]["mixed"]["trace_ratio"] == pytest.approx(
        alone["prop1"]["mixed"]["trace_ratio"], rel=1e-9, abs=0
    )
    # the pooled primary's point lies between its runs', weighted by their prompts (24 and 16)
    per_run = (alone, second)
    for stat in ("inner", "along", "ref2", "mean2", "single2"):
        got = results["table"]["mapo_walk|group"]["q"][stat]
        want = [x["table"]["mapo_walk|group"]["q"][stat] for x in per_run]
        assert got == pytest.approx((24 * want[0] + 16 * want[1]) / 40, rel=1e-9, abs=0)


def test_the_report_states_only_what_results_json_holds(analysed, tmp_path):
    _, results, _, _, replications = analysed
    report = gc.write_report(tmp_path / "experiment.md", results, replications, SETUP)
    text = report.read_text()
    shows = text.split("## What it shows", 1)[1].split("\n## ", 1)[0]
    bullets = [line for line in shows.splitlines() if line.startswith("- ")]
    # the headline leads with Proposition 2 (a)'s contrasts at each batch size, then Proposition 1 in both worlds
    assert [b.split(":", 1)[0] for b in bullets[:2]] == [
        "- **Proposition 2 (a), B = 2 (the experiment's batch), `scale_rewards",
        f"- **Proposition 2 (a), B = {gc.RECIPE_PROMPTS} (the paper recipe's batch), `scale_rewards",
    ]
    assert "information (`mapo_walk` - q = 0)" in bullets[0] and "density (q = 0 - `C_zoom`)" in bullets[0]
    assert "learning-curve" not in text  # the RL experiment writes its own report; a copy of its verdict went stale
    assert any(b.startswith("- **Proposition 1, the world of mixed difficulty") for b in bullets[:6])
    assert any(b.startswith("- **Proposition 1, the recipe's world") for b in bullets[:6])
    record = json.loads((tmp_path / "experiment" / "results.json").read_text())
    assert unbacked_numbers(shows, record) == []
    assert sorted(p.name for p in (tmp_path / "experiment").glob("*.png")) == ["gain_vs_batch.png", "quality.png"]
    # a run whose own sample cannot measure |grad J*|^2 is named so, and not counted among the others' verdicts
    unmeasured = [x for x in replications if not x["measurable"]]
    assert unmeasured and "not measurable" in bullets[-1]
    assert bullets[-1].count(" undefined") == len(replications) - len(unmeasured)


def test_the_headline_check_finds_a_number_results_json_lacks():
    data = {"rate": 0.13125, "d": {"value": -0.0017812, "se": 0.00123, "z": -1.448}, "n": 1024, "b": [2, 32]}
    text = "Q* in 13.1% of 1,024 prompts (`sft-round2`, Proposition 2 (a)): -0.00178 ± 0.00123 (-1.4 SE) at B = 32"
    assert unbacked_numbers(text, data) == []
    assert unbacked_numbers(text.replace("-0.00178", "-0.00179"), data) == ["-0.00179"]
    assert unbacked_numbers(text.replace("-0.00178", "+0.00178"), data) == ["+0.00178"]  # the sign counts
    assert unbacked_numbers(text.replace("13.1%", "13.2%"), data) == ["13.2%"]
    assert unbacked_numbers(text + " and 0.5", data) == ["0.5"]


def test_the_committed_report_headline_is_results_json():
    """Every number of the committed report's "What it shows" is a figure of its results.json (`unbacked_numbers`),
    and the headline leads with the signed information and density contrasts at both batch sizes on the pooled primary,
    then Proposition 1 in both worlds."""
    record = json.loads(RESULTS.read_text(encoding="utf-8"))
    bullets = stages.experiment_verdict(REPORT)
    for bullet in bullets:
        assert unbacked_numbers(bullet, record) == [], bullet
    sizes, s = record["batch_sizes"], record["scaling"]
    assert sizes == [record["batch_prompts"], gc.RECIPE_PROMPTS] and len(record["seeds"]) >= 2
    for bullet, n in zip(bullets, sizes):
        a = record["prop2"]["a"][s][f"b{n}"]
        assert bullet.startswith(f"- **Proposition 2 (a), B = {n} ") and f": {a['verdict']}.**" in bullet
        assert gc.pm_full(a["information"]) in bullet and gc.pm_full(a["density"]) in bullet
    worlds = [b for b in bullets if b.startswith("- **Proposition 1, ")]
    assert len(worlds) == 2 and bullets.index(worlds[0]) < 6
    for world, bullet in zip(("mixed", "recipe"), worlds):
        assert f": {gc.p1_verdict(record['prop1'][world])}.**" in bullet


def test_the_committed_report_is_what_the_generator_writes_from_its_results_json(tmp_path):
    """A change to the report's words reaches the committed report: rendered anew from its results.json
    (`--render`), it is the committed text."""
    folder = tmp_path / REPORT.with_suffix("").name
    folder.mkdir()
    record = json.loads(RESULTS.read_text(encoding="utf-8"))
    replications, setup = record.pop("replications"), record.pop("setup")
    written = gc.write_report(tmp_path / REPORT.name, record, replications, setup)
    assert written.read_text(encoding="utf-8") == REPORT.read_text(encoding="utf-8")


def test_proposition_1s_verdict_carries_its_interval():
    """The mixed world's ratio is below 1 by the 2 SE rule while its percentile interval contains 1: every place
    that gives the verdict gives the interval with it."""
    record = json.loads(RESULTS.read_text(encoding="utf-8"))
    lo, hi = record["prop1"]["mixed"]["trace_ratio_interval"]
    assert record["prop1"]["mixed"]["verdict"] == "holds" and lo < 1 < hi
    [bullet] = [b for b in stages.experiment_verdict(REPORT) if b.startswith("- **Proposition 1, the world of mixed")]
    headline = bullet.split(".**", 1)[0]
    for text in (headline, gc.summary(record), gc.short_summary(record)):
        assert f"holds by the 2 SE rule, though its percentile interval [{lo:.3f}, {hi:.3f}] contains 1" in text
    entry = {"verdict": "holds", "trace_ratio_interval": [0.4, 0.9]}
    assert gc.p1_verdict(entry) == "holds, percentile interval [0.400, 0.900]"
    entry = {"verdict": "inconclusive", "trace_ratio_interval": [0.389, 1.245]}
    assert gc.p1_verdict(entry) == "inconclusive, percentile interval [0.389, 1.245]"


def test_proposition_2b_names_the_constant_bonuses_when_they_do_as_well_as_the_walk():
    """Lower noise over signal than GRPO's holds for the walk arm, and as much or more for the constant bonuses that
    carry no information on which crop framed the target: the verdict says so, with the figures."""
    record = json.loads(RESULTS.read_text(encoding="utf-8"))
    s, b = record["scaling"], record["prop2"]["b"]
    constants = {arm: record["table"][f"{arm}|{s}"]["q"]["noise_over_signal"] for arm in gc.CONSTANT_BONUSES}
    assert b["verdict"] == "holds" and max(constants.values()) <= b["walk"]
    [bullet] = [b for b in stages.experiment_verdict(REPORT) if b.startswith("- **Proposition 2 (b)")]
    figures = ", ".join(f"`{arm}` {v:.1f}" for arm, v in constants.items())
    figures += f", `mapo_walk` {b['walk']:.1f}, `grpo` {b['grpo']:.1f}"
    for text in (bullet, gc.summary(record), gc.short_summary(record)):
        assert "the information-free constant bonuses do as well or better" in text
        assert f"(noise over signal: {figures})" in text
    for arm in gc.CONSTANT_BONUSES:  # the constants worse than the walk: the figures stay, the caveat goes
        record["table"][f"{arm}|{s}"]["q"]["noise_over_signal"] = 2 * b["walk"]
    assert "as well or better" not in gc.prop2b_words(record)
    assert f"`mapo_walk` {b['walk']:.1f}, `grpo` {b['grpo']:.1f})" in gc.prop2b_words(record)


def test_the_readme_and_the_demo_page_quote_the_reports_verdicts():
    """The README's research paragraph and docs/demo.md word each verdict with its qualifier (batch size, scaling,
    world, SE) as `gc.summary` writes it from the committed results.json."""
    record = json.loads(RESULTS.read_text(encoding="utf-8"))
    for page, summary in (("README.md", gc.short_summary(record)), ("docs/demo.md", gc.summary(record))):
        assert unbacked_numbers(summary, record) == []
        text = " ".join((stages.REPO / page).read_text(encoding="utf-8").split())
        assert summary in text, f"{page} does not quote: {summary}"


def test_the_paper_recipes_batch_is_32_prompts():
    recipe = yaml.safe_load((stages.REPO / "recipes" / "mapo_paper.yaml").read_text(encoding="utf-8"))
    processes = yaml.safe_load((stages.REPO / "recipes/accelerate_configs/zero3.yaml").read_text())["num_processes"]
    rollouts = recipe["per_device_train_batch_size"] * recipe["gradient_accumulation_steps"] * processes
    assert rollouts / recipe["num_generations"] == gc.RECIPE_PROMPTS


def test_every_run_at_the_primary_checkpoint_draws_prompts_no_run_before_used():
    args = argparse.Namespace(checkpoints=[2, 1], seeds=[0, 2, 3], rollouts=2560, pooled_rollouts=1024,
                              replication_rollouts=512, group=4)  # fmt: skip
    assert gc.runs(args) == [(2, 0, 2560, 0), (2, 2, 1024, 640), (2, 3, 1024, 896), (1, 0, 512, 0)]


def test_pooled_runs_must_not_share_a_prompt():
    gc.check_independent([{"seed": 0, "prompt_rows": [0, 1, 2]}, {"seed": 2, "prompt_rows": [3, 4]}])
    with pytest.raises(ValueError, match="prompt 2 is measured by the runs of seeds 0 and 2"):
        gc.check_independent([{"seed": 0, "prompt_rows": [0, 1, 2]}, {"seed": 2, "prompt_rows": [2, 3]}])
