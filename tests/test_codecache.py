"""The compiled code of the evaluator's generated Python is cached on disk between processes
(sexpgpu/lisp/codecache.py): a second process loads it instead of compiling, and an entry
that is damaged, not a regular file, or in a folder that cannot be written is never used and
never stops a check."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from sexpgpu.lisp import codecache
from sexpgpu.lisp.evaluator import Interpreter, run_with_big_stack

SOURCE = "def _unit(f0):\n    return f0 + 1\n"


def entries(root: Path) -> list[Path]:
    folder = root / codecache.KIND
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []


def test_a_second_process_loads_the_preludes_code_instead_of_compiling(tmp_path: Path) -> None:
    """The first world writes its generated units' code; a second process building the same
    world compiles none of them (its `compile` is taken away and the world still builds)."""
    env = {**os.environ, "SEXPGPU_CACHE": str(tmp_path)}
    first = subprocess.run([sys.executable, "-m", "sexpgpu", "check", str(REPO / "examples" / "quickstart.lisp")], capture_output=True, text=True, env=env, cwd=REPO)
    assert first.returncode == 0, first.stderr[-2000:]
    written = entries(tmp_path)
    assert len(written) >= 5, written  # the prelude's hot functions and the file's
    program = (
        ""
        "from sexpgpu.lisp import codecache\n"
        "from sexpgpu.lisp.evaluator import Interpreter, run_with_big_stack\n"
        "def refuse(*args, **kwargs):\n"
        "    raise AssertionError('compiled although cached')\n"
        "codecache.compile = refuse\n"  # the name cached_compile calls on a miss
        "run_with_big_stack(Interpreter)\n"
    )
    second = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, cwd=REPO)
    assert second.returncode == 0, second.stderr[-2000:]
    assert entries(tmp_path) == written


def test_an_entry_holds_the_code_sealed_and_loads_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path))
    code = codecache.cached_compile(SOURCE, "<sexpgpu generated>")
    (path,) = entries(tmp_path)
    assert path == codecache.entry_path(SOURCE, "<sexpgpu generated>")
    assert path.read_bytes().startswith(codecache.HEADER)
    namespace: dict[str, object] = {}
    exec(codecache.cached_compile(SOURCE, "<sexpgpu generated>"), namespace)
    assert namespace["_unit"](41) == 42  # type: ignore[operator]
    assert codecache.cached_compile(SOURCE, "<sexpgpu generated>") is not code  # read from disk, not kept in memory
    assert codecache.entry_path(SOURCE, "<other>") != path and codecache.entry_path(SOURCE + "\n", "<sexpgpu generated>") != path


def damage_flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x40
    path.write_bytes(bytes(data))


def damage_truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-7])


def damage_header(path: Path) -> None:
    path.write_bytes(b"not ours" + path.read_bytes())


def damage_folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("x")


def damage_link(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


@pytest.mark.parametrize("damage", [damage_flip, damage_truncate, damage_header, damage_folder, damage_link])
def test_a_damaged_entry_is_compiled_again_and_written_over(damage: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEXPGPU_CACHE", str(tmp_path))
    codecache.cached_compile(SOURCE, "<sexpgpu generated>")
    (path,) = entries(tmp_path)
    good = path.read_bytes()
    damage(path)  # type: ignore[operator]
    namespace: dict[str, object] = {}
    exec(codecache.cached_compile(SOURCE, "<sexpgpu generated>"), namespace)
    assert namespace["_unit"](1) == 2  # type: ignore[operator]
    assert path.is_file() and not path.is_symlink() and path.read_bytes() == good


def test_a_folder_that_cannot_be_written_leaves_the_check_compiling_silently(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("SEXPGPU_CACHE", str(blocker / "cache"))  # under a file: nothing can be made there
    interp = run_with_big_stack(Interpreter)
    assert interp.functions
    assert capsys.readouterr().err == ""
