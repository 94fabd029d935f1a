"""The system image kept on disk between processes (sexpgpu/lisp/imagefile.py): a check
records the prelude's, the contract macros' and the standard modules' expansions once, and
every later check, in any process, replays them. What it loads is what was stored, cons for
cons; every diagnostic, IR and slug is what a check that expands everything gives; an entry
that is damaged, not a regular file, or in a folder that cannot be written is never used and
never stops a check; and a project's own libraries never reach it."""

from __future__ import annotations

import json
import os
import time
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from sexpgpu.cachefiles import package_signature
from sexpgpu.compile import pipeline
from sexpgpu.compile.pipeline import check_every_selection, compile_file, kept_on_disk, system_image, system_texts
from sexpgpu.lisp import imagefile
from sexpgpu.lisp.evaluator import Interpreter
from sexpgpu.lisp.image import SYSTEM_FILE, Name, SystemImage
from sexpgpu.lisp.modules import standard_context
from sexpgpu.lisp.objects import BitVector
from sexpgpu.lisp.types import NIL, QUOTE, Char, Cons, Loc, Symbol
from sexpgpu.records import plain

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
RUN_FILES = ["quickstart", "charlm", "cnn", "char-transformer", "tour", "sweep", "search"]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache root for this test (SEXPGPU_CACHE)."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SEXPGPU_CACHE", str(root))
    return root


def entries(root: Path) -> list[Path]:
    folder = root / imagefile.KIND
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []


def stored() -> SystemImage | None:
    return imagefile.stored_image(system_texts(), package_signature())


def same_template(a: Any, b: Any, names: dict[int, int], cells: dict[int, int]) -> None:
    """A (as built) and B (as loaded) are the same template: every cons at the same position,
    shared and circular structure where it was, each Name alike and one to one, the standard
    symbols themselves, the atoms equal and of the same type."""
    while True:
        assert type(b) is type(a)
        if type(a) is Cons:
            if id(a) in cells:
                assert cells[id(a)] == id(b)
                return
            cells[id(a)] = id(b)
            assert b.loc == a.loc
            same_template(a.car, b.car, names, cells)
            a, b = a.cdr, b.cdr
            continue
        if type(a) is Name:
            assert (b.name, b.kind) == (a.name, a.kind)
            assert names.setdefault(id(a), id(b)) == id(b)
        elif type(a) is Symbol:
            assert b is a
        elif type(a) is list or type(a) is BitVector:
            assert len(b) == len(a) and (id(a) not in cells or cells[id(a)] == id(b))
            cells[id(a)] = id(b)
            for x, y in zip(a, b):
                same_template(x, y, names, cells)
        else:
            assert b == a
        return


def test_an_image_kept_on_disk_loads_back_form_for_form(cache: Path) -> None:
    """The image a first check builds is on disk, and the one loaded from there holds the same
    texts' forms and the same expansions: leaf for leaf, at the same positions and counters."""
    built = system_image()
    (entry,) = entries(cache)
    assert entry == imagefile.entry_path(system_texts(), package_signature())
    loaded = stored()
    assert loaded is not None
    assert list(loaded.texts) == list(built.texts) and set(loaded.expanded) == set(built.expanded)
    assert {(SYSTEM_FILE, text) for _, text in system_texts()[:2]} <= set(loaded.expanded)
    for key, forms in built.texts.items():
        again = loaded.texts[key]
        assert [f.loc for f in again] == [f.loc for f in forms]
        names: dict[int, int] = {}
        for a, b in zip(forms, again):
            same_template(a.form, b.form, names, {})
    for key, leaves in built.expanded.items():
        replayed = loaded.expanded[key]
        assert [(x.loc, x.counters) for x in replayed] == [(x.loc, x.counters) for x in leaves]
        names = {}
        for a, b in zip(leaves, replayed):
            same_template(a.form, b.form, names, {})


def test_shared_and_circular_structure_and_every_atom_survive_the_disk() -> None:
    here = Loc("<prelude>", 3, 7)
    gensym = Name("G1", None)
    shared = Cons(Name("X", ""), NIL, here)
    ring = Cons(Name("R", "KEYWORD"), NIL, None)
    ring.cdr = ring
    bits = BitVector([1, 0, 1])
    vector: list[Any] = [shared, 2.5, bits]
    atoms = ["text", 7, 2**70, -0.0, True, Fraction(2, 3), Char("a")]
    form = Cons(QUOTE, Cons(shared, Cons(shared, Cons(gensym, Cons(gensym, Cons(ring, Cons(vector, NIL)))))), here)
    for atom in reversed(atoms):
        form = Cons(atom, form, Loc("<prelude>", 1, 1))
    table = imagefile.encode_roots([(form, here, (1, 2, 3)), (vector, Loc("lib.lisp", 9, 1), None)])
    (made, loc, counters), (made_vector, vector_loc, _) = imagefile.decode_roots(table)
    assert (loc, counters, vector_loc) == (here, (1, 2, 3), Loc("lib.lisp", 9, 1))
    for atom in atoms:
        assert type(made.car) is type(atom) and made.car == atom and made.loc == Loc("<prelude>", 1, 1)
        made = made.cdr
    assert made.car is QUOTE and made.loc == here
    first, second, g1, g2, ring_made, vector_made = list(made.cdr)
    assert first is second and first.loc == here and type(first.car) is Name and first.car.name == "X"
    assert g1 is g2 and (g1.name, g1.kind) == ("G1", None)
    assert ring_made.cdr is ring_made and (ring_made.car.name, ring_made.car.kind) == ("R", "KEYWORD")
    assert vector_made is made_vector and vector_made[0] is first and type(vector_made[2]) is BitVector and vector_made[2] == [1, 0, 1]
    assert made is not form and first is not shared  # every object new


def counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How many system texts worlds read, and how many they expand, from now on."""
    counts = {"read": 0, "expanded": 0}
    load_text, record_text = Interpreter.load_text, Interpreter.record_text

    def reading(interp: Interpreter, text: str, file: str, *args: Any) -> Any:
        counts["read"] += file == SYSTEM_FILE
        return load_text(interp, text, file, *args)

    def recording(interp: Interpreter, *args: Any) -> None:
        counts["expanded"] += 1
        record_text(interp, *args)

    monkeypatch.setattr(Interpreter, "load_text", reading)
    monkeypatch.setattr(Interpreter, "record_text", recording)
    return counts


def test_a_later_check_replays_what_the_first_recorded(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first check of a file expands the prelude, the contract macros and the modules it
    requires first, and keeps them on disk; a second check (what a new process does: the
    image comes from the disk each time) reads and expands none of them."""
    counts = counting(monkeypatch)
    first = check_every_selection(EXAMPLES / "quickstart.lisp")
    assert counts == {"read": 0, "expanded": 4}  # prelude, contract macros, nn, optim
    assert len(entries(cache)) == 1
    counts.update(read=0, expanded=0)
    second = check_every_selection(EXAMPLES / "quickstart.lisp")
    assert counts == {"read": 0, "expanded": 0}
    assert second.diagnostics == first.diagnostics == []


def test_a_warm_disk_gives_every_diagnostic_ir_and_slug_a_cold_one_gives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every example compiled with nothing on disk (each world expands the system texts, or
    one does and the rest replay it) and again with the disk warm: the same diagnostics and
    the same experiment, field for field (the IR hash and the slug included)."""
    for name in RUN_FILES:
        path = EXAMPLES / f"{name}.lisp"
        monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path / name / "compile"))
        cold = compile_file(path)
        monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path / name / "check"))
        cold_check = check_every_selection(path)
        warm_check, warm = check_every_selection(path), compile_file(path)
        assert entries(tmp_path / name / "compile") and entries(tmp_path / name / "check")
        assert warm_check.diagnostics == cold_check.diagnostics and warm.diagnostics == cold.diagnostics
        if name == "tour":  # not a run file: its diagnostics are all
            assert cold.experiment is None and warm.experiment is None
            continue
        assert cold.experiment is not None and warm.experiment is not None
        assert json.dumps(plain(warm.experiment), sort_keys=True) == json.dumps(plain(cold.experiment), sort_keys=True)
        assert warm.experiment.identity_hash() == cold.experiment.identity_hash()


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flipped", "truncated", "other format", "folder", "link"])
def test_a_damaged_entry_is_built_again_and_written_over(cache: Path, damage: str) -> None:
    system_image()
    (entry,) = entries(cache)
    if damage == "flipped":
        flip_last_byte(entry)
    elif damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:1000])
    elif damage == "other format":
        entry.write_bytes(b"sexpgpu system image 0\n" + entry.read_bytes()[len(imagefile.HEADER) :])
    elif damage == "folder":
        entry.unlink()
        entry.mkdir()
    else:
        target = cache / "elsewhere"
        target.write_bytes(entry.read_bytes())
        entry.unlink()
        entry.symlink_to(target)
    assert stored() is None
    assert check_every_selection(EXAMPLES / "quickstart.lisp").diagnostics == []
    assert entry.is_file() and not entry.is_symlink() and stored() is not None


def test_a_cache_that_cannot_be_written_changes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """SEXPGPU_CACHE under a regular file: nothing can be kept, and every check still works,
    with the diagnostics of one that keeps its image."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SEXPGPU_CACHE", str(blocker / "cache"))
    bad = tmp_path / "bad.lisp"
    bad.write_text('(require "sexpgpu/nn" :as nn)\n(defun f (x) (+ x "one"))\n(f 3)\n')
    unwritable = [check_every_selection(bad).diagnostics for _ in range(2)]
    monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path / "writable"))
    kept = [check_every_selection(bad).diagnostics for _ in range(2)]
    assert unwritable[0] == unwritable[1] == kept[0] == kept[1] and [d.code for d in kept[0]] == ["E103"]


def test_the_key_changes_with_a_text_the_code_and_the_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = system_texts()
    path = imagefile.entry_path(texts, "code-a")
    assert imagefile.entry_path(texts, "code-b") != path
    assert imagefile.entry_path([texts[0], (texts[1][0], texts[1][1] + " "), *texts[2:]], "code-a") != path
    assert imagefile.entry_path(texts[:-1], "code-a") != path
    monkeypatch.setattr(imagefile.sys, "version", imagefile.sys.version + " other")
    assert imagefile.entry_path(texts, "code-a") != path
    package = tmp_path / "package"
    (package / "inner" / "__pycache__").mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    (package / "inner" / "b.py").write_text("B = 2\n")
    signature = package_signature(package)
    (package / "inner" / "__pycache__" / "b.cpython-311.pyc").write_bytes(b"compiled")
    (package / "notes.txt").write_text("not code")
    assert package_signature(package) == signature  # only the Python files count
    (package / "inner" / "b.py").write_text("B = 3\n")
    os.utime(package / "inner" / "b.py", ns=(1, 1))
    assert package_signature(package) != signature
    assert package_signature() != signature and len(package_signature()) == 64


def test_a_write_keeps_the_newest_entries_and_removes_the_older(cache: Path) -> None:
    """Each install (another signature) writes an entry of its own; a write leaves the
    KEPT_ENTRIES most recently written, the one just written among them, and a temporary
    file of another writer's write under way."""
    image = system_image(expand=False, forms=True)
    texts = system_texts()
    signatures = [f"install-{i}" for i in range(imagefile.KEPT_ENTRIES + 2)]
    folder = cache / imagefile.KIND
    start = time.time() + 10  # after the entry system_image wrote
    for i, signature in enumerate(signatures):
        imagefile.store_image(image, texts, signature, kept_on_disk)
        written = imagefile.entry_path(texts, signature)
        os.utime(written, (start + i, start + i))  # written in this order, a second apart
        if i == 1:
            (folder / f".{written.name}.under-way.tmp").write_bytes(b"half")
    newest = {imagefile.entry_path(texts, s) for s in signatures[-imagefile.KEPT_ENTRIES:]}
    assert set(entries(cache)) == newest
    assert any(p.name.endswith(".under-way.tmp") for p in folder.iterdir())
    assert imagefile.stored_image(texts, signatures[-1]) is not None and imagefile.stored_image(texts, signatures[0]) is None


def test_a_projects_own_library_never_reaches_the_disk(cache: Path, tmp_path: Path) -> None:
    """A standard module recorded after a project's library depends on that library: the
    disk keeps the prelude's, the contract macros' and the standard modules' expansions made
    after standard modules only, and nothing of the project (not even its paths)."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "sexpgpu.toml").write_text("")
    (project / "helpers.lisp").write_text("(defun widen (x) (* 2 x))\n")
    main = project / "main.lisp"
    main.write_text('(require "./helpers.lisp" :as helpers)\n(require "sexpgpu/nn" :as nn)\n(print (helpers:widen 3))\n')
    assert check_every_selection(main).diagnostics == []
    (entry,) = entries(cache)
    assert str(project).encode() not in entry.read_bytes() and b"helpers" not in entry.read_bytes()
    loaded = stored()
    assert loaded is not None and all(kept_on_disk(key) for key in loaded.expanded)
    assert not any(key[0].startswith("sexpgpu/lib/nn.lisp") for key in loaded.expanded)  # recorded after helpers
    assert standard_context("sexpgpu/lib/optim.lisp\nafter sexpgpu/nn@0a1b; within ")
    assert not standard_context(f"sexpgpu/lib/nn.lisp\nafter {project / 'helpers.lisp'}@0a1b; within ")
    assert not standard_context("helpers.lisp\nafter ; within ")


def test_a_sweep_reads_the_texts_once_and_keeps_them_for_the_next(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep's check where the disk holds an image without the texts' forms (a plain
    check made it) reads them once and keeps them: the next sweep reads none."""
    check_every_selection(EXAMPLES / "quickstart.lisp")
    plain_image = stored()
    assert plain_image is not None and not plain_image.texts
    read: list[int] = []
    real = SystemImage.read

    def reading(texts: Any) -> SystemImage:
        read.append(1)
        return real(texts)

    monkeypatch.setattr(SystemImage, "read", staticmethod(reading))
    check_every_selection(EXAMPLES / "search.lisp")
    check_every_selection(EXAMPLES / "search.lisp")
    assert read == [1]
    sweep_image = stored()
    assert sweep_image is not None and set(sweep_image.texts) == set(system_texts())
    assert pipeline.system_image(expand=False, forms=True).texts.keys() == sweep_image.texts.keys()
