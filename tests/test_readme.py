"""README.md is a user's page: short, in a fixed order of sections, with no issue history, and every repo path it
names in backticks exists. Pure text checks: no model, no network."""

import functools
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

MAX_WORDS = 2000

# The `##` sections, in order, each matched by a keyword of its title (case-insensitive), so small rewordings pass.
SECTIONS = [
    ("install", "install"),
    ("the two commands", "demo"),
    ("the pipeline on real data", "pipeline"),
    ("recipes", "recipe"),
    ("LoRA on one GPU", "lora"),
    ("multi-GPU and multi-node", "multi-"),
    ("weights for real runs and air-gapped nodes", "weights"),
    ("extending it", "extend"),
    ("layout", "layout"),
]


# A repo path mentioned in backticks: inline code spans, and tokens of fenced code blocks.
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_SPAN = re.compile(r"`([^`\n]+)`")
_TOKEN = re.compile(r"[^\s=\"'(),;\[\]|]+")
_EXTENSIONS = (".py", ".md", ".yaml")


def readme() -> str:
    return README.read_text(encoding="utf-8")


def headings(text: str) -> list[str]:
    body = _FENCE.sub("", text)
    return [line[3:].strip() for line in body.splitlines() if line.startswith("## ")]


def _top_level() -> set[str]:
    return {entry.name for entry in REPO.iterdir() if not entry.name.startswith(".")}


def _exempt(token: str) -> bool:
    """Outputs, placeholders, absolute paths (/data/..., /models/..., /shared/...), URLs and patterns."""
    return token.startswith(("outputs/", "/", "~", "$")) or any(
        mark in token for mark in ("<", ">", "{", "*", "://", "...")
    )


@functools.cache
def _repo_files() -> tuple[Path, ...]:
    """The repo's files, less hidden folders (.venv, .git) and outputs/."""
    files = []
    for root, dirs, names in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("outputs", "__pycache__")]
        files += [Path(root, name) for name in names]
    return tuple(files)


@functools.cache
def _code() -> str:
    return "\n".join(
        p.read_text(encoding="utf-8", errors="replace")
        for p in _repo_files()
        if p.suffix == ".py" and "tests" not in p.relative_to(REPO).parts
    )


def _logged_metric(token: str) -> bool:
    """A metric name such as `tools/zoom_error_rate`: it is quoted in the code that logs it."""
    return f'"{token}"' in _code() or f"'{token}'" in _code()


def path_mentions(text: str) -> set[str]:
    """Tokens in backticks that look like repo paths: with a `/` under a top-level entry of the repo, or ending in
    .py/.md/.yaml. A bare file name (`config_mapo.yaml`) must name a file somewhere in the repo."""
    chunks = _FENCE.findall(text) + _SPAN.findall(_FENCE.sub("", text))
    top = _top_level()
    found = set()
    for chunk in chunks:
        for token in _TOKEN.findall(chunk.strip("`")):
            token = token.rstrip(".:")
            if not token or _exempt(token):
                continue
            if ("/" in token and token.split("/")[0] in top) or token.endswith(_EXTENSIONS):
                found.add(token)
    return found


def _exists(token: str) -> bool:
    if "/" not in token:  # a bare file name, as recipes refer to their siblings
        return any(p.name == token for p in _repo_files())
    return (REPO / token).exists()


def test_the_readme_has_at_most_2000_words():
    # Words are whitespace-separated tokens over the whole file, code blocks included.
    words = len(readme().split())
    assert words <= MAX_WORDS, f"README.md has {words} words; at most {MAX_WORDS}"


def test_the_readme_opens_with_its_title_and_a_paragraph_then_the_sections_in_order():
    text = readme()
    assert text.startswith("# "), "the title line comes first"
    intro = text.split("\n## ", 1)[0].split("\n", 1)[1].strip()
    assert intro, "one paragraph saying what the repo is, before the first section"
    titles = headings(text)
    assert len(titles) == len(SECTIONS), titles
    for title, (what, keyword) in zip(titles, SECTIONS):
        assert keyword in title.lower(), f"expected the section on {what} (title with {keyword!r}), got {title!r}"


def test_the_readme_cites_no_issue_numbers():
    text = readme()
    issues = re.findall(r"(?i)\b(?:issues?|PRs?|pull requests?)\s*#?\d+", text)
    # `#123` alone; upstream references such as trl#6294 (a name right before the #) are fine.
    bare = re.findall(r"(?<![\w/])#\d+", text)
    assert not issues and not bare, issues + bare


def test_every_repo_path_the_readme_names_exists():
    mentioned = path_mentions(readme())
    assert "configs.py" in mentioned and "recipes/mapo_paper.yaml" in mentioned  # the scan sees inline spans
    missing = sorted(token for token in mentioned if not _exists(token) and not _logged_metric(token))
    assert not missing, f"README.md names paths that do not exist: {missing}"


def test_the_path_scan_catches_a_missing_path_and_exempts_placeholders():
    text = "See `docs/nowhere.md` and `recipes/<Model>/rl/config_x.yaml`, `outputs/demo/x.json`, `/data/vstar`.\n"
    assert path_mentions(text) == {"docs/nowhere.md"}
    assert not _exists("docs/nowhere.md")
