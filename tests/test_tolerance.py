"""The suite's float tolerances (`tests/tolerance.py`): the bound holds for a float32 sum in any order and fails when
the reduction's length is left out, and no comparison in tests/ falls back on a library's default tolerance."""

import ast
from pathlib import Path

import pytest
import torch

from tests.tolerance import FLOAT32, FLOAT64, approx, assert_norm_close, deviation_condition, tolerance

TESTS = Path(__file__).resolve().parent
# A comparison and the keywords that state its tolerance, all of which it must name. pytest.approx needs only `abs`:
# given alone, pytest drops the relative tolerance; given `rel` alone, it keeps its default `abs` (1e-12).
STATED = {
    ("pytest", "approx"): ("abs",),
    ("torch", "allclose"): ("rtol", "atol"),
    ("torch", "isclose"): ("rtol", "atol"),
    ("np", "allclose"): ("rtol", "atol"),
    ("np", "isclose"): ("rtol", "atol"),
    ("testing", "assert_close"): ("rtol", "atol"),
    ("testing", "assert_allclose"): ("rtol", "atol"),
    ("math", "isclose"): ("rel_tol", "abs_tol"),
}


def defaults(path: Path) -> list[str]:
    """`file:line call` of each comparison in `path` that leaves a tolerance to its library's default."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "pytest"
            and any(a.name == "approx" for a in node.names)
        ):
            found.append(f"{path.name}:{node.lineno} from pytest import approx")
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner = node.func.value
        name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", None)
        needed = STATED.get((name, node.func.attr))
        given = {k.arg for k in node.keywords}
        if needed and None not in given and not set(needed) <= given:  # None: **kwargs, stated elsewhere
            found.append(f"{path.name}:{node.lineno} {name}.{node.func.attr}")
    return found


def test_no_comparison_in_the_suite_uses_a_default_tolerance():
    """pytest.approx's default (1e-6 relative) held on one CPU and failed on another (issue 49); torch's (1e-5, 1e-8)
    is no better argued. Every comparison names its tolerance, or uses tests/tolerance.py's."""
    found = [hit for path in sorted(TESTS.rglob("*.py")) for hit in defaults(path)]
    assert not found, found


def test_the_scan_sees_a_default(tmp_path):
    planted = tmp_path / "test_planted.py"
    planted.write_text(
        "import pytest, torch, math\n"
        "assert 0.1 == pytest.approx(0.1)\n"
        "assert 0.1 == pytest.approx(0.1, rel=1e-7)\n"  # abs left to the default (1e-12)
        "assert 0.1 == pytest.approx(0.1, abs=1e-9)\n"  # stated: pytest then ignores rel
        "assert torch.allclose(torch.ones(1), torch.ones(1), atol=0)\n"
        "assert math.isclose(1, 1, rel_tol=0, abs_tol=0)\n"
        "assert torch.testing.assert_close(1.0, 1.0, **{'rtol': 0, 'atol': 0}) is None\n"
    )
    lines = sorted(hit.split(" ")[0].split(":")[1] for hit in defaults(planted))
    assert lines == ["2", "3", "5"]


def test_a_float32_sum_in_any_order_stays_within_its_bound_and_not_within_one_rounding():
    """10,000 float32 terms of one sign (condition 1), summed forwards, backwards and by torch's blocked kernel,
    against the float64 sum: each within terms x eps; a bound that forgot the length (terms=1) is exceeded."""
    values = torch.rand(10_000, generator=torch.Generator().manual_seed(0)) + 0.5
    exact = float(values.double().sum())
    forwards, backwards = torch.zeros((), dtype=FLOAT32), torch.zeros((), dtype=FLOAT32)
    for v in values:
        forwards += v
    for v in values.flip(0):
        backwards += v
    sums = [float(forwards), float(backwards), float(values.sum())]
    assert sums == [approx(exact, terms=len(values))] * 3
    assert float(forwards) != approx(exact, terms=1)  # the sequential sum's error grows with its length
    # cancellation: the same sum, minus its float64 value's float32 rounding, has an unbounded relative error
    shifted = torch.cat([values, -values[:9_999]])
    kappa = float(shifted.abs().sum() / shifted.sum().abs())
    assert float(shifted.sum()) == approx(float(shifted.double().sum()), terms=len(shifted), condition=kappa)


def test_the_bound_is_the_stated_formula():
    eps32, eps64 = torch.finfo(torch.float32).eps, torch.finfo(torch.float64).eps
    assert (eps32, eps64) == (2**-23, 2**-52)
    assert tolerance(terms=100, condition=3, scale=2) == {"rel": 300 * eps32, "abs": 200 * eps32}
    assert tolerance(FLOAT64, terms=4) == {"rel": 4 * eps64, "abs": 0.0}
    with pytest.raises(ValueError, match="terms >= 1"):
        tolerance(terms=0)
    # group-normalised advantages: 1.08 and 1.32 deviate +-0.12 from 1.2, a cancellation of 2.4 / 0.24 = 10
    assert deviation_condition([1.2, 0.2, 1.08, 1.32], 2) == approx(10.0, FLOAT64, terms=8)
    assert deviation_condition([1.0, 1.0, float("nan"), 0.5], 2) == 1.0  # equal values and a lone scorable one
    assert_norm_close(torch.tensor([1.0, 1e-9]), torch.tensor([1.0, 0.0]), terms=1)  # normwise, not entrywise
    with pytest.raises(AssertionError, match="terms=1"):
        assert_norm_close(torch.tensor([1.0, 1e-6]), torch.tensor([1.0, 0.0]), terms=1)
