"""Issue 59, items 2 and 3: `python -m data.convert` on a hostile release (`hostile_release`: CoF's layout, good rows
beside every bad case). Nothing is read outside `--input` (an absolute path, a `file://` URL, `../`, a symlink out: a
counted `outside_input` skip naming the path, the outside file's bytes nowhere in the output); a zip member over the
image cap is never opened; and no row loses the conversion (a 400-digit box number, nesting 100,000 deep in a call, a
field or a line, `messages` a string, a record that is a list, `images: 5`, a latin-1 or UTF-16 file, a truncated
parquet shard): each is a skip counted under its reason whose message names its file and row, in bounded words, and
every good row converts."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL.PngImagePlugin import PngInfo

from data import convert
from data.converters import FORMATS
from data.converters.common import MAX_IMAGE_FILE_BYTES, MAX_SKIP_DETAIL, ImageStore, LayoutError, SkipRow
from tests.conversions import release
from tests.release_fixtures import cof_record, png, scene, think, write_cof
from tools import ToolConfig

SQUARE = [240, 90, 300, 150]
MARKER = b"OUTSIDE-INPUT-SECRET"  # in the outside file's PNG text chunk: never in the output
MAIN = "cof_sft_data.json"
DEEP = 100_000


def good(name: str, question: str = "What colour is the small square?") -> tuple[dict, dict]:
    return cof_record([(SQUARE, "the red square")], image_name=f"{name}.png", question=question)


def with_call(record: dict, payload: str) -> dict:
    record["messages"][2]["content"] = think("Zoom.") + f"\n<tool_call>{payload}</tool_call>"
    return record


def outside_image(tmp_path: Path) -> Path:
    """The original image, as the rows' crops were cut from it, in a PNG marked `MARKER`, outside the release: were it
    read, the row would convert with its bytes."""
    path = tmp_path / "outside" / "secret.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    info = PngInfo()
    info.add_text("origin", MARKER.decode())
    scene().save(path, pnginfo=info)
    return path


# The bad rows of the main file, after its two good ones in this order: (the reason each is skipped under, what its
# message must say; for a path leading outside, the path as written).
MAIN_CASES = {
    "absolute": ("outside_input", "outside/secret.png"),
    "file_url": ("outside_input", "file://"),
    "dotdot": ("outside_input", "../outside/secret.png"),
    "symlink": ("outside_input", "link.png"),
    "zip_bomb": ("missing_image", f"over the {MAX_IMAGE_FILE_BYTES}-byte cap"),
    "huge_int": ("malformed_call", "too large"),
    "deep_call": ("malformed_call", "nested too deep"),
    "deep_field": ("malformed_row", "nested too deep"),
    "messages_string": ("malformed_row", "messages is of type str"),
    "record_list": ("malformed_row", "of type list, not a record"),
    "images_int": ("malformed_row", "images is of type int"),
}
FILE_CASES = {  # (file, row, reason, what the message says)
    "latin1": ("cof_sft_data_latin1.json", 1, "malformed_row", "not UTF-8"),
    "deep_line": ("cof_sft_data_lines.jsonl", 1, "malformed_row", "nested too deep"),
    "huge_line": ("cof_sft_data_lines.jsonl", 1, "malformed_row", "4300 digits"),
    "truncated_parquet": ("cof_sft_data_shard.parquet", 0, "unreadable_file", "cannot be read"),
}
# A JSON file in UTF-16 (RFC 7159 allows it, and Python's json reads it) is no bad case: its row, written with an
# "é", converts.
UTF16 = "utf16"
# the good rows: the main file's two, the JSON Lines file's two, one ASCII row in the latin-1 file, the UTF-16 row
GOOD = {MAIN: 2, "cof_sft_data_lines.jsonl": 2, "latin1": 1, UTF16: 1}


def hostile_release(tmp_path: Path, cases) -> Path:
    """CoF's release (`write_cof`: `cof_sft_data*.json`, `.jsonl`, `.parquet` and `images/`) with its good rows and
    the `cases` (names of `MAIN_CASES`, `FILE_CASES` and `UTF16`); the outside file is `tmp_path/outside/secret.png`."""
    secret = outside_image(tmp_path)
    root = tmp_path / "release"
    records = [good("good0"), good("good1")]
    main_cases = [case for case in MAIN_CASES if case in cases]
    bad = {case: good(case) for case in main_cases}
    for case, (record, _) in bad.items():
        if case == "absolute":
            record["images"][0] = str(secret)
        elif case == "file_url":
            record["images"][0] = f"file://{secret}"
        elif case == "dotdot":
            record["images"][0] = "../outside/secret.png"
        elif case in ("symlink", "zip_bomb"):
            record["images"][0] = f"{'link' if case == 'symlink' else 'bomb'}.png"
        elif case == "huge_int":
            with_call(record, json.dumps({"name": "image_zoom_in_tool", "arguments": {
                "bbox_2d": [10**400, 90, 300, 150], "label": "the red square"}}))  # fmt: skip
        elif case == "deep_call":
            with_call(record, "[" * DEEP)
        elif case == "messages_string":
            record["messages"] = "What colour is the small square?"
        elif case == "images_int":
            record["images"] = 5
    write_cof(root, records + list(bad.values()))
    texts = [json.dumps(record) for record, _ in records]
    for case, (record, _) in bad.items():
        if case == "record_list":
            texts.append(json.dumps([record["messages"], record["images"]]))
        elif case == "deep_field":  # valid JSON no parser of the whole file can read: it is read row by row
            texts.append(json.dumps(record)[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}")
        else:
            texts.append(json.dumps(record))
    (root / MAIN).write_text("[" + ",\n".join(texts) + "]", encoding="utf-8")
    if "symlink" in cases:
        (root / "images" / "link.png").symlink_to(secret)
    if "zip_bomb" in cases:  # a zip of a few hundred KB whose member is just over the cap
        with zipfile.ZipFile(root / "images.zip", "w", zipfile.ZIP_DEFLATED) as archive:
            with archive.open("images/bomb.png", "w") as member:
                zeros = bytes(2**20)
                for _ in range(MAX_IMAGE_FILE_BYTES // len(zeros)):
                    member.write(zeros)
                member.write(b"\0")
    extra = {}
    if "latin1" in cases:
        extra["latin1"] = [good("latin0"), good("latin1", "What colour is the café's small square?")]
    if UTF16 in cases:
        extra[UTF16] = [good("utf16", "What colour is the café's small square?")]
    extra["lines"] = [good("line0"), good("line3")]
    extra["shard"] = [good("shard0")] if "truncated_parquet" in cases else []
    for named in extra.values():  # their images, beside the others'
        for _, files in named:
            for name, image in files.items():
                image.save(root / "images" / name)
    if "latin1" in cases:
        text = json.dumps([record for record, _ in extra["latin1"]], ensure_ascii=False)
        (root / "cof_sft_data_latin1.json").write_bytes(text.encode("latin-1"))
    if UTF16 in cases:
        text = json.dumps([record for record, _ in extra[UTF16]], ensure_ascii=False)
        (root / "cof_sft_data_utf16.json").write_bytes(text.encode("utf-16"))
    lines = [json.dumps(extra["lines"][0][0])]
    lines += ["[" * DEEP] if "deep_line" in cases else []
    lines += ['{"messages": [], "images": [1' + "0" * 5000 + "]}"] if "huge_line" in cases else []
    lines += [json.dumps(extra["lines"][1][0])]
    (root / "cof_sft_data_lines.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if extra["shard"]:
        shard = root / "cof_sft_data_shard.parquet"
        pq.write_table(pa.Table.from_pylist([record for record, _ in extra["shard"]]), shard)
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a download cut short: no footer
    return root


def expected_skips(cases) -> dict[str, tuple[str, str, str]]:
    """Per case: (where its skip is, its reason, what its message says)."""
    out, row = {}, 2
    for case, (reason, says) in MAIN_CASES.items():
        if case in cases:
            out[case] = (f"{MAIN} row {row}", reason, says)
            row += 1
    for case, (file, row, reason, says) in FILE_CASES.items():
        if case in cases:
            row += case == "huge_line" and "deep_line" in cases  # the line after it
            out[case] = (f"{file} row {row}", reason, says)
    return out


def check(tmp_path: Path, cases, preview: int = 0) -> None:
    root = hostile_release(tmp_path, cases)
    opened = []
    original_open = zipfile.ZipFile.open

    def spy(self, name, *args, **kwargs):
        opened.append(getattr(name, "filename", name))
        return original_open(self, name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zipfile.ZipFile, "open", spy)
        items = list(FORMATS["cof_sft"](root, ToolConfig()))
        out = tmp_path / "out"
        argv = ["--format", "cof_sft", "--input", str(root), "--output", str(out), "--preview", str(preview)]
        stats = convert.main(argv)
    landed = [file for file in out.rglob("*") if file.is_file() and MARKER in file.read_bytes()]
    assert not landed, f"the outside file's bytes landed in {landed}"  # the dataset, stats.json, the preview
    assert "images/bomb.png" not in opened  # never read, not even in part
    skips = {f"{skip.where}": skip for skip in items if isinstance(skip, SkipRow)}
    expected = expected_skips(cases)
    for case, (where, reason, says) in expected.items():
        assert where in skips, (case, where, sorted(skips))
        skip = skips[where]
        assert (skip.reason, says in skip.detail) == (reason, True), (case, skip.reason, skip.detail)
        assert len(skip.detail) <= MAX_SKIP_DETAIL + 40, (case, len(skip.detail))
    assert len(skips) == len(expected), sorted(skips)
    kept = [item for item in items if not isinstance(item, SkipRow)]
    good_rows = sum(count for name, count in GOOD.items() if name in cases or name.startswith("cof_sft_data"))
    assert len(kept) == good_rows == stats["rows_converted"]
    counted = {}
    for _, reason, _ in expected.values():
        counted[reason] = counted.get(reason, 0) + 1
    assert stats["rows_skipped"] == counted
    assert stats["rows_read"] == good_rows + len(expected) - ("truncated_parquet" in cases)
    for examples in stats["skipped_examples"].values():
        assert all(" row " in example and len(example) < MAX_SKIP_DETAIL + 100 for example in examples), examples
    dataset = datasets.load_from_disk(str(out))["train"]
    assert dataset["id"][:2] == ["cof_sft_data-0", "cof_sft_data-1"] and len(dataset) == good_rows
    assert all(row["gold_calls"][0]["box"] == SQUARE for row in dataset)
    if UTF16 in cases:
        assert [p for p in dataset["prompt"] if "café" in p[-1]["content"]], "the UTF-16 row, decoded"
    assert MARKER in (tmp_path / "outside" / "secret.png").read_bytes()


@pytest.mark.parametrize("case", [*MAIN_CASES, *FILE_CASES, UTF16])
def test_each_hostile_row_alone_is_a_counted_skip_naming_its_file_and_row(tmp_path, case):
    check(tmp_path, {case})


def test_a_hostile_release_converts_its_good_rows_and_counts_every_bad_one(tmp_path):
    check(tmp_path, {*MAIN_CASES, *FILE_CASES, UTF16}, preview=1)


def test_image_cells_are_confined_to_the_input_folder(tmp_path):
    """A path inside the folder (relative, `./`, absolute, or through a symlink that stays in) is read; one that leaves
    it, however written, is `outside_input` whether or not the outside file exists."""
    root = tmp_path / "release"
    (root / "images").mkdir(parents=True)
    (root / "images" / "a.png").write_bytes(png(scene()))
    (root / "inside.png").symlink_to(root / "images" / "a.png")
    (tmp_path / "elsewhere").mkdir()
    (root / "out").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    store = ImageStore(root)
    for value in ("a.png", "./images/a.png", "images/a.png", str(root / "images" / "a.png"), "inside.png",
                  f"file://{root / 'images' / 'a.png'}"):  # fmt: skip
        assert store.encoded(value, "image") == png(scene()), value
    for value in ("/etc/hostname", "file:///etc/hostname", "../x.png", "images/../../x.png", "out/x.png"):
        with pytest.raises(SkipRow, match="outside_input") as raised:
            store.encoded(value, "image")
        assert value in raised.value.detail
    (root / "loop.png").symlink_to(root / "loop.png")
    for value in ("loop.png", "a\0.png", "missing.png"):  # no file of the release: missing, not outside
        with pytest.raises(SkipRow, match="missing_image"):
            store.encoded(value, "image")


def _bigger_box(record: dict, box: str) -> dict:
    """`record` with `box` (as its call's JSON writes it) starting with a 400-digit number."""
    if "conversations" in record:  # Mini-o3's: a string
        return {**record, "conversations": record["conversations"].replace(box, f"[{10**400}, " + box[1:], 1)}
    return json.loads(json.dumps(record).replace(box, f"[{10**400}, " + box[1:], 1))


# Per format, bad rows after `conversions.release`'s two good ones: (what, the record, its reason). Parquet's typed
# columns hold no field of another type: Mini-o3's bad rows are in its strings.
BAD_ROWS = {
    "mini_o3_coldstart": lambda good: [
        ("conversations nested 100,000 deep", {**good, "conversations": "[" * DEEP}, "malformed_call"),
        ("a 400-digit box", _bigger_box(good, "[0.5, 0.2, 0.8, 0.6]"), "malformed_call"),
    ],
    "pixel_reasoner_sft": lambda good: [
        ("message_list a string", {**good, "message_list": "What colour?"}, "malformed_row"),
        ("a message that is a number", {**good, "message_list": [5]}, "malformed_row"),
        ("a record that is a list", [good], "malformed_row"),
        ("a 400-digit box", _bigger_box(good, "[0.6, 0.3, 0.75, 0.5]"), "malformed_call"),
    ],
    "deepeyes_v2_sft": lambda good: [
        ("messages a string", {**good, "messages": "What colour?"}, "malformed_row"),
        ("images: 5", {**good, "images": 5}, "malformed_row"),
        ("a record that is a list", [good], "malformed_row"),
    ],
    "thyme_sft": lambda good: [
        ("image: 5", {**good, "image": 5}, "malformed_row"),
        ("a record that is a list", [good], "malformed_row"),
    ],
}


@pytest.mark.parametrize("fmt", sorted(BAD_ROWS))
def test_every_reader_skips_rows_of_another_shape_and_converts_the_rest(tmp_path, fmt):
    """Each release reader on rows of a shape it does not expect: each a counted skip naming its file and row, the two
    good rows converted (before issue 59, each lost the conversion: RecursionError, OverflowError, AttributeError,
    TypeError, KeyError)."""
    root, file, records = release(tmp_path / "in", fmt)
    bad = BAD_ROWS[fmt](records[0])
    if fmt == "mini_o3_coldstart":
        pq.write_table(pa.Table.from_pylist(records + [record for _, record, _ in bad]), file)
    elif fmt == "thyme_sft":  # the JSON Lines Thyme's README converts to: a field of any type
        file.unlink()
        file = file.with_name("2round.jsonl")
        file.write_text("".join(json.dumps(r) + "\n" for r in records + [record for _, record, _ in bad]))
    else:
        file.write_text(json.dumps(records + [record for _, record, _ in bad]), encoding="utf-8")
    items = list(FORMATS[fmt](root, ToolConfig()))
    assert sum(not isinstance(item, SkipRow) for item in items) == 2, items
    skips = [item for item in items if isinstance(item, SkipRow)]
    assert [(skip.where, skip.reason) for skip in skips] == [
        (f"{file.name} row {row}", reason) for row, (_, _, reason) in enumerate(bad, start=2)
    ], [str(skip) for skip in skips]
    assert all(len(skip.detail) <= MAX_SKIP_DETAIL + 40 for skip in skips)
    stats = convert.main(["--format", fmt, "--input", str(root), "--output", str(tmp_path / "out")])
    assert stats["rows_converted"] == 2 and stats["rows_read"] == 2 + len(bad)


def test_a_record_file_or_archive_linked_from_outside_fails_naming_it(tmp_path):
    """A record file or `*.zip` of the folder that is a link out of it is no file of the release: the conversion fails
    at once naming it and where it leads, before a byte of it is read."""
    outside = tmp_path / "outside"
    write_cof(outside, [good("0")])
    root = tmp_path / "release"
    (root / "images").mkdir(parents=True)
    (root / MAIN).symlink_to(outside / MAIN)
    with pytest.raises(LayoutError, match=rf"{MAIN} links to {outside / MAIN}, outside --input"):
        list(FORMATS["cof_sft"](root, ToolConfig()))
    (root / MAIN).unlink()
    write_cof(root / "in", [good("0")])
    root = root / "in"
    (root / "images" / "0.png").unlink()
    with zipfile.ZipFile(outside / "images.zip", "w") as archive:
        archive.writestr("images/0.png", png(scene()))
    (root / "images.zip").symlink_to(outside / "images.zip")
    with pytest.raises(LayoutError, match=r"images.zip links to .*outside --input"):
        list(FORMATS["cof_sft"](root, ToolConfig()))
