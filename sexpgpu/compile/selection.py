"""Variants and sweeps: read before the file is evaluated, because knob values are bound
before evaluation. defvariant and defsweep settings are literal data (numbers, strings,
keywords, lists), so a pre-read of the file's top-level forms finds them without running
anything.

Precedence of a knob's value: the file's default < the variant < the sweep point < --set.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..ir.experiment import Halving, Selection
from ..lisp.conditions import LispError, lisp_error
from ..lisp.data import as_data
from ..lisp.diagnostics import DiagnosticError
from ..lisp.evaluator import run_with_big_stack
from ..lisp.reader import Reader, decode_source
from ..lisp.types import Cons, Loc, Symbol, SymbolTable
from .search import DISTRIBUTIONS, Distribution, distribution, halving, sampled_points


class _AnyPrefix(SymbolTable):
    """Reads `prefix:name` without resolving modules (the pre-read runs before require)."""

    def qualified(self, prefix: str, name: str) -> Symbol:
        return Symbol(name, prefix)


@dataclass
class VariantDecl:
    name: str
    settings: dict[str, Any]
    loc: Loc


@dataclass
class SweepDecl:
    name: str
    axes: dict[str, list[Any]]
    zip: bool
    variant: Optional[str]
    loc: Loc
    sample: Optional[int] = None  # a sampled sweep: this many points drawn from `draws`
    seed: int = 0
    draws: dict[str, Distribution] = field(default_factory=dict)
    halving: Optional[Halving] = None

    def points(self) -> list[dict[str, Any]]:
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


@dataclass
class Declared:
    variants: dict[str, VariantDecl] = field(default_factory=dict)
    sweeps: dict[str, SweepDecl] = field(default_factory=dict)


def prescan(path: Path) -> Declared:
    """The variants and sweeps a file declares. Problems reading the file are left for the
    real read to report; malformed declarations are diagnostics here."""
    declared = Declared()
    try:
        text = decode_source(path.read_bytes(), str(path))
        forms = run_with_big_stack(lambda: Reader(text, str(path), _AnyPrefix()).read_all())
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
        if head == "DEFVARIANT":
            declared.variants[name] = VariantDecl(name, {k.name.lower(): as_data(v, form=True) for k, v in pairs}, read.loc)
        else:
            try:
                sweep = sweep_decl(name, pairs, read.loc)
                sweep.points()
            except LispError as exc:
                raise located(exc, read.loc) from None
            declared.sweeps[name] = sweep
    return declared


SWEEP_OPTIONS = ("ZIP", "VARIANT", "SAMPLE", "SEED", "HALVING")


def sweep_decl(name: str, pairs: list[tuple[Any, Any]], loc: Loc) -> SweepDecl:
    """A defsweep's options and axes: lists of values (a grid, or :zip t), or with :sample N
    the distributions each knob is drawn from."""
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
    for k, v in pairs:
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
    variant = as_data(options.get("VARIANT"), form=True)
    plan = halving(name, options["HALVING"]) if "HALVING" in options else None
    return SweepDecl(name, axes, bool(as_data(options.get("ZIP"), form=True)), variant if isinstance(variant, str) else None, loc,
                     sample=sample, seed=seed, draws=draws, halving=plan)


def located(err: LispError, loc: Loc) -> LispError:
    err.loc = loc
    return err


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
