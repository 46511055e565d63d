"""What the conversion tests share (tests/test_convert.py, tests/test_convert_releases.py,
tests/test_convert_code.py, tests/test_convert_hostile.py): `python -m data.convert` run on a release and its stats
checked against stats.json, the boxes of what it converted and the real tool's replay of them, Thyme's code as its
README shows it, and two good rows of every format as its release ships them."""

import json
from pathlib import Path

import datasets

from data import convert
from data.trajectories import replay_calls
from tests.release_fixtures import (
    TARGET,
    as_null_keyed_parts,
    cof_record,
    deepeyes_v2_record,
    mini_o3_row,
    pixel_reasoner_record,
    thyme_record,
    write_cof,
    write_deepeyes_v2,
    write_mini_o3,
    write_pixel_reasoner,
    write_thyme,
)
from tools import ToolConfig, box_contains, make_environment_factory
from utils.recipes import real_recipe_budget

FIRST = {"bbox_2d": [0.5, 0.2, 0.8, 0.6], "source": "original_image"}  # (200, 60, 320, 180)
SECOND = {"bbox_2d": [0.25, 0.2, 0.9, 0.8], "source": "observation_1"}  # inside FIRST's 120 x 120: (230, 84, 308, 156)
SQUARE = [240, 90, 300, 150]  # the 60 px box around the target most rows zoom on


def converted(tmp_path: Path, fmt: str, source: Path, preview: int = 0) -> tuple[datasets.Dataset, dict]:
    out = tmp_path / f"{fmt}-out"
    stats = convert.main(["--format", fmt, "--input", str(source), "--output", str(out), "--preview", str(preview)])
    assert json.loads((out / "stats.json").read_text()) == {k: v for k, v in stats.items() if k != "preview"}
    return datasets.load_from_disk(str(out))["train"], stats


def conversion(tmp_path: Path, fmt: str, source: Path) -> tuple[datasets.Dataset | None, dict]:
    """`converted`, also when no row converts (the CLI then exits): (the dataset or None, the stats)."""
    trajectories, stats = convert.convert(fmt, source, ToolConfig())
    if not trajectories:
        return None, stats
    return converted(tmp_path, fmt, source)


def boxes(dataset: datasets.Dataset) -> list[list[list[int]]]:
    return [[call["box"] for call in row["gold_calls"]] for row in dataset]


def replayed_boxes(dataset: datasets.Dataset) -> list[list[tuple]]:
    """Per row, the original-pixel boxes the real tool cropped when SFT replayed its calls."""
    env = make_environment_factory(ToolConfig(), real_recipe_budget(None)[1])()
    out = []
    for row in dataset:
        replay_calls(row, env)
        out.append([call.box for call in env.calls])
    return out


def assert_every_crop_shows_the_target(dataset):
    for row, replayed in zip(dataset, replayed_boxes(dataset)):
        assert replayed, row["id"]
        for call, box in zip(row["gold_calls"], replayed):
            assert box_contains(call["box"], TARGET), (row["id"], call["box"])
            assert box_contains(box, TARGET), (row["id"], box)  # the tool's crop, mapped back from the seen frame


# Thyme's code as its README (section 6) and paper (figures 8-16) show it: the path written as a literal the sandbox
# rewrites, the image saved under /mnt/data/temp_processed_images/ with a random suffix, and its path printed (how
# the sandbox finds it). A literal `x1, y1, x2, y2` or `crop_box` is widened by the sandbox to 64 px a side.
THYME_CV2_SAVE = """random_suffix = str(uuid4())[:8]
processed_filename = f"0001_{random_suffix}.jpg"
processed_path = os.path.join("/mnt/data/temp_processed_images/", processed_filename)
cv2.imwrite(processed_path, resized_image)
print(processed_path)"""
THYME_PIL_SAVE = """random_suffix = random.randint(1000, 9999)
processed_filename = f"0001_{random_suffix}.jpg"
processed_path = "/mnt/data/temp_processed_images/" + processed_filename
zoomed_image.save(processed_path)
print(processed_path)"""
THYME_CV2_OPEN = 'import cv2\nimport os\nimport numpy as np\nfrom uuid import uuid4\nimage_path = "/data/0001.jpg"\n'
THYME_CV2_OPEN += "image = cv2.imread(image_path)\n"
THYME_PIL_OPEN = (
    'import os\nimport random\nfrom PIL import Image\nimage_path = "/data/0001.jpg"\nimage = Image.open(image_path)\n'
)
THYME_CV2_ZOOM = "resized_image = cv2.resize(cropped_image, None, fx=2, fy=2, interpolation=cv2.INTER_CUBIC)\n"
THYME_PIL_ZOOM = "zoomed_image = cropped_image.resize((cropped_image.width * 2, cropped_image.height * 2))\n"


def thyme_cv2(crop: str) -> str:
    return THYME_CV2_OPEN + crop + "\n" + THYME_CV2_ZOOM + THYME_CV2_SAVE


def thyme_pil(crop: str) -> str:
    return THYME_PIL_OPEN + crop + "\n" + THYME_PIL_ZOOM + THYME_PIL_SAVE


def release(tmp_path: Path, fmt: str, parts: bool = False) -> tuple[Path, Path, list[dict]]:
    """Two good rows of `fmt` as the release ships them (the folder, the record file, its records); the first record
    has a key the second lacks, as releases do. `parts`: message contents as null-keyed typed parts."""
    root = tmp_path / fmt
    if fmt == "mini_o3_coldstart":
        rows = [mini_o3_row([FIRST, SECOND], index=0), mini_o3_row([FIRST], index=1)]
        rows[1]["rollout_index"] = None  # read as a missing index: 0
        if parts:
            for row in rows:
                turns = json.loads(row["conversations"])
                row["conversations"] = json.dumps([{**t, "value": as_null_keyed_parts(t["value"])} for t in turns])
        return write_mini_o3(root, rows), root / "data" / "train-00000-of-00001.parquet", rows
    if fmt == "pixel_reasoner_sft":
        records = [pixel_reasoner_record([([0.6, 0.3, 0.75, 0.5], 1)], qid=f"q{k}") for k in range(2)]
        del records[1][0]["qid"]  # read as a missing id: the file and row
        return write_pixel_reasoner(root, records), root / "release.json", [r for r, _ in records]
    if fmt == "thyme_sft":
        records = [thyme_record([("Crop.", thyme_cv2("cropped_image = image[60:180, 200:320]"))]) for _ in range(2)]
        records[0]["id"] = "unread"
        return write_thyme(root, records), root / "data" / "2round-00000-of-00001.parquet", records
    if fmt == "cof_sft":
        records = [cof_record([(SQUARE, "the red square")], image_name=f"{k}.png") for k in range(2)]
        records[0][0]["id"] = "first"
        write, file = write_cof, "cof_sft_data.json"
    else:
        records = [deepeyes_v2_record(["display(image_1.crop((240, 90, 300, 150)))"], image_name=f"{k}.png")
                   for k in range(2)]  # fmt: skip
        records[0][0]["id"] = "first"
        write, file = write_deepeyes_v2, "json/sft_part_0.json"
    if parts:
        for record, _ in records:
            record["messages"] = [{**m, "content": as_null_keyed_parts(m["content"])} for m in record["messages"]]
    return write(root, records), root / file, [r for r, _ in records]
