"""The compiled CPU device (`--device cpu`, the default): the lowering's programs (runtime/lower/) with
their kernels written as C for the host (hostc.py), compiled by the system C compiler
(toolchain.py), loaded with ctypes, and run from a tape.

Each program is lowered once (runtime/lower/: the fusion partition, the arena, the steps), its
kernels are compiled into one shared library (cached on disk by source hash), and its steps'
launches are recorded once into a tape (`sx_run` in runtime_c.py walks it in C: one call from
Python per run of the program). Matmuls and convolutions' gemms are the lowering's cuBLAS
calls made to the BLAS NumPy links against (OpenBLAS in the wheels), through its C interface.
The few steps that need Python each run (the scatter-add's sort of positions by index, an op
the table declares `on_host`) split the tape there and run as the executor runs them.

Resident tensors are host arrays in their storage dtype (bf16 as its 16 bits): the loop's
parameters, state and gradients stay NumPy arrays between programs, as on the NumPy backend.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

import numpy as np

from ...ir.dtypes import DType
from ...ir.graph import Program
from ..backend import Ready
from ..lower.blas import CUBLAS_OP_N, BlasCall
from ..lower.codegen import STORAGE, KernelSource
from ..lower.executor import ArrayDevice, DeviceBackend, LoweredProgram, ProgramRun
from ..lower.fusion import Lowering
from ..lower.plan import scratch_value
from .images import CACHE_BYTES, host_schedule
from .hostc import HostKernel, host_kernels, host_prelude, numpy_ufuncs
from .runtime_c import RUNTIME_C
from .toolchain import Compiled, Toolchain

PARALLEL_WORK = 1 << 17  # bytes moved + flops per thread: a kernel with less for each runs on the calling thread
PYTHON_STEPS = ("scatter", "host")  # step kinds that run in Python each run (between stretches of the tape)
MATH_MODES = ("numpy", "libm")


class SxOp(ctypes.Structure):
    _fields_ = [(name, ctypes.c_longlong) for name in ("kind", "nargs", "first", "size", "work")] + [("fn", ctypes.c_void_p)] + [
        (name, ctypes.c_longlong) for name in ("op_a", "op_b", "m", "n", "k", "lda", "ldb", "ldc", "sa", "sb", "sc", "oa", "ob", "oc", "batch",
                                               "in_bf16", "out_bf16")]


class SxRef(ctypes.Structure):
    _fields_ = [("base", ctypes.c_longlong), ("offset", ctypes.c_longlong), ("step", ctypes.c_longlong)]


# -- what the kernels call: NumPy's f32 loops, the BLAS ------------------------------------------------------
def numpy_loops() -> list[tuple[int, int]]:
    """The f32 inner loops (function, data) of the ufuncs `numpy_ufuncs` (in the op table's order), read from each ufunc's
    PyUFuncObject (NumPy's public C struct: `functions`, `data`, `ntypes`, `name`, `types`),
    each read checked against what Python says of the ufunc."""
    loops = []
    pointer = ctypes.sizeof(ctypes.c_void_p)
    for name in numpy_ufuncs():
        ufunc = getattr(np, name)
        address = id(ufunc)
        head = 2 * pointer  # PyObject_HEAD
        nin, nout, nargs = (ctypes.c_int * 3).from_address(address + head)
        functions = ctypes.c_void_p.from_address(address + head + 16).value
        data = ctypes.c_void_p.from_address(address + head + 16 + pointer).value
        ntypes = ctypes.c_int.from_address(address + head + 16 + 2 * pointer).value
        named = ctypes.c_char_p.from_address(address + head + 24 + 2 * pointer).value
        types = ctypes.c_void_p.from_address(address + head + 24 + 3 * pointer).value
        signature = "f" * ufunc.nin + "->f"
        if (nin, nout, nargs, ntypes, named) != (ufunc.nin, ufunc.nout, ufunc.nargs, ufunc.ntypes, name.encode()) or not functions or not types:
            raise RuntimeError(f"NumPy's ufunc {name} is not laid out as this device reads it")
        k = ufunc.types.index(signature)
        codes = ctypes.string_at(types + k * nargs, nargs)
        if codes != bytes([np.dtype(np.float32).num]) * nargs:
            raise RuntimeError(f"NumPy's ufunc {name}: its loop {k} is not the f32 loop")
        fn = ctypes.c_void_p.from_address(functions + k * pointer).value
        extra = ctypes.c_void_p.from_address(data + k * pointer).value if data else None
        loops.append((int(fn or 0), int(extra or 0)))
    return loops


@dataclass(frozen=True)
class Blas:
    sgemm: int  # the address of cblas_sgemm
    int64: bool  # its integers are 64-bit (an ILP64 build)
    name: str
    get_threads: Any = None  # OpenBLAS's openblas_get_num_threads and openblas_set_num_threads (ctypes), where found
    set_threads: Any = None
    library: Optional[ctypes.CDLL] = None  # held so the library stays loaded while sgemm is called


def blas_thread_functions(library: ctypes.CDLL) -> tuple[Any, Any]:
    """OpenBLAS's get and set of its threads in LIBRARY (NumPy's wheels prefix their names), or Nones."""
    for prefix, suffix in (("scipy_", "64_"), ("scipy_", ""), ("", "64_"), ("", "")):
        get = getattr(library, f"{prefix}openblas_get_num_threads{suffix}", None)
        put = getattr(library, f"{prefix}openblas_set_num_threads{suffix}", None)
        if get is not None and put is not None:
            get.restype, get.argtypes = ctypes.c_int, []
            put.restype, put.argtypes = None, [ctypes.c_int]
            return get, put
    return None, None


BLAS_VARIABLE = "SEXPGPU_BLAS"  # which BLAS the device calls: auto (the default), mkl or numpy
BLAS_CHOICES = ("auto", "mkl", "numpy")
# MKL's sequential layer, linked as the libraries of one small library of ours: the pool threads
# the products (in pieces, as OpenBLAS held to one thread), and no OpenMP runtime is loaded
MKL_LIBRARIES = ("libmkl_intel_lp64.so", "libmkl_sequential.so", "libmkl_core.so")
MKL_SHIM_C = r"""
#include <stddef.h>
extern void cblas_sgemm(void);
extern void MKL_Get_Version_String(char* buffer, int length);
void* sx_mkl_sgemm(void) { return (void*)cblas_sgemm; }
void sx_mkl_version(char* buffer, int length) { MKL_Get_Version_String(buffer, length); }
"""


def blas_choice(environ: Mapping[str, str]) -> str:
    """ENVIRON's $SEXPGPU_BLAS as find_blas reads it (unset or empty: auto)."""
    return environ.get(BLAS_VARIABLE, "").strip().lower() or "auto"


def blas_choice_problem(environ: Mapping[str, str]) -> Optional[str]:
    """What is wrong with ENVIRON's $SEXPGPU_BLAS (a value find_blas refuses), or None."""
    choice = blas_choice(environ)
    if choice not in BLAS_CHOICES:
        return f"${BLAS_VARIABLE}={choice!r}: use one of {', '.join(BLAS_CHOICES)}"
    if choice == "mkl" and mkl_files() is None:
        return f"${BLAS_VARIABLE}=mkl, but MKL is not installed: pip install mkl==2026.2.0 (or unset ${BLAS_VARIABLE})"
    return None


def find_blas(toolchain: Toolchain, environ: Optional[Mapping[str, str]] = None) -> Blas:
    """The BLAS the device calls. By default MKL (the `mkl` wheel, a dependency on x86-64 Linux)
    on an Intel core, where its sgemm measures 15-25% faster than OpenBLAS at the benchmarks'
    products (bench/blas_choice.py), else the BLAS NumPy links against (OpenBLAS in the wheels).
    $SEXPGPU_BLAS names one: mkl or numpy."""
    environ = os.environ if environ is None else environ
    problem = blas_choice_problem(environ)
    if problem is not None:
        raise ValueError(problem)
    choice = blas_choice(environ)
    found = mkl_files() if wants_mkl(environ) else None
    if found is None:
        return numpy_blas()
    try:
        return load_mkl(toolchain, found)
    except (RuntimeError, OSError, AttributeError):  # MKL did not link or load here: by default, NumPy's BLAS instead
        if choice == "mkl":
            raise
        return numpy_blas()


def wants_mkl(environ: Mapping[str, str]) -> bool:
    """Whether find_blas tries MKL under ENVIRON: asked for, or by default on an Intel core with
    MKL installed (it builds its small library of ours into the kernel cache)."""
    choice = blas_choice(environ)
    return choice == "mkl" or (choice == "auto" and cpu_vendor() == "GenuineIntel" and mkl_files() is not None)


def cpu_vendor() -> str:
    """The first core's vendor_id in /proc/cpuinfo (GenuineIntel, AuthenticAMD), or "" where there is none."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def mkl_files() -> Optional[list[Path]]:
    """MKL_LIBRARIES (each with its version suffix) of the installed `mkl` distribution, or None."""
    try:
        files = importlib.metadata.distribution("mkl").files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found: dict[str, Path] = {}
    for file in files:
        stem = file.name.partition(".so")[0] + ".so"
        if stem in MKL_LIBRARIES and stem not in found:
            path = Path(str(file.locate())).resolve()
            if path.is_file():
                found[stem] = path
    return [found[name] for name in MKL_LIBRARIES] if len(found) == len(MKL_LIBRARIES) else None


def load_mkl(toolchain: Toolchain, libraries: list[Path]) -> Blas:
    """MKL's cblas_sgemm through a library of ours that links MKL_LIBRARIES, loaded with
    RTLD_LOCAL: MKL's symbols stay out of the process's global scope, so a library loaded
    later that carries its own MKL (PyTorch's, linked in statically) keeps calling its own,
    and ours never binds to one loaded before."""
    link = tuple(f"-l:{path.name}" for path in libraries)
    folders = tuple(dict.fromkeys(str(path.parent) for path in libraries))
    link = tuple(f"-L{folder}" for folder in folders) + link + tuple(f"-Wl,-rpath,{folder}" for folder in folders)
    library = ctypes.CDLL(str(toolchain.build(MKL_SHIM_C, "mkl", link).path))
    library.sx_mkl_sgemm.restype = ctypes.c_void_p
    library.sx_mkl_version.argtypes = [ctypes.c_char_p, ctypes.c_int]
    text = ctypes.create_string_buffer(256)
    library.sx_mkl_version(text, len(text))
    version = text.value.decode(errors="replace").partition("Version")[2].partition("-Product")[0].strip()
    return Blas(int(library.sx_mkl_sgemm() or 0), False, f"MKL {version} sequential", lambda: 1, lambda threads: None, library)


def numpy_blas() -> Blas:
    """cblas_sgemm of the BLAS NumPy links against (threadpoolctl finds its library)."""
    from threadpoolctl import threadpool_info

    for info in threadpool_info():
        if info.get("user_api") != "blas":
            continue
        library = ctypes.CDLL(info["filepath"])
        for symbol, int64 in (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("scipy_cblas_sgemm", False), ("cblas_sgemm", False)):
            function = getattr(library, symbol, None)
            if function is not None:
                version = info.get("version") or ""
                return Blas(int(ctypes.cast(function, ctypes.c_void_p).value or 0), int64, f"{info.get('internal_api')} {version}".strip(),
                            *blas_thread_functions(library), library)
    raise RuntimeError("NumPy's BLAS has no cblas_sgemm that the CPU device can call")


class CpuRuntime:
    """The runtime library (thread pool and tape runner), the BLAS, NumPy's loops and the
    toolchain: what every program of one CPU device shares."""

    def __init__(self, toolchain: Toolchain, threads: int = 1, math: str = "numpy", cache_bytes: int = CACHE_BYTES, blas: Optional[Blas] = None) -> None:
        if math not in MATH_MODES:
            raise ValueError(f"math {math!r}: use one of {MATH_MODES}")
        self.toolchain = toolchain
        self.math = math
        self.cache_bytes = cache_bytes  # a step's scratch per launch (images.host_schedule)
        self.library = ctypes.CDLL(str(toolchain.build(RUNTIME_C, "runtime").path))
        self.library.sx_pool_new.restype = ctypes.c_void_p
        self.library.sx_pool_new.argtypes = [ctypes.c_int, ctypes.c_longlong]
        self.library.sx_pool_free.argtypes = [ctypes.c_void_p]
        self.library.sx_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong]
        self.library.sx_run.restype = ctypes.c_int
        self.library.sx_pieces_exact.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.library.sx_pieces_exact.restype = ctypes.c_int
        self.library.sx_pool_split_gemms.argtypes = [ctypes.c_void_p, ctypes.c_int]
        self.library.sx_pool_shared.argtypes = [ctypes.c_void_p]
        self.library.sx_pool_shared.restype = ctypes.c_longlong
        self.blas = blas if blas is not None else find_blas(toolchain)
        self.loops = numpy_loops() if math == "numpy" else []
        self.functions: dict[str, Any] = {}  # every kernel loaded so far, by symbol
        self.libraries: list[ctypes.CDLL] = []
        self.threads = 0
        self.pool: Optional[int] = None
        self.exact_pieces: Optional[bool] = None  # whether the BLAS gives a gemm's pieces the whole product's bits (probed once, with threads)
        self.split_gemms = False
        self.set_threads(threads)

    def set_threads(self, threads: int) -> None:
        """The kernels' threads (the run's thread plan; the BLAS gets the same number through
        threadpoolctl, and the two never run at once)."""
        threads = max(1, int(threads))
        if threads == self.threads and self.pool is not None:
            return
        if self.pool is not None:
            self.library.sx_pool_free(self.pool)
        self.pool = self.library.sx_pool_new(threads, PARALLEL_WORK)
        self.threads = threads
        self.split_gemms = threads > 1 and self.pieces_available()
        self.library.sx_pool_split_gemms(self.pool, int(self.split_gemms))

    def shared_launches(self) -> int:
        """How many launches (kernels, repeats, gemm items or pieces) the pool's threads shared
        since set_threads last made it."""
        return int(self.library.sx_pool_shared(self.pool)) if self.pool is not None else 0

    def pieces_available(self) -> bool:
        """Whether, with two threads or more, the pool splits the large products into pieces
        (the BLAS gives a piece the whole product's bits, and lets this device hold it to one
        thread): probed once."""
        if self.exact_pieces is None:
            self.exact_pieces = self.blas.set_threads is not None and self.pieces_exact()
        return self.exact_pieces

    def pieces_exact(self) -> bool:
        """Whether the BLAS computes a gemm's pieces in the bits of the whole product (on one thread)."""
        before = self.blas.get_threads()
        self.blas.set_threads(1)
        try:
            return bool(self.library.sx_pieces_exact(self.blas.sgemm, int(self.blas.int64)))
        finally:
            self.blas.set_threads(before)

    def __del__(self) -> None:
        pool, self.pool = getattr(self, "pool", None), None
        if pool is not None:
            self.library.sx_pool_free(pool)

    def load(self, kernels: list[HostKernel]) -> tuple[dict[str, Any], Optional[Compiled]]:
        """Each kernel's function (by name): those this device loaded before as they are, the
        others compiled into one library (from the disk cache when it is there), NumPy's
        loops set in it. The compile, or None when every kernel was loaded before."""
        unique = {k.symbol: k for k in kernels if k.symbol not in self.functions}
        built = None
        if unique:
            source = host_prelude() + "".join(dict.fromkeys(k.preamble for k in unique.values() if k.preamble)) + "".join(k.text for k in unique.values())
            built = self.toolchain.build(source)
            library = ctypes.CDLL(str(built.path))
            self.libraries.append(library)
            if self.math == "numpy":
                library.sx_set_math.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
                for k, (fn, extra) in enumerate(self.loops):
                    library.sx_set_math(k, fn, extra or None)
            for name in unique:
                function = getattr(library, name)
                function.argtypes = [ctypes.c_void_p, ctypes.c_longlong, ctypes.c_longlong]
                function.restype = None
                self.functions[name] = function
        return {k.symbol: self.functions[k.symbol] for k in kernels}, built

    def preload(self, programs: list[Program]) -> Optional[Compiled]:
        """Every kernel of PROGRAMS compiled in one library now (one compiler call for many
        programs: a sweep's, a test's), so that the programs find them loaded."""
        return self.load([k for program in programs for k in self.kernels_of(program)])[1]

    def step_kernels(self, program: Program) -> list[tuple[int, HostKernel]]:
        """PROGRAM's host kernels with the index of the step that launches each (the step
        numbers of `explain --cuda`), in the order a CpuProgram compiles them."""
        return self.lowered_kernels(program)[1]

    def lowered_kernels(self, program: Program) -> tuple[Lowering, list[tuple[int, HostKernel]]]:
        """PROGRAM lowered and scheduled for the host, and its host kernels as `step_kernels`."""
        from ..lower.fusion import lower
        from ..lower.kernels import kernels_for

        lowering = lower(program)
        host_schedule(lowering, self.cache_bytes)
        return lowering, [(k, kernel) for k, step in enumerate(lowering.steps)
                          for kernel in host_kernels(step, lowering.program, lowering.constants, kernels_for(step, lowering.program, lowering.constants), self.math)]

    def kernels_of(self, program: Program) -> list[HostKernel]:
        """PROGRAM's host kernels, in the order a CpuProgram compiles them."""
        return [kernel for _, kernel in self.step_kernels(program)]

    def compile_cost(self, program: Program) -> dict[str, Any]:
        """What running PROGRAM first on this device costs in compiling (explain --cpu): its
        kernels, those new to this device, the seconds (0 from the disk cache), the library,
        and each kernel with its step, its items and how the host loops over them."""
        lowering, steps = self.lowered_kernels(program)
        kernels = [kernel for _, kernel in steps]
        new = len({k.symbol for k in kernels if k.symbol not in self.functions})
        _, built = self.load(kernels)
        return {"kernels": len({k.name for k in kernels}), "new": new, "seconds": round(built.seconds, 3) if built else 0.0,
                "cached": built is None or built.cached, "library": str(built.path) if built else None,
                "steps": launches(lowering, steps)}


# the host's name for the lowering's BLAS calls, and what it does with one (explain --cpu)
HOST_BLAS = (("cublasGemmStridedBatchedEx", "sgemm, batched"), ("cublasGemmEx", "sgemm"))
# (with threads, an f32 product of SX_SPLIT_GEMM multiply-adds or more is cut into pieces of its output on the
# pool's threads where sx_pieces_exact finds the BLAS gives them the whole product's bits; else the BLAS's threads)
BLAS_SCHEDULE = "the device's BLAS (doctor names it), cblas_sgemm per matrix (bf16 as f32); with threads, a large f32 product in pieces on the pool"


def host_blas(label: str) -> Optional[str]:
    """LABEL (a launch of explain --cuda) as the host names it, if it is a BLAS call."""
    for cuda, host in HOST_BLAS:
        if cuda in label:
            return label.replace(cuda, host)
    return None


def launches(lowering: Lowering, steps: list[tuple[int, HostKernel]]) -> list[dict[str, Any]]:
    """Every launch of LOWERING's steps in the order of explain --cuda's line for the step
    (the same kernels by the same names, a BLAS call by the host's name), each with the items
    the host's threads share and its schedule on the host."""
    kernels: dict[int, dict[str, HostKernel]] = {}
    for k, kernel in steps:
        kernels.setdefault(k, {})[kernel.name] = kernel
    out: list[dict[str, Any]] = []
    for k, step in enumerate(lowering.steps):
        line = step.describe(k, lowering)
        own = kernels.pop(k, {})
        for name in line.kernel.split(" + "):
            blas = host_blas(name)
            if name in own:
                kernel = own.pop(name)
                out.append({"step": k, "kernel": kernel.name, "items": kernel.size, "schedule": kernel.schedule})
            elif blas is not None:
                out.append({"step": k, "kernel": blas, "items": line.elements, "schedule": BLAS_SCHEDULE})
        out += [{"step": k, "kernel": kernel.name, "items": kernel.size, "schedule": kernel.schedule} for kernel in own.values()]
    return out


# -- running one kernel from Python (the steps between stretches of the tape) ----------------------------------
class CpuRunner:
    """The executor's KernelRunner for the steps that run in Python: kernels by name from the
    programs' libraries, gemms through the tape runner."""

    def __init__(self, runtime: CpuRuntime) -> None:
        self.runtime = runtime
        self.functions: dict[str, tuple[Any, HostKernel]] = {}

    def prepare(self, kernels: list[KernelSource]) -> None:
        """Nothing: a CpuProgram compiles its own kernels (it needs its steps, not only their
        CUDA sources) and registers them here."""

    def register(self, functions: dict[str, Any], kernels: list[HostKernel]) -> None:
        """A program's kernels: the host function of each CUDA kernel name it launches."""
        for kernel in kernels:
            self.functions[kernel.name] = (functions[kernel.symbol], kernel)

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        function, host = self.functions[kernel.name]
        pointers = (ctypes.c_void_p * max(1, len(arrays)))(*[a.ctypes.data for a in arrays])
        function(pointers, 0, kernel.size if host.launched_items else host.size)

    def gemm(self, call: BlasCall, a: Any, b: Any, c: Any) -> None:
        tape = Tape(self.runtime)
        tape.add_gemm(call, [(k + 1, 0) for k in range(3)])
        tape.run([0, a.ctypes.data, b.ctypes.data, c.ctypes.data], 3)


# -- the tape --------------------------------------------------------------------------------------------------------
Ref = tuple[int, int]  # (base, byte offset): base 0 the arena, k the k-th input
PRIVATE = -1  # a repeat's argument in the running thread's own region (its copy of the step's scratch)
REGION_ALIGN = 256
OP_FIELDS = [name for name, _ in SxOp._fields_ if name != "first"]


def region_aligned(count: int) -> int:
    return (count + REGION_ALIGN - 1) // REGION_ALIGN * REGION_ALIGN


class Tape:
    """A stretch of launches, in C's terms, run by one call of sx_run."""

    def __init__(self, runtime: CpuRuntime) -> None:
        self.runtime = runtime
        self.ops: list[SxOp] = []
        self.refs: list[tuple[int, int, int]] = []  # (base, offset, bytes per item of a repeat)
        self.workspace_floats = 0
        self.private_bytes = 0  # a thread's copy of the largest repeated step's scratch
        self.most_args = 1
        self.built: Optional[tuple[Any, Any, Any, Any, int, int, int, int]] = None

    def add_kernel(self, function: int, kernel: HostKernel, size: int, refs: list[Ref]) -> None:
        self.ops.append(SxOp(kind=0, nargs=len(refs), first=len(self.refs), size=size, work=kernel.work, fn=function))
        self.refs += [(b, o, 0) for b, o in refs]
        self.most_args = max(self.most_args, len(refs))

    def add_gemm(self, call: BlasCall, refs: list[Ref]) -> None:
        bf16 = call.in_dtype == DType.bf16
        self.ops.append(SxOp(kind=1, nargs=3, first=len(self.refs), size=call.batch, work=call.flops, fn=None,
                             op_a=int(call.op_a != CUBLAS_OP_N), op_b=int(call.op_b != CUBLAS_OP_N), m=call.m, n=call.n, k=call.k,
                             lda=call.a.ld, ldb=call.b.ld, ldc=call.c.ld, sa=call.a.stride, sb=call.b.stride, sc=call.c.stride,
                             oa=call.a.offset, ob=call.b.offset, oc=call.c.offset, batch=call.batch, in_bf16=int(bf16),
                             out_bf16=int(call.out_dtype == DType.bf16)))
        self.refs += [(b, o, 0) for b, o in refs]
        self.most_args = max(self.most_args, 3)
        if bf16:
            self.workspace_floats = max(self.workspace_floats, call.m * call.k + call.k * call.n + call.m * call.n)

    def add_repeat(self, count: int, first: Tape, second: Tape, last: Tape, private: tuple[int, int]) -> None:
        """COUNT items, each FIRST's ops (item 0's launches; SECOND's are item 1's, LAST's item
        COUNT - 1's): each argument moves by the same bytes from one item to the next, except
        those in PRIVATE (the step's scratch, [start, end) of the arena), which each thread
        running items has a copy of."""
        shapes = [[[getattr(op, name) for name in OP_FIELDS] for op in tape.ops] for tape in (first, second, last)]
        if not first.ops or shapes[0] != shapes[1] or shapes[0] != shapes[2]:
            raise RuntimeError("a repeat's items do not launch the same kernels and gemms")
        start, end = private
        refs = []
        for (base, offset, _), (base1, offset1, _), (base2, offset2, _) in zip(first.refs, second.refs, last.refs):
            step = offset1 - offset
            if base1 != base or base2 != base or offset2 != offset + (count - 1) * step:
                raise RuntimeError("a repeat's items do not read and write evenly spaced arrays")
            if base == 0 and start <= offset < end:
                if step:
                    raise RuntimeError("a repeat's items move through the step's scratch")
                refs.append((PRIVATE, offset - start, 0))
            else:
                refs.append((base, offset, step))
        work = sum(op.work for op in first.ops) * count
        self.ops.append(SxOp(kind=2, nargs=first.most_args, first=len(self.refs), size=count, work=work, fn=None, batch=len(first.ops)))
        for op in first.ops:
            self.ops.append(SxOp(**{name: getattr(op, name) for name in OP_FIELDS}, first=len(self.refs) + op.first))
        self.refs += refs
        self.most_args = max(self.most_args, first.most_args)
        self.workspace_floats = max(self.workspace_floats, first.workspace_floats)
        self.private_bytes = max(self.private_bytes, end - start)

    def region_bytes(self) -> tuple[int, int]:
        """A thread's region: its copy of the repeats' scratch, then its bf16 workspace."""
        scratch = region_aligned(self.private_bytes)
        return scratch + region_aligned(4 * max(1, self.workspace_floats)), scratch

    def build(self) -> tuple[Any, Any, Any, Any, int, int, int, int]:
        """The C arrays, the threads' regions and their aligned address (kept: a step reads no
        ctypes address again), the region's bytes and the private part's, for these threads."""
        threads = self.runtime.threads
        if self.built is None or self.built[4] != threads:
            ops = (SxOp * max(1, len(self.ops)))(*self.ops)
            refs = (SxRef * max(1, len(self.refs)))(*[SxRef(base=b, offset=o, step=t) for b, o, t in self.refs])
            scratch = (ctypes.c_void_p * self.most_args)()
            region, private = self.region_bytes()
            regions = np.empty(region * (threads if self.private_bytes else 1) + REGION_ALIGN, dtype=np.uint8)
            address = regions.ctypes.data
            address += -address % REGION_ALIGN
            self.built = (ops, refs, scratch, regions, threads, address, region if self.private_bytes else 0, private)
        return self.built

    def run(self, bases: Union[list[int], Any], count: int = 0) -> None:
        ops, refs, scratch, _, _, address, region, private = self.build()
        if not isinstance(bases, ctypes.Array):
            bases = (ctypes.c_void_p * len(bases))(*bases)
        runtime = self.runtime
        blas = runtime.blas
        # with threads the pool splits the gemms, each piece one BLAS call on one thread
        before = blas.get_threads() if runtime.split_gemms else 1
        if before > 1:
            blas.set_threads(1)
        try:
            runtime.library.sx_run(runtime.pool, ops, len(self.ops), refs, bases, scratch, blas.sgemm, int(blas.int64), address, region, private)
        finally:
            if before > 1:
                blas.set_threads(before)


@dataclass(frozen=True)
class PythonStep:
    """A step the tape leaves to Python (its index in the lowering)."""

    index: int


@dataclass(frozen=True)
class ValueRef:
    """Where a value lives once a run has made it: its base and offset, shape and storage dtype."""

    base: int
    offset: int
    shape: tuple[int, ...]
    dtype: Any


class Recording(ProgramRun):
    """A run of the steps that records their launches instead of running them."""

    def __init__(self, lowered: CpuProgram, values: dict[int, Any], spans: list[tuple[int, int]]) -> None:
        super().__init__(lowered, values)
        self.cpu = lowered
        self.spans = spans  # [start, end) addresses of the arena (base 0) and of each input
        self.tape: list[Union[Tape, PythonStep]] = []
        self.once: set[int] = set()  # indices of the tapes' ops that belong to steps made once

    def ref(self, array: Any) -> Ref:
        if array.size == 0:
            return (0, 0)
        address = array.ctypes.data
        for base, (start, end) in enumerate(self.spans):
            if start <= address < end:
                return (base, address - start)
        raise RuntimeError(f"a launch of step {self.step} reads an array that is neither the arena nor an input")

    def current(self) -> Tape:
        if not self.tape or not isinstance(self.tape[-1], Tape):
            self.tape.append(Tape(self.cpu.runtime))
        last = self.tape[-1]
        assert isinstance(last, Tape)
        return last

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        function, host = self.cpu.cpu_runner.functions[kernel.name]
        size = kernel.size if host.launched_items else host.size
        self.current().add_kernel(int(ctypes.cast(function, ctypes.c_void_p).value or 0), host, size, [self.ref(a) for a in arrays])

    def gemm(self, call: BlasCall, a: Any, b: Any, c: Any) -> None:
        self.current().add_gemm(call, [self.ref(x) for x in (a, b, c)])

    def each(self, count: int, body: Callable[[int], None], private_bytes: Optional[int] = None) -> None:
        """One repeat op of COUNT items on the tape, each BODY's launches, recorded for items 0,
        1 and the last to find how far each argument moves per item; the step's scratch (its
        first PRIVATE_BYTES where given) a copy per thread, so that the pool's threads may run
        items at once."""
        if count < 2:
            for item in range(count):
                body(item)
            return
        first, second, last = (self.record_item(body, item) for item in (0, 1, count - 1))
        raw = self.lowered.views.get(scratch_value(self.step))
        private = (0, 0)
        if raw is not None and raw.size:
            start = self.ref(raw)[1]
            private = (start, start + (raw.nbytes if private_bytes is None else min(private_bytes, raw.nbytes)))
        self.current().add_repeat(count, first, second, last, private)

    def record_item(self, body: Callable[[int], None], item: int) -> Tape:
        """BODY(ITEM)'s launches on a tape of their own."""
        kept, self.tape = self.tape, []
        try:
            body(item)
            recorded = self.tape
        finally:
            self.tape = kept
        if len(recorded) != 1 or not isinstance(recorded[0], Tape):
            raise RuntimeError(f"step {self.step}: a repeat's item must launch kernels and gemms only")
        return recorded[0]


class PythonRun(ProgramRun):
    """A step run from Python, its kernels the program's own."""

    def __init__(self, lowered: CpuProgram, values: dict[int, Any]) -> None:
        super().__init__(lowered, values)
        self.cpu = lowered

    def launch(self, kernel: KernelSource, arrays: list[Any]) -> None:
        self.cpu.cpu_runner.launch(kernel, arrays)

    def gemm(self, call: BlasCall, a: Any, b: Any, c: Any) -> None:
        self.cpu.cpu_runner.gemm(call, a, b, c)


class CpuProgram(LoweredProgram):
    """A program on the compiled CPU device: lowered, compiled, its launches on a tape."""

    def __init__(self, program: Program, device: ArrayDevice, runtime: CpuRuntime) -> None:
        self.runtime = runtime
        super().__init__(program, device)
        lowering = self.lowering
        runner = CpuRunner(runtime)  # this program's kernels, by their CUDA names
        self.cpu_runner = runner
        host = [host_kernels(step, lowering.program, lowering.constants, kernels, runtime.math) for step, kernels in zip(lowering.steps, self.kernels)]
        flat = [k for ks in host for k in ks]
        functions, self.compiled = runtime.load(flat)
        runner.register(functions, flat)
        self.kernel_count = len({k.name for k in flat})
        self.first_tape, self.later_tape, self.refs = self.record()
        self.base_array = (ctypes.c_void_p * (1 + len(self.input_ids)))()
        self.base_array[0] = self.memory.ctypes.data
        self.input_order = [(name, self.input_types[name], tuple(self.input_types[name].shape)) for name in self.input_ids]
        # the arrays whose addresses are in base_array now (held, so that no other array takes
        # an address while it is there): a feed that is the same array as last run is not
        # looked at again (a model's parameters, its state, the gradients of its train program)
        self.held: list[Any] = [None] * len(self.input_order)
        self.fixed = {vid: self.views_of(ref) for vid, ref in self.refs.items() if ref.base == 0}
        # each output: its fixed view in the arena (None: it lives in an input's array) and
        # whether the host reads that view as it is (every dtype but bf16's bits and bool's bytes)
        self.output_plan = [(name, vid, self.fixed.get(vid), self.types[vid].dtype not in (DType.bf16, DType.bool))
                            for name, vid in self.outputs.items()]

    def schedule(self, lowering: Lowering) -> None:
        host_schedule(lowering, self.runtime.cache_bytes)

    def views_of(self, ref: ValueRef, inputs: Optional[list[Any]] = None) -> Any:
        """The array at REF (in the arena, or in INPUTS' arrays)."""
        source = self.memory if ref.base == 0 else (inputs or [])[ref.base - 1].reshape(-1).view(np.uint8)
        count = int(np.prod(ref.shape, dtype=np.int64)) * np.dtype(ref.dtype).itemsize
        return source[ref.offset : ref.offset + count].view(ref.dtype).reshape(ref.shape)

    def record(self) -> tuple[list[Union[Tape, PythonStep]], list[Union[Tape, PythonStep]], dict[int, ValueRef]]:
        """The tapes of the first run (with the constants made once) and of the later ones, and
        where every value lives."""
        placeholders = [np.empty(max(1, int(np.prod(self.input_types[name].shape, dtype=np.int64))) * np.dtype(STORAGE[self.input_types[name].dtype]).itemsize,
                                 dtype=np.uint8) for name in self.input_ids]
        values: dict[int, Any] = {}
        for (name, vid), raw in zip(self.input_ids.items(), placeholders):
            t = self.input_types[name]
            count = int(np.prod(t.shape, dtype=np.int64))
            values[vid] = raw[: count * np.dtype(STORAGE[t.dtype]).itemsize].view(STORAGE[t.dtype]).reshape(t.shape)
        spans = [(self.memory.ctypes.data, self.memory.ctypes.data + self.memory.nbytes)]
        spans += [(raw.ctypes.data, raw.ctypes.data + raw.nbytes) for raw in placeholders]
        tapes: dict[bool, list[Union[Tape, PythonStep]]] = {}
        refs: dict[int, ValueRef] = {}
        for first in (True, False):
            recording = Recording(self, dict(values), spans)
            for k, step in enumerate(self.lowering.steps):
                recording.step = k
                if step.once and not first:
                    for vid in step.writes:
                        recording.set(vid, recording.buffer(vid))
                elif step.kind in PYTHON_STEPS:
                    recording.tape.append(PythonStep(k))
                    for vid in step.writes:
                        recording.set(vid, recording.buffer(vid))
                else:
                    step.launch(recording, self.kernels[k])
            tapes[first] = recording.tape
            for vid, value in recording.values.items():
                base, offset = recording.ref(value) if value.size else (0, 0)
                refs[vid] = ValueRef(base, offset, tuple(value.shape), value.dtype)
        return tapes[True], tapes[False], refs

    def run(self, feeds: dict[str, Any], keep: frozenset[str] = frozenset(), ready: Optional[Ready] = None) -> dict[str, Any]:
        device, types, held, bases = self.device, self.types, self.held, self.base_array
        inputs = []
        for k, (name, t, shape) in enumerate(self.input_order):
            host = feeds[name]
            if host is not held[k] or host.shape != shape:
                array = device.to_device(host, t)
                bases[k + 1] = array.ctypes.data
                held[k] = array if array is host else None  # a converted copy lives for this run only
                host = array
            inputs.append(host)
        for part in self.first_tape if not self.made_once else self.later_tape:
            if isinstance(part, Tape):
                part.run(bases)
            else:
                self.run_python_step(part.index, inputs)
        self.made_once = True
        out = {}
        for name, vid, fixed, plain in self.output_plan:
            value = fixed if fixed is not None else self.views_of(self.refs[vid], inputs)
            out[name] = value if plain or name in keep else device.to_host(value, types[vid])
        if ready is not None:
            for name in keep:
                if name in out:
                    ready(name, out[name])
        return out

    def run_python_step(self, index: int, inputs: list[Any]) -> None:
        step = self.lowering.steps[index]
        values = {vid: self.fixed[vid] if vid in self.fixed else self.views_of(self.refs[vid], inputs) for vid in step.reads if vid in self.refs}
        run = PythonRun(self, values)
        run.step = index
        step.launch(run, self.kernels[index])

    def notice(self) -> Optional[str]:
        """A line when compiling this program's kernels cost time (a new program: later runs
        find them in the disk cache)."""
        compiled = self.compiled
        if compiled is None or compiled.cached:
            return None
        kept = "in this process's private cache" if compiled.private else "cached on disk for the next run"
        return f"cpu: {self.program.name}: compiled {self.kernel_count} kernels in {compiled.seconds:.1f} s ({kept})"

    def compile_report(self) -> dict[str, Any]:
        """What compiling this program cost: its kernels, the seconds (0 from the disk cache,
        or when another program of this device had compiled them all)."""
        compiled = self.compiled
        return {"kernels": self.kernel_count, "seconds": round(compiled.seconds, 3) if compiled else 0.0,
                "cached": compiled is None or compiled.cached, "library": str(compiled.path) if compiled else None}


class CpuBackend(DeviceBackend):
    """The loop's backend on the compiled CPU device: resident arrays are host arrays in their
    storage dtype, programs CpuPrograms."""

    def __init__(self, runtime: CpuRuntime) -> None:
        self.runtime = runtime
        super().__init__(ArrayDevice(np, CpuRunner(runtime)))

    def program(self, program: Program) -> CpuProgram:
        return CpuProgram(program, self.device, self.runtime)

    def set_threads(self, threads: int) -> None:
        self.runtime.set_threads(threads)

    def blas_name(self) -> str:
        return self.runtime.blas.name

    def pieces_available(self) -> bool:
        return self.runtime.pieces_available()

