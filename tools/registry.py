"""A tool is one module that registers one `Tool`: its schema (the environment method, whose signature and docstring
TRL renders), what it executes and returns, its sentence of the system prompt, its worst case for the token budget,
its gold replay for SFT and its line in the tiny kit's tokenizer corpus. A recipe enables tools by registry name or
import path (`tools: [zoom_in, rotate]`, `tools: [zoom_in, mypkg.tools:MY_TOOL]`); every part of a run that depends
on the tools (environment, system prompt, token budget, calls-per-rollout metrics) reads the enabled list.

`zoom_in` (`tools.zoom_in`) is the default and the tool MAPO scores; any other tool's calls carry no label and get no
z_t (`tools.env.executed_calls` leaves them out). How to add one: docs/tools.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_TOOLS = ("zoom_in",)


@dataclass(frozen=True)
class Tool:
    """One tool of the agent's environment.

    - `function`: the name the model calls, and the environment method's name.
    - `method(config)`: the environment method for a `ToolConfig` (its docstring is the schema TRL renders), or None
      when the environment class defines it already (zoom-in, whose schema depends on the box convention). It returns
      a list of parts (an image, then text: `tools.zoom_in.observation`) or text; a bad call is an observation too,
      never an exception, and sets `env.last_error`.
    - `prompt(box_convention)`: its sentence of the system prompt.
    - `budget_arguments(env)`: the call whose response costs the most tokens (the token budget's worst case), on an
      environment reset on an image of the largest size the budget allows.
    - `short_arguments`: the shortest well-formed call (the budget's call turn).
    - `metric`: the name of its calls-per-rollout metric.
    - `kit_schema`: its line in the tiny kit's tokenizer corpus (`tiny.kit.KIT_TOOLS` lists the tools trained in).
    """

    name: str
    function: str
    prompt: Callable[[str], str]
    budget_arguments: Callable[[Any], dict]
    short_arguments: dict
    method: Callable[[Any], Callable | None] = lambda config: None
    metric: str = ""
    kit_schema: str = ""

    @property
    def metric_name(self) -> str:
        return self.metric or f"tools/{self.name}_calls_per_rollout"


TOOLS: dict[str, Tool] = {}


def register_tool(tool: Tool) -> Tool:
    """Add `tool` to `TOOLS` under its name (a second tool of the same name replaces it: tests re-register)."""
    TOOLS[tool.name] = tool
    return tool


def get_tool(name: str) -> Tool:
    """The tool a recipe names: a name in `TOOLS`, or an import path `package.module:ATTRIBUTE` to a `Tool`."""
    if ":" in name:
        module, _, attribute = name.partition(":")
        try:
            tool = getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError) as err:
            raise ValueError(f"tool {name!r}: cannot import it ({err})") from err
        if not isinstance(tool, Tool):
            raise ValueError(f"tool {name!r} is a {type(tool).__name__}, not a tools.Tool")
        return tool
    if name not in TOOLS:
        raise ValueError(f"unknown tool {name!r}: use one of {sorted(TOOLS)} or an import path 'package.module:NAME'")
    return TOOLS[name]


def get_tools(names: list[str] | tuple[str, ...]) -> list[Tool]:
    """The tools of `names`, in order; refuses none, a repeat, or a list without `zoom_in` (MAPO's scored tool)."""
    tools = [get_tool(name) for name in names]
    functions = [tool.function for tool in tools]
    if len(set(functions)) != len(functions):
        raise ValueError(f"tools {list(names)} name a tool twice")
    if "zoom_in" not in [tool.name for tool in tools]:
        raise ValueError(f"tools {list(names)} must include zoom_in: MAPO's semantic reward scores its calls")
    return tools
