"""Qwen3.5 as a family of its own (issue 62): Qwen-Agent's zoom settings, its own thinking and non-thinking chat
templates with their XML tool calls, the start-up checks of its hybrid layers and of the vLLM that would run it, and the
tiny Qwen3.5 of the offline kit (`outputs/tiny/qwen3_5`: one Gated DeltaNet layer, one gated attention layer, the
vision tower) through SFT, MAPO RL, evaluation and a multi-turn rollout's linear-attention state."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from PIL import Image
from transformers import AutoConfig
from trl import ModelConfig
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    parse_response,
    qwen3_5_nothink_training_chat_template,
    qwen3_5_template,
    qwen3_5_think_training_chat_template,
)
from trl.data_utils import prepare_multimodal_messages

import evaluate
from data.task import build_prompt
from repairs import rollout
from tests.vllm_launch import vllm_env
from tools import ToolConfig, crop_box, environment_tools, make_environment_factory
from tools.config import FAMILY_TOOL_SETTINGS, MODEL_FAMILIES
from utils import checks, models

# The tiny kit's Qwen3 processors' budget (tiny/kit.py): images of 4 to 16 tokens, crops of 4.
TINY_QWEN3_BUDGET = ["--max_pixels", str(32 * 32 * 16), "--crop_max_pixels", str(32 * 32 * 4)]
TINY_QWEN3_BUDGET += ["--crop_min_pixels", str(32 * 32 * 4)]
QWEN_AGENT_ZOOM = "QwenLM/Qwen-Agent qwen_agent/tools/image_zoom_in_qwen3vl.py @ d04611b"


def qwen_agent_crop(bbox_2d, width: int, height: int) -> list[float]:
    """The region Qwen-Agent's Qwen3-VL zoom tool, the one it ships for Qwen3.5 too, crops for `bbox_2d`
    (`QWEN_AGENT_ZOOM`, `ImageZoomInToolQwen3VL.call`): `rel / 1000. * img_width` per coordinate, then clipped to the
    image (`maybe_resize_bbox`, whose expansion of a side under 32 px these boxes do not reach)."""
    x1, y1, x2, y2 = (value / 1000.0 * side for value, side in zip(bbox_2d, (width, height, width, height)))
    return [max(0, x1), max(0, y1), min(width, x2), min(height, y2)]


@pytest.fixture(scope="module")
def qwen3_5(tiny_kit):
    return tiny_kit["qwen3_5"]


def with_template(folder, tmp_path, name: str):
    """A copy of the tiny Qwen3.5 whose processor and tokenizer ship chat template `name` (TRL's)."""
    copy = tmp_path / name
    shutil.copytree(folder, copy)
    processor = models.AutoProcessor.from_pretrained(copy)
    processor.chat_template = processor.tokenizer.chat_template = models.CHAT_TEMPLATES[name]
    processor.save_pretrained(copy)
    return copy


# ------------------------------------------------------------------------------------------------- the family
def test_qwen3_5_takes_qwen_agents_zoom_settings(qwen3_5):
    """Both Qwen3.5 types write boxes on the 0-1000 grid and may name `img_idx`, as Qwen-Agent's zoom tool reads them;
    a tiny Qwen3.5 evaluated with no recipe or record takes them as its family's own. Planted: `qwen3_5` out of
    `MODEL_FAMILIES` (refused at parse), its settings Qwen2.5-VL's (pixels)."""
    for kind in ("qwen3_5", "qwen3_5_moe"):
        assert FAMILY_TOOL_SETTINGS[kind] == {"box_convention": "relative_1000", "accept_img_idx": True}
        assert MODEL_FAMILIES[kind].chat_templates == ("qwen3_5_think", "qwen3_5_nothink")
    tool = evaluate.parse_args(["--model_name_or_path", str(qwen3_5), "--benchmark", "synthetic"])[1]
    assert (tool.box_convention, tool.accept_img_idx) == ("relative_1000", True)


@pytest.mark.parametrize("size", [(2240, 1120), (640, 480), (333, 1000)])
def test_the_tools_relative_box_crops_what_qwen_agents_tool_crops(qwen3_5, size):
    """The published convention, worked by Qwen-Agent's own arithmetic (`qwen_agent_crop`): the tool of the tiny
    Qwen3.5 (its family's `relative_1000`, under its processor's budget) crops the same region of the original, to
    the pixel, whatever the image's size or the processor's resize. Planted: the grid read as pixels of the seen image
    (`box_convention: pixels`) crops another region."""
    processor = models.load_processor(qwen3_5)
    env = make_environment_factory(ToolConfig(**FAMILY_TOOL_SETTINGS["qwen3_5"]), models.pixel_budget(processor))()
    env.reset(image=Image.new("RGB", size))
    for box in ([500, 500, 700, 700], [0, 0, 1000, 1000], [123, 456, 789, 987]):
        ours = crop_box(size, box, seen_size=env.box_frame, min_side=28, max_aspect=100)
        assert list(ours) == pytest.approx(qwen_agent_crop(box, *size), abs=1), box  # integer pixels of a float box
    assert list(crop_box((2240, 1120), [500, 500, 700, 700], seen_size=env.box_frame, min_side=28, max_aspect=100)) == [
        1120, 560, 1568, 784,
    ]  # fmt: skip


# ------------------------------------------------------------------------------------------ the chat templates
def test_the_tiny_qwen3_5_keeps_its_familys_own_template(qwen3_5, tmp_path):
    """A Qwen3.5 processor keeps the template of the pair it ships (the tiny kit's: thinking; a Qwen3.5-2B's:
    non-thinking) and gets the thinking one for any other; TRL recognises both, to parse Qwen3.5's calls and to swap in
    their training variants. Planted: `load_processor` giving every family TRL's Qwen3-VL template (the tiny Qwen3.5's
    is not kept)."""
    assert models.load_processor(qwen3_5).chat_template == models.CHAT_TEMPLATES["qwen3_5_think"]
    nothink = models.load_processor(with_template(qwen3_5, tmp_path, "qwen3_5_nothink"))
    assert nothink.chat_template == nothink.tokenizer.chat_template == models.CHAT_TEMPLATES["qwen3_5_nothink"]
    other = models.load_processor(with_template(qwen3_5, tmp_path, "qwen3_vl"))
    assert other.chat_template == models.CHAT_TEMPLATES["qwen3_5_think"]
    training = {"qwen3_5_think": qwen3_5_think_training_chat_template}
    training["qwen3_5_nothink"] = qwen3_5_nothink_training_chat_template
    for name, processor in (("qwen3_5_think", models.load_processor(qwen3_5)), ("qwen3_5_nothink", nothink)):
        assert get_training_chat_template(processor) == training[name]
        add_response_schema(processor)
        assert processor.tokenizer.response_template is qwen3_5_template


@pytest.mark.parametrize("name", ["qwen3_5_think", "qwen3_5_nothink"])
def test_a_zoom_call_round_trips_through_qwen3_5s_templates(qwen3_5, tmp_path, name):
    """A zoom-in call written as the template has the model write it (`utils.models.turn_format`: XML parameters;
    under the thinking template the prompt has opened `<think>`) is the call the template renders from the structured
    message, and TRL's parser reads back the same tool, box, label and reasoning. Planted: JSON calls for Qwen3.5 (no
    tool call parsed), the label JSON-quoted (`"red circle"` read back with its quotes), the thinking template's
    `<think>` written again by the model (the reasoning lost)."""
    processor = models.load_processor(with_template(qwen3_5, tmp_path, name))
    add_response_schema(processor)
    turns = models.turn_format(processor.chat_template)
    assert (turns.call_format, turns.think_opened) == ("xml", name == "qwen3_5_think")
    env = make_environment_factory(ToolConfig(**FAMILY_TOOL_SETTINGS["qwen3_5"]), models.pixel_budget(processor))()
    env.reset(image=Image.new("RGB", (300, 200)))
    prompt = prepare_multimodal_messages(build_prompt("Where?", box_convention="relative_1000"), images=[env.image])
    prefix = rollout.prompt_ids(processor, prompt, env)
    assert processor.tokenizer.decode(prefix).endswith("<think>\n" if turns.think_opened else "</think>\n\n")
    box, label = [100, 200, 300, 400], "red circle"
    call = {
        "type": "function",
        "function": {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": box, "label": label}},
    }
    rendered = processor.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False
    )
    assert turns.call(box, label) in rendered
    text = f"{turns.think('look closer')}\n{turns.call(box, label)}<|im_end|>"
    ids = processor.tokenizer(text, add_special_tokens=False)["input_ids"]
    parsed = parse_response(processor.tokenizer, ids, prefix=prefix, tools=environment_tools(env))
    assert parsed["tool_calls"] == [call]
    if turns.think_opened:
        assert parsed["reasoning_content"] == "look closer" and parsed["content"] == ""


# ------------------------------------------------------------------------------------------ the start-up checks
def test_qwen3_5_lora_targets_must_reach_both_layer_kinds(qwen3_5):
    """Qwen3.5's attention names select only its gated full-attention layers (one in four; here the tiny model's
    second): training's start-up check refuses them, naming the Gated DeltaNet layers and their Linear modules, and
    takes them with those added, or the MLP alone. Planted: the hybrid check removed (the attention-only list passes)."""
    attention = ["q_proj", "k_proj", "v_proj", "o_proj"]
    named = r"lora_target_modules: .*full_attention layer.*none of the 1 linear_attention layer.*in_proj_qkv"
    with pytest.raises(ValueError, match=named):
        checks.check_model(ModelConfig(str(qwen3_5), use_peft=True, lora_target_modules=attention))
    for targets in ([*attention, "in_proj_qkv", "in_proj_z", "out_proj"], ["gate_proj", "up_proj", "down_proj"]):
        assert checks.check_model(ModelConfig(str(qwen3_5), use_peft=True, lora_target_modules=targets)) is not None


def fake_engine(registered=("Qwen3_5ForConditionalGeneration",), on_cpu=True):
    return lambda: (set(registered), on_cpu)


def test_a_vllm_that_cannot_run_qwen3_5_is_refused_before_it_starts(qwen3_5):
    """Before any engine starts: a vLLM whose registry lacks Qwen3.5's architecture is refused, naming the first vLLM
    that runs it; on vLLM's CPU build a float32 engine for a model with linear-attention layers is refused where the
    CPU has AVX512-BF16 (vLLM's conv kernel there has no float32), and a bfloat16 one, or a float32 Qwen3-VL, passes;
    a colocated training engine there is refused at any dtype (TRL's weight sync would write the conv weights vLLM
    repacked), not on a GPU. Planted: the dtype check removed (float32 passes), the registry read as supporting
    everything, the colocated check removed."""
    config = AutoConfig.from_pretrained(qwen3_5)
    with pytest.raises(ValueError, match=r"Qwen3_5ForConditionalGeneration, which the installed vLLM .*>= 0\.17\.0"):
        checks.check_vllm_model(qwen3_5, config, "bfloat16", engine=fake_engine(registered=()))
    checks.check_vllm_model(qwen3_5, config, "bfloat16", engine=fake_engine())
    checks.check_vllm_model(qwen3_5, config, "float32", engine=fake_engine(on_cpu=False))
    qwen3_vl = AutoConfig.from_pretrained(qwen3_5.parent / "qwen3_vl")
    checks.check_vllm_model(qwen3_5, qwen3_vl, "float32", engine=fake_engine(["Qwen3VLForConditionalGeneration"]))
    if torch.cpu._is_avx512_bf16_supported():
        for dtype in ("float32", "auto"):  # auto: the tiny kit's float32 checkpoint
            with pytest.raises(ValueError, match="linear-attention layers, which vLLM's CPU build runs in bfloat16"):
                checks.check_vllm_model(qwen3_5, config, dtype, engine=fake_engine())
        with pytest.raises(ValueError, match="TRL's weight sync of a colocated engine writes them unpacked"):
            checks.check_vllm_model(qwen3_5, config, "bfloat16", colocated=True, engine=fake_engine())
    checks.check_vllm_model(qwen3_5, config, "bfloat16", colocated=True, engine=fake_engine(on_cpu=False))


@pytest.mark.vllm
def test_vllms_cpu_build_rolls_out_the_tiny_qwen3_5_in_bfloat16_only(qwen3_5, tmp_path, monkeypatch):
    """vLLM 0.31's CPU build registers both Qwen3.5 architectures and rolls out the tiny Qwen3.5's evaluation in
    bfloat16 (its Gated DeltaNet on vLLM's CPU kernels, the prompt image and crops through its vision tower, vLLM's
    image expansion checked against the processor's on every call); in float32 `evaluate.py --backend vllm` stops at
    its start-up check, before vLLM's engine (which would fail loading the conv weights)."""
    for name, value in vllm_env().items():  # a 1 GiB KV cache, not 90% of the machine's memory; a port of its own
        monkeypatch.setenv(name, value)
    registered, on_cpu = checks.vllm_engine()
    assert {"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"} <= registered and on_cpu
    argv = ["--model_name_or_path", str(qwen3_5), "--benchmark", "synthetic", "--backend", "vllm", "--limit", "2"]
    argv += ["--vllm_enforce_eager", "true", "--vllm_max_model_len", "4096", "--max_completion_length", "160"]
    argv += ["--max_tool_calling_iterations", "1"]
    argv += ["--clip_model", str(qwen3_5.parent / "clip"), *TINY_QWEN3_BUDGET]
    if torch.cpu._is_avx512_bf16_supported():
        args, tool = evaluate.parse_args([*argv, "--dtype", "float32", "--output_dir", str(tmp_path / "fp32")])
        with pytest.raises(ValueError, match="runs in bfloat16 only"):
            evaluate.run_evaluation(args, tool)
        assert not (tmp_path / "fp32" / "samples.jsonl").exists()
    args, tool = evaluate.parse_args([*argv, "--dtype", "bfloat16", "--output_dir", str(tmp_path / "bf16")])
    metrics = evaluate.run_evaluation(args, tool)
    samples = [json.loads(line) for line in (tmp_path / "bf16" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and metrics is not None


def test_the_tiny_qwen3_5_is_qwen3_5_with_both_layer_kinds(qwen3_5):
    """The kit's Qwen3.5 is the real architecture at the kit's sizes: a Gated DeltaNet layer, a gated attention
    layer (its query doubled by the output gate), the vision tower, and the config's fields as Qwen3.5-9B states
    them (linear heads of 128, a quarter of each attention head rotated)."""
    raw = json.loads((qwen3_5 / "config.json").read_text())
    text = raw["text_config"]
    assert raw["model_type"] == "qwen3_5" and raw["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert text["layer_types"] == ["linear_attention", "full_attention"]
    assert (text["linear_key_head_dim"], text["linear_value_head_dim"], text["head_dim"]) == (128, 128, 32)
    assert text["rope_parameters"]["partial_rotary_factor"] == 0.25
    model = models.build_on_meta(qwen3_5)
    layers = model.model.language_model.layers
    assert type(layers[0].linear_attn).__name__ == "Qwen3_5GatedDeltaNet"
    assert layers[1].self_attn.q_proj.out_features == 2 * 4 * 32
    assert sum(p.numel() for p in model.model.visual.parameters()) > 0
