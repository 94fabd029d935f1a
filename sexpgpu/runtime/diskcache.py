"""The on-disk caches: where they live, how an entry is read and written, and the private
cache a process falls back on when the folder cannot be written.

Every cache lives under one root, `$SEXPGPU_CACHE` (else `~/.cache/sexpgpu`): the compiled CPU
kernels in `kernels/`, the prepared datasets in `data/`, CuPy's compiled CUDA modules in
`cupy/`. A cache only saves time, so nothing found in one may stop a run:

- an entry is read only when it is a regular file (not a symbolic link, a folder, a device
  or a FIFO) no bigger than its bound, and what it holds is checked against its digest by
  the cache that owns it; an entry that fails is rebuilt;
- an entry is written whole: a temporary file in the same folder, flushed to disk, renamed
  over the name (a bad entry there, a folder included, is removed first);
- when the folder cannot be written, the process writes its entries to a private temporary
  cache, removed when it exits, and says so once on stderr.
"""

from __future__ import annotations

import atexit
import errno
import functools
import os
import shutil
import stat
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, MutableMapping, Optional

CACHE_VARIABLE = "SEXPGPU_CACHE"
KINDS = ("kernels", "data", "cupy")


class BadEntry(Exception):
    """Something is at an entry's name that is not a readable regular file (the message says what)."""


def cache_root(environ: Optional[Mapping[str, str]] = None) -> Path:
    """The root every cache lives under: `$SEXPGPU_CACHE`, else `~/.cache/sexpgpu`."""
    environ = os.environ if environ is None else environ
    configured = environ.get(CACHE_VARIABLE)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "sexpgpu"


def open_entry(path: Path) -> Optional[BinaryIO]:
    """The regular file at PATH opened for reading, or None when nothing is there; BadEntry
    when what is there is a symbolic link, a folder, a device, a FIFO or cannot be read.
    (The link is refused by the open itself and a FIFO does not block it, so no reader can
    be pointed at /dev/zero or wait on a pipe.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise BadEntry("a symbolic link" if exc.errno == errno.ELOOP else reason(exc)) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise BadEntry("a folder" if stat.S_ISDIR(mode) else "not a regular file")
    return os.fdopen(fd, "rb")


def read_entry(path: Path, limit: int) -> Optional[bytes]:
    """The bytes of the regular file at PATH (as open_entry), None when nothing is there;
    BadEntry when it holds more than LIMIT bytes."""
    handle = open_entry(path)
    if handle is None:
        return None
    with handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise BadEntry(reason(exc)) from None
    if len(data) > limit:
        raise BadEntry(f"bigger than {limit:,} bytes")
    return data


def reason(exc: OSError) -> str:
    """An OSError in words without its path (the same for every file of a folder)."""
    return os.strerror(exc.errno) if exc.errno else type(exc).__name__


def discard(path: Path) -> None:
    """Remove what is at PATH, whatever it is (a folder with what it holds; a link, not what
    it points to)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass  # another process removed it first


def publish(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """The entry at PATH written whole by WRITE: into a temporary file of the same folder,
    flushed to disk, renamed over the name; a reader sees the old entry or the new one, never
    a part. OSError when the folder cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            write(out)
            out.flush()
            os.fsync(out.fileno())
        if os.path.lexists(path) and (path.is_symlink() or not path.is_file()):
            discard(path)  # a rename cannot replace a folder
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    sync_folder(path.parent)


def sync_folder(folder: Path) -> None:
    """The folder's entries flushed to disk (so a rename survives a power loss); best effort."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
