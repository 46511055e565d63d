"""Which parts of the policy train: the vision tower and projector frozen where the recipe says (LLaMA-Factory's
`freeze_vision_tower` / `freeze_multi_modal_projector`, the settings of Mini-o3's cold start), no LoRA adapter placed
in a frozen part, no backward pass through a part that has nothing to train, and the quantised base leaving the
vision tower in `dtype`."""

from __future__ import annotations

import logging
import types
from collections.abc import Sequence

from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer

from utils.lora import lora_matches, normalise_target_modules

logger = logging.getLogger(__name__)

# Qwen2.5-VL and Qwen3-VL name them alike: the vision tower is `model.visual` (patch embedding, blocks and, on
# Qwen3-VL, its position embedding and deepstack mergers), its projector into the language model `model.visual.merger`
# (LLaMA-Factory's `vision_model_keys` and `projector_keys` for both families).
VISION_TOWER = "model.visual"
PROJECTOR = "model.visual.merger"
# Left in `dtype` by a 4-bit (QLoRA) load, `BitsAndBytesConfig.llm_int8_skip_modules`: the vision tower with its
# projector (ms-swift skips `model.visual` too) and the output head, which transformers skips by default only when no
# list is given.
QUANTIZATION_SKIP_MODULES = ("lm_head", VISION_TOWER)


def frozen_prefixes(model: nn.Module, *, vision_tower: bool, projector: bool) -> list[str]:
    """Module-name prefixes of the parts to freeze: with `vision_tower`, every child of `model.visual` but the
    projector; with `projector`, `model.visual.merger`. A model without them fails, naming what it lacks."""
    if not (vision_tower or projector):
        return []
    modules = dict(model.named_modules())
    if VISION_TOWER not in modules or PROJECTOR not in modules:
        raise ValueError(
            f"freeze_vision_tower/freeze_projector: {type(model).__name__} has no {VISION_TOWER} with a "
            f"{PROJECTOR} (the Qwen2.5-VL and Qwen3-VL layout); set both to false"
        )
    prefixes = [PROJECTOR] if projector else []
    if vision_tower:
        children = (f"{VISION_TOWER}.{name}" for name, _ in modules[VISION_TOWER].named_children())
        prefixes += [name for name in children if name != PROJECTOR]
    return sorted(prefixes)


def is_under(name: str, prefixes: Sequence[str]) -> bool:
    """Whether module or parameter `name` is one of `prefixes` or lies inside one."""
    return any(name == prefix or name.startswith(f"{prefix}.") for prefix in prefixes)


def quantized_linear_modules(model: nn.Module) -> set[str]:
    """The Linear modules a 4-bit load stores in 4 bits: every `nn.Linear` outside `QUANTIZATION_SKIP_MODULES`
    (transformers' `should_convert_module` reads the skip list as name prefixes)."""
    return {
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and not is_under(name, QUANTIZATION_SKIP_MODULES)
    }


def freeze(model: nn.Module, prefixes: Sequence[str]) -> int:
    """Set `requires_grad=False` on every parameter under `prefixes` (before the trainer builds its optimizer, which
    takes only parameters that require grad); returns how many parameters that froze."""
    if not prefixes:
        return 0
    frozen = [p for name, p in model.named_parameters() if is_under(name, prefixes)]
    for param in frozen:
        param.requires_grad_(False)
    count = sum(p.numel() for p in frozen)
    if frozen:
        logger.info("frozen: %s (%s parameters)", ", ".join(prefixes), f"{count:,}")
    return count


def lora_exclusions(
    model: nn.Module, target_modules: str | Sequence[str] | None, prefixes: Sequence[str]
) -> list[str]:
    """Full names of the modules the LoRA targets select inside frozen parts (`prefixes`), for peft's
    `exclude_modules`: a frozen tower gets no adapter either (LLaMA-Factory's `patch_target_modules`). Fails when the
    targets select nothing outside them."""
    if target_modules is None or not prefixes:
        return []
    if isinstance(target_modules, set):  # peft's LoraConfig keeps a list as a set
        target_modules = sorted(target_modules)
    selected = {
        name for found in lora_matches(model, normalise_target_modules(target_modules)).values() for name in found
    }
    excluded = sorted(name for name in selected if is_under(name, prefixes))
    if excluded and len(excluded) == len(selected):
        raise ValueError(
            f"lora_target_modules {target_modules} select only modules of the frozen vision tower/projector "
            f"({', '.join(prefixes)}): name the language model's modules, or set freeze_vision_tower/freeze_projector "
            "false"
        )
    if excluded:
        logger.info("LoRA: no adapter on %d module(s) of the frozen %s", len(excluded), ", ".join(prefixes))
    return excluded


def _inputs_require_grad(module: nn.Module, args, output) -> None:
    output.requires_grad_(True)


def _trains_checkpointed_layers(module: nn.Module) -> bool:
    return any(
        p.requires_grad
        for layer in module.modules()
        if isinstance(layer, GradientCheckpointingLayer)
        for p in layer.parameters()
    )


def enable_input_require_grads(self: PreTrainedModel) -> None:
    """transformers' `PreTrainedModel.enable_input_require_grads`, but a sub-model with an input embedding of its own
    (Qwen2.5-VL's vision tower: its `patch_embed`) is hooked only when one of its gradient-checkpointed layers has a
    parameter that trains.

    The hook makes an embedding's output require grad, so reentrant checkpointing sends gradients into the checkpointed
    layers after it. transformers 5.17 hooks every sub-model's embedding, and TRL 1.16 (PEFT with gradient
    checkpointing) and `gradient_checkpointing_enable` both call it: on a LoRA run whose adapters are all in the
    language model, or a full run with a frozen tower, every step would keep and recompute the frozen vision tower's
    activations and backpropagate through it for no gradient. Idempotent: earlier hooks are removed first (transformers'
    own registrations pile up, one per call)."""
    self.disable_input_require_grads()
    top = self.get_input_embeddings()
    hooks, seen = [], set()
    for module in self.modules():
        if not (isinstance(module, PreTrainedModel) and hasattr(module, "get_input_embeddings")):
            continue
        try:
            embeddings = module.get_input_embeddings()
        except NotImplementedError:  # Qwen3-VL's vision model has none
            continue
        if embeddings is None or id(embeddings) in seen or not hasattr(embeddings, "register_forward_hook"):
            continue
        if embeddings is not top and not _trains_checkpointed_layers(module):
            continue
        seen.add(id(embeddings))
        hooks.append(embeddings.register_forward_hook(_inputs_require_grad))
    self._require_grads_hooks = hooks
    if hooks:
        self._require_grads_hook = hooks[0]


def only_trained_inputs_require_grads(model: PreTrainedModel) -> PreTrainedModel:
    """Install `enable_input_require_grads` on `model` (the instance, so TRL's call through the PEFT wrapper and
    `gradient_checkpointing_enable`'s own call both reach it); returns `model`."""
    model.enable_input_require_grads = types.MethodType(enable_input_require_grads, model)
    return model
