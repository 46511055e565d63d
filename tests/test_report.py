"""The HTML report: its structure (one card per sample, filter attributes, only inline images), and a real render of
its filters in headless Chromium where `/usr/bin/chromium` exists (Debian's `chromium` package)."""

import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from PIL import Image

from data.task import build_prompt
from evaluation.agent import Episode
from evaluation.metrics import episode_record
from evaluation.report import render_report, write_report
from tools import ZoomCall

CHROMIUM = Path("/usr/bin/chromium")


def make_records(tokenizer):
    """Three samples through `evaluate.episode_record`, so the report reads the real `samples.jsonl` format: a
    correct answer after a gap call, a wrong answer after a good call, and a failure after a rejected call."""
    image = Image.new("RGB", (400, 300), (240, 240, 230))
    crop = image.crop((10, 10, 110, 90))
    records = []
    for i, (prediction, z, failure) in enumerate(
        [("A", (0.2, 0.3), None), ("B", (0.4, 0.1), None), (None, None, "x")]
    ):
        row = {
            "id": f"s{i}",
            "source": "synthetic/colour",
            "prompt": build_prompt("What colour is the <star>?", ["red", "blue"]),
            "answer": "A",
            "options": ["red", "blue"],
            "target_bbox": [20, 20, 60, 60],
            "target_label": "red star",
        }
        arguments = {"bbox_2d": [1, 1, 20, 20], "label": "red star"}
        if z is None:
            call = ZoomCall(1, arguments, "red star", None, None, "bbox_2d is empty inside the image")
        else:
            call = ZoomCall(1, arguments, "red star", (10, 10, 110, 90), crop)
        completion = [
            {"role": "assistant", "reasoning_content": "look <closer>", "content": "", "tool_calls": []},
            {"role": "tool", "name": "image_zoom_in_tool", "content": [{"type": "text", "text": "Zoomed in."}]},
        ]
        episode = Episode(
            f"s{i}", image, (112, 84), completion=completion, turn_ids=[[1]], prediction=prediction,
            failure=failure and "no <answer>",
        )  # fmt: skip
        records.append(episode_record("synthetic", row, episode, [call], [z], tokenizer))
    return records, {record["id"]: image for record in records}


class Outline(HTMLParser):
    """What the tests look at: cards with their data attributes, image sources, SVG boxes, scripts, links."""

    def __init__(self):
        super().__init__()
        self.cards, self.images, self.rects, self.scripts, self.links = [], [], 0, 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "section" and "card" in attrs.get("class", ""):
            self.cards.append(attrs)
        elif tag == "img":
            self.images.append(attrs["src"])
        elif tag == "rect":
            self.rects += 1
        elif tag == "script":
            self.scripts += 1
        self.links += [v for k, v in attrs.items() if k in ("href", "src") and not (v or "").startswith("data:")]


def test_report_structure(tiny_processor):
    records, images = make_records(tiny_processor.tokenizer)
    page = render_report(records, images.get, metrics={"accuracy": 1 / 3, "by": {"x": 0.5}}, title="tiny on synthetic")
    outline = Outline()
    outline.feed(page)
    assert [card["id"] for card in outline.cards] == ["sample-s0", "sample-s1", "sample-s2"]
    assert [(card["data-wrong"], card["data-gap"]) for card in outline.cards] == [
        ("false", "true"),  # z 0.2 <= whole-image 0.3: a gap call
        ("true", "false"),
        ("true", "false"),  # failed: wrong, and its only call returned no crop
    ]
    assert len(outline.images) == 3 + 2  # three images, two crops (the rejected call has none)
    assert all(src.startswith("data:image/jpeg;base64,") for src in outline.images)
    assert outline.rects == 3 + 2  # a target box per image, a box per crop
    assert outline.scripts == 1 and outline.links == []  # self-contained: inline script and images, nothing fetched
    assert "look &lt;closer&gt;" in page and "<star>" not in page  # model and data text are escaped
    assert "z=0.200 (whole image 0.300) · gap" in page and "failure: no &lt;answer&gt;" in page


def test_report_shows_a_capped_number_of_samples(tiny_processor):
    records, images = make_records(tiny_processor.tokenizer)
    page = render_report(records, images.get, metrics={}, title="t", max_samples=2)
    outline = Outline()
    outline.feed(page)
    assert len(outline.cards) == 2 and "(first 2 of 3)" in page


@pytest.mark.process
@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium package (/usr/bin/chromium)")
@pytest.mark.parametrize(
    ("fragment", "visible"), [("", ["s0", "s1", "s2"]), ("#wrong", ["s1", "s2"]), ("#gap", ["s0"])]
)
def test_report_filters_render_in_headless_chromium(tmp_path, fragment, visible, tiny_processor):
    records, images = make_records(tiny_processor.tokenizer)
    path = write_report(tmp_path / "report.html", records, images.get, metrics={"accuracy": 1 / 3}, title="t")
    dom = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom", path.as_uri() + fragment],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    outline = Outline()
    outline.feed(dom)  # the DOM after the report's script ran: filtered cards carry `hidden`
    assert [card["id"].removeprefix("sample-") for card in outline.cards if "hidden" not in card] == visible
    assert f">{len(visible)}</span> shown" in dom
