"""Readers of the public zoom-trajectory SFT sets, one module per release, each turning a release's rows, as
published, into `data.rows.Trajectory` records with every box in the original image's pixels; `python -m
data.convert` writes them as a dataset SFT trains on. The formats, their box conventions, what each reader skips and
why: docs/data.md."""

from collections.abc import Callable, Iterator
from pathlib import Path

from data.converters.cof import read_cof_sft
from data.converters.common import SkipRow
from data.converters.deepeyes_v2 import read_deepeyes_v2_sft
from data.converters.mini_o3 import read_mini_o3_coldstart
from data.converters.pixel_reasoner import read_pixel_reasoner_sft
from data.converters.thyme import read_thyme_sft
from data.rows import Trajectory
from tools import ToolConfig

# The readers by `--format` name. Each names the files and fields it expects in its own `LayoutError`s.
FORMATS: dict[str, Callable[[Path, ToolConfig], Iterator[Trajectory | SkipRow]]] = {
    "mini_o3_coldstart": read_mini_o3_coldstart,
    "cof_sft": read_cof_sft,
    "pixel_reasoner_sft": read_pixel_reasoner_sft,
    "deepeyes_v2_sft": read_deepeyes_v2_sft,
    "thyme_sft": read_thyme_sft,
}
