"""Every Python module of the repo, production, research and tests alike, is at most `MAX_LINES` lines; the check names
each module over it with its count. Like tests/test_layout.py's rules, it is a function over a source tree, so a small
tree that breaks it checks that it is caught."""

from __future__ import annotations

from pathlib import Path

from test_layout import REPO, modules  # tests/test_layout.py: how the suite finds the repo's modules

# The house's 600-line rule (issue 63, item 4): a module past it does more than one thing, and is split by what each
# part measures or does rather than trimmed. One limit for every module, research and tests included.
MAX_LINES = 600


def ignored_dirs(root: Path) -> set[str]:
    """The folders `.gitignore` names (`wandb/`, `.hypothesis/`): what runs leave in the tree, not the repo's code."""
    gitignore = root / ".gitignore"
    lines = gitignore.read_text(encoding="utf-8").splitlines() if gitignore.exists() else []
    return {line.strip().strip("/") for line in lines if line.strip().endswith("/")}


def oversized(root: Path, limit: int = MAX_LINES) -> list[str]:
    """`path: N lines` for every module under `root` (`test_layout.modules`, less the ignored folders) of more than
    `limit` lines, the longest first."""
    skip = ignored_dirs(root)
    counts = {}
    for path in modules(root).values():
        rel = path.relative_to(root)
        if skip & set(rel.parts):
            continue
        counts[rel.as_posix()] = len(path.read_text(encoding="utf-8").splitlines())
    longest_first = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [f"{path}: {n} lines" for path, n in longest_first if n > limit]


def test_no_module_is_over_the_line_limit():
    assert len(modules(REPO)) > 100  # the walk found the repo
    found = oversized(REPO)
    assert not found, f"over {MAX_LINES} lines, to split by what each part does:\n" + "\n".join(found)


def test_a_module_over_the_limit_is_named_with_its_count(tmp_path):
    files = {
        "at_the_limit.py": MAX_LINES,
        "over.py": MAX_LINES + 1,
        "pkg/__init__.py": 0,
        "pkg/far_over.py": 2 * MAX_LINES,
        "outputs/run.py": 3 * MAX_LINES,  # test_layout.SKIP_DIRS
        "wandb/run-1/files/code/train.py": 3 * MAX_LINES,  # a folder .gitignore names
    }
    for rel, lines in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n" * lines, encoding="utf-8")
    (tmp_path / ".gitignore").write_text("outputs/\n__pycache__/\n*.pyc\nwandb/\n", encoding="utf-8")
    assert oversized(tmp_path) == [f"pkg/far_over.py: {2 * MAX_LINES} lines", f"over.py: {MAX_LINES + 1} lines"]
