"""Evaluation's recipe dataclass, `EvalArguments` (evaluate.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from data.benchmarks import BENCHMARKS
from rewards import get_reward_funcs
from rewards.judge import JudgeArguments
from utils.checks import EVAL_RANGES, check_ranges


@dataclass
class EvalArguments(JudgeArguments):
    """What to evaluate, on what, and how. Every field is also a command-line flag and a `--config` YAML key."""

    model_name_or_path: str = field(metadata={"help": "Checkpoint (local folder or hub name) to evaluate."})
    benchmark: str = field(default="synthetic", metadata={"help": "Benchmark reader.", "choices": list(BENCHMARKS)})
    data_path: list[str] | None = field(
        default=None,
        metadata={
            "help": "What you downloaded (docs/evaluation.md), one path or several of one format (read in turn, as "
            "RL's dataset_path); None for synthetic: generated."
        },
    )
    split: str | None = field(default=None, metadata={"help": "Split, for formats that have them (synthetic)."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Default: outputs/eval/<model>-<benchmark>[-<data>]."}
    )
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N rows (quick runs)."})
    sample_seed: int | None = field(
        default=None,
        metadata={
            "help": "With limit: a seeded random sample of limit rows across the data instead of the first ones."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Also score every rollout with these RL rewards (names in rewards.REWARDS or import paths), as "
            "training would: samples.jsonl records each, metrics.json their means and how many rollouts each paid "
            "(the reproduction's probe of the RL data, scripts/reproduce.py)."
        },
    )
    skip_bad_rows: bool = field(default=False, metadata={"help": "Skip (and count) invalid benchmark rows."})
    backend: str = field(
        default="transformers", metadata={"help": "Generation backend.", "choices": ["transformers", "vllm"]}
    )
    batch_size: int = field(default=8, metadata={"help": "Samples whose turns are generated together."})
    max_completion_length: int = field(
        default=2048,
        metadata={"help": "Tokens per rollout. Default: the checkpoint's RL record, else recipes/mapo_paper.yaml's."},
    )
    max_tool_calling_iterations: int | None = field(
        default=5,
        metadata={
            "help": "Tool rounds per rollout. Default: the checkpoint's RL record, else recipes/mapo_paper.yaml's."
        },
    )
    temperature: float = field(default=0.0, metadata={"help": "0: greedy decoding."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling, when temperature > 0."})
    seed: int = field(default=0, metadata={"help": "Seed for sampled decoding."})
    samples: int = field(
        default=1,
        metadata={"help": "Rollouts per question (k of Avg@k, needs temperature > 0); metrics.json's avg_at_k."},
    )
    no_tools: bool = field(
        default=False,
        metadata={
            "help": "Withhold the tools: the prompt says none is available, no schema is rendered, a call is never "
            "run (what the tool adds; docs/evaluation.md)."
        },
    )
    with_tools_run: str | None = field(
        default=None,
        metadata={
            "help": "With --no_tools: the output folder of this model's run with its tools on the same rows; "
            "metrics.json's tool_effect sets the two against each other, question by question."
        },
    )
    shuffle_options: str = field(
        default="auto",
        metadata={
            "help": "Also evaluate each question with its options shuffled by this seed: 'auto' (seed 0 where every "
            "right option sits under one letter as read, as in V*'s annotations), 'off', or a seed; answer_order."
        },
    )
    dtype: str = field(default="auto", metadata={"help": "Model dtype (auto, bfloat16, float32...)."})
    attn_implementation: str | None = field(default=None, metadata={"help": "e.g. sdpa or flash_attention_2."})
    device: str | None = field(default=None, metadata={"help": "Model and CLIP device (default: cuda if any)."})
    judge: bool = field(
        default=False,
        metadata={
            "help": "Ask the LLM judge (judge_* keys) to rule on the answers no scoring rule reads, as DeepEyes' "
            "evaluation does (default judge_verdict: deepeyes_eval, judge_prompt its eval/judge_result.py)."
        },
    )
    report_max_samples: int = field(default=500, metadata={"help": "Samples shown in report.html."})
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM backend only."})
    vllm_max_model_len: int | None = field(default=None, metadata={"help": "vLLM backend only."})
    vllm_max_images: int = field(default=16, metadata={"help": "vLLM backend only: images per conversation."})
    vllm_enforce_eager: bool = field(default=False, metadata={"help": "vLLM backend only: no torch.compile."})

    def __post_init__(self):
        check_ranges(self, EVAL_RANGES)  # batch_size -1 would hang once the model loads
        if isinstance(self.data_path, str):  # one path, from a YAML recipe or an older eval_args.json
            self.data_path = [self.data_path]
        get_reward_funcs(self.reward_funcs)  # an unknown name or a broken import path fails at parse, naming it
        if self.with_tools_run is not None and not self.no_tools:
            raise ValueError("with_tools_run: compares a --no_tools run with a run with tools; set --no_tools too")
        if self.with_tools_run is not None and not (Path(self.with_tools_run) / "samples.jsonl").is_file():
            raise ValueError(
                f"with_tools_run: {self.with_tools_run} has no samples.jsonl (an evaluation's output folder)"
            )
        if self.output_dir is None:
            name = f"{Path(self.model_name_or_path).name}-{self.benchmark}"
            if self.data_path:
                name += f"-{Path(self.data_path[0]).stem}"
            self.output_dir = str(Path("outputs") / "eval" / name)
