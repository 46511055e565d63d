"""A self-contained HTML report of an evaluation run (one file, thumbnails inlined, opens offline): per sample, the
image with every call's box drawn over it (SVG in original pixels; the target box dashed), every crop with its label,
z_t and the label's score on the whole image, every turn with the tool's replies, and the verdict. Two filters show
only wrong answers and only samples with a gap call (a crop no closer to its label than the whole image);
`report.html#wrong`, `#gap` or `#wrong,gap` open with them set.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from PIL import Image

THUMBNAIL, CROP_THUMBNAIL = 480, 160  # longest side, pixels
PER_QUESTION = ("question_means",)  # metrics.json entries with one value per question: in metrics.json only

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222;background:#fafafa}
table.metrics{border-collapse:collapse;margin-bottom:1em}table.metrics td{border:1px solid #ddd;padding:2px 8px}
.filters{position:sticky;top:0;background:#fafafa;padding:.5em 0;border-bottom:1px solid #ddd;z-index:1}
.card{background:#fff;border:1px solid #ddd;border-radius:6px;margin:1em 0;padding:1em}
.card header{display:flex;gap:1em;align-items:baseline}.card h2{font-size:1em;margin:0}
.ok{color:#2a7d2a}.bad{color:#b3261e}.src{color:#777}
.row{display:flex;gap:1em;flex-wrap:wrap;align-items:flex-start}
.frame{position:relative;display:inline-block;line-height:0}.frame svg{position:absolute;inset:0;width:100%;height:100%}
figure{margin:0}figcaption{font-size:12px;color:#555;max-width:480px}
.crop{border:3px solid #2a9d8f;padding:2px}.crop.gap{border-color:#e76f51}.crop.error{border-color:#999}
pre{white-space:pre-wrap;background:#f3f3f3;padding:.5em;margin:.3em 0}pre.reasoning{color:#555}
.tool{color:#555;font-size:12px}
"""

_JS = """
const filters = [...document.querySelectorAll('input[data-filter]')];
function apply() {
  let shown = 0;
  for (const card of document.querySelectorAll('.card')) {
    card.hidden = filters.some(f => f.checked && card.dataset[f.dataset.filter] !== 'true');
    shown += card.hidden ? 0 : 1;
  }
  document.getElementById('shown').textContent = shown;
}
const preset = location.hash.slice(1).split(',');
for (const f of filters) { f.checked = preset.includes(f.dataset.filter); f.addEventListener('change', apply); }
apply();
"""


def _data_uri(image: Image.Image, longest: int) -> str:
    thumbnail = image.convert("RGB")
    thumbnail.thumbnail((longest, longest))
    buffer = io.BytesIO()
    thumbnail.save(buffer, format="JPEG", quality=80)
    return "data:image/jpeg;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else html.escape(str(value))


def _metrics_table(metrics: Mapping[str, Any]) -> str:
    cells = []  # (name, value); a nested mapping's entries are named `key / k` (each question's mean left out)
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            cells += [(f"{key} / {k}", v) for k, v in value.items() if k not in PER_QUESTION]
        else:
            cells.append((key, value))
    rows = "".join(f"<tr><td>{html.escape(name)}</td><td>{_fmt(value)}</td></tr>" for name, value in cells)
    return f"<table class='metrics'>{rows}</table>"


def _rect(box: Sequence[float], colour: str, label: str, dashed: bool = False) -> str:
    x1, y1, x2, y2 = box
    dash = " stroke-dasharray='6 4'" if dashed else ""
    return (
        f"<rect x='{x1}' y='{y1}' width='{x2 - x1}' height='{y2 - y1}' fill='none' stroke='{colour}' "
        f"stroke-width='3' vector-effect='non-scaling-stroke'{dash}><title>{html.escape(label)}</title></rect>"
    )


def _image_panel(record: Mapping[str, Any], image: Image.Image | None) -> str:
    if image is None:
        return "<figure><figcaption>image unavailable</figcaption></figure>"
    width, height = image.size
    shapes = []
    if record.get("target_bbox"):
        shapes.append(_rect(record["target_bbox"], "#264653", f"target: {record.get('target_label')}", dashed=True))
    for k, call in enumerate(record["calls"], start=1):
        if call["box"]:
            shapes.append(_rect(call["box"], "#e76f51" if call["gap"] else "#2a9d8f", f"call {k}: {call['label']}"))
    seen = f", seen as {record['seen_size'][0]}×{record['seen_size'][1]}" if record.get("seen_size") else ""
    return (
        f"<figure><div class='frame'><img src='{_data_uri(image, THUMBNAIL)}' alt='image {html.escape(record['id'])}'>"
        f"<svg viewBox='0 0 {width} {height}' preserveAspectRatio='none'>{''.join(shapes)}</svg></div>"
        f"<figcaption>{width}×{height}{seen}</figcaption></figure>"
    )


def _crop_panel(k: int, call: Mapping[str, Any], image: Image.Image | None) -> str:
    caption = f"call {k} (turn {call['turn']}): {html.escape(str(call['label']))}"
    if call["error"] or not call["box"] or image is None:
        return (
            f"<figure class='crop error'><figcaption>{caption}<br>error: {_fmt(call['error'])}</figcaption></figure>"
        )
    gap = " gap" if call["gap"] else ""
    scores = f"z={_fmt(call['z'])} (whole image {_fmt(call['z_full'])}){' · gap' if call['gap'] else ''}"
    crop = _data_uri(image.crop(tuple(call["box"])), CROP_THUMBNAIL)
    return (
        f"<figure class='crop{gap}'><img src='{crop}' alt='crop {k}'>"
        f"<figcaption>{caption}<br>{scores}</figcaption></figure>"
    )


def _turns(record: Mapping[str, Any]) -> str:
    """Each assistant turn (reasoning, text, calls) with the tool's replies to it."""
    turns: list[list[str]] = []
    for message in record["messages"]:
        if message["role"] == "assistant":
            parts = (
                [f"<pre class='reasoning'>{html.escape(message['reasoning'])}</pre>"] if message["reasoning"] else []
            )
            parts += [f"<pre>{html.escape(message['content'])}</pre>"] if message["content"] else []
            parts += [f"<pre>call {html.escape(json.dumps(call))}</pre>" for call in message["tool_calls"]]
            turns.append(parts)
        else:  # a tool reply follows the turn that called
            name, content = html.escape(str(message["name"])), html.escape(message["content"])
            turns[-1].append(f"<div class='tool'>tool ({name}): {content}</div>")
    return "<ol class='turns'>" + "".join(f"<li>{''.join(parts)}</li>" for parts in turns) + "</ol>"


def _card(record: Mapping[str, Any], image: Image.Image | None) -> str:
    correct = record["correct"]
    gap = any(call["gap"] for call in record["calls"])
    verdict = "<span class='ok'>✓ correct</span>" if correct else "<span class='bad'>✗ wrong</span>"
    failure = f" · failure: {html.escape(record['failure'])}" if record["failure"] else ""
    if "order" in record:  # issue 64: options shuffled, or k samples
        failure += f" · {html.escape(str(record['order']))} order, sample {record.get('sample', 0)}"
    if "correct_reply" in record and record["correct_reply"] != record["correct"]:
        reading = "right" if record["correct_reply"] else "wrong"
        failure += f" · read as a whole reply: {reading} ({html.escape(str(record.get('rule_reply')))})"
    crops = "".join(_crop_panel(k, call, image) for k, call in enumerate(record["calls"], start=1))
    return (
        f"<section class='card' id='sample-{html.escape(record['id'])}' data-wrong='{str(not correct).lower()}' "
        f"data-gap='{str(gap).lower()}'>"
        f"<header><h2>{html.escape(record['id'])}</h2>{verdict}<span class='src'>{html.escape(record['source'])}</span>"
        f"</header><div class='row'>{_image_panel(record, image)}<div class='row'>{crops}</div></div>"
        f"<pre>{html.escape(record['question'])}</pre>{_turns(record)}"
        f"<p>prediction: <b>{_fmt(record['prediction'])}</b> · answer: <b>{_fmt(record['answer'])}</b>{failure}</p>"
        "</section>"
    )


def render_report(
    records: Sequence[Mapping[str, Any]], image_of: Callable[[str], Image.Image | None], *, metrics: Mapping[str, Any],
    title: str, max_samples: int | None = None, budgets: Mapping[str, Any] | None = None,
) -> str:  # fmt: skip
    """The report's HTML for `records` (`samples.jsonl` lines); `image_of(id)` gives a sample's original image, or
    None. Only the first `max_samples` records get a card (all are counted in `metrics`). `budgets` (the pixel and
    token budgets the rollouts ran under) are tabulated under the metrics."""
    shown = records if max_samples is None else records[:max_samples]
    note = f" (first {len(shown)} of {len(records)})" if len(shown) < len(records) else ""
    cards = "".join(_card(record, image_of(record["id"])) for record in shown)
    budget_table = f"<h2>budgets</h2>{_metrics_table(budgets)}" if budgets else ""
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{_metrics_table(metrics)}{budget_table}"
        "<div class='filters'><label><input type='checkbox' data-filter='wrong'> wrong answers only</label> "
        "<label><input type='checkbox' data-filter='gap'> samples with gap calls only</label> "
        f"· <span id='shown'>{len(shown)}</span> shown{note}</div>"
        f"{cards}<script>{_JS}</script></body></html>"
    )


def write_report(path: str | Path, records, image_of, **kwargs) -> Path:
    """Write `render_report(records, image_of, **kwargs)` to `path`."""
    path = Path(path)
    path.write_text(render_report(records, image_of, **kwargs), encoding="utf-8")
    return path
