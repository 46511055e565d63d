"""The repo's layout rules, read from the source: imports flow one way, production never imports the research package,
runnables are leaves, nothing edits `sys.path` or the environment at import, and `MAPOTrainer`'s docstring names every
method it overrides.

Each rule is a function over a source tree, so the tests also run it on a small tree that breaks the rule and check
that it is caught.
"""

from __future__ import annotations

import ast
import importlib
import io
import re
import tokenize
from pathlib import Path

import conftest  # tests/conftest.py, as pytest loaded it (tests/ is on sys.path)
import pytest
from trl import GRPOTrainer

from mapo_trainer import MAPOTrainer

REPO = Path(__file__).resolve().parents[1]
SKIP_DIRS = {".venv", "outputs", ".git", "__pycache__"}
ENTRY_SCRIPTS = {"rl", "sft", "evaluate", "data.convert"}  # data.convert runs as `python -m data.convert`
RESEARCH = "research"  # experiments and probes: they may import the product, never the other way round
RUNNABLE_RESEARCH = {
    "research.experiment",
    "research.localization_probe",
    "research.zoom_necessity",
    "research.hpo_solvers",
    "research.gradient_claims",
    "research.positive_control",
    "research.frame_ceiling",
    "research.vision_tokens",
    "research.training_tail",
    "research.clip_gate",
}
# The runnables that import an entry script: each builds `rl.py`'s trainer unchanged but for its trainer class.
ALLOWED_RUNNABLE_IMPORTS = {("scripts.rl_forced", "rl"), ("research.gradient_claims", "rl")}


# ----------------------------------------------------------------------------------------------------- the rules
def modules(root: Path) -> dict[str, Path]:
    """Every Python module under `root` by dotted name (`utils.models`, `data` for `data/__init__.py`)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if SKIP_DIRS & set(rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(node: ast.AST, module: str, known: dict[str, Path]) -> list[str]:
    """The repo modules an import statement of `module` loads (a `from pkg import sub` names the submodule)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative import
            package = (
                module.split(".")[: -node.level] if not known[module].name == "__init__.py" else module.split(".")
            )
            base = ".".join([*package, base] if base else package)
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = []
    for name in names:
        while name and name not in known:  # `import a.b.c` of a package path: the deepest repo module
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def import_graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """Module -> repo modules it imports at top level, and the imports of repo modules made inside a function or
    class body (`module: line`), which hide an edge from anyone reading the top of the file."""
    known = modules(root)
    graph, deferred = {name: set() for name in known}, []
    for name, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = set(map(id, tree.body))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                targets = [t for t in _imported(node, name, known) if t != name]
                if id(node) in top:
                    graph[name] |= set(targets)
                elif targets:
                    deferred.append(f"{name}:{node.lineno} imports {', '.join(targets)}")
    return graph, deferred


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (or a module importing itself): import cycles."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def runnable_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a runnable (`scripts.*`, an entry script) by a module that is not a test."""
    runnable = {m for m in graph if m.startswith("scripts.") or m in ENTRY_SCRIPTS | RUNNABLE_RESEARCH}
    return [
        f"{m} imports {t}"
        for m, targets in sorted(graph.items())
        if not m.startswith("tests")
        for t in sorted(targets & runnable)
        if (m, t) not in ALLOWED_RUNNABLE_IMPORTS
    ]


def research_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of the research package by a production module (anything outside it and the tests)."""
    inside = (RESEARCH, "tests")
    return [
        f"{m} imports {t}"
        for m, targets in sorted(graph.items())
        if not (m == RESEARCH or m.startswith(tuple(f"{p}." for p in inside)))
        for t in sorted(targets)
        if t == RESEARCH or t.startswith(f"{RESEARCH}.")
    ]


def layout_rows(readme: str) -> dict[str, int]:
    """Each top-level module or package the README's layout block names -> its row, counted from the top (the block
    lists the layers from the top down). Rows from `research/` on are not layers of the product."""
    block = readme.split("## Layout", 1)[1].split("```")[1]
    rows = {}
    lines = [line for line in block.strip().splitlines() if not line[:1].isspace()]  # not continuation lines
    for index, line in enumerate(lines):
        names = re.split(r"\s{2,}", line, maxsplit=1)[0]
        if names.startswith(RESEARCH):
            break
        rows |= {name.removesuffix("/").removesuffix(".py"): index for name in re.split(r"[,\s]+", names)}
    return rows


def upward_imports(graph: dict[str, set[str]], rows: dict[str, int]) -> list[str]:
    """Imports between production packages that go up the README's layout (to a row above the importer's), and the
    production modules the layout does not place."""
    row = lambda module: rows.get(module.split(".")[0])  # noqa: E731
    production = [m for m in sorted(graph) if not m.startswith((f"{RESEARCH}.", "tests.")) and m != RESEARCH]
    found = [f"{m} is in no row of the README's layout" for m in production if row(m) is None]
    for m in production:
        for t in sorted(graph[m]):
            if row(m) is not None and row(t) is not None and row(t) < row(m):
                found.append(f"{m} imports {t}, a row above it")
    return found


_SYS_PATH = re.compile(r"\bsys\.path\.(insert|append|extend)\(|\bsys\.path\s*=")
_ENV_AT_IMPORT = re.compile(r"^os\.environ(\[|\.setdefault\(|\.update\()", re.M)


def import_time_edits(root: Path) -> list[str]:
    """`sys.path` edits anywhere, `# noqa: E402` (imports pushed below code), and environment variables set at module
    level outside tests: configuration belongs to the Makefile and the entry points, not to an import."""
    found = []
    for name, path in modules(root).items():
        text = path.read_text(encoding="utf-8")
        if _SYS_PATH.search(text):
            found.append(f"{name}: edits sys.path")
        comments = [
            t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT
        ]
        if any("noqa: E402" in comment for comment in comments):
            found.append(f"{name}: noqa: E402")
        if not name.startswith("tests") and _ENV_AT_IMPORT.search(text):
            found.append(f"{name}: sets os.environ at import")
    return found


def overridden_methods(cls: type, base: type) -> set[str]:
    """Methods that `cls` and the classes between it and `base` in its MRO define and that `base`'s MRO also defines:
    what `cls` overrides of `base`."""
    mro = cls.__mro__
    own = mro[: mro.index(base)]
    inherited = {name for klass in base.__mro__ for name in vars(klass)}
    return {name for klass in own for name, value in vars(klass).items() if callable(value) and name in inherited}


def documented_overrides(docstring: str) -> set[str]:
    """The methods a docstring's "Methods it overrides" list names: the first backticked name of each `- ` item."""
    _, _, section = docstring.partition("Methods it overrides")
    return set(re.findall(r"^\s*- `(\w+)`", section, re.M)) | set(re.findall(r"^\s*- `\w+`, `(\w+)`", section, re.M))


# ------------------------------------------------------------------------------------------------------ the repo
def test_the_repo_has_no_import_cycle():
    graph, _ = import_graph(REPO)
    assert {"mapo_trainer", "utils.models", "evaluation.agent", "tiny.stages"} <= set(graph)  # the walk found the repo
    assert cycles(graph) == []


def test_no_repo_module_is_imported_inside_a_function():
    _, deferred = import_graph(REPO)
    assert deferred == []


def test_runnables_are_leaves():
    graph, _ = import_graph(REPO)
    assert runnable_imports(graph) == []
    # Every research module that runs as a program is counted as a runnable here.
    main_guard = '__name__ == "__main__"'
    mains = {m for m, path in modules(REPO).items() if m.startswith("research.") and main_guard in path.read_text()}
    assert mains == RUNNABLE_RESEARCH


def test_production_never_imports_the_research_package():
    graph, _ = import_graph(REPO)
    assert any(m.startswith(f"{RESEARCH}.") for m in graph)  # the walk found it
    assert research_imports(graph) == []


def test_packages_import_only_down_the_readme_layout():
    graph, _ = import_graph(REPO)
    rows = layout_rows((REPO / "README.md").read_text(encoding="utf-8"))
    assert rows["scripts"] < rows["rl"] < rows["mapo_trainer"] < rows["data"] < rows["tools"]  # the block was read
    assert upward_imports(graph, rows) == []


def test_nothing_edits_sys_path_or_the_environment_at_import():
    assert import_time_edits(REPO) == []


def test_the_trainer_docstring_lists_every_method_it_overrides():
    overridden = overridden_methods(MAPOTrainer, GRPOTrainer)
    assert {"_calculate_rewards", "_generate_single_turn", "_load_from_checkpoint"} <= overridden
    assert documented_overrides(MAPOTrainer.__doc__) == overridden


# --------------------------------------------------------------------------------- the rules catch what they guard
def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def test_a_cycle_through_a_package_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "a.py": "from pkg import b\n",
            "pkg/__init__.py": "",
            "pkg/b.py": "from pkg.c import x\n",
            "pkg/c.py": "import a\nx = 1\n",
            "d.py": "import a\n",
        },
    )
    graph, deferred = import_graph(root)
    assert graph["a"] == {"pkg.b"} and graph["d"] == {"a"}
    assert cycles(graph) == [["a", "pkg.b", "pkg.c"]]
    assert deferred == []


def test_a_deferred_import_and_a_runnable_import_are_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "lib.py": "def f():\n    import rl\n",
            "rl.py": "",
            "scripts/__init__.py": "",
            "scripts/demo.py": "import rl\n",
            "tiny/stages.py": "from scripts import demo\n",
            "tests/test_x.py": "from scripts import demo\n",
        },
    )
    graph, deferred = import_graph(root)
    assert deferred == ["lib:2 imports rl"]
    assert runnable_imports(graph) == ["scripts.demo imports rl", "tiny.stages imports scripts.demo"]


def test_a_production_import_of_research_is_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "research/__init__.py": "",
            "research/rewards.py": "import rewards\n",  # research may use the product
            "research/experiment.py": "from research import rewards\n",
            "rewards.py": "",
            "tiny/stages.py": "from research.rewards import x\n",
            "configs.py": "import research\n",
            "tests/test_x.py": "from research import experiment\n",
        },
    )
    graph, _ = import_graph(root)
    assert research_imports(graph) == ["configs imports research", "tiny.stages imports research.rewards"]


def test_an_upward_import_between_packages_is_found(tmp_path):
    readme = "## Layout\n\n```\nrl.py, sft.py   entry\nutils/   helpers\ndata/   data\ntools/   tool\nresearch/   lab\n```\n"
    rows = layout_rows(readme)
    assert rows == {"rl": 0, "sft": 0, "utils": 1, "data": 2, "tools": 3}
    root = _tree(
        tmp_path,
        {
            "rl.py": "import utils.recipes\nimport tools\n",  # down: fine
            "utils/__init__.py": "",
            "utils/recipes.py": "from tools import x\n",
            "utils/rollout.py": "import data.task\n",  # down: fine
            "data/convert.py": "import utils.recipes\n",  # up: utils sits above data
            "data/__init__.py": "",
            "data/task.py": "from data import __init__\n",  # its own package: fine
            "tools/__init__.py": "x = 1\n",
            "extra.py": "import tools\n",  # in no row
            "research/__init__.py": "",
            "research/probe.py": "import rl\n",  # the lab may import anything
        },
    )
    graph, _ = import_graph(root)
    assert upward_imports(graph, rows) == [
        "extra is in no row of the README's layout",
        "data.convert imports utils.recipes, a row above it",
    ]


def test_import_time_edits_are_found(tmp_path):
    root = _tree(
        tmp_path,
        {
            "a.py": "import sys\nsys.path.insert(0, '.')\n",
            "b.py": "import os\nos.environ.setdefault('X', '1')\nimport json  # noqa: E402\n",
            "c.py": "import os\n\ndef main():\n    os.environ['X'] = '1'\n",
            "tests/conftest.py": "import os\nos.environ.setdefault('X', '1')\n",
        },
    )
    assert import_time_edits(root) == ["a: edits sys.path", "b: noqa: E402", "b: sets os.environ at import"]


class _Base:
    def hook(self): ...

    def other(self): ...


class _Mixin:
    def other(self): ...


class _Trainer(_Mixin, _Base):
    """Methods it overrides:
    - `hook`: something.
    """

    def hook(self): ...

    def helper(self): ...


@pytest.mark.parametrize("doc, ok", [(_Trainer.__doc__, False), (_Trainer.__doc__ + "- `other` (`_Mixin`)\n", True)])
def test_an_override_missing_from_the_docstring_is_found(doc, ok):
    assert overridden_methods(_Trainer, _Base) == {"hook", "other"}
    assert (documented_overrides(doc) == overridden_methods(_Trainer, _Base)) is ok


def test_what_users_import_stays_where_it_was():
    kept = {
        "mapo_trainer": [
            "MAPOConfig", "MAPOTrainer", "ClipVerifier", "semantic_reward", "reference_advantages", "kantorovich_potentials",
        ],
        "tools": ["ToolConfig", "ZoomInEnv", "make_environment_factory"],
        "tools.zoom_in": ["crop_box", "TOOL_NAME"],
        "data.synthetic": ["build_synthetic"],
        "data.benchmarks": ["load_benchmark"],
    }  # fmt: skip
    missing = [f"{m}.{n}" for m, names in kept.items() for n in names if not hasattr(importlib.import_module(m), n)]
    assert missing == []


def test_the_files_the_suite_starts_first_exist():
    """`conftest.LONGEST_FIRST` orders `make test`'s files; a renamed file would silently drop out of the order."""
    assert conftest.LONGEST_FIRST and all((REPO / path).is_file() for path in conftest.LONGEST_FIRST)
