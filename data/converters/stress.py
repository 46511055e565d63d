"""What converting costs, measured by `make bench` (sections 5 and 6 of `scripts/bench.py`; docs/benchmarks.md):
`python -m data.convert`'s peak memory and seconds on Mini-o3-shaped releases at a real release's image sizes
(`bench_convert`), and the seconds each reader of the converters takes on issue 59's hostile rows
(`bench_hostile_rows`)."""

from __future__ import annotations

import io
import json
import math
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from data.converters.code_reader import CodeReader
from data.converters.common import SkipRow, thought_of, tool_calls
from data.converters.deepeyes_v2 import python_fences
from data.converters.labels import derive_label
from data.converters.thyme import thyme_code_blocks
from data.questions import dataset_question, split_options
from data.task import extract_answer, tag_contents


def write_coldstart_release(root: Path, rows: int, size: tuple[int, int] = (2000, 1500), seed: int = 0) -> Path:
    """A Mini-o3 cold-start release (`data/*.parquet`, data/converters/mini_o3.py reads it) of `rows` rows, each a
    distinct JPEG original of `size` and one zoom whose observation is the relative box's crop, upscaled to 512 x 512
    pixels (aspect kept, NEAREST) as Mini-o3's rollout shows it: what `data.convert` reads, at a real release's image sizes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, size=(size[1] // 25, size[0] // 25, 3), dtype=np.uint8)
    box = (0.10, 0.20, 0.35, 0.45)
    records = []
    for index in range(rows):
        pixels = np.array(Image.fromarray(base).resize(size, Image.Resampling.BICUBIC))
        y, x = rng.integers(0, size[1] - 64), rng.integers(0, size[0] - 64)
        pixels[y : y + 64, x : x + 64] = rng.integers(0, 256, 3, dtype=np.uint8)  # every original distinct
        original = Image.fromarray(pixels)
        pixel_box = [int(box[0] * size[0]), int(box[1] * size[1]), int(box[2] * size[0]), int(box[3] * size[1])]
        crop = original.crop(pixel_box)
        grow = max(1.0, (512 * 512 / (crop.width * crop.height)) ** 0.5)  # Mini-o3's process_image floor
        observation = crop.resize((int(crop.width * grow), int(crop.height * grow)), Image.Resampling.NEAREST)
        images = []
        for image in (original, observation):
            buffer = io.BytesIO()
            image.save(buffer, format="JPEG", quality=95)
            images.append({"bytes": buffer.getvalue(), "path": None})
        call = {"bbox_2d": list(box), "source": "original_image"}
        turns = [
            {"from": "system", "value": "..."},
            {"from": "human", "value": "<image>\nWhat colour is the patch?"},
            {"from": "gpt", "value": f"<think>I zoom in on the patch.</think><grounding>{json.dumps(call)}</grounding>"},
            {"from": "human", "value": "After the above Action 0, here is the the zoom-in image (Observation 1):\n"
             "<image>.\nContinue your reasoning."},
            {"from": "gpt", "value": "<think>It is grey.</think><answer>grey</answer>"},
        ]  # fmt: skip
        records.append({"conversations": json.dumps(turns), "images": images, "sample_index": index})
    (root / "data").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(records), root / "data" / "train-00000-of-00001.parquet", row_group_size=64)
    return root


def peak_memory(command: list[str]) -> tuple[dict[str, float], float, str]:
    """Run `command`, sampling its /proc status every 50 ms: peak `RssAnon` (heap: what grows with rows) and `VmRSS`
    (with mapped files: the written dataset's pages, which the kernel can drop), in MB; its seconds; its stdout."""
    start = time.perf_counter()
    # files, not pipes: nothing the process writes blocks it while the loop samples
    output, errors = tempfile.TemporaryFile(mode="w+"), tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(command, stdout=output, stderr=errors, text=True)
    peak = {"RssAnon": 0.0, "VmRSS": 0.0}
    while process.poll() is None:
        try:
            status = Path(f"/proc/{process.pid}/status").read_text()
        except OSError:
            break
        for key in peak:
            found = re.search(rf"^{key}:\s+(\d+) kB", status, re.M)
            if found:
                peak[key] = max(peak[key], int(found.group(1)) / 1024)
        time.sleep(0.05)
    process.wait()
    output.seek(0)
    out = output.read()
    if process.returncode:
        errors.seek(0)
        raise RuntimeError(f"{' '.join(command)} failed (exit {process.returncode}): {errors.read()[-2000:]}")
    return peak, time.perf_counter() - start, out


def bench_convert(rows: list[int]) -> dict:
    """Peak memory and seconds of `python -m data.convert` on releases of each size (`write_coldstart_release`)."""
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for n in rows:
            release = write_coldstart_release(Path(tmp) / f"release-{n}", n)
            output = Path(tmp) / f"converted-{n}"
            command = [sys.executable, "-m", "data.convert", "--format", "mini_o3_coldstart", "--input", str(release),
                       "--output", str(output)]  # fmt: skip
            peak, seconds, _ = peak_memory(command)
            stats = json.loads((output / "stats.json").read_text())
            results[str(n)] = {"rows_converted": stats["rows_converted"], "peak_rss_anon_mb": round(peak["RssAnon"]),
                               "peak_vm_rss_mb": round(peak["VmRSS"]), "seconds": round(seconds, 1)}  # fmt: skip
    sizes = sorted(rows)
    if len(sizes) > 1:  # between the two largest: the slope once the first batches' buffers are in place
        small, large = results[str(sizes[-2])], results[str(sizes[-1])]
        grown = (large["peak_rss_anon_mb"] - small["peak_rss_anon_mb"]) / (sizes[-1] - sizes[-2])
        results["rss_anon_mb_per_row"] = round(grown, 3)
    return results


# Issue 59, item 4's readers of tags and option lines, each quadratic in the tags left open or the spaces in a line
# before it (its regexes: docs/benchmarks.md), by the name a `hostile_rows` row reads with.
TAG_READERS = {
    "thought": thought_of,
    "tool calls": tool_calls,
    "answer": extract_answer,
    "DeepEyesV2 code": lambda text: tag_contents(text, "<code>", "</code>"),
    "grounding": lambda text: tag_contents(text, "<grounding>", "</grounding>"),
    "python fences": python_fences,
    "options": lambda text: split_options(text)[1],
    "question": lambda text: dataset_question(text)[1],
    "question label": lambda text: (derive_label("", text) or ("",))[0],
}


def hostile_rows(scale: float = 1.0) -> dict[str, tuple[str, str]]:
    """Issue 59, item 4's rows, each (what reads it: "blocks", Thyme's code-block scan, "reader", DeepEyesV2's code
    reader, one turn, or a `TAG_READERS` name; its text), every size times `scale` (a power of two where a size
    doubles)."""
    doublings = round(math.log2(scale))
    tags = max(1, int(40_000 * scale))
    return {
        "<code> and 2,000 spaces": ("blocks", "<code>" + " " * int(2_000 * scale)),
        "40,000 <code>, none closed": ("blocks", "<code>" * tags),
        "40,000 blocks, outputs left open": ("blocks", "<code>x</code><sandbox_output><image>" * tags),
        "a million lines": ("reader", "a = 1\n" * int(1_000_000 * scale)),
        # `b`: 8,192 references to one list of 8,192: the sum is a list of 2**26 items
        "sum(b, []) of 8,192 lists of 8,192": ("reader", "a = [0]\n" + "a = a + a\n" * 13 + "b = [a]\n"
                                               + "b = b + b\n" * (13 + doublings) + "c = sum(b, [])"),
        "a skip naming a list nested 30 deep": ("reader", "a = [0]\n" + "a = [a, a]\n" * (30 + doublings)
                                                + "x, y, z = a"),
        "40,000 <think>, none closed": ("thought", "<think>" * tags),
        "40,000 <tool_call>, none closed": ("tool calls", "<tool_call>" * tags),
        "40,000 <answer>, none closed": ("answer", "<answer>" * tags),
        "40,000 DeepEyesV2 <code>, none closed": ("DeepEyesV2 code", "<code>" * tags),
        "40,000 <grounding>, none closed": ("grounding", "<grounding>" * tags),
        "40,000 ```python fences, none closed": ("python fences", "```python\nx" * tags),
        "an option line with 40,000 spaces": ("options", "Q?\n(A) x" + " " * tags + "y\n(B) z"),
        "an Options line with 40,000 spaces": ("question", "Q?\nOptions" + " " * tags + "x\nA. a\nB. b"),
        "a question of 40,000 words `the`": ("question label", "the " * tags),
    }  # fmt: skip


def bench_hostile_rows(scale: float = 1.0, code_blocks=None, reader=None, tag_readers=None) -> dict:
    """Per `hostile_rows` row: seconds to read it and what it came to (Thyme's blocks found; the reader's skip reason
    and its message's length; or the length of what a tag reader returned: blocks, options, an answer's or a thought's
    characters). `code_blocks`, `reader` (a `CodeReader` class) and `tag_readers` (`TAG_READERS`' names, some or all)
    default to the converters' own: docs/benchmarks.md passes the code before issue 59 at a smaller `scale` for its
    "before" figures."""
    code_blocks = code_blocks or thyme_code_blocks
    reader = reader or CodeReader
    tag_readers = {**TAG_READERS, **(tag_readers or {})}
    results = {}
    for name, (kind, text) in hostile_rows(scale).items():
        start = time.perf_counter()
        if kind in tag_readers:
            outcome = {"found": len(tag_readers[kind](text) or "")}
        elif kind == "blocks":
            found = code_blocks(text)
            outcome = {"blocks": len(found[0] if isinstance(found, tuple) else found)}
        else:
            try:
                reader((400, 300), {}, "display", original_as="image_1").run(text)
                outcome = {"read": True}
            except SkipRow as skip:
                outcome = {"skip": skip.reason, "message_chars": len(str(skip))}
        results[name] = {"seconds": round(time.perf_counter() - start, 4), **outcome}
    return results
