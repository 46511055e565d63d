"""`CodeReader` (DeepEyesV2's and Thyme's crops read with `ast`) against code no release was meant to hold (issue 49,
item 7): a number no image coordinate needs is `unsupported_code` before it is built, a row's code has a time limit
(`slow_code`), and generated code never raises anything but a counted skip nor builds a huge integer. The release
forms the reader must read are in tests/test_convert.py."""

from __future__ import annotations

import itertools
import math
import operator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data import convert
from data.converters import code_reader
from data.converters.code_reader import MAX_NUMBER, CodeReader, Module, OriginalPath
from data.converters.common import SkipRow
from data.converters.thyme import ThymeSandboxRewrites, parse_thyme_code
from tests.release_fixtures import SIZE, deepeyes_v2_record, write_deepeyes_v2
from tools import ToolConfig

# An integer operation of the reader may build at most this many bits: its operands are within MAX_NUMBER (53 bits),
# so a product takes 106; a power is refused before it is computed when it would pass 53.
MAX_BITS = 2 * MAX_NUMBER.bit_length()


def _bits(value) -> int:
    return abs(value).bit_length() if isinstance(value, int) else 0


def _guarded(name: str, apply):
    """`apply`, refusing (AssertionError) to build an integer over MAX_BITS: checked on the operands and, for the
    operations whose result can outgrow them by more than a bit, on the size the result would have, before it is
    computed."""

    def guarded(*args):
        assert all(_bits(a) <= MAX_BITS for a in args), (name, [_bits(a) for a in args])
        if name == "pow" and isinstance(args[0], int) and isinstance(args[1], int) and abs(args[0]) > 1:
            assert args[1] * math.log2(abs(args[0])) <= MAX_BITS, f"{args[0]} ** {args[1]} would be built"
        if name == "round" and len(args) > 1:
            assert abs(args[1]) <= 64, f"round to {args[1]} digits computes 10 ** {abs(args[1])}"
        result = apply(*args)
        assert _bits(result) <= MAX_BITS, (name, _bits(result))
        return result

    return guarded


@pytest.fixture
def guard(monkeypatch):
    """Every arithmetic operation and number function the reader applies, guarded by `_guarded`."""
    _install_guard(monkeypatch)


def _install_guard(monkeypatch):
    binops = {
        kind: _guarded(getattr(apply, "__name__", str(apply)), apply) for kind, apply in code_reader._BINOPS.items()
    }
    functions = {name: _guarded(name, apply) for name, apply in code_reader._NUMBER_FUNCS.items()}
    monkeypatch.setattr(code_reader, "_BINOPS", binops)
    monkeypatch.setattr(code_reader, "_NUMBER_FUNCS", functions)


def v2_reader(**kwargs) -> CodeReader:
    return CodeReader(SIZE, {}, "display", original_as="image_1", **kwargs)


# Code computing a number no image coordinate needs before (or for) its crop: each one would take seconds to
# gigabytes if evaluated (`10 ** 10 ** 9`: over 15 s and growing, issue 49), and each is refused before it is built.
HUGE = {
    "the issue's power": "x = 10 ** 10 ** 9\ndisplay(image_1.crop((0, 0, 60, 60)))",
    "a power tower": "x = 2 ** 2 ** 2 ** 2 ** 2",
    "a power of a product": "a = 10 ** 9\nb = (a * a) ** a",
    "repeated squaring": "x = 2 ** 40\n" + "x = x * x\n" * 30,
    "an augmented power": "x = 3\nx **= 10 ** 8",
    "a round to a billion digits": "x = round(5, -10 ** 9)",
    "a literal of 400 digits": "x = " + "9" * 400 + "\ny = x + 1",
    "a list doubled 30 times": "a = [0]\n" + "a = a + a\n" * 30,
    "a negated power": "x = -(7 ** 10 ** 7)",
}


@pytest.mark.parametrize("case", HUGE)
def test_a_number_no_coordinate_needs_is_unsupported_code_and_never_built(guard, case):
    """Issue 49, item 7, the done-when: the huge-power row is skipped at once. No wall clock is asserted: the guard
    fails the test if any operation would build an integer over MAX_BITS, which is what took the time. Planted: with
    `_binop`'s bound on `**` removed, the issue's power trips the guard (`10 ** 1000000000 would be built`)."""
    with pytest.raises(SkipRow) as skip:
        v2_reader().run(HUGE[case])
    assert skip.value.reason == "unsupported_code", skip.value
    assert (
        "no image coordinate needs" in skip.value.detail
        or "items" in skip.value.detail
        or "digits" in skip.value.detail
    )


def test_the_huge_power_row_is_skipped_by_the_converter_and_counted(guard, tmp_path):
    """The same code in a DeepEyesV2 row, converted: the row is skipped on `unsupported_code`, quoting the statement;
    the next row converts."""
    crop = "display(image_1.crop((240, 90, 300, 150)))"
    huge = deepeyes_v2_record([crop], image_name="0.png")  # the fixture runs its cells: the power is written after
    huge[0]["messages"][2]["content"] = huge[0]["messages"][2]["content"].replace(crop, f"x = 10 ** 10 ** 9\n{crop}")
    good = deepeyes_v2_record([crop], image_name="1.png")
    root = write_deepeyes_v2(tmp_path / "in", [huge, good])
    kept, stats = convert.convert("deepeyes_v2_sft", root, ToolConfig())
    assert stats["rows_skipped"] == {"unsupported_code": 1} and len(kept) == 1
    assert "`x = 10 ** 10 ** 9`" in stats["skipped_examples"]["unsupported_code"][0]


def test_numbers_within_the_bound_are_read_as_before():
    """The bound is far above what coordinates need: sizes, products of sizes and powers that fit keep working."""
    reader = v2_reader()
    shown = reader.run("w, h = image_1.size\narea = w * h * 2 ** 20\nside = int((area / 2 ** 20) ** 0.5 / 5)\n"
                       "display(image_1.crop((240, 90, 240 + side, 90 + side)))")  # fmt: skip
    assert reader.env["area"] == 400 * 300 * 2**20 and reader.env["side"] == 69
    assert [s.picture.extent for s in shown] == [(240.0, 90.0, 309.0, 159.0)]
    assert reader.run("x = ~5\ny = -x") == [] and (reader.env["x"], reader.env["y"]) == (-6, 6)  # ~ was read as +


def test_a_rows_code_has_a_time_limit_over_all_its_turns():
    """`slow_code` once the row's evaluation passes its limit, summed over the row's code turns (a kernel's). The
    clock is a counter (one tick per reading), so the test does not depend on the machine's speed. Planted: with
    `run` restarting the budget each turn, the fourth turn converts and the test fails."""
    ticks = itertools.count()
    reader = v2_reader(seconds=10, clock=lambda: next(ticks))
    for _ in range(3):  # each: the start, a statement's check, its value's check, the end: 3 ticks spent
        assert reader.run("a = 1") == []
    assert reader.seconds_left == 1
    with pytest.raises(SkipRow) as skip:
        reader.run("a = 1")
    assert skip.value.reason == "slow_code" and "over 10 s" in str(skip.value)


def test_a_slow_row_is_skipped_by_the_converter_on_its_reason(tmp_path, monkeypatch):
    """The converter counts `slow_code` (a limit already spent, so every row's first check trips)."""
    monkeypatch.setattr(code_reader, "CODE_SECONDS_PER_ROW", -1.0)
    root = write_deepeyes_v2(tmp_path / "in", [deepeyes_v2_record(["display(image_1.crop((240, 90, 300, 150)))"])])
    kept, stats = convert.convert("deepeyes_v2_sft", root, ToolConfig())
    assert kept == [] and stats["rows_skipped"] == {"slow_code": 1}


def test_code_the_parser_cannot_hold_is_malformed_not_a_crash():
    """A sum of 5,000 terms overflows `ast.parse`'s recursion (RecursionError, not SyntaxError), and a literal of 5,000
    digits passes Python's int conversion limit: both are `malformed_call` (they crashed the converter before)."""
    for code in ("x = 1" + " + 1" * 5000, "x = " + "9" * 5000):
        with pytest.raises(SkipRow) as skip:
            v2_reader().run(code)
        assert skip.value.reason == "malformed_call"
        with pytest.raises(SkipRow) as skip:
            parse_thyme_code(code)
        assert skip.value.reason == "malformed_call"


# ------------------------------------------------------------------------------------------------------- fuzzing
NAMES = ("a", "b", "w", "h", "x1", "y1", "box", "crop")
OPERATORS = ("+", "-", "*", "/", "//", "%", "**", "<<", ">>", "&", "|", "^")
HUGE_LITERALS = ("2 ** 53", "2 ** 64", "10 ** 18", "1e308", "-1e308", "1e999", "9" * 30, "9" * 400, "0x" + "f" * 40)
numbers = st.one_of(
    st.integers(-(10**6), 10**6).map(str),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=False, allow_infinity=False, width=32).map(repr),
    st.sampled_from(HUGE_LITERALS),
)
atoms = st.one_of(
    numbers, st.sampled_from(NAMES), st.sampled_from(("image_1.size", "image_1.width", "image_1.height"))
)


def _extend(inner):
    return st.one_of(
        st.tuples(inner, st.sampled_from(OPERATORS), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(st.sampled_from(("-", "+", "~", "not ")), inner).map(lambda t: f"({t[0]}{t[1]})"),
        st.tuples(st.sampled_from(("int", "float", "abs", "round", "math.floor", "math.sqrt", "len")), inner).map(
            lambda t: f"{t[0]}({t[1]})"
        ),
        st.tuples(st.sampled_from(("round", "max", "min", "pow")), inner, inner).map(
            lambda t: f"{t[0]}({t[1]}, {t[2]})"
        ),
        st.tuples(inner, inner).map(lambda t: f"({t[0]}, {t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"[{t[0]}] * ({t[1]})"),
        st.tuples(inner, inner).map(lambda t: f"({t[0]})[{t[1]}]"),
        st.tuples(inner, inner, inner).map(lambda t: f"({t[0]} if {t[1]} else {t[2]})"),
        st.tuples(inner, st.sampled_from(("<", "==", "is", ">=")), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    )


expressions = st.recursive(atoms, _extend, max_leaves=12)
statements = st.one_of(
    st.tuples(st.sampled_from(NAMES), expressions).map(lambda t: f"{t[0]} = {t[1]}"),
    st.tuples(st.sampled_from(NAMES), st.sampled_from(OPERATORS), expressions).map(lambda t: f"{t[0]} {t[1]}= {t[2]}"),
    st.tuples(expressions, expressions).map(lambda t: f"x1, y1 = {t[0]}, {t[1]}"),
    st.lists(numbers, min_size=4, max_size=4).map(lambda b: f"x1, y1, x2, y2 = {', '.join(b)}"),
    st.just("crop = image_1.crop((x1, y1, x2, y2))"),
    st.lists(expressions, min_size=4, max_size=4).map(lambda b: f"crop = image_1.crop(({', '.join(b)}))"),
    st.tuples(expressions, st.sampled_from(NAMES), expressions).map(lambda t: f"if {t[0]}:\n    {t[1]} = {t[2]}"),
    st.just("display(crop)"),
    st.just("import math"),
    expressions,
)
blocks = st.tuples(st.lists(statements, min_size=1, max_size=8), st.sampled_from(("", "  ", "    ")))


def _numbers_held(value):
    if isinstance(value, tuple | list):
        for item in value:
            yield from _numbers_held(item)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        yield value


def thyme_reader(**kwargs) -> CodeReader:
    """Thyme's reader (`data.converters.thyme`: its parse and its sandbox's rewrites), the original also as
    `image_1` so that the generated crops apply to both readers."""
    path = OriginalPath("/data/0001.jpg")
    rewrite = ThymeSandboxRewrites(SIZE, path).visit
    names = {"image_path": path, "cv2": Module("cv2"), "np": Module("numpy")}
    return CodeReader(SIZE, names, "save", original_as="image_1", rewrite=rewrite, parse=parse_thyme_code, **kwargs)


@settings(max_examples=200, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(blocks, min_size=1, max_size=3), st.booleans())
def test_generated_code_only_ever_reads_or_skips(turns, thyme):
    """Generated code (numbers up to 10^30 and past 2**53, every arithmetic operator, calls, tuples, repetition,
    indexing, conditionals, augmented assignments, crops, four literals unpacked into x1, y1, ... as Thyme's sandbox
    clamps them), indented or not, over several turns of one row, by DeepEyesV2's reader and by Thyme's: the reader
    returns what the code showed or raises a `SkipRow`, nothing else; no integer operation builds over MAX_BITS; every
    number it keeps is within MAX_NUMBER. Derandomized: the same 200 programs every run. Each of these crashed or
    misread before issue 49: a RecursionError of `ast.parse`, a literal of 400 digits in a crop (`float()` overflows),
    `~x` (read as `+x`), an infinite literal unpacked into x1, ... (the clamp's `int(round(inf))`)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _install_guard(monkeypatch)
        reader = (thyme_reader if thyme else v2_reader)(seconds=60)  # the time limit: tested above
        for lines, indent in turns:
            code = "\n".join(indent + line.replace("\n", "\n" + indent) for line in lines)
            try:
                shown = reader.run(code)
            except SkipRow as skip:
                assert skip.reason in ("unsupported_code", "malformed_call"), skip
                return
            assert all(isinstance(s, code_reader.Shown) for s in shown)
            held = [v for value in reader.env.values() for v in _numbers_held(value)]
            assert all(abs(v) <= MAX_NUMBER for v in held), max(held, key=abs)


def test_the_guard_catches_a_huge_power():
    """The fuzz's guard can fail: applied to the issue's power, it refuses before computing."""
    with pytest.raises(AssertionError, match="would be built"):
        _guarded("pow", operator.pow)(10, 10**9)
