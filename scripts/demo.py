"""`make demo`: the whole pipeline on the tiny offline models, on CPU, in a few minutes (docs/demo.md).

Trains the tiny CLIP verifier, generates a synthetic split, evaluates the untrained policy, runs SFT and MAPO RL
through the real entry points with the tiny recipes (`tiny.stages`, shared with `research/experiment.py`), evaluates
after each, and writes `outputs/demo/summary.json`: accuracy beside chance, and a warning per stage with no signal.

    python -m scripts.demo [--rl_steps 16 ...]   (make demo)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from tiny.stages import (
    EXPERIMENT_REPORT,
    SUMMARY_KEYS,
    Stages,
    add_stage_arguments,
    eval_summary,
    evaluate,
    experiment_verdict,
    make_data,
    rl_argv,
    rl_endpoint,
    rl_overview,
    rl_step_log,
    rollout_budget,
    run_rl,
    run_sft,
    signal_warnings,
    tiny_kit,
    train_verifier,
)


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_summary(summary: dict, path: Path) -> None:
    """The summary as plain tables: tool use per stage, then accuracy beside chance per question type, then warnings
    (last, so they are what a reader sees)."""
    print(f"\nCLIP verifier, held-out top-1 label retrieval: {summary['clip_verifier']}")
    widths = [len(k) + 2 for k in SUMMARY_KEYS]
    print(f"{'stage':<8}" + "".join(k.rjust(w) for k, w in zip(SUMMARY_KEYS, widths)))
    for stage, metrics in summary["eval"].items():
        print(f"{stage:<8}" + "".join(_number(metrics[k]).rjust(w) for k, w in zip(SUMMARY_KEYS, widths)))

    sources = sorted({s for metrics in summary["eval"].values() for s in metrics["chance_by_source"]})
    names = [s.removeprefix("synthetic/") for s in sources]
    print("\naccuracy / chance, by question type")
    print(f"{'stage':<8}{'all':>15}" + "".join(f"{name:>15}" for name in names))
    for stage, metrics in summary["eval"].items():
        pairs = [(metrics["accuracy"], metrics["chance"])]
        pairs += [(metrics["accuracy_by_source"].get(s), metrics["chance_by_source"].get(s)) for s in sources]
        print(f"{stage:<8}" + "".join(f"{_number(acc)} / {_number(chance)}".rjust(15) for acc, chance in pairs))

    overview = summary["rl_overview"]
    print(
        f"\nRL over {overview['steps']} steps: R_sem mean {_number(overview['r_sem_mean'])}, non-zero in "
        f"{overview['r_sem_nonzero_steps']}; valid-call rate mean {_number(overview['valid_call_rate_mean'])}; "
        f"calls per rollout mean {_number(overview['calls_per_rollout_mean'])}"
    )
    first, last = summary["rl_first_step"], summary["rl_last_step"]
    print("\nRL, first -> last step: " + ", ".join(f"{k} {_number(first[k])} -> {_number(last[k])}" for k in first))
    verdict = experiment_verdict()
    if verdict:
        print(
            "\nDoes MAPO's signal act? The demo cannot tell (one run, 16 steps); `make experiment` tests it with controls:"
        )
        print("\n".join(verdict) + f"\n(from {EXPERIMENT_REPORT.relative_to(EXPERIMENT_REPORT.parents[1])})")
    print(f"\nsummary: {path}   reports: {path.parent / 'eval'}/*/report.html   total {summary['seconds']['total']} s")
    for warning in summary["warnings"]:
        print(f"WARNING: {warning}")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", type=Path, default=Path("outputs/demo"))
    add_stage_arguments(parser)
    parser.add_argument("--rl_steps", type=int, default=16)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict:
    args = parse_args(argv)
    out = args.output_dir
    stage = Stages()
    kit = tiny_kit()
    clip_dir, data_dir, sft_dir, rl_dir = out / "clip", out / "data", out / "sft", out / "rl"
    clip = stage("train the CLIP verifier", lambda: train_verifier(clip_dir, kit, args.clip_steps))
    stage("generate synthetic data", lambda: make_data(data_dir, args.train_rows, args.test_rows))

    def evaluate_stage(name: str, model: Path, **overrides) -> dict:
        eval_dir = out / "eval" / name
        return eval_summary(evaluate(model, data_dir, eval_dir, args.test_rows, **overrides), eval_dir)

    results = {}
    # No record yet for the untrained policy and SFT (SFT scores nothing with CLIP, so its record names no
    # verifier): they get RL's rollout budget and the trained verifier.
    before_rl = {"clip_model": clip_dir, **rollout_budget()}
    results["base"] = stage(
        "evaluate the untrained policy", lambda: evaluate_stage("base", kit["policy"], **before_rl)
    )
    stage("SFT cold start", lambda: run_sft(kit["policy"], data_dir, sft_dir, args.sft_steps))
    results["sft"] = stage("evaluate after SFT", lambda: evaluate_stage("sft", sft_dir, **before_rl))
    log_history = stage("MAPO RL", lambda: run_rl(rl_argv(sft_dir, data_dir, clip_dir, rl_dir, args.rl_steps)))
    results["rl"] = stage("evaluate after RL", lambda: evaluate_stage("rl", rl_dir))

    steps = rl_step_log(log_history)
    summary = {
        "clip_verifier": clip,
        "eval": results,
        "rl_steps": steps,
        "rl_first_step": rl_endpoint(steps[0]) if steps else {},
        "rl_last_step": rl_endpoint(steps[-1]) if steps else {},
        "rl_overview": rl_overview(steps),
    }
    summary["warnings"] = signal_warnings(summary)
    summary["seconds"] = {**stage.seconds, "total": stage.total()}
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print_summary(summary, path)
    return summary


if __name__ == "__main__":
    main()
