"""The environment class of a `ToolConfig` and its factory for TRL (`make_environment_factory`): `ZoomInEnv` in the
config's box convention (`RelativeZoomInEnv`: Qwen3-VL's 0-1000 grid), with Qwen-Agent's `img_idx` when the config
accepts it (`accepting_img_idx`), with the method of every other tool the config enables (`environment_class`); and
the replay of a gold call through the tool (`replay_call`, SFT)."""

from __future__ import annotations

import functools
import textwrap

from tools.config import PixelBudget, ToolConfig
from tools.env import ZoomInEnv
from tools.registry import get_tools
from tools.zoom_in import ToolError


class RelativeZoomInEnv(ZoomInEnv):
    """`ZoomInEnv` reading `bbox_2d` on Qwen3-VL's 0-1000 grid (`box_convention` "relative_1000"); only the tool's
    description differs."""

    box_convention = "relative_1000"

    def image_zoom_in_tool(self, bbox_2d: list[float], label: str) -> list[dict]:
        """Zoom in on a region of the image by cropping it with a bounding box, to see small details clearly.

        Args:
            bbox_2d: The region to zoom in on, as [x1, y1, x2, y2] on a 0-1000 grid over the image you see, where
                (0, 0) is its top-left corner and (1000, 1000) its bottom-right corner, whatever its size.
            label: A few words naming what you expect to see in the box, e.g. "the star" or "the small sign".
        """
        return self._zoom(bbox_2d, label)


IMG_IDX_DESCRIPTION = (
    "img_idx: Which image to zoom in on: 0 (the default) is the original image, and i the image the i-th successful "
    "zoom returned. bbox_2d is written in that image's frame."
)


def accepting_img_idx(env: type[ZoomInEnv]) -> type[ZoomInEnv]:
    """`env` whose tool also takes the optional `img_idx` (0 when absent), as Qwen3-VL's released tool does (Qwen-Agent
    `qwen_agent/tools/image_zoom_in_qwen3vl.py`: an index over every image shown), described in its schema."""

    def image_zoom_in_tool(self, bbox_2d: list[float], label: str, img_idx: int = 0) -> list[dict]:
        return self._zoom(bbox_2d, label, img_idx)

    argument = textwrap.fill(IMG_IDX_DESCRIPTION, 116, initial_indent=" " * 12, subsequent_indent=" " * 16)
    image_zoom_in_tool.__doc__ = f"{env.image_zoom_in_tool.__doc__.rstrip()}\n{argument}\n        "
    name = env.__name__.removesuffix("Env") + "WithImageIndexEnv"
    return type(name, (env,), {"accept_img_idx": True, "image_zoom_in_tool": image_zoom_in_tool, "__doc__": (
        f"`{env.__name__}` whose tool also takes Qwen3-VL's `img_idx` (`accepting_img_idx`)."
    )})  # fmt: skip


# The environment of each (`ToolConfig.box_convention`, `ToolConfig.accept_img_idx`) (`tools.make_environment_factory`).
ENVIRONMENTS = {
    (env.box_convention, accept): accepting_img_idx(env) if accept else env
    for env in (ZoomInEnv, RelativeZoomInEnv)
    for accept in (False, True)
}


def environment_class(config: ToolConfig) -> type[ZoomInEnv]:
    """The environment of `config`: `ENVIRONMENTS`' zoom-in environment of its box convention and `accept_img_idx`,
    with the method of every other tool `config.tools` enables (`Tool.method`); the default tools: that class."""
    base = ENVIRONMENTS[config.box_convention, config.accept_img_idx]
    methods = {tool.function: tool.method(config) for tool in get_tools(config.tools)}
    methods = {name: method for name, method in methods.items() if method is not None}
    if not methods:
        return base
    name = base.__name__.removesuffix("Env") + "".join(tool.name.title().replace("_", "") for tool in get_tools(
        config.tools) if tool.function in methods) + "Env"  # fmt: skip
    return type(name, (base,), {**methods, "__doc__": f"`{base.__name__}` with {', '.join(methods)}."})


def replay_call(env: ZoomInEnv, function: str, arguments: dict) -> list[dict] | str:
    """A gold call (SFT) run through the tool as TRL runs it: its observation, or `ToolError` when the tool refused
    it (`env.last_error`)."""
    env.last_error = None
    result = getattr(env, function)(**arguments)
    if env.last_error is not None:
        raise ToolError(env.last_error)
    return result


def make_environment_factory(config: ToolConfig, image_budget: PixelBudget) -> functools.partial:
    """A zero-argument factory for TRL's `environment_factory`: the `ZoomInEnv` of `config.box_convention` and
    `accept_img_idx` with the tools `config.tools` enables (`tools.environments.environment_class`), in the processor's frame
    (`utils.models.pixel_budget(processor)`)."""
    return functools.partial(environment_class(config), config, image_budget)
