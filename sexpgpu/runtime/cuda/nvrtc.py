"""The generated kernels through NVRTC and ptxas without a GPU: what a GPU would meet first.

NVRTC (`libnvrtc.so`, from the `nvidia-cuda-nvrtc-cu12` wheel or `$SEXPGPU_NVRTC`) compiles a
kernel with the options the CUDA device gives CuPy's `RawModule` (cubins.py's
`COMPILE_OPTIONS`), plus `-ftz=true`, which CuPy adds itself, to PTX for `compute_90`; ptxas
(the `nvidia-cuda-nvcc-cu12` wheel or `$SEXPGPU_PTXAS`) assembles it for `sm_90` with `-v`,
which reports each kernel's registers, spills, static shared memory and constant bank; the
parameter bytes are read from the PTX entry's parameter list. Neither needs a GPU or a driver.

A kernel fails the check on a compile error, on any warning but an unused variable, on a
spill, or when it exceeds sm_90's limits for the block it is launched with (registers x
threads, 48 KiB of static shared memory, 4 KiB of parameters).

`check` builds the kernels in units of a few (the prelude once, then the kernels), in
threads, and keeps each unit's cubin (cubins.py: what the device loads) and its report
(`DIGEST.json`, beside the cubin, with the NVRTC version that made it), so an unchanged unit
is not built again.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, ValidationError

from ..backend import DeviceError
from ..lower.codegen import BLOCK, PARAM_BYTES, KernelSource
from .cubins import COMPILE_OPTIONS, digest, link, lookup, unit_path, unit_source, write_atomically

CUPY_ADDS = ("-ftz=true",)  # what CuPy's compile_with_cache appends to a RawModule's options
ARCH = "90"  # the H100/H200 the GPU machines have
REGISTER_FILE = 65536  # 32-bit registers per SM (and per block) on sm_90
STATIC_SHARED = 48 * 1024  # static __shared__ per block
ALLOWED_WARNINGS = (re.compile(r"variable \"[^\"]*\" was (declared|set) but never (referenced|used)"),)


class Toolchain(DeviceError):
    """No NVRTC library or no ptxas here: the check cannot run (pip install -e '.[test]')."""


class KernelReport(BaseModel):
    """One kernel as ptxas built it for sm_90 (what a result file records per kernel)."""

    name: str
    registers: int
    spill_bytes: int  # spill stores + spill loads
    stack_bytes: int
    static_shared: int
    param_bytes: int
    threads: int  # the block it is launched with
    problems: list[str]


class UnitReport(BaseModel):
    """One compile unit (the prelude and one kernel): its kernels, or what stopped it."""

    digest: str
    kernels: list[KernelReport]
    errors: list[str]  # compile errors and warnings that are not allowed


def find_nvrtc() -> Path:
    """libnvrtc.so: `$SEXPGPU_NVRTC`, else the nvidia-cuda-nvrtc wheel's."""
    configured = os.environ.get("SEXPGPU_NVRTC")
    if configured:
        return Path(configured)
    try:
        import nvidia.cuda_nvrtc
    except ImportError:
        raise Toolchain("no NVRTC: pip install -e '.[test]' (nvidia-cuda-nvrtc-cu12) or set SEXPGPU_NVRTC to a libnvrtc.so") from None
    folder = Path(next(iter(nvidia.cuda_nvrtc.__path__))) / "lib"
    found = sorted(p for p in folder.glob("libnvrtc.so*") if ".alt." not in p.name)
    if not found:
        raise Toolchain(f"no libnvrtc.so in {folder}")
    return found[0]


def find_ptxas() -> Path:
    """ptxas: `$SEXPGPU_PTXAS`, else the nvidia-cuda-nvcc wheel's, else the PATH's."""
    configured = os.environ.get("SEXPGPU_PTXAS")
    if configured:
        return Path(configured)
    try:
        import nvidia.cuda_nvcc

        candidate = Path(next(iter(nvidia.cuda_nvcc.__path__))) / "bin" / "ptxas"
        if candidate.exists():
            return candidate
    except ImportError:
        pass
    on_path = shutil.which("ptxas")
    if on_path is None:
        raise Toolchain("no ptxas: pip install -e '.[test]' (nvidia-cuda-nvcc-cu12) or set SEXPGPU_PTXAS")
    return Path(on_path)


@dataclass
class Nvrtc:
    """The NVRTC library through ctypes; thread-safe (each call its own program), and ctypes
    lets go of the GIL during a compile, so threads compile in parallel."""

    lib: ctypes.CDLL

    @classmethod
    def load(cls, path: Optional[Path] = None) -> "Nvrtc":
        lib = ctypes.CDLL(str(path or find_nvrtc()))
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        return cls(lib)

    def version(self) -> tuple[int, int]:
        major, minor = ctypes.c_int(), ctypes.c_int()
        self.check(self.lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
        return major.value, minor.value

    def check(self, status: int) -> None:
        if status != 0:
            raise DeviceError(f"NVRTC: {self.lib.nvrtcGetErrorString(status).decode()}")

    def compile(self, source: str, options: tuple[str, ...], name: str = "sexpgpu.cu") -> tuple[Optional[str], str]:
        """SOURCE compiled with OPTIONS: (its PTX, or None when it does not compile; the log)."""
        program = ctypes.c_void_p()
        self.check(self.lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None))
        try:
            encoded = [o.encode() for o in options]
            status = self.lib.nvrtcCompileProgram(program, len(encoded), (ctypes.c_char_p * len(encoded))(*encoded))
            size = ctypes.c_size_t()
            self.check(self.lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)))
            log = ctypes.create_string_buffer(size.value)
            self.check(self.lib.nvrtcGetProgramLog(program, log))
            if status != 0:
                return None, log.value.decode(errors="replace")
            self.check(self.lib.nvrtcGetPTXSize(program, ctypes.byref(size)))
            ptx = ctypes.create_string_buffer(size.value)
            self.check(self.lib.nvrtcGetPTX(program, ptx))
            return ptx.value.decode(), log.value.decode(errors="replace")
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(program))


def disallowed(log: str) -> list[str]:
    """The warnings and errors of a compile log, but an unused variable's."""
    lines = [line.strip() for line in log.splitlines() if re.search(r"\b(warning|error)\b", line, re.IGNORECASE) and not line.lstrip().startswith("Remark")]
    return [line for line in lines if not any(p.search(line) for p in ALLOWED_WARNINGS)]


PTX_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)", re.S)
PTX_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)\s+\w+(?:\[(\d+)\])?")
PARAM_SIZES = {"u64": 8, "s64": 8, "b64": 8, "f64": 8, "u32": 4, "s32": 4, "b32": 4, "f32": 4, "u16": 2, "s16": 2, "b16": 2, "u8": 1, "s8": 1, "b8": 1}


def param_bytes(ptx: str) -> dict[str, int]:
    """Each entry's parameter bytes, laid out as the driver lays them (each aligned to its size)."""
    out: dict[str, int] = {}
    for name, params in PTX_ENTRY.findall(ptx):
        offset = 0
        for align, kind, count in PTX_PARAM.findall(params):
            size = PARAM_SIZES[kind] * (int(count) if count else 1)
            alignment = int(align) if align else PARAM_SIZES[kind]
            offset = -(-offset // alignment) * alignment + size
        out[name] = offset
    return out


PTXAS_FUNCTION = re.compile(r"Compiling entry function '(\w+)'")
PTXAS_STACK = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
PTXAS_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


def ptxas_reports(log: str) -> dict[str, tuple[int, int, int, int]]:
    """ptxas -v's lines per function: (registers, spill bytes, stack bytes, static shared)."""
    out: dict[str, tuple[int, int, int, int]] = {}
    current: Optional[str] = None
    stack = spills = 0
    for line in log.splitlines():
        if (m := PTXAS_FUNCTION.search(line)) is not None:
            current, stack, spills = m.group(1), 0, 0
        elif current is not None and (m := PTXAS_STACK.search(line)) is not None:
            stack, spills = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        elif current is not None and (m := PTXAS_USED.search(line)) is not None:
            out[current] = (int(m.group(1)), spills, stack, int(m.group(2) or 0))
    return out


def limits(kernel: KernelReport) -> list[str]:
    """What of sm_90's limits KERNEL exceeds, or where it spills."""
    problems = []
    if kernel.registers * kernel.threads > REGISTER_FILE:
        problems.append(f"{kernel.registers} registers x {kernel.threads} threads > {REGISTER_FILE}")
    if kernel.spill_bytes:
        problems.append(f"spills {kernel.spill_bytes} bytes to local memory")
    if kernel.static_shared > STATIC_SHARED:
        problems.append(f"{kernel.static_shared} B of static shared memory > {STATIC_SHARED}")
    if kernel.param_bytes > PARAM_BYTES:
        problems.append(f"{kernel.param_bytes} B of parameters > {PARAM_BYTES}")
    return problems


def assemble_ptx(ptxas: Path, ptx: str, arch: str = ARCH) -> tuple[Optional[bytes], str]:
    """PTX through `ptxas -arch=sm_ARCH -v`: (the cubin, or None when it fails; the log)."""
    with tempfile.TemporaryDirectory(prefix="sexpgpu-ptxas-") as folder:
        source, cubin = Path(folder) / "unit.ptx", Path(folder) / "unit.cubin"
        source.write_text(ptx)
        done = subprocess.run([str(ptxas), f"-arch=sm_{arch}", "-v", "-o", str(cubin), str(source)], capture_output=True, text=True)
        log = done.stdout + done.stderr
        return (cubin.read_bytes() if done.returncode == 0 and cubin.exists() else None), log


def options(base: tuple[str, ...], arch: str = ARCH) -> tuple[str, ...]:
    """What NVRTC sees when CuPy compiles BASE for compute_ARCH."""
    return (*base, *CUPY_ADDS, f"-arch=compute_{arch}")


def build_unit(nvrtc: Nvrtc, ptxas: Path, key: str, source: str, threads: dict[str, int], base: tuple[str, ...],
               arch: str = ARCH) -> tuple[UnitReport, Optional[bytes]]:
    """SOURCE (the prelude and its kernels) through NVRTC and ptxas: the report and the cubin."""
    ptx, log = nvrtc.compile(source, options(base, arch))
    errors = disallowed(log)
    if ptx is None:
        return UnitReport(digest=key, kernels=[], errors=errors or [log.strip()[-2000:]]), None
    cubin, assembled = assemble_ptx(ptxas, ptx, arch)
    errors += [line for line in disallowed(assembled) if "ptxas info" not in line]
    if cubin is None:
        return UnitReport(digest=key, kernels=[], errors=errors or [assembled.strip()[-2000:]]), None
    sizes = param_bytes(ptx)
    kernels = []
    for name, (registers, spills, stack, shared) in sorted(ptxas_reports(assembled).items()):
        report = KernelReport(name=name, registers=registers, spill_bytes=spills, stack_bytes=stack, static_shared=shared,
                              param_bytes=sizes.get(name, 0), threads=threads.get(name, 256), problems=[])
        report.problems = limits(report)
        kernels.append(report)
    missing = sorted(set(threads) - {k.name for k in kernels})
    errors += [f"{name}: not in ptxas's report" for name in missing]
    return UnitReport(digest=key, kernels=kernels, errors=errors), cubin


class CachedUnit(BaseModel):
    """A unit's report as kept beside its cubin."""

    nvrtc: str
    report: UnitReport


class CheckReport(BaseModel):
    """Every kernel given to `check`, as sm_90 would take it."""

    nvrtc: str
    units: int
    built: int  # units compiled now (the others came from the cache)
    kernels: list[KernelReport]
    errors: list[str]  # "kernel: message" for every compile error or disallowed warning

    @property
    def failures(self) -> list[str]:
        return self.errors + [f"{k.name}: {p}" for k in self.kernels for p in k.problems]


def check(kernels: list[KernelSource], root: Optional[Path] = None, arch: str = ARCH, workers: Optional[int] = None) -> CheckReport:
    """Every distinct kernel of KERNELS through NVRTC and ptxas for sm_ARCH, WORKERS units at
    a time (the CPUs by default), each unit's cubin and report kept under ROOT (the cache
    root). A unit is the kernels whose names end in the same two hex digits (a kernel's name
    is the hash of its text): a changed kernel rebuilds its unit only. A unit that does not
    build is built again a kernel at a time, so that each error names its kernel."""
    nvrtc, ptxas = Nvrtc.load(), find_ptxas()
    version = ".".join(map(str, nvrtc.version()))
    buckets: dict[str, list[KernelSource]] = {}
    for kernel in sorted({k.name: k for k in kernels}.values(), key=lambda k: k.name):
        buckets.setdefault(kernel.name[-12:-10], []).append(kernel)
    units = list(buckets.values())
    cached = [cached_unit(unit, version, arch, root) for unit in units]
    todo = [unit for unit, report in zip(units, cached) if report is None]

    def build(unit: list[KernelSource]) -> list[UnitReport]:
        report = build_and_keep(nvrtc, ptxas, version, unit, arch, root)
        if not report.errors or len(unit) == 1:
            return [report]
        return [build_and_keep(nvrtc, ptxas, version, [kernel], arch, root) for kernel in unit]

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        built = [r for reports in pool.map(build, todo) for r in reports]
    reports = [r for r in cached if r is not None] + built
    errors = [e for r in reports for e in r.errors]
    found = sorted((k for r in reports for k in r.kernels), key=lambda k: k.name)
    return CheckReport(nvrtc=version, units=len(units), built=len(todo), kernels=found, errors=errors)


def build_and_keep(nvrtc: Nvrtc, ptxas: Path, version: str, unit: list[KernelSource], arch: str, root: Optional[Path]) -> UnitReport:
    """UNIT built; when it builds cleanly, its cubin, its report and its kernels' links kept."""
    source = unit_source(unit)
    key = digest(source)
    report, cubin = build_unit(nvrtc, ptxas, key, source, {k.name: k.threads or BLOCK for k in unit}, COMPILE_OPTIONS, arch)
    if len(unit) == 1:  # errors name their kernel
        report.errors = [f"{unit[0].name}: {e}" for e in report.errors]
    if cubin is not None and not report.errors:
        path = unit_path(key, arch, root)
        write_atomically(path, cubin)
        write_atomically(path.with_suffix(".json"), CachedUnit(nvrtc=version, report=report).model_dump_json().encode())
        for kernel in unit:
            link(kernel, key, arch, root)
    return report


def cached_unit(unit: list[KernelSource], version: str, arch: str, root: Optional[Path]) -> Optional[UnitReport]:
    """UNIT's kept report, if NVRTC VERSION made it, its cubin is there and its kernels link
    to it."""
    key = digest(unit_source(unit))
    path = unit_path(key, arch, root)
    report = cached_report(path.with_suffix(".json"), version)
    if report is None or not path.is_file():
        return None
    for kernel in unit:
        if lookup(kernel, arch, root) != path.resolve():
            link(kernel, key, arch, root)
    return report


def cached_report(path: Path, version: str) -> Optional[UnitReport]:
    """The report kept at PATH, if NVRTC VERSION made it and it reads whole."""
    try:
        cached = CachedUnit.model_validate_json(path.read_bytes())
    except (OSError, ValidationError):
        return None
    return cached.report if cached.nvrtc == version else None
