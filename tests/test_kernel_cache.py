"""The on-disk caches under faults: a damaged entry (truncated, empty, garbage, a folder, a
link to /dev/zero) is rebuilt and the run computes the same numbers; a cache that cannot be
written (SEXPGPU_CACHE or HOME under a file, a read-only folder for a user without root's
override) sends the process to a private temporary cache, said once on stderr; doctor counts
the entries and the bad ones. Every run is the real CLI in a private SEXPGPU_CACHE."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Optional

import pytest

from conftest import REPO
from conftest import environment as child_environment

from sexpgpu.runtime.cpu.device import wants_mkl
from sexpgpu.runtime.cpu.toolchain import library_problem
from sexpgpu.runtime.data.cache import entry_problem
from sexpgpu.runtime.diskcache import point_cupy_cache

STEPS = "12"
FALLBACK = re.compile(r"^sexpgpu: the cache (\S+) cannot be written \(([^)]+)\): this process caches in (\S+), removed when it ends; "
                      r"set SEXPGPU_CACHE to a writable folder \(sexpgpu doctor checks it\)$")

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="the compiled CPU device needs a C compiler")


def project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ".git").mkdir(exist_ok=True)
    shutil.copy(REPO / "examples" / "quickstart.lisp", folder / "quickstart.lisp")
    return folder


def environment(**changes: Optional[str]) -> dict[str, str]:
    return child_environment(SEXPGPU_DEVICE=None, **changes)


def kernel_entries() -> list[str]:
    """The kinds of library a clean quickstart run leaves in the kernel cache: the program's
    two, the runtime's, and where the device calls MKL, the small library that links it."""
    return sorted(["kernels", "kernels", "runtime"] + (["mkl"] if wants_mkl(environment()) else []))


def run(folder: Path, store: str, env: dict[str, str], prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*prefix, sys.executable, "-m", "sexpgpu", "run", "quickstart.lisp", "--store", store, "--max-steps", STEPS, "--json"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=600)


def outcome(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stdout + done.stderr
    assert "internal error" not in done.stderr, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.fixture(scope="module")
def primed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """A cache filled by one clean run, and that run's final loss."""
    folder = project(tmp_path_factory.mktemp("primed"))
    cache = folder / "cache"
    first = outcome(run(folder, "runs", environment(SEXPGPU_CACHE=str(cache))))
    assert sorted(p.name.split("-")[0] for p in (cache / "kernels").iterdir()) == kernel_entries()
    assert len(list((cache / "data").iterdir())) == 1
    loss = first["final_loss"]
    assert isinstance(loss, float)
    return cache, loss


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def empty(path: Path) -> None:
    path.write_bytes(b"")


def garbage(path: Path) -> None:
    size = path.stat().st_size
    path.write_bytes(bytes((i * 131 + 7) % 256 for i in range(size)))


def folder(path: Path) -> None:
    path.unlink()
    path.mkdir()
    (path / "inside").write_text("not a library\n")


def dev_zero(path: Path) -> None:
    path.unlink()
    path.symlink_to("/dev/zero")


def fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


@pytest.mark.parametrize("damage", [truncate, empty, garbage, folder, dev_zero, fifo], ids=lambda f: f.__name__)
def test_a_damaged_entry_is_rebuilt_and_the_run_computes_the_same_numbers(tmp_path: Path, primed: tuple[Path, float], damage: Callable[[Path], None]) -> None:
    """Every kernel library and the prepared dataset damaged the same way: the run succeeds
    with the clean run's loss, says nothing of the cache, and leaves whole entries behind."""
    clean, loss = primed
    work = project(tmp_path / "project")
    cache = tmp_path / "cache"
    shutil.copytree(clean, cache)
    entries = sorted((cache / "kernels").iterdir()) + sorted((cache / "data").iterdir())
    for path in entries:
        damage(path)
    done = run(work, "runs", environment(SEXPGPU_CACHE=str(cache)))
    assert outcome(done)["final_loss"] == loss
    assert not fallback_lines(done.stderr), done.stderr
    assert [library_problem(p) for p in entries[:-1]] == [None] * len(kernel_entries())
    assert entry_problem(entries[-1]) is None
    assert all(p.is_file() and not p.is_symlink() for p in entries)
    assert sorted(p.name for p in (cache / "kernels").iterdir()) == [p.name for p in entries[:-1]]  # no temporary left


def fallback_lines(stderr: str) -> list[re.Match[str]]:
    return [m for m in (FALLBACK.match(line) for line in stderr.splitlines()) if m is not None]


def test_a_cache_under_a_file_falls_back_to_a_private_cache_said_once(tmp_path: Path, primed: tuple[Path, float]) -> None:
    """SEXPGPU_CACHE=FILE/sub cannot be created, by root either: the kernels and the data go
    to a private temporary cache, one line says so, and the private cache is gone after."""
    _, loss = primed
    work = project(tmp_path / "project")
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way\n")
    done = run(work, "runs", environment(SEXPGPU_CACHE=str(blocker / "sub")))
    assert outcome(done)["final_loss"] == loss
    (line,) = fallback_lines(done.stderr)
    assert line.group(1) == str(blocker / "sub") and line.group(2) == "Not a directory"
    assert not Path(line.group(3)).exists()
    assert blocker.read_text() == "in the way\n"


def test_an_unwritable_home_without_sexpgpu_cache_falls_back_to_a_private_cache(tmp_path: Path, primed: tuple[Path, float]) -> None:
    _, loss = primed
    work = project(tmp_path / "project")
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    done = run(work, "runs", environment(SEXPGPU_CACHE=None, HOME=str(home)))
    assert outcome(done)["final_loss"] == loss
    (line,) = fallback_lines(done.stderr)
    assert line.group(1) == str(home / ".cache" / "sexpgpu") and line.group(2) == "Not a directory"


def as_unprivileged() -> tuple[str, ...]:
    """A command prefix that runs as an ordinary user who still owns this user's files (a user
    namespace mapping us to uid 1000): permission bits apply to it, as they do not to root."""
    prefix = ("unshare", "--user", "--map-user=1000", "--map-group=1000")
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode != 0:
        pytest.skip("no user namespaces here")
    return prefix


def test_a_read_only_cache_folder_falls_back_for_an_ordinary_user(tmp_path: Path, primed: tuple[Path, float]) -> None:
    """A cache folder the user may not write (mode 0555: EACCES) whose entries are damaged:
    the run neither uses the bad entries nor stops; it compiles into its private cache."""
    clean, loss = primed
    prefix = as_unprivileged()
    work = project(tmp_path / "project")
    cache = tmp_path / "cache"
    shutil.copytree(clean, cache)
    for path in (cache / "kernels").iterdir():
        empty(path)
    for sub in (cache, cache / "kernels", cache / "data"):
        sub.chmod(0o555)
    try:
        done = run(work, "runs", environment(SEXPGPU_CACHE=str(cache)), prefix)
    finally:
        for sub in (cache, cache / "kernels", cache / "data"):
            sub.chmod(0o755)
    assert outcome(done)["final_loss"] == loss
    (line,) = fallback_lines(done.stderr)
    assert line.group(1) == str(cache) and line.group(2) == "Permission denied"
    assert all(p.stat().st_size == 0 for p in (cache / "kernels").iterdir())  # nothing written to it


def test_doctor_counts_the_entries_and_the_bad_ones_and_says_how_to_fix(tmp_path: Path, primed: tuple[Path, float]) -> None:
    clean, _ = primed
    cache = tmp_path / "cache"
    shutil.copytree(clean, cache)
    env = environment(SEXPGPU_CACHE=str(cache))

    def finding(env: dict[str, str]) -> dict[str, str]:
        done = subprocess.run([sys.executable, "-m", "sexpgpu", "doctor", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        (found,) = [f for f in json.loads(done.stdout)["findings"] if f["check"] == "cache"]
        return found

    count = len(kernel_entries())
    good = finding(env)
    assert good["level"] == "ok" and good["detail"] == f"{cache} (from $SEXPGPU_CACHE): writable; kernels {count} entries, data 1, cupy 0", good
    libraries = sorted((cache / "kernels").iterdir())
    truncate(libraries[0])
    dev_zero(libraries[1])
    bad = finding(env)
    assert bad["level"] == "warn", bad
    assert bad["detail"] == (f"{cache} (from $SEXPGPU_CACHE): writable; kernels {count} entries, data 1, cupy 0; 2 bad: "
                             f"kernels/{libraries[0].name} (truncated or not a cached library (no digest at its end)), "
                             f"kernels/{libraries[1].name} (a symbolic link)"), bad
    assert bad["fix"] == f"the next run rebuilds a bad entry; or remove them: rm -r {libraries[0]} {libraries[1]}"
    for path in libraries[:2]:
        path.unlink()
    (cache / "kernels" / "kernels-0123456789abcdef0123456789abcdef.so").write_bytes(b"an older sexpgpu's library")
    older = finding(env)
    assert older["level"] == "ok" and older["detail"] == (f"{cache} (from $SEXPGPU_CACHE): writable; kernels {count - 2} entries, data 1, cupy 0; "
                                                          "1 kernel libraries of an older sexpgpu, unused (safe to delete)"), older
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    stuck = finding(environment(SEXPGPU_CACHE=str(blocker / "sub")))
    assert stuck["level"] == "warn", stuck
    assert stuck["detail"] == (f"{blocker / 'sub'} (from $SEXPGPU_CACHE): cannot be written (Not a directory): "
                               "runs cache in a private temporary folder and compile their kernels again each time")
    assert stuck["fix"] == "set SEXPGPU_CACHE to a folder you can write"


def test_cupy_is_pointed_at_a_tidied_cache_or_the_private_one(tmp_path: Path) -> None:
    """CuPy checks its entries' hashes itself but follows a link to /dev/zero and fails on a
    folder: those are removed before it compiles; a CUPY_CACHE_DIR the user set is theirs."""
    cupy = tmp_path / "cache" / "cupy"
    cupy.mkdir(parents=True)
    (cupy / "0123_2.cubin").write_bytes(b"a cached module")
    (cupy / "4567_2.cubin").symlink_to("/dev/zero")
    (cupy / "89ab_2.cubin").mkdir()
    env = {"SEXPGPU_CACHE": str(tmp_path / "cache")}
    assert point_cupy_cache(env) == cupy and env["CUPY_CACHE_DIR"] == str(cupy)
    assert sorted(p.name for p in cupy.iterdir()) == ["0123_2.cubin"]
    mine = {"SEXPGPU_CACHE": str(tmp_path / "cache"), "CUPY_CACHE_DIR": str(tmp_path / "mine")}
    assert point_cupy_cache(mine) == tmp_path / "mine" and not (tmp_path / "mine").exists()


CUPY_FALLBACK = """
import os, sys
from sexpgpu.runtime.diskcache import point_cupy_cache
env = {"SEXPGPU_CACHE": sys.argv[1]}
folder = point_cupy_cache(env)
print(folder, env["CUPY_CACHE_DIR"], folder.is_dir())
"""


def test_cupy_caches_privately_when_the_cache_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = subprocess.run([sys.executable, "-c", CUPY_FALLBACK, str(blocker / "sub")], env=environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    folder, variable, exists = done.stdout.split()
    (line,) = fallback_lines(done.stderr)
    assert line.group(1) == str(blocker / "sub") and folder == variable == str(Path(line.group(3)) / "cupy") and exists == "True"
    assert not Path(folder).exists()  # removed when the process ended
