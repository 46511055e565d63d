"""`ToolConfig`: the one declaration of what SFT, RL and evaluation must agree on about the tools and the CLIP
verifier (`VerifierConfig`). `sft.py`, `rl.py` and `evaluate.py` all parse it (flat recipe keys, `--field value`
flags); every checkpoint records it (`tools.record`: `tool_config.json`). The model families' own settings:
`tools.families` (re-exported here)."""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from tools.families import FAMILY_TOOL_SETTINGS as FAMILY_TOOL_SETTINGS  # re-exported: read at start-up
from tools.families import MODEL_FAMILIES as MODEL_FAMILIES
from tools.families import Family as Family
from tools.registry import DEFAULT_TOOLS, get_tools

# `clip_resize` values, and open_clip's names for them (`create_model_and_transforms(image_resize_mode=...)`).
OPEN_CLIP_RESIZE_MODE = {"pad": "longest", "squash": "squash", "center_crop": "shortest"}
CLIP_RESIZE = tuple(OPEN_CLIP_RESIZE_MODE)
# How the model writes `bbox_2d` (`ToolConfig.box_convention`): Qwen2.5-VL's absolute pixels of the resized image it
# sees, or Qwen3-VL's 0-1000 grid relative to the image (its pre-training's grounding format).
BOX_CONVENTIONS = ("pixels", "relative_1000")


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
