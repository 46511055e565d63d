"""Every reach into a library's internals (`docs/internals.md`) still holds on the installed stack.

The table in `docs/internals.md` is the one source of truth: this file parses it and checks each row (see the page
for the target syntax). A row fails, naming itself, when its library's installed version differs from `checked on`,
or when a module, attribute, parameter or source fragment its target names is gone; it skips when its library, or an
optional package its module imports, is not installed. The checker is tested on planted upstream changes below.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import inspect
import re
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from packaging.version import InvalidVersion, Version

DOC = Path(__file__).resolve().parents[1] / "docs" / "internals.md"
COLUMNS = ("id", "library", "checked on", "target", "where", "what and why", "upstream")
LIBRARIES = {"trl", "transformers", "vllm", "deepspeed", "accelerate", "peft", "open_clip_torch", "torch", "datasets"}
ID_RE = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")
NEEDS_RE = re.compile(r"\s*\[needs ([\w.\- ,]+)\]\s*$")
SPEC_RE = re.compile(
    r"""^(?P<module>[A-Za-z_][\w.]*)
    (?::(?P<path>[A-Za-z_][\w.]*))?
    (?:\((?P<params>[^()]*)\))?
    (?:\s+\{(?P<mentions>.*)\})?
    (?:\s*==\s*(?P<value>.+))?$""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class Row:
    id: str
    library: str
    checked_on: str
    target: str
    where: str
    what: str
    upstream: str


@dataclass(frozen=True)
class Spec:
    text: str
    module: str
    path: tuple[str, ...]
    params: tuple[str, ...] | None
    mentions: tuple[str, ...]
    value: str | None


# ------------------------------------------------------------------------------------------------------ parsing
def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_table(text: str) -> list[Row]:
    """The rows of the one table whose header is `COLUMNS`; backticks around a whole cell are dropped."""
    lines = text.splitlines()
    headers = [i for i, line in enumerate(lines) if line.lstrip().startswith("|") and tuple(_cells(line)) == COLUMNS]
    if len(headers) != 1:
        raise ValueError(f"{DOC.name}: expected one table with columns {COLUMNS}, found {len(headers)}")
    rows = []
    for line in lines[headers[0] + 2 :]:
        if not line.lstrip().startswith("|"):
            break
        cells = _cells(line)
        if len(cells) != len(COLUMNS):
            raise ValueError(f"{DOC.name}: a row has {len(cells)} cells, not {len(COLUMNS)}: {line[:80]}")
        target = cells[3]
        if len(target) > 1 and target.startswith("`") and target.endswith("`"):
            target = target[1:-1]
        rows.append(Row(cells[0], cells[1], cells[2], target, cells[4], cells[5], cells[6]))
    return rows


def parse_target(target: str) -> tuple[list[Spec], list[str]]:
    """The specs of a target and the distributions its `[needs ...]` names."""
    needs: list[str] = []
    match = NEEDS_RE.search(target)
    if match:
        needs = [name.strip() for name in match.group(1).split(",") if name.strip()]
        target = target[: match.start()]
    specs = []
    for text in target.split(" ; "):
        text = text.strip()
        m = SPEC_RE.match(text)
        if m is None:
            raise ValueError(f"not a target spec: {text!r}")
        params = None
        if m["params"] is not None:
            params = tuple(p.strip() for p in m["params"].split(",") if p.strip())
        mentions = tuple(x.strip() for x in m["mentions"].split(",") if x.strip()) if m["mentions"] else ()
        path = tuple(m["path"].split(".")) if m["path"] else ()
        specs.append(Spec(text, m["module"], path, params, mentions, m["value"]))
    return specs, needs


# ------------------------------------------------------------------------------------------------------ checking
def _params_match(actual: list[str], pattern: tuple[str, ...]) -> bool:
    """`actual` matches `pattern`, where `...` stands for any number of parameters."""
    if not pattern:
        return not actual
    head, rest = pattern[0], pattern[1:]
    if head == "...":
        return any(_params_match(actual[i:], rest) for i in range(len(actual) + 1))
    return bool(actual) and actual[0] == head and _params_match(actual[1:], rest)


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _import(module: str, row: Row) -> types.ModuleType:
    """The module, or a skip when only a package outside the module's own library is missing."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        missing = err.name or ""
        if missing and missing.split(".")[0] != module.split(".")[0]:
            pytest.skip(f"row {row.id}: {module} needs {missing}, which is not installed")
        raise LookupError(f"module {module} cannot be imported ({err}): removed or renamed upstream?") from err


def check_spec(spec: Spec, row: Row) -> list[str]:
    """What no longer holds of one spec (empty: all of it holds)."""
    try:
        obj = _import(spec.module, row)
    except LookupError as err:
        return [f"`{spec.text}`: {err}"]
    for i, part in enumerate(spec.path):
        if not hasattr(obj, part):
            owner = ":".join([spec.module, ".".join(spec.path[:i])]) if i else spec.module
            return [f"`{spec.text}`: {owner} has no attribute {part!r} (removed or renamed upstream?)"]
        obj = getattr(obj, part)
    target = obj.fget if isinstance(obj, property) else obj
    problems = []
    if spec.params is not None:
        try:
            actual = list(inspect.signature(target).parameters)
        except (TypeError, ValueError) as err:
            return [f"`{spec.text}`: no signature to check ({err})"]
        if not _params_match(actual, spec.params):
            named = [p for p in spec.params if p != "..."]
            missing = [p for p in named if p not in actual]
            detail = f"lacks parameter(s) {', '.join(missing)}" if missing else "has them in another order or more"
            problems.append(f"`{spec.text}`: signature ({', '.join(actual)}) {detail}")
    if spec.mentions:
        try:
            source = _squash(inspect.getsource(target))
        except (OSError, TypeError) as err:
            return [*problems, f"`{spec.text}`: no source to look in ({err})"]
        for mention in spec.mentions:
            absent = mention.startswith("!")
            fragment = _squash(mention[1:] if absent else mention)
            if absent and fragment in source:
                problems.append(f"`{spec.text}`: its source now contains {fragment!r}")
            elif not absent and fragment not in source:
                problems.append(f"`{spec.text}`: its source no longer contains {fragment!r}")
    if spec.value is not None:
        expected = ast.literal_eval(spec.value)
        if obj != expected:
            problems.append(f"`{spec.text}`: is {obj!r}, the row expects {expected!r}")
    return problems


def check_row(row: Row, version: Callable[[str], str] = importlib.metadata.version) -> list[str]:
    """What no longer holds of `row`; skips (pytest.skip) when it cannot be checked here."""
    try:
        installed = version(row.library)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"row {row.id}: {row.library} is not installed")
    specs, needs = parse_target(row.target)
    for dist in needs:
        try:
            version(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"row {row.id}: needs {dist}, which is not installed")
    problems = []
    if Version(installed).public != Version(row.checked_on).public:
        problems.append(
            f"row {row.id} was checked on {row.library} {row.checked_on}, installed "
            f"{Version(installed).public}: re-check it and update the row"
        )
    for spec in specs:
        problems += check_spec(spec, row)
    return problems


def assert_row(row: Row, **kwargs) -> None:
    problems = check_row(row, **kwargs)
    if problems:
        pytest.fail(f"row {row.id} ({row.where}):\n  " + "\n  ".join(problems), pytrace=False)


ROWS = parse_table(DOC.read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------------ the rows
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_row_still_holds(row: Row):
    assert_row(row)


def test_table_is_well_formed():
    assert len(ROWS) >= 7
    ids = [row.id for row in ROWS]
    assert len(ids) == len(set(ids)), f"duplicate ids: {sorted({i for i in ids if ids.count(i) > 1})}"
    for row in ROWS:
        for column, value in zip(COLUMNS, (row.id, row.library, row.checked_on, row.target, row.where, row.what)):
            assert value and value != "—", f"row {row.id or '?'}: empty {column}"
        assert row.upstream, f"row {row.id}: empty upstream (write — when none)"
        assert ID_RE.fullmatch(row.id), f"row {row.id}: id is not kebab-case"
        assert row.library in LIBRARIES, f"row {row.id}: unknown library {row.library!r}"
        try:
            checked = Version(row.checked_on)
        except InvalidVersion:
            pytest.fail(f"row {row.id}: checked on {row.checked_on!r} is not a version")
        assert str(checked) == checked.public == row.checked_on, f"row {row.id}: write the public version only"
        specs, needs = parse_target(row.target)  # raises on a malformed spec
        assert all(spec.path or spec.mentions for spec in specs), f"row {row.id}: a spec checks nothing but import"
        assert set(needs) <= LIBRARIES, f"row {row.id}: unknown distribution in [needs ...]"
        assert "/" not in row.where and ".py" not in row.where, f"row {row.id}: `where` names code, not a file"


# ------------------------------------------------------------------------------------------------------ the checker
def fake_row(target: str, checked_on: str = "1.0.0", library: str = "trl") -> Row:
    return Row("planted", library, checked_on, target, "tests.test_internals", "a planted upstream change", "—")


def installed(at: str = "1.0.0") -> Callable[[str], str]:
    return lambda dist: at


UPSTREAM_SOURCE = """\
CHUNK = 4096


class Trainer:
    def __init__(self, args):
        self._metrics = {}

    def _step(self, inputs, num_generations, flag=False):
        return self._generate(inputs)
"""


@pytest.fixture
def upstream(tmp_path, monkeypatch) -> types.ModuleType:
    """A fake library module, as if upstream shipped it, registered in `sys.modules` for the test only."""
    path = tmp_path / "fake_upstream.py"
    path.write_text(UPSTREAM_SOURCE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("fake_upstream", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(sys.modules, "fake_upstream", module)
    return module


def problems_of(target: str, **kwargs) -> list[str]:
    return check_row(fake_row(target, **kwargs), version=installed())


def test_checker_passes_what_holds(upstream):
    assert problems_of("fake_upstream:Trainer._step(self, inputs, num_generations, flag) {self._generate(}") == []
    assert problems_of("fake_upstream:Trainer.__init__ {self._metrics =, !self._logs}") == []
    assert problems_of("fake_upstream:CHUNK == 4096 ; fake_upstream:Trainer._step(self, ..., flag)") == []
    assert problems_of("json:dumps(obj, ..., skipkeys, ..., sort_keys, ...)") == []


def test_checker_catches_a_removed_attribute(upstream):
    del upstream.Trainer._step
    (problem,) = problems_of("fake_upstream:Trainer._step(self, inputs, num_generations, flag)")
    assert "has no attribute '_step'" in problem


def test_checker_catches_a_lost_parameter():
    (problem,) = problems_of("json:dumps(obj, skipkeys, ...) ; json:dumps(obj, ..., no_such_parameter, ...)")
    assert "lacks parameter(s) no_such_parameter" in problem
    (problem,) = problems_of("json:dumps(obj, skipkeys)")  # exact: upstream added parameters
    assert "another order or more" in problem


def test_checker_catches_changed_source_and_values(upstream):
    problems = problems_of("fake_upstream:Trainer._step {self._generate_single_turn(, !self._generate(}")
    assert len(problems) == 2
    assert "no longer contains 'self._generate_single_turn('" in problems[0]
    assert "now contains 'self._generate('" in problems[1]
    (problem,) = problems_of("fake_upstream:CHUNK == 8192")
    assert "is 4096, the row expects 8192" in problem


def test_checker_catches_a_version_bump_naming_the_row(upstream):
    row = fake_row("fake_upstream:CHUNK == 4096", checked_on="1.16.0")
    (problem,) = check_row(row, version=installed("1.17.0"))
    assert problem == "row planted was checked on trl 1.16.0, installed 1.17.0: re-check it and update the row"
    assert check_row(row, version=installed("1.16.0+cpu")) == []  # a local build of the same release
    with pytest.raises(pytest.fail.Exception, match=r"row planted \(tests.test_internals\)"):
        assert_row(row, version=installed("1.17.0"))


def test_checker_catches_a_removed_module():
    (problem,) = problems_of("json.no_such_module:dumps")
    assert "module json.no_such_module cannot be imported" in problem


def test_checker_skips_an_uninstalled_library():
    row = fake_row("no_such_library_xyz.module:thing", library="no-such-distribution-xyz")
    with pytest.raises(pytest.skip.Exception, match="no-such-distribution-xyz is not installed"):
        check_row(row)

    def version(dist: str) -> str:
        if dist == "trl":
            return "1.0.0"
        raise importlib.metadata.PackageNotFoundError(dist)

    with pytest.raises(pytest.skip.Exception, match="needs no-such-distribution-xyz"):
        check_row(fake_row("json:dumps [needs no-such-distribution-xyz]"), version=version)


def test_checker_skips_a_missing_optional_dependency(tmp_path, monkeypatch):
    (tmp_path / "fake_lib_needing_dep.py").write_text("import no_such_optional_dependency_xyz\nthing = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_lib_needing_dep", raising=False)
    with pytest.raises(pytest.skip.Exception, match="needs no_such_optional_dependency_xyz"):
        problems_of("fake_lib_needing_dep:thing")


def test_a_planted_change_to_a_real_row_names_it():
    """A real row with a parameter renamed, as an upstream rename would look: it fails and says which row."""
    row = next(r for r in ROWS if r.id == "mapo-calculate-rewards")
    planted = replace(row, target=row.target.replace("completion_ids_list", "completion_ids"))
    problems = check_row(planted)
    assert problems and "lacks parameter(s) completion_ids" in problems[-1]
    with pytest.raises(pytest.fail.Exception, match="row mapo-calculate-rewards"):
        assert_row(planted)
