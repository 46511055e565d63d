"""Every dataclass whose fields a recipe key can set, in one place.

A recipe (or the command line) sets fields of these; `utils.recipes.parse_args_and_record` parses each entry script's
tuple of them, and a key none of them has fails at start with its name:

| dataclass | fields for | entry scripts |
|---|---|---|
| `ScriptArguments` (TRL's, plus this repo's) | data, rewards | sft.py, rl.py |
| `MAPOConfig` (TRL's `GRPOConfig` plus the estimators' fields) | RL | rl.py |
| `trl.SFTConfig` | SFT | sft.py |
| `trl.ModelConfig` | the policy, LoRA | sft.py, rl.py |
| `ToolConfig` (defined in `tools/config.py`) | the zoom-in tool, pixel budgets, CLIP verifier | all three |
| `TrajectoryArguments` (defined in `data/trajectories.py`) | gold SFT trajectories | sft.py |
| `EvalArguments` | what to evaluate and how | evaluate.py |

`ToolConfig` and `TrajectoryArguments` live beside the code that reads them (the tool and data packages, which sit
below this module) and are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import trl
from trl import GRPOConfig

from data import DATASETS
from data.benchmarks import BENCHMARKS
from data.synthetic import DEFAULT_IMAGE_SIZE, DEFAULT_OBJECT_FRACTION, QUESTION_TYPES
from data.trajectories import TrajectoryArguments
from hpo import HPO_SOLVERS, MAX_OFF_TRAJECTORIES, MIN_NEGATIVE_STEPS, MIN_POSITIVE_STEPS
from mapo import SEMANTIC_SCORES
from rewards import get_reward_funcs
from rewards.verifiers import VERIFIERS, verifier_factory
from tools import ToolConfig
from utils.checks import check_vllm_version

__all__ = ["EvalArguments", "MAPOConfig", "ScriptArguments", "ToolConfig", "TrajectoryArguments"]


@dataclass
class ScriptArguments(trl.ScriptArguments):
    """TRL's script arguments plus what this repo's recipes choose by name."""

    dataset_name: str = field(
        default="synthetic",
        metadata={"help": f"A dataset builder by name ({', '.join(sorted(DATASETS))}) or a `save_to_disk` folder."},
    )
    dataset_path: str | None = field(
        default=None, metadata={"help": "Local file or folder a named dataset builder reads (benchmarks, DeepEyes)."}
    )
    num_samples: int = field(default=64, metadata={"help": "Rows to generate, for generated datasets (synthetic)."})
    dataset_seed: int = field(default=0, metadata={"help": "Seed of generated datasets."})
    synthetic_image_size: list[int] = field(
        default_factory=lambda: list(DEFAULT_IMAGE_SIZE),
        metadata={
            "help": "Synthetic data: the range each image side is drawn from, in pixels (low, high). Larger than the "
            "crop budget needs wastes decoding time: the tiny policy sees ~112 px crops of its zooms."
        },
    )
    synthetic_object_fraction: list[float] = field(
        default_factory=lambda: list(DEFAULT_OBJECT_FRACTION),
        metadata={
            "help": "Synthetic data: object size range as a fraction of the image's short side. With the pixel "
            "budget (max_pixels) it sets how many pixels a target covers in the image the model sees, and so "
            "whether it can be read without zooming."
        },
    )
    synthetic_question_types: list[str] = field(
        default_factory=lambda: list(QUESTION_TYPES),
        metadata={"help": f"Synthetic data: the question types to cycle through, a subset of {list(QUESTION_TYPES)}."},
    )
    synthetic_region_hint: bool = field(
        default=False,
        metadata={
            "help": "Synthetic data: each question names the cell of the image's 3x3 grid that holds its target "
            "('Look in the top left of the image.'), for a policy that cannot localize from pixels (the tiny one)."
        },
    )
    reward_funcs: list[str] = field(
        default_factory=lambda: ["outcome", "format"],
        metadata={
            "help": "Outcome reward functions, each a name in rewards.REWARDS or an import path "
            "'package.module:function' (a TRL reward function; imported when the recipe is parsed)."
        },
    )

    def __post_init__(self):
        get_reward_funcs(self.reward_funcs)  # an unknown name or a broken import path fails at parse, naming it


ADVANTAGE_ESTIMATORS = ("grpo", "mapo", "hpo", "mapo+hpo")


HPO_HINDSIGHT = ("online", "offline")
HPO_FALLBACK = ("scaled", "unscaled")


GRPO_FIELDS = {f.name for f in fields(GRPOConfig)}
# TRL's losses that average over the rows of a micro-batch (grpo, sapo, luspo: the mean of the rows' terms; dr_grpo:
# divided by rows x max_completion_length), so a row out of the loss still counts among them; the others normalise by
# the tokens in the loss (bnpo: the micro-batch's; dapo, cispo, vespo: `num_items_in_batch`, which `mask_over_turn`
# recounts). `MAPOTrainer._compute_loss` renormalises the first over the rows left in the loss.
ROW_MEAN_LOSSES = ("grpo", "sapo", "luspo", "dr_grpo")


@dataclass
class MAPOConfig(GRPOConfig):
    """`GRPOConfig` plus the fields of the advantage estimators (`advantage_estimator`: MAPO's semantic reward, HPO's
    step advantage) and of the gradient-variance probe. Every GRPO field keeps its meaning."""

    advantage_estimator: str = field(
        default="mapo",
        metadata={
            "help": "How advantages are formed. 'mapo': group-normalised R_out + semantic_beta * R_sem (eq. 3). "
            "'grpo': outcome rewards only; R_sem is still computed and logged, with weight 0. 'hpo': GRPO's episode "
            "advantage mixed per turn with HPO's step advantage (HPO eq. 17). 'mapo+hpo': the same with MAPO's "
            "composite episode advantage as A_E.",
            "choices": list(ADVANTAGE_ESTIMATORS),
        },
    )
    semantic_beta: float = field(
        default=0.4, metadata={"help": "beta, the weight of R_sem in the composite reward (paper: 0.4)."}
    )
    semantic_lambda: float = field(
        default=0.95,
        metadata={"help": "lambda, the trajectory discount in R_sem = (1/T) sum_t lambda^(T-t) z_t (paper: 0.95)."},
    )
    semantic_score: str = field(
        default="cosine",
        metadata={
            "help": "Scale of z_t (the paper does not say). 'cosine': the raw CLIP cosine of L2-normalised "
            "embeddings, in [-1, 1]. 'clipscore': 2.5 * max(cosine, 0) (Hessel et al., 2021). 'contrastive': "
            "cosine(label, crop) - cosine(label, whole image), a guard against label hacking (not in the paper): a "
            "label that fits everything earns nothing.",
            "choices": list(SEMANTIC_SCORES),
        },
    )
    semantic_verifier: str = field(
        default="clip",
        metadata={
            "help": f"What scores z_t: a name in rewards.verifiers.VERIFIERS ({', '.join(VERIFIERS)}; 'clip' is the "
            "CLIP model of clip_model, the paper's) or an import path 'package.module:factory', a factory called as "
            "factory(tool_config, device, seed) that returns an object with score(calls, scenes) (imported when the "
            "recipe is parsed; research.verifiers holds the experiment's ground-truth controls)."
        },
    )
    no_tool_semantic: float = field(
        default=0.0,
        metadata={
            "help": "R_sem of a rollout that made no zoom-in call (T = 0; the paper does not say). 0.0 makes "
            "'no call' score like a call whose crop is unrelated to its label under the raw cosine."
        },
    )

    mask_over_turn: bool = field(
        default=False,
        metadata={
            "help": "Leave out of the loss every rollout that ends on a tool call that never ran (over-turn): it "
            "reached max_tool_calling_iterations still calling the tool, or TRL dropped its tool response for "
            "overflowing max_completion_length or the context. Such a rollout has no answer, and its low reward "
            "would push the policy to stop exploring early. Not in the MAPO paper: Mini-o3's `ignore_exceed`, done "
            "the same way: the rollout still counts, with its reward, in its group's statistics (mean and std, R_sem "
            "included; HPO's clouds), and only its own tokens leave the loss and its normaliser: the token count "
            "(dapo, bnpo) or, for a loss that averages over rollouts (grpo, dr_grpo, sapo, luspo), the rollout count. "
            "Its fraction is logged either way as tools/over_turn_frac.",
        },
    )

    hpo_omega: float = field(
        default=0.5, metadata={"help": "omega of HPO eq. 17: A = (A_E + omega * A_S) / (1 + omega) (paper: 0.5)."}
    )
    hpo_hindsight: str = field(
        default="online",
        metadata={
            "help": "HPO's hindsight set. 'online': the steps of the group's own successful rollouts (a group with "
            "too few positive or negative steps falls back, counted in hpo/fallback_frac and by reason in "
            "hpo/fallback/<reason>). 'offline': "
            "successful trajectories stored per prompt in the dataset column `hpo_hindsight_column`.",
            "choices": list(HPO_HINDSIGHT),
        },
    )
    hpo_fallback: str = field(
        default="scaled",
        metadata={
            "help": "Advantage of a group with no step advantage (a fallback). 'scaled': A_E / (1 + omega), eq. 17 "
            "with A_S = 0, as the authors' code does. 'unscaled': A_E, which weighs fallback groups 1 + omega times "
            "more than eligible ones (1.5x at omega 0.5) when fallbacks are common.",
            "choices": list(HPO_FALLBACK),
        },
    )
    hpo_solver: str = field(
        default="exact",
        metadata={
            "help": "Kantorovich potentials of HPO eq. 13-14. 'exact': POT's exact solver (the paper's f*, "
            "deterministic). 'geomloss': the authors' code, geomloss Sinkhorn at blur 0.01, scaling 0.5, which stops "
            "far from converged: its step advantages differ from exact ones by ~15-30% of their norm (docs/method.md).",
            "choices": list(HPO_SOLVERS),
        },
    )
    hpo_hindsight_column: str = field(
        default="hindsight",
        metadata={
            "help": "Offline hindsight column: per row, a list of successful trajectories, each a list of step "
            "texts (segments 1..T, as hpo.step_segments renders a rollout) or of step embeddings (lists of floats, "
            "of the text encoder's width)."
        },
    )
    hpo_success_threshold: float = field(
        default=1.0,
        metadata={"help": "A rollout succeeded when its outcome reward (R_out, without R_sem) is at least this."},
    )
    hpo_min_positive_steps: int = field(
        default=MIN_POSITIVE_STEPS,
        metadata={"help": "Online HPO: fewest steps of successful rollouts a group needs (authors: 4)."},
    )
    hpo_min_negative_steps: int = field(
        default=MIN_NEGATIVE_STEPS,
        metadata={"help": "Online HPO: fewest steps of failed rollouts a group needs (authors: 4)."},
    )
    hpo_max_offline_trajectories: int = field(
        default=MAX_OFF_TRAJECTORIES,
        metadata={"help": "Offline HPO: max_off_num; a prompt's step advantage scales by n_off / this."},
    )
    hpo_text_encoder: str = field(
        default="Qwen/Qwen3-Embedding-0.6B",
        metadata={"help": "Text encoder of HPO's intent space (HPO section 4.2), a hub name or local folder."},
    )
    hpo_encoder_max_length: int = field(
        default=8192, metadata={"help": "Longest token window the text encoder reads per step."}
    )
    vllm_dtype: str = field(
        default="auto",
        metadata={
            "help": "dtype of the colocated vLLM engine (vllm_mode: colocate), which TRL 1.16 leaves to vLLM: 'auto' "
            "runs a float32 checkpoint in bfloat16 or float16. float32 on CPU makes the engine's logprobs comparable "
            "with the trainer's to rounding (the tiny vLLM recipe and tests use it).",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )
    vllm_enforce_eager: bool = field(
        default=False,
        metadata={
            "help": "Build the colocated vLLM engine (vllm_mode: colocate) without torch.compile and CUDA graphs, "
            "which TRL 1.16 cannot ask for (a server takes `--enforce_eager` on its own command line). Leave it off "
            "on GPUs, where CUDA graphs speed decoding; the tiny CPU recipe sets it: vLLM's CPU build otherwise "
            "compiles the model at every engine start (~40 s of a ~45 s start on 2 cores, docs/vllm.md)."
        },
    )
    variance_probe_steps: int = field(
        default=0,
        metadata={
            "help": "Every this many steps (0: never), measure the variance of per-sample policy-gradient norms on "
            "a fixed batch (the first one, kept), logged as probe/grad_norm_var: whether an estimator lowers "
            "gradient variance, on your own run. Costs one backward pass per probed sample."
        },
    )
    variance_probe_rows: int = field(
        default=8, metadata={"help": "Rollouts of the fixed batch the gradient-variance probe uses."}
    )
    gradient_variance_batches: int = field(
        default=0,
        metadata={
            "help": "Keep the policy gradient of each of the first this many steps' batches (0: off) and log, at "
            "that step, the variance of the gradient estimate across them: gradvar/trace (trace of the covariance) "
            "and gradvar/relative (trace / squared norm of the mean gradient). With learning_rate 0 every batch is "
            "drawn from the starting checkpoint: the papers' gradient-variance quantity. Costs one copy of the "
            "gradient per batch in host memory."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        check_vllm_version(self.use_vllm)  # TRL only warns about a vLLM outside its range
        verifier_factory(self.semantic_verifier)  # an unknown name or a broken import path fails at parse
        for f in fields(MAPOConfig):  # the fields this class adds that name their choices; GRPO's are TRL's to check
            choices = f.metadata.get("choices")
            if choices is not None and f.name not in GRPO_FIELDS and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {choices}; got {getattr(self, f.name)!r}")
        if not self.hpo_omega >= 0:
            raise ValueError(f"hpo_omega must be >= 0; got {self.hpo_omega}")
        if self.gradient_variance_batches == 1:
            raise ValueError("gradient_variance_batches needs at least 2 batches for a variance (0: off)")
        if (
            self.mask_over_turn
            and self.loss_type in ROW_MEAN_LOSSES
            and (self.entropy_coef or self.use_adaptive_entropy)
        ):
            raise ValueError(
                f"mask_over_turn under loss_type={self.loss_type!r} renormalises each micro-batch's loss over the "
                "rollouts left in it, which would rescale the entropy bonus too: set entropy_coef: 0 and "
                "use_adaptive_entropy: false, or use a token-normalised loss_type (dapo, bnpo)."
            )
        if self.uses_semantic and self.multi_objective_aggregation != "sum_then_normalize":
            raise ValueError(
                f"advantage_estimator={self.advantage_estimator!r} normalises the composite R_out + beta * R_sem "
                "(eq. 3), which is multi_objective_aggregation='sum_then_normalize'; got "
                f"{self.multi_objective_aggregation!r}."
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
class EvalArguments:
    """What to evaluate, on what, and how. Every field is also a command-line flag and a `--config` YAML key."""

    model_name_or_path: str = field(metadata={"help": "Checkpoint (local folder or hub name) to evaluate."})
    benchmark: str = field(default="synthetic", metadata={"help": "Benchmark reader.", "choices": list(BENCHMARKS)})
    data_path: str | None = field(
        default=None,
        metadata={
            "help": "What you downloaded: the V* folder, an HR-Bench .tsv/.parquet file, the MME-RealWorld folder "
            "(or its Lite folder), or a synthetic save_to_disk folder. None for synthetic: generate a test split."
        },
    )
    split: str | None = field(default=None, metadata={"help": "Split, for formats that have them (synthetic)."})
    output_dir: str | None = field(
        default=None, metadata={"help": "Run folder; default outputs/eval/<model>-<benchmark>[-<data name>]."}
    )
    limit: int | None = field(default=None, metadata={"help": "Evaluate only the first N rows (quick runs)."})
    skip_bad_rows: bool = field(
        default=False, metadata={"help": "Skip (and count) benchmark rows that fail validation instead of stopping."}
    )
    backend: str = field(
        default="transformers", metadata={"help": "Generation backend.", "choices": ["transformers", "vllm"]}
    )
    batch_size: int = field(default=8, metadata={"help": "Samples whose turns are generated together."})
    max_completion_length: int = field(
        default=2048,
        metadata={
            "help": "One token budget per rollout, shared by every turn and tool response: TRL's "
            "max_completion_length. Default: the checkpoint's RL record (tool_config.json), else (evaluate.py) the "
            "real RL recipes' (recipes/mapo_paper.yaml), else 2048."
        },
    )
    max_tool_calling_iterations: int | None = field(
        default=5,
        metadata={
            "help": "Most tool-calling rounds per rollout: TRL's max_tool_calling_iterations. Default: the "
            "checkpoint's RL record, else (evaluate.py) recipes/mapo_paper.yaml's, else 5."
        },
    )
    temperature: float = field(default=0.0, metadata={"help": "0 for greedy decoding (the default)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling, when temperature > 0."})
    seed: int = field(default=0, metadata={"help": "Seed for sampled decoding."})
    dtype: str = field(default="auto", metadata={"help": "Model dtype (auto, bfloat16, float32...)."})
    attn_implementation: str | None = field(default=None, metadata={"help": "e.g. sdpa or flash_attention_2."})
    device: str | None = field(
        default=None, metadata={"help": "Device for the model and CLIP (default: cuda if any)."}
    )
    report_max_samples: int = field(
        default=500, metadata={"help": "Samples shown in report.html (all are in samples.jsonl)."}
    )
    vllm_gpu_memory_utilization: float = field(default=0.9, metadata={"help": "vLLM backend only."})
    vllm_max_model_len: int | None = field(default=None, metadata={"help": "vLLM backend only."})
    vllm_max_images: int = field(default=16, metadata={"help": "vLLM backend only: images per conversation."})
    vllm_enforce_eager: bool = field(
        default=False,
        metadata={"help": "vLLM backend only: no torch.compile or CUDA graphs (as MAPOConfig.vllm_enforce_eager)."},
    )

    def __post_init__(self):
        if self.output_dir is None:
            name = f"{Path(self.model_name_or_path).name}-{self.benchmark}"
            if self.data_path:
                name += f"-{Path(self.data_path).stem}"
            self.output_dir = str(Path("outputs") / "eval" / name)
