"""The tiny Qwen3.5 of the offline kit (`outputs/tiny/qwen3_5`) through the recipes' own entry points (issue 62, item
2): `sft.py` on its tiny recipe, `rl.py` on its tiny MAPO recipe with scripted zoom-in calls, `evaluate.py`, and a
multi-turn rollout whose decoded logprobs, its Gated DeltaNet state carried from the prefill of two images and a tool
turn into each decoding step, equal a one-pass forward of the whole conversation (what the trainer scores)."""

from __future__ import annotations

import math

import pytest
import torch
from PIL import Image
from transformers import GenerationConfig
from trl import ModelConfig
from trl.data_utils import prepare_multimodal_messages

import evaluate
import evaluation.run as evaluation_run
import rl
import sft
from configs import MAPOConfig, ScriptArguments, SFTConfig, TrajectoryArguments
from data.task import SYSTEM_PROMPTS, build_prompt
from evaluation.run import read_samples
from repairs import rollout
from tests.tolerance import assert_close, transformer_terms
from tiny.scripted import DEFAULT_BOX, ForcedMAPOTrainer, force_tool_calls, tool_call_turn
from tools import TOOL_NAME, ToolConfig, crop_box, make_environment_factory, read_record
from tools.config import FAMILY_TOOL_SETTINGS
from utils.models import CHAT_TEMPLATES, load_model, load_processor, pixel_budget, turn_format
from utils.recipes import parse_args_and_record

SFT_RECIPE = "recipes/tiny/sft/config_sft_qwen3_5.yaml"
RL_RECIPE = "recipes/tiny/rl/config_mapo_qwen3_5.yaml"
SFT_TYPES = (ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig)
RL_TYPES = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)
# One weight of each layer kind of the tiny Qwen3.5: its Gated DeltaNet (layer 0) and its gated attention (layer 1).
LAYER_KINDS = (
    "model.language_model.layers.0.linear_attn.in_proj_qkv.weight",
    "model.language_model.layers.1.self_attn.q_proj.weight",
)


def changed(model, name_or_path) -> set[str]:
    base = dict(load_model(name_or_path, dtype=torch.float32).named_parameters())
    return {n for n, p in model.named_parameters() if not torch.equal(p.detach().cpu(), base[n])}


@pytest.mark.slow
def test_sft_trains_the_tiny_qwen3_5_on_its_own_template(tiny_kit, tmp_path):
    """sft.py on the tiny Qwen3.5 recipe: both layer kinds train, the checkpoint records its family's settings and
    keeps Qwen3.5's thinking template, and the loss covers the gold calls in Qwen3.5's XML format, rendered by TRL's
    training variant of that template (its generation markers). Planted: the recipe on the tiny Qwen3-VL (no
    linear-attention weight to train), Qwen3-VL's template given to Qwen3.5 (JSON calls in the loss)."""
    argv = ["--config", SFT_RECIPE, "--output_dir", str(tmp_path), "--max_steps", "2", "--num_samples", "4"]
    trainer = sft.main(*parse_args_and_record(SFT_TYPES, [*argv, "--per_device_train_batch_size", "2"]))
    assert trainer.state.global_step == 2
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 2 and all(0 < loss < 20 for loss in losses)
    assert set(LAYER_KINDS) <= changed(trainer.model, tiny_kit["qwen3_5"])
    tool = read_record(tmp_path)["tool"]
    assert {k: tool[k] for k in FAMILY_TOOL_SETTINGS["qwen3_5"]} == FAMILY_TOOL_SETTINGS["qwen3_5"]
    assert load_processor(tmp_path).chat_template == CHAT_TEMPLATES["qwen3_5_think"]
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    trained = trainer.processing_class.tokenizer.decode(batch["input_ids"][batch["labels"] != -100])
    assert f"<tool_call>\n<function={TOOL_NAME}>\n<parameter=bbox_2d>\n[" in trained and '{"name"' not in trained


@pytest.mark.slow
def test_rl_trains_the_tiny_qwen3_5_with_zoom_calls_and_advantages(tiny_kit, tmp_path):
    """rl.py on the tiny Qwen3.5 MAPO recipe with transformers generation, the zoom-in calls scripted in Qwen3.5's
    own format (`tiny.scripted`, `utils.models.turn_format`): TRL parses every call, the tool crops where the 0-1000
    grid puts the box, CLIP scores the crops, the groups' advantages are not all 0, both layer kinds train, and the
    checkpoint records its family's settings. Planted: the scripted calls in JSON (no call parsed: 0 per rollout)."""
    argv = ["--config", RL_RECIPE, "--output_dir", str(tmp_path), "--max_steps", "1", "--num_samples", "4"]
    argv += ["--model_name_or_path", str(tiny_kit["qwen3_5"]), "--clip_model", str(tiny_kit["clip"])]
    trainer = rl.main(*parse_args_and_record(RL_TYPES, argv), trainer_cls=ForcedMAPOTrainer)
    assert trainer.state.global_step == 1
    assert all(row["prompt"][0]["content"] == SYSTEM_PROMPTS["relative_1000"] for row in trainer.train_dataset)
    last = [e for e in trainer.state.log_history if "tools/zoom_calls_per_rollout" in e][-1]
    assert last["tools/zoom_calls_per_rollout"] == 1.0 and last["tools/zoom_error_rate"] == 0.0
    assert not math.isnan(last["rewards/semantic/mean"]) and last["mapo/advantage_std"] > 0
    for env in (env for env in trainer._environment_pool[None] if env.calls):
        (call,) = env.calls
        assert env.box_frame == (1000, 1000)
        assert call.box == crop_box(
            env.image.size, list(DEFAULT_BOX), seen_size=(1000, 1000), min_side=28, max_aspect=100
        )
    assert set(LAYER_KINDS) <= changed(trainer.model, tiny_kit["qwen3_5"])
    assert read_record(tmp_path)["tool"]["box_convention"] == "relative_1000"


@pytest.mark.slow
def test_evaluate_runs_the_tiny_qwen3_5(tiny_kit, tmp_path):
    """evaluate.py on the tiny Qwen3.5 with transformers generation (turns scripted in its format): the prompt opens
    Qwen3.5's `<think>`, each call is parsed and cropped on the 0-1000 grid, and every sample answers."""
    prompts, original = [], evaluation_run.load_model

    def load_scripted(name_or_path, **kwargs):
        model = original(name_or_path, **kwargs)
        tokenizer = load_processor(name_or_path).tokenizer
        force_tool_calls(model, tokenizer)
        scripted = model.generate

        def generate(*args, **kw):
            prompts.append(tokenizer.decode(kw["input_ids"][0]))
            return scripted(*args, **kw)

        model.generate = generate
        return model

    argv = ["--model_name_or_path", str(tiny_kit["qwen3_5"]), "--benchmark", "synthetic", "--limit", "2"]
    argv += ["--output_dir", str(tmp_path), "--clip_model", str(tiny_kit["clip"]), "--device", "cpu"]
    argv += ["--max_pixels", str(32 * 32 * 16), "--crop_max_pixels", str(32 * 32 * 4), "--crop_min_pixels"]
    argv += [str(32 * 32 * 4), "--max_completion_length", "320", "--max_tool_calling_iterations", "2"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(evaluation_run, "load_model", load_scripted)
        evaluate.main(argv)
    assert prompts[0].endswith("<|im_start|>assistant\n<think>\n")
    records = read_samples(tmp_path / "samples.jsonl")
    assert len(records) == 2
    for record in records:
        assert record["box_frame"] == [1000, 1000] and record["failure"] is None
        (call,) = record["calls"]
        assert call["arguments"]["bbox_2d"] == list(DEFAULT_BOX)
        size = tuple(record["image_size"])
        assert call["box"] == list(
            crop_box(size, list(DEFAULT_BOX), seen_size=(1000, 1000), min_side=28, max_aspect=100)
        )


def conversations(processor, images):
    """Two rollouts as TRL's tool loop builds them (`repairs.rollout`, token for token): the prompt with its image, a
    scripted zoom-in call, the tool's response with the crop, the next assistant header. Their lengths differ, so the
    batch is left-padded as generation pads it. Returns each rollout's ids and images."""
    turns = turn_format(processor.chat_template)
    settings = ToolConfig(**FAMILY_TOOL_SETTINGS["qwen3_5"], crop_max_pixels=32 * 32 * 4, crop_min_pixels=32 * 32 * 4)
    out = []
    for question, image, box in zip(
        ("Where?", "What colour is the star in the top left?"), images, ([0, 0, 500, 500], [250, 100, 900, 700])
    ):
        env = make_environment_factory(settings, pixel_budget(processor))()
        env.reset(image=image)
        prompt = prepare_multimodal_messages(
            build_prompt(question, box_convention="relative_1000"), images=[env.image]
        )
        ids = rollout.prompt_ids(processor, prompt, env)
        call = processor.tokenizer(tool_call_turn("red circle", box, turns=turns), add_special_tokens=False)
        (response,) = rollout.run_tool_calls(
            env,
            [
                {
                    "type": "function",
                    "function": {"name": TOOL_NAME, "arguments": {"bbox_2d": box, "label": "red circle"}},
                }
            ],
        )
        suffix = rollout.tool_suffix_ids(processor, [response])
        crops = [part["image"] for part in response["content"] if part.get("type") == "image"]
        out.append((ids + call["input_ids"] + suffix, [env.image, *crops]))
    return out


def model_inputs(processor, batch, pad_to: int):
    """Left-padded ids, mask and vision inputs, as `evaluation.agent.TransformersBackend` (and TRL) build them."""
    pad = processor.tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (pad_to - len(ids)) + ids for ids, _ in batch])
    mask = torch.tensor([[0] * (pad_to - len(ids)) + [1] * len(ids) for ids, _ in batch])
    vision = processor.image_processor(images=[im for _, images in batch for im in images], return_tensors="pt")
    image_token = processor.tokenizer.convert_tokens_to_ids(rollout.IMAGE_PAD)
    return dict(
        input_ids=input_ids, attention_mask=mask, mm_token_type_ids=(input_ids == image_token).long(), **vision
    )


@pytest.mark.slow
def test_a_second_turns_decoded_logprobs_equal_a_one_pass_forward(tiny_kit):
    """The second turn of two rollouts, generated after a prefill of the prompt image, a zoom-in call and the crop's
    tool response (left-padded to one length): each decoding step of the Gated DeltaNet reads the recurrent and conv
    state the prefill left (its chunked form, two images in), and the attention layer its KV cache. Their log-
    probabilities equal those of one forward pass over the whole conversation, the trainer's, to float32's rounding.

    Tolerance: two float32 computations of one log-softmax, each within `terms` x eps of exact, by the decoder's
    chain of reductions (`transformer_terms` over the longest conversation, plus the Gated DeltaNet's: the state's
    sum over every earlier token, a head of 128 contracted twice, the chunked form's 64-token blocks), at the size of
    the logits (|logit| <= `scale`), where a log-probability may cancel to about 0. Planted: the decoding steps' state
    dropped (each step starts the linear layer afresh) fails by ~0.9."""
    processor = load_processor(tiny_kit["qwen3_5"])
    model = load_model(tiny_kit["qwen3_5"], dtype=torch.float32).eval()
    # A linear layer whose state matters: the random init draws A up to 16 (a decay of e^-21 a token: the state
    # forgets within a token or two) and projections of 0.02, so dropping the state moved the logprobs by 3e-6.
    # A = e^-4 keeps ~98% a token, and projections x10 make the layer count: the plant then moves them by ~0.9.
    gdn = model.model.language_model.layers[0].linear_attn
    with torch.no_grad():
        gdn.A_log.fill_(-4.0)
        for weight in (gdn.in_proj_qkv.weight, gdn.in_proj_z.weight, gdn.out_proj.weight):
            weight.mul_(10)
    images = [Image.effect_noise((300, 200), 60).convert("RGB"), Image.effect_noise((200, 320), 90).convert("RGB")]
    batch = conversations(processor, images)
    width = max(len(ids) for ids, _ in batch)
    new = 12
    torch.manual_seed(0)
    with torch.inference_mode():
        out = model.generate(
            **model_inputs(processor, batch, width),
            generation_config=GenerationConfig(
                max_new_tokens=new, min_new_tokens=new, do_sample=True, temperature=1.0
            ),
            output_logits=True,
            return_dict_in_generate=True,
        )
        decoded = torch.stack(out.logits, dim=1).log_softmax(-1)  # the decoding steps' own distributions
        sampled = out.sequences[:, width:]
        whole = [(ids + row.tolist(), images) for (ids, images), row in zip(batch, sampled)]
        logits = model(**model_inputs(processor, whole, width + new)).logits
    once = logits[:, width - 1 : -1].log_softmax(-1)  # the one pass, at each sampled token's position
    picked = lambda lp: lp.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)  # noqa: E731
    terms = transformer_terms(64, 128, 2, width + new, 1088) + (width + new) + 2 * 128 + 2 * 64
    scale = float(logits.abs().max())
    assert_close(picked(decoded), picked(once), terms=terms, scale=scale)
    assert_close(decoded, once, terms=terms, scale=scale)  # every token's, not only those sampled
