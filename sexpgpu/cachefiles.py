"""Cache entries on disk, for every cache of sexpgpu: where the caches live, and how one entry
is read and written (runtime/diskcache.py has the caches of a run; lisp/codecache.py the
compiled code of the Lisp's generated Python, which `check` reads without the runtime).

- an entry is read only when it is a regular file (not a symbolic link, a folder, a device
  or a FIFO) no bigger than its bound; what it holds is checked by the cache that owns it;
- an entry is written whole: a temporary file in the same folder, flushed to disk, renamed
  over the name (a bad entry there, a folder included, is removed first).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO, Callable, Mapping, Optional

CACHE_VARIABLE = "SEXPGPU_CACHE"


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


def package_signature(package: Optional[Path] = None) -> str:
    """A digest of the Python files of PACKAGE (by default sexpgpu's own), by name, size and
    modification time: part of the key of an entry that holds what the code made rather than
    what it was given (lisp/imagefile.py), so that an edit, an upgrade or another checkout
    makes it again. A stat of each file, about 2 ms for the package."""
    root = package if package is not None else Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for folder, folders, files in os.walk(root):
        folders[:] = sorted(name for name in folders if name != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                try:
                    st = os.stat(os.path.join(folder, name))
                except OSError:
                    continue
                digest.update(f"{os.path.relpath(os.path.join(folder, name), root)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()
