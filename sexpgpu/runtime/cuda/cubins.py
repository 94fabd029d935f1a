"""The precompiled kernels the CUDA device loads instead of compiling, in
`$SEXPGPU_CACHE/cubins/sm_ARCH/` (`~/.cache/sexpgpu` by default, the root of the CPU device's
kernel cache and of the prepared-data cache): compile units (the prelude and a few kernels,
`units/DIGEST.cubin`), and for each kernel `DIGEST.cubin`, a link to the unit that holds it,
DIGEST being the SHA-256 of the compile options and the source (for a kernel, the prelude and
the kernel alone), so a kernel is found by its text whatever unit compiled it.

`bench/gpu_ready.py` builds them with NVRTC and ptxas on a machine without a GPU (nvrtc.py)
and packs them (`pack`); bench/gpu_check.sh unpacks them into the GPU machine's cache. A
kernel without its cubin is compiled as before: a miss costs time, never a result. Files are
written under a temporary name and renamed, so a reader never sees half of one.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile
from pathlib import Path
from typing import Iterable, Optional

from ..diskcache import cache_root, publish
from ..lower.codegen import KernelSource
from .dialect import cuda_source

COMPILE_OPTIONS = ("--std=c++14", "--fmad=false")  # no fused multiply-add: a*b+c rounds twice, as on the CPU


def unit_source(kernels: list[KernelSource]) -> str:
    """What KERNELS are compiled from together."""
    return cuda_source(kernels)


def digest(source: str, options: tuple[str, ...] = COMPILE_OPTIONS) -> str:
    return hashlib.sha256(("\0".join(options) + "\0\0" + source).encode()).hexdigest()


def folder(arch: str, root: Optional[Path] = None) -> Path:
    """Where the cubins for sm_ARCH live."""
    return (root or cache_root()) / "cubins" / f"sm_{arch}"


def kernel_path(kernel: KernelSource, arch: str, root: Optional[Path] = None) -> Path:
    return folder(arch, root) / f"{digest(unit_source([kernel]))}.cubin"


def unit_path(key: str, arch: str, root: Optional[Path] = None) -> Path:
    return folder(arch, root) / "units" / f"{key}.cubin"


def lookup(kernel: KernelSource, arch: str, root: Optional[Path] = None) -> Optional[Path]:
    """The precompiled cubin for sm_ARCH holding KERNEL (its unit's file), if there is one."""
    path = kernel_path(kernel, arch, root)
    try:
        return path.resolve(strict=True) if path.stat().st_size > 0 else None
    except OSError:  # none, or a link to a unit that is not there
        return None


def link(kernel: KernelSource, key: str, arch: str, root: Optional[Path] = None) -> None:
    """KERNEL is found in unit KEY from now on."""
    path = kernel_path(kernel, arch, root)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    os.symlink(f"units/{key}.cubin", temporary)
    os.replace(temporary, path)


def write_atomically(path: Path, data: bytes) -> None:
    """DATA published whole at PATH (the one way a cache entry is written: diskcache.publish)."""
    publish(path, lambda out: out.write(data))


def pack(kernels: Iterable[KernelSource], archive: Path, arch: str, root: Optional[Path] = None) -> tuple[int, list[str]]:
    """The cubins of KERNELS (their links and the units they name) in the gzipped tar ARCHIVE,
    as `cubins/sm_ARCH/...`: unpacked into a cache root, they are that root's. Returns how
    many kernels have one, and the names of those that have none."""
    missing, count, units = [], 0, set()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for kernel in sorted({k.name: k for k in kernels}.values(), key=lambda k: k.name):
            unit = lookup(kernel, arch, root)
            if unit is None:
                missing.append(kernel.name)
                continue
            if unit.name not in units:
                tar.add(unit, arcname=f"cubins/sm_{arch}/units/{unit.name}")
                units.add(unit.name)
            tar.add(kernel_path(kernel, arch, root), arcname=f"cubins/sm_{arch}/{kernel_path(kernel, arch, root).name}")
            count += 1
    write_atomically(archive, buffer.getvalue())
    return count, missing
