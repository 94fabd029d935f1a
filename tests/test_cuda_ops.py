"""Every op of the table on the emulated CUDA device against the NumPy backend: each case of
test_ops.py's tables (GRAD_CASES, FORWARD_CASES) and a few edge cases, in f32 and bf16,
lowered for the device, its generated kernels compiled for the host (tests/cuda_host.py)
and its cuBLAS calls computed by cuBLAS's documented contract, run twice (a constant is made
once), and compared with the NumPy backend: bit for bit where the device adds in the CPU's
order (moves, gathers, constants, argmax, scatter-add, pools), within rounding where cuBLAS
or a different summation order is involved. And the report holds to the code: every kernel
`explain --cuda` names is in the generated source or is a named cuBLAS call."""

from __future__ import annotations

import re
import shutil
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from cuda_host import HostRunner
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType, parse_dtype
from sexpgpu.ir.graph import Program, TensorType
from sexpgpu.ir.ops import OpError, all_ops
from sexpgpu.runtime.lower.codegen import LoweringError
from sexpgpu.runtime.lower.executor import ArrayDevice, LoweredProgram
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.runtime.lower.kernels import kernels_for
from sexpgpu.runtime.lower.plan import report
from sexpgpu.runtime.numpy_backend import CompiledProgram
from test_ops import FORWARD_CASES, GRAD_CASES, Case, D, F, I, _rng

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

# the device adds these in the CPU's order (or moves bits): equal bit for bit
EXACT = {"take", "scatter_add", "transpose", "slice", "unslice", "concat", "reshape", "broadcast_to", "full", "constant", "arange", "tril_mask",
         "argmax", "max_pool2d", "max_pool2d_grad", "max_pool2d_select", "avg_pool2d", "avg_pool2d_grad", "max", "min", "dropout_mask",
         "random_uniform", "random_normal"}


def one_op(op: str, case: Case, float_dtype: str) -> Program:
    b = Builder(f"device-{op}")
    ids = [b.input(f"x{i}", "data", arg.type(float_dtype)) for i, arg in enumerate(case.args)]
    return b.program({"y": b.op(op, *ids, **case.resolved_attrs(float_dtype))})


def assert_equal_or_close(got: np.ndarray, want: np.ndarray, dtype: DType, exact: bool, what: str) -> None:
    want = np.asarray(want)
    assert got.shape == want.shape, what
    if exact or dtype in (DType.i32, DType.i64, DType.bool):
        g, w = np.ascontiguousarray(got), np.ascontiguousarray(want)
        nan = np.isnan(w.astype(np.float64)) if dtype.is_float else np.zeros(w.shape, bool)
        assert (np.isnan(g.astype(np.float64)) == nan).all() if dtype.is_float else True, f"{what}: NaN where the other is not"
        np.testing.assert_array_equal(np.where(nan, 0, g), np.where(nan, 0, w), err_msg=what)
        return
    g64, w64 = got.astype(np.float64), want.astype(np.float64)
    finite = np.isfinite(w64)
    assert (np.isfinite(g64) == finite).all(), f"{what}: non-finite values differ"
    scale = max(1e-3, float(np.max(np.abs(w64[finite])))) if finite.any() else 1.0
    tol = 2.0**-7 if dtype == DType.bf16 else 2e-6
    np.testing.assert_allclose(g64[finite], w64[finite], rtol=tol, atol=tol * scale, err_msg=what)


def device() -> ArrayDevice:
    return ArrayDevice(np, HostRunner())


def run_both(program: Program, feeds: dict[str, np.ndarray], runs: int = 2) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    want = CompiledProgram(program).run_copy(feeds)
    lowered = LoweredProgram(program, device())
    return want, [{k: np.array(v, copy=True) for k, v in lowered.run(feeds).items()} for _ in range(runs)]


def what_of(op: str, case: Case) -> str:
    return f"{op} {case.label()}"


def cases_of(op: str) -> list[Case]:
    return GRAD_CASES.get(op, []) + FORWARD_CASES.get(op, [])


@pytest.mark.parametrize("op", sorted(all_ops()))
def test_every_op_on_the_emulated_device_equals_the_numpy_backend(op: str) -> None:
    """Each case in f32 and bf16 (integer and boolean cases as they are, f64 where the case
    asks for it)."""
    assert cases_of(op), f"{op} has no case in test_ops.py"
    for index, case in enumerate(cases_of(op)):
        for float_dtype in ("f32", "bf16"):
            try:
                program = one_op(op, case, float_dtype)
            except OpError:  # the op does not take this dtype (an f16/bf16 rule), as on the CPU
                continue
            out_t = program.types()[program.outputs["y"]]
            try:
                lower(program)
            except LoweringError:  # a dtype the device does not compute (f64), refused rather than run another way
                assert out_t.dtype in (DType.f64, DType.f16) or any(t.dtype in (DType.f64, DType.f16) for t in program.types().values()), what_of(op, case)
                continue
            rng = _rng(op, index, float_dtype, "device")
            feeds = {f"x{i}": arg.draw(rng, float_dtype) for i, arg in enumerate(case.args)}
            want, runs = run_both(program, feeds)
            what = f"{op} {case.label()} in {float_dtype}"
            for k, got in enumerate(runs):
                assert_equal_or_close(got["y"], want["y"], out_t.dtype, op in EXACT, f"{what}, run {k + 1}")


EDGE_CASES: list[tuple[str, Case, str]] = [
    # indices far out of range clip to the nearest row, in both index dtypes
    ("take", Case([F(6, 5), I([[-7, 0, 9], [5, 2, 100]], "i32")], {"axis": 0}), "f32"),
    ("take", Case([F(3, 4, 2), I([-1, 3, 4, 0], "i64")], {"axis": 1}), "bf16"),
    # repeated and out-of-range indices along every axis; the CPU's order of additions
    ("scatter_add", Case([F(3, 7, 4), I([2, -3, 2, 9, 0, 2, 1])], {"shape": [3, 4, 4], "axis": 1}), "f32"),
    ("scatter_add", Case([F(2, 3, 6), I([5, 5, 1, 0, 5, 9], "i32")], {"shape": [2, 3, 7], "axis": -1}), "bf16"),
    ("scatter_add", Case([I(np.arange(24).reshape(4, 6) - 7, "i32"), I([1, 1, 0, 3])], {"shape": [5, 6], "axis": 0}), "f32"),
    # a window that is one run of memory is a view; one that is not, a kernel
    ("slice", Case([F(4, 3, 5)], {"starts": [2, 0, 0], "stops": [3, 2, 5]}), "f32"),
    ("slice", Case([F(4, 3, 5)], {"starts": [1, 1, 2], "stops": [3, 3, 4]}), "bf16"),
    ("concat", Case([F(2, 3, 1), F(2, 3, 4), F(2, 3, 2)], {"axis": 2}), "bf16"),
    ("concat", Case([I([[1, 2]], "i64"), I([[3, 4], [5, 6]], "i64")], {"axis": 0}), "f32"),
    # ties go to the first maximum; NaN wins (the first NaN)
    ("argmax", Case([I([[1.0, 3.0, 3.0, -1.0], [float("nan"), 2.0, float("nan"), 9.0], [-np.inf, -np.inf, -np.inf, -np.inf]], "f32")], {"axis": 1}), "f32"),
    ("argmax", Case([I([[4, 9, 9], [-2, -8, -2]], "i32")], {"axis": 1, "keepdims": True}), "f32"),
    ("constant", Case([], {"data": [1.5, -2.25, 3.0, 1e-3, 7.0, 0.1], "dtype": "bf16", "shape": [3, 2]}), "f32"),
    ("constant", Case([], {"data": [3, -4, 2**40], "dtype": "i64", "shape": [3]}), "f32"),
    ("arange", Case([], {"shape": [7], "dtype": "f32", "start": 0.5, "step": 0.25}), "f32"),
    ("arange", Case([], {"shape": [5], "dtype": "i32", "start": -3, "step": 2}), "f32"),
    ("full", Case([], {"value": True, "dtype": "bool", "shape": [3, 2]}), "f32"),
    ("tril_mask", Case([], {"shape": [4, 6], "dtype": "bf16", "k": 2}), "f32"),
]


def pool_edge_cases() -> list[tuple[str, Case, str]]:
    """Max pools over ties, NaN, -inf windows at the padding; average pools of signed zeros."""
    x = np.array([[1.0, 1.0, -np.inf, -np.inf, 2.0], [1.0, np.nan, -np.inf, -np.inf, 2.0], [-0.0, 3.0, 3.0, -np.inf, -np.inf],
                  [0.5, -0.0, 3.0, -np.inf, -np.inf]]).reshape(1, 1, 4, 5)
    g = np.arange(1, 1 + 3 * 3, dtype=np.float64).reshape(1, 1, 3, 3) - 4.5
    attrs = {"kernel": [2, 2], "stride": [2, 2], "padding": [1, 1]}
    hx = np.linspace(-1, 1, 20).reshape(1, 1, 4, 5)
    return [
        ("max_pool2d", Case([I(x, "f32")], attrs), "f32"),
        ("max_pool2d_grad", Case([I(x, "f32"), I(g, "f32")], attrs), "f32"),
        ("max_pool2d_select", Case([I(x, "f32"), I(hx, "f32")], attrs), "f32"),
        ("max_pool2d_grad", Case([D(1, 2, 5, 5), F(1, 2, 5, 5)], {"kernel": [3, 3], "stride": [1, 1], "padding": [1, 1]}), "f32"),
        ("avg_pool2d", Case([I(np.copysign(0.0, x), "f32")], attrs), "f32"),
        ("avg_pool2d", Case([F(2, 3, 5, 4)], {"kernel": [3, 2], "stride": [1, 2], "padding": [1, 1]}), "bf16"),
        ("avg_pool2d_grad", Case([F(2, 1, 4, 4)], {"kernel": [3, 3], "stride": [2, 1], "padding": [1, 1], "input_shape": [2, 1, 7, 4]}), "bf16"),
    ]


@pytest.mark.parametrize("op,case,float_dtype", EDGE_CASES + pool_edge_cases(), ids=lambda v: v if isinstance(v, str) else "")
def test_edge_cases_on_the_emulated_device(op: str, case: Case, float_dtype: str) -> None:
    program = one_op(op, case, float_dtype)
    rng = _rng(op, case.label(), "edge")
    feeds = {f"x{i}": arg.draw(rng, float_dtype) for i, arg in enumerate(case.args)}
    want, runs = run_both(program, feeds)
    out_t = program.types()[program.outputs["y"]]
    for got in runs:
        assert_equal_or_close(got["y"], want["y"], out_t.dtype, op in EXACT, f"{op} {case.label()}")
    if op == "slice":
        kinds = [s.kind for s in lower(program).steps]
        assert kinds == (["view"] if case.attrs["starts"][0] == 2 else ["move"]), kinds


@pytest.mark.parametrize("float_dtype", ["f32", "bf16"])
def test_convolutions_and_their_gradients_match_the_cpu_in_every_geometry(float_dtype: str) -> None:
    """conv2d, conv2d_input_grad and conv2d_weight_grad (strides, padding, dilation, groups,
    1x1, depthwise) as im2col / col2im kernels around cuBLAS calls, with the calls checked
    by cuBLAS's contract: within f32 summation order of the CPU, and one bf16 rounding."""
    for op in ("conv2d", "conv2d_input_grad", "conv2d_weight_grad"):
        for index, case in enumerate(GRAD_CASES[op]):
            program = one_op(op, case, float_dtype)
            steps = lower(program).steps
            assert [s.kind for s in steps] == ["image"], steps
            line = report(program).kernels[0]
            assert line.cublas >= 1 and line.launches == line.cublas + len(kernels_for(steps[0], program)), line
            rng = _rng(op, index, float_dtype, "conv")
            feeds = {f"x{i}": arg.draw(rng, float_dtype) for i, arg in enumerate(case.args)}
            want, runs = run_both(program, feeds, runs=1)
            assert_equal_or_close(runs[0]["y"], want["y"], parse_dtype(float_dtype), False, f"{op} {case.label()} {float_dtype}")


# -- the report holds to the code ---------------------------------------------------------------------
GENERATED = re.compile(r"^sx_[a-z0-9_]+_[0-9a-f]{12}$")
CUBLAS = re.compile(r"^(\d+ x )?(cublasGemmEx|cublasGemmStridedBatchedEx) ")


def check_report(program: Program) -> None:
    """Every name in the report's kernel column is a kernel of the lowering's source (the
    one the step launches) or a named cuBLAS call, and the counts add up."""
    lowering = lower(program)
    lines = report(program, lowering).kernels
    for step, line in zip(lowering.steps, lines):
        sources = {k.name: k.source for k in kernels_for(step, lowering.program, lowering.constants)}
        if line.kind in ("view", "host"):
            assert line.kernel.startswith("(") and not sources and line.launches == 0, line
            assert (line.kind == "host") == bool(line.warning), line
            continue
        parts = line.kernel.split(" + ")
        named = [p for p in parts if GENERATED.match(p)]
        calls = [p for p in parts if CUBLAS.match(p)]
        assert len(named) + len(calls) == len(parts), f"{line.kernel}: neither a generated kernel nor a cuBLAS call"
        assert set(named) == set(sources), (line.kernel, sorted(sources))
        for name in named:
            assert f" {name}(" in sources[name], name
        counted = [re.match(r"^(\d+) x ", c) for c in calls]
        assert line.cublas == sum(int(m.group(1)) if m else 1 for m in counted), line
        assert line.launches == (0 if step.once else line.cublas + sum(1 for _ in sources)), line


def test_every_kernel_the_report_names_exists_for_every_op_and_example() -> None:
    from test_cuda_codegen import example_programs

    checked = 0
    for op in sorted(all_ops()):
        for case in cases_of(op):
            for float_dtype in ("f32", "bf16"):
                try:
                    program = one_op(op, case, float_dtype)
                    check_report(program)
                except (OpError, LoweringError):  # not this dtype, or f64 (refused, not lowered another way)
                    continue
                checked += 1
    for _, _, program in example_programs():
        check_report(program)
        checked += 1
    assert checked > 300, checked


def test_no_example_program_has_an_op_on_the_host() -> None:
    from test_cuda_codegen import example_programs

    for stem, name, program in example_programs():
        host = [line.nodes[0] for line in report(program).kernels if line.kind == "host"]
        assert not host, f"{stem} {name}: {host}"


def test_an_op_on_the_host_is_declared_in_the_table_reported_and_counted() -> None:
    """random_normal (on_host in the table): a host step, a warning with the bytes it copies,
    and the CPU's bits on the device."""
    assert sorted(name for name, op in all_ops().items() if op.on_host) == ["random_normal"]
    b = Builder("noise")
    step = b.input("rng.step", "data", TensorType(dtype=DType.i64, shape=()))
    noise = b.op("random_normal", step, shape=[5, 7], dtype="bf16", seed=3, key=9, mean=0.0, std=1.0)
    program = b.program({"y": b.op("mul", noise, b.const(2.0, DType.bf16))})
    (line,) = [k for k in report(program).kernels if k.kind == "host"]
    assert line.host_bytes == 8 + 5 * 7 * 2 and "random_normal runs on the host" in line.warning, line
    feeds = {"rng.step": np.asarray(4, dtype=np.int64)}
    want, runs = run_both(program, feeds)
    assert runs[0]["y"].view(np.uint16).tobytes() == np.asarray(want["y"], dtype=ml_dtypes.bfloat16).view(np.uint16).tobytes()


def test_a_joined_update_with_more_pointers_than_the_parameter_space_takes_them_from_device_memory() -> None:
    """The optimizer's joined update of many parameters (1-D parts joined, updated, windowed
    back) is one kernel with an input and an output per part: past 4 KiB of parameters its
    pointers go through a device array (as GPT-2's 197 parameters need), with the same values."""
    from sexpgpu.runtime.lower.codegen import PARAM_BYTES

    parts, width = 260, 3
    b = Builder("joined")
    t = TensorType(dtype=DType.f32, shape=(width,))
    params = [b.input(f"p{k}", "data", t) for k in range(parts)]
    grads = [b.input(f"g{k}", "data", t) for k in range(parts)]
    joined_p, joined_g = b.op("concat", *params, axis=0), b.op("concat", *grads, axis=0)
    new = b.op("sub", joined_p, b.op("mul", joined_g, b.const(0.5, DType.f32)))
    program = b.program({f"q{k}": b.op("slice", new, starts=[k * width], stops=[(k + 1) * width]) for k in range(parts)})
    lowering = lower(program)
    (kernel,) = [k for step in lowering.steps for k in kernels_for(step, lowering.program, lowering.constants)]
    assert 8 * (len(kernel.params) + 1) > PARAM_BYTES and kernel.table, len(kernel.params)
    assert "void* const* __restrict__ sx_args, long long n" in kernel.source
    rng = np.random.default_rng(5)
    feeds = {f"{x}{k}": rng.standard_normal(width).astype(np.float32) for x in "pg" for k in range(parts)}
    want, runs = run_both(program, feeds)
    for got in runs:
        for k in range(parts):
            np.testing.assert_array_equal(got[f"q{k}"], want[f"q{k}"], err_msg=f"q{k}")
