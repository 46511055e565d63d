"""LoRA targets with peft's matching rules, checked against a model's real module tree before training starts."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from torch import nn
from transformers import PreTrainedModel

logger = logging.getLogger(__name__)

ALL_LINEAR = "all-linear"
_DECODER_LAYER = re.compile(
    r"(?:^|\.)layers\.(\d+)$"
)  # a decoder layer of the language model (vision: `blocks`)  # peft's shorthand for every Linear layer but the output head
VISION_MARKERS = ("visual", "vision_tower", "vision_model")  # a module-name component that places it in a vision tower


def is_vision_module(name: str) -> bool:
    """Whether a module or parameter name lies in the vision tower (projector included)."""
    return any(part in VISION_MARKERS for part in name.split("."))


def output_module_names(model: nn.Module) -> set[str]:
    """Names of the output head (and any module sharing its weight), which peft's `all-linear` leaves out."""
    head = model.get_output_embeddings() if isinstance(model, PreTrainedModel) else None
    if head is None:
        return set()
    return {name for name, module in model.named_modules() if module is head}


def normalise_target_modules(target_modules: str | Sequence[str] | None) -> str | list[str] | None:
    """What TRL's `ModelConfig` hands peft: a one-element list becomes its element, which peft reads as a regular
    expression over the *full* module name (so `[all-linear]` works in a recipe and `[q_proj]` alone does not)."""
    if target_modules is None or isinstance(target_modules, str):
        return target_modules
    target_modules = list(target_modules)
    return target_modules[0] if len(target_modules) == 1 else target_modules


def lora_matches(model: nn.Module, target_modules: str | Sequence[str]) -> dict[str, list[str]]:
    """Module names each LoRA target selects, with peft's rules: a list entry matches a name equal to it or ending
    with `.<entry>`; a string is a regular expression over the whole name, except `all-linear`, every `nn.Linear` but
    the output head. Keys are the targets (the string itself for a string)."""
    names = [name for name, _ in model.named_modules() if name]
    if isinstance(target_modules, str):
        if target_modules.lower() == ALL_LINEAR:
            excluded = output_module_names(model)
            linear = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and n not in excluded]
            return {target_modules: linear}
        return {target_modules: [name for name in names if re.fullmatch(target_modules, name)]}
    return {
        target: [name for name in names if name == target or name.endswith(f".{target}")] for target in target_modules
    }


def check_lora_targets(model: nn.Module, target_modules: str | Sequence[str], frozen: Sequence[str] = ()) -> int:
    """The number of modules the LoRA targets select; ValueError if any target selects nothing (stricter than
    peft, which fails only when *no* target matches: `qkv_projj` beside `q_proj` would train silently) or a layer type
    peft cannot adapt. Warns when they select modules of the vision tower outside `frozen` (module-name prefixes that
    get no adapter, `utils.trainable.lora_exclusions`): Qwen2.5-VL's vision MLP is also `gate_proj`/`up_proj`/
    `down_proj`, and `all-linear` takes every vision Linear, so such a list adapts the tower and backpropagates
    through it."""
    matches = lora_matches(model, target_modules)
    missing = [target for target, found in matches.items() if not found]
    if missing:
        suffixes = sorted({name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, nn.Linear)})
        hint = ""
        if isinstance(target_modules, str):
            hint = (
                " A single target is a regular expression over the full module name (TRL passes a one-element list"
                " to peft as a string): write e.g. '.*\\.q_proj', or list two or more names."
            )
        raise ValueError(
            f"LoRA target(s) {missing} match no module of {type(model).__name__}. "
            f"Linear module suffixes it has: {suffixes}.{hint}"
        )
    modules = dict(model.named_modules())
    selected = {name for found in matches.values() for name in found}
    # peft's LoRA also wraps nn.MultiheadAttention and GPT-2's Conv1D; neither occurs in the models this repo trains.
    supported = nn.Linear | nn.Embedding | nn.Conv1d | nn.Conv2d | nn.Conv3d
    unsupported = sorted(name for name in selected if not isinstance(modules[name], supported))
    if unsupported:
        kinds = sorted({type(modules[name]).__name__ for name in unsupported})
        raise ValueError(
            f"LoRA target(s) select {len(unsupported)} module(s) peft cannot adapt ({', '.join(kinds)}), "
            f"e.g. {unsupported[0]}: name Linear layers (their last name component) instead"
        )
    check_hybrid_layers(model, selected)
    vision = sorted(
        n for n in selected if is_vision_module(n) and not any(n == p or n.startswith(f"{p}.") for p in frozen)
    )
    if vision:
        logger.warning(
            "lora_target_modules %s also select %d module(s) of the vision tower (e.g. %s): those adapters train the "
            "tower, and every step backpropagates through it. To adapt the language model only, name its modules "
            "(q_proj, k_proj, v_proj, o_proj: the vision blocks call theirs qkv and proj).",
            target_modules,
            len(vision),
            vision[0],
        )
    return len(selected)


def mixer_modules(model: nn.Module) -> dict[str, list[tuple[int, str]]]:
    """A hybrid model's token mixers by layer kind (the text config's `layer_types`, e.g. Qwen3.5's `linear_attention`,
    a Gated DeltaNet, and `full_attention`): each layer's children that hold Linear modules, the MLP aside, as
    `(layer index, module name)`. Empty for a model whose layers are all of one kind."""
    config = getattr(model, "config", None)
    kinds = getattr(config.get_text_config(), "layer_types", None) if config is not None else None
    if not kinds or len(set(kinds)) < 2:
        return {}
    found: dict[str, list[tuple[int, str]]] = {}
    for name, layer in model.named_modules():
        match = _DECODER_LAYER.search(name)
        if match is None or is_vision_module(name) or int(match.group(1)) >= len(kinds):
            continue
        index = int(match.group(1))
        for child, module in layer.named_children():
            if child != "mlp" and any(isinstance(m, nn.Linear) for m in module.modules()):
                found.setdefault(kinds[index], []).append((index, f"{name}.{child}"))
    return found


def check_hybrid_layers(model: nn.Module, selected: set[str]) -> None:
    """ValueError when the LoRA targets adapt the token mixer of a hybrid model's layers of one kind and of none of
    another: on Qwen3.5 the attention names (`q_proj`, `k_proj`, `v_proj`, `o_proj`) select only the full-attention
    layers, one in four, and the Gated DeltaNet layers (`in_proj_qkv`, `in_proj_z`, `in_proj_b`, `in_proj_a`,
    `out_proj`) would train nothing. Targets that adapt no mixer (the MLP only) treat every layer alike and pass."""
    mixers = mixer_modules(model)
    adapted = {
        kind: any(n.startswith(f"{m}.") for _, m in modules for n in selected) for kind, modules in mixers.items()
    }
    missing = [kind for kind, done in adapted.items() if not done]
    if not missing or not any(adapted.values()):
        return
    modules = dict(model.named_modules())

    def describe(kind: str) -> str:
        layers = mixers[kind]
        children = sorted({m.rsplit(".", 1)[-1] for _, m in layers})
        linear = sorted(
            {
                n.rsplit(".", 1)[-1]
                for _, m in layers
                for n, x in modules[m].named_modules(prefix=m)
                if isinstance(x, nn.Linear)
            }
        )
        return f"{len(layers)} {kind} layers ({'/'.join(children)}: {', '.join(linear)})"

    done = [describe(kind) for kind, ok in adapted.items() if ok]
    raise ValueError(
        f"the LoRA targets adapt the token mixer of the {' and '.join(done)} but of none of the "
        f"{' and '.join(describe(kind) for kind in missing)}: those layers would not train. Name their Linear modules "
        'too (recipes/README.md, "Qwen3.5"), or adapt the MLP alone (gate_proj, up_proj, down_proj).'
    )
