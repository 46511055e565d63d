"""How many lines a reader of one RL step reads (issue 63, item 3): the modules a default MAPO step on one process
runs code from, from `rl.py` through the recipe's dataclasses, the trainer's hooks, the tools, the outcome reward and
the verifier, MAPO's math, TRL's rollout as the repo mends it, to the task's answer rules.

The list is explicit (`STEP_MODULES`), checked against the real import graph of `rl.py` (tests/test_layout.py's):
every module in it is one `rl.py` imports, directly or not, and it holds every module of the issue's path. Left out,
as a default step runs none of their code: start-up (`repairs.token_budget`, `tools.families`, `tools.environments`:
the environment class built once), the checkpoint record (`tools.record`), what the agent is told (`data.prompt`:
written into the dataset before training), calls written by hand (`tools.calls`), what a default recipe leaves off
(`tools.rotate`; HPO: `hpo`; the over-turn mask: `repairs.over_turn`; vLLM: `repairs.vllm_setup`, `repairs.
vllm_images`; the gradient probes: `utils.probes`), the other stages' dataclasses (`arguments`), judged rewards.
"""

from __future__ import annotations

from pathlib import Path

from test_layout import REPO, import_graph, modules

STEP_MODULES = (
    "rl",
    "configs",
    "mapo_trainer",
    "tools",
    "tools.config",
    "tools.registry",
    "tools.env",
    "tools.zoom_in",
    "rewards.outcome",
    "rewards.verifiers",
    "mapo",
    "repairs.rollout",
    "repairs.tool_rounds",
    "data.task",
)
# The issue's path: rl.py -> configs -> trainer -> tools -> rewards -> MAPO -> repairs -> task.
PATH = ("rl", "configs", "mapo_trainer", "tools", "rewards.outcome", "mapo", "repairs.rollout", "data.task")
GOAL = 2000  # issue 63's (2,391 lines in 14 files before it)


def step_lines() -> dict[str, int]:
    found = modules(REPO)
    return {name: len(Path(found[name]).read_text(encoding="utf-8").splitlines()) for name in STEP_MODULES}


def test_the_step_modules_are_what_rl_imports_and_hold_the_issues_path():
    graph, _ = import_graph(REPO)
    reached, todo = set(), ["rl"]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += sorted(graph[name])
    assert set(STEP_MODULES) <= reached, sorted(set(STEP_MODULES) - reached)
    assert set(PATH) <= set(STEP_MODULES)


def test_one_rl_step_reads_at_most_2000_lines():
    lines = step_lines()
    total = sum(lines.values())
    print(f"\none RL step reads {total} lines in {len(lines)} modules (at most {GOAL}):")
    for name, count in sorted(lines.items(), key=lambda item: -item[1]):
        print(f"  {count:5d}  {name}")
    assert total <= GOAL, f"one RL step reads {total} lines, over {GOAL}"
