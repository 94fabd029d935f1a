"""One store interface for every file a run writes, over fsspec.

A store is a root (a local folder, `file://`, `memory://`, `s3://bucket/prefix`, any fsspec
URL) and paths relative to it, always with `/`. It gives:

- atomic publish: on a local folder a write goes to a temporary name in the same folder, is
  flushed and fsynced, then `os.replace`d onto the final name; on an object store it is one put
  of the whole object. A reader never sees a partial file.
- an append-only line log: `append_lines("slug/events", lines)` appends to
  `slug/events.jsonl` on a local folder (flush + fsync), and writes numbered segments
  `slug/events/000000.jsonl`, `000001.jsonl`, ... on object stores, which cannot append.
  `read_lines` reads either form back in order.
- retries with exponential backoff on transient errors (OSError, ConnectionError,
  TimeoutError, and the S3 client's connection errors, which are not OSErrors; but not the
  errors that say what the path is: missing, exists, is a folder, permission); after the
  configured attempts a `StoreError` is raised.
"""

from __future__ import annotations

import builtins
import errno
import json
import math
import os
import posixpath
import re
import shutil
import stat
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar, overload

import fsspec
from fsspec.core import url_to_fs
from pydantic import BaseModel

from ..records import dump, is_record

LOCAL_PROTOCOLS = frozenset({"file", "local"})
TEMP_SUFFIX = ".tmp"
SEGMENT_RE = re.compile(r"^(\d{6,})\.jsonl$")

# OSError subclasses that describe the path, not the connection: retrying cannot help.
class NotARegularFile(OSError):
    """The path names a link, a device, a FIFO or a folder where a file was expected: never
    opened (a link to /dev/zero once made `checkpoint verify` grow to 23 GB)."""


class UnexpectedSize(OSError):
    """The file is not the size its record says, or larger than what may be read of it."""


PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
    NotARegularFile,
    UnexpectedSize,
)
# errnos that say the store cannot take the write, now or in a few seconds: a full disk, a
# quota, a read-only mount, a name or file the filesystem refuses. Retrying only spends the
# budget (a full store once took 605 s to be reported).
PERMANENT_ERRNOS = frozenset({
    errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM,
    errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG, errno.ENOENT, errno.EEXIST,
})
# S3's error codes for the same (s3fs passes some on as the cause of an OSError)
PERMANENT_CLIENT_CODES = frozenset({
    "AccessDenied", "AllAccessDisabled", "AccountProblem", "InvalidAccessKeyId", "InvalidBucketName",
    "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken", "NoSuchBucket", "NotSignedUp",
    "QuotaExceeded", "ServiceQuotaExceededException", "EntityTooLarge",
})
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (OSError, ConnectionError, TimeoutError)
# Client libraries whose connection errors are not OSErrors, by (module, class name), so that
# checking them imports nothing: s3fs lets botocore's through untranslated (the endpoint
# refused or dropped the connection, timed out, or sent a reply cut short).
CLIENT_TRANSIENT_ERRORS = frozenset(
    {
        ("botocore.exceptions", "ConnectionError"),  # EndpointConnectionError, ConnectTimeout...
        ("botocore.exceptions", "HTTPClientError"),  # ConnectionClosedError, ReadTimeoutError...
        ("botocore.exceptions", "IncompleteReadError"),
        ("botocore.exceptions", "ResponseStreamingError"),
        ("aiohttp.client_exceptions", "ClientConnectionError"),
        ("aiohttp.client_exceptions", "ClientPayloadError"),
    }
)

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


class StoreError(OSError):
    """A store operation still failed after every retry."""


RETRIES_VARIABLE = "SEXPGPU_STORE_RETRIES"
DEFAULT_ATTEMPTS = 6  # with the backoff below: 6.2 s of waiting before an operation gives up


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: attempt k (from 1) waits base_delay * 2**(k-1), at most max_delay."""

    attempts: int = DEFAULT_ATTEMPTS
    base_delay: float = 0.2
    max_delay: float = 10.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def delay(self, attempt: int) -> float:
        return min(self.max_delay, self.base_delay * (2 ** (attempt - 1)))

    @classmethod
    def configured(cls, environ: Mapping[str, str]) -> "RetryPolicy":
        """The policy `$SEXPGPU_STORE_RETRIES` asks for: attempts per store operation
        (docs/environment.md); 1 turns retrying off."""
        text = environ.get(RETRIES_VARIABLE, "").strip()
        if not text:
            return cls()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"${RETRIES_VARIABLE}={text!r}: use a whole number of attempts, 1 or more")
        return cls(attempts=int(text))


PATIENCE_VARIABLE = "SEXPGPU_STORE_PATIENCE"
DEFAULT_PATIENCE_S = 600.0


def patience_configured(environ: Mapping[str, str]) -> float:
    """How long a run waits for an unreachable store (after each operation's own retries)
    before it writes its header and before it ends: `$SEXPGPU_STORE_PATIENCE` seconds, else
    600. Refusals (a full store, no access) are never waited for."""
    text = environ.get(PATIENCE_VARIABLE, "").strip()
    if not text:
        return DEFAULT_PATIENCE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise ValueError(f"${PATIENCE_VARIABLE}={text!r}: use a number of seconds, 0 or more")
    return value


def is_transient(error: BaseException) -> bool:
    """Worth another attempt: a connection-ish error, not one about the path or the store's
    room, and not an operation that already spent its own retries."""
    if isinstance(error, (StoreError, *PERMANENT_ERRORS)) or is_permanent(error):
        return False
    if isinstance(error, TRANSIENT_ERRORS):
        return True
    return any(
        (cls.__module__, cls.__name__) in CLIENT_TRANSIENT_ERRORS for cls in type(error).__mro__
    )


def precondition_failed(error: BaseException) -> bool:
    """An object store refused a conditional write (HTTP 412), directly or as the cause."""
    return _refused_as(error, "PreconditionFailed", "pre-conditions you specified did not hold")


def range_unsatisfiable(error: BaseException) -> bool:
    """An object store refused a ranged read as beyond the object's end (HTTP 416)."""
    return _refused_as(error, "InvalidRange", "the requested range is not satisfiable")


def _refused_as(error: BaseException, code: str, message: str) -> bool:
    """Whether an object store's reply, in ERROR or its causes, has the error CODE (or, where
    s3fs kept only the text, says MESSAGE)."""
    seen: set[int] = set()
    current: Optional[BaseException] = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        response = getattr(current, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") == code:
            return True
        if message in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


def is_permanent(error: BaseException) -> bool:
    """The store refused for good (full, a quota, no access), directly or as the cause of
    what the client raised."""
    seen: set[int] = set()
    current: Optional[BaseException] = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in PERMANENT_ERRNOS:
            return True
        response = getattr(current, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") in PERMANENT_CLIENT_CODES:
            return True
        current = current.__cause__ or current.__context__
    return False


# The S3 client libraries; their own errors (no credentials, a refused request) are not
# OSErrors, and they are told apart by module so that checking one imports nothing.
CLIENT_MODULES = frozenset({"botocore", "aiobotocore", "s3fs", "aiohttp", "boto3"})


def is_store_failure(error: BaseException) -> bool:
    """The store cannot be used (a finding for the user, exit 4), not a bug: an OSError
    (StoreError, a path under a file, no permission...) or an S3 client's own error. A
    closed stdout (BrokenPipeError) is the reader's, not the store's."""
    if isinstance(error, BrokenPipeError):
        return False
    if isinstance(error, OSError):
        return True
    return any(cls.__module__.split(".")[0] in CLIENT_MODULES for cls in type(error).__mro__)


def store_problem(url: str, error: BaseException) -> str:
    """One line for the user: which store, what it said, and the fix."""
    fix = "check the AWS_* settings and the bucket" if url.startswith("s3://") else "choose a writable folder with --store or SEXPGPU_STORE"
    return f"the store {url} cannot be used ({type(error).__name__}: {error}); {fix}"


# ---------------------------------------------------------------------------------------------
# JSON


def _finite(value: Any) -> Any:
    """VALUE with every non-finite float replaced by None (strict JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _json_default(value: Any) -> Any:
    """numpy scalars and arrays (without importing numpy), and models and records nested in dicts."""
    if isinstance(value, BaseModel):
        return _finite(value.model_dump(mode="json"))
    if is_record(value):
        return _finite(dump(value))
    for attribute in ("tolist", "item"):
        method = getattr(value, attribute, None)
        if callable(method):
            return _finite(method())
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def to_jsonable(obj: Any) -> Any:
    """A model, a record (sexpgpu/records.py) or plain value as JSON-ready data, non-finite floats as None."""
    if isinstance(obj, BaseModel):
        obj = obj.model_dump(mode="json")
    elif is_record(obj):
        obj = dump(obj)
    return _finite(obj)


def dump_json(obj: Any, indent: Optional[int] = None) -> str:
    """Strict JSON text of a model or plain value (non-finite floats become null)."""
    separators = (",", ":") if indent is None else (",", ": ")
    return json.dumps(
        to_jsonable(obj),
        indent=indent,
        separators=separators,
        ensure_ascii=False,
        allow_nan=False,
        default=_json_default,
    )


# ---------------------------------------------------------------------------------------------
# Paths


def check_path(path: str, allow_root: bool = False) -> str:
    """PATH as a clean relative `/` path; no absolute paths, no `..`."""
    if not isinstance(path, str):
        raise TypeError(f"store path must be a string, got {type(path).__name__}")
    stripped = path.strip("/")
    if not stripped:
        if allow_root:
            return ""
        raise ValueError("empty store path")
    if path.startswith("/") or "\\" in path:
        raise ValueError(f"store path must be relative with '/' separators: {path!r}")
    if "//" in stripped or ("." in stripped and ("/./" in f"/{stripped}/" or "/../" in f"/{stripped}/")):
        raise ValueError(f"store path must not contain empty, '.' or '..' parts: {path!r}")
    return stripped


def _read_to_end(descriptor: int, most: int) -> bytes:
    """At most MOST bytes of the open file DESCRIPTOR, up to its end: one read for a file that
    fits (a buffered file object around it cost as much as the read of a small file)."""
    parts: list[bytes] = []
    while most > 0 and (part := os.read(descriptor, most)):
        parts.append(part)
        most -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a file")


def _not_regular(full: str, mode: int) -> NotARegularFile:
    """The refusal of the local path FULL (of MODE, from lstat): what it is, and for a link
    where it points (and whether that is there), so the message names the real file."""
    what = _file_kind(mode)
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(full)
        except OSError:
            target = "?"
        whole = os.path.normpath(os.path.join(os.path.dirname(full), target))
        there = "" if os.path.exists(whole) else ", which does not exist"
        what = f"a symbolic link to {whole}{there}"
    return NotARegularFile(f"{full} is {what}, not a regular file: a run folder's files are read only as "
                           f"regular files, never through a link (replace it with the file itself): refused")


def _is_temp_name(name: str) -> bool:
    return name.startswith(".") and name.endswith(TEMP_SUFFIX)


def _fsync_dir(folder: str) -> None:
    """Make a rename in FOLDER durable (best effort: not every platform allows it)."""
    try:
        handle = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def _local_folders(full: str) -> list[str]:
    """The names of the folders in the local folder FULL (not a link to one, which fsspec's
    listing does not call a folder either); none when it is not there."""
    try:
        with os.scandir(full) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []


def _protocols(fs: fsspec.AbstractFileSystem) -> frozenset[str]:
    protocol = fs.protocol
    return frozenset([protocol] if isinstance(protocol, str) else protocol)


# ---------------------------------------------------------------------------------------------
# The store


@dataclass(frozen=True)
class Conditional:
    """How a conditional write went: WRITTEN, and the VERSION (ETag) it wrote when the store said."""

    written: bool
    version: Optional[str] = None


class Store:
    """Every file a run writes goes through one of these."""

    def __init__(
        self, fs: fsspec.AbstractFileSystem, root: str, retry: Optional[RetryPolicy] = None
    ) -> None:
        self.fs = fs
        self.root = root.rstrip("/")  # "" for a filesystem's top ("/", "memory://")
        self.retry = retry or RetryPolicy()
        self.is_local = bool(_protocols(fs) & LOCAL_PROTOCOLS)
        # Object stores: the next segment number per log prefix, found by listing once.
        self._next_segment: dict[str, int] = {}
        self._conditional: Optional[bool] = None  # conditional_writes(), once known

    @classmethod
    def open(
        cls, url: str = "./runs", retry: Optional[RetryPolicy] = None, **storage_options: Any
    ) -> "Store":
        """A store at URL: a local folder path, `file://...`, `memory://...`, `s3://...`.
        Its retries: RETRY, else `$SEXPGPU_STORE_RETRIES`, else 6 attempts."""
        retry = retry or RetryPolicy.configured(os.environ)
        if "://" not in url:
            return cls(fsspec.filesystem("file"), os.path.abspath(url), retry)
        if url.startswith(("s3://", "s3a://")):
            # the store's RetryPolicy is the one retry layer: botocore's and s3fs's own retries
            # (and botocore's 60 s connect timeout) made an unreachable endpoint take 69 s.
            # total_max_attempts counts the first try; botocore's max_attempts=1 still meant one retry
            storage_options.setdefault("config_kwargs", {"retries": {"total_max_attempts": 1, "mode": "standard"}, "connect_timeout": 10})
            # a fresh client: fsspec's instance cache would hand back one made for another
            # endpoint or credentials (read from the environment when the client was made)
            storage_options.setdefault("skip_instance_cache", True)
        fs, root = url_to_fs(url, **storage_options)
        if hasattr(fs, "retries"):
            fs.retries = 1
        if bool(_protocols(fs) & LOCAL_PROTOCOLS):
            root = os.path.abspath(root)
        return cls(fs, root, retry)

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def under(self, prefix: str) -> "Store":
        """The store at the folder PREFIX of this one, on the same client (an object store's
        client costs its process tens of milliseconds and megabytes to make: a sweep's driver
        writes every bundle through its own)."""
        under = Store(self.fs, self._full(prefix), self.retry)
        under._conditional = self._conditional
        return under

    # -- naming -------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The root: an absolute folder path for local stores, else the fsspec URL."""
        return self.root if self.is_local else self.fs.unstrip_protocol(self.root)

    def _full(self, path: str, allow_root: bool = False) -> str:
        relative = check_path(path, allow_root=allow_root)
        if not relative:
            return self.root or "/"
        return f"{self.root}/{relative}"

    def _relative(self, full: str) -> str:
        prefix = self.root + "/"
        return full[len(prefix):] if full.startswith(prefix) else full

    def url_of(self, path: str) -> str:
        """Where PATH lives: an absolute local path, or a URL; `Store.open` accepts either."""
        full = self._full(path, allow_root=True)
        return full if self.is_local else self.fs.unstrip_protocol(full)

    # -- retries ------------------------------------------------------------------------------

    def _retrying(self, what: str, action: Callable[[], T]) -> T:
        policy = self.retry
        for attempt in range(1, max(1, policy.attempts) + 1):
            try:
                return action()
            except BaseException as error:  # noqa: BLE001 - classified just below
                if not is_transient(error):
                    raise
                if attempt >= policy.attempts:
                    raise StoreError(
                        f"store {what} failed after {attempt} attempts: {error}"
                    ) from error
                policy.sleep(policy.delay(attempt))
        raise AssertionError("unreachable")

    # -- whole files --------------------------------------------------------------------------

    def write_bytes(self, path: str, data: bytes) -> None:
        """Publish DATA at PATH atomically, replacing any previous version."""
        full = self._full(path)
        payload = bytes(data)
        if self.is_local:
            self._retrying(f"write {path}", lambda: self._publish_local(full, payload))
        else:
            self._retrying(f"write {path}", lambda: self.fs.pipe_file(full, payload))

    def write_text(self, path: str, text: str) -> None:
        self.write_bytes(path, text.encode("utf-8"))

    def write_json(self, path: str, obj: Any, indent: Optional[int] = 2) -> None:
        """A pydantic model or plain value as JSON (non-finite floats become null)."""
        text = dump_json(obj, indent=indent)
        self.write_text(path, text + "\n")

    def create_new(self, path: str, data: bytes) -> bool:
        """Write DATA at PATH only if nothing is there (an exclusive create, so of two
        writers exactly one succeeds); False when PATH exists. On an object store only where
        it has conditional writes (S3's If-None-Match; `conditional_writes`); elsewhere use
        write and read back (runtime/lease.py)."""
        if not self.is_local:
            return self._put_if(path, data, {"mode": "create"}).written
        full = self._full(path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        try:
            descriptor = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        _fsync_dir(os.path.dirname(full))
        return True

    def conditional_writes(self) -> bool:
        """Whether this object store refuses a write whose precondition does not hold
        (S3 since 2024: If-None-Match, If-Match). Found once per store by trying: an object
        store that ignores the preconditions would let two writers both win."""
        if self.is_local:
            return False
        if self._conditional is None:
            probe = f".conditional-{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}"  # a temp name: never listed
            try:
                first = self._put_if(probe, b"1", {"mode": "create"}, probing=True).written
                second = self._put_if(probe, b"2", {"mode": "create"}, probing=True).written
                self._conditional = first and not second
            except Exception as exc:  # noqa: BLE001 - a store without the operation: write and read back
                if is_transient(exc):
                    raise
                self._conditional = False
            finally:
                self.delete(probe)
        return self._conditional

    def version(self, path: str) -> Optional[str]:
        """An object store's version of the object at PATH (its ETag): what `replace_if`
        needs; None when nothing is there."""
        full = self._full(path)

        def info() -> Optional[str]:
            self.fs.invalidate_cache(full)
            try:
                return str(self.fs.info(full).get("ETag") or "") or None
            except FileNotFoundError:
                return None

        return self._retrying(f"look at {path}", info)

    def replace_if(self, path: str, data: bytes, version: str) -> bool:
        """On an object store with conditional writes: write DATA at PATH only if the
        object there is still VERSION (If-Match); False when it changed since."""
        return self._put_if(path, data, {"IfMatch": version}).written

    def put_if(self, path: str, data: bytes, version: Optional[str]) -> "Conditional":
        """`create_new` (VERSION None) or `replace_if`, saying also the version written (what
        the store replied; None when it did not say), so that the writer's next replace needs
        no look at the object first."""
        return self._put_if(path, data, {"mode": "create"} if version is None else {"IfMatch": version})

    def _put_if(self, path: str, data: bytes, condition: dict[str, str], probing: bool = False) -> "Conditional":
        if not probing and not self.conditional_writes():
            raise NotImplementedError("this object store has no conditional writes")
        full = self._full(path)

        def put() -> Conditional:
            try:
                reply = self.fs.pipe_file(full, data, **condition)
            except FileExistsError:  # If-None-Match
                return Conditional(written=False)
            except OSError as exc:  # If-Match: s3fs says EINVAL, the code is the cause's
                if precondition_failed(exc):
                    return Conditional(written=False)
                raise
            version = reply.get("ETag") if isinstance(reply, dict) else None
            return Conditional(written=True, version=str(version) if version else None)

        return self._retrying(f"write {path}", put)

    def move_aside(self, path: str) -> Optional["MovedAside"]:
        """On a local store: rename the file at PATH to a unique name beside it (atomic: of
        two movers one gets it); None when nothing was there."""
        if not self.is_local:
            raise NotImplementedError("an object store has no atomic rename")
        full = self._full(path)
        folder, name = os.path.split(full)
        aside = os.path.join(folder, f".{name}.aside-{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}")  # a temp name: never listed
        try:
            os.rename(full, aside)
        except FileNotFoundError:
            return None
        return MovedAside(full, aside, _first_bytes(aside, 64 * 1024))

    def _publish_local(self, full: str, data: bytes) -> None:
        folder, name = os.path.split(full)
        os.makedirs(folder, exist_ok=True)
        temp = os.path.join(folder, f".{name}.{uuid.uuid4().hex[:12]}{TEMP_SUFFIX}")
        try:
            with open(temp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temp, full)
        except BaseException:
            try:
                os.unlink(temp)
            except OSError:
                pass
            raise
        _fsync_dir(folder)

    def read_bytes(self, path: str, limit: Optional[int] = None, exactly: Optional[int] = None) -> bytes:
        """The file at PATH, which must be a regular file: at most LIMIT bytes of it, or
        EXACTLY that many (what a manifest records), checked before anything is read."""
        full = self._full(path)
        return self._retrying(f"read {path}", lambda: self._read_checked(full, path, limit, exactly))[0]

    def read_stamped(self, path: str, limit: Optional[int] = None) -> tuple[bytes, Optional[float]]:
        """`read_bytes` of PATH, and when the version read was last written (`modified`'s
        time; never later than what was read): locally the opened file's own time, no look
        of its own; on an object store a look before the read."""
        if not self.is_local:
            when = self.modified(path)
            return self.read_bytes(path, limit), when
        full = self._full(path)
        return self._retrying(f"read {path}", lambda: self._read_checked(full, path, limit, None))

    def _read_checked(self, full: str, path: str, limit: Optional[int], exactly: Optional[int]) -> tuple[bytes, Optional[float]]:
        """The file's bytes and, locally, its time (None from an object store)."""
        if not self.is_local and limit is None and exactly is None:  # an object is a file: nothing to look at first
            return bytes(self.fs.cat_file(full)), None
        if not self.is_local and exactly is None and limit is not None:
            return self._read_at_most(full, path, limit), None
        if not self.is_local:
            self._check_size(path, self._regular_file_size(full, path), limit, exactly)
            return bytes(self.fs.cat_file(full)), None
        # no look first: O_NOFOLLOW refuses a link, O_NONBLOCK keeps a FIFO from hanging the
        # open, and the opened file's fstat refuses whatever is not a regular file; an open
        # that fails is explained by a look (a link, a socket) or raises as it failed. The
        # size is the opened file's: a writer that replaces the file (write, then rename)
        # leaves this descriptor on one whole version, old or new
        try:
            descriptor = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        except FileNotFoundError:
            raise
        except OSError:
            self._regular_file_size(full, path)
            raise
        try:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode):
                raise _not_regular(full, info.st_mode)
            size = info.st_size
            self._check_size(path, size, limit, exactly)
            data = _read_to_end(descriptor, size + 1)
        finally:
            os.close(descriptor)
        if len(data) != size:
            raise UnexpectedSize(f"{path} changed size while it was read")
        return data, info.st_mtime

    def _read_at_most(self, full: str, path: str, limit: int) -> bytes:
        """At most LIMIT bytes of an object, in one ranged GET of one byte more (a missing
        object is one request too, where a look first costs a HEAD and, for a missing one, a
        LIST): a larger object is refused with only those bytes read."""
        try:
            data = bytes(self.fs.cat_file(full, start=0, end=limit + 1))
        except OSError as exc:
            if not range_unsatisfiable(exc):
                raise
            return b""  # the range starts at byte 0: only an empty object cannot satisfy it
        if len(data) > limit:
            raise UnexpectedSize(f"{self.url_of(path)} is more than the {limit:,} bytes it may be: not read")
        return data

    def _check_size(self, path: str, size: int, limit: Optional[int], exactly: Optional[int]) -> None:
        if exactly is not None and size != exactly:
            raise UnexpectedSize(f"{self.url_of(path)} is {size:,} bytes, its record says {exactly:,}")
        if limit is not None and size > limit:
            raise UnexpectedSize(f"{self.url_of(path)} is {size:,} bytes, more than the {limit:,} it may be: not read")

    def read_from(self, path: str, offset: int, limit: int) -> tuple[int, bytes]:
        """(the size of the regular file at PATH, at most LIMIT of its bytes from OFFSET): how
        a reader that remembers where it stopped reads only what was added since."""
        full = self._full(path)
        return self._retrying(f"read {path}", lambda: self._read_range(full, path, offset, limit))

    def _read_range(self, full: str, path: str, offset: int, limit: int) -> tuple[int, bytes]:
        if not self.is_local:
            size = self._regular_file_size(full, path)
            end = min(size, offset + limit)
            return size, (bytes(self.fs.cat_file(full, start=offset, end=end)) if end > offset else b"")
        self._regular_file_size(full, path)
        descriptor = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(descriptor, "rb") as handle:
            info = os.fstat(descriptor)
            if not stat.S_ISREG(info.st_mode):
                raise _not_regular(full, info.st_mode)
            if info.st_size <= offset:
                return info.st_size, b""
            handle.seek(offset)
            return info.st_size, handle.read(min(limit, info.st_size - offset))

    def copy_to_local(self, path: str, destination: "os.PathLike[str]") -> None:
        """Copy the regular file at PATH to the local file DESTINATION, streamed (never whole
        in memory); a link or a special file is refused, not followed."""
        full = self._full(path)

        def copy() -> None:
            self._regular_file_size(full, path)
            if not self.is_local:
                self.fs.get_file(full, os.fspath(destination))
                return
            descriptor = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(descriptor, "rb") as source, open(destination, "wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)

        self._retrying(f"copy {path}", copy)

    def _regular_file_size(self, full: str, path: str) -> int:
        if self.is_local:
            info = os.lstat(full)
            if not stat.S_ISREG(info.st_mode):
                raise _not_regular(full, info.st_mode)
            return info.st_size
        self.fs.invalidate_cache(full)
        described = self.fs.info(full)
        if described.get("type") not in ("file", None):
            raise NotARegularFile(f"{path} is not a file ({described.get('type')}): refused")
        return int(described.get("size") or 0)

    def modified(self, path: str) -> Optional[float]:
        """When the file at PATH was last written (unix time), None when the store does not
        say; FileNotFoundError when there is none."""
        full = self._full(path)
        return self._retrying(f"look at {path}", lambda: self._modified(full))

    def _modified(self, full: str) -> Optional[float]:
        if self.is_local:
            return os.lstat(full).st_mtime
        self.fs.invalidate_cache(full)
        described = self.fs.info(full)
        when = described.get("LastModified") or described.get("mtime") or described.get("created")
        if isinstance(when, datetime):
            return when.timestamp()
        return float(when) if isinstance(when, (int, float)) else None

    def read_text(self, path: str, limit: Optional[int] = None) -> str:
        return self.read_bytes(path, limit=limit).decode("utf-8")

    @overload
    def read_json(self, path: str) -> Any: ...

    @overload
    def read_json(self, path: str, model: type[M]) -> M: ...

    def read_json(self, path: str, model: Optional[type[M]] = None) -> Any:
        """The JSON at PATH, validated as MODEL when one is given."""
        text = self.read_text(path)
        if model is not None:
            return model.model_validate_json(text)
        return json.loads(text)

    def exists(self, path: str) -> bool:
        full = self._full(path, allow_root=True)
        return self._retrying(f"exists {path}", lambda: self._exists(full))

    def _exists(self, full: str) -> bool:
        if not self.is_local:
            self.fs.invalidate_cache(full)
        return bool(self.fs.exists(full))

    def file_exists(self, path: str) -> bool:
        """Whether an object is at PATH (on a local store, as `exists`): on an object store in
        one request, where `exists` is s3fs's HEAD and, for a missing object, a LIST for a
        folder of that name."""
        full = self._full(path)
        return self._retrying(f"exists {path}", lambda: self._file_exists(full))

    def _file_exists(self, full: str) -> bool:
        if self.is_local:
            return self._exists(full)
        try:
            self.fs.cat_file(full, start=0, end=1)  # a ranged GET of its first byte
            return True
        except FileNotFoundError:
            return False
        except OSError as exc:
            if range_unsatisfiable(exc):  # only an empty object cannot give byte 0
                return True
            raise

    # below this method, `list` in the class's annotations names it: they say builtins.list
    def list(self, prefix: str = "") -> list[str]:
        """Every file under the folder PREFIX, as store paths, sorted; temp files left out."""
        full = self._full(prefix, allow_root=True)
        found = self._retrying(f"list {prefix or '/'}", lambda: self._find(full))
        paths = [self._relative(item) for item in found]
        return sorted(p for p in paths if not _is_temp_name(posixpath.basename(p)))

    def _find(self, full: str) -> builtins.list[str]:
        if not self.is_local:
            self.fs.invalidate_cache(full)
        try:
            return list(self.fs.find(full))
        except FileNotFoundError:
            return []

    def folders(self, prefix: str = "") -> builtins.list[str]:
        """The names of the folders directly under PREFIX, sorted: one listing (on an object
        store, one delimited LIST of the common prefixes), where `list` walks every file."""
        full = self._full(prefix, allow_root=True)
        if self.is_local:  # one scandir: fsspec's listing stats every entry (0.36 s for 5,000 folders)
            names: Iterable[str] = self._retrying(f"list folders {prefix or '/'}", lambda: _local_folders(full))
        else:
            entries = self._retrying(f"list folders {prefix or '/'}", lambda: self._ls(full))
            names = (posixpath.basename(str(e["name"]).rstrip("/")) for e in entries if e.get("type") == "directory")
        return sorted(n for n in names if n and not n.startswith("."))

    def _ls(self, full: str) -> builtins.list[dict[str, Any]]:
        if not self.is_local:
            self.fs.invalidate_cache(full)
        try:
            return list(self.fs.ls(full, detail=True))
        except FileNotFoundError:  # a folder nothing was written to yet holds nothing, as `list` says
            return []

    def rename(self, path: str, new_path: str) -> None:
        """Move the file at PATH to NEW_PATH (a rename on a local folder; a copy, then the
        original deleted, on an object store, which has no rename)."""
        full, target = self._full(path), self._full(new_path)
        if self.is_local:
            def move() -> None:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(full, target)

            self._retrying(f"rename {path}", move)
            return
        self._retrying(f"copy {path}", lambda: self.fs.copy(full, target))
        self._retrying(f"delete {path}", lambda: self.fs.rm(full))

    def delete(self, path: str, recursive: bool = False, missing_ok: bool = True) -> None:
        """Remove PATH (a folder only with RECURSIVE); a missing path is fine by default."""
        full = self._full(path, allow_root=True)
        try:
            self._retrying(f"delete {path}", lambda: self.fs.rm(full, recursive=recursive))
        except FileNotFoundError:
            if not missing_ok:
                raise

    # -- append-only line logs ----------------------------------------------------------------

    def log_paths(self, path_prefix: str) -> tuple[str, str]:
        """(the single local file, the segment folder) for the log at PATH_PREFIX."""
        prefix = check_path(path_prefix)
        return f"{prefix}.jsonl", prefix

    def append_lines(self, path_prefix: str, lines: Iterable[str]) -> Optional["Appended"]:
        """Append LINES (no newlines inside) to the log at PATH_PREFIX, durably, in order;
        where they went (None: there were none)."""
        items = list(lines)
        for line in items:
            if "\n" in line or "\r" in line:
                raise ValueError("a log line must not contain a newline")
        if not items:
            return None
        data = ("\n".join(items) + "\n").encode("utf-8")
        single, folder = self.log_paths(path_prefix)
        if self.is_local:
            start = self._append_local(self._full(single), data, path_prefix)
            return Appended(start=start, end=start + len(data), segment=-1, data=data)
        return Appended(start=0, end=len(data), segment=self._append_segment(folder, data, path_prefix), data=data)

    def _append_local(self, full: str, data: bytes, what: str) -> int:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        start = self._retrying(f"append {what}", lambda: _clean_end(full))

        def attempt() -> None:
            with open(full, "r+b") as handle:
                handle.seek(start)
                handle.truncate(start)  # undo what a failed attempt left
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())

        try:
            self._retrying(f"append {what}", attempt)
        except BaseException:
            _truncate_quietly(full, start)
            raise
        return start

    def _append_segment(self, folder: str, data: bytes, what: str) -> int:
        number = self._retrying(f"append {what}", lambda: self._claim_segment(folder))
        full = self._full(f"{folder}/{number:06d}.jsonl")
        # The number is fixed before retrying, so a put that landed but reported failure is
        # simply written again, never duplicated.
        self._retrying(f"append {what}", lambda: self.fs.pipe_file(full, data))
        self._next_segment[folder] = number + 1
        return number

    def _claim_segment(self, folder: str) -> int:
        number = self._next_segment.get(folder)
        if number is not None and not self._file_exists(self._full(f"{folder}/{number:06d}.jsonl")):
            return number
        # First append in this process, or another writer took the number: list again.
        existing = self._segment_numbers(folder)
        return (max(existing) + 1) if existing else 0

    def _segment_numbers(self, folder: str) -> builtins.list[int]:
        numbers = []
        for item in self._find(self._full(folder)):
            match = SEGMENT_RE.match(posixpath.basename(item))
            if match and posixpath.dirname(self._relative(item)) == folder:
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    def log_segments(self, path_prefix: str) -> builtins.list[int]:
        """The numbers of the segments of the log at PATH_PREFIX (an object store's form), in order."""
        _, folder = self.log_paths(path_prefix)
        return self._retrying(f"list {folder}", lambda: self._segment_numbers(folder))

    def read_lines(self, path_prefix: str) -> builtins.list[str]:
        """Every line of the log at PATH_PREFIX: the single file, then the segments in order.

        A final line without its newline is a torn local append and is left out."""
        single, folder = self.log_paths(path_prefix)
        lines: builtins.list[str] = []
        if self.exists(single):
            text = self.read_text(single)
            complete = text[: text.rfind("\n") + 1]
            lines.extend(complete.splitlines())
        numbers = self._retrying(f"list {folder}", lambda: self._segment_numbers(folder))
        for number in numbers:
            lines.extend(self.read_text(f"{folder}/{number:06d}.jsonl").splitlines())
        return [line for line in lines if line.strip()]


class KeptStores:
    """Stores for a process that runs many attempts (a sweep's worker): one client per
    object store bucket, made once (tens of milliseconds and megabytes each), every folder
    of it a store on that client (`under`), and the last few stores opened kept by URL, so
    that the runs' store probes its conditional writes (two writes and a delete) once, not
    for every attempt. A caller owns one."""

    MOST = 8  # stores kept by URL (a sweep's: its runs' store, the bundle in use)

    def __init__(self) -> None:
        self.roots: dict[str, Store] = {}  # object stores: by protocol and bucket
        self.opened: OrderedDict[str, Store] = OrderedDict()

    def __call__(self, url: str) -> Store:
        store = self.opened.get(url)
        if store is None:
            store = self.opened[url] = self.open(url)
            while len(self.opened) > self.MOST:
                self.opened.popitem(last=False)
        self.opened.move_to_end(url)
        return store

    def open(self, url: str) -> Store:
        protocol, sep, path = url.partition("://")
        if not sep or protocol in ("file", "memory"):
            return Store.open(url)
        bucket, _, folder = path.strip("/").partition("/")
        base = f"{protocol}://{bucket}"
        root = self.roots.get(base)
        if root is None:
            root = self.roots[base] = Store.open(base)
        return root.under(folder) if folder else root


@dataclass(frozen=True)
class Appended:
    """Where `append_lines` put its lines: bytes START to END of the local file (a torn line
    it found at the end dropped first), or the object store's segment SEGMENT (-1 locally);
    DATA is what was written."""

    start: int
    end: int
    segment: int
    data: bytes


@dataclass(frozen=True)
class MovedAside:
    """A file Store.move_aside renamed: its first bytes, and the way back or out."""

    original: str
    aside: str
    data: bytes

    def restore(self) -> None:
        """Back to its name, unless something took the name since (then it is dropped)."""
        try:
            os.link(self.aside, self.original)
        except FileExistsError:
            pass
        self.discard()

    def discard(self) -> None:
        try:
            os.unlink(self.aside)
        except (FileNotFoundError, IsADirectoryError, PermissionError):  # a folder stays, under a name never listed
            pass


def _first_bytes(full: str, count: int) -> bytes:
    """Up to COUNT bytes of the regular file FULL; nothing of a link, a FIFO or a folder
    (neither followed nor waited on)."""
    try:
        descriptor = os.open(full, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return b""
    with os.fdopen(descriptor, "rb") as handle:
        return handle.read(count) if stat.S_ISREG(os.fstat(descriptor).st_mode) else b""


def _clean_end(full: str) -> int:
    """The offset to append at in FULL (created if missing), dropping a torn final line."""
    with open(full, "ab+") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size == 0:
            return 0
        position = size
        chunk = 65536
        while position > 0:
            begin = max(0, position - chunk)
            handle.seek(begin)
            block = handle.read(position - begin)
            if position == size and block.endswith(b"\n"):
                return size
            newline = block.rfind(b"\n")
            if newline >= 0:
                return begin + newline + 1
            position = begin
        return 0


def _truncate_quietly(full: str, size: int) -> None:
    try:
        with open(full, "r+b") as handle:
            handle.truncate(size)
    except OSError:
        pass
