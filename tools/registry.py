"""A tool is one module that registers one `Tool` (what it declares: the class docstring, docs/tools.md). A recipe
enables tools by registry name or import path (`tools: [zoom_in, rotate]`, `tools: [zoom_in, mypkg.tools:MY_TOOL]`);
the environment, the system prompt, the token budget and the calls-per-rollout metrics read the enabled list.
`zoom_in` is the default and the tool MAPO scores; other tools' calls carry no label: no z_t (`executed_calls`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

DEFAULT_TOOLS = ("zoom_in",)


@dataclass(frozen=True)
class Tool:
    """One tool of the agent's environment: `function`, the name the model calls and the environment method's;
    `method(config)`, that method for a `ToolConfig` (its signature and docstring are the schema TRL renders; None:
    the environment class has it), returning parts (`tools.zoom_in.observation`) or text, a bad call an observation
    that sets `env.last_error`, never an exception; `prompt(box_convention)`, its system-prompt sentence;
    `budget_arguments(env)` and `short_arguments`, the token budget's dearest and shortest calls; `metric`, its
    calls-per-rollout metric; `kit_schema`, its line in the tiny kit's tokenizer corpus (`tiny.kit.KIT_TOOLS`)."""

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
