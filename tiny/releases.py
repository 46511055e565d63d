"""Release-shaped data for the tiny set of `make reproduce` (recipes/reproduce.yaml, `own_data`): each release the plan
reads, a few rows in its published layout (the layouts docs/data.md and docs/evaluation.md describe and the readers of
data.converters, data.rl_sets and data.benchmarks take), so that `make reproduce RECIPE_SET=tiny` walks the whole road
offline with nothing downloaded. Small images of coloured patches: the pipeline's shape, not a benchmark of anything.

    Mini-o3-Coldstart-Dataset/data/train-00000-of-00001.parquet   sharegpt conversations with one <grounding> zoom
    DeepEyes-Datasets-47k/<the RL files>                          verl rows: images, prompt, reward_model, extra_info
    vstar_bench/test_questions.jsonl, <category>/<image>.jpg      V*'s question lines
    HR-Bench/hr_bench_4k.tsv, hr_bench_8k.tsv                     VLMEvalKit's TSV, base64 images
    MME-RealWorld-lite-lmms-eval/data/train-00000-of-00001.parquet lmms-eval's Lite parquet, image bytes
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

ROWS = 4  # rows of each benchmark and RL file: every evaluation of the tiny road runs on 2 CPU processes, ~10 s a row
COLDSTART_ROWS = 16  # cold-start rows: what SFT trains on
COLOURS = {"red": (200, 30, 30), "blue": (30, 60, 200), "green": (30, 160, 60), "yellow": (220, 200, 40)}
VSTAR_SUFFIX = "Answer with the option's letter from the given choices directly."  # V*'s own instruction line
BOX = (0.10, 0.20, 0.35, 0.45)  # the cold start's zoom, relative to the original (Mini-o3's bbox_2d)


def scene(size: tuple[int, int], colour: str, seed: int) -> Image.Image:
    """A grey noise image of `size` with a square of `colour` inside `BOX`: what the questions ask about."""
    rng = np.random.default_rng(seed)
    pixels = rng.integers(90, 170, size=(size[1], size[0], 3), dtype=np.uint8)
    x1, y1, x2, y2 = (int(v * s) for v, s in zip(BOX, (*size, *size)))
    pixels[y1 + (y2 - y1) // 4 : y2 - (y2 - y1) // 4, x1 + (x2 - x1) // 4 : x2 - (x2 - x1) // 4] = COLOURS[colour]
    return Image.fromarray(pixels)


def jpeg(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=95)
    return buffer.getvalue()


def colour_of(row: int) -> str:
    return list(COLOURS)[row % len(COLOURS)]


def write_coldstart(folder: Path, rows: int = COLDSTART_ROWS) -> None:
    """Mini-o3's cold start: one zoom on `BOX` of the original, whose observation is the box's crop upscaled to at
    least 512 x 512 pixels (aspect kept, NEAREST), as Mini-o3's rollout shows it; then the answer, the square's
    colour."""
    records = []
    for index in range(rows):
        original = scene((400, 300), colour_of(index), index)
        crop = original.crop(tuple(int(v * s) for v, s in zip(BOX, (*original.size, *original.size))))
        grow = max(1.0, (512 * 512 / (crop.width * crop.height)) ** 0.5)  # Mini-o3's process_image floor
        observation = crop.resize((int(crop.width * grow), int(crop.height * grow)), Image.Resampling.NEAREST)
        call = {"bbox_2d": list(BOX), "source": "original_image"}
        turns = [
            {"from": "system", "value": "..."},
            {"from": "human", "value": "<image>\nWhat colour is the square?"},
            {"from": "gpt", "value": f"<think>I zoom in on the square.</think><grounding>{json.dumps(call)}</grounding>"},
            {"from": "human", "value": "After the above Action 0, here is the the zoom-in image (Observation 1):\n"
             "<image>.\nContinue your reasoning."},
            {"from": "gpt", "value": f"<think>It is {colour_of(index)}.</think><answer>{colour_of(index)}</answer>"},
        ]  # fmt: skip
        images = [{"bytes": jpeg(image), "path": None} for image in (original, observation)]
        records.append({"conversations": json.dumps(turns), "images": images, "sample_index": index})
    (folder / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), folder / "data" / "train-00000-of-00001.parquet")


def write_rl_file(path: Path, source: str, rows: int = ROWS) -> None:
    """A DeepEyes-47k file: verl rows whose question asks the square's colour, the colour the ground truth."""
    records = []
    for index in range(rows):
        question = "What is the colour of the square?"
        records.append({
            "data_source": source, "images": [{"bytes": jpeg(scene((240, 180), colour_of(index), 100 + index)), "path": None}],
            "prompt": [{"role": "user", "content": f"<image>\n{question}"}], "ability": "vl",
            "env_name": "visual_toolbox_v2", "reward_model": {"ground_truth": colour_of(index), "style": "model"},
            "extra_info": {"question": f"<image>\n{question}"},
        })  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), path)


def choice(index: int) -> tuple[list[str], str]:
    """Two options, the square's colour and another, and the letter of the right one (A or B in turn)."""
    right, wrong = colour_of(index), colour_of(index + 1)
    return ([right, wrong], "A") if index % 2 == 0 else ([wrong, right], "B")


def write_vstar(folder: Path, rows: int = ROWS) -> None:
    """V* Bench: test_questions.jsonl, one question a line naming its image, its options in the text."""
    lines = []
    for qid in range(rows):
        category = ("direct_attributes", "relative_position")[qid % 2]
        image = f"{category}/sa_{qid}.jpg"
        (folder / category).mkdir(parents=True, exist_ok=True)
        (folder / image).write_bytes(jpeg(scene((320, 240), colour_of(qid), 200 + qid)))
        options, label = choice(qid)
        text = "\n".join(["What is the colour of the square?", *(f"({chr(65 + i)}) {o}" for i, o in enumerate(options)),
                          VSTAR_SUFFIX])  # fmt: skip
        lines.append(
            json.dumps({"image": image, "text": text, "category": category, "question_id": qid, "label": label})
        )
    (folder / "test_questions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_hrbench(path: Path, rows: int = ROWS) -> None:
    """An HR-Bench TSV as VLMEvalKit dumps it: index, question, answer letter, A-D, category, base64 image."""
    records = []
    for index in range(rows):
        options, label = choice(index)
        image = base64.b64encode(jpeg(scene((320, 240), colour_of(index), 300 + index))).decode("ascii")
        records.append({"index": index, "question": "What is the colour of the square?", "answer": label,
                        "A": options[0], "B": options[1], "C": "white", "D": "black",
                        "category": ("single", "cross")[index % 2], "cycle_category": "cycle_0", "image": image})  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(records).to_csv(path, sep="\t", index=False)


def write_mme_lite(folder: Path, rows: int = ROWS) -> None:
    """MME-RealWorld-Lite as lmms-eval publishes it: data/*.parquet, options "(A) ...", the image's bytes."""
    records = []
    for index in range(rows):
        options, label = choice(index)
        records.append({"index": index, "question": "What is the colour of the square?",
                        "multi-choice options": [f"({chr(65 + i)}) {o}" for i, o in enumerate(options)],
                        "answer": label, "category": "Perception/Attribute/Color", "l2-category": "Color",
                        "bytes": base64.b64encode(jpeg(scene((320, 240), colour_of(index), 400 + index))).decode("ascii")})  # fmt: skip
    (folder / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), folder / "data" / "train-00000-of-00001.parquet")


# the writer of each release by its key in recipes/reproduce.yaml's `data`
WRITERS: dict[str, Callable[[Path], None]] = {
    "coldstart": write_coldstart,
    "vstar": write_vstar,
    "hrbench_4k": write_hrbench,
    "hrbench_8k": write_hrbench,
    "mme_realworld_lite": write_mme_lite,
}


def write_releases(root: Path, spec: dict) -> list[Path]:
    """Each release `spec` (recipes/reproduce.yaml) reads, under `root` at the path it names, when that path is not
    there yet; the paths written. The RL files take the published `data_source` of their file (vstar, ThinkLite)."""
    written = []
    for key, entry in spec["data"].items():
        path = root / entry["path"]
        if not path.exists():
            WRITERS[key](path)
            written.append(path)
    block = spec["rl_data"]
    for entry in block["files"]:
        path = root / block["folder"] / entry["file"]
        if not path.exists():
            source = "thinklite_eureka" if "thinklite" in entry["file"] else "vstar"
            write_rl_file(path, source)
            written.append(path)
    return written
