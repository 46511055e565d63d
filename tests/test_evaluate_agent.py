"""Evaluation's agent against TRL's own rollout code on the tiny model (forced tool calls): the prompt and the tool
suffix are TRL's, turns end where TRL's end, and the agent replays TRL's rollout token for token (the model's inputs,
the calls kept, the crops under the floor, the answers), and what SFT renders for the same calls."""

import json
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from trl import GRPOTrainer
from trl.data_utils import prepare_multimodal_messages

from data.collator import DataCollatorForVisionToolCalling
from data.synthetic import build_synthetic
from data.task import build_prompt
from data.trajectories import GoldTrajectoryRenderer
from evaluation.agent import TransformersBackend, ZoomAgent
from mapo_trainer import MAPOTrainer
from repairs.rollout import eos_token_ids, prompt_ids, tool_suffix_ids, until_eos
from tiny.scripted import DEFAULT_LABELS, force_tool_calls, tiny_trainer
from tools import (
    TOOL_NAME,
    ToolConfig,
    environment_tools,
    executed_calls,
    make_environment_factory,
    seen_size,
)
from utils.models import load_model, load_processor, pixel_budget

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------------------------------- the agent against TRL
def test_prompt_and_tool_suffix_are_trls(tiny_kit):
    """The ids the agent builds are the ones GRPOTrainer builds: its own methods run here on a stand-in trainer."""
    processor = load_processor(tiny_kit["policy"])
    env = make_environment_factory(ToolConfig(), pixel_budget(processor))()
    image = Image.new("RGB", (600, 400), "white")
    env.reset(image=image)
    trainer = SimpleNamespace(
        processing_class=processor,
        chat_template=None,  # the repo's template is prefix-preserving, so TRL keeps it
        chat_template_kwargs={},
        _is_vlm=True,
        _tokenizer=processor.tokenizer,
        environment_factories={None: None},
        _batch_environments=[None],
        _env_tools={None: [env.image_zoom_in_tool]},
    )
    prompt = prepare_multimodal_messages(build_prompt("What colour?", ["red", "blue"]), images=[image])
    trl_ids = GRPOTrainer._tokenize_prompts(trainer, [prompt])[0][0]
    assert prompt_ids(processor, prompt, env) == list(trl_ids)

    result = env.image_zoom_in_tool(bbox_2d=[0, 0, 40, 40], label="white wall")
    for messages in (
        [{"role": "tool", "name": "image_zoom_in_tool", "content": result}],  # a crop: content is a list
        [{"role": "tool", "name": "image_zoom_in_tool", "content": str({"error": "bad arguments"})}],
    ):
        assert tool_suffix_ids(processor, messages) == GRPOTrainer._get_tool_suffix_ids(trainer, messages)


def test_turns_end_at_eos_or_the_budget_left_never_at_the_end_of_a_call(tiny_processor):
    tokenizer = tiny_processor.tokenizer
    eos = eos_token_ids(tokenizer, [1024])  # as GRPOTrainer: the tokenizer's EOS first, then the model's
    assert eos == [tokenizer.eos_token_id, 1024] and eos_token_ids(tokenizer, eos) == eos
    (call_end,) = tokenizer.encode("</tool_call>", add_special_tokens=False)
    assert until_eos([5, call_end, 6, eos[0], 7, 7], eos, budget=10) == [5, call_end, 6, eos[0]]  # no stop at a call
    assert until_eos([5, 6, 7, 8], eos, budget=3) == [5, 6, 7]  # the rollout's budget is spent


def call_text(box, label):
    return json.dumps({"name": TOOL_NAME, "arguments": {"bbox_2d": box, "label": label}})


# The scripted calls: the first crops a region under the test's crop floor (about 60x50 original pixels, 4 tokens
# natively), the second one over it.
SCRIPTED_BOXES = ([8, 8, 20, 18], [40, 40, 100, 90])
CROP_FLOOR = 28 * 28 * 8  # the tiny SFT recipe's crop_min_pixels


def two_calls(i, label):
    """A turn that calls the tool twice, then (after the responses) an answer: TRL runs both calls."""
    calls = [call_text(SCRIPTED_BOXES[0], "red circle"), call_text(SCRIPTED_BOXES[1], "blue square")]
    return "<think>two places</think>" + "".join(f"\n<tool_call>\n{c}\n</tool_call>" for c in calls) + "<|im_end|>"


def answer(i):
    return "<think>seen</think><answer>A</answer><|im_end|>"


def record_model_inputs(model, image_start_id: int) -> dict[tuple, list]:
    """Wrap `model.generate` to keep what each call feeds the model, per row and turn: its unpadded tokens and
    attention, token types (`mm_token_type_ids`), its images' grids and pixel values, and the names of the tensors
    passed. Rows are keyed by their
    first turn's tokens, which every later turn's context extends."""
    seen: dict[tuple, list] = {}
    generate = model.generate

    def spy(*args, **kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        grids, pixels = kwargs.get("image_grid_thw"), kwargs.get("pixel_values")
        names = sorted(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
        types = kwargs.get("mm_token_type_ids", torch.zeros_like(ids))
        image = patch = 0
        for row, row_mask, row_types in zip(ids, mask, types):
            tokens = row[row_mask.bool()].tolist()
            n_images = tokens.count(image_start_id)
            row_grids = grids[image : image + n_images]
            n_patches = int(row_grids.prod(dim=1).sum())
            key = next((k for k in seen if tuple(tokens[: len(k)]) == k), tuple(tokens))
            seen.setdefault(key, []).append(
                {
                    "tokens": tokens,
                    "mask": row_mask[row_mask.bool()].tolist(),
                    "types": row_types[row_mask.bool()].tolist(),
                    "grids": row_grids.tolist(),
                    "pixels": pixels[patch : patch + n_patches].clone(),
                    "names": names,
                }
            )
            image, patch = image + n_images, patch + n_patches
        return generate(*args, **kwargs)

    model.generate = spy
    return seen


def trl_rollouts(tiny_kit, rows, tmp_path, inputs=None, tool_config=None, **config):
    """TRL's own rollouts of `rows` (GRPOTrainer's `_generate`, one training step) with the scripted turns; with
    `inputs` a dict, the model inputs of every generation call are recorded into it (`record_model_inputs`)."""
    script = {"first_turn": two_calls, "answer": answer}
    trainer = tiny_trainer(
        MAPOTrainer, tiny_kit, rows, tmp_path, script=script, max_steps=1, tool_config=tool_config, **config
    )
    if inputs is not None:
        start = trainer.processing_class.tokenizer.convert_tokens_to_ids("<|vision_start|>")
        inputs.update(seen=record_model_inputs(trainer.model, start))
    seen = []
    generate = trainer._generate

    def spy(prompts):
        out = generate(prompts)
        seen.append((prompts, out, list(trainer.environments)))
        return out

    trainer._generate = spy
    trainer.train()
    (original_prompts, (prompt_ids_, completion_ids, _, completions, *_), envs) = seen[0]
    return [
        {"prompt": p, "prompt_ids": list(pi), "completion_ids": list(ci), "completion": c, "env": e}
        for p, pi, ci, c, e in zip(original_prompts, prompt_ids_, completion_ids, completions, envs)
    ]


def agent_episodes(tiny_kit, rows, inputs=None, tool_config=None, **budget):
    processor = load_processor(tiny_kit["policy"])
    model = load_model(tiny_kit["policy"], dtype=torch.float32)
    force_tool_calls(model, processor.tokenizer, first_turn=two_calls, answer=answer)
    if inputs is not None:
        start = processor.tokenizer.convert_tokens_to_ids("<|vision_start|>")
        inputs.update(seen=record_model_inputs(model, start))
    tool_config = tool_config or ToolConfig(clip_model=str(tiny_kit["clip"]))
    agent = ZoomAgent(TransformersBackend(model, processor), processor, tool_config, **budget)
    return agent.run(list(rows))


def sft_rendering(tiny_kit, row, tool_config):
    """The SFT cold start's rendering of `row` with the scripted calls as its gold calls (`bbox_2d` in the model's
    frame, as `data.trajectories` plans and replays them): its images (the original, then each crop) and the model
    inputs the SFT collator builds from them."""
    processor = load_processor(tiny_kit["policy"])
    factory = make_environment_factory(tool_config, pixel_budget(processor))
    calls = [{"bbox_2d": box, "label": label, "thought": "look"} for box, label in zip(SCRIPTED_BOXES, DEFAULT_LABELS)]
    rendered = GoldTrajectoryRenderer(factory)({key: [value] for key, value in {**row, "calls": calls}.items()})
    messages = rendered["messages"][0]
    crops = [
        part["image"] for m in messages if m["role"] == "tool" for part in m["content"] if part["type"] == "image"
    ]
    collator = DataCollatorForVisionToolCalling(
        processor=processor, tools=environment_tools(factory()), assistant_only_loss=True
    )
    batch = collator([{"messages": messages, "images": rendered["images"][0]}])
    return [*rendered["images"][0], *crops], batch


def question(prompt):
    content = prompt[-1]["content"]
    return content if isinstance(content, str) else "".join(p.get("text", "") for p in content)


@pytest.mark.parametrize(
    ("max_completion_length", "calls_kept"),
    [(320, 2), (120, 0)],  # 120: the two-call turn fits, its two tool responses do not: TRL drops them
    ids=["two-calls-run", "responses-over-budget"],
)
def test_the_agent_replays_trls_rollout_token_for_token(tiny_kit, tmp_path, max_completion_length, calls_kept):
    """Evaluation's agent against TRL's rollout (RL), and, where the calls run, SFT's rendering of the same calls:
    the same tokens, crops and pixel values, the first crop upscaled to the floor (`crop_min_pixels`) in all three."""
    rows = build_synthetic(2, seed=0, split="train", min_size=448, max_size=640)
    budget = dict(max_completion_length=max_completion_length, max_tool_calling_iterations=2)
    tool = ToolConfig(clip_model=str(tiny_kit["clip"]), crop_min_pixels=CROP_FLOOR)
    trl_inputs, agent_inputs = {}, {}
    trl = trl_rollouts(tiny_kit, rows, tmp_path, inputs=trl_inputs, tool_config=tool, **budget)
    episodes = agent_episodes(tiny_kit, rows, inputs=agent_inputs, tool_config=tool, **budget)
    episodes = {question(row["prompt"]): e for row, e in zip(rows, episodes)}
    row_of = {question(row["prompt"]): row for row in rows}
    # Every generation call, turn by turn, fed the model the same inputs in both paths: tokens, attention, image
    # grids and pixel values, and the same tensors by name (token-type masks included, when there are any).
    theirs, ours = trl_inputs["seen"], agent_inputs["seen"]
    assert len(theirs) == len(ours) == 2  # two rows
    for key, turns in theirs.items():
        assert len(turns) == 2 * len(ours[key])  # TRL ran the group's 2 rollouts (identical, scripted) of each row
        turns = [turn for i, turn in enumerate(turns) if all(turn["tokens"] != u["tokens"] for u in turns[:i])]
        assert len(turns) == len(ours[key]) == (2 if calls_kept else 1), key
        for t, (a, b) in enumerate(zip(turns, ours[key])):
            assert a["tokens"] == b["tokens"] and a["mask"] == b["mask"] and a["grids"] == b["grids"], t
            assert a["types"] == b["types"], t
            assert a["names"] == b["names"], t
            assert torch.equal(a["pixels"], b["pixels"]), t
    for rollout in trl:
        episode = episodes[question(rollout["prompt"])]
        assert episode.prompt_ids == rollout["prompt_ids"]
        assert episode.completion_ids == rollout["completion_ids"]
        assert [m["role"] for m in episode.completion] == [m["role"] for m in rollout["completion"]]
        ours, theirs = episode.calls, executed_calls(rollout["env"], rollout["completion"])
        assert len(ours) == len(theirs) == calls_kept
        assert [(c.label, c.box, c.ok) for c in ours] == [(c.label, c.box, c.ok) for c in theirs]
        if calls_kept:
            assert [c.label for c in ours] == ["red circle", "blue square"]  # both calls of the one turn ran
            assert episode.prediction == "A" and episode.failure is None
            # The first crop is under the floor natively and upscaled to it (aspect kept), the same pixels in RL
            # (TRL's environment), evaluation (the agent's) and SFT (the gold trajectory's replay through the tool).
            small = ours[0]
            native = seen_size((small.box[2] - small.box[0], small.box[3] - small.box[1]), episode.env.image_budget)
            assert native[0] * native[1] < CROP_FLOOR <= small.crop.width * small.crop.height
            sft_images, sft_batch = sft_rendering(tiny_kit, row_of[question(rollout["prompt"])], tool)
            for k, (rl_call, eval_call) in enumerate(zip(theirs, ours), start=1):
                assert rl_call.crop.size == eval_call.crop.size == sft_images[k].size, k
                assert rl_call.crop.tobytes() == eval_call.crop.tobytes() == sft_images[k].tobytes(), k
            # ...and as model input: SFT's collated pixel values are those of the agent's last turn (TRL's, above).
            last = agent_inputs["seen"][tuple(episode.prompt_ids)][-1]
            assert sft_batch["image_grid_thw"].tolist() == last["grids"]
            assert torch.equal(sft_batch["pixel_values"], last["pixels"])
        else:
            assert len(rollout["env"].calls) == 2  # TRL ran both tools, then dropped their responses
            assert episode.prediction is None and "overflow max_completion_length=120" in episode.failure
