"""The precompiled kernels the CUDA device loads instead of compiling: one cubin per kernel, in
`$SEXPGPU_CACHE/cubins/sm_ARCH/DIGEST.cubin` (`~/.cache/sexpgpu` by default, the root of the
CPU device's kernel cache and the prepared-data cache), DIGEST being the SHA-256 of the
compile options and the unit's source (the prelude and the kernel).

`bench/gpu_ready.py` builds them with NVRTC and ptxas on a machine without a GPU (nvrtc.py);
`bench/gpu_wheels.sh` copies them into `.gpu-wheels/cubins`, which the GPU machine's check
script points `SEXPGPU_CACHE` at. A kernel without its cubin is compiled as before (a
cache miss costs time, never a result). A file is written under a temporary name and renamed,
so a reader never sees half of one.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Iterable, Optional

from ..data.cache import default_cache_dir
from .codegen import PRELUDE, KernelSource

COMPILE_OPTIONS = ("--std=c++14", "--fmad=false")  # no fused multiply-add: a*b+c rounds twice, as on the CPU


def unit_source(kernel: KernelSource) -> str:
    """What one kernel is compiled from on its own."""
    return PRELUDE + kernel.source


def digest(source: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> str:
    return hashlib.sha256(("\0".join(options) + "\0\0" + source).encode()).hexdigest()


def folder(arch: str, root: Optional[Path] = None) -> Path:
    """Where the cubins for sm_ARCH live."""
    return (root or default_cache_dir()) / "cubins" / f"sm_{arch}"


def cubin_path(kernel: KernelSource, arch: str, root: Optional[Path] = None) -> Path:
    return folder(arch, root) / f"{digest(unit_source(kernel))}.cubin"


def lookup(kernel: KernelSource, arch: str, root: Optional[Path] = None) -> Optional[Path]:
    """KERNEL's precompiled cubin for sm_ARCH, if there is one."""
    path = cubin_path(kernel, arch, root)
    return path if path.is_file() and path.stat().st_size > 0 else None


def write_atomically(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "wb") as out:
        out.write(data)
    os.replace(temporary, path)


def pack(kernels: Iterable[KernelSource], archive: Path, arch: str, root: Optional[Path] = None) -> tuple[int, list[str]]:
    """The cubins of KERNELS, as `cubins/sm_ARCH/DIGEST.cubin` in the gzipped tar ARCHIVE
    (unpacked into a cache root, they are that root's cubins): how many, and the kernels that
    have none."""
    missing, count = [], 0
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for kernel in sorted({k.name: k for k in kernels}.values(), key=lambda k: k.name):
            path = lookup(kernel, arch, root)
            if path is None:
                missing.append(kernel.name)
                continue
            tar.add(path, arcname=f"cubins/sm_{arch}/{path.name}")
            count += 1
    write_atomically(archive, buffer.getvalue())
    return count, missing
