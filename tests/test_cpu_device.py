"""The compiled CPU device (`--device cpu`): the CUDA lowering with its kernels emitted as C
and compiled by the system C compiler.

Two claims, each checked on every op of the table and every example program:
- elementwise results are the NumPy backend's bit for bit (every elementwise op in every
  dtype, and every fusion group of every example program, run alone on the values NumPy
  computes for its inputs);
- everything else is what the CUDA device computes: with the C library's math (as the
  host emulation of the CUDA kernels uses it) and the same BLAS for the gemms, the compiled
  CPU and the emulated CUDA device (tests/cuda_host.py, with the device's 256-thread blocks)
  agree bit for bit on every op case, every reduction strategy, every row group's lanes and
  every example program.
And the whole loop trains like the NumPy backend's, within the documented tolerance.

The kernels of the op cases are compiled in one library per math mode (`CpuRuntime.preload`),
once per test process, and cached on disk like any run's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO, environment
from cuda_host import HostRunner
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import Program, TensorType
from sexpgpu.ir.ops import OpError, all_ops, op_def
from sexpgpu.runtime.lower.blas import BlasCall
from sexpgpu.runtime.lower.codegen import BLOCK, LoweringError, KernelSource
from sexpgpu.runtime.lower.executor import ArrayDevice, DeviceBackend, LoweredProgram
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.runtime.lower.kernels import reduce_kernels
from sexpgpu.runtime.lower.row_kernel import rows_kernel
from sexpgpu.runtime.lower.steps import FusedGroup, ReduceGroup, RowGroup
from sexpgpu.runtime.numpy_backend import CompiledProgram

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("g++") is None, reason="the compiled CPU device needs a C compiler")


# -- the devices ----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def runtimes() -> dict[str, Any]:
    from sexpgpu.runtime.cpu.device import CpuRuntime
    from sexpgpu.runtime.cpu.toolchain import open_toolchain

    toolchain = open_toolchain()
    return {math: CpuRuntime(toolchain, math=math) for math in ("numpy", "libm")}


def cpu(runtimes: dict[str, Any], math: str = "numpy") -> Any:
    from sexpgpu.runtime.cpu.device import CpuBackend

    return CpuBackend(runtimes[math])


class DeviceBlocks(HostRunner):
    """The host emulation of the CUDA kernels with the device's block size (a block's lanes
    are BLOCK threads there: the order a block reduction adds in), and the gemms of the BLAS
    the CPU device calls: the two devices then differ only in their kernels."""

    def __init__(self, blas: Any) -> None:
        super().__init__()
        self.blas = blas

    def launch(self, kernel: KernelSource, arrays: list[np.ndarray]) -> None:
        import ctypes

        fn = getattr(self.modules[kernel.name].lib, f"launch_{kernel.name}")
        fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_longlong, ctypes.c_uint, ctypes.c_uint]
        fn.restype = ctypes.c_int
        pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
        assert fn(pointers, kernel.size, 2, kernel.threads or BLOCK) == 0, kernel.name

    def gemm(self, call: BlasCall, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> None:
        self.blas.gemm(call, a, b, c)


def emulated(runtimes: dict[str, Any]) -> ArrayDevice:
    from sexpgpu.runtime.cpu.device import CpuRunner

    return ArrayDevice(np, DeviceBlocks(CpuRunner(runtimes["libm"])))


def bits(x: Any) -> np.ndarray:
    """The value's bits as unsigned integers, every NaN the same."""
    a = np.ascontiguousarray(np.asarray(x))
    if a.dtype == ml_dtypes.bfloat16 or a.dtype == np.uint16:
        u = a.view(np.uint16).copy()
        u[np.isnan(a.view(ml_dtypes.bfloat16).astype(np.float32))] = 0x7FC0
        return u
    if a.dtype == np.float32:
        u32 = a.view(np.uint32).copy()
        u32[np.isnan(a)] = 0x7FC00000
        return u32
    if a.dtype == np.float64:
        u64 = a.view(np.uint64).copy()
        u64[np.isnan(a)] = 0x7FF8000000000000
        return u64
    return a.astype(np.int64)


def assert_same_bits(got: Any, want: Any, what: str) -> None:
    g, w = np.asarray(got), np.asarray(want)
    assert g.shape == w.shape, f"{what}: shape {g.shape} != {w.shape}"
    if w.dtype == bool or g.dtype == bool:
        np.testing.assert_array_equal(g.astype(bool), w.astype(bool), err_msg=what)
        return
    gb, wb = bits(g), bits(w.astype(g.dtype) if w.dtype != g.dtype else w)
    bad = np.flatnonzero(gb.reshape(-1) != wb.reshape(-1))
    assert bad.size == 0, f"{what}: {bad.size} of {gb.size} elements differ, first at {bad[0]}: {g.reshape(-1)[bad[0]]!r} != {w.reshape(-1)[bad[0]]!r}"


# -- elementwise: NumPy's bits ---------------------------------------------------------------------------
def elementwise_cases() -> list[tuple[Program, dict[str, np.ndarray]]]:
    from test_cuda_codegen import CASES, POSITIVE, one_op_program, values

    out = []
    for index, (op, dtypes, shapes, attrs) in enumerate(CASES):
        program, ins = one_op_program(op, dtypes, shapes, **attrs)
        rng = np.random.default_rng(index)
        feeds = {f"x{k}": values(s, d, rng, positive=op in POSITIVE) for k, (d, s) in enumerate(zip(dtypes, shapes))}
        if dtypes[0] in (DType.f32, DType.bf16) and op not in POSITIVE and len(dtypes) == 1:
            flat = feeds["x0"].reshape(-1)  # specials: NaN, infinities, signed zeros, a denormal
            flat[2:8] = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-40, -3.5], dtype=np.float32).astype(flat.dtype)
        out.append((program, feeds))
    return out


def test_every_elementwise_op_is_numpys_bit_for_bit(runtimes: dict[str, Any]) -> None:
    """Each elementwise op alone (f32, bf16, integers, booleans, broadcasts, casts), on random
    values and the specials: the CPU device's result has NumPy's bits."""
    cases = elementwise_cases()
    runtimes["numpy"].preload([p for p, _ in cases])
    backend = cpu(runtimes)
    for program, feeds in cases:
        want = CompiledProgram(program).run_copy(feeds)
        got = backend.program(program).run(feeds)
        assert_same_bits(backend.get(got["out"], program.types()[program.outputs["out"]]), want["out"], program.name)


def fusion_groups(program: Program, values: dict[int, Any]) -> list[tuple[Program, dict[str, Any]]]:
    """Each fused elementwise group of PROGRAM's lowering as a program of its own, its inputs
    fed with the values NumPy computed for them."""
    lowering = lower(program)
    types = lowering.program.types()
    out = []
    for k, group in enumerate(s for s in lowering.steps if isinstance(s, FusedGroup)):
        b = Builder(f"{program.name}:group{k}")
        feeds = {}
        renamed: dict[int, int] = {}
        for v in group.inputs:
            renamed[v] = b.input(f"v{v}", "data", types[v])
            feeds[f"v{v}"] = values[v]
        for node in group.nodes:
            for a in node.args:  # a literal constant the group reads
                if a not in renamed and a in lowering.constants:
                    renamed[a] = b.op("full", **lowering.constants[a].attrs)
            args = [renamed[a] for a in node.args]
            renamed[node.id] = b.op(node.op, *args, **node.attrs)
        out.append((b.program({f"v{v}": renamed[v] for v in group.outputs}), feeds))
    return out


def every_value(program: Program, feeds: dict[int, np.ndarray]) -> dict[int, Any]:
    values: dict[int, Any] = dict(feeds)
    for node in program.nodes:
        with np.errstate(all="ignore"):
            values[node.id] = op_def(node.op).numpy([values[a] for a in node.args], dict(node.attrs), None)
    return values


def test_every_fusion_group_of_every_example_is_numpys_bit_for_bit(runtimes: dict[str, Any]) -> None:
    """Every fused group of every example's programs (GELU, the optimizers' joined updates,
    casts, masks...), on the values NumPy computes for its inputs in the whole program."""
    from test_cuda_codegen import example_programs, feeds_for

    rng = np.random.default_rng(5)
    groups: list[tuple[Program, dict[str, Any]]] = []
    for _, _, program in example_programs():
        lowered_program = lower(program).program
        values = every_value(lowered_program, feeds_for(lowered_program, rng))
        groups += fusion_groups(lowered_program, values)
    assert len(groups) >= 30, len(groups)
    runtimes["numpy"].preload([p for p, _ in groups])
    backend = cpu(runtimes)
    for program, feeds in groups:
        want = CompiledProgram(program).run_copy(feeds)
        got = backend.program(program).run(feeds)
        types = program.types()
        for name, vid in program.outputs.items():
            assert_same_bits(backend.get(got[name], types[vid]), want[name], f"{program.name} {name} ({'+'.join(n.op for n in program.nodes)})")


# -- everything: the CUDA device's bits ------------------------------------------------------------------
def op_case_programs() -> list[tuple[str, Program, dict[str, np.ndarray]]]:
    from test_cuda_ops import EDGE_CASES, cases_of, one_op, pool_edge_cases
    from test_ops import _rng

    out = []
    for op in sorted(all_ops()):
        cases = [(case, dtype) for case in cases_of(op) for dtype in ("f32", "bf16")] + [(c, d) for o, c, d in EDGE_CASES + pool_edge_cases() if o == op]
        for index, (case, float_dtype) in enumerate(cases):
            try:
                program = one_op(op, case, float_dtype)
                lower(program)
            except (OpError, LoweringError):  # not this dtype; f64, which the lowering refuses
                continue
            rng = _rng(op, index, float_dtype, "cpu")
            out.append((f"{op} {case.label()} {float_dtype}", program, {f"x{i}": arg.draw(rng, float_dtype) for i, arg in enumerate(case.args)}))
    return out


@pytest.fixture(scope="module")
def op_cases(runtimes: dict[str, Any]) -> list[tuple[str, Program, dict[str, np.ndarray]]]:
    cases = op_case_programs()
    runtimes["libm"].preload([p for _, p, _ in cases])
    return cases


def outputs_equal(program: Program, got: dict[str, Any], want: dict[str, Any], backend: Any, what: str) -> None:
    types = program.types()
    for name, vid in program.outputs.items():
        assert_same_bits(backend.get(got[name], types[vid]), backend.get(want[name], types[vid]), f"{what}: {name}")


def test_every_op_case_equals_the_emulated_cuda_device_bit_for_bit(runtimes: dict[str, Any], op_cases: list[tuple[str, Program, dict[str, np.ndarray]]]) -> None:
    """Every case of the op tables (and the device's edge cases), in f32 and bf16, run twice (a
    constant is made once): the compiled CPU with the C library's math against the emulated
    CUDA kernels, bit for bit; and against the NumPy backend within test_cuda_ops' bounds."""
    from test_cuda_ops import EXACT, assert_equal_or_close

    backend = cpu(runtimes, "libm")
    device = emulated(runtimes)
    ops = set()
    for what, program, feeds in op_cases:
        mine = backend.program(program)
        theirs = LoweredProgram(program, device)
        want = CompiledProgram(program).run_copy(feeds)
        out_t = program.types()[program.outputs["y"]]
        for run in range(2):
            got = {k: np.array(v, copy=True) for k, v in mine.run(feeds).items()}
            outputs_equal(program, got, theirs.run(feeds), backend, f"{what}, run {run + 1}")
            assert_equal_or_close(got["y"], want["y"], out_t.dtype, program.name.split("-", 1)[1] in EXACT, f"{what} against NumPy")
        ops.add(program.name.split("-", 1)[1])
    assert ops == {op for op in all_ops() if op != "cast" or True} - {op for op in all_ops() if not any(p.name == f"device-{op}" for _, p, _ in op_cases)}
    assert len(ops) > 50, len(ops)


def reduction_strategies() -> list[Any]:
    from test_cuda_codegen import strategies

    return strategies  # type: ignore[no-any-return]


def test_every_reduction_strategy_and_row_lanes_equal_the_device_bit_for_bit(runtimes: dict[str, Any]) -> None:
    """Every reduction of every example program in every strategy the device has (a thread,
    a warp or a block per output; chunks of a thread or a block), and every row group with a
    thread, a warp and a block per row: the host kernels add in the device's order."""
    from sexpgpu.runtime.cpu.device import CpuRunner
    from sexpgpu.runtime.cpu.hostc import reduce_host, rows_host
    from test_cuda_codegen import example_programs, feeds_for, strategies

    runtime = runtimes["libm"]
    rng = np.random.default_rng(9)
    jobs: list[tuple[str, list[Any], list[Any], list[int], list[int], Any]] = []  # (what, cuda kernels, host kernels, inputs, outputs, values)
    for stem, name, program in example_programs():
        lowering = lower(program)
        lowered = lowering.program
        types = lowered.types()
        values = every_value(lowered, feeds_for(lowered, rng))
        for step in lowering.steps:
            if isinstance(step, ReduceGroup):
                for strategy in strategies(step, types):
                    cuda = reduce_kernels(step, lowered, lowering.constants, strategy)
                    host = reduce_host(step, lowered, lowering.constants, "libm", cuda, strategy)
                    jobs.append((f"{stem} {name} %{step.node.id} {strategy}", cuda, host, step.inputs, step.writes, values))
            if isinstance(step, RowGroup):
                for lanes in ("thread", "warp", "block"):
                    cuda = [rows_kernel(step, lowered, lowering.constants, lanes)]
                    host = [rows_host(step, lowered, lowering.constants, "libm", cuda[0], lanes)]
                    jobs.append((f"{stem} {name} rows {lanes}", cuda, host, step.inputs, step.outputs, values))
    assert len(jobs) > 100, len(jobs)
    functions, _ = runtime.load([k for job in jobs for k in job[2]])
    device = DeviceBlocks(CpuRunner(runtime))
    device.prepare([k for job in jobs for k in job[1]])
    from cuda_host import storage, storage_dtype

    for what, cuda, host, inputs, _outputs, values in jobs:
        results = []
        for run_kernel in ("host", "cuda"):
            ins = [np.ascontiguousarray(storage(np.asarray(values[v]), lower_dtype(values[v]))) for v in inputs]
            outs = [np.zeros(p.shape, dtype=storage_dtype(p.dtype.value)) for p in cuda[0].params if p.role == "out"]
            if len(cuda) == 2:  # a split reduction: partial results, then their combination
                final = np.zeros(cuda[1].params[-1].shape, dtype=storage_dtype(cuda[1].params[-1].dtype.value))
                launch(run_kernel, cuda[0], host[0], functions, device, ins + outs)
                launch(run_kernel, cuda[1], host[1], functions, device, [outs[0], final])
                results.append([final] + outs[1:])
            else:
                launch(run_kernel, cuda[0], host[0], functions, device, ins + outs)
                results.append(outs)
        for k, (a, b) in enumerate(zip(*results)):
            assert_same_bits(a, b, f"{what}: output {k}")


def lower_dtype(value: Any) -> str:
    a = np.asarray(value)
    return {np.dtype(np.float32): "f32", np.dtype(ml_dtypes.bfloat16): "bf16", np.dtype(np.int32): "i32", np.dtype(np.int64): "i64", np.dtype(bool): "bool"}[a.dtype]


def launch(which: str, cuda: KernelSource, host: Any, functions: dict[str, Any], device: DeviceBlocks, arrays: list[np.ndarray]) -> None:
    import ctypes

    if which == "cuda":
        device.launch(cuda, arrays)
        return
    pointers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    functions[host.symbol](pointers, 0, cuda.size if host.launched_items else host.size)


def test_every_example_program_equals_the_emulated_device_and_numpy(runtimes: dict[str, Any]) -> None:
    """Whole programs of every example: with the C library's math, the CUDA device's bits; with
    NumPy's (the default), the NumPy backend's values within f32 reduction order."""
    from test_cuda_codegen import example_programs, feeds_for

    programs = example_programs()
    runtimes["numpy"].preload([p for _, _, p in programs])
    runtimes["libm"].preload([p for _, _, p in programs])
    device = emulated(runtimes)
    rng = np.random.default_rng(11)
    for stem, name, program in programs:
        by_id = feeds_for(program, rng)
        feeds = {i.name: by_id[i.id] for i in program.inputs}
        libm = cpu(runtimes, "libm")
        outputs_equal(program, libm.program(program).run(feeds), LoweredProgram(program, device).run(feeds), libm, f"{stem} {name}")
        want = CompiledProgram(program).run_copy(feeds)
        got = cpu(runtimes).program(program).run(feeds)
        types = program.types()
        for key, w in want.items():
            t = types[program.outputs[key]]
            g = np.asarray(cpu(runtimes).get(got[key], t))
            if t.dtype in (DType.i32, DType.i64, DType.bool):
                np.testing.assert_array_equal(g, w, err_msg=f"{stem} {name} {key}")
                continue
            g64, w64 = g.astype(np.float64), np.asarray(w, dtype=np.float64)
            scale = max(1e-3, float(np.max(np.abs(w64)))) if w64.size else 1.0
            tol = 2.0**-6 if t.dtype == DType.bf16 else 2e-4
            np.testing.assert_allclose(g64, w64, rtol=tol, atol=tol * scale, err_msg=f"{stem} {name} {key}")


def train_at_one_and_two_threads(runtimes: dict[str, Any], stem: str, seed: int) -> int:
    """STEM's train program run at one thread and at two on the same feeds: the launches the
    pool's threads shared at two (its outputs checked against one thread's bits)."""
    from test_cuda_codegen import example_programs, feeds_for

    (program,) = [p for s, name, p in example_programs() if s == stem and name == "train"]
    by_id = feeds_for(program, np.random.default_rng(seed))
    feeds = {i.name: by_id[i.id] for i in program.inputs}
    runtime = runtimes["numpy"]
    backend = cpu(runtimes)
    compiled = backend.program(program)
    try:
        runtime.set_threads(1)
        one = {k: np.array(v, copy=True) for k, v in compiled.run(feeds).items()}
        runtime.set_threads(2)
        two = compiled.run(feeds)
        shared = runtime.shared_launches()
    finally:
        runtime.set_threads(1)
    outputs_equal(program, two, one, backend, f"{stem}: 2 threads against 1")
    return shared


def test_two_threads_give_the_bits_of_one(runtimes: dict[str, Any]) -> None:
    """The pool splits a kernel's items between threads; each item is one CUDA thread's (or
    warp's, or block's) work, so the bits do not change."""
    assert train_at_one_and_two_threads(runtimes, "char-transformer", 2) > 0, "the transformer's large kernels are the two threads' to share"


def test_a_small_programs_kernels_run_on_the_calling_thread_at_two_threads(runtimes: dict[str, Any]) -> None:
    """A kernel is shared only where each thread gets a grain of work: the quickstart's largest
    (64 items, about 70 KB moved and computed) costs less on one thread than waking the other
    and waiting for it, so at two threads its steps hand nothing to the pool, and keep their bits."""
    assert train_at_one_and_two_threads(runtimes, "quickstart", 3) == 0


def test_a_large_product_is_shared_by_the_threads_in_a_piece_for_each() -> None:
    """With threads, the pool shares a large f32 gemm in pieces of C's columns (or rows, when
    it has more rows): a share of that extent for each thread (at most halves where the
    operand every piece reads whole outgrows 1 MiB), a multiple of 16 and at least 64,
    each one BLAS call. Forced on (the pool does it by itself where the BLAS gives a piece the
    whole product's bits, which OpenBLAS's Haswell kernels do not), 2 and 3 threads give
    the bits of their pieces called one by one on one thread."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):  # every call on one thread, as the pool makes them when it splits
        products_in_pieces()


def test_the_pool_splits_products_only_where_numpy_sees_the_blas_give_pieces_the_whole_bits() -> None:
    """The probe's verdict against NumPy's matmul (the device told to call NumPy's BLAS: the same BLAS, another way in): on the
    probe's shapes, whole products against the pieces the pool would make, one thread. Where
    NumPy sees a piece differ, the pool must not split; where it splits, a tape run holds the
    BLAS to one thread and gives it its count back."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from sexpgpu.runtime.cpu.device import CpuRunner, CpuRuntime, find_blas
    from sexpgpu.runtime.cpu.toolchain import open_toolchain
    from sexpgpu.runtime.lower.blas import Operand

    rng = np.random.default_rng(7)
    exact = True
    with threadpool_limits(limits=1, user_api="blas"):
        for m, n, k in ((128, 768, 128), (768, 200, 96), (100, 300, 256), (512, 768, 64), (96, 1030, 48)):
            # NumPy's row-major (n, k) @ (k, m) is the BLAS's column-major m x n product
            a, b = rng.standard_normal((n, k), dtype=np.float32), rng.standard_normal((k, m), dtype=np.float32)
            whole = a @ b
            rows = m > n
            dim = m if rows else n
            for parts in (2, 3, 8):  # the probe's: the pieces of 2, 3 and 8 threads
                width = piece_width(dim, parts)
                if rows:
                    pieces = np.concatenate([a @ b[:, at:at + width] for at in range(0, dim, width)], axis=1)
                else:
                    pieces = np.concatenate([a[at:at + width] @ b for at in range(0, dim, width)], axis=0)
                exact = exact and np.array_equal(whole, pieces)
    toolchain = open_toolchain()
    runtime = CpuRuntime(toolchain, threads=2, blas=find_blas(toolchain, {"SEXPGPU_BLAS": "numpy"}))  # NumPy's BLAS, whatever the default here
    if not exact:
        assert runtime.exact_pieces is False and not runtime.split_gemms
    if runtime.split_gemms:
        before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
        a32 = rng.standard_normal(300 * 300).astype(np.float32)
        call = BlasCall(op_a=0, op_b=0, m=300, n=300, k=300, a=Operand(ld=300), b=Operand(ld=300), c=Operand(ld=300), in_dtype=DType.f32, out_dtype=DType.f32)
        out = np.zeros(300 * 300, dtype=np.float32)
        CpuRunner(runtime).gemm(call, a32, a32, out)
        np.testing.assert_allclose(out.reshape(300, 300).T, (a32.reshape(300, 300).T.astype(np.float64) @ a32.reshape(300, 300).T), rtol=1e-4, atol=1e-3)
        assert [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"] == before


def products_in_pieces() -> None:
    from sexpgpu.runtime.cpu.device import CpuRunner, CpuRuntime
    from sexpgpu.runtime.cpu.toolchain import open_toolchain
    from sexpgpu.runtime.lower.blas import Operand

    runtime = CpuRuntime(open_toolchain(), threads=1)
    runner = CpuRunner(runtime)
    rng = np.random.default_rng(5)
    # the last: deep, its whole operand (64 x 5000 floats) outgrows the cache: two pieces of 144
    for m, n, k, op_a, op_b in ((100, 300, 96, 0, 0), (300, 100, 96, 1, 1), (64, 288, 5000, 0, 1)):
        a = rng.standard_normal(m * k).astype(np.float32)
        b = rng.standard_normal(k * n).astype(np.float32)
        lda, ldb = (k if op_a else m), (n if op_b else k)
        rows = m > n
        dim = m if rows else n
        deep = (n if rows else m) * k * 4 > 1 << 20
        whole = BlasCall(op_a=op_a, op_b=op_b, m=m, n=n, k=k, a=Operand(ld=lda), b=Operand(ld=ldb), c=Operand(ld=m), in_dtype=DType.f32, out_dtype=DType.f32)
        for threads in (2, 3):
            width = piece_width(dim, 2 if deep else threads)
            assert not deep or width == 144
            want = np.zeros(m * n, dtype=np.float32)
            for at in range(0, dim, width):
                span = min(width, dim - at)
                piece = BlasCall(op_a=op_a, op_b=op_b, m=span if rows else m, n=n if rows else span, k=k,
                                 a=Operand(ld=lda, offset=(at * lda if op_a else at) if rows else 0), b=Operand(ld=ldb, offset=0 if rows else (at if op_b else at * ldb)),
                                 c=Operand(ld=m, offset=at if rows else at * m), in_dtype=DType.f32, out_dtype=DType.f32)
                runner.gemm(piece, a, b, want)
            a64 = a.reshape(m, k).astype(np.float64) if op_a else a.reshape(k, m).T.astype(np.float64)
            b64 = b.reshape(k, n).astype(np.float64) if op_b else b.reshape(n, k).T.astype(np.float64)
            np.testing.assert_allclose(want.reshape(n, m).T, a64 @ b64, rtol=1e-4, atol=1e-4)
            runtime.set_threads(threads)
            runtime.library.sx_pool_split_gemms(runtime.pool, 1)
            got = np.zeros(m * n, dtype=np.float32)
            runner.gemm(whole, a, b, got)
            assert_same_bits(got, want, f"{m}x{n}x{k} on {threads} threads")
            runtime.set_threads(1)  # the next count's pieces called on one thread


def piece_width(dim: int, parts: int) -> int:
    """The width of a product's pieces along DIM for PARTS threads: a share each, a multiple of 16, at least 64."""
    return max(64, ((dim + parts - 1) // parts + 15) // 16 * 16)


# -- the loop ----------------------------------------------------------------------------------------------
def losses_of(folder: Path) -> list[float]:
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]
    return [e["loss"] for e in events if e["kind"] == "step"]


@pytest.mark.parametrize("example,steps", [("quickstart", 40), ("char-transformer", 8), ("cnn", 8)])
def test_examples_train_on_the_cpu_device_like_on_numpy(example: str, steps: int, tmp_path: Path, runtimes: dict[str, Any]) -> None:
    """The one training loop on the compiled CPU device: the NumPy backend's loss at every
    step within 1e-4 (relative), the documented tolerance."""
    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.attempt import RunOptions, train

    experiment = compile_file(REPO / "examples" / f"{example}.lisp").experiment
    assert experiment is not None
    experiment.run.log_every = 1
    numpy = train(experiment, RunOptions(store=str(tmp_path / "numpy"), max_steps=steps, signals=False), say=lambda _: None)
    compiled = train(experiment, RunOptions(store=str(tmp_path / "cpu"), max_steps=steps, signals=False, backend=cpu(runtimes)), say=lambda _: None)
    assert numpy.exit_code == compiled.exit_code == 0
    a, b = losses_of(tmp_path / "numpy" / numpy.slug), losses_of(tmp_path / "cpu" / compiled.slug)
    assert len(a) == len(b) == steps
    np.testing.assert_allclose(b, a, rtol=1e-4)


def test_the_whole_loop_on_the_cpu_device(tmp_path: Path, runtimes: dict[str, Any]) -> None:
    """Microbatches, bf16, AdamW, diagnostics, evaluation, checkpoints and a resume, on the
    compiled CPU device: the NumPy backend's events and checkpoints, within f32 reduction
    order (test_cuda_executor's check, on this device)."""
    from test_cuda_executor import check_whole_loop

    check_whole_loop(tmp_path, cpu(runtimes))


# -- the compiler, the cache, the choice of device ---------------------------------------------------------
def sexpgpu(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sexpgpu", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def project(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir()
    shutil.copy(REPO / "examples" / "quickstart.lisp", tmp_path / "quickstart.lisp")
    return tmp_path


def test_cpu_is_the_compiled_device_by_default_and_numpy_the_reference(tmp_path: Path) -> None:
    """The default device is the compiled one; run.json names the BLAS it called (its default,
    or NumPy's when $SEXPGPU_BLAS=numpy), and the three train alike."""
    from sexpgpu.runtime.cpu.device import find_blas
    from sexpgpu.runtime.cpu.toolchain import open_toolchain

    folder = project(tmp_path)
    env = environment(SEXPGPU_DEVICE=None)
    default = sexpgpu(["run", "quickstart.lisp", "--store", "runs-cpu", "--max-steps", "30"], folder, env)
    numpy = sexpgpu(["run", "quickstart.lisp", "--store", "runs-numpy", "--max-steps", "30", "--device", "numpy"], folder, env)
    openblas = sexpgpu(["run", "quickstart.lisp", "--store", "runs-openblas", "--max-steps", "30"], folder, {**env, "SEXPGPU_BLAS": "numpy"})
    assert default.returncode == numpy.returncode == openblas.returncode == 0, default.stderr + numpy.stderr + openblas.stderr
    assert "NumPy backend" not in default.stdout + default.stderr
    toolchain = open_toolchain()
    libraries = {"runs-cpu": find_blas(toolchain).name, "runs-numpy": "", "runs-openblas": find_blas(toolchain, {"SEXPGPU_BLAS": "numpy"}).name}
    for store, device in (("runs-cpu", "cpu"), ("runs-numpy", "numpy"), ("runs-openblas", "cpu")):
        (run,) = (folder / store).iterdir()
        info = json.loads((run / "run.json").read_text())
        assert info["devices"] == [device] and info["threads"]["library"] == libraries[store], (store, info["threads"])
    a, b = losses_of(next((folder / "runs-cpu").iterdir())), losses_of(next((folder / "runs-numpy").iterdir()))
    np.testing.assert_allclose(a, b, rtol=1e-4)
    np.testing.assert_allclose(losses_of(next((folder / "runs-openblas").iterdir())), b, rtol=1e-4)


def test_without_a_c_compiler_a_cpu_run_says_so_and_uses_numpy(tmp_path: Path) -> None:
    """No compiler on the PATH (and none in $CC): one line says so, the run trains on the
    NumPy backend and records it; a $CC that names no program is said by name."""
    folder = project(tmp_path)
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    for changes, expect in (({"PATH": str(empty), "CC": None}, "no C compiler found"), ({"CC": "no-such-cc-here"}, "$CC='no-such-cc-here' is not a program on the PATH")):
        store = f"runs-{len(changes)}"
        done = sexpgpu(["run", "quickstart.lisp", "--store", store, "--max-steps", "10"], folder, environment(SEXPGPU_DEVICE=None, **changes))
        assert done.returncode == 0, done.stderr
        lines = [line for line in (done.stdout + done.stderr).splitlines() if "NumPy backend" in line]
        assert len(lines) == 1 and expect in lines[0], done.stdout + done.stderr
        (run,) = (folder / store).iterdir()
        assert json.loads((run / "run.json").read_text())["devices"] == ["numpy"]


BUILD = """
import sys
from pathlib import Path
from sexpgpu.runtime.cpu.toolchain import open_toolchain
toolchain = open_toolchain()
done = toolchain.build(sys.argv[1])
print(done.path, done.cached)
"""


def test_the_kernel_cache_is_shared_by_processes_compiling_at_once(tmp_path: Path) -> None:
    """Two processes compile the same new module at once into an empty cache: each gets a
    whole library (written under a temporary name, then renamed), one file is left, no
    temporary; a third process finds it cached."""
    source = f"int sx_probe_{os.getpid()}(void) {{ return 42; }}\n"
    env = environment(SEXPGPU_CACHE=str(tmp_path / "cache"))
    both = [subprocess.Popen([sys.executable, "-c", BUILD, source], env=env, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300)[0].split() for p in both]
    assert all(p.returncode == 0 for p in both)
    assert outs[0][0] == outs[1][0] and Path(outs[0][0]).parent == tmp_path / "cache" / "kernels"
    assert [p.name for p in (tmp_path / "cache" / "kernels").iterdir()] == [Path(outs[0][0]).name]
    third = subprocess.run([sys.executable, "-c", BUILD, source], env=env, capture_output=True, text=True, timeout=300)
    assert third.stdout.split() == [outs[0][0], "True"]
    import ctypes

    assert ctypes.CDLL(outs[0][0])[f"sx_probe_{os.getpid()}"]() == 42


def test_bf16_storage_round_trips_on_the_cpu_device(runtimes: dict[str, Any]) -> None:
    """Resident bf16 tensors are their 16 bits; put and get give the host array back."""
    backend = cpu(runtimes)
    t = TensorType(dtype=DType.bf16, shape=(3, 4))
    host = (np.arange(12, dtype=np.float32) / 7).astype(ml_dtypes.bfloat16).reshape(3, 4)
    assert_same_bits(backend.get(backend.put(host, t), t), host, "bf16 put/get")
    assert isinstance(backend, DeviceBackend)


def test_explain_shows_the_compile_cost_and_a_run_pays_it_once(tmp_path: Path) -> None:
    """A new program's kernels: `explain --cpu` compiles them and says how long it took; a
    second explain and a run find them in the disk cache (the run says nothing of compiling);
    a run in an empty cache says what compiling cost, once per program."""
    folder = project(tmp_path)
    env = environment(SEXPGPU_DEVICE=None, SEXPGPU_CACHE=str(tmp_path / "cache"))
    first = sexpgpu(["explain", "quickstart.lisp", "--cpu"], folder, env)
    again = sexpgpu(["explain", "quickstart.lisp", "--cpu", "--json"], folder, env)
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    compiled = [line for line in first.stdout.split("compiled CPU device")[-1].splitlines() if line.lstrip().startswith(("train ", "update "))]
    assert len(compiled) == 2 and all("compiled in" in line and "paid once" in line for line in compiled), first.stdout
    doc = json.loads(again.stdout)["cpu"]["programs"]
    assert doc["train"]["cached"] and doc["update"]["cached"] and doc["train"]["kernels"] > 0, doc
    run = sexpgpu(["run", "quickstart.lisp", "--store", "runs", "--max-steps", "5"], folder, env)
    assert run.returncode == 0 and "compiled" not in run.stdout + run.stderr, run.stdout + run.stderr
    cold = sexpgpu(["run", "quickstart.lisp", "--store", "runs-cold", "--max-steps", "5"], folder,
                   {**env, "SEXPGPU_CACHE": str(tmp_path / "empty-cache")})
    lines = [line for line in (cold.stdout + cold.stderr).splitlines() if "kernels in" in line]
    assert cold.returncode == 0 and sorted(line.split(":")[1].strip() for line in lines) == ["train", "update"], cold.stdout + cold.stderr


def test_doctor_reports_the_compiler_the_blas_and_the_thread_plan(tmp_path: Path) -> None:
    """With a compiler: it and the kernel cache; the BLAS and the threads the kernels and the
    BLAS share. Without: a warning that `cpu` runs on the NumPy backend, and the fix."""
    from sexpgpu.runtime.cpu.device import find_blas
    from sexpgpu.runtime.cpu.toolchain import open_toolchain

    empty = tmp_path / "empty-bin"
    empty.mkdir()
    findings = {}
    for name, env in (("with", environment(SEXPGPU_DEVICE=None, SEXPGPU_CACHE=str(tmp_path / "cache"))),
                      ("without", environment(SEXPGPU_DEVICE=None, CC=None, PATH=str(empty)))):
        done = sexpgpu(["doctor", "--json", "--store", str(tmp_path / "runs")], tmp_path, env)
        assert done.returncode == 0, done.stdout + done.stderr
        findings[name] = {f["check"]: f for f in json.loads(done.stdout)["findings"]}
    compiler, threads = findings["with"]["compiler"], findings["with"]["threads"]
    assert compiler["level"] == "ok" and str(tmp_path / "cache" / "kernels") in compiler["detail"], compiler
    assert "thread(s) for the kernels and the BLAS" in threads["detail"] and f"{find_blas(open_toolchain()).name} (the compiled CPU device)" in threads["detail"], threads
    missing = findings["without"]["compiler"]
    assert missing["level"] == "warn" and "no C compiler found" in missing["detail"] and "NumPy backend" in missing["detail"] and missing["fix"], missing


def test_a_bias_gradient_with_a_relu_backward_runs_vectorized_and_equals_the_device(runtimes: dict[str, Any], tmp_path: Path) -> None:
    """The CNN's bias gradient: sum over batch and image of g * (x + b > 0), [N, C, H, W] ->
    [C] (the trailing axes reduced, the bias broadcast). Each block's elements are computed in
    runs of neighbours in memory by a function of its own, which the compiler vectorizes (the
    per-element index divisions and a bool kept the loop scalar), in the device's bits in
    every strategy."""
    f32 = DType.f32
    b = Builder("bias-grad")
    x = b.input("x", "data", TensorType(dtype=f32, shape=(4, 6, 9, 9)))
    bias = b.input("b", "param", TensorType(dtype=f32, shape=(1, 6, 1, 1)))
    g = b.input("g", "data", TensorType(dtype=f32, shape=(4, 6, 9, 9)))
    zero = b.const(0.0, f32)
    mask = b.op("cast", b.op("gt", b.op("add", x, bias), zero), dtype="f32")
    program = b.program({"db": b.op("sum", b.op("mul", g, mask), axis=[0, 2, 3])})
    assert runs_vectorized_in_the_devices_bits(program, runtimes, tmp_path, "runs of at most 81 neighbours") >= 2


def test_a_transformers_weight_gradients_across_outputs_run_vectorized_and_equal_the_device(runtimes: dict[str, Any], tmp_path: Path) -> None:
    """nanoGPT's bias and norm-weight gradients, [B, T, C] -> [C] (the leading axes reduced: a
    thread per output, the outputs side by side): each step's block of outputs is computed in
    runs of neighbours in memory by a function of its own, which the compiler vectorizes,
    with a per-row input ([B, T, 1]: one value per run, a bool held as an int) and a
    position one ([T, C]: a base per run), in the device's bits in every strategy that has a
    thread per output (the warp's and block's lanes take an output's elements instead)."""
    f32 = DType.f32
    b = Builder("norm-grad")
    x = b.input("x", "data", TensorType(dtype=f32, shape=(3, 10, 24)))
    pos = b.input("pos", "param", TensorType(dtype=f32, shape=(10, 24)))
    mean = b.input("mean", "data", TensorType(dtype=f32, shape=(3, 10, 1)))
    rstd = b.input("rstd", "data", TensorType(dtype=f32, shape=(3, 10, 1)))
    g = b.input("g", "data", TensorType(dtype=f32, shape=(3, 10, 24)))
    zero = b.const(0.0, f32)
    live = b.op("cast", b.op("gt", rstd, zero), dtype="f32")
    normed = b.op("mul", b.op("sub", b.op("add", x, pos), mean), b.op("mul", rstd, live))
    program = b.program({"dw": b.op("sum", b.op("mul", g, normed), axis=[0, 1])})
    assert runs_vectorized_in_the_devices_bits(program, runtimes, tmp_path, "runs of at most 24 neighbours", lanes=("thread",)) >= 2


def runs_vectorized_in_the_devices_bits(program: Program, runtimes: dict[str, Any], tmp_path: Path, schedule: str,
                                        lanes: tuple[str, ...] = ("thread", "warp", "block")) -> int:
    """PROGRAM's reduction, in every strategy of LANES: its host kernel has a run function (its
    schedule says SCHEDULE) that GCC reports vectorized, and its outputs are the emulated
    device's bit for bit. Returns the strategies tried."""
    from sexpgpu.runtime.cpu.device import CpuRunner
    from sexpgpu.runtime.cpu.hostc import host_prelude, reduce_host
    from sexpgpu.runtime.cpu.toolchain import open_toolchain
    from test_cuda_codegen import feeds_for, strategies

    lowering = lower(program)
    lowered = lowering.program
    step = next(s for s in lowering.steps if isinstance(s, ReduceGroup))
    assert step.prologue is not None
    rng = np.random.default_rng(3)
    values = every_value(lowered, feeds_for(lowered, rng))
    device = DeviceBlocks(CpuRunner(runtimes["libm"]))
    tried = 0
    for strategy in [s for s in strategies(step, lowered.types()) if s.lanes in lanes]:
        cuda = reduce_kernels(step, lowered, lowering.constants, strategy)
        host = reduce_host(step, lowered, lowering.constants, "libm", cuda, strategy)
        run = f"{cuda[0].name}_run"
        assert run in host[0].source, host[0].schedule
        assert schedule in host[0].schedule, host[0].schedule
        source = tmp_path / f"k{tried}.c"
        source.write_text(host_prelude() + host[0].text)
        report = subprocess.run([open_toolchain().compiler, "-std=gnu11", "-O3", "-march=native", "-c", "-o", os.devnull, "-fopt-info-vec-optimized", str(source)],
                                capture_output=True, text=True, check=True).stderr
        helper_line = host[0].text[: host[0].text.index(run.replace(cuda[0].name, host[0].symbol))].count("\n") + host_prelude().count("\n") + 1
        assert any(f":{helper_line + 1}:" in line and "loop vectorized" in line for line in report.splitlines()), report
        functions, _ = runtimes["libm"].load(host)
        device.prepare(cuda)
        results = both_sides(cuda, host, [values[v] for v in step.inputs], functions, device)
        for k, (got, want) in enumerate(zip(*results)):
            assert_same_bits(got, want, f"{strategy}: output {k}")
        tried += 1
    return tried


def both_sides(cuda: list[KernelSource], host: list[Any], inputs: list[Any], functions: dict[str, Any], device: DeviceBlocks) -> list[list[np.ndarray]]:
    """A reduction's or a row group's kernels run on the host and on the emulated device, on
    the f32 INPUTS: each side's outputs (a split reduction's final result first)."""
    from cuda_host import storage, storage_dtype

    results = []
    for which in ("host", "cuda"):
        ins = [np.ascontiguousarray(storage(np.asarray(v), "f32")) for v in inputs]
        outs = [np.zeros(p.shape, dtype=storage_dtype(p.dtype.value)) for p in cuda[0].params if p.role == "out"]
        launch(which, cuda[0], host[0], functions, device, ins + outs)
        if len(cuda) == 2:
            final = np.zeros(cuda[1].params[-1].shape, dtype=storage_dtype(cuda[1].params[-1].dtype.value))
            launch(which, cuda[1], host[1], functions, device, [outs[0], final])
            outs = [final] + outs[1:]
        results.append(outs)
    return results


def test_a_feed_that_is_last_runs_array_is_not_looked_at_again_and_every_other_feed_is(runtimes: dict[str, Any]) -> None:
    """A program's run reads the address of each feed once per array: a model's parameters,
    fed as the same arrays every step, cost no look-up after the first run (the quickstart's
    per-step cost), while a new array, an array changed in place, a different shape and a
    feed that needs converting give the results NumPy computes."""
    f32 = DType.f32
    b = Builder("held-feeds")
    x = b.input("x", "data", TensorType(dtype=f32, shape=(8, 16)))
    w = b.input("w", "param", TensorType(dtype=f32, shape=(16, 4)))
    program = b.program({"y": b.op("relu", b.op("matmul", x, w))})
    lowered = cpu(runtimes).program(program)
    looked_at: list[int] = []
    to_device = lowered.device.to_device

    def counted(host: Any, t: TensorType) -> Any:
        looked_at.append(id(host))
        return to_device(host, t)

    lowered.device.to_device = counted  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((16, 4), dtype=np.float32)

    def check(xs: Any) -> None:
        want = np.maximum(np.asarray(xs, dtype=np.float32) @ weights, 0)
        np.testing.assert_allclose(lowered.run({"x": xs, "w": weights})["y"], want, rtol=1e-5, atol=1e-6)

    batch = rng.standard_normal((8, 16), dtype=np.float32)
    check(batch)
    assert looked_at == [id(batch), id(weights)]
    check(batch)
    assert looked_at == [id(batch), id(weights)], "the same arrays: no look-up"
    weights *= 2  # changed in place: the same array, its new values
    check(batch)
    fresh = rng.standard_normal((8, 16), dtype=np.float32)
    check(fresh)
    assert looked_at[2:] == [id(fresh)], "only the new array"
    as_f64 = rng.standard_normal((8, 16))  # converted to f32 for this run only, every run
    check(as_f64)
    check(as_f64)
    assert looked_at[3:] == [id(as_f64), id(as_f64)]
    weights.shape = (4, 16)  # the array last run held, reshaped in place: looked at again, and refused
    with pytest.raises(ValueError, match="shape"):
        lowered.run({"x": fresh, "w": weights})
