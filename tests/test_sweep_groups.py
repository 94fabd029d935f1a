"""One compile per shape: a sweep's points that differ only in scalars share one probe compile
(sexpgpu/compile/probes.py, sweep_groups.py), and every point still gets, byte for byte, the
diagnostics, the experiment, the IR hash and the slug its own compile gives."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import REPO
from sweep_files import QUICKSTART, lr_seed_grid, width_grid

import sexpgpu.compile.pipeline as pipeline
from sexpgpu.compile.pipeline import CompileResult, check_every_selection, compile_file, compile_points, stream_points
from sexpgpu.compile.selection import prescan
from sexpgpu.ir.experiment import Selection
from sexpgpu.records import dump_json
from sexpgpu.runtime.runfolder import run_slug

QUICK = QUICKSTART.read_text()


def variant_of_quickstart(*edits: tuple[str, str]) -> str:
    text = QUICK
    for old, new in edits:
        assert old in text
        text = text.replace(old, new)
    return text


def sweep_of(knobs: str, axes: str, *edits: tuple[str, str]) -> str:
    return variant_of_quickstart(("(defknob lr 0.1)", f"{knobs}\n(defsweep s {axes})"), *edits)


# files whose knobs reach the program in every way a sweep's point can: a shape, an `if` that
# picks the structure, Lisp arithmetic, a printed value, a constant the IR already has, a knob
# check that refuses one point, a value only a record keeps
ADVERSARIAL = {
    "knob-picks-a-width-by-if": sweep_of("(defknob lr 0.1)", ":lr (0.05 0.1 0.2 0.3 0.4)", ("(nn:mlp 2 64 3)", "(nn:mlp 2 (if (> lr 0.15) 32 64) 3)")),
    "knob-in-a-list-a-builtin-searches": sweep_of("(defknob lr 0.1)", ":lr (0.1 0.5 0.2 0.3)", ("(nn:mlp 2 64 3)", "(nn:mlp 2 (if (find 0.5 (list lr)) 32 64) 3)")),
    "knob-picks-a-width-by-case": sweep_of("(defknob lr 0.1)", ":lr (0.1 0.5 0.2 0.3)", ("(nn:mlp 2 64 3)", "(nn:mlp 2 (case lr (0.5 32) (t 64)) 3)")),
    "knob-is-a-hash-key": sweep_of("(defknob lr 0.1)", ":lr (0.1 0.5 0.2 0.3)",
                                   ("(nn:mlp 2 64 3)", "(nn:mlp 2 (let ((h (make-hash-table))) (setf (gethash 0.5 h) 32) (gethash lr h 64)) 3)")),
    "knob-in-arithmetic": sweep_of("(defknob lr 0.1)", ":lr (0.05 0.1 0.2 0.3)", ("(optim:sgd :lr lr)", "(optim:sgd :lr (* 2 lr))")),
    "knob-equals-an-ir-constant": sweep_of("(defknob lr 0.1)", ":lr (0.05 0.5 1.0 0.2 2.0 -1.0)"),
    "knob-is-a-width": sweep_of("(defknob lr 0.1)\n(defknob width 64)", ":width (16 32 64) :lr (0.1 0.2)", ("(nn:mlp 2 64 3)", "(nn:mlp 2 width 3)")),
    "knob-is-the-seed": sweep_of("(defknob lr 0.1)\n(defknob run-seed 0)", ":run-seed (0 1 2 3) :lr (0.1 0.2 0.3)", ("(defrun :steps 300 :seed 0)", "(defrun :steps 300 :seed run-seed)")),
    "knob-is-printed": sweep_of("(defknob lr 0.1)", ":lr (0.05 0.1 0.2)", ("(defrun :steps 300 :seed 0)", '(defrun :steps 300 :seed 0)\n(format t "lr ~a~%" lr)')),
    "knob-names-a-part": sweep_of("(defknob lr 0.1)", ":lr (0.05 0.1 0.2)", ("(defrun :steps 300 :seed 0)", '(defrun :steps 300 :seed 0)\n(unless (string= (format nil "~a" lr) "0.1") (warn "not the default"))')),
    "adamw-multiplies-the-rate": sweep_of("(defknob lr 0.1)", ":lr (0.05 0.1 0.2)", ("(optim:sgd :lr lr)", "(optim:adamw :lr lr)")),
    "a-schedule-of-the-rate": sweep_of("(defknob lr 0.1)", ":lr (0.05 0.1 0.2)", ("(optim:sgd :lr lr)", "(optim:sgd :lr (optim:warmup-cosine lr :warmup 10))")),
    "a-point-out-of-range": sweep_of("(defknob lr 0.1 :range (0.0 1.0))", ":lr (0.05 0.1 2.0 0.3)"),
    "a-knob-sets-the-steps": sweep_of("(defknob lr 0.1)\n(defknob steps 300)", ":steps (100 200 300 400)", ("(defrun :steps 300 :seed 0)", "(defrun :steps steps :seed 0)")),
    "a-knob-sets-the-batch": sweep_of("(defknob lr 0.1)\n(defknob batch 64)", ":batch (16 32 64)", (":batch 64)", ":batch batch)")),
    "a-point-that-does-not-check": sweep_of("(defknob lr 0.1)\n(defknob width 64)", ":width (16 32 0 64)", ("(nn:mlp 2 64 3)", "(nn:mlp 2 width 3)")),
}


def counting(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each compile compile_points runs (True: a probe compile), calling the real compile_file."""
    calls: list[bool] = []
    real: Callable[..., CompileResult] = pipeline.compile_file

    def counted(*args: Any, **kwargs: Any) -> CompileResult:
        calls.append(kwargs.get("probing") is not None)
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "compile_file", counted)
    return calls


def sweep_selections(path: Path) -> list[Selection]:
    return [Selection(sweep=name, point=i) for name, sweep in prescan(path).sweeps.items() for i in range(len(sweep.points()))]


def assert_same(path: Path, grouped: CompileResult, alone: CompileResult, point: int) -> None:
    where = f"{path.name} point {point}"
    assert grouped.diagnostics == alone.diagnostics, where
    assert (grouped.experiment is None) == (alone.experiment is None), where
    if grouped.experiment is not None and alone.experiment is not None:
        assert grouped.experiment.ir_hash == alone.experiment.ir_hash, where
        assert run_slug(grouped.experiment) == run_slug(alone.experiment), where
        assert dump_json(grouped.experiment) == dump_json(alone.experiment), where


def compare_every_point(path: Path, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    selections = sweep_selections(path)
    with monkeypatch.context() as patch:
        calls = counting(patch)
        grouped = compile_points(path, selections, output=lambda _: None)
    for point, (selection, result) in enumerate(zip(selections, grouped)):
        assert_same(path, result, compile_file(path, selection, output=lambda _: None), point)
    return calls


@pytest.mark.parametrize("name", ["sweep.lisp", "search.lisp"])
def test_example_sweeps_match_one_compile_per_point(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = compare_every_point(REPO / "examples" / name, monkeypatch)
    assert len(calls) < len(sweep_selections(REPO / "examples" / name))


def test_a_scalar_grid_compiles_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Learning rates x seeds: one real compile of the first point and one probe compile."""
    path = tmp_path / "grid.lisp"
    path.write_text(lr_seed_grid(4, 4))
    calls = compare_every_point(path, monkeypatch)
    assert calls == [False, True]


def test_a_streamed_grid_gives_its_first_point_before_the_probe_compile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's first point trains while its group is probed: the stream gives it after its
    own compile alone, then every other point once, the first point's result unchanged."""
    path = tmp_path / "grid.lisp"
    path.write_text(lr_seed_grid(4, 4))
    selections = sweep_selections(path)
    with monkeypatch.context() as patch:
        calls = counting(patch)
        stream = stream_points(path, selections, output=lambda _: None)
        first = next(stream)
        assert first[0] == 0 and calls == [False]
        rest = list(stream)
    assert calls == [False, True] and sorted(i for i, _ in rest) == list(range(1, len(selections)))
    assert_same(path, first[1], compile_file(path, selections[0], output=lambda _: None), 0)


def test_a_width_grid_compiles_once_per_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Three widths x three learning rates: the width is a shape, the rate is not."""
    path = tmp_path / "widths.lisp"
    path.write_text(width_grid(3, 3))
    calls = compare_every_point(path, monkeypatch)
    assert calls.count(False) == 3, calls


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_knobs_that_reach_the_structure_get_their_own_compile(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / f"{name}.lisp"
    path.write_text(ADVERSARIAL[name])
    compare_every_point(path, monkeypatch)


def test_the_1024_point_grid_compiles_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """32 learning rates x 32 seeds: two compiles for all 1,024 points, and the points checked
    one by one (corners, edges, a spread) are their own compile's, byte for byte."""
    path = tmp_path / "grid.lisp"
    path.write_text(lr_seed_grid(32, 32))
    selections = sweep_selections(path)
    assert len(selections) == 1024
    with monkeypatch.context() as patch:
        calls = counting(patch)
        grouped = compile_points(path, selections)
    assert calls == [False, True]
    assert len({run_slug(r.experiment) for r in grouped if r.experiment is not None}) == 1024
    for point in (0, 1, 31, 32, 33, 511, 512, 992, 1000, 1023):
        assert_same(path, grouped[point], compile_file(path, selections[point]), point)


def test_a_sweep_checks_later_compiles_do_not_walk_the_earlier_worlds(tmp_path: Path) -> None:
    """Each compile's results keep its world alive; the collections of the compiles after it
    run with it frozen (they were about a third of search.lisp's check), and once the check
    returns nothing is left frozen, so a world the caller drops is freed."""
    path = tmp_path / "grid.lisp"
    path.write_text(width_grid(2, 2))
    frozen_at_collections: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            frozen_at_collections.append(gc.get_freeze_count())

    gc.unfreeze()
    gc.callbacks.append(note)
    try:
        checked = check_every_selection(path)
    finally:
        gc.callbacks.remove(note)
    assert checked.compiled > 2 and not [d for d in checked.diagnostics if d.severity == "error"]
    assert max(frozen_at_collections) > 0
    assert gc.get_freeze_count() == 0
