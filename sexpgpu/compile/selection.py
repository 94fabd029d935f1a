"""Variants and sweeps: read before the file is evaluated, because knob values are bound
before evaluation. defvariant and defsweep settings are literal data (numbers, strings,
keywords, lists), so a pre-read of the file's top-level forms finds them without running
anything.

Precedence of a knob's value: the file's default < the variant < the sweep point < --set.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..ir.experiment import Selection
from ..lisp.conditions import LispError, lisp_error
from ..lisp.data import as_data
from ..lisp.diagnostics import DiagnosticError
from ..lisp.evaluator import run_with_big_stack
from ..lisp.reader import Reader, decode_source
from ..lisp.types import Cons, Loc, Symbol, SymbolTable


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

    def points(self) -> list[dict[str, Any]]:
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


_MAY_DECLARE = re.compile(r"def(variant|sweep)", re.IGNORECASE)


def prescan(path: Path) -> Declared:
    """The variants and sweeps a file declares. Problems reading the file are left for the
    real read to report; malformed declarations are diagnostics here."""
    declared = Declared()
    try:
        text = decode_source(path.read_bytes(), str(path))
        if not _MAY_DECLARE.search(text):
            return declared  # reading the whole file again would only find nothing
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
            options = {k.name.lower(): as_data(v, form=True) for k, v in pairs if k.name in ("ZIP", "VARIANT")}
            axes = {}
            for k, v in pairs:
                if k.name in ("ZIP", "VARIANT"):
                    continue
                values = as_data(v, form=True)
                if not isinstance(values, list) or not values:
                    raise located(lisp_error("C008", f"defsweep {name}: :{k.name.lower()} needs a list of values, got {values!r}", "PROGRAM-ERROR"), read.loc)
                axes[k.name.lower()] = values
            variant = options.get("variant")
            sweep = SweepDecl(name, axes, bool(options.get("zip")), variant if isinstance(variant, str) else None, read.loc)
            try:
                sweep.points()
            except LispError as exc:
                raise located(exc, read.loc) from None
            declared.sweeps[name] = sweep
    return declared


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
