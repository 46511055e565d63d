"""The model families the repo supports and their own tool settings (`MODEL_FAMILIES`), read at start-up
(`utils.recipes`, `utils.checks`, `utils.models`); `tools.config` re-exports them where they were."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
