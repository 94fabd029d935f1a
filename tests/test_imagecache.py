"""The system texts' recorded expansions on disk (sexpgpu/lisp/imagecache.py): a compile of one
file records them once per machine and every later process's world evaluates them; an entry
that is damaged, or holds anything but a template's data, is recorded again and written over."""

from __future__ import annotations

import hashlib
import marshal
from pathlib import Path
from typing import Any

import pytest

from sexpgpu.compile import pipeline
from sexpgpu.compile.pipeline import base_texts, compile_file, system_image
from sexpgpu.lisp import imagecache
from sexpgpu.lisp.evaluator import Interpreter, run_with_big_stack
from sexpgpu.lisp.image import SystemImage

from test_system_image import described, same_form, world

QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.lisp"


@pytest.fixture
def worlds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[Interpreter]:
    """Every world built from now on, in a private cache."""
    monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path))
    made: list[Interpreter] = []
    init = Interpreter.__init__

    def building(interp: Interpreter, *args: Any) -> None:
        made.append(interp)
        init(interp, *args)

    monkeypatch.setattr(Interpreter, "__init__", building)
    return made


def test_the_first_compile_records_the_expansions_and_the_next_evaluates_them(worlds: list[Interpreter]) -> None:
    path = imagecache.entry_path(base_texts())
    assert not path.exists()
    first = compile_file(QUICKSTART)
    assert path.is_file() and worlds[0].recording is not None
    second = compile_file(QUICKSTART)
    assert worlds[1].recording is None and worlds[1].image is not None and worlds[1].image.expanded
    assert first.experiment is not None and second.experiment is not None
    assert first.experiment.ir_hash == second.experiment.ir_hash and first.diagnostics == second.diagnostics


def test_the_leaves_come_back_from_disk_as_they_were_recorded(worlds: list[Interpreter]) -> None:
    image = system_image()  # records them, and writes the entry
    kept = imagecache.load(base_texts())
    assert kept is not None and set(kept.expanded) == set(image.expanded) == set(base_texts())
    for key, leaves in image.expanded.items():
        back = kept.expanded[key]
        assert [(leaf.loc, leaf.counters) for leaf in back] == [(leaf.loc, leaf.counters) for leaf in leaves]
        table = world(None).interp.base
        pairs: dict[int, Any] = {}
        for made, recorded in zip(list(image.leaves(*key, table) or []), list(kept.leaves(*key, table) or [])):
            same_form(made.form, recorded.form, pairs)
    from_disk, expanding = world(kept), world(SystemImage(image.texts))
    assert described(from_disk.interp) == described(expanding.interp)


def seal(payload: bytes) -> bytes:
    return imagecache.HEADER + hashlib.sha256(payload).digest() + payload


@pytest.mark.parametrize("damage", ["truncated", "a flipped byte", "a code object", "a foreign tag", "a folder"])
def test_a_bad_entry_is_recorded_again_and_written_over(worlds: list[Interpreter], damage: str) -> None:
    compile_file(QUICKSTART)
    path = imagecache.entry_path(base_texts())
    good = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(good[: len(good) // 2])
    elif damage == "a flipped byte":
        path.write_bytes(good[:-10] + bytes([good[-10] ^ 1]) + good[-9:])
    elif damage == "a code object":
        path.write_bytes(seal(marshal.dumps(compile("x = 1", "x", "exec"))))
    elif damage == "a foreign tag":
        path.write_bytes(seal(marshal.dumps(((( ("z", 1), ("<prelude>", 1, 1), (0, 0, 0)),), ()))))
    else:
        path.unlink()
        path.mkdir()
    assert imagecache.load(base_texts()) is None
    worlds.clear()
    result = compile_file(QUICKSTART)
    assert result.ok and worlds[0].recording is not None
    assert path.read_bytes() == good


def test_a_cache_that_cannot_be_written_leaves_each_compile_recording(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("SEXPGPU_CACHE", str(blocker / "cache"))
    assert compile_file(QUICKSTART).ok and compile_file(QUICKSTART).ok
    assert imagecache.load(base_texts()) is None


def test_a_change_to_the_lisps_python_is_another_entry(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path / "cache"))
    before = imagecache.entry_path(base_texts())
    copy = tmp_path / "lisp"
    copy.mkdir()
    for source in imagecache._SOURCES.glob("*.py"):
        (copy / source.name).write_bytes(source.read_bytes())
    monkeypatch.setattr(imagecache, "_SOURCES", copy)
    assert imagecache.entry_path(base_texts()) == before
    (copy / "builtins_conses.py").write_bytes((copy / "builtins_conses.py").read_bytes() + b"\n# changed\n")
    assert imagecache.entry_path(base_texts()) != before
    assert run_with_big_stack(lambda: pipeline.with_recorded(SystemImage({})))[1] == {}
