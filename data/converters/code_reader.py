"""`CodeReader`: DeepEyesV2's and Thyme's crops, Python read with `ast` the way their sandboxes ran it, never run and
never pattern-matched (what it evaluates, and what skips a row: docs/data.md, "Code turns")."""

from __future__ import annotations

import ast
import contextlib
import math
import operator
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from data.converters.code_values import (
    CODE_SECONDS_PER_ROW,
    MAX_CODE_CHARS,
    MAX_CODE_LINES,
    MAX_DETAIL,
    MAX_ITEMS,
    MAX_NUMBER,
    MAX_ROUND_DIGITS,
    OPAQUE,
    Module,
    OriginalPath,
    Picture,
    Shown,
    _Bound,
    _bounded,
    _Enhancer,
    _is_number,
    _items_over,
    _Opaque,
    _power_bits,
    _quoting,
    _shown,
    _unsupported,
)
from data.converters.common import SkipRow
from data.converters.replay import ReadCall
from data.quoting import cut

# How the reader evaluates, beside `CodeReader`, which looks these tables up here (a test swaps the arithmetic and
# number functions for guarded ones); what values it holds and its bounds: `data.converters.code_values`.
_ALIASES = {"np": "numpy", "plt": "matplotlib.pyplot"}
# Operations that change an image's colours, not its geometry: a crop of their result is a crop of the original.
_ENHANCE = {
    "cv2.cvtColor", "cv2.GaussianBlur", "cv2.medianBlur", "cv2.blur", "cv2.bilateralFilter", "cv2.convertScaleAbs",
    "cv2.equalizeHist", "cv2.filter2D", "cv2.detailEnhance", "cv2.addWeighted", "cv2.normalize", "cv2.bitwise_not",
    "numpy.clip", "numpy.uint8", "numpy.array", "numpy.asarray", "numpy.ascontiguousarray", "numpy.copy",
    "PIL.ImageOps.autocontrast", "PIL.ImageOps.equalize", "PIL.ImageOps.grayscale", "PIL.ImageOps.invert",
    "PIL.ImageOps.posterize", "PIL.ImageOps.solarize", "PIL.Image.fromarray",
}  # fmt: skip
_PICTURE_ENHANCE = {"convert", "copy", "filter", "astype", "point", "__array__"}
_GEOMETRY = {"rotate", "transpose", "transform", "thumbnail", "reduce", "expand", "flip", "warpAffine", "rot90"}
_NUMBER_FUNCS: dict[str, Callable] = {
    "int": int, "float": float, "round": round, "abs": abs, "min": min, "max": max, "len": len, "sum": sum,
    "tuple": tuple, "list": list, "math.floor": math.floor, "math.ceil": math.ceil, "math.sqrt": math.sqrt,
    "numpy.floor": math.floor, "numpy.ceil": math.ceil, "numpy.round": round, "numpy.int32": int, "numpy.int64": int,
}  # fmt: skip
_BINOPS: dict[type, Callable] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow,
}  # fmt: skip
_COMPARE: dict[type, Callable] = {
    ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
}  # fmt: skip


class CodeReader:
    """Evaluates `ast` statements over the values crops depend on, so crops become boxes on the original; names persist
    from one code turn to the next (a Jupyter kernel, Thyme's saved context). `run(code)` returns what the code showed
    (`Shown`); anything it cannot evaluate faithfully raises `SkipRow("unsupported_code")`. `shows`: "display"
    (DeepEyesV2's Jupyter) or "save" (Thyme's sandbox returns the images the code writes)."""

    def __init__(
        self,
        size: tuple[int, int],
        names: dict[str, Any],
        shows: str,
        original_as: str | None = None,
        rewrite: Callable[[ast.Module], ast.Module] | None = None,
        parse: Callable[[str], ast.Module] | None = None,
        seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        assert shows in ("display", "save"), shows
        self.parse = parse or parse_code  # how the sandbox reads the code's text (Thyme's: `thyme.parse_thyme_code`)
        self.rewrite = rewrite  # what the sandbox does to the code before it runs it (Thyme's: `ThymeSandboxRewrites`)
        self.seconds = CODE_SECONDS_PER_ROW if seconds is None else seconds  # the row's time limit, and its clock
        self.seconds_left, self.clock, self.deadline = self.seconds, clock, math.inf
        self.original = Picture((0.0, 0.0, float(size[0]), float(size[1])), size, array=False)
        self.env: dict[str, Any] = dict(names)
        if original_as is not None:  # DeepEyesV2's kernel holds the original as `image_1`
            self.env[original_as] = self.original
        self.shows = shows
        self.shown: list[Shown] = []
        self.figure: Picture | None = None

    # ------------------------------------------------------------------------------------------------ statements
    def run(self, code: str) -> list[Shown]:
        """What one code turn showed. The row's time limit counts down over its turns: past it, `SkipRow("slow_code")`."""
        start = self.clock()
        self.deadline = start + self.seconds_left
        try:
            return self._run(code)
        except RecursionError:  # nesting deeper than Python's stack: no crop is written so
            raise SkipRow("unsupported_code", "expressions nested too deeply to read") from None
        except SkipRow as skip:  # the net under every message built below: stats.json keeps each skip's text
            if len(skip.detail) <= MAX_DETAIL:
                raise
            short = SkipRow(skip.reason, cut(skip.detail, MAX_DETAIL))
            short.statement = skip.statement
            raise short from None
        finally:
            self.seconds_left -= self.clock() - start
            self.deadline = math.inf

    def _check_time(self) -> None:
        if self.clock() > self.deadline:
            raise SkipRow("slow_code", f"over {self.seconds:g} s reading the row's code")

    def _run(self, code: str) -> list[Shown]:
        self.shown, self.figure = [], None
        self._check_time()  # a limit the row's earlier turns spent: this turn is not even parsed
        lines = code.count("\n") + 1
        if len(code) > MAX_CODE_CHARS or lines > MAX_CODE_LINES:
            raise SkipRow("unsupported_code", f"a code turn of {len(code):,} characters and {lines:,} lines, over the "
                          f"reader's {MAX_CODE_CHARS:,} and {MAX_CODE_LINES:,}: not parsed")  # fmt: skip
        tree = self.parse(code)
        if self.rewrite is not None:
            tree = self.rewrite(tree)
        self._check_time()  # parsing and the rewrite count against the limit
        for i, statement in enumerate(tree.body):
            last = i == len(tree.body) - 1
            if last and self.shows == "display" and isinstance(statement, ast.Expr):
                with _quoting(statement):
                    value = self.eval(statement.value)
                if isinstance(value, Picture):  # Jupyter displays a cell's last value
                    self._show(value, "display")
            else:
                self.statement(statement)
        if self.figure is not None and self.shows == "display":  # the inline backend shows open figures at the end
            self._show(self.figure, "figure")
        return self.shown

    def statements(self, body: Sequence[ast.stmt]) -> None:
        for statement in body:
            self.statement(statement)

    def statement(self, node: ast.stmt) -> None:
        with _quoting(node):
            self._statement(node)

    def _statement(self, node: ast.stmt) -> None:
        self._check_time()
        if isinstance(node, ast.Import | ast.ImportFrom):
            self._import(node)
        elif isinstance(node, ast.Assign):
            value = self.eval(node.value)
            for target in node.targets:
                self.assign(target, value)
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            self.assign(node.target, self.eval(node.value))
        elif isinstance(node, ast.AugAssign):
            self.assign(node.target, self._binop(node.op, self.eval(node.target), self.eval(node.value), node))
        elif isinstance(node, ast.Expr):
            self.eval(node.value)
        elif isinstance(node, ast.If):
            test = self.eval(node.test)
            if not isinstance(test, bool | int | float) or isinstance(test, _Opaque):
                raise _unsupported(node, "an `if` whose test the reader cannot decide")
            self.statements(node.body if test else node.orelse)
        elif isinstance(node, ast.Try):
            # The sandbox ran the body; had it raised, the release would show no image after the turn (checked).
            self.statements(node.body)
            self.statements(node.orelse)
            self.statements(node.finalbody)
        elif isinstance(node, ast.With):
            for item in node.items:
                value = self.eval(item.context_expr)
                if item.optional_vars is not None:
                    self.assign(item.optional_vars, value)
            self.statements(node.body)
        elif isinstance(node, ast.Pass | ast.Assert | ast.Delete | ast.Global | ast.Nonlocal):
            pass
        else:
            raise _unsupported(node, f"a `{type(node).__name__}` statement")

    def _import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            if isinstance(node, ast.Import):
                full = alias.name
                bound = alias.asname or full.split(".")[0]
                self.env[bound] = Module(full if alias.asname else full.split(".")[0])
            else:
                self.env[alias.asname or alias.name] = Module(f"{node.module}.{alias.name}")

    def assign(self, target: ast.expr, value: Any) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, ast.Tuple | ast.List):
            if isinstance(value, _Opaque):  # `name, ext = os.path.splitext(...)`: nothing a crop reads
                for element in target.elts:
                    self.assign(element, OPAQUE)
                return
            if not isinstance(value, tuple | list) or len(value) != len(target.elts):
                raise _unsupported(target, f"unpacking {_shown(value)} into {len(target.elts)} names")
            for element, item in zip(target.elts, value):
                self.assign(element, item)
        elif isinstance(target, ast.Subscript):
            owner = self.eval(target.value)
            if isinstance(owner, Picture):  # drawing into an array: same geometry, other colours
                self.assign(target.value, replace(owner, made_by=f"{owner.made_by}, edited"))
        elif isinstance(target, ast.Attribute):
            pass  # an attribute of an object the reader does not follow
        else:
            raise _unsupported(target, f"assignment to a `{type(target).__name__}`")

    # ----------------------------------------------------------------------------------------------- expressions
    def eval(self, node: ast.expr) -> Any:
        self._check_time()
        if isinstance(node, ast.Constant):
            return _bounded(node.value, node)  # so every number the reader holds is within MAX_NUMBER
        if isinstance(node, ast.Name):
            if node.id in self.env:
                return self.env[node.id]
            if node.id in _NUMBER_FUNCS or node.id in ("print", "display", "str", "isinstance", "type", "range"):
                return Module(node.id)
            raise _unsupported(node, f"the name {_shown(node.id)}, not defined before")
        if isinstance(node, ast.Tuple | ast.List):
            values = [self.eval(e) for e in node.elts]
            return tuple(values) if isinstance(node, ast.Tuple) else values
        if isinstance(node, ast.JoinedStr | ast.Dict | ast.Set | ast.Lambda | ast.ListComp | ast.GeneratorExp):
            return OPAQUE
        if isinstance(node, ast.UnaryOp):
            operand = self.eval(node.operand)
            if isinstance(node.op, ast.Not):
                return OPAQUE if isinstance(operand, _Opaque) else not operand
            if _is_number(operand) and isinstance(node.op, ast.USub | ast.UAdd):
                return _bounded(-operand if isinstance(node.op, ast.USub) else +operand, node)
            if isinstance(operand, int) and not isinstance(operand, bool) and isinstance(node.op, ast.Invert):
                return _bounded(~operand, node)
            return OPAQUE
        if isinstance(node, ast.BinOp):
            return self._binop(node.op, self.eval(node.left), self.eval(node.right), node)
        if isinstance(node, ast.BoolOp):
            values = [self.eval(v) for v in node.values]
            if any(isinstance(v, _Opaque) for v in values):
                return OPAQUE
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare):
            return self._compare(node)
        if isinstance(node, ast.IfExp):
            test = self.eval(node.test)
            if isinstance(test, _Opaque):
                raise _unsupported(node, "a conditional expression whose test the reader cannot decide")
            return self.eval(node.body if test else node.orelse)
        if isinstance(node, ast.Attribute):
            return self._attribute(self.eval(node.value), node.attr, node)
        if isinstance(node, ast.Subscript):
            return self._subscript(self.eval(node.value), node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Starred):
            raise _unsupported(node, "a starred expression")
        raise _unsupported(node, f"a `{type(node).__name__}` expression")

    def _binop(self, op: ast.operator, left: Any, right: Any, node: ast.AST) -> Any:
        if _is_number(left) and _is_number(right) and type(op) in _BINOPS:
            _bounded(left, node), _bounded(right, node)  # operands within MAX_NUMBER: `*` makes at most 106 bits
            if isinstance(op, ast.Pow) and _power_bits(left, right) > MAX_NUMBER.bit_length():
                raise _unsupported(node, f"a number no image coordinate needs ({left} ** {right}, over 2**53)")
            try:
                return _bounded(_BINOPS[type(op)](left, right), node)
            except (ZeroDivisionError, OverflowError):
                raise _unsupported(node, "arithmetic that fails") from None
        picture = left if isinstance(left, Picture) else right if isinstance(right, Picture) else None
        if picture is not None and picture.array:  # array arithmetic: brightness or contrast, same geometry
            return replace(picture, made_by=f"{picture.made_by}, enhanced")
        if isinstance(left, tuple | list) and isinstance(right, tuple | list) and isinstance(op, ast.Add):
            return _bounded(type(left)([*_bounded(left, node), *_bounded(right, node)]), node)
        return OPAQUE

    def _compare(self, node: ast.Compare) -> Any:
        left = self.eval(node.left)
        for op, comparator in zip(node.ops, node.comparators):
            right = self.eval(comparator)
            if isinstance(op, ast.Is | ast.IsNot):  # `img is None`: the guard after cv2.imread
                if isinstance(left, _Opaque) or isinstance(right, _Opaque) or (left is not None and right is not None):
                    return OPAQUE
                result = (left is right) if isinstance(op, ast.Is) else (left is not right)
            elif type(op) in _COMPARE and _is_number(left) and _is_number(right):
                result = _COMPARE[type(op)](left, right)
            else:
                return OPAQUE
            if not result:
                return False
            left = right
        return True

    def _attribute(self, owner: Any, name: str, node: ast.AST) -> Any:
        if isinstance(owner, Module):
            return Module(f"{owner.name}.{name}")
        if isinstance(owner, Picture):
            width, height = owner.size
            if name == "size":
                return (width, height) if not owner.array else width * height * 3
            if name == "shape" and owner.array:
                return (height, width, 3)
            if name in ("width", "height") and not owner.array:
                return width if name == "width" else height
            if name in ("mode", "dtype", "format", "info", "ndim"):
                return OPAQUE
            return _Bound(owner, name)
        if isinstance(owner, _Enhancer | str | _Opaque):
            return _Bound(owner, name)
        raise _unsupported(node, f"the attribute .{name} of {_shown(owner)}")

    def _subscript(self, owner: Any, node: ast.Subscript) -> Any:
        if isinstance(owner, Picture):
            if not owner.array:
                raise _unsupported(node, "indexing a PIL image")
            return self._slice_array(owner, node.slice)
        if isinstance(owner, tuple | list):
            index = node.slice
            if isinstance(index, ast.Slice):
                bounds = [self.eval(b) if b is not None else None for b in (index.lower, index.upper, index.step)]
                if all(b is None or isinstance(b, int) for b in bounds):
                    return owner[slice(*bounds)]
                raise _unsupported(node, "a slice with bounds the reader cannot compute")
            key = self.eval(index)
            if isinstance(key, int) and -len(owner) <= key < len(owner):
                return owner[key]
            raise _unsupported(node, f"index {_shown(key)} of a {len(owner)}-tuple")
        return OPAQUE

    def _slice_array(self, picture: Picture, index: ast.expr) -> Picture:
        """numpy's basic slicing of an (H, W[, C]) array: rows, then columns, then channels (any channel selection
        keeps the region); bounds clipped to the array as numpy does, negative ones counted from the end."""
        parts = list(index.elts) if isinstance(index, ast.Tuple) else [index]
        width, height = picture.size
        spans = []
        for axis, length in ((0, height), (1, width)):
            if axis >= len(parts):
                spans.append((0, length))
                continue
            part = parts[axis]
            if not isinstance(part, ast.Slice):
                raise _unsupported(index, "an integer index into an image's rows or columns")
            lower, upper, step = (self.eval(b) if b is not None else None for b in (part.lower, part.upper, part.step))
            if step not in (None, 1):
                raise _unsupported(index, f"a slice with step {_shown(step)}")
            if not all(b is None or (isinstance(b, int) and not isinstance(b, bool)) for b in (lower, upper)):
                raise _unsupported(index, f"slice bounds {_shown(lower)}:{_shown(upper)} that are not integers")
            start, stop, _ = slice(lower, upper).indices(length)
            spans.append((start, max(start, stop)))
        (top, bottom), (left, right) = spans
        return self._crop(picture, (left, top, right, bottom), index)

    def _crop(self, picture: Picture, box: Sequence[Any], node: ast.AST) -> Picture:
        """`picture` cropped at `box` (its own pixels, x1, y1, x2, y2), its region composed into the original."""
        if picture.extent is None:
            raise _unsupported(node, f"a crop of an image made by {cut(picture.made_by, 80)}")
        if not (isinstance(box, tuple | list) and len(box) == 4 and all(_is_number(v) for v in box)):
            raise _unsupported(node, f"a crop box the reader cannot compute: {_shown(box)}")
        x1, y1, x2, y2 = (float(v) for v in box)
        if not picture.array:  # PIL rounds a float box to whole pixels
            x1, y1, x2, y2 = (float(round(v)) for v in (x1, y1, x2, y2))
        width, height = picture.size
        if width <= 0 or height <= 0:  # its region has no pixel to scale a box by (a ZeroDivisionError, issue 59)
            raise SkipRow("box_outside_image", f"line {getattr(node, 'lineno', '?')}: a crop of an empty image "
                          f"({width}x{height}, made by {cut(picture.made_by, 80)})")  # fmt: skip
        ex1, ey1, ex2, ey2 = picture.extent
        sx, sy = (ex2 - ex1) / width, (ey2 - ey1) / height
        extent = (ex1 + x1 * sx, ey1 + y1 * sy, ex1 + x2 * sx, ey1 + y2 * sy)
        size = (max(0, int(x2 - x1)), max(0, int(y2 - y1)))
        return Picture(extent, size, picture.array, made_by="a crop", cropped=True)

    # ------------------------------------------------------------------------------------------------------ calls
    def _call(self, node: ast.Call) -> Any:
        function = self.eval(node.func)
        args = [self.eval(a) for a in node.args]
        kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg is not None}
        if isinstance(function, _Bound):
            return self._method(function.owner, function.name, args, kwargs, node)
        if not isinstance(function, Module):
            return OPAQUE
        name = function.name
        for alias, full in _ALIASES.items():
            if name == alias or name.startswith(f"{alias}."):
                name = full + name[len(alias) :]
        pictures = [a for a in [*args, *kwargs.values()] if isinstance(a, Picture)]
        if name in ("print", "str", "isinstance", "type", "range") or name.startswith(("os.", "json.", "re.")):
            return OPAQUE
        if name in _NUMBER_FUNCS:
            for arg in args:
                _bounded(arg, node)
            if _items_over(args, MAX_ITEMS):
                raise _unsupported(node, f"{name} of over {MAX_ITEMS} items, nested ones counted")
            if name in ("round", "numpy.round") and len(args) > 1 and _is_number(args[1]):
                if abs(args[1]) > MAX_ROUND_DIGITS:  # round(5, -10**9) computes 10**(10**9)
                    raise _unsupported(node, f"a round to {args[1]} digits")
            try:
                return _bounded(_NUMBER_FUNCS[name](*args), node)
            except (TypeError, ValueError, OverflowError):
                if pictures and name == "len":
                    return pictures[0].size[1]
                return OPAQUE
        if name == "display":
            for picture in pictures:
                self._show(picture, "display")
            return None
        if name in ("cv2.imread", "PIL.Image.open"):
            if args and self._is_original_path(args[0]):
                return replace(self.original, array=name == "cv2.imread")
            raise _unsupported(node, f"{name} of a file other than the original: {_shown(args[:1])}")
        if name == "cv2.imwrite":
            if self.shows == "save" and len(args) >= 2 and isinstance(args[1], Picture):
                self._show(args[1], "save")
            return True
        if name == "cv2.resize":
            return self._resize(args, kwargs, node)
        if name == "cv2.createCLAHE" or name.startswith("PIL.ImageEnhance."):
            return _Enhancer(pictures[0] if pictures else None)
        if name in _ENHANCE:
            if not pictures:
                return OPAQUE
            picture = pictures[0]
            return replace(picture, array=not name.startswith("PIL."), made_by=f"{picture.made_by}, enhanced")
        if name.startswith("matplotlib.pyplot."):
            return self._pyplot(name.rsplit(".", 1)[1], pictures, node)
        if pictures:  # any other operation on an image: not a crop (a rotation, a warp, a drawing library)
            return Picture(None, pictures[0].size, pictures[0].array, made_by=name, cropped=pictures[0].cropped)
        return OPAQUE

    def _method(self, owner: Any, name: str, args: list, kwargs: dict, node: ast.AST) -> Any:
        if isinstance(owner, _Enhancer):
            if name in ("enhance", "apply"):
                picture = owner.picture or next((a for a in args if isinstance(a, Picture)), None)
                return replace(picture, made_by=f"{picture.made_by}, enhanced") if picture else OPAQUE
            return OPAQUE
        if not isinstance(owner, Picture):
            return OPAQUE
        if name == "crop":
            box = args[0] if args else kwargs.get("box")
            return self._crop(owner, box, node)
        if name == "resize":
            size = args[0] if args else kwargs.get("size")
            if not (isinstance(size, tuple | list) and len(size) == 2 and all(_is_number(v) for v in size)):
                raise _unsupported(node, f"a resize to a size the reader cannot compute: {_shown(size)}")
            return replace(owner, size=(int(size[0]), int(size[1])), made_by=f"{owner.made_by}, resized")
        if name in _PICTURE_ENHANCE:
            return replace(owner, made_by=f"{owner.made_by}, enhanced")
        if name == "show":
            if self.shows == "display":
                self._show(owner, "display")
            return None
        if name == "save":
            if self.shows == "save":
                self._show(owner, "save")
            return None
        if name in ("tobytes", "getpixel", "getdata", "mean", "std", "sum", "max", "min", "tolist", "histogram"):
            return OPAQUE
        if name in _GEOMETRY:
            return Picture(None, owner.size, owner.array, made_by=f".{name}", cropped=owner.cropped)
        raise _unsupported(node, f"the image method .{name}")

    def _resize(self, args: list, kwargs: dict, node: ast.AST) -> Picture:
        """`cv2.resize(src, dsize)` or `cv2.resize(src, None / (0, 0), fx=, fy=)`: the same region at another size."""
        picture = args[0] if args else kwargs.get("src")
        if not isinstance(picture, Picture):
            raise _unsupported(node, "cv2.resize of something that is not an image")
        size = args[1] if len(args) > 1 else kwargs.get("dsize")
        fx = args[3] if len(args) > 3 else kwargs.get("fx", 0)
        fy = args[4] if len(args) > 4 else kwargs.get("fy", 0)
        width, height = picture.size
        if isinstance(size, tuple | list) and len(size) == 2 and all(_is_number(v) and v > 0 for v in size):
            new = (int(size[0]), int(size[1]))
        elif _is_number(fx) and _is_number(fy) and fx > 0 and fy > 0:
            new = (round(width * fx), round(height * fy))
        else:
            raise _unsupported(
                node, f"cv2.resize to a size the reader cannot compute: {_shown(size)}, fx={_shown(fx)}"
            )
        return replace(picture, size=new, made_by=f"{picture.made_by}, resized")

    def _pyplot(self, name: str, pictures: list[Picture], node: ast.AST) -> Any:
        """matplotlib's pyplot: one image per figure (`imshow`), shown by `show` (or at the end of a Jupyter cell),
        written by `savefig` (Thyme); several images in one figure are not one crop."""
        if name == "imshow" and pictures:
            if self.figure is not None:
                raise _unsupported(node, "several images drawn into one figure")
            self.figure = pictures[0]
        elif name in ("subplots", "subplot", "subplot2grid", "add_subplot"):
            raise _unsupported(node, f"plt.{name}: a figure of several panels")
        elif name == "figure":
            if self.figure is not None:
                raise _unsupported(node, "a new figure while one with an image is open")
        elif name in ("show", "savefig") and self.figure is not None:
            if (name == "show") == (self.shows == "display"):
                self._show(self.figure, "figure")
            self.figure = None
        elif name == "close":
            self.figure = None
        return OPAQUE

    def _show(self, picture: Picture, via: str) -> None:
        self.shown.append(Shown(picture, via))

    def _is_original_path(self, value: Any) -> bool:
        return isinstance(value, OriginalPath) or (
            isinstance(value, str) and any(isinstance(v, OriginalPath) and v == value for v in self.env.values())
        )


def parse_or_skip(code: str) -> ast.Module:
    """`ast.parse(code)`, or `SkipRow("malformed_call")`: a syntax error, a literal over Python's digit limit, or
    nesting deeper than its parser's stack."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise SkipRow("malformed_call", f"code does not parse: {str(err)[:200]}") from None


def parse_code(code: str) -> ast.Module:
    """The code as DeepEyesV2's sandbox would run it: dedented, else with its indentation repair (each line stripped,
    re-indented after a line ending in ":"), `deepeyesv2.py` `fix_python_indentation`. Unparseable code raises
    `SkipRow("malformed_call")`."""
    with contextlib.suppress(SkipRow):
        return parse_or_skip(textwrap.dedent(code))
    lines, fixed, indent = [line.strip() for line in code.splitlines() if line.strip()], [], 0
    for line in lines:
        if line.startswith(("except", "elif", "else", "finally")):
            indent = max(0, indent - 1)
        fixed.append("    " * indent + line)
        indent += line.endswith(":")
    return parse_or_skip("\n".join(fixed))


def shown_calls(shown: Sequence[Shown]) -> list[ReadCall]:
    """The crops code showed, as calls; an image it showed that is not a crop of the original (the whole image, a
    rotation) is another tool's output."""
    calls = []
    for item in shown:
        picture = item.picture
        if picture.extent is None:
            raise SkipRow("unsupported_tool", f"the code shows an image made by {cut(picture.made_by, MAX_DETAIL)}")
        if not picture.cropped:
            raise SkipRow("unsupported_tool", f"the code shows the whole image ({cut(picture.made_by, MAX_DETAIL)})")
        calls.append(ReadCall(picture.extent, figure=item.via == "figure"))
    return calls
