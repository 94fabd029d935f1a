"""The compiled code of the evaluator's generated Python, kept on disk between processes.

codegen.py turns hot Lisp (the prelude's and the standard modules' functions, a user's loops)
into Python source, and Python's `compile` of that source is most of what generating costs:
0.1-0.2 s of CPU in a fresh `check` of a 5,000-line file. The generated source of the same Lisp is
the same text in every process (its names come from counters, never from addresses), so its
code object is cached by the SHA-256 of the source, the Python it was compiled by and the
name it is compiled under: `$SEXPGPU_CACHE/code/<hash>` (cachefiles.py says where the root is
and how an entry is read and written). An entry is marshal's bytes of the code object, sealed
with their SHA-256; marshal is the format of Python's own `.pyc` files and runs nothing when
read. Nothing but code this module wrote is ever loaded, and an entry that is damaged,
truncated, too large or not a regular file is compiled again and written over.

A cache only saves time: a folder that cannot be written leaves the process compiling as
before, without a word (the runtime's caches say so, because a missing kernel cache costs
minutes; this one costs milliseconds).
"""

from __future__ import annotations

import hashlib
import marshal
import sys
from pathlib import Path
from types import CodeType
from typing import Optional

from ..cachefiles import BadEntry, cache_root, publish, read_entry

KIND = "code"
HEADER = b"sexpgpu generated code 1\n"
DIGEST_BYTES = 32
ENTRY_LIMIT = 64 << 20  # generated units are tens of kilobytes; anything this size is not ours


def entry_path(source: str, filename: str) -> Path:
    """Where SOURCE's code object compiled under FILENAME is kept, for this Python."""
    key = hashlib.sha256(f"{sys.implementation.cache_tag}\0{sys.version}\0{filename}\0".encode())
    key.update(source.encode("utf-8", "surrogatepass"))
    return cache_root() / KIND / key.hexdigest()


def seal(code: CodeType) -> bytes:
    payload = marshal.dumps(code)
    return HEADER + hashlib.sha256(payload).digest() + payload


def unseal(data: bytes) -> Optional[CodeType]:
    """The code object an entry holds, or None when it is not one this module wrote whole."""
    if not data.startswith(HEADER):
        return None
    digest, payload = data[len(HEADER) : len(HEADER) + DIGEST_BYTES], data[len(HEADER) + DIGEST_BYTES :]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        code = marshal.loads(payload)
    except (EOFError, ValueError, TypeError):
        return None
    return code if isinstance(code, CodeType) else None


def cached_compile(source: str, filename: str) -> CodeType:
    """compile(SOURCE, FILENAME, "exec"), from the cache when it holds it. Raises what
    compile raises (SyntaxError ...) for source it cannot compile; nothing is cached then."""
    path = entry_path(source, filename)
    try:
        data = read_entry(path, ENTRY_LIMIT)
    except (BadEntry, OSError):
        data = None
    code = unseal(data) if data is not None else None
    if code is not None:
        return code
    code = compile(source, filename, "exec")
    sealed = seal(code)
    try:
        publish(path, lambda out: out.write(sealed))
    except OSError:
        pass  # not writable here: compile again next time
    return code
