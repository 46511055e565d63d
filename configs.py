"""Every recipe dataclass, findable from here (`RECIPE_DATACLASSES`): each field is a flat recipe key and a `--field`
flag, parsed by `utils.recipes.parse_args_and_record` (a key none of them has fails at start with its name).

Defined here, RL's: `ScriptArguments` (data, rewards: sft.py, rl.py) and `MAPOConfig` (rl.py). Defined beside what
they configure, importable from here: `SFTConfig` (`arguments.sft`: sft.py), `EvalArguments` (`arguments.evaluation`:
evaluate.py), `ToolConfig` (`tools.config`: the tools, pixel budgets and, in its `VerifierConfig` fields, the CLIP
verifier: all three entry scripts), `JudgeArguments` (`rewards.judge`: the LLM judge, in `ScriptArguments` and
`EvalArguments`), `TrajectoryArguments` (`data.trajectories`: gold SFT trajectories, sft.py), `HPOArguments`
(`hpo.config`) and `GradientProbeArguments` (`utils.probes`), both composed into `MAPOConfig`. TRL's `ModelConfig`
completes the entry scripts' tuples.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, fields

import trl
from trl import GRPOConfig

from arguments.evaluation import EvalArguments
from arguments.sft import FREEZE_PEERS, FROZEN_PARTS, SFTConfig, freeze_field
from data import DATASETS
from data.synthetic import DEFAULT_IMAGE_SIZE, DEFAULT_OBJECT_FRACTION, QUESTION_TYPES
from data.trajectories import TrajectoryArguments
from hpo.config import HPOArguments
from mapo import SEMANTIC_SCORES
from repairs.over_turn import ROW_MEAN_LOSSES
from repairs.resume import resolve_resume
from rewards import get_reward_funcs
from rewards.judge import JudgeArguments
from rewards.verifiers import VERIFIERS, verifier_factory
from tools import ToolConfig, VerifierConfig
from utils.checks import check_ranges, check_vllm_version
from utils.probes import GradientProbeArguments


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


ADVANTAGE_ESTIMATORS = ("grpo", "mapo", "hpo", "mapo+hpo")
GRPO_FIELDS = {f.name for f in fields(GRPOConfig)}


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

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "FREEZE_PEERS",
    "FROZEN_PARTS",
    "GRPO_FIELDS",
    "RECIPE_DATACLASSES",
    "ROW_MEAN_LOSSES",
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
    "freeze_field",
]
