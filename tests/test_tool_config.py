"""One declaration of the tool settings (`ToolConfig`): parsed by every entry script, recorded in checkpoints, replayed
from the record unless the recipe or command line says otherwise (with a warning naming both values); and the CLIP
verifier that scores the whole crop."""

import json
import logging
import shutil
import warnings

import pytest
from PIL import Image
from trl import ModelConfig

import evaluate
from configs import EvalArguments, ScriptArguments, SFTConfig
from data.trajectories import TrajectoryArguments
from mapo_trainer import ClipVerifier, MAPOConfig
from tools import RECORD_NAME, PixelBudget, ToolConfig, read_record, write_record
from utils import checks
from utils.recipes import parse_args_and_record

RL_TYPES = (ScriptArguments, MAPOConfig, ModelConfig, ToolConfig)
SFT_TYPES = (ScriptArguments, SFTConfig, ModelConfig, TrajectoryArguments, ToolConfig)


def test_crop_budget_defaults_to_the_image_budget_and_resolves_for_the_record():
    image = PixelBudget(3136, 12544, 28)
    assert ToolConfig().crop_budget(image) == image
    assert ToolConfig(crop_max_pixels=6272).crop_budget(image) == PixelBudget(3136, 6272, 28)
    assert ToolConfig(crop_max_pixels=100).crop_budget(image).max_pixels == 3136  # never below the minimum
    record = ToolConfig(clip_model="x").resolved(image).as_record(verifier=False)
    assert (record["min_pixels"], record["max_pixels"], record["crop_max_pixels"]) == (3136, 12544, 12544)
    assert "clip_model" not in record and "clip_resize" not in record  # SFT scores nothing with CLIP


def test_the_crop_floor_joins_the_crop_budget_and_the_record():
    image = PixelBudget(3136, 12544, 28)
    assert ToolConfig(crop_min_pixels=6272).crop_budget(image) == PixelBudget(6272, 12544, 28)
    assert ToolConfig(crop_min_pixels=100).crop_budget(image).min_pixels == 3136  # never below the processor's
    assert ToolConfig().resolved(image).crop_min_pixels == 3136  # unset: the processor's floor, as recorded
    record = ToolConfig(crop_min_pixels=6272).resolved(image).as_record(verifier=False)
    assert (record["crop_min_pixels"], record["crop_max_pixels"]) == (6272, 12544)
    with pytest.raises(ValueError, match="crop_min_pixels=20000 is over the crops' ceiling of 12544"):
        ToolConfig(crop_min_pixels=20000).crop_budget(image)  # over the processor's max_pixels
    for kwargs, ceiling in (({"crop_max_pixels": 6272}, "crop_max_pixels=6272"), ({"max_pixels": 6272}, "max_pixels")):
        with pytest.raises(ValueError, match=f"crop_min_pixels=12544 must be at most {ceiling}"):
            ToolConfig(crop_min_pixels=12544, **kwargs)


def test_a_record_from_before_the_crop_floor_reads_as_floored_at_min_pixels(tmp_path):
    """Such a checkpoint's crops were floored by the processor alone: a run that sets a floor warns, naming both."""
    write_record(tmp_path, {"min_pixels": 3136, "max_pixels": 12544})
    assert read_record(tmp_path)["tool"]["crop_min_pixels"] == 3136
    with pytest.warns(UserWarning, match="crop_min_pixels: trained with 3136, now 6272"):
        parse_args_and_record(
            (EvalArguments, ToolConfig), ["--model_name_or_path", str(tmp_path), "--crop_min_pixels", "6272"]
        )


def test_a_crop_budget_over_the_image_budget_is_capped_at_it_and_warns():
    """Issue 49, item 6: the processor shrinks any image into its own max_pixels, so a crop resized to a larger
    `crop_max_pixels` was shown smaller than the tool's record of it (its `img_idx` frame, its token cost). Capped at
    the image's ceiling; the run's record says so, with a warning naming both (`evaluate.py --max_pixels 50176`
    keeps the recipes' crop_max_pixels 401408)."""
    image = PixelBudget(3136, 12544, 28)
    assert ToolConfig(crop_max_pixels=20000).crop_budget(image) == image
    with pytest.warns(
        UserWarning, match="crop_max_pixels 20000 is over max_pixels 12544: crops are resized to at most"
    ):
        assert ToolConfig(crop_max_pixels=20000).resolved(image).crop_max_pixels == 12544
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ToolConfig(crop_max_pixels=12544).resolved(image).crop_max_pixels == 12544


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"clip_resize": "crop"}, "clip_resize"),
        ({"max_pixels": 0}, "max_pixels"),
        ({"max_label_words": 0}, "label"),
        ({"box_convention": "relative"}, "box_convention"),
        # Issue 59, item 1: a zero side floor let a 1-pixel box through; NaN passed every `<` check.
        ({"min_side": 0}, "min_side"),
        ({"min_side": -28}, "min_side"),
        ({"max_aspect": 0.0}, "max_aspect"),
        ({"max_aspect": -1.0}, "max_aspect"),
        ({"max_aspect": 0.5}, "max_aspect"),
        ({"max_aspect": float("nan")}, "max_aspect"),
        ({"max_aspect": float("inf")}, "max_aspect"),
    ],
)
def test_bad_settings_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ToolConfig(**kwargs)


def test_a_record_with_an_unknown_setting_names_it(tmp_path):
    write_record(tmp_path, {"max_pixels": 1, "max_pixelz": 2})
    with pytest.raises(ValueError, match="max_pixelz"):
        read_record(tmp_path)
    assert read_record(tmp_path / "elsewhere") is None and read_record("Qwen/Qwen2.5-VL-7B-Instruct") is None


def test_a_record_of_an_earlier_version_with_the_retired_environment_setting_still_reads(tmp_path):
    write_record(tmp_path, {"max_pixels": 6272, "environment": "zoom_in"})
    # ...and, recorded before box_convention and accept_img_idx existed, it was trained in pixels without img_idx
    assert read_record(tmp_path)["tool"] == {"max_pixels": 6272, "box_convention": "pixels", "accept_img_idx": False}


@pytest.fixture
def checkpoint(tmp_path):
    """A checkpoint folder whose record says what it was trained with."""
    record = ToolConfig(max_pixels=6272, crop_max_pixels=3136, max_label_words=5, clip_model="trained-clip")
    write_record(tmp_path, record.as_record(), max_completion_length=512, max_tool_calling_iterations=3)
    return tmp_path


def test_settings_not_given_come_from_the_checkpoint_record(checkpoint):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing differs: no warning
        args, tool = parse_args_and_record((EvalArguments, ToolConfig), ["--model_name_or_path", str(checkpoint)])
    assert (tool.max_pixels, tool.crop_max_pixels, tool.max_label_words, tool.clip_model) == (
        6272,
        3136,
        5,
        "trained-clip",
    )
    assert (args.max_completion_length, args.max_tool_calling_iterations) == (512, 3)  # the RL rollout budget


def test_the_command_line_and_recipe_win_and_warn_with_both_values(checkpoint, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model_name_or_path: {checkpoint}\nmax_label_words: 8\n")
    argv = ["--config", str(recipe), "--max_pixels", "12544", "--max_completion_length", "1024"]
    with pytest.warns(UserWarning) as caught:
        args, tool = parse_args_and_record((EvalArguments, ToolConfig), argv)
    assert (tool.max_pixels, tool.max_label_words, args.max_completion_length) == (12544, 8, 1024)
    assert tool.crop_max_pixels == 3136  # not given: the record's
    (message,) = [str(w.message) for w in caught if RECORD_NAME in str(w.message)]
    for expected in ("max_pixels: trained with 6272, now 12544", "max_label_words: trained with 5, now 8"):
        assert expected in message
    assert "max_completion_length: trained with 512, now 1024" in message


def test_without_a_record_the_dataclass_defaults_apply(tmp_path):
    _, _, _, tool = parse_args_and_record(RL_TYPES, ["--model_name_or_path", str(tmp_path), "--use_cpu", "true"])
    assert tool == ToolConfig()


def test_rl_from_an_sft_checkpoint_inherits_its_tool_settings(checkpoint):
    """`make sft` then `make rl`: the tiny RL recipe starts from the SFT output and takes its tool settings."""
    argv = ["--config", "recipes/tiny/rl/config_mapo.yaml", "--model_name_or_path", str(checkpoint)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        script_args, config, model_args, tool = parse_args_and_record(RL_TYPES, argv)
    assert (tool.max_pixels, tool.crop_max_pixels, tool.max_label_words) == (6272, 3136, 5)
    assert tool.clip_model == "outputs/tiny/clip"  # the recipe names its verifier: that wins, and says so
    assert any("clip_model: trained with 'trained-clip'" in str(w.message) for w in caught)


def test_a_run_that_sets_another_box_convention_than_its_checkpoint_fails_at_start(tmp_path):
    """A policy trained to write boxes in one frame, read in another, crops the wrong region on every call: unlike a
    changed pixel budget (a warning), this is an error, naming both values. Left out, the record's is taken."""
    qwen3 = tmp_path / "qwen3"
    write_record(qwen3, ToolConfig(box_convention="relative_1000").as_record(verifier=False))
    argv = ["--model_name_or_path", str(qwen3)]
    with pytest.raises(
        ValueError, match=r"box_convention: trained with 'relative_1000', the recipe or command line sets 'pixels'"
    ):
        parse_args_and_record((EvalArguments, ToolConfig), [*argv, "--box_convention", "pixels"])
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("box_convention: pixels\n")
    with pytest.raises(ValueError, match=f"{qwen3} was trained with other tool settings"):
        parse_args_and_record((EvalArguments, ToolConfig), ["--config", str(recipe), *argv])
    assert parse_args_and_record((EvalArguments, ToolConfig), argv)[1].box_convention == "relative_1000"
    older = tmp_path / "older"  # a record written before the setting existed: trained in pixels
    write_record(older, {"max_pixels": 6272})
    with pytest.raises(ValueError, match="trained with 'pixels', the recipe or command line sets 'relative_1000'"):
        parse_args_and_record(
            (EvalArguments, ToolConfig), ["--model_name_or_path", str(older), "--box_convention", "relative_1000"]
        )


def box_convention(*argv: str) -> str:
    return parse_args_and_record((EvalArguments, ToolConfig), list(argv))[1].box_convention


def test_without_a_record_the_box_convention_is_the_model_familys_own(tiny_kit, tmp_path, caplog):
    """Issue 37: a Qwen3-VL with no `tool_config.json` (the hub model as a zero-shot baseline, an SFT recipe that
    leaves the key out) writes its boxes on its 0-1000 grid; read as pixels, every crop would be wrong, silently. Left
    unset, the convention is the family's, logged; a recipe or command line that sets the other one warns, naming
    both; a record still wins over the family."""
    qwen3, qwen25 = str(tiny_kit["qwen3_vl"]), str(tiny_kit["policy"])
    with caplog.at_level(logging.WARNING, logger="utils.recipes"):
        assert box_convention("--model_name_or_path", qwen3) == "relative_1000"
    assert (
        f"no recipe, command line or record of {qwen3} sets box_convention='relative_1000', accept_img_idx=True: its family's own"
        in caplog.text
    )
    assert box_convention("--model_name_or_path", "Qwen/Qwen3-VL-8B-Instruct") == "relative_1000"  # shipped config
    flag_last = ["--model_name_or_path", qwen25, "--accept_img_idx"]  # a bare boolean flag, last on the line
    assert parse_args_and_record((EvalArguments, ToolConfig), flag_last)[1].accept_img_idx is True
    for model, accepts in ((qwen3, True), (qwen25, False)):  # Qwen3-VL's own zoom tool takes img_idx
        assert parse_args_and_record((EvalArguments, ToolConfig), ["--model_name_or_path", model])[1].accept_img_idx \
            is accepts  # fmt: skip
    assert box_convention("--model_name_or_path", "Qwen/Qwen2.5-VL-7B-Instruct") == "pixels"
    sft = ["--model_name_or_path", qwen3, "--output_dir", str(tmp_path / "sft"), "--use_cpu", "true"]
    assert parse_args_and_record(SFT_TYPES, sft)[-1].box_convention == "relative_1000"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the family's own, set: no warning
        box_convention("--model_name_or_path", qwen25, "--box_convention", "pixels")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"model_name_or_path: {qwen3}\nbox_convention: pixels\n")
    named = rf"recipe {recipe} sets 'pixels' for {qwen3}, a qwen3_vl model, whose own convention is 'relative_1000'"
    with pytest.warns(UserWarning, match=named):
        assert box_convention("--config", str(recipe)) == "pixels"
    named = r"the command line sets 'relative_1000' for .*, a qwen2_5_vl model, whose own convention is 'pixels'"
    with pytest.warns(UserWarning, match=named):
        box_convention("--model_name_or_path", qwen25, "--box_convention=relative_1000")
    trained = tmp_path / "trained_in_pixels"  # a Qwen3-VL SFT checkpoint trained in pixels: its record says so
    shutil.copytree(qwen3, trained)
    write_record(trained, ToolConfig(box_convention="pixels").as_record(verifier=False))
    assert box_convention("--model_name_or_path", str(trained)) == "pixels"


def qwen3_vl_moe_folder(tiny_kit, folder):
    """A local Qwen3-VL MoE checkpoint's config (Qwen3-VL-30B-A3B's `model_type`), the tiny Qwen3-VL's made MoE: a
    real `Qwen3VLMoeConfig` (no weights: the parse and the start-up check read only the config)."""
    raw = json.loads((tiny_kit["qwen3_vl"] / "config.json").read_text())
    raw.update(model_type="qwen3_vl_moe", architectures=["Qwen3VLMoeForConditionalGeneration"])
    raw["text_config"].update(model_type="qwen3_vl_moe_text", num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=32, decoder_sparse_step=1)  # fmt: skip
    raw["vision_config"]["model_type"] = "qwen3_vl_moe_vision"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(raw))
    return folder


def test_qwen3_vl_moe_takes_qwen3_vls_settings_and_an_unknown_family_is_refused(tiny_kit, tmp_path, caplog):
    """Issue 49, item 4: a local fine-tune with `model_type: qwen3_vl_moe` (Qwen3-VL-30B-A3B) got `pixels`, the log
    saying its family "cannot be read", and `evaluate.py` took any family: its 0-1000 boxes cropped the wrong region,
    silently. Now the MoE takes Qwen3-VL's settings, logged as its family's own, and passes training's start-up check
    (its LoRA targets on the MoE module tree); a model of a family the repo does not support is refused by
    evaluation's parse, by training's parse and by the start-up check, naming the field and the families. Planted:
    without `qwen3_vl_moe` in `MODEL_FAMILIES`, the MoE is refused; without the parse's check, the llava is evaluated
    in `pixels`."""
    moe = str(qwen3_vl_moe_folder(tiny_kit, tmp_path / "moe"))
    with caplog.at_level(logging.INFO, logger="utils.recipes"):
        tool = parse_args_and_record((EvalArguments, ToolConfig), ["--model_name_or_path", moe])[1]
    assert (tool.box_convention, tool.accept_img_idx) == ("relative_1000", True)
    assert (
        "box_convention='relative_1000', accept_img_idx=True: its family's own (model_type qwen3_vl_moe)"
        in caplog.text
    )
    assert "cannot be read" not in caplog.text
    lora = {"use_peft": True, "lora_target_modules": ["q_proj", "v_proj"]}
    assert checks.check_model(ModelConfig(model_name_or_path=moe, **lora)).model_type == "qwen3_vl_moe"

    llava = tmp_path / "llava"
    llava.mkdir()
    (llava / "config.json").write_text('{"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"]}')
    named = (r"model_name_or_path: .*llava is a 'llava' model.*; supported model families: Qwen2.5-VL \(model_type "
             r"qwen2_5_vl\), Qwen3-VL \(model_type qwen3_vl\), Qwen3-VL-MoE \(model_type qwen3_vl_moe\), Qwen3.5 "
             r"\(model_type qwen3_5\), Qwen3.5-MoE \(model_type qwen3_5_moe\)$")  # fmt: skip
    with pytest.raises(ValueError, match=named):
        evaluate.parse_args(["--model_name_or_path", str(llava), "--benchmark", "synthetic"])
    with pytest.raises(ValueError, match=named):
        parse_args_and_record(
            SFT_TYPES, ["--model_name_or_path", str(llava), "--output_dir", str(tmp_path), "--use_cpu", "true"]
        )
    with pytest.raises(ValueError, match=named):
        checks.check_model(ModelConfig(model_name_or_path=str(llava)))


def test_the_tiny_rl_recipe_starts_from_the_tiny_sft_output():
    import yaml

    sft = yaml.safe_load(open("recipes/tiny/sft/config_sft.yaml"))
    rl = yaml.safe_load(open("recipes/tiny/rl/config_mapo.yaml"))
    assert rl["model_name_or_path"] == sft["output_dir"]


# ---------------------------------------------------------------------------------------------- the CLIP verifier
def elongated_crop() -> Image.Image:
    """A 896x112 crop: grey, with a red square at its right end (what an 8:1 zoom on a shelf label looks like)."""
    image = Image.new("RGB", (896, 112), (128, 128, 128))
    image.paste((255, 0, 0), (800, 8, 892, 104))
    return image


@pytest.mark.parametrize(("resize", "sees_red"), [("pad", True), ("squash", True), ("center_crop", False)])
def test_clip_sees_the_whole_crop_unless_told_to_centre_crop(tiny_kit, resize, sees_red):
    verifier = ClipVerifier(ToolConfig(clip_model=str(tiny_kit["clip"]), clip_resize=resize))
    pixels = verifier.preprocess(elongated_crop())  # normalised: red has a high R and a low G channel
    red = (pixels[0] > 1.0) & (pixels[1] < -1.0)
    assert bool(red.any()) == sees_red
    if resize == "pad":  # letterboxed: the crop keeps its 8:1 shape inside the square, padded above and below
        padding = pixels[:, 0, 0]  # the top row is padding: black, normalised
        content = ((pixels - padding[:, None, None]).abs().sum(0) > 1e-3).any(1)
        assert 0 < int(content.sum()) <= pixels.shape[1] // 8 + 2


def test_training_and_evaluation_score_with_the_same_preprocessing(tiny_kit):
    """Both build `ClipVerifier` from the one `ToolConfig`; the default lets CLIP see the whole crop."""
    assert ToolConfig().clip_resize == "pad"
    verifier = ClipVerifier(ToolConfig(clip_model=str(tiny_kit["clip"])))
    assert (
        verifier.preprocess(elongated_crop()).shape[-2:] == verifier.preprocess(Image.new("RGB", (64, 64))).shape[-2:]
    )


def test_record_file_is_plain_json(checkpoint):
    data = json.loads((checkpoint / RECORD_NAME).read_text())
    assert set(data) == {"tool", "rollout"} and data["rollout"]["max_tool_calling_iterations"] == 3
