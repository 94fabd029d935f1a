"""The on-disk caches: where they live, how an entry is read and written, and the private
cache a process falls back on when the folder cannot be written.

Every cache lives under one root, `$SEXPGPU_CACHE` (else `~/.cache/sexpgpu`): the compiled CPU
kernels in `kernels/`, the prepared datasets in `data/`, CuPy's compiled CUDA modules in
`cupy/` (and, outside the runtime, the compiled code of the Lisp's generated Python in `code/`:
lisp/codecache.py). A cache only saves time, so nothing found in one may stop a run:

- an entry is read only when it is a regular file (not a symbolic link, a folder, a device
  or a FIFO) no bigger than its bound, and what it holds is checked against its digest by
  the cache that owns it; an entry that fails is rebuilt;
- an entry is written whole: a temporary file in the same folder, flushed to disk, renamed
  over the name (a bad entry there, a folder included, is removed first);
- (how an entry is read and written is sexpgpu/cachefiles.py, shared with lisp/codecache.py)
- when the folder cannot be written, the process writes its entries to a private temporary
  cache, removed when it exits, and says so once on stderr.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, MutableMapping, Optional

# how an entry is read and written is shared with the Lisp's code cache (cachefiles.py)
from ..cachefiles import CACHE_VARIABLE as CACHE_VARIABLE
from ..cachefiles import BadEntry as BadEntry
from ..cachefiles import cache_root as cache_root
from ..cachefiles import discard as discard
from ..cachefiles import open_entry as open_entry
from ..cachefiles import publish as publish
from ..cachefiles import read_entry as read_entry
from ..cachefiles import reason as reason
from ..cachefiles import sync_folder as sync_folder

KINDS = ("kernels", "data", "cupy")


def writable_problem(folder: Path) -> Optional[str]:
    """None when FOLDER can be created and written (by writing and removing a probe file),
    else why not, in words (EACCES, EROFS, ENOTDIR ...). Writing is the test, not
    os.access: for root, permission bits do not stop a write, and a read-only mount or a
    path under a file stops everyone."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return reason(exc)
    return None


@functools.cache
def private_root() -> Path:
    """This process's private cache (one per process), removed when the process exits."""
    folder = Path(tempfile.mkdtemp(prefix="sexpgpu-cache-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def fallen_back() -> Optional[Path]:
    """The private cache when this process has made one, else None."""
    return private_root() if private_root.cache_info().currsize else None


@functools.cache
def announce(root: Path, why: str) -> None:
    """The one line (per cache root and cause, so once per process) saying where entries go."""
    print(f"sexpgpu: the cache {root} cannot be written ({why}): this process caches in {private_root()}, removed when it ends; "
          f"set {CACHE_VARIABLE} to a writable folder (sexpgpu doctor checks it)", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Cache:
    """One cache under a root: its entries are looked up in ROOT/KIND, then in this process's
    private cache if it has one, and written to the first that can be written."""

    root: Path
    kind: str

    @property
    def folder(self) -> Path:
        return self.root / self.kind

    def paths(self, name: str) -> list[Path]:
        """Where an entry NAME may be, in the order to look."""
        private = fallen_back()
        return [self.folder / name] + ([private / self.kind / name] if private is not None else [])

    def write(self, name: str, write: Callable[[BinaryIO], object]) -> tuple[Path, bool]:
        """The entry NAME published (as publish) in this cache's folder, else in the private
        cache (saying so once); where it went and whether that is the private cache."""
        try:
            path = self.folder / name
            publish(path, write)
            return path, False
        except OSError as exc:
            announce(self.root, reason(exc))
        path = private_root() / self.kind / name
        publish(path, write)
        return path, True


def entry_count(folder: Path) -> int:
    """How many entries FOLDER holds (temporary files and probes not counted); 0 without one."""
    try:
        return sum(1 for entry in os.scandir(folder) if not entry.name.startswith("."))
    except OSError:
        return 0


def bad_entries(folder: Path, check: Callable[[Path], Optional[str]]) -> list[tuple[str, str]]:
    """Each entry of FOLDER that CHECK finds bad (it says why), by name."""
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if not entry.name.startswith("."))
    except OSError:
        return []
    found = []
    for name in names:
        problem = check(folder / name)
        if problem is not None:
            found.append((name, problem))
    return found


def regular_problem(path: Path) -> Optional[str]:
    """None when PATH is a regular file (not a link to one), else what it is."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return "gone"
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a folder"
    return None if stat.S_ISREG(mode) else "not a regular file"


def tidy(folder: Path, limit: int) -> None:
    """Remove from FOLDER every entry a reader that does not check (CuPy's) would stumble on:
    links, folders, devices, FIFOs, unreadable files and files over LIMIT bytes."""
    for entry in os.scandir(folder):
        path = Path(entry.path)
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit or not os.access(path, os.R_OK):
            discard(path)


CUPY_VARIABLE = "CUPY_CACHE_DIR"
MAX_CUBIN_BYTES = 256 << 20


def point_cupy_cache(environ: Optional[MutableMapping[str, str]] = None) -> Path:
    """The folder CuPy caches compiled CUDA modules in, set in ENVIRON's `CUPY_CACHE_DIR`
    (which CuPy reads at each compile): the root's `cupy/`, tidied (CuPy checks each entry's
    hash itself and recompiles a bad one, but it reads a link to /dev/zero forever and fails
    on a folder); this process's private cache when that cannot be written. A
    `CUPY_CACHE_DIR` set already is the user's choice, left as it is."""
    environ = os.environ if environ is None else environ
    if environ.get(CUPY_VARIABLE):
        return Path(environ[CUPY_VARIABLE])
    cache = Cache(cache_root(environ), "cupy")
    folder = cache.folder
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tidy(folder, MAX_CUBIN_BYTES)
        problem = writable_problem(folder)
    except OSError as exc:
        problem = reason(exc)
    if problem is not None:
        announce(cache.root, problem)
        folder = private_root() / cache.kind
        folder.mkdir(parents=True, exist_ok=True)
    environ[CUPY_VARIABLE] = str(folder)
    return folder
