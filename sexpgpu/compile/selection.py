"""Variants and sweeps: read before the file is evaluated, because knob values are bound
before evaluation. defvariant and defsweep settings are literal data (numbers, strings,
keywords, lists), so a pre-read of the file's top-level forms finds them without running
anything.

Precedence of a knob's value: the file's default < the variant < the sweep point < --set.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from ..ir.experiment import Halving, Selection
from ..lisp.conditions import LispError, lisp_error
from ..lisp.data import as_data
from ..lisp.diagnostics import DiagnosticError
from ..lisp.evaluator import run_with_big_stack
from ..lisp.printer import prin1_to_string
from ..lisp.program import display_path
from ..lisp.reader import Reader, decode_source
from ..lisp.types import Cons, Loc, Symbol, SymbolTable
from ..sweeps.search import DISTRIBUTIONS, Distribution, distribution, halving, sampled_points


class _AnyPrefix(SymbolTable):
    """Reads `prefix:name` without resolving modules (the pre-read runs before require)."""

    def qualified(self, prefix: str, name: str) -> Symbol:
        return Symbol(name, prefix)


@dataclass(frozen=True)
class Written:
    """Where a pre-read knob value is written, as written, and what wrote it."""

    loc: Loc
    text: str  # the value as the file writes it
    by: str  # "defvariant wide", "point 2 of defsweep lr"
    axis: Optional[str] = None  # the sweep's list of values, when it looks like a call such as (log-grid ...)


@dataclass
class VariantDecl:
    name: str
    settings: dict[str, Any]
    loc: Loc
    written: dict[str, Written] = field(default_factory=dict)


@dataclass
class SweepDecl:
    name: str
    axes: dict[str, list[Any]]
    zip: bool
    variant: Optional[str]
    loc: Loc
    written: dict[str, list[Written]] = field(default_factory=dict)  # each axis's values, in order
    sample: Optional[int] = None  # a sampled sweep: this many points drawn from `draws`
    seed: int = 0
    draws: dict[str, Distribution] = field(default_factory=dict)
    halving: Optional[Halving] = None
    _points: Optional[list[dict[str, Any]]] = field(default=None, repr=False, compare=False)

    def points(self) -> list[dict[str, Any]]:
        """Every point's knob values, in order (made once: a grid of a thousand points is
        asked for each of its points)."""
        if self._points is None:
            self._points = self.all_points()
        return self._points

    def all_points(self) -> list[dict[str, Any]]:
        if self.sample is not None:
            return sampled_points(self.seed, self.sample, self.draws)
        names = list(self.axes)
        if not names:
            return [{}]
        if self.zip:
            lengths = {len(v) for v in self.axes.values()}
            if len(lengths) != 1:
                raise lisp_error("C004", f"defsweep {self.name} :zip t needs lists of one length, got lengths {sorted(lengths)}", "PROGRAM-ERROR")
            return [dict(zip(names, values)) for values in zip(*self.axes.values())]
        return [dict(zip(names, values)) for values in itertools.product(*self.axes.values())]

    def point_written(self, point: int) -> dict[str, Written]:
        """Where the values of POINT are written (the same order as points())."""
        names = [n for n in self.axes if n in self.written]
        if not names:
            return {}
        sizes = [len(self.written[n]) for n in names]
        count = min(sizes) if self.zip else math.prod(sizes)
        if not 0 <= point < count:
            return {}
        picks = [point] * len(names)
        if not self.zip:  # the row of itertools.product: the last axis varies fastest
            rest = point
            for at in reversed(range(len(names))):
                rest, picks[at] = divmod(rest, sizes[at])
        return {n: replace(self.written[n][i], by=f"point {point} of defsweep {self.name}") for n, i in zip(names, picks)}


@dataclass
class Declared:
    variants: dict[str, VariantDecl] = field(default_factory=dict)
    sweeps: dict[str, SweepDecl] = field(default_factory=dict)


_MAY_DECLARE = re.compile(r"def(variant|sweep)", re.IGNORECASE)


def prescan(path: Path) -> Declared:
    """The variants and sweeps a file declares. Problems reading the file are left for the
    real read to report; malformed declarations are diagnostics here."""
    declared = Declared()
    name = display_path(path)
    try:
        text = decode_source(path.read_bytes(), name)
        if not _MAY_DECLARE.search(text):
            return declared  # reading the whole file again would only find nothing
        forms = run_with_big_stack(lambda: Reader(text, name, _AnyPrefix()).read_all())
    except (DiagnosticError, OSError, RecursionError):
        return declared
    for read in forms:
        form = read.form
        if type(form) is not Cons or type(form.car) is not Symbol:
            continue
        head = form.car.name
        if head not in ("DEFVARIANT", "DEFSWEEP"):
            continue
        items = list(form)
        if len(items) < 2 or type(items[1]) is not Symbol or len(items) % 2 != 0:
            raise located(lisp_error("C008", f"{head.lower()}: expected ({head.lower()} name :knob value ...)", "PROGRAM-ERROR"), read.loc)
        name = items[1].name.lower()
        pairs = list(zip(items[2::2], items[3::2]))
        for key, _ in pairs:
            if type(key) is not Symbol or key.package != "KEYWORD":
                raise located(lisp_error("C008", f"{head.lower()} {name}: {as_data(key, form=True)} is not a :knob keyword", "PROGRAM-ERROR"), read.loc)
        cells = list_cells(form)[2:]
        if head == "DEFVARIANT":
            written = {k.name.lower(): Written(cell.loc or read.loc, printed(v), f"defvariant {name}") for (k, v), cell in zip(pairs, cells[1::2])}
            declared.variants[name] = VariantDecl(name, {k.name.lower(): as_data(v, form=True) for k, v in pairs}, read.loc, written)
        else:
            try:
                sweep = sweep_decl(name, pairs, read.loc, cells, text)
                sweep.points()
            except LispError as exc:
                raise located(exc, read.loc) from None
            declared.sweeps[name] = sweep
    return declared


SWEEP_OPTIONS = ("ZIP", "VARIANT", "SAMPLE", "SEED", "HALVING")


def sweep_decl(name: str, pairs: list[tuple[Any, Any]], loc: Loc, cells: Optional[list[Cons]] = None, text: Optional[str] = None) -> SweepDecl:
    """A defsweep's options and axes: lists of values (a grid, or :zip t), or with :sample N
    the distributions each knob is drawn from. With the form's CELLS (after the name) and the
    file's TEXT, where each grid value is written."""
    options = {k.name: v for k, v in pairs if k.name in SWEEP_OPTIONS}
    sample = options.get("SAMPLE")
    if sample is not None and (type(sample) is not int or sample < 1):
        raise lisp_error("C008", f"defsweep {name}: :sample needs a positive number of points, got {as_data(sample, form=True)!r}", "PROGRAM-ERROR")
    seed = options.get("SEED", 0)
    if type(seed) is not int:
        raise lisp_error("C008", f"defsweep {name}: :seed needs an integer, got {as_data(seed, form=True)!r}", "PROGRAM-ERROR")
    if sample is None and "SEED" in options:
        raise lisp_error("C008", f"defsweep {name}: :seed goes with :sample N (a grid has nothing to draw)", "PROGRAM-ERROR")
    if sample is not None and "ZIP" in options:
        raise lisp_error("C008", f"defsweep {name}: :zip and :sample do not go together (a sampled sweep draws each knob)", "PROGRAM-ERROR")
    axes: dict[str, list[Any]] = {}
    draws: dict[str, Distribution] = {}
    where: dict[str, list[Written]] = {}
    value_cells = cells[1::2] if cells is not None else [None] * len(pairs)
    for (k, v), cell in zip(pairs, value_cells):
        if k.name in SWEEP_OPTIONS:
            continue
        if sample is not None:
            draws[k.name.lower()] = distribution(name, k.name.lower(), v)
            continue
        values = as_data(v, form=True)
        drawn = type(v) is Cons and type(v.car) is Symbol and v.car.name in DISTRIBUTIONS
        if not isinstance(values, list) or not values or drawn:
            hint = f" (a distribution such as ({v.car.name.lower()} ...) needs :sample N)" if drawn else ""
            raise lisp_error("C008", f"defsweep {name}: :{k.name.lower()} needs a list of values, got {values!r}{hint}", "PROGRAM-ERROR")
        axes[k.name.lower()] = values
        if cell is not None and text is not None:
            where[k.name.lower()] = axis_written(v, cell.loc or loc, text, name)
    variant = as_data(options.get("VARIANT"), form=True)
    plan = halving(name, options["HALVING"]) if "HALVING" in options else None
    return SweepDecl(name, axes, bool(as_data(options.get("ZIP"), form=True)), variant if isinstance(variant, str) else None, loc,
                     where, sample=sample, seed=seed, draws=draws, halving=plan)


def list_cells(form: Any) -> list[Cons]:
    out = []
    while type(form) is Cons:
        out.append(form)
        form = form.cdr
    return out


def printed(form: Any) -> str:
    return prin1_to_string(form)


def axis_written(axis: Any, loc: Loc, text: str, sweep: str) -> list[Written]:
    """Where each value of a sweep's list AXIS (written at LOC) is. The first value's
    position is found in TEXT: a list's first cell carries the position of its paren."""
    cells = list_cells(axis)
    looks_like_call = type(axis) is Cons and type(axis.car) is Symbol and axis.car.package != "KEYWORD" and axis.car.name not in ("T", "NIL")
    shown = printed(axis) if looks_like_call else None
    out = []
    for i, cell in enumerate(cells):
        where = after_paren(text, loc) if i == 0 else cell.loc or loc
        out.append(Written(where, printed(cell.car), f"defsweep {sweep}", shown))
    return out


def after_paren(text: str, loc: Loc) -> Loc:
    """The position of the first form inside the list whose paren is at LOC."""
    lines = text.split("\n")
    line, col = loc.line, loc.col  # col points at "("
    while line <= len(lines):
        rest = lines[line - 1]
        while col < len(rest) and rest[col] in " \t":
            col += 1
        if col < len(rest) and rest[col] != ";":
            return Loc(loc.file, line, col + 1)
        line, col = line + 1, 0
    return loc


def located(err: LispError, loc: Loc) -> LispError:
    err.loc = loc
    return err


def written_values(declared: Declared, selection: Selection) -> dict[str, Written]:
    """Where the knob values overrides() gives are written (the later one of a variant and a
    sweep point, as overrides() applies them)."""
    out: dict[str, Written] = {}
    sweep = declared.sweeps.get(selection.sweep or "")
    variant = declared.variants.get(selection.variant or (sweep.variant if sweep else None) or "")
    if variant is not None:
        out.update(variant.written)
    if sweep is not None and selection.point is not None:
        out.update(sweep.point_written(selection.point))
    return out


def overrides(declared: Declared, selection: Selection) -> dict[str, Any]:
    """Knob values the selection imposes, as literals (before --set, which is read apart)."""
    values: dict[str, Any] = {}
    variant = selection.variant
    if selection.sweep is not None:
        sweep = declared.sweeps.get(selection.sweep)
        if sweep is None:
            raise lisp_error("C004", f"--sweep {selection.sweep}: the file declares no such sweep (sweeps: {', '.join(declared.sweeps) or 'none'})", "PROGRAM-ERROR")
        points = sweep.points()
        if selection.point is None or not 0 <= selection.point < len(points):
            raise lisp_error("C004", f"--point {selection.point}: sweep {sweep.name} has points 0 to {len(points) - 1}", "PROGRAM-ERROR")
        variant = variant or sweep.variant
        if variant is not None:
            values.update(variant_settings(declared, variant))
        values.update(points[selection.point])
        return values
    if variant is not None:
        values.update(variant_settings(declared, variant))
    return values


def variant_settings(declared: Declared, name: str) -> dict[str, Any]:
    variant = declared.variants.get(name)
    if variant is None:
        raise lisp_error("C004", f"--variant {name}: the file declares no such variant (variants: {', '.join(declared.variants) or 'none'})", "PROGRAM-ERROR")
    return dict(variant.settings)
