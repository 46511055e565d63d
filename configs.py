"""Every recipe dataclass, findable from here (`RECIPE_DATACLASSES`): each field is a flat recipe key and a `--field`
flag, parsed by `utils.recipes.parse_args_and_record` (a key none of them has fails at start with its name).

Defined here: `ScriptArguments` (data, rewards: sft.py, rl.py), `MAPOConfig` (RL: rl.py), `SFTConfig` (SFT:
sft.py), `EvalArguments` (evaluate.py). Defined beside what they configure, re-exported here: `ToolConfig`
(`tools.config`: the tools, pixel budgets and, in its `VerifierConfig` fields, the CLIP verifier: all three entry
scripts), `JudgeArguments` (`rewards.judge`: the LLM judge, in `ScriptArguments` and `EvalArguments`),
`TrajectoryArguments` (`data.trajectories`: gold SFT trajectories, sft.py), `HPOArguments` (`hpo.config`) and
`GradientProbeArguments` (`utils.probes`), both composed into `MAPOConfig`. TRL's `ModelConfig` completes the entry
scripts' tuples.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields
from pathlib import Path

import trl
from trl import GRPOConfig

from data import DATASETS
from data.benchmarks import BENCHMARKS
from data.synthetic import DEFAULT_IMAGE_SIZE, DEFAULT_OBJECT_FRACTION, QUESTION_TYPES
from data.trajectories import TrajectoryArguments
from hpo.config import HPOArguments
from mapo import SEMANTIC_SCORES
from repairs.resume import resolve_resume
from rewards import get_reward_funcs
from rewards.judge import JudgeArguments
from rewards.verifiers import VERIFIERS, verifier_factory
from tools import ToolConfig, VerifierConfig
from utils.checks import EVAL_RANGES, check_ranges, check_vllm_version
from utils.probes import GradientProbeArguments

__all__ = [
    "RECIPE_DATACLASSES",
    "EvalArguments",
    "GradientProbeArguments",
    "HPOArguments",
    "JudgeArguments",
    "MAPOConfig",
    "SFTConfig",
    "ScriptArguments",
    "ToolConfig",
    "TrajectoryArguments",
    "VerifierConfig",
]


@dataclass
class ScriptArguments(trl.ScriptArguments, JudgeArguments):
    """TRL's script arguments plus what this repo's recipes choose by name, and the LLM judge a reward may ask."""

    dataset_name: str = field(
        default="synthetic",
        metadata={"help": f"A dataset builder by name ({', '.join(sorted(DATASETS))}) or a `save_to_disk` folder."},
    )
    dataset_path: list[str] | None = field(
        default=None,
        metadata={
            "help": "Files or folders a named dataset builder reads; several are read in turn and concatenated (ids "
            "stay unique: each reader prefixes them with its file)."
        },
    )
    num_samples: int = field(default=64, metadata={"help": "Rows to generate, for generated datasets (synthetic)."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of generated datasets."})
    synthetic_image_size: list[int] = field(
        default_factory=lambda: list(DEFAULT_IMAGE_SIZE),
        metadata={"help": "Synthetic data: the range each image side is drawn from, in pixels (low, high)."},
    )
    synthetic_object_fraction: list[float] = field(
        default_factory=lambda: list(DEFAULT_OBJECT_FRACTION),
        metadata={"help": "Synthetic data: object size range as a fraction of the image's short side."},
    )
    synthetic_question_types: list[str] = field(
        default_factory=lambda: list(QUESTION_TYPES),
        metadata={"help": f"Synthetic data: the question types to cycle through, a subset of {list(QUESTION_TYPES)}."},
    )
    synthetic_region_hint: bool = field(
        default=False,
        metadata={"help": "Synthetic data: each question names the 3x3 grid cell of its target (the tiny policy)."},
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["outcome", "format"],
        metadata={"help": "Outcome rewards: names in rewards.REWARDS or import paths 'package.module:function'."},
    )

    def __post_init__(self):
        if isinstance(self.dataset_path, str):  # a recipe's single file: `dataset_path: /data/x.parquet`
            self.dataset_path = [self.dataset_path]
        get_reward_funcs(self.reward_funcs)  # an unknown name or a broken import path fails at parse, naming it


FROZEN_PARTS = {
    "vision_tower": "the vision tower (model.visual: patch embedding, blocks; on Qwen3-VL its deepstack mergers too)",
    "projector": "the projector into the language model (model.visual.merger)",
}
FREEZE_PEERS = {
    True: "Mini-o3's cold start (LLaMA-Factory's defaults)",
    False: "Mini-o3's and DeepEyes' RL (verl trains the whole model)",
}


def freeze_field(part: str, default: bool, stage: str):
    """A `freeze_vision_tower` / `freeze_projector` field (`utils.trainable`, applied by `utils.policy.load_policy`):
    the same help in SFT and RL, each stage with its peers' default."""
    return field(
        default=default,
        metadata={
            "help": f"Freeze {FROZEN_PARTS[part]}: its weights do not train and, under LoRA, get no adapter. "
            f"{stage} default: {str(default).lower()}, as {FREEZE_PEERS[default]}."
        },
    )


@dataclass
class SFTConfig(trl.SFTConfig):
    """TRL's `SFTConfig` (every field keeps its meaning) plus which parts of the policy stay frozen."""

    freeze_vision_tower: bool = freeze_field("vision_tower", True, "SFT")
    freeze_projector: bool = freeze_field("projector", True, "SFT")

    def __post_init__(self):
        check_ranges(self)  # utils.checks.FIELD_RANGES: a NaN or 0 batch would fail, or not, once the model loads
        super().__post_init__()
        resolve_resume(self)  # nothing intact to resume from fails here, not after the weights load


ADVANTAGE_ESTIMATORS = ("grpo", "mapo", "hpo", "mapo+hpo")
GRPO_FIELDS = {f.name for f in fields(GRPOConfig)}
# TRL's losses that average over a micro-batch's rows (dr_grpo: rows x max_completion_length), so a row out of the loss
# still counts; `MAPOTrainer._compute_loss` renormalises them over the generation batch's rows left in (the others
# count tokens).
ROW_MEAN_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")


@dataclass
class MAPOConfig(GRPOConfig, HPOArguments, GradientProbeArguments):
    """`GRPOConfig` (every field keeps its meaning) plus MAPO's fields (the semantic reward), and, composed in with
    their flat keys, HPO's step advantage (`hpo.config.HPOArguments`) and the gradient-variance probes
    (`utils.probes.GradientProbeArguments`)."""

    advantage_estimator: str = field(
        default="mapo",
        metadata={
            "help": "'mapo': group-normalised R_out + semantic_beta * R_sem (eq. 3). 'grpo': R_out only (R_sem "
            "logged). 'hpo': GRPO's advantage mixed per turn with HPO's step advantage (HPO eq. 17). 'mapo+hpo': "
            "the same over MAPO's.",
            "choices": list(ADVANTAGE_ESTIMATORS),
        },
    )
    semantic_beta: float = field(default=0.4, metadata={"help": "beta, the weight of R_sem (eq. 3; paper: 0.4)."})
    semantic_lambda: float = field(
        default=0.95,
        metadata={"help": "lambda, the trajectory discount in R_sem = (1/T) sum_t lambda^(T-t) z_t (paper: 0.95)."},
    )
    semantic_score: str = field(
        default="cosine",
        metadata={
            "help": "Scale of z_t (the paper does not say): 'cosine', raw, in [-1, 1]; 'clipscore', 2.5 * max(cosine, "
            "0); 'contrastive', cosine(label, crop) - cosine(label, whole image), against label hacking (ours).",
            "choices": list(SEMANTIC_SCORES),
        },
    )
    semantic_verifier: str = field(
        default="clip",
        metadata={
            "help": f"What scores z_t: a name in rewards.verifiers.VERIFIERS ({', '.join(VERIFIERS)}: the paper's, "
            "the CLIP of VerifierConfig's clip_* fields) or an import path 'package.module:factory' "
            "(rewards.verifiers)."
        },
    )
    no_tool_semantic: float = field(default=0.0, metadata={"help": "R_sem when T = 0 (the paper does not say)."})
    mask_over_turn: bool = field(
        default=False,
        metadata={
            "help": "Leave out of the loss every rollout that ends on a tool call that never ran (over-turn: out of "
            "tool rounds or tokens), Mini-o3's `ignore_exceed`: it still counts in its group's statistics, only its "
            "tokens leave the loss and its normaliser (docs/method.md). Logged either way as tools/over_turn_frac.",
        },
    )

    vllm_dtype: str = field(
        default="auto",
        metadata={
            "help": "dtype of the colocated vLLM engine (TRL leaves it to vLLM); float32 on CPU: trainer logprobs.",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )
    vllm_enforce_eager: bool = field(
        default=False, metadata={"help": "Colocated vLLM engine without torch.compile and CUDA graphs (docs/vllm.md)."}
    )
    freeze_vision_tower: bool = freeze_field("vision_tower", False, "RL")
    freeze_projector: bool = freeze_field("projector", False, "RL")
    signal_window_steps: int = field(
        default=10,
        metadata={
            "help": "Optimizer steps the warning of a run that cannot learn judges together (utils.diagnostics."
            "LearningSignalCheck): no verdict on fewer, so one unlucky logging window does not warn."
        },
    )

    def __post_init__(self):
        check_ranges(self)  # before TRL's own, which divides by num_generations
        super().__post_init__()
        resolve_resume(self)
        check_vllm_version(self.use_vllm)  # TRL only warns about a vLLM outside its range
        verifier_factory(self.semantic_verifier)  # an unknown name or a broken import path fails at parse
        for f in fields(MAPOConfig):  # the fields this class adds that name their choices; GRPO's are TRL's to check
            choices = f.metadata.get("choices")
            if choices is not None and f.name not in GRPO_FIELDS and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {choices}; got {getattr(self, f.name)!r}")
        if self.gradient_variance_batches == 1:
            raise ValueError("gradient_variance_batches needs at least 2 batches for a variance (0: off)")
        entropy = self.entropy_coef or self.use_adaptive_entropy
        if self.mask_over_turn and self.loss_type in ROW_MEAN_LOSSES and entropy:
            raise ValueError(
                f"mask_over_turn under loss_type={self.loss_type!r} renormalises the loss over the generation "
                "batch's rollouts left in it, which would rescale the entropy bonus too: set entropy_coef: 0 and "
                "use_adaptive_entropy: false, or use a token-normalised loss_type (dapo, bnpo)."
            )
        if self.uses_semantic and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r} normalises the composite R_out + beta * R_sem "
                "(eq. 3), which is multi_objective_aggregation='sum_then_normalize'; got "
                f"{self.multi_objective_aggregation!r}."
            )
        if not self.uses_semantic:
            # a recipe cannot tell a value that trains from one only logged: say which of its R_sem fields move nothing
            changed = [
                f"{f.name}={getattr(self, f.name)!r}"
                for f in fields(MAPOConfig)
                if "semantic" in f.name and getattr(self, f.name) != f.default
            ]
            if changed:
                warnings.warn(
                    f"advantage_estimator={self.advantage_estimator!r} does not train on R_sem, it only logs it, so "
                    f"{', '.join(changed)} {'moves' if len(changed) == 1 else 'move'} no gradient (semantic_beta "
                    "weighs nothing; the others shape the logged R_sem): 'mapo' or 'mapo+hpo' train on R_sem.",
                    stacklevel=3,  # the dataclass's __init__ calls this: name its caller
                )

    @property
    def uses_semantic(self) -> bool:
        """R_sem moves the policy (weight semantic_beta) rather than being logged only."""
        return self.advantage_estimator in ("mapo", "mapo+hpo")

    @property
    def uses_hpo(self) -> bool:
        """Advantages are per turn, mixed with HPO's step advantage."""
        return self.advantage_estimator in ("hpo", "mapo+hpo")


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
        if self.output_dir is None:
            name = f"{Path(self.model_name_or_path).name}-{self.benchmark}"
            if self.data_path:
                name += f"-{Path(self.data_path[0]).stem}"
            self.output_dir = str(Path("outputs") / "eval" / name)


# Every dataclass whose fields a recipe sets, the composed parts included (tests/test_configs.py checks the entry
# scripts' tuples against it).
RECIPE_DATACLASSES = (
    ScriptArguments,
    JudgeArguments,
    MAPOConfig,
    HPOArguments,
    GradientProbeArguments,
    SFTConfig,
    EvalArguments,
    ToolConfig,
    VerifierConfig,
    TrajectoryArguments,
)
