"""Summarise a `scripts/gpu_check.sh` run: `python -m scripts.gpu_check_summary <its output folder>`.

Reads `stages.tsv` (stage, exit code, seconds), `bench7b.json` and `<config>.json` (`scripts/rl_forced.py` under
zero2/zero3/fsdp2); writes `gpu_check.json` and `gpu_check.md`, the section for docs/benchmarks.md. A stage that
failed or timed out is reported as such, never left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

TIMEOUT_CODES = {124: "timed out", 137: "killed (timeout or memory)", 200: "skipped (budget spent)"}


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def status(rc: int) -> str:
    return "ok" if rc == 0 else TIMEOUT_CODES.get(rc, f"failed (exit {rc})")


def fmt(value, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def summarise(out: Path) -> tuple[dict, str]:
    stages = {}
    for line in (out / "stages.tsv").read_text().splitlines():
        name, rc, seconds = line.split("\t")
        stages[name] = {"rc": int(rc), "seconds": int(seconds), "status": status(int(rc))}
    header = (out / "env.txt").read_text().strip() if (out / "env.txt").exists() else ""
    lines = ["### GPU check (`scripts/gpu_check.sh`)", "", "```", header, "```", ""]

    bench = read_json(out / "bench7b.json")
    step = (bench or {}).get("step_time", {})
    lines += ["#### MAPO against GRPO at 7B shape, paired in one process (`bench.py --shape 7b`)", ""]
    if step:
        s = step["settings"]
        lines += [
            f"Random-weight Qwen2.5-VL-7B architecture ({step['parameters_b']:.2f} B parameters, {step['dtype']}) on "
            f"{step['device']}; {s['batch']} rollouts (G = {s['num_generations']}), {s['max_completion_length']} new "
            f"tokens per turn, prompt images <= {s['max_pixels']} pixels, {s['clip_model']} verifier; "
            f"{step['pairs']} timed pairs after {step['warmup_pairs']} warm-up pair(s).",
            "",
            "| | median step | peak memory |",
            "|---|---|---|",
            f"| GRPO (stock `GRPOTrainer`) | {fmt(step['median_step_s']['grpo'])} s | "
            f"{fmt((step.get('peak_memory_gib') or {}).get('grpo'), '.1f')} GiB |",
            f"| MAPO (`MAPOTrainer`) | {fmt(step['median_step_s']['mapo'])} s | "
            f"{fmt((step.get('peak_memory_gib') or {}).get('mapo'), '.1f')} GiB |",
            f"| **ratio MAPO / GRPO** | **{step['ratio_mapo_over_grpo']:.3f}** | |",
            "",
            f"Verifier (`_semantic_reward`, CLIP included): {step['median_semantic_reward_s'] * 1e3:.1f} ms per "
            f"MAPO step (median), {100 * step['verifier_share_of_mapo_step']:.2f}% of it "
            f"({step['crops_scored_per_mapo_step']} crops scored per step).",
        ]
        for name, clip in (bench.get("clip_throughput") or {}).items():
            lines.append(f"CLIP {name}: {clip['crops_per_s']:.0f} crops/s ({clip['dtype']}, batch {clip['batch']}).")
    else:
        lines.append(f"Not measured: the stage {stages.get('bench7b', {}).get('status', 'did not run')}.")
    lines += [
        "",
        "#### Tiny MAPO recipe on one GPU (`scripts/rl_forced.py`: rl.py with forced tool calls)",
        "",
        "| accelerate config | status | steps | median step (after the first) | peak memory, training | peak memory, "
        "generation | R_sem computed |",
        "|---|---|---|---|---|---|---|",
    ]
    runs = {}
    for config in ("zero2", "zero3", "fsdp2"):
        run = runs[config] = read_json(out / f"{config}.json")
        stage = stages.get(config, {"status": "did not run"})
        if run is None:
            lines.append(f"| {config} | {stage['status']} | | | | | |")
            continue
        lines.append(
            f"| {config} | {stage['status']} | {len(run['steps'])} | {fmt(run['median_step_s_after_first'])} s | "
            f"{fmt(run['peak_memory_gib'])} GiB | {fmt(run.get('generation_peak_memory_gib'))} GiB | "
            f"{'yes' if run['ok'] else 'no'} |"
        )
    lines += ["", "Stages: " + ", ".join(f"{n} {v['status']} in {v['seconds']} s" for n, v in stages.items()) + "."]
    return {"stages": stages, "bench7b": bench, "recipes": runs}, "\n".join(lines) + "\n"


def main() -> None:
    out = Path(sys.argv[1])
    data, markdown = summarise(out)
    (out / "gpu_check.json").write_text(json.dumps(data, indent=2))
    (out / "gpu_check.md").write_text(markdown)
    print(markdown)


if __name__ == "__main__":
    main()
