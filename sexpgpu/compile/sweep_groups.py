"""One staging per shape: which points of a sweep may share a compile, and binding one point's
knob values into a probe compile of its group (pipeline.compile_points does the compiling).

Points are first grouped by everything but their numeric knob values: the variant, --set, and
the knobs whose values are not numbers. A group's probe compile (probes.py) says which of the
numeric knobs reach a shape, a dtype or the program's structure; its points are then grouped
again by those knobs' values. In a group whose probe no knob was seen by, each point's
experiment is the probe's with the poison values replaced by the point's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..ir.experiment import Experiment, KnobSpec, Selection
from ..ir.graph import data_hash
from ..lisp.conditions import LispError
from ..lisp.diagnostics import Diagnostic
from ..records import load, plain
from .probes import Probing


def numeric(value: Any) -> bool:
    """A knob value a probe can stand for: an integer or a float, as the file writes it."""
    return type(value) is int or type(value) is float


def group_key(chosen: Selection, imposed: dict[str, Any]) -> tuple[Any, ...]:
    """What points must agree on before a probe can tell whether their numeric knobs matter:
    the variant, --set, every other knob's value, and the type of each numeric one."""
    others = tuple(sorted((k, repr(v)) for k, v in imposed.items() if not numeric(v)))
    numbers = tuple(sorted((k, type(v).__name__) for k, v in imposed.items() if numeric(v)))
    return chosen.variant, tuple(sorted(chosen.set.items())), others, numbers


def split_by(indices: list[int], knobs: set[str], imposed: list[dict[str, Any]]) -> list[list[int]]:
    """INDICES in groups of equal values of KNOBS, in order of first appearance."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i in indices:
        groups.setdefault(tuple(repr(imposed[i].get(k)) for k in sorted(knobs)), []).append(i)
    return list(groups.values())


def substituted(data: Any, swaps: dict[tuple[type, Any], Any]) -> Any:
    """DATA (JSON-shaped) with each number that is a key of SWAPS (by type and value) replaced."""
    kind = type(data)
    if kind is dict:
        return {k: substituted(v, swaps) for k, v in data.items()}
    if kind is list:
        return [substituted(v, swaps) for v in data]
    if kind is float or kind is int:
        return swaps.get((kind, data), data)
    return data


@dataclass
class Binding:
    """A group's probe compile, ready to give each of its points the experiment and the
    diagnostics that point's own compile gives."""

    probing: Probing
    diagnostics: list[Diagnostic]
    experiment: Optional[Experiment]
    dumped: Optional[dict[str, Any]] = None
    shared: Optional[list[tuple[list[tuple[Any, ...]], set[tuple[Any, ...]]]]] = None

    def swaps(self, point: int) -> dict[tuple[type, Any], Any]:
        out: dict[tuple[type, Any], Any] = {}
        for knob, poison in self.probing.poisons.items():
            value = self.probing.bound[knob][point]
            if type(poison) is float:
                out[(float, poison)] = float(value)
            else:
                out[(int, poison)] = int(value)
                out[(float, float(poison))] = float(value)
        return out

    def refuses(self, point: int) -> bool:
        """Whether POINT needs a compile of its own: a knob check refuses its value, a check
        the probe's values passed refuses it, or one of its values is a constant the
        program already has (a compile would share that constant's node)."""
        if point in self.probing.refused:
            return True
        for knob, check in self.probing.guards:
            try:
                check(self.probing.bound[knob][point])
            except LispError:
                return True
        return self.collides(point)

    def collides(self, point: int) -> bool:
        # the builder keys a constant by its value's repr (ir/builder.py: const)
        by_repr: dict[str, Any] = {}
        for knob, poison in self.probing.poisons.items():
            value = self.probing.bound[knob][point]
            by_repr[repr(float(poison))] = value
            if type(poison) is int:
                by_repr[repr(poison)] = value
        for poisoned, rest in self.constants():
            made: set[tuple[Any, ...]] = set()
            for text, dtype, shape in poisoned:
                value = by_repr[text]
                key = (repr(float(value)) if dtype.is_float else repr(int(value)), dtype, shape)
                if key in rest or key in made:
                    return True
                made.add(key)
        return False

    def constants(self) -> list[tuple[list[tuple[Any, ...]], set[tuple[Any, ...]]]]:
        """Per builder the probe staged into: its poisoned constants and the others."""
        if self.shared is None:
            texts = {repr(float(p)) for p in self.probing.poisons.values()} | {repr(p) for p in self.probing.poisons.values() if type(p) is int}
            self.shared = []
            for tracer in self.probing.tracers.values():
                keys = tracer.builder.constant_keys()
                poisoned = [key for key in keys if key[0] in texts]
                if poisoned:
                    self.shared.append((poisoned, keys - set(poisoned)))
        return self.shared

    def data_for(self, point: int, selection: Selection) -> Optional[dict[str, Any]]:
        """POINT's experiment as plain data (records.plain): the probe's with the point's
        values, knob records and selection, and the hash of its IR."""
        if self.experiment is None:
            return None
        if self.dumped is None:
            self.dumped = plain(self.experiment)
        data = substituted(self.dumped, self.swaps(point))
        data["selection"] = plain(selection)
        data["knobs"] = [plain(self.knob_record(spec, point)) for spec in self.experiment.knobs]
        data["ir_hash"] = data_hash(data["module"])
        return data

    def experiment_for(self, point: int, selection: Selection) -> Optional[Experiment]:
        """POINT's experiment, validated from data_for."""
        data = self.data_for(point, selection)
        return None if data is None else load(Experiment, data)

    def knob_record(self, spec: KnobSpec, point: int) -> KnobSpec:
        specs = self.probing.specs.get(spec.name)
        made = specs[point] if specs is not None else spec
        assert made is not None, "a refused point is compiled on its own"
        return made
