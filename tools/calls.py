"""A tool call written out by hand, as the chat template renders a structured call and TRL's response parser reads
it back (the tiny kit's corpus and scripted policies, the token budget, SFT data converters): Qwen's `<tool_call>`
JSON block or Qwen3.5's XML one. Re-exported from `tools.zoom_in`."""

from __future__ import annotations

import json
from collections.abc import Sequence

TOOL_NAME = "image_zoom_in_tool"


def _json_call(name: str, arguments: dict) -> str:
    """Qwen2.5's and Qwen3-VL's call: one JSON object in `<tool_call>` (TRL's `qwen3_vl.jinja`)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _xml_call(name: str, arguments: dict) -> str:
    """Qwen3.5's call: `<function=name>` with one `<parameter=key>` block per argument, a list as JSON and a string as
    it is (Qwen3.5's chat template, `args_value | tojson` or `| string`)."""
    params = "".join(
        f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
        for key, value in arguments.items()
    )
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


# The formats a chat template renders a structured call in (`utils.models.turn_format` reads which from the template).
CALL_FORMATS = {"json": _json_call, "xml": _xml_call}


def tool_call_text(bbox_2d: Sequence[float], label: str, name: str = TOOL_NAME, call_format: str = "json") -> str:
    """A zoom-in call as the model writes it, as the chat template renders a structured call and TRL's response
    parser reads it back: Qwen's `<tool_call>` JSON block, or Qwen3.5's XML one (`CALL_FORMATS`). The one place that
    spells a call out by hand."""
    return CALL_FORMATS[call_format](name, {"bbox_2d": list(bbox_2d), "label": label})
