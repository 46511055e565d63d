"""The one place that loads models, processors, the CLIP verifier and the step text encoder by name, and builds an
architecture on the meta device: the tiny kit (`tiny/kit.py`) and the real checkpoints take the same code path."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import open_clip
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PretrainedConfig,
    ProcessorMixin,
)
from transformers.image_utils import SizeDict
from transformers.integrations import deepspeed as hf_deepspeed
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
from trl.chat_template_utils import qwen3_5_nothink_chat_template, qwen3_5_think_chat_template

from tools.config import MODEL_FAMILIES, PixelBudget, open_clip_resize_mode
from tools.zoom_in import TOOL_NAME, tool_call_text

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase
    from trl import ModelConfig

RECIPES_DIR = Path(__file__).resolve().parents[1] / "recipes"
CHAT_TEMPLATE_PATH = RECIPES_DIR / "chat_template.jinja"
MODEL_CONFIGS_DIR = RECIPES_DIR / "model_configs"
CLIP_CONFIG_NAME = "open_clip_config.json"
CLIP_WEIGHTS_NAME = "open_clip_pytorch_model.bin"
FSDP_RAM_EFFICIENT = "FSDP_CPU_RAM_EFFICIENT_LOADING"  # accelerate's variable for fsdp_cpu_ram_efficient_loading


@contextmanager
def whole_on_every_process() -> Iterator[None]:
    """Build models beside the policy (the CLIP verifier, HPO's text encoder) whole on every process, under any
    launcher. Two of transformers' loading paths take every model for the policy a wrapper will shard or broadcast:
    - ZeRO-3: once a ZeRO-3 config is registered, transformers builds every model inside `deepspeed.zero.Init`, and a
      side model no DeepSpeed engine wraps would compute with empty shards. The registration is lifted meanwhile;
    - FSDP's `fsdp_cpu_ram_efficient_loading` (`accelerate launch` exports ACCELERATE_USE_FSDP and
      FSDP_CPU_RAM_EFFICIENT_LOADING=true): `from_pretrained` on every local rank but 0 replaces each parameter with
      zeros, expecting FSDP to broadcast rank 0's, which it does only for the model it wraps (transformers 5.17,
      `PreTrainedModel._move_missing_keys_from_meta_to_device`, when `is_fsdp_enabled()`, which reads both variables
      at each call). FSDP_CPU_RAM_EFFICIENT_LOADING is set to false meanwhile.
    `check_loaded` then confirms the weights are there."""
    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    ram_efficient = os.environ.get(FSDP_RAM_EFFICIENT)
    os.environ[FSDP_RAM_EFFICIENT] = "false"
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved
        if ram_efficient is None:
            os.environ.pop(FSDP_RAM_EFFICIENT, None)
        else:
            os.environ[FSDP_RAM_EFFICIENT] = ram_efficient


def check_loaded(model: torch.nn.Module, name: str | os.PathLike) -> None:
    """Refuse a frozen helper model (`name`: what was loaded) with a weight matrix that is all zeros on this process: a
    loader left it for a broadcast that never comes (`whole_on_every_process`), and it would score or embed silently wrong."""
    zero = [key for key, param in model.named_parameters() if param.dim() >= 2 and not param.detach().any()]
    if zero:
        rank = os.environ.get("LOCAL_RANK", "0")
        raise RuntimeError(
            f"{name}: {len(zero)} weight matrices are all zeros on local rank {rank} (first: {zero[0]}): its weights "
            "were not loaded on this process. Under FSDP with fsdp_cpu_ram_efficient_loading, load it through "
            "utils.models (whole_on_every_process)."
        )


def load_chat_template() -> str:
    """The chat template of the Qwen2.5-VL and Qwen3-VL families' processors: TRL's `qwen3_vl.jinja`, byte for byte
    (TRL recognises it only if unchanged). Qwen2.5-VL's stock template drops `tools` and cannot put images in tool
    responses."""
    return CHAT_TEMPLATE_PATH.read_text(encoding="utf-8")


# TRL 1.16's chat templates the families carry (`tools.config.Family.chat_templates`), by TRL's name, byte for byte:
# TRL recognises a template only if unchanged (`add_response_schema`'s parser, `get_training_chat_template`'s
# prefix-preserving, generation-marked variant, which GRPO and SFT swap in for Qwen3.5's).
CHAT_TEMPLATES = {
    "qwen3_vl": load_chat_template(),
    "qwen3_5_think": qwen3_5_think_chat_template,
    "qwen3_5_nothink": qwen3_5_nothink_chat_template,
}


def family_chat_template(kind: str | None, current: str | None) -> str:
    """The chat template a processor of `model_type` `kind` gets: `current` (the checkpoint's own) when it is one of
    its family's, else the family's first (a model of no known family: Qwen3-VL's). So a Qwen3.5-2B keeps its
    non-thinking template and a checkpoint saved by a run keeps the one it trained with."""
    family = MODEL_FAMILIES.get(kind)
    names = family.chat_templates if family is not None else ("qwen3_vl",)
    allowed = [CHAT_TEMPLATES[name] for name in names]
    return current if current in allowed else allowed[0]


@dataclass(frozen=True)
class TurnFormat:
    """How a chat template has the model write an assistant turn, for the places that write one by hand (scripted
    tiny policies, the token budget): the tool-call format (`tools.zoom_in.CALL_FORMATS`) and whether the generation
    prompt already opened `<think>` (Qwen3.5's thinking template), so the model writes its reasoning and `</think>`."""

    call_format: str = "json"
    think_opened: bool = False

    def call(self, bbox_2d, label: str, name: str = TOOL_NAME) -> str:
        """A zoom-in call as the model writes it."""
        return tool_call_text(bbox_2d, label, name, call_format=self.call_format)

    def think(self, text: str | None) -> str:
        """The reasoning block as the model writes it; None: no reasoning (an empty block where the prompt opened
        one, which must still be closed)."""
        if self.think_opened:
            return f"{text or ''}</think>"
        return "" if text is None else f"<think>{text}</think>"


JSON_TURNS = TurnFormat()  # TRL's qwen3_vl template: JSON calls, the model opens its own `<think>`


def turn_format(chat_template: str | None) -> TurnFormat:
    """The `TurnFormat` of a chat template: Qwen3.5's write XML calls (`<function=...>`), and its thinking template's
    generation prompt opens `<think>`; any other, Qwen's JSON calls after a `<think>` block the model opens."""
    if chat_template in (qwen3_5_think_chat_template, qwen3_5_nothink_chat_template):
        return TurnFormat("xml", think_opened=chat_template == qwen3_5_think_chat_template)
    return JSON_TURNS


def load_processor(
    name_or_path: str | os.PathLike, *, min_pixels: int | None = None, max_pixels: int | None = None
) -> ProcessorMixin:
    """`AutoProcessor.from_pretrained` with an optional image pixel budget and its family's chat template
    (`family_chat_template`). The budget is set on the image processor's `size` after loading: passed to
    `from_pretrained`, transformers 5.17 also hands it to the video processor and re-sends it on every call through a
    deprecated path."""
    processor = AutoProcessor.from_pretrained(name_or_path)
    size = dict(processor.image_processor.size)
    if min_pixels is not None:
        size["shortest_edge"] = min_pixels
    if max_pixels is not None:
        size["longest_edge"] = max_pixels
    processor.image_processor.size = SizeDict(**size)
    template = family_chat_template(model_type(name_or_path), processor.chat_template)
    processor.chat_template = processor.tokenizer.chat_template = template
    return processor


def pixel_budget(processor: ProcessorMixin) -> PixelBudget:
    """The image processor's budget; resized image sides are multiples of `factor` (patch size x merge size)."""
    image_processor = processor.image_processor
    size = image_processor.size
    factor = image_processor.patch_size * image_processor.merge_size
    return PixelBudget(size["shortest_edge"], size["longest_edge"], factor)


def context_length(model: str | os.PathLike | PreTrainedModel | PretrainedConfig) -> int:
    """The language model's context (its text config's `max_position_embeddings`), from a model, its config or its
    name (read without weights)."""
    config = model if isinstance(model, PretrainedConfig) else getattr(model, "config", None)
    if config is None:
        config = native_config(model)
    return config.get_text_config().max_position_embeddings


def native_config(name_or_path: str | os.PathLike, **kwargs: Any) -> PretrainedConfig:
    """`AutoConfig.from_pretrained` through the class transformers itself defines for the checkpoint's `model_type`.

    AutoConfig's registry is process-wide and other libraries write to it: vLLM 0.31, on loading a Qwen3.5 config,
    registers its own `qwen3_5` classes (`_register_config_class`, `exist_ok=True`), whose vision config lacks
    transformers' `attribute_map`, so a transformers Qwen3.5 built afterwards in that process (the trainer's model
    beside a colocated vLLM, an evaluation after a rollout) fails on `num_attention_heads`. Naming the class from
    transformers' own table makes the result independent of what ran before. Types transformers does not know
    (remote code) go through AutoConfig as before."""
    raw, _ = PretrainedConfig.get_config_dict(name_or_path, **kwargs)
    class_name = CONFIG_MAPPING_NAMES.get(raw.get("model_type"))
    if class_name is None:
        return AutoConfig.from_pretrained(name_or_path, **kwargs)
    return getattr(transformers, class_name).from_pretrained(name_or_path, **kwargs)


def load_model(
    name_or_path: str | os.PathLike,
    *,
    dtype: str | torch.dtype | None = "auto",
    attn_implementation: str | None = None,
    **kwargs: Any,
) -> PreTrainedModel:
    """The policy: `AutoModelForImageTextToText.from_pretrained` on its `native_config` (extra kwargs go straight
    through)."""
    config = native_config(name_or_path, revision=kwargs.get("revision"))
    return AutoModelForImageTextToText.from_pretrained(
        name_or_path, config=config, dtype=dtype, attn_implementation=attn_implementation, **kwargs
    )


def model_init_kwargs(model_args: ModelConfig) -> dict[str, Any]:
    """`load_model` kwargs from TRL's `ModelConfig` (`trust_remote_code` lives on TRL's trainer configs instead)."""
    return {
        "revision": model_args.model_revision,
        "dtype": model_args.dtype,
        "attn_implementation": model_args.attn_implementation,
    }


def load_clip(
    name: str | os.PathLike, pretrained: str | None = None, *, resize: str = "pad", device: str | torch.device = "cpu"
) -> tuple[torch.nn.Module, Any, Any]:
    """A frozen open_clip model with its eval transform and tokenizer: `(model, preprocess, tokenizer)`.

    `name` is an open_clip architecture (`ViT-B-32`, with `pretrained="openai"`), `hf-hub:org/repo`, or a local
    directory (`local-dir:/path` or just `/path`) as `save_clip` writes it, whose weights replace `pretrained`.
    `resize` is how an image is fitted to the model's square input (`tools.ToolConfig.clip_resize`).
    """
    resize_mode = open_clip_resize_mode(resize)
    name = os.fspath(name)
    if os.path.isdir(name):
        name = f"local-dir:{name}"
    if name.startswith("local-dir:"):
        pretrained = None  # the directory carries its weights; recipes may still name a tag for hub models
    with whole_on_every_process():
        model, _, preprocess = open_clip.create_model_and_transforms(
            name, pretrained=pretrained, device=device, image_resize_mode=resize_mode
        )
    model.eval().requires_grad_(False)
    check_loaded(model, name)
    return model, preprocess, open_clip.get_tokenizer(name)


def save_clip(model: torch.nn.Module, output_dir: str | os.PathLike, model_cfg: dict, preprocess_cfg: dict) -> Path:
    """Write `model` in open_clip's `local-dir:` layout, so `load_clip(output_dir)` restores it exactly: `model_cfg`
    is the kwargs of `open_clip.CLIP`, `preprocess_cfg` the fields of `open_clip.transform.PreprocessCfg`."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    config = {"model_cfg": model_cfg, "preprocess_cfg": preprocess_cfg}
    (output_dir / CLIP_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    torch.save(model.state_dict(), output_dir / CLIP_WEIGHTS_NAME)
    return output_dir


def load_text_encoder(name_or_path: str | os.PathLike) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A frozen text encoder (`AutoModel`, `AutoTokenizer`) whose hidden states embed reasoning steps; whole on every
    process, never sharded by ZeRO-3 nor zeroed by FSDP's RAM-efficient loading (`whole_on_every_process`, `check_loaded`)."""
    with whole_on_every_process():
        model = AutoModel.from_pretrained(name_or_path).eval().requires_grad_(False)
    check_loaded(model, name_or_path)
    return model, AutoTokenizer.from_pretrained(name_or_path)


def resolve_config_path(config_dir_or_name: str | os.PathLike) -> str:
    """A local config folder as is; a hub name such as `Qwen/Qwen2.5-VL-7B-Instruct` mapped to the shipped copy of
    its `config.json` under `recipes/model_configs/` when there is one (so recipes naming hub models validate
    offline); anything else goes to `AutoConfig` unchanged."""
    path = Path(config_dir_or_name)
    if path.is_dir():
        return str(path)
    shipped = MODEL_CONFIGS_DIR / path.name
    return str(shipped) if (shipped / "config.json").is_file() else os.fspath(config_dir_or_name)


def model_type(config_dir_or_name: str | os.PathLike, revision: str | None = None) -> str | None:
    """The `model_type` of a checkpoint's `config.json` (a local folder's, or for a hub name the copy shipped under
    `recipes/model_configs/`, else the hub's), or None when it cannot be read (offline, no such model)."""
    source = resolve_config_path(config_dir_or_name)
    try:
        raw, _ = PretrainedConfig.get_config_dict(source, revision=revision if source == config_dir_or_name else None)
    except OSError:
        return None
    return raw.get("model_type")


def build_on_meta(config: PretrainedConfig | str | os.PathLike) -> PreTrainedModel:
    """`AutoModelForImageTextToText.from_config` under `torch.device("meta")`: the real module tree and parameter
    shapes, no storage, built in about a second even for 8B models. `config` is a config or what
    `resolve_config_path` takes."""
    if not isinstance(config, PretrainedConfig):
        config = native_config(resolve_config_path(config))
    with torch.device("meta"):
        return AutoModelForImageTextToText.from_config(config)
