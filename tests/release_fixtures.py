"""Small releases shaped like each public zoom-trajectory set as published, generated here (nothing is downloaded),
with the crops each ships made by a transcription of that project's own crop code, never by `data.converters`.

Each writer cites the upstream loader or dataset card whose layout it follows, and each crop function the upstream
code it transcribes (repository and path). A row is built from its calls as the upstream tool ran them: a call the
tool rejects shows an error turn and no image, exactly as the release would. `plant` arguments build a row whose
crops were made under another convention than its text states (x and y swapped, a 0-based target, an enlarged box),
which the converter's crop check must catch.
"""

from __future__ import annotations

import ast
import base64
import contextlib
import glob
import io
import json
import math
import os
import random
import re
import string
import tempfile
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image, ImageDraw, ImageEnhance, ImageFilter

SIZE = (400, 300)
TARGET = (250, 100, 290, 140)  # a red square: a crop shows it when it holds these pixels
QUESTION = "What colour is the small square?"


def scene(size: tuple[int, int] = SIZE, seed: int = 0) -> Image.Image:
    """A textured picture (smooth random blobs and bars, so a crop in the wrong place has other content) with the red
    target square."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(size[1] // 20 + 1, size[0] // 20 + 1, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize(size, Image.Resampling.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(12):
        x, y = int(rng.integers(0, size[0])), int(rng.integers(0, size[1]))
        w, h = int(rng.integers(8, 40)), int(rng.integers(8, 40))
        draw.rectangle((x, y, x + w, y + h), fill=tuple(int(v) for v in rng.integers(0, 256, 3)))
    draw.rectangle((TARGET[0], TARGET[1], TARGET[2] - 1, TARGET[3] - 1), fill=(220, 20, 30))
    return image


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def think(text: str) -> str:
    return f"<think>{text}</think>"


def smart_resize(height: int, width: int, factor: int = 28, min_pixels: int = 56 * 56, max_pixels: int = 12845056):
    """Qwen's resize rule as PixelReasoner and CoF import it from qwen_vl_utils (github.com/QwenLM/Qwen3-VL, formerly
    Qwen2.5-VL, `qwen-vl-utils/src/qwen_vl_utils/vision_process.py`, `smart_resize`): sides rounded to multiples of
    `factor`, then scaled into [min_pixels, max_pixels]."""
    assert max(height, width) / min(height, width) <= 200, "absolute aspect ratio must be smaller than 200"
    h_bar, w_bar = max(factor, round(height / factor) * factor), max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar, w_bar = math.floor(height / beta / factor) * factor, math.floor(width / beta / factor) * factor
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


# ============================================================================================================ Mini-o3
def mini_o3_observation(observations: list[Image.Image], call: dict) -> Image.Image:
    """The next observation, as github.com/Mini-o3/Mini-o3 `verl/workers/rollout/vllm_rollout/function_tools.py`
    makes it (`prepare_grounding_inputs_multi_turn` with `use_relative_coordinates=True`, then `crop_image` with
    `resize=1`): the relative box times the source observation's size, truncated, clamped to w-1 / h-1, cropped.
    Raises on what their tool rejects (their rollout then shows an error turn and adds no observation)."""
    source = call["source"]
    index = 0 if source == "original_image" else int(source.removeprefix("observation_"))
    assert index < len(observations), f'Error in predicting the source observation: "{source}".'
    image = observations[index]
    w, h = image.size
    bbox = call["bbox_2d"]
    bbox = (bbox[0] * w, bbox[1] * h, bbox[2] * w, bbox[3] * h)
    bbox = [int(bbox[0]), int(bbox[1]), int(bbox[2]), int(bbox[3])]
    bbox = [max(bbox[0], 0), max(bbox[1], 0), min(bbox[2], w - 1), min(bbox[3], h - 1)]
    assert bbox[0] <= bbox[2] - 1, f"The bounding box is not valid in width: {bbox}"
    assert bbox[1] <= bbox[3] - 1, f"The bounding box is not valid in height: {bbox}"
    width_box, height_box = bbox[2] - bbox[0], bbox[3] - bbox[1]
    if width_box / height_box >= 200 or height_box / width_box >= 200:
        raise ValueError("The absolute aspect ratio of the bounding box exceeds 200, which is too large.")
    return image.crop(bbox)


def mini_o3_process_image(image: Image.Image, max_pixels: int = 2048 * 2048, min_pixels: int = 512 * 512):
    """The observation as their rollout shows it (`vllm_rollout_spmd.py` `process_image`): NEAREST-resized into the
    pixel range, 28 px a side at least."""
    if image.width * image.height > max_pixels:
        factor = math.sqrt(max_pixels / (image.width * image.height))
        image = image.resize((int(image.width * factor), int(image.height * factor)), Image.Resampling.NEAREST)
    if image.width * image.height < min_pixels:
        factor = math.sqrt(min_pixels / (image.width * image.height))
        image = image.resize((int(image.width * factor), int(image.height * factor)), Image.Resampling.NEAREST)
    if image.width < 28 or image.height < 28:
        factor = 28 / min(image.width, image.height)
        image = image.resize((int(image.width * factor + 1), int(image.height * factor + 1)), Image.Resampling.NEAREST)
    return image.convert("RGB")


def mini_o3_row(calls, answer="red", question=QUESTION, original=None, index=0, plant=None) -> dict:
    """One cold-start row (the columns `scripts/preprocess_coldstart.py` of Mini-o3/Mini-o3 reads: `conversations` a
    string of a sharegpt list, `images` the original then each observation, `image_names`). `calls`: per action its
    grounding dict. `plant="swap_xy"`: the observations were cut with x and y swapped."""
    original = original or scene()
    observations, shipped = [original], [original]
    turns = [{"from": "system", "value": "..."}, {"from": "human", "value": f"<image>\n{question}"}]
    for action, call in enumerate(calls):
        text = think(f"Step {action}: I zoom in on the red square.") + f"<grounding>{json.dumps(call)}</grounding>"
        turns.append({"from": "gpt", "value": text})
        ran = dict(call)
        if plant == "swap_xy":
            x1, y1, x2, y2 = call["bbox_2d"]
            ran["bbox_2d"] = [y1, x1, y2, x2]
        try:
            observation = mini_o3_observation(observations, ran)
        except (AssertionError, ValueError) as err:
            turns.append({"from": "human", "value": f"ERROR occurs during grounding. Error Information: {err}.\n"})
            continue
        observations.append(observation)
        shipped.append(mini_o3_process_image(observation))
        # their observation number counts every action, failed ones too (current_iteration + 1)
        turns.append({"from": "human", "value": f"After the above Action {action}, here is the the zoom-in image "
                      f"(Observation {action + 1}):\n<image>.\nContinue your reasoning."})  # fmt: skip
    turns.append({"from": "gpt", "value": think("It is red.") + f"<answer>{answer}</answer>"})
    names = ["original_image.jpg"] + [f"observation_{k}.jpg" for k in range(1, len(shipped))]
    return {
        "conversations": json.dumps(turns),
        "images": [{"bytes": png(image), "path": None} for image in shipped],
        "image_names": names,
        "data_source": "visual_probe",
        "sample_index": index,
        "rollout_index": 0,
    }


def write_mini_o3(root: Path, rows: list[dict]) -> Path:
    """The release as the HF dataset `Mini-o3/Mini-o3-Coldstart-Dataset` holds it: parquet shards under `data/`."""
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), root / "data" / "train-00000-of-00001.parquet")
    return root


# ======================================================================================================= PixelReasoner
def pixel_reasoner_crop(image: Image.Image, bbox_2d, padding: float = 0.1) -> Image.Image:
    """github.com/TIGER-AI-Lab/Pixel-Reasoner `curiosity_driven_rl/openrlhf/trainer/ppo_utils/experience_maker.py`,
    `CropImageNormalized.call`: normalised when all four values are < 1, else pixels of the image given; padded by
    0.1 per side, clamped to [0, 1]; more than 28 px a side."""
    img_x, img_y = image.size
    if all(v < 1 for v in bbox_2d):
        box = (bbox_2d[0] - padding, bbox_2d[1] - padding, bbox_2d[2] + padding, bbox_2d[3] + padding)
    else:
        box = (bbox_2d[0] / img_x - padding, bbox_2d[1] / img_y - padding, bbox_2d[2] / img_x + padding,
               bbox_2d[3] / img_y + padding)  # fmt: skip
    x1, y1, x2, y2 = (min(max(0, v), 1) for v in box)
    cropped = image.crop((x1 * img_x, y1 * img_y, x2 * img_x, y2 * img_y))
    w, h = cropped.size
    assert w > 28 and h > 28, f"Cropped image is too small: {w}x{h}"
    return cropped


def pixel_reasoner_resize(image: Image.Image, min_pixels: int = 4 * 28 * 28, max_pixels: int = 5120 * 28 * 28):
    """The crop as their loop shows it (`experience_maker.py` `resize_cropped`: Qwen's smart_resize)."""
    height, width = smart_resize(image.height, image.width, factor=28, min_pixels=min_pixels, max_pixels=max_pixels)
    return image.convert("RGB").resize((width, height))


def pixel_reasoner_record(
    calls, qid="q0", answer="red", first_parts=None, plant=None, padding=0.1
) -> tuple[dict, dict]:
    """One `{qid, message_list}` record (github.com/TIGER-AI-Lab/Pixel-Reasoner `instruction_tuning/sft_tool.py`
    reads `message_list`) and the image files it names. Each call runs as their `execute_tool` (non-video) runs it:
    `images[target_image - 1]`, the original raw, a crop as shown; a rejected call shows an error turn and no image.
    `plant="zero_based"`: the last call's crop was cut from `images[target_image]`, a 0-based reading. `padding`:
    their RL tool's 0.1, or another (0: a release whose crops are the plain box)."""
    original = scene()
    files = {"images/0.png": original}
    images = [original]
    parts = first_parts or [{"type": "image", "image": "images/0.png"}, {"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": parts}]
    for k, call in enumerate(calls):
        arguments = {"bbox_2d": call[0], "target_image": call[1]}
        text = think("I zoom in on the red square.") + "<tool_call>" + json.dumps(
            {"name": "crop_image_normalized", "arguments": arguments}
        ) + "</tool_call>"  # fmt: skip
        messages.append({"role": "assistant", "content": [{"type": "text", "text": text}]})
        index = call[1] - (0 if plant == "zero_based" and k == len(calls) - 1 else 1)
        try:
            assert index < len(images), "Execution Error: Incorrect `target_image` argument"
            shown = pixel_reasoner_resize(pixel_reasoner_crop(images[index], call[0], padding=padding))
        except AssertionError as err:
            messages.append({"role": "user", "content": [{"type": "text", "text": f"\nExecution error:\n{err}\n"}]})
            continue
        images.append(shown)
        name = f"images/{qid}_crop{k}.png"
        files[name] = shown
        messages.append({"role": "user", "content": [
            {"type": "text", "text": f"\nHere is the cropped image (Image Size: {shown.width}x{shown.height}):"},
            {"type": "image", "image": name}]})  # fmt: skip
    final = think("Red.") + f"The answer is \\boxed{{{answer}}}."
    messages.append({"role": "assistant", "content": [{"type": "text", "text": final}]})
    return {"qid": qid, "message_list": messages}, files


def write_pixel_reasoner(root: Path, records: list[tuple[dict, dict]], zipped: bool = False) -> Path:
    """The release as the HF dataset `TIGER-Lab/PixelReasoner-SFT-Data` holds it: a JSON list and `images.zip` (here
    unzipped into `images/`, or left as the zip)."""
    root.mkdir(parents=True)
    _write_images(root, {name: image for _, files in records for name, image in files.items()}, zipped)
    (root / "release.json").write_text(json.dumps([record for record, _ in records]), encoding="utf-8")
    return root


def _write_images(root: Path, files: dict[str, Image.Image], zipped: bool) -> None:
    if zipped:
        with zipfile.ZipFile(root / "images.zip", "w") as archive:
            for name, image in files.items():
                archive.writestr(name, png(image))
        return
    for name, image in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        image.save(root / name)


# ============================================================================================================== CoF
def cof_crop(image: Image.Image, bbox_2d, enlarge_factor: float = 1.0, scaleup_factor: int = 2,
             min_pixels: int = 112 * 112) -> Image.Image:  # fmt: skip
    """github.com/xtong-zhang/Chain-of-Focus `verl/recipe/zoomin/zoomin_vision_tool.py`, `enlarge_bbox` then
    `do_crop`: the box enlarged about its centre (clamped), truncated, cropped, scaled up through smart_resize. The
    SFT release's crop code is not published; its RL tool and eval enlarge by 1.5: the converter reads both
    (`cof.COF_ENLARGEMENT`)."""
    width, height = image.size
    x0, y0, x1, y1 = bbox_2d
    if enlarge_factor != 1:
        cx, cy, bw, bh = (x0 + x1) / 2, (y0 + y1) / 2, (x1 - x0) * enlarge_factor, (y1 - y0) * enlarge_factor
        x0, y0, x1, y1 = max(0, cx - bw / 2), max(0, cy - bh / 2), min(width, cx + bw / 2), min(height, cy + bh / 2)
    cropped = image.crop((int(x0), int(y0), int(x1), int(y1)))
    h, w = smart_resize(cropped.height * scaleup_factor, cropped.width * scaleup_factor, factor=28,
                        min_pixels=min_pixels, max_pixels=5120 * 28 * 28)  # fmt: skip
    return cropped.resize((w, h), Image.Resampling.LANCZOS).convert("RGB")


# CoF's user turn (prepare_zoomin_data.py): "<image> Question: {question}" + an answer instruction + USER_PROMPT.
COF_TOOL_LINE = (
    "Think in the mind first, and then decide whether to call tools one or more times OR provide final answer."
)


def cof_user_turn(question: str, options=()) -> str:
    text = question + "".join(f"\n({chr(65 + j)}) {option}" for j, option in enumerate(options))
    instruction = ("Answer with the option's letter from the given choices directly." if options
                   else "Answer the question using a single word or phrase.")  # fmt: skip
    return f"<image> Question: {text}\n{instruction}\n{COF_TOOL_LINE}"


def cof_record(calls, answer="red", question=QUESTION, options=(), image_name="0.png", enlarge=1.0, thought=None):
    """One LLaMA-Factory sharegpt record (github.com/xtong-zhang/Chain-of-Focus `configs/dataset_info.json`:
    `messages`, `images`, paths relative to `dataset_dir`, the unzipped `images.zip`) and its image files. `calls`:
    per turn (bbox_2d, label), or None for a turn whose call the tool rejects (an error turn, no image)."""
    original = scene()
    files = {image_name: original}
    images = [image_name]
    messages = [{"role": "system", "content": "You are a helpful assistant.\n\n# Tools ..."},
                {"role": "user", "content": cof_user_turn(question, options)}]  # fmt: skip
    for k, call in enumerate(calls):
        box, label = call if call is not None else ([500, 500, 600, 600], "the red square")
        payload = json.dumps({"name": "image_zoom_in_tool", "arguments": {"bbox_2d": box, "label": label}})
        text = think(thought or "Too small; I zoom in.") + f"\n<tool_call>{payload}</tool_call>"
        messages.append({"role": "assistant", "content": text})
        if call is None:
            messages.append({"role": "user", "content": f"Error: bbox {box} out of range.\n{COF_TOOL_LINE}"})
            continue
        name = f"{image_name.rsplit('.', 1)[0]}_crop{k}.png"
        files[name] = cof_crop(original, box, enlarge_factor=enlarge)
        images.append(name)
        messages.append({"role": "user", "content": f"<image>\n{COF_TOOL_LINE}"})
    messages.append({"role": "assistant", "content": think("Red.") + f"\n<answer>{answer}</answer>"})
    return {"messages": messages, "images": images}, files


def write_cof(root: Path, records, layout: str = "images_folder") -> Path:
    """The release as HF `xintongzhang/CoF-SFT-Data-5.4k` holds it: `cof_sft_data.json` and `images.zip`.
    `layout`: "images_folder" (the zip unzipped into `images/`, the paths relative to it), "zip" (not unzipped), or
    "root" (paths written `images/...` relative to the folder)."""
    root.mkdir(parents=True)
    files = {name: image for _, named in records for name, image in named.items()}
    out = []
    for record, _ in records:
        record = dict(record)
        if layout == "root":
            record["images"] = [f"images/{name}" for name in record["images"]]
        out.append(record)
    if layout == "zip":
        _write_images(root, {f"images/{name}": image for name, image in files.items()}, zipped=True)
    else:
        _write_images(root, {f"images/{name}": image for name, image in files.items()}, zipped=False)
    (root / "cof_sft_data.json").write_text(json.dumps(out), encoding="utf-8")
    return root


# ========================================================================================================= DeepEyesV2
def deepeyes_v2_maybe_resize(image: Image.Image) -> Image.Image:
    """github.com/Visual-Agent/DeepEyesV2 `reinforcement_learning/verl/workers/agent/envs/deepeyesv2/deepeyesv2.py`,
    `maybe_resize_image`: an image under 32 px a side is scaled up (LANCZOS)."""
    height, width = image.height, image.width
    if min(height, width) >= 32:
        return image
    ratio = 32 / min(height, width)
    return image.resize((math.ceil(width * ratio), math.ceil(height * ratio)), Image.Resampling.LANCZOS)


def deepeyes_v2_cell(code: str, kernel: dict) -> list[Image.Image]:
    """The images one code cell displays, run as their Jupyter sandbox runs it (`deepeyesv2.py`: `image_1` decoded from
    the un-resized original, the kernel's names kept between cells; `display` and a cell's last value shown)."""
    shown: list[Image.Image] = []
    kernel["display"] = lambda *values: shown.extend(v for v in values if isinstance(v, Image.Image))
    kernel.update(Image=Image, ImageEnhance=ImageEnhance, ImageFilter=ImageFilter)
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<cell>", "exec"), kernel)  # the tests' own fixture code, run as the sandbox runs it
    if last is not None:
        value = eval(compile(ast.Expression(last.value), "<cell>", "eval"), kernel)
        if isinstance(value, Image.Image):
            shown.append(value)
    return [deepeyes_v2_maybe_resize(image.convert("RGB")) for image in shown]


def deepeyes_v2_record(cells, answer="red", question=QUESTION, image_name="0.png", plant_code=None):
    """One sharegpt record of DeepEyesV2's SFT set (`cold_start/data/dataset_info.json`: `messages`, `images`, paths
    joined to the unzipped `images.zip` by `cold_start/data_convert.py`) and its image files. `cells`: per turn the
    code (run for the images it shows) or a `<tool_call>` search string. `plant_code`: per cell, other code whose
    images the release ships instead (a convention the text does not state)."""
    original = scene()
    files = {image_name: original}
    images = [image_name]
    kernel = {"image_1": original.copy()}
    planted = {"image_1": original.copy()}
    messages = [{"role": "system", "content": "..."},
                {"role": "user", "content": f"<image>\n{question}\n\nYou must put your answer inside <answer> "
                 "</answer> tags. Use Python code to process the image if necessary."}]  # fmt: skip
    for k, cell in enumerate(cells):
        if cell.startswith("<tool_call>"):
            messages.append({"role": "assistant", "content": think("Let me search.") + cell})
            messages.append({"role": "user", "content": "<tool_response>\nno results\n</tool_response>"})
            continue
        messages.append({"role": "assistant", "content": think("I examine the red square.")
                         + f"\n<code>\n```python\n{cell}\n```\n</code>"})  # fmt: skip
        try:
            shown = deepeyes_v2_cell(cell, kernel)
            if plant_code is not None:
                shown = deepeyes_v2_cell(plant_code[k], planted)
        except Exception as err:  # the sandbox reports any error as text, no image
            messages.append({"role": "user", "content": f"Code execution result:\nstderr:\n```\n{err!r}\n```"})
            continue
        for j, image in enumerate(shown):
            name = f"{image_name.rsplit('.', 1)[0]}_{k}_{j}.png"
            files[name] = image
            images.append(name)
        tags = ("Images:\n" + "<image>" * len(shown)) if shown else ""
        messages.append({"role": "user", "content": f"Code execution result:\nstdout:\n```\n\n```\n\n{tags}"})
    messages.append({"role": "assistant", "content": think("It is red.") + f"<answer>{answer}</answer>"})
    return {"messages": messages, "images": images}, files


def write_deepeyes_v2(root: Path, records, zipped: bool = False) -> Path:
    """The release as HF `honglyhly/DeepEyesV2_SFT` holds it (DeepEyesV2 `data/README.md`): `json/sft_part_*.json` and
    `images.zip`, the paths relative to what it unzips to (here `images/`, or left zipped)."""
    (root / "json").mkdir(parents=True)
    files = {name: image for _, named in records for name, image in named.items()}
    _write_images(root, {f"images/{name}": image for name, image in files.items()}, zipped)
    records = [record for record, _ in records]
    (root / "json" / "sft_part_0.json").write_text(json.dumps(records), encoding="utf-8")
    return root


# ============================================================================================================== Thyme
THYME_OUTPUT_PREFIX = "/mnt/data/temp_processed_images/"  # sandbox.py ORIGINAL_OUTPUT_PREFIX: where code saves


def thyme_clamp(v_x1, v_y1, v_x2, v_y2, img_w, img_h, min_dim=64):
    """github.com/yfzhang114/Thyme `eval/VLMEvalKit/vlmeval/vlm/thyme/sandbox.py`,
    `CropCoordinateTransformer._clamp_coordinates`, line for line."""
    img_w, img_h = float(img_w), float(img_h)
    cx1, cx2, cy1, cy2 = min(v_x1, v_x2), max(v_x1, v_x2), min(v_y1, v_y2), max(v_y1, v_y2)
    final_x1 = min(max(0.0, cx1), img_w - 1.0 if img_w > 0 else 0.0)
    final_x2 = min(max(0.0, cx2), img_w)
    if final_x1 >= final_x2 and img_w > 0:
        final_x1 = max(0.0, final_x2 - 1.0)
        if final_x2 <= final_x1:
            final_x2 = min(img_w, final_x1 + 1.0)
    final_y1 = min(max(0.0, cy1), img_h - 1.0 if img_h > 0 else 0.0)
    final_y2 = min(max(0.0, cy2), img_h)
    if final_y1 >= final_y2 and img_h > 0:
        final_y1 = max(0.0, final_y2 - 1.0)
        if final_y2 <= final_y1:
            final_y2 = min(img_h, final_y1 + 1.0)
    if img_w > 0 and final_x2 - final_x1 < min_dim:
        if img_w < min_dim:
            final_x1, final_x2 = 0.0, img_w
        else:
            final_x2 = final_x1 + min_dim
            if final_x2 > img_w:
                final_x2 = img_w
                final_x1 = max(0.0, final_x2 - min_dim)
    if img_h > 0 and final_y2 - final_y1 < min_dim:
        if img_h < min_dim:
            final_y1, final_y2 = 0.0, img_h
        else:
            final_y2 = final_y1 + min_dim
            if final_y2 > img_h:
                final_y2 = img_h
                final_y1 = max(0.0, final_y2 - min_dim)
    if img_w > 0 and final_x1 >= final_x2:
        final_x2 = min(img_w, final_x1 + 1.0)
    if img_h > 0 and final_y1 >= final_y2:
        final_y2 = min(img_h, final_y1 + 1.0)
    return [final_x1, final_y1, final_x2, final_y2]


class ThymeRewrites(ast.NodeTransformer):
    """sandbox.py's `ImagePathTransformer` (a literal `image_path` that is no image on disk becomes the input path),
    `CropCoordinateTransformer` cases 1 and 2 (case 3 tests for `ast.Index`, which Python 3.9+ never produces) and
    `OpenCVNamespaceTransformer`, applied in one pass (they touch different nodes)."""

    COORDS = ["x1", "y1", "x2", "y2", "left", "top", "right", "bottom"]
    BOXES = ["crop_box", "bbox", "box", "coordinates", "coords", "crop_coords", "left_crop_coords",
             "right_crop_coords", "top_crop_coords", "bottom_crop_coords"]  # fmt: skip

    def __init__(self, input_path: str, size: tuple[int, int]):
        self.input_path, self.size = input_path, size

    def visit_Assign(self, node):
        targets, value = node.targets, node.value
        if len(targets) == 1 and isinstance(targets[0], ast.Name) and targets[0].id == "image_path":
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and not os.path.isfile(value.value):
                node.value = ast.Constant(value=self.input_path)
        numbers = None
        if isinstance(value, ast.Tuple) and len(value.elts) == 4 and len(targets) == 1:
            target = targets[0]
            unpacked = (isinstance(target, ast.Tuple) and len(target.elts) == 4
                        and all(isinstance(t, ast.Name) for t in target.elts)
                        and any(t.id.lower() in self.COORDS for t in target.elts))  # fmt: skip
            if unpacked or (isinstance(target, ast.Name) and target.id in self.BOXES):
                numbers = [v.value if isinstance(v, ast.Constant) and isinstance(v.value, int | float) else None
                           for v in value.elts]  # fmt: skip
        if numbers is not None and all(n is not None for n in numbers):
            clamped = thyme_clamp(*numbers, *self.size)
            if [int(round(c)) for c in clamped] != [int(round(c)) for c in numbers]:
                value.elts = [ast.Constant(value=int(round(c))) for c in clamped]
        return self.generic_visit(node)

    def visit_Attribute(self, node):  # sandbox.py `OpenCVNamespaceTransformer`
        if isinstance(node.value, ast.Name) and node.value.id in ["cv", "cv4", "cv3", "CV"]:
            node.value.id = "cv2"
        return self.generic_visit(node)


def align_first_line_to_second(code: str) -> str:
    """sandbox.py `align_first_line_to_second`: the first non-blank line takes the second's indentation (spaces)."""
    lines = code.splitlines()
    filled = [i for i, line in enumerate(lines) if line.strip()][:2]
    if len(filled) < 2:
        return code
    first, second = lines[filled[0]], lines[filled[1]]
    first_indent = " " * (len(first) - len(first.lstrip(" ")))
    second_indent = " " * (len(second) - len(second.lstrip(" ")))
    if first_indent != second_indent:
        lines[filled[0]] = second_indent + first.lstrip(" ")
    return "\n".join(lines)


def thyme_run(code: str, original: Image.Image, context: dict) -> list[Image.Image]:
    """The images one code block returns, run as Thyme's sandbox runs it (github.com/yfzhang114/Thyme
    `eval/VLMEvalKit/vlmeval/vlm/thyme/sandbox.py`, `_sandboxed_execution_target`): the code stripped, realigned and
    dedented, rewritten (`ThymeRewrites`, then `/mnt/data/temp_processed_images/` replaced by the output folder),
    exec'd with cv2 (real OpenCV), numpy, PIL's `Image`, os, random, math, re, json and string as globals and
    `image_path` (the original, on disk) and `temp_output_dir` as locals, the locals of earlier blocks kept
    (`context`); the images returned are a new `processed_path`, then every existing path under the output folder the
    code printed, in print order."""
    import cv2  # opencv-python-headless: requirements.txt, for this transcription only

    with tempfile.TemporaryDirectory(prefix="thyme-") as folder:
        input_path, output = os.path.join(folder, "input.png"), os.path.join(folder, "out") + "/"
        os.makedirs(output)
        original.save(input_path)
        # model.py strips the block; the sandbox realigns its first line, dedents and strips (then autopep8, whose
        # reformatting these blocks do not need)
        code = textwrap.dedent(align_first_line_to_second(code.strip())).strip()
        tree = ThymeRewrites(input_path, original.size).visit(ast.parse(code))
        code = ast.unparse(tree).replace(THYME_OUTPUT_PREFIX, output)
        sandbox_globals = {"cv2": cv2, "np": np, "numpy": np, "Image": Image, "os": os, "random": random,
                           "math": math, "re": re, "json": json, "string": string}  # fmt: skip
        sandbox_locals = {**context, "image_path": input_path, "temp_output_dir": output}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(code, sandbox_globals, sandbox_locals)  # the tests' own fixture code, run as the sandbox runs it
        paths = []
        processed = sandbox_locals.get("processed_path")
        if "processed_path" not in context and isinstance(processed, str) and os.path.isfile(processed):
            paths.append(processed)
        matches = re.findall(rf"({re.escape(output)}[^\s'\"]+\.(?:jpg|jpeg|png|bmp|gif|tiff))", printed.getvalue())
        paths += [path for path in dict.fromkeys(matches) if os.path.isfile(path) and path not in paths]
        if not paths:  # its fallback: as many image names printed as images in the folder (glob order; sorted here)
            files = sorted(
                p for ext in ("jpg", "jpeg", "png", "bmp", "gif", "tiff") for p in glob.glob(f"{output}*.{ext}")
            )
            names = re.findall(r"([^\s'\"]+\.(?:jpg|jpeg|png|bmp|gif|tiff))", printed.getvalue())
            if files and len(files) in (len(matches), len(names)):
                paths = files
        images = []
        for path in paths:
            with Image.open(path) as image:
                images.append(image.convert("RGB"))
    context.update({k: v for k, v in sandbox_locals.items() if k not in ("image_path", "temp_output_dir")})
    return images


THYME_PATH = "/mllm_hdd/data/images/0001.jpg"


def thyme_question(question: str = QUESTION, path: str = THYME_PATH, size=SIZE) -> str:
    """A Thyme question as the release writes it (Thyme's `eval/VLMEvalKit/vlmeval/vlm/thyme/utils.py`,
    `generate_prompt_final_qa`): the question, the sandbox's path and size lines, the output-format block."""
    return (f'<image>\n{question}\n\n### User Image Path:** "{path}"\n### User Image Size:** "{size[0]}x{size[1]}"\n\n'
            "### **Output Format (strict adherence required):**\n\n<think>Your detailed reasoning, with any code."
            "</think>\n<answer>Your final answer.</answer>\n")  # fmt: skip


def thyme_record(blocks, answer="red", question=QUESTION, plant_code=None, encode: str = "base64") -> dict:
    """One Thyme SFT record (Thyme's README "Training Data Format": `image` the original then each processed image,
    `question`, `response`, code inside the one `<think>`, each block's output in `<sandbox_output>`). `blocks`: per
    code block (thought, code). `plant_code`: per block, the code whose images the release ships instead."""
    original = scene()
    context, planted = {}, {}
    images, response = [original], "<think>"
    for k, (thought, code) in enumerate(blocks):
        response += f"{thought}\n<code>\n```python\n{code}\n```\n</code>"
        try:
            written = thyme_run(code, original, context)
            if plant_code is not None:
                written = thyme_run(plant_code[k], original, planted)
        except Exception as err:  # the sandbox returns the error as text, no image
            response += f"<sandbox_output>Error: {err!r}</sandbox_output>"
            continue
        images += written
        response += "<sandbox_output>" + "<image>" * len(written) + "</sandbox_output>"
    response += f"\nThe crop shows it is red.</think><answer>{answer}</answer>"
    cells = [base64.b64encode(png(image)).decode() for image in images]
    return {"image": cells, "question": thyme_question(question), "response": response}


def write_thyme(root: Path, records: list[dict], form: str = "parquet", split: str = "2round") -> Path:
    """The release as HF `Kwai-Keye/Thyme-SFT` serves it to `load_dataset` (Thyme's README, "Download Dataset": splits
    `wo_thinking_thyme_single_round`, `2round`, `computation`): parquet shards `data/<split>-*.parquet`; or the JSONL
    the README's script converts them to."""
    (root / "data").mkdir(parents=True)
    if form == "parquet":
        pq.write_table(pa.Table.from_pylist(records), root / "data" / f"{split}-00000-of-00001.parquet")
    else:
        lines = "\n".join(json.dumps(record) for record in records) + "\n"
        (root / "data" / f"{split}.jsonl").write_text(lines, encoding="utf-8")
    return root


# ====================================================================================================== re-saved
def resave_with_datasets(release_file: Path, records: list[dict]) -> None:
    """`release_file` as a copy that passed through `datasets` holds it (the Hub's parquet conversion,
    `load_dataset(...).to_json`, `save_to_disk`): `Dataset.from_list` unifies the keys of every record, message and
    content part into one schema, so a key one of them lacks is there, null; then `to_parquet`, or `to_json` (JSON
    Lines, its default, even under a `.json` name), writes it in place."""
    import datasets

    dataset = datasets.Dataset.from_list(records)
    if release_file.suffix == ".parquet":
        dataset.to_parquet(str(release_file))
    else:
        dataset.to_json(str(release_file))


def as_null_keyed_parts(content):
    """A message's string content as Qwen's typed parts, every part with every key (`text`, `image`, `video`), as
    `datasets` writes them."""
    return [{"type": "text", "text": content, "image": None, "video": None}] if isinstance(content, str) else content
