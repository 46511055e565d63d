"""The tiny kit behaves like the real Qwen2.5-VL / Qwen3-VL + CLIP stack wherever the recipes touch it."""

import json
import os

import pytest
import torch
from PIL import Image
from transformers import (
    AutoConfig,
    AutoModel,
    AutoProcessor,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen3VLForConditionalGeneration,
    Qwen3VLProcessor,
)
from transformers.integrations import deepspeed as hf_deepspeed
from trl import ModelConfig
from trl.chat_template_utils import (
    add_response_schema,
    get_training_chat_template,
    is_chat_template_prefix_preserving,
    parse_response,
    qwen3_vl_chat_template,
    qwen3_vl_training_chat_template,
    supports_tool_calling,
)

from data import task
from tiny.kit import ADDED_TOKENS, BPE_VOCAB_SIZE, build_tiny_kit
from tools import PixelBudget
from utils import models

ZOOM_CALL = {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [10, 20, 100, 200], "label": "red circle"}}


def image_zoom_in_tool(bbox_2d: list[int], label: str) -> str:
    """Zoom in on a region of the image.

    Args:
        bbox_2d: Box [x1, y1, x2, y2] in pixels of the image.
        label: A few words naming what the box should show.
    """


@pytest.fixture(scope="module")
def policy(tiny_kit):
    return models.load_model(tiny_kit["policy"])


def image_prompt(processor):
    """A user turn with one 448x448 image, tokenized for generation."""
    image = Image.new("RGB", (448, 448), "red")
    messages = [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": "Colour?"}]}]
    return processor.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt"
    )


def test_policy_reloads_every_weight(tiny_kit):
    model, info = models.load_model(tiny_kit["policy"], output_loading_info=True)
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration)
    assert not any(info.values()), info  # nothing missing, hence nothing silently re-initialised
    assert model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) < 500_000
    processor = AutoProcessor.from_pretrained(tiny_kit["policy"])  # the saved template, without `load_processor`
    assert isinstance(processor, Qwen2_5_VLProcessor)
    assert processor.chat_template == models.load_chat_template()


def test_the_tiny_qwen3_vl_is_qwen3_vl_with_its_own_processor(tiny_kit, tiny_qwen3_vl_processor):
    model, info = models.load_model(tiny_kit["qwen3_vl"], output_loading_info=True)
    assert isinstance(model, Qwen3VLForConditionalGeneration)
    assert not any(info.values()), info
    assert sum(p.numel() for p in model.parameters()) < 500_000
    text, vision = model.config.text_config, model.config.vision_config
    assert text.head_dim == 32 != text.hidden_size // text.num_attention_heads  # Qwen3 states its head size
    assert vision.deepstack_visual_indexes == [0] and len(model.model.visual.deepstack_merger_list) == 1
    processor = AutoProcessor.from_pretrained(tiny_kit["qwen3_vl"])
    assert isinstance(processor, Qwen3VLProcessor) and processor.chat_template == models.load_chat_template()
    # Budget and grid read from the processor: 16-pixel patches merged 2 x 2, a 448x448 image 128x128 (16 tokens)
    assert models.pixel_budget(tiny_qwen3_vl_processor) == PixelBudget(32 * 32 * 4, 32 * 32 * 16, 32)
    processor = models.load_processor(tiny_kit["qwen3_vl"], max_pixels=32 * 32 * 64)
    assert models.pixel_budget(processor) == PixelBudget(32 * 32 * 4, 32 * 32 * 64, 32)
    assert image_prompt(processor)["image_grid_thw"].tolist() == [[1, 16, 16]]


def test_the_tiny_qwen3_vl_sees_images_through_its_deepstack(tiny_kit, tiny_qwen3_vl_processor):
    """An image forward pass and generation; the deepstack features reach the first decoder layer (zeroing the
    deepstack merger changes the logits at the text positions after the image)."""
    model = models.load_model(tiny_kit["qwen3_vl"])
    inputs = image_prompt(tiny_qwen3_vl_processor)
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert (inputs["input_ids"] == model.config.image_token_id).sum() == 16
    with torch.no_grad():
        logits = model(**inputs).logits
        assert logits.shape == (1, inputs["input_ids"].shape[1], model.config.text_config.vocab_size)
        assert torch.isfinite(logits).all()
        for param in model.model.visual.deepstack_merger_list.parameters():
            param.zero_()
        # the same forward on the same inputs is bitwise the same: any change is the zeroed mergers'
        assert not torch.equal(model(**inputs).logits, logits)
    output = model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert output.shape == (1, inputs["input_ids"].shape[1] + 4)


def test_rebuild_with_same_seed_is_identical(tiny_kit, tmp_path):
    rebuilt = build_tiny_kit(tmp_path, seed=0)
    pairs = [
        (models.load_model(tiny_kit["policy"]), models.load_model(rebuilt["policy"])),
        (models.load_model(tiny_kit["qwen3_vl"]), models.load_model(rebuilt["qwen3_vl"])),
        (models.load_text_encoder(tiny_kit["text_encoder"])[0], models.load_text_encoder(rebuilt["text_encoder"])[0]),
        (models.load_clip(tiny_kit["clip"])[0], models.load_clip(rebuilt["clip"])[0]),
    ]
    for built, again in pairs:
        expected, actual = built.state_dict(), again.state_dict()
        assert expected.keys() == actual.keys()
        assert all(torch.equal(expected[key], actual[key]) for key in expected)
    assert (tiny_kit["policy"] / "tokenizer.json").read_bytes() == (rebuilt["policy"] / "tokenizer.json").read_bytes()


def test_token_ids_match_config(tiny_kit, tiny_processor):
    tokenizer = tiny_processor.tokenizer
    config = AutoConfig.from_pretrained(tiny_kit["policy"])
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in ADDED_TOKENS}
    assert list(ids.values()) == list(range(BPE_VOCAB_SIZE, BPE_VOCAB_SIZE + len(ADDED_TOKENS)))  # Qwen's order
    assert ids["<|image_pad|>"] == config.image_token_id == tiny_processor.image_token_id
    assert ids["<|video_pad|>"] == config.video_token_id
    assert ids["<|vision_start|>"] == config.vision_start_token_id
    assert ids["<|vision_end|>"] == config.vision_end_token_id
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == config.text_config.eos_token_id
    assert tokenizer.pad_token == "<|endoftext|>" and tokenizer.pad_token_id == config.text_config.pad_token_id
    assert len(tokenizer) <= config.text_config.vocab_size and config.text_config.vocab_size % 64 == 0
    # `<tool_call>` is an added but non-special token: it survives the `skip_special_tokens` decoding parsers use.
    ids = tokenizer("<tool_call>\n{}\n</tool_call><|im_end|>")["input_ids"]
    assert ids[0] == tokenizer.convert_tokens_to_ids("<tool_call>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


def test_image_forward_and_generate(policy, tiny_processor):
    inputs = image_prompt(tiny_processor)
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert (inputs["input_ids"] == policy.config.image_token_id).sum() == 16
    with torch.no_grad():
        logits = policy(**inputs).logits
    assert logits.shape == (1, inputs["input_ids"].shape[1], policy.config.text_config.vocab_size)
    assert torch.isfinite(logits).all()
    output = policy.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
    assert output.shape == (1, inputs["input_ids"].shape[1] + 4)


def test_pixel_budget_override(tiny_kit, tiny_processor, tmp_path):
    assert models.pixel_budget(tiny_processor) == PixelBudget(28 * 28 * 4, 28 * 28 * 16, 28)
    processor = models.load_processor(tiny_kit["policy"], max_pixels=28 * 28 * 64)
    assert models.pixel_budget(processor) == PixelBudget(28 * 28 * 4, 28 * 28 * 64, 28)
    assert image_prompt(processor)["image_grid_thw"].tolist() == [[1, 16, 16]]
    processor.save_pretrained(tmp_path)  # checkpoints keep the budget they were trained with
    assert models.pixel_budget(models.load_processor(tmp_path)) == models.pixel_budget(processor)


def test_chat_template_renders_a_zoom_episode(tiny_processor):
    call = {
        "type": "function",
        "function": {"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4], "label": "x"}},
    }
    messages = [
        {"role": "system", "content": task.SYSTEM_PROMPT},
        {"role": "user", "content": [{"type": "image", "image": Image.new("RGB", (448, 448))}, {"type": "text", "text": "Colour?"}]},
        {"role": "assistant", "content": "", "tool_calls": [call]},  # transformers 5.17 cannot iterate None
        {"role": "tool", "name": "image_zoom_in_tool", "content": [{"type": "image", "image": Image.new("RGB", (112, 112))}, {"type": "text", "text": "Zoomed in."}]},
        {"role": "assistant", "content": [{"type": "text", "text": "<think>Red.</think> <answer>red</answer>"}]},
    ]  # fmt: skip
    text = tiny_processor.apply_chat_template(messages, tools=[image_zoom_in_tool], tokenize=False)
    system, _, conversation = text.partition("<|im_end|>\n")
    assert system.startswith(f"<|im_start|>system\n{task.SYSTEM_PROMPT}\n\n# Tools")
    assert '"name": "image_zoom_in_tool"' in system and '"bbox_2d": {"type": "array"' in system
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4], '
        '"label": "x"}}\n</tool_call><|im_end|>\n' in conversation
    )
    assert (
        "<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|><|vision_end|>Zoomed in.\n</tool_response>"
        in conversation
    )
    assert text.count("<|vision_start|>") == 2
    assert text.endswith("<|im_start|>assistant\n<think>Red.</think> <answer>red</answer><|im_end|>\n")
    inputs = tiny_processor.apply_chat_template(
        messages, tools=[image_zoom_in_tool], tokenize=True, return_dict=True, return_tensors="pt"
    )
    assert inputs["image_grid_thw"].tolist() == [[1, 8, 8], [1, 8, 8]]  # the crop is an image like any other


def test_chat_template_is_trls_qwen3_vl():
    # TRL recognises templates by exact equality, to parse tool calls and to derive its training template.
    assert models.CHAT_TEMPLATE_PATH.read_bytes() == qwen3_vl_chat_template.encode("utf-8")


@pytest.mark.parametrize("policy_name", ["policy", "qwen3_vl"])
def test_trl_accepts_the_processor(tiny_kit, policy_name):
    processor = models.load_processor(tiny_kit[policy_name])  # own copy: add_response_schema mutates the tokenizer
    assert supports_tool_calling(processor)
    assert is_chat_template_prefix_preserving(processor)
    assert get_training_chat_template(processor) == qwen3_vl_training_chat_template
    add_response_schema(processor)
    prompt = [{"role": "user", "content": [{"type": "text", "text": "Zoom in on the red circle."}]}]
    prefix = processor.apply_chat_template(
        prompt, tools=[image_zoom_in_tool], add_generation_prompt=True, tokenize=True, return_dict=False
    )[0]
    ids = processor.tokenizer(f"<tool_call>\n{json.dumps(ZOOM_CALL)}\n</tool_call><|im_end|>")["input_ids"]
    # As GRPO calls it: transformers 5.17 parses tool calls only when given the prompt (`prefix`).
    parsed = parse_response(processor.tokenizer, ids, prefix=prefix, tools=[image_zoom_in_tool])
    assert parsed["tool_calls"] == [{"type": "function", "function": ZOOM_CALL}]


def test_model_init_kwargs_load_the_policy(tiny_kit):
    args = ModelConfig(model_name_or_path=str(tiny_kit["policy"]), dtype="bfloat16", attn_implementation="sdpa")
    model = models.load_model(args.model_name_or_path, **models.model_init_kwargs(args))
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "sdpa"


def test_tiny_clip_scores_a_batch(tiny_clip):
    model, preprocess, tokenizer = tiny_clip
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    images = torch.stack([preprocess(Image.new("RGB", (100, 80), colour)) for colour in ("red", "blue")])
    texts = tokenizer(["a red circle", "a blue square", "a green star"])
    assert images.shape == (2, 3, 64, 64) and texts.shape == (3, 32)
    image_features = model.encode_image(images, normalize=True)
    text_features = model.encode_text(texts, normalize=True)
    assert image_features.shape == (2, 64) and text_features.shape == (3, 64)
    scores = image_features @ text_features.T
    assert scores.shape == (2, 3) and torch.isfinite(scores).all()


def test_load_clip_accepts_the_local_dir_schema(tiny_kit, tiny_clip):
    model, _, tokenizer = models.load_clip(f"local-dir:{tiny_kit['clip']}")
    expected = tiny_clip[0].state_dict()
    assert all(torch.equal(tensor, expected[key]) for key, tensor in model.state_dict().items())
    assert tokenizer.context_length == tiny_clip[2].context_length == 32  # read from open_clip_config.json


def test_text_encoder_embeds_steps(tiny_kit):
    model, tokenizer = models.load_text_encoder(tiny_kit["text_encoder"])
    batch = tokenizer(["<think>Zoom in on the sign.</think>", "<answer>B</answer>"], padding=True, return_tensors="pt")
    hidden = model(**batch).last_hidden_state
    assert hidden.shape == (2, batch["input_ids"].shape[1], model.config.hidden_size)
    assert not any(p.requires_grad for p in model.parameters())


class _RegisteredZero3:
    """What `TrainingArguments` registers with transformers when its DeepSpeed config is ZeRO-3."""

    def is_zero3(self) -> bool:
        return True


def test_side_models_load_whole_when_a_zero3_config_is_registered(tiny_kit):
    """Under ZeRO-3 transformers builds every model inside `deepspeed.zero.Init` (its parameters partitioned); the
    CLIP verifier and HPO's text encoder live outside any engine, so they must load whole."""
    registered = _RegisteredZero3()
    hf_deepspeed.set_hf_deepspeed_config(registered)
    try:
        assert hf_deepspeed.is_deepspeed_zero3_enabled()
        # The mechanism at work: a plain load goes to zero.Init (here it cannot even start: no DeepSpeed on CPU).
        with pytest.raises(ModuleNotFoundError, match="deepspeed"):
            AutoModel.from_pretrained(tiny_kit["text_encoder"])
        encoder, _ = models.load_text_encoder(tiny_kit["text_encoder"])
        clip, _, _ = models.load_clip(tiny_kit["clip"])
        assert hf_deepspeed.is_deepspeed_zero3_enabled()  # the policy's own load still sees the config
    finally:
        hf_deepspeed.unset_hf_deepspeed_config()
    for model in (encoder, clip):
        assert all(p.numel() > 0 and not hasattr(p, "ds_id") for p in model.parameters())


def test_a_side_model_with_an_all_zero_weight_matrix_is_refused(tiny_kit, monkeypatch):
    """What a rank other than 0 gets from FSDP's RAM-efficient loading (tests/test_multiprocess.py shows it under a
    real 2-process launch): every weight zeroed. `check_loaded` names the model, the count and the rank; the
    environment variable is restored after a guarded load."""
    monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "true")
    model, _ = models.load_text_encoder(tiny_kit["text_encoder"])
    assert os.environ["FSDP_CPU_RAM_EFFICIENT_LOADING"] == "true"
    models.check_loaded(model, "encoder")  # loaded: passes
    with torch.no_grad():
        model.get_input_embeddings().weight.zero_()
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(RuntimeError, match=r"encoder: 1 weight matrices are all zeros on local rank 1 \(first: "):
        models.check_loaded(model, "encoder")
