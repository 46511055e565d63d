"""`ToolConfig`: the one declaration of what SFT, RL and evaluation must agree on about the zoom-in tool and its
CLIP verifier (`VerifierConfig`), and `tool_config.json`, the record of it that every checkpoint carries.

`sft.py`, `rl.py` and `evaluate.py` all parse `ToolConfig` (flat recipe keys, `--field value` flags). Each checkpoint
records the settings it was trained with, pixel budgets resolved from the processor (and, for RL, the rollout budget).
A run from a checkpoint takes those values unless the recipe or command line says otherwise, and then warns with both
values: a policy evaluated with another pixel budget sees its coordinates in another frame, silently. A different
`box_convention` is an error instead (`refuse_mismatch`): every box would be read in a frame it was not written in.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from tools.registry import DEFAULT_TOOLS, get_tools

RECORD_NAME = "tool_config.json"
# `clip_resize` values, and open_clip's names for them (`create_model_and_transforms(image_resize_mode=...)`).
OPEN_CLIP_RESIZE_MODE = {"pad": "longest", "squash": "squash", "center_crop": "shortest"}
CLIP_RESIZE = tuple(OPEN_CLIP_RESIZE_MODE)
# How the model writes `bbox_2d` (`ToolConfig.box_convention`): Qwen2.5-VL's absolute pixels of the resized image it
# sees, or Qwen3-VL's 0-1000 grid relative to the image (its pre-training's grounding format).
BOX_CONVENTIONS = ("pixels", "relative_1000")
# The model families the repo supports, by config.json `model_type`: their name, their own tool settings (what a run
# takes for a setting neither the recipe, the command line nor the starting checkpoint's record sets:
# `utils.recipes.parse_args_and_record`) and the chat templates their processor may carry (TRL 1.16's names,
# `trl/chat_templates/<name>.jinja`; the first when the checkpoint carries none of them: `utils.models.load_processor`).
# A model of another type is refused by training and evaluation alike (`utils.checks.check_family`).
# - Qwen2.5-VL: boxes in pixels of the resized image. Its stock template drops `tools` and cannot put images in tool
#   responses, so it gets TRL's Qwen3-VL template (recipes/chat_template.jinja), as Qwen3-VL does.
# - Qwen3-VL and its MoE models (30B-A3B, 235B-A22B: `qwen3_vl_moe`, which shares its processor, transformers 5.17's
#   `Qwen3VLProcessor`): its 0-1000 grounding (recipes/README.md, "Qwen3-VL: box coordinates") and Qwen-Agent's
#   `img_idx` (qwen_agent/tools/image_zoom_in_qwen3vl.py).
# - Qwen3.5, dense (0.8B-27B: `qwen3_5`) and MoE (35B-A3B to 397B-A17B: `qwen3_5_moe`), Gated DeltaNet and gated
#   attention layers: transformers 5.17 gives it Qwen3-VL's processor (processing_auto: qwen3_5 -> Qwen3VLProcessor,
#   the image processor of 16-pixel patches merged 2 x 2). Its tool settings are Qwen-Agent's zoom tool's, the one it
#   ships (qwen_agent/tools/image_zoom_in_qwen3vl.py, unchanged by its Qwen3.5 release commit 6f5acff of 2026-02-16,
#   which added only examples/assistant_qwen3.5.py): bbox_2d read as `rel / 1000 * width` (0-1000) and `img_idx`.
#   Not verified against Qwen's own Qwen3.5 documentation: QwenLM/Qwen3.5's README states no grounding frame, and its
#   user guide was "coming soon" (the 0-1000 frame is also what third-party notes on Qwen3.5 state). The pixel budgets
#   stay the recipes' (recipes/README.md, "Qwen3.5"): Qwen-Agent's tool upsamples a crop to at least 256 x 32 x 32 =
#   262,144 pixels (smart_resize, factor 32, max 12,845,056), where the recipes' floor is Mini-o3's 40,000. Its
#   chat templates are its own pair, which TRL 1.16 ships with training variants: thinking (Qwen3.5-4B and larger ship
#   it; the generation prompt opens `<think>`, which the task's format needs) and non-thinking (2B and smaller).
# transformers 5.17's other Qwen VL types are not taken: Qwen2-VL (`qwen2_vl`: its own processor, its grounding 0-1000
# in box tokens, not `bbox_2d`) and `qwen4_exp` (Qwen3-VL's processor, but its grounding frame is not checked here).


@dataclass(frozen=True)
class Family:
    """A supported model family: its name, its own tool settings (`ToolConfig` fields) and the TRL chat templates its
    processor may carry, the default first."""

    name: str
    tool: dict[str, Any]
    chat_templates: tuple[str, ...] = ("qwen3_vl",)


_QWEN3_VL_TOOL = {"box_convention": "relative_1000", "accept_img_idx": True}
_QWEN3_5_TEMPLATES = ("qwen3_5_think", "qwen3_5_nothink")
MODEL_FAMILIES = {
    "qwen2_5_vl": Family("Qwen2.5-VL", {"box_convention": "pixels", "accept_img_idx": False}),
    "qwen3_vl": Family("Qwen3-VL", _QWEN3_VL_TOOL),
    "qwen3_vl_moe": Family("Qwen3-VL-MoE", _QWEN3_VL_TOOL),
    "qwen3_5": Family("Qwen3.5", _QWEN3_VL_TOOL, _QWEN3_5_TEMPLATES),
    "qwen3_5_moe": Family("Qwen3.5-MoE", _QWEN3_VL_TOOL, _QWEN3_5_TEMPLATES),
}
FAMILY_TOOL_SETTINGS = {kind: family.tool for kind, family in MODEL_FAMILIES.items()}


def open_clip_resize_mode(clip_resize: str) -> str:
    """open_clip's `image_resize_mode` for a `clip_resize` value; the one check of that value."""
    if clip_resize not in OPEN_CLIP_RESIZE_MODE:
        raise ValueError(f"clip_resize must be one of {CLIP_RESIZE}; got {clip_resize!r}")
    return OPEN_CLIP_RESIZE_MODE[clip_resize]


@dataclass(frozen=True)
class PixelBudget:
    """An image processor's budget: `min_pixels <= h * w <= max_pixels`, sides multiples of `factor` (patch size x
    merge size), one token per `factor x factor` block."""

    min_pixels: int
    max_pixels: int
    factor: int

    @property
    def max_tokens(self) -> int:
        """Image tokens of the largest image this budget allows."""
        return self.max_pixels // (self.factor * self.factor)


@dataclass
class VerifierConfig:
    """The CLIP model that scores z_t (MAPO eq. 1): `semantic_verifier: clip` in training (`configs.MAPOConfig`
    names which verifier scores) and always in evaluation. Each recipe family's default: recipes/README.md."""

    clip_model: str = field(default="ViT-B-32", metadata={"help": "open_clip model name, or a local directory."})
    clip_pretrained: str | None = field(default="openai", metadata={"help": "open_clip's pretrained tag."})
    clip_resize: str = field(
        default="pad",
        metadata={
            "help": "How a crop is fitted to CLIP's square input. 'pad': letterbox (the whole crop is scored); "
            "'squash': stretch; 'center_crop': open_clip's default, which scores only the middle square of an "
            "elongated crop.",
            "choices": list(CLIP_RESIZE),
        },
    )

    def __post_init__(self):
        open_clip_resize_mode(self.clip_resize)


VERIFIER_FIELDS = tuple(f.name for f in fields(VerifierConfig))


@dataclass
class ToolConfig(VerifierConfig):
    """The zoom-in tool and its verifier; shared by SFT, RL and evaluation and recorded in each checkpoint."""

    min_pixels: int | None = field(default=None, metadata={"help": "Image processor min pixels (None: the model's)."})
    max_pixels: int | None = field(
        default=None,
        metadata={"help": "Image processor max pixels (None: the model's own): the frame bbox_2d is written in."},
    )
    crop_max_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Max pixels of a crop fed back to the model (None: max_pixels); costs max_completion_length. "
            "At most max_pixels: the processor would shrink a larger crop to that all the same (a larger value "
            "warns and is capped)."
        },
    )
    crop_min_pixels: int | None = field(
        default=None,
        metadata={
            "help": "Min pixels of a crop fed back to the model: a smaller crop is upscaled, keeping its aspect ratio, "
            "as Mini-o3 shows its observations (None: min_pixels). At most crop_max_pixels."
        },
    )
    min_side: int = field(default=28, metadata={"help": "Shorter box sides (original pixels) are expanded."})
    max_aspect: float = field(default=100.0, metadata={"help": "Boxes more elongated than this are rejected."})
    box_convention: str = field(
        default="pixels",
        metadata={
            "help": "The frame the model writes bbox_2d in, wherever it is read (tool, system prompt, SFT gold calls, "
            "evaluation): 'pixels', absolute pixels of the resized image the model sees (Qwen2.5-VL's grounding), or "
            "'relative_1000', a 0-1000 grid over the image (Qwen3-VL's). A run that sets another one than its "
            "starting checkpoint recorded fails at start. Unset: the record's, else the model family's own "
            "(recipes/README.md, 'Qwen3-VL: box coordinates').",
            "choices": list(BOX_CONVENTIONS),
        },
    )
    accept_img_idx: bool = field(
        default=False,
        metadata={
            "help": "Let the zoom tool take Qwen3-VL's `img_idx` (Qwen-Agent's image_zoom_in_tool): 0 or absent the "
            "original, i the image the i-th successful zoom returned, a negative i counted from the last image "
            "shown (-1: the last, as Qwen-Agent's Python list index reads it), bbox_2d in that image's frame. Unset: "
            "the record's, else the model family's own (qwen3_vl: true, qwen2_5_vl: false)."
        },
    )
    max_label_words: int = field(default=12, metadata={"help": "Longest label (words); MAPO section 3.3."})
    max_label_chars: int = field(default=80, metadata={"help": "Longest label (characters) the tool accepts."})
    tools: list[str] = field(
        default_factory=lambda: list(DEFAULT_TOOLS),
        metadata={
            "help": "The tools the agent may call, by name (tools.TOOLS: zoom_in, rotate) or import path "
            "'package.module:NAME' of a tools.Tool; zoom_in must be one. The environment, the system prompt and the "
            "token budget follow it (docs/tools.md)."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.box_convention not in BOX_CONVENTIONS:
            raise ValueError(f"box_convention must be one of {BOX_CONVENTIONS}; got {self.box_convention!r}")
        for name in ("min_pixels", "max_pixels", "crop_max_pixels", "crop_min_pixels"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive number of pixels or None; got {value}")
        for name in ("crop_max_pixels", "max_pixels"):  # the crop's floor under each ceiling set
            ceiling = getattr(self, name)
            if None not in (self.crop_min_pixels, ceiling) and self.crop_min_pixels > ceiling:
                raise ValueError(
                    f"crop_min_pixels={self.crop_min_pixels} must be at most {name}={ceiling}: set crop_min_pixels "
                    "too (a run from a model with no record takes recipes/mapo_paper.yaml's) or raise the ceiling"
                )
        # A side floor of 0 lets a one-pixel box through, and NaN compares False against every bound, so each
        # comparison below is written to fail for NaN as well.
        if not self.min_side >= 1:
            raise ValueError(f"min_side must be a whole number of pixels >= 1; got {self.min_side!r}")
        if not 1.0 <= self.max_aspect < math.inf:
            raise ValueError(f"max_aspect must be a finite ratio >= 1 (long side over short); got {self.max_aspect!r}")
        if isinstance(self.tools, str):  # one tool, from a recipe's `tools: zoom_in`
            self.tools = [self.tools]
        get_tools(self.tools)  # an unknown name, a broken import path or no zoom_in fails at parse, naming it
        if self.max_label_words < 1 or self.max_label_chars < 1:
            raise ValueError(
                f"max_label_words and max_label_chars must be >= 1; got {self.max_label_words}, {self.max_label_chars}"
            )

    def crop_budget(self, image_budget: PixelBudget) -> PixelBudget:
        """The budget crops are resized to: the image's, with `crop_max_pixels` as its ceiling when set, never above
        the image's own ceiling (the processor shrinks any image into it: the tool's frame of a crop, and the tokens
        it costs, must be those of the crop the model sees), and `crop_min_pixels` as its floor when set
        (`smart_resize` upscales a smaller crop, aspect kept, sides rounded up to the factor)."""
        ceiling = image_budget.max_pixels
        if self.crop_max_pixels is not None:
            ceiling = max(min(self.crop_max_pixels, image_budget.max_pixels), image_budget.min_pixels)
        floor = max(self.crop_min_pixels or 0, image_budget.min_pixels)
        if floor > ceiling:
            raise ValueError(
                f"crop_min_pixels={self.crop_min_pixels} is over the crops' ceiling of {ceiling} pixels "
                f"(crop_max_pixels={self.crop_max_pixels}, max_pixels={image_budget.max_pixels}): lower it"
            )
        return replace(image_budget, min_pixels=floor, max_pixels=ceiling)

    def as_record(self, verifier: bool = True) -> dict[str, Any]:
        """The settings a checkpoint records; without the verifier's for a stage that scored nothing (SFT)."""
        return {k: v for k, v in asdict(self).items() if verifier or k not in VERIFIER_FIELDS}

    def resolved(self, image_budget: PixelBudget) -> ToolConfig:
        """A copy with the pixel budgets the processor really uses, as a checkpoint records them (a `crop_max_pixels`
        over the image's `max_pixels` warns: it is capped, `crop_budget`)."""
        if self.crop_max_pixels is not None and self.crop_max_pixels > image_budget.max_pixels:
            warnings.warn(
                f"crop_max_pixels {self.crop_max_pixels} is over max_pixels {image_budget.max_pixels}: crops are "
                f"resized to at most {image_budget.max_pixels} pixels (the processor shrinks a larger one all the same)",
                stacklevel=2,
            )
        return replace(
            self,
            min_pixels=image_budget.min_pixels,
            max_pixels=image_budget.max_pixels,
            crop_max_pixels=self.crop_budget(image_budget).max_pixels,
            crop_min_pixels=self.crop_budget(image_budget).min_pixels,
        )


def write_record(output_dir: str | os.PathLike, tool: dict[str, Any], **rollout: Any) -> Path:
    """Write `tool_config.json` into `output_dir`: the tool settings (`ToolConfig.as_record`) and RL's rollout budget
    (`max_completion_length`, `max_tool_calling_iterations`), which evaluation replays."""
    path = Path(output_dir) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"tool": tool, "rollout": rollout}, indent=2) + "\n", encoding="utf-8")
    return path


# Settings earlier checkpoints recorded that no longer exist, ignored when read (`environment`: the zoom-in tool).
RETIRED_SETTINGS = ("environment",)
# Settings earlier checkpoints did not record, read as what they were trained with: boxes in pixels, no `img_idx`.
UNRECORDED_SETTINGS = {"box_convention": "pixels", "accept_img_idx": False}
# Recorded settings a run may not change: boxes read in another frame than they were trained in crop the wrong region
# on every call, silently (a pixel budget changed only rescales the frame, which a warning covers).
MUST_MATCH = ("box_convention",)


def read_record(checkpoint: str | os.PathLike | None) -> dict[str, dict[str, Any]] | None:
    """The record of a local checkpoint folder, or None (no record, or a hub name: nothing is downloaded for it)."""
    if checkpoint is None:
        return None
    path = Path(checkpoint) / RECORD_NAME
    if not path.is_file():
        return None
    record = json.loads(path.read_text(encoding="utf-8"))
    tool = UNRECORDED_SETTINGS | {k: v for k, v in record.get("tool", {}).items() if k not in RETIRED_SETTINGS}
    if "crop_min_pixels" not in tool and "min_pixels" in tool:  # recorded before it existed: floored at min_pixels
        tool["crop_min_pixels"] = tool["min_pixels"]
    known = {f.name for f in fields(ToolConfig)}
    if unknown := set(tool) - known:
        raise ValueError(f"{path}: unknown tool setting(s) {sorted(unknown)}; known: {sorted(known)}")
    return {"tool": tool, "rollout": record.get("rollout", {})}


def record_mismatches(record: dict[str, dict[str, Any]], values: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """`{name: (recorded, used)}` for every recorded setting that `values` sets to something else."""
    recorded = {**record["tool"], **record["rollout"]}
    return {k: (recorded[k], values[k]) for k in recorded if k in values and values[k] != recorded[k]}


def refuse_mismatch(checkpoint: str | os.PathLike, mismatches: dict[str, tuple[Any, Any]]) -> None:
    """Raise, naming both values, when a setting of `MUST_MATCH` differs from what `checkpoint` was trained with."""
    if refused := {name: mismatches[name] for name in MUST_MATCH if name in mismatches}:
        lines = "; ".join(
            f"{name}: trained with {old!r}, the recipe or command line sets {new!r}"
            for name, (old, new) in refused.items()
        )
        raise ValueError(
            f"{checkpoint} was trained with other tool settings than this run's ({RECORD_NAME}): {lines}. The policy "
            "writes its boxes in the convention it was trained with; leave the setting out (the record's is taken) "
            "or start from a checkpoint trained with the one you set."
        )


def warn_on_mismatch(checkpoint: str | os.PathLike, mismatches: dict[str, tuple[Any, Any]]) -> None:
    """One warning naming every setting that differs from what `checkpoint` was trained with, and both values."""
    if mismatches:
        lines = "; ".join(
            f"{name}: trained with {old!r}, now {new!r}" for name, (old, new) in sorted(mismatches.items())
        )
        warnings.warn(f"{checkpoint} was trained with other tool settings ({RECORD_NAME}): {lines}", stacklevel=2)


class ToolConfigRecorder(TrainerCallback):
    """Writes the tool record into every checkpoint folder the trainer saves (`checkpoint-<step>/`)."""

    def __init__(self, tool: dict[str, Any], **rollout: Any):
        self.tool, self.rollout = tool, rollout

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            write_record(Path(args.output_dir) / f"checkpoint-{state.global_step}", self.tool, **self.rollout)
