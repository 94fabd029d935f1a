"""The C compiler the CPU device compiles its kernels with, and the on-disk cache of what it
compiled.

The compiler is `$CC` when set, else the first of `cc`, `gcc` and `clang` on the PATH; it
compiles with `-O3 -march=native` and the flags that keep the numbers NumPy's: no fused
multiply-add (`-ffp-contract=off`: a*b+c rounds twice, as NumPy and the CUDA device compute
it), wrapping signed integers (`-fwrapv`, as NumPy's), and nothing of `-ffast-math`.

A compiled module is cached by the SHA-256 of its source, the compiler's identity (its path
and `--version`), the flags and this CPU's model and features (what `-march=native` compiled
for), in `$SEXPGPU_CACHE/kernels` (`~/.cache/sexpgpu/kernels` by default; the prepared-data
cache is `$SEXPGPU_CACHE/data`), named `KIND-KEY.v2.so`. A cached library ends with its own
SHA-256 (after the ELF image, where the loader never looks), so the library and its digest
are one file, published by one rename (diskcache.py): processes compiling the same module at
once each get a whole library, and a library that is truncated, empty, overwritten, or not a
file at all is compiled again and replaces it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from ..backend import DeviceError
from ..diskcache import BadEntry, Cache, cache_root, read_entry

COMPILER_VARIABLE = "CC"
CANDIDATES = ("cc", "gcc", "clang")
SEAL = b"SXSHA256"  # what precedes a cached library's digest at its end
LIBRARY_SUFFIX = ".v2.so"  # a sealed library; `NAME-DIGEST.so` (no .v2) is an older sexpgpu's, never read
DIGEST_BYTES = 32
MAX_LIBRARY_BYTES = 256 << 20  # far above any kernel module; a bigger file is not one of ours
FLAGS = ("-std=gnu11", "-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math", "-fwrapv", "-fPIC", "-shared", "-pthread")


class NoCompiler(DeviceError):
    """No working C compiler here: the CPU device falls back to the NumPy backend."""


def cache_folder(environ: Optional[Mapping[str, str]] = None) -> Path:
    return cache_root(environ) / "kernels"


def seal(library: bytes) -> bytes:
    """LIBRARY as the cache keeps it: followed by SEAL and its SHA-256."""
    return library + SEAL + hashlib.sha256(library).digest()


def sealed_problem(blob: bytes) -> Optional[str]:
    """None when BLOB is a library followed by its own digest, else what is wrong with it."""
    if len(blob) < len(SEAL) + DIGEST_BYTES or blob[-DIGEST_BYTES - len(SEAL):-DIGEST_BYTES] != SEAL:
        return "empty" if not blob else "truncated or not a cached library (no digest at its end)"
    if hashlib.sha256(blob[:-DIGEST_BYTES - len(SEAL)]).digest() != blob[-DIGEST_BYTES:]:
        return "its bytes do not match its digest"
    return None


def library_problem(path: Path) -> Optional[str]:
    """None when PATH holds a whole cached library, else why it does not (doctor's check)."""
    try:
        blob = read_entry(path, MAX_LIBRARY_BYTES)
    except BadEntry as exc:
        return str(exc)
    return "gone" if blob is None else sealed_problem(blob)


def cpu_signature() -> str:
    """This CPU's model and feature flags (what -march=native compiles for)."""
    try:
        with open("/proc/cpuinfo") as info:
            lines = [line for line in info if line.startswith(("model name", "flags"))][:2]
        return "".join(lines)
    except OSError:
        import platform

        return platform.processor() or platform.machine()


@dataclass
class Compiled:
    """What compiling one module cost (for explain and the run's notice)."""

    path: Path
    seconds: float  # 0 when it came from the cache
    cached: bool
    private: bool = False  # compiled into this process's private cache (the shared one cannot be written)


@dataclass
class Toolchain:
    """A working C compiler and the cache folder."""

    compiler: str
    version: str
    cache: Path
    flags: tuple[str, ...] = FLAGS
    compiled: list[Compiled] = field(default_factory=list)

    @property
    def identity(self) -> str:
        return f"{self.compiler}\n{self.version}\n{' '.join(self.flags)}\n{cpu_signature()}"

    def describe(self) -> str:
        return f"{self.compiler} ({self.version.splitlines()[0] if self.version else 'unknown version'})"

    def build(self, source: str, kind: str = "kernels", link: tuple[str, ...] = ()) -> Compiled:
        """The shared library compiled from SOURCE (C), linked with LINK (the linker's arguments
        after the source), from the cache when a whole one is there."""
        digest = hashlib.sha256((self.identity + "\n" + " ".join(link) + "\n" + source).encode()).hexdigest()[:32]
        name = f"{kind}-{digest}{LIBRARY_SUFFIX}"
        cache = Cache(self.cache.parent, self.cache.name)
        for path in cache.paths(name):
            if library_problem(path) is None:
                done = Compiled(path, 0.0, True)
                self.compiled.append(done)
                return done
        start = time.perf_counter()
        library = self.compile(source, link)
        path, private = cache.write(name, lambda out: out.write(seal(library)))
        done = Compiled(path, time.perf_counter() - start, False, private)
        self.compiled.append(done)
        return done

    def compile(self, source: str, link: tuple[str, ...] = ()) -> bytes:
        """SOURCE compiled (and linked with LINK), in a scratch folder of its own: the library's bytes."""
        with tempfile.TemporaryDirectory(prefix="sexpgpu-cc-") as scratch:
            c_file, out = os.path.join(scratch, "module.c"), os.path.join(scratch, "module.so")
            with open(c_file, "w") as handle:
                handle.write(source)
            result = subprocess.run([self.compiler, *self.flags, "-o", out, c_file, *link, "-lm"], capture_output=True, text=True)
            if result.returncode != 0:
                raise RuntimeError(f"the C compiler refused a generated kernel module ({self.describe()}):\n{result.stderr[-4000:]}")
            with open(out, "rb") as built:
                return built.read()


def find_compiler(environ: Optional[Mapping[str, str]] = None) -> str:
    """The compiler's path: $CC, else cc, gcc or clang from the PATH; NoCompiler says why none."""
    environ = os.environ if environ is None else environ
    path = environ.get("PATH", os.defpath)
    wanted = environ.get(COMPILER_VARIABLE, "").strip()
    if wanted:
        found = shutil.which(wanted.split()[0], path=path)
        if found is None:
            raise NoCompiler(f"$CC={wanted!r} is not a program on the PATH")
        return found
    for name in CANDIDATES:
        found = shutil.which(name, path=path)
        if found is not None:
            return found
    raise NoCompiler(f"no C compiler found ({', '.join(CANDIDATES)} on the PATH, or $CC)")


def open_toolchain(environ: Optional[Mapping[str, str]] = None) -> Toolchain:
    """The compiler, checked by asking its version; NoCompiler when there is none that runs."""
    compiler = find_compiler(environ)
    try:
        result = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NoCompiler(f"the C compiler {compiler} does not run: {exc}") from None
    if result.returncode != 0:
        raise NoCompiler(f"the C compiler {compiler} does not run: {result.stderr.strip()[:200]}")
    return Toolchain(compiler=compiler, version=result.stdout.strip(), cache=cache_folder(environ))
