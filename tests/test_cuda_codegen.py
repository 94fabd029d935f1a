"""The CUDA code generator without a GPU: every elementwise op (f32, bf16, integers, booleans,
broadcasting) and every fusion group of every example's programs is generated, compiled as
C++ with a host shim, run on the CPU and compared with the NumPy backend; the same sources go through NVRTC and
ptxas in test_cuda_nvrtc.py."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Optional

import ml_dtypes
import numpy as np
import pytest

from conftest import REPO
from cuda_host import HostModule
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import Program, TensorType
from sexpgpu.ir.ops import OPS, op_def
from sexpgpu.runtime.lower.codegen import KernelSource
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.runtime.lower.kernels import ReduceStrategy, elementwise_kernel, planned_strategy, reduce_geometry, reduce_kernels
from sexpgpu.runtime.lower.row_kernel import rows_kernel
from sexpgpu.runtime.lower.steps import GemmCall, RowGroup

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

POSITIVE = {"log", "sqrt", "rsqrt", "log1p", "pow"}
UNARY = ["neg", "abs", "sign", "stop_gradient", "exp", "log", "log1p", "sqrt", "rsqrt", "square", "tanh", "sigmoid", "relu", "sin", "cos"]
BINARY = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
COMPARE = ["eq", "ne", "lt", "gt", "le", "ge"]


def values(shape: tuple[int, ...], dtype: DType, rng: np.random.Generator, positive: bool = False) -> np.ndarray:
    if dtype == DType.bool:
        return rng.random(shape) > 0.5
    if dtype in (DType.i32, DType.i64):
        return rng.integers(-5, 6, size=shape).astype(np.int32 if dtype == DType.i32 else np.int64)
    x = rng.standard_normal(shape).astype(np.float32) * 2.0
    if positive:
        x = np.abs(x) + 0.1
    x.flat[0] = 0.0 if not positive else 1.0  # exact values and ties
    if x.size > 1:
        x.flat[1] = x.flat[0]
    return x.astype(ml_dtypes.bfloat16) if dtype == DType.bf16 else x


def reference(program: Program, feeds: dict[int, np.ndarray]) -> dict[int, Any]:
    """Every value of PROGRAM, node by node, with the op table's NumPy kernels."""
    vals: dict[int, Any] = dict(feeds)
    for node in program.nodes:
        with np.errstate(all="ignore"):
            vals[node.id] = op_def(node.op).numpy([vals[a] for a in node.args], dict(node.attrs), None)
    return vals


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str, scale_atol: bool = False) -> None:
    want = np.asarray(want)
    if dtype in ("bool", "i32", "i64"):
        np.testing.assert_array_equal(got, want.astype(got.dtype), err_msg=what)
        return
    g, w = got.astype(np.float32), want.astype(np.float32)
    same_nan = np.isnan(g) == np.isnan(w)
    assert same_nan.all(), f"{what}: NaN where the other is not"
    ok = ~np.isnan(w)
    # libm and NumPy's vectorized transcendentals may differ by a few f32 ulps; one
    # rounding apart in bf16 is one bf16 ulp
    rtol = 2.0**-7 if dtype == "bf16" else 4e-6
    tiny = np.abs(w[ok]) < 1e-30  # denormals (CUDA flushes them; the host may not)
    finite = w[ok][np.isfinite(w[ok])]
    atol = (rtol * float(np.max(np.abs(finite)))) if scale_atol and finite.size else 1e-30
    np.testing.assert_allclose(np.where(tiny, 0, g[ok]), np.where(tiny, 0, w[ok]), rtol=rtol, atol=atol, err_msg=what)


def check_program(program: Program, feeds: dict[int, np.ndarray], expect_groups: Optional[int] = None) -> list[KernelSource]:
    """Generate every fused group of PROGRAM, run it on the host, compare with NumPy."""
    lowering = lower(program)
    program = lowering.program  # with softmax and the like built from their parts
    vals = reference(program, feeds)
    kernels = [(g, elementwise_kernel(g, program, lowering.constants)) for g in lowering.groups]
    if expect_groups is not None:
        assert len(kernels) == expect_groups, [[n.op for n in g.nodes] for g, _ in kernels]
    types = program.types()
    # every way a reduction or a row group can be spread over the GPU, not only the one its
    # shapes choose: the tests' shapes are small
    reductions = [(r, reduce_kernels(r, program, lowering.constants, strategy)) for r in lowering.reductions for strategy in strategies(r, types)]
    rows = [(g, rows_kernel(g, program, lowering.constants, lanes)) for g in lowering.steps if isinstance(g, RowGroup) for lanes in ("thread", "warp", "block")]
    module = HostModule([k for _, k in kernels + rows] + [k for _, ks in reductions for k in ks])
    # nodes a group recomputes (rematerialized from another group's inputs): from inputs that
    # are NumPy's values, a last-place difference of libm (tanh) can cancel into a relative one
    steps_of: dict[int, int] = {}
    for step in lowering.steps:
        for n in step.nodes:
            steps_of[n.id] = steps_of.get(n.id, 0) + 1
    for group, kernel in kernels:
        outs = module.run(kernel, [vals[v] for v in group.inputs])
        recomputes = any(steps_of[n.id] > 1 for n in group.nodes)
        for vid, got in zip(group.outputs, outs):
            ops = "+".join(n.op for n in group.nodes)
            assert_close(got, vals[vid], types[vid].dtype.value, f"%{vid} of group [{ops}]", scale_atol=recomputes)
    for row_group, kernel in rows:
        outs = module.run(kernel, [vals[v] for v in row_group.inputs], grid=2, block=64)
        by_id = {n.id: n for n in row_group.nodes}
        for vid, got in zip(row_group.outputs, outs):
            node = by_id[vid]
            what = f"%{vid} of row group [{'+'.join(n.op for n in row_group.nodes)}]"
            if node.op in ("sum", "mean", "max", "min"):
                assert_reduced(got, vals[vid], np.asarray(vals[node.args[0]]).astype(np.float64), node, what)
            else:
                # downstream of a reduction (double here, f32 in NumPy): cancellation (x - mean)
                # turns a last-bit difference of the mean into a relative one; compare to scale
                assert_close(got, vals[vid], types[vid].dtype.value, what, scale_atol=True)
    for red, chain in reductions:
        first = module.run(chain[0], [vals[v] for v in red.inputs], grid=2, block=64)
        # a split reduction: its partial results, then their combination
        result = module.run(chain[1], first[:1], grid=2, block=64)[0] if len(chain) == 2 else first[0]
        ops = "+".join(n.op for n in (red.prologue.nodes if red.prologue else [])) + f" -> {red.node.op}"
        source = np.asarray(vals[red.node.args[0]]).astype(np.float64)
        how = ", ".join(f"{k.lanes} x {k.size}" for k in chain)
        assert_reduced(result, vals[red.node.id], source, red.node, f"%{red.node.id} [{ops}] ({how})")
        for vid, got in zip(red.sides, first[1:]):  # the prologue's values the kernel stores
            assert_close(got, vals[vid], types[vid].dtype.value, f"%{vid}, a side of %{red.node.id} [{ops}] ({how})", scale_atol=True)
    return [k for _, k in kernels + rows] + [k for _, ks in reductions for k in ks]


def strategies(red: Any, types: dict[int, Any]) -> list[ReduceStrategy]:
    """Every strategy that fits reduction RED: a thread, a warp or a block per output, and
    split into chunks of a thread or a block (integer reductions: a thread per output)."""
    _, reduced, _, integer = reduce_geometry(red, types)
    if integer:
        return [ReduceStrategy("thread")]
    split = min(3, reduced)
    return [ReduceStrategy("thread"), ReduceStrategy("warp"), ReduceStrategy("block")] + (
        [ReduceStrategy("thread", split), ReduceStrategy("block", split)] if split >= 2 else [])


def assert_reduced(got: np.ndarray, want: Any, source: np.ndarray, node: Any, what: str) -> None:
    """A reduction against NumPy: max/min exactly; sums within NumPy's own rounding bound,
    which scales with the count and the sum of magnitudes."""
    want = np.asarray(want)
    if node.op in ("max", "min") or want.dtype.kind in "iu":
        np.testing.assert_array_equal(np.asarray(got, dtype=np.float64), want.astype(np.float64), err_msg=what)
        return
    from sexpgpu.ir.ops_reduce import normalize_axes

    axes = tuple(normalize_axes(node.op, node.attrs.get("axis"), source.ndim))
    scale = np.abs(source).sum(axis=axes, keepdims=bool(node.attrs.get("keepdims", False)))
    if node.op == "mean":
        scale = scale / max(1, int(np.prod([source.shape[a] for a in axes])))
    count = max(1, int(np.prod([source.shape[a] for a in axes])))
    # NumPy may accumulate in the input's precision, sequentially along a strided axis:
    # its error grows with the count; the kernel's (double) is far smaller
    eps = (2.0**-8 if want.dtype.itemsize == 2 else 2.0**-24) * (count + 2)
    g, w = np.asarray(got, dtype=np.float64), want.astype(np.float64)
    assert (np.isnan(g) == np.isnan(w)).all(), f"{what}: NaN where the other is not"
    ok = ~np.isnan(w)
    err = np.abs(g - w)[ok]
    assert (err <= (eps * scale)[ok] + 1e-30).all(), f"{what}: worst {float(np.max(err - (eps * scale)[ok]))}"


def one_op_program(op: str, dtypes: list[DType], shapes: list[tuple[int, ...]], **attrs: Any) -> tuple[Program, list[int]]:
    b = Builder(f"op-{op}")
    ins = [b.input(f"x{k}", "data", TensorType(dtype=d, shape=s)) for k, (d, s) in enumerate(zip(dtypes, shapes))]
    out = b.op(op, *ins, **attrs)
    return b.program({"out": out}), ins


CASES: list[tuple[str, list[DType], list[tuple[int, ...]], dict[str, Any]]] = []
for _op in UNARY:
    for _dt in (DType.f32, DType.bf16):
        CASES.append((_op, [_dt], [(5, 37)], {}))
for _op in ("neg", "abs", "square", "relu", "sign"):
    CASES.append((_op, [DType.i32], [(5, 37)], {}))
for _op in BINARY:
    for _dt in (DType.f32, DType.bf16):
        for _shapes in ([(5, 37), (5, 37)], [(5, 37), (37,)], [(5, 1), (5, 37)], [(5, 37), ()]):
            CASES.append((_op, [_dt, _dt], _shapes, {}))
for _op in ("add", "sub", "mul", "maximum", "minimum"):
    CASES.append((_op, [DType.i32, DType.i32], [(4, 9), (9,)], {}))
for _op in COMPARE:
    for _dt in (DType.f32, DType.bf16, DType.i32):
        CASES.append((_op, [_dt, _dt], [(6, 11), (11,)], {}))
for _op in ("logical_and", "logical_or"):
    CASES.append((_op, [DType.bool, DType.bool], [(6, 11), (6, 11)], {}))
CASES.append(("logical_not", [DType.bool], [(6, 11)], {}))
for _dt in (DType.f32, DType.bf16, DType.i32):
    CASES.append(("where", [DType.bool, _dt, _dt], [(6, 11), (6, 11), (11,)], {}))
for _src, _dst in [("f32", "bf16"), ("bf16", "f32"), ("f32", "i32"), ("i32", "f32"), ("f32", "bool"), ("bool", "f32"), ("i32", "i64"), ("bf16", "i32")]:
    CASES.append(("cast", [DType(_src)], [(5, 13)], {"dtype": _dst}))
CASES.append(("broadcast_to", [DType.f32], [(1, 13)], {"shape": (4, 5, 13)}))


def test_the_cases_cover_every_elementwise_op() -> None:
    op_def("add")
    elementwise = {name for name, op in OPS.items() if op.elementwise}
    assert elementwise <= {case[0] for case in CASES}, elementwise - {case[0] for case in CASES}


@pytest.mark.parametrize("op,dtypes,shapes,attrs", CASES, ids=[f"{c[0]}-{'-'.join(d.value for d in c[1])}-{'x'.join(str(s) for s in c[2])}" for c in CASES])
def test_every_elementwise_op_matches_numpy(op: str, dtypes: list[DType], shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> None:
    program, ins = one_op_program(op, dtypes, shapes, **attrs)
    rng = np.random.default_rng(abs(hash(op)) % 2**32)
    feeds = {vid: values(s, d, rng, positive=op in POSITIVE) for vid, d, s in zip(ins, dtypes, shapes)}
    check_program(program, feeds, expect_groups=1)


def test_a_chain_with_broadcasts_constants_and_two_outputs_is_one_kernel() -> None:
    b = Builder("chain")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(8, 16)))
    w = b.input("w", "param", TensorType(dtype=DType.f32, shape=(16,)))
    bias = b.input("b", "param", TensorType(dtype=DType.f32, shape=(8, 1)))
    y = b.op("sigmoid", b.op("add", b.op("mul", x, w), bias))
    y2 = b.op("mul", y, b.const(2.0, DType.f32))
    half = b.const(0.5, DType.f32)
    z = b.op("where", b.op("gt", y, half), y2, b.op("neg", y))
    low = b.cast(b.op("exp", b.cast(z, DType.bf16)), DType.f32)
    program = b.program({"y": y, "out": low})
    rng = np.random.default_rng(1)
    feeds = {x: values((8, 16), DType.f32, rng), w: values((16,), DType.f32, rng), bias: values((8, 1), DType.f32, rng)}
    (kernel,) = check_program(program, feeds, expect_groups=1)
    assert [p.role for p in kernel.params].count("out") == 2  # y (returned) and the final value
    assert "0.5f" in kernel.source and "2.0f" in kernel.source  # constants are literals, not loads


def test_nan_passes_through_relu_maximum_and_minimum_as_in_numpy() -> None:
    b = Builder("nan")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(6,)))
    zero = b.const(0.0, DType.f32)
    program = b.program({"r": b.op("relu", x), "mx": b.op("maximum", x, zero), "mn": b.op("minimum", zero, x)})
    feeds = {x: np.array([np.nan, -1.0, 2.0, np.inf, -np.inf, 0.0], dtype=np.float32)}
    check_program(program, feeds)


def test_a_value_both_fused_and_needed_by_a_matmul_is_written() -> None:
    b = Builder("mixed")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(4, 8)))
    w = b.input("w", "param", TensorType(dtype=DType.f32, shape=(8, 3)))
    h = b.op("tanh", x)
    y = b.op("matmul", h, w)
    out = b.op("add", b.op("relu", y), b.const(1.0, DType.f32))
    program = b.program({"out": out})
    lowering = lower(program)
    kinds = [s.kind for s in lowering.steps]
    assert kinds == ["fused", "gemm", "fused"], kinds
    gemm = lowering.steps[1]
    assert isinstance(gemm, GemmCall) and (gemm.m, gemm.n, gemm.k) == (4, 3, 8)
    rng = np.random.default_rng(2)
    check_program(program, {x: values((4, 8), DType.f32, rng), w: values((8, 3), DType.f32, rng)})



def test_a_constant_a_matmul_reads_is_a_kernel_of_its_own_and_a_transpose_it_reads_a_flag() -> None:
    """A `full` becomes a literal only when every reader is fused: a matmul's is made (once)
    (and a transpose only matmuls read is cuBLAS's flag, whichever operand it is)."""
    b = Builder("constant-operand")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(4, 3)))
    w = b.const(0.5, DType.f32, (2, 3))
    program = b.program({"out": b.op("matmul", x, b.op("transpose", w, perm=[1, 0]))})
    lowering = lower(program)
    assert [s.kind for s in lowering.steps] == ["constant", "gemm"] and not lowering.constants
    gemm = lowering.steps[1]
    assert isinstance(gemm, GemmCall) and gemm.trans_b and gemm.b == w

def example_programs() -> list[tuple[str, str, Program]]:
    from sexpgpu.compile.pipeline import compile_file

    out = []
    for path in sorted((REPO / "examples").glob("*.lisp")):
        result = compile_file(path)
        if result.experiment is None:
            continue
        for name, program in result.experiment.module.programs.items():
            out.append((path.stem, name, program))
    return out


def feeds_for(program: Program, rng: np.random.Generator) -> dict[int, np.ndarray]:
    feeds: dict[int, np.ndarray] = {}
    for i in program.inputs:
        t = i.type
        if t.dtype in (DType.i32, DType.i64):  # token ids, labels, counters: small and valid
            feeds[i.id] = rng.integers(0, 3, size=t.shape).astype(np.int32 if t.dtype == DType.i32 else np.int64)
        else:
            feeds[i.id] = values(tuple(t.shape), t.dtype, rng, positive=i.kind == "state") * (0.1 if t.dtype != DType.bool else 1)
    return feeds


@pytest.fixture(scope="module")
def examples() -> list[tuple[str, str, Program]]:
    return example_programs()


def test_every_fusion_group_of_every_example_matches_numpy_on_the_host(examples: list[tuple[str, str, Program]]) -> None:
    rng = np.random.default_rng(3)
    groups = 0
    for _, _, program in examples:
        kernels = check_program(program, feeds_for(program, rng))
        groups += len(kernels)
    assert groups > 50, groups


def test_the_arena_never_overlaps_two_live_buffers(examples: list[tuple[str, str, Program]]) -> None:
    from sexpgpu.runtime.lower.plan import plan_arena

    for stem, name, program in examples:
        lowering = lower(program)
        program = lowering.program
        arena = plan_arena(lowering)
        assert arena.size >= arena.peak_live > 0 or not arena.buffers, (stem, name)
        bufs = arena.buffers
        for i, a in enumerate(bufs):
            assert a.offset % 256 == 0 and a.offset + a.bytes <= arena.size
            for b in bufs[i + 1 :]:
                live_together = a.first <= b.last and b.first <= a.last
                apart = a.offset + a.bytes <= b.offset or b.offset + b.bytes <= a.offset
                assert not live_together or apart, (stem, name, a, b)
        written = {v for s in lowering.steps if s.kind != "view" for v in s.writes}
        assert all(r.node.id in written for r in lowering.reductions)
        # and the steps' scratch buffers (a split reduction's partial results, im2col), named by their step
        types = program.types()
        scratch = {-(k + 1) for k, s in enumerate(lowering.steps) if s.scratch_bytes(types)}
        assert {-(k + 1) for k, s in enumerate(lowering.steps) if s.kind == "reduce" and planned_strategy(s, types).split > 1} <= scratch
        assert written | scratch == {b.value for b in bufs}, (stem, name)


def test_explain_cuda_reports_every_example(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    for path in sorted((REPO / "examples").glob("*.lisp")):
        if path.stem == "tour":
            continue
        done = subprocess.run([sys.executable, "-m", "sexpgpu", "explain", str(path), "--cuda", "--json"], capture_output=True, text=True, cwd=REPO)
        assert done.returncode == 0, (path, done.stderr)
        cuda = json.loads(done.stdout)["cuda"]
        train = cuda["programs"]["train"]
        kinds = {k["kind"] for k in train["kernels"]}
        assert {"fused", "gemm"} <= kinds, (path.stem, kinds)
        assert train["arena"]["size"] > 0 and cuda["memory"]["total"] > cuda["memory"]["params"]
        text = subprocess.run([sys.executable, "-m", "sexpgpu", "explain", str(path), "--cuda"], capture_output=True, text=True, cwd=REPO)
        assert "CUDA lowering: train" in text.stdout and "memory plan (cuda)" in text.stdout and "cublasGemm" in text.stdout


REDUCE_CASES = [
    (op, dtype, axis, keep)
    for op in ("sum", "mean", "max", "min")
    for dtype in (DType.f32, DType.bf16, DType.i32)
    for axis, keep in ((None, False), (0, False), (-1, True), ((0, 2), False), (1, True))
    if not (op == "mean" and dtype == DType.i32)
]


@pytest.mark.parametrize("op,dtype,axis,keep", REDUCE_CASES, ids=[f"{c[0]}-{c[1].value}-{c[2]}-{c[3]}" for c in REDUCE_CASES])
def test_every_reduction_matches_numpy(op: str, dtype: DType, axis: Any, keep: bool) -> None:
    program, ins = one_op_program(op, [dtype], [(3, 7, 5)], axis=axis, keepdims=keep)
    rng = np.random.default_rng(5)
    lowering = lower(program)
    assert [s.kind for s in lowering.steps] == ["reduce"]
    check_program(program, {ins[0]: values((3, 7, 5), dtype, rng)})


def test_a_reduction_takes_in_its_prologue_and_propagates_nan() -> None:
    b = Builder("softmax-ish")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(6, 9)))
    m = b.op("max", x, axis=0, keepdims=True)  # over the first axis: not a row group
    e = b.op("exp", b.op("sub", x, m))
    s = b.op("sum", e, axis=0, keepdims=True)
    program = b.program({"m": m, "s": s})
    lowering = lower(program)
    assert [st.kind for st in lowering.steps] == ["reduce", "reduce"]
    assert [n.op for n in lowering.steps[1].prologue.nodes] == ["sub", "exp"]
    feeds = values((6, 9), DType.f32, np.random.default_rng(6))
    feeds[2, 3] = np.nan
    check_program(program, {x: feeds})


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
def test_the_sorted_scatter_add_gives_the_cpu_backends_bits(dtype: DType) -> None:
    """Repeated and out-of-range indices; the same order of additions as np.add.at, so the
    same bits (not merely close)."""
    from cuda_host import HostRunner
    from sexpgpu.runtime.lower.executor import ArrayDevice, LoweredProgram
    from sexpgpu.runtime.numpy_backend import CompiledProgram

    b = Builder("scatter")
    g = b.input("g", "data", TensorType(dtype=dtype, shape=(4, 9, 6)))
    idx = b.input("idx", "data", TensorType(dtype=DType.i32, shape=(4, 9)))
    out = b.op("scatter_add", g, idx, shape=[11, 6], axis=0)
    program = b.program({"out": out})
    assert [s.kind for s in lower(program).steps] == ["scatter"]
    rng = np.random.default_rng(9)
    feeds = {"g": values((4, 9, 6), dtype, rng), "idx": rng.integers(-2, 14, size=(4, 9)).astype(np.int32)}
    want = CompiledProgram(program).run_copy(feeds)["out"]
    got = LoweredProgram(program, ArrayDevice(np, HostRunner())).run(feeds)["out"]
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()


@pytest.mark.parametrize("op,dtype,attrs", [
    ("dropout_mask", DType.bool, {"rate": 0.1}), ("dropout_mask", DType.bool, {"rate": 0.5}),
    ("random_uniform", DType.f32, {"dtype": "f32", "low": -0.3, "high": 1.7}), ("random_uniform", DType.bf16, {"dtype": "bf16", "low": 0.0, "high": 1.0}),
])
def test_device_philox_gives_the_cpu_backends_bits(op: str, dtype: DType, attrs: dict[str, Any]) -> None:
    from cuda_host import HostRunner
    from sexpgpu.runtime.lower.executor import ArrayDevice, LoweredProgram
    from sexpgpu.runtime.numpy_backend import CompiledProgram

    b = Builder("random")
    step = b.input("rng.step", "data", TensorType(dtype=DType.i64, shape=()))
    out = b.op(op, step, shape=[5, 7, 3], seed=12345, key=2**32 - 7, **attrs)  # 105 elements: a partial last block
    program = b.program({"out": out})
    assert [s.kind for s in lower(program).steps] == ["random"]
    for counter in (0, 3, 2**40 + 17):
        feeds = {"rng.step": np.asarray(counter, dtype=np.int64)}
        want = CompiledProgram(program).run_copy(feeds)["out"]
        got = LoweredProgram(program, ArrayDevice(np, HostRunner())).run(feeds)["out"]
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), counter


def test_bf16_constants_are_rounded_like_the_cpu_backend_and_big_integers_stay_exact() -> None:
    b = Builder("constants")
    x = b.input("x", "data", TensorType(dtype=DType.bf16, shape=(3, 8)))
    y = b.op("mul", x, b.const(0.044715, DType.bf16))  # 0.044715 is 0.0446777... in bf16
    i = b.input("i", "data", TensorType(dtype=DType.i64, shape=(4,)))
    j = b.input("j", "data", TensorType(dtype=DType.i64, shape=(4,)))
    program = b.program({"y": y, "m": b.op("maximum", i, j), "a": b.op("abs", b.op("neg", i))})
    rng = np.random.default_rng(8)
    big = np.array([2**40 + 1, -(2**33) - 3, 16777217, 5], dtype=np.int64)
    check_program(program, {x: values((3, 8), DType.bf16, rng), i: big, j: big - 1})
    lowering = lower(program)
    kernel = elementwise_kernel(lowering.groups[0], program, lowering.constants)
    assert "0.044677734375f" in kernel.source or any("0.044677734375f" in elementwise_kernel(g, program, lowering.constants).source for g in lowering.groups)


def test_softmax_and_layer_norm_are_one_row_kernel_each() -> None:
    b = Builder("rows")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(5, 6, 33)))
    w = b.input("w", "param", TensorType(dtype=DType.f32, shape=(33,)))
    m = b.op("max", x, axis=-1, keepdims=True)
    e = b.op("exp", b.op("sub", x, m))
    soft = b.op("div", e, b.op("sum", e, axis=-1, keepdims=True))
    mean = b.op("mean", soft, axis=-1, keepdims=True)
    centered = b.op("sub", soft, mean)
    var = b.op("mean", b.op("mul", centered, centered), axis=-1, keepdims=True)
    normed = b.op("mul", b.op("mul", centered, b.op("rsqrt", b.op("add", var, b.const(1e-5, DType.f32)))), w)
    program = b.program({"soft": soft, "out": normed})
    lowering = lower(program)
    assert [st.kind for st in lowering.steps] == ["rows"], [st.kind for st in lowering.steps]
    rng = np.random.default_rng(12)
    feeds = values((5, 6, 33), DType.f32, rng)
    feeds[1, 2, 4] = np.nan  # one row goes NaN, as in NumPy; the others are untouched
    check_program(program, {x: feeds, w: values((33,), DType.f32, rng)})



F64_FILE = """
(require "sexpgpu/nn" :as nn)
(require "sexpgpu/optim" :as optim)
(defloader train :source (synthetic :spirals :n 64 :classes 3 :seed 0) :fields ((x :f32 (2)) (y :i32 ())) :batch 16)
(defpart net (nn:mlp 2 8 3))
(defobjective (batch) (nn:cross-entropy (cast (net (cast (field batch x) :f64)) :f32) (field batch y)))
(defgroups (all "**" (optim:sgd :lr 0.1)))
(defrun :steps 2 :seed 0)
"""


def test_a_program_the_device_cannot_compute_is_refused_with_its_reason(tmp_path: Path) -> None:
    """f64 matmuls: the lowering says so (a LoweringError, a DeviceError), `explain --cuda`
    prints it for the program instead of a report, and the run's device check refuses with
    it (exit 4 on `run --device cuda`), never running the op some other way."""
    import subprocess
    import sys

    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.memory import device_memory_problem

    (tmp_path / ".git").mkdir()
    path = tmp_path / "f64.lisp"
    path.write_text(F64_FILE)
    experiment = compile_file(path).experiment
    assert experiment is not None
    problem = device_memory_problem(experiment, 2**40)
    assert problem is not None and problem.startswith("the CUDA device cannot run it: matmul %") and "not f64" in problem, problem
    done = subprocess.run([sys.executable, "-m", "sexpgpu", "explain", str(path), "--cuda"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "CUDA lowering: train  cannot run on the CUDA device: matmul %" in done.stdout and "memory plan (cuda)" not in done.stdout, done.stdout
