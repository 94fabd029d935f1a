"""The CUDA device on a real GPU (skipped elsewhere; `bench/gpu_check.sh` runs it on a lent
GPU machine): every elementwise op and reduction through NVRTC kernels against NumPy, every
case of the op tables (moves, gathers, scatters, convolutions through cuBLAS, pools,
attention) against the NumPy backend, fused attention against the unfused path up to 1,030
positions, every example program against the NumPy backend, and the examples' losses
against the CPU's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from conftest import REPO
from sexpgpu.ir.dtypes import DType
from sexpgpu.runtime.numpy_backend import CompiledProgram

cupy = pytest.importorskip("cupy")


def gpu() -> bool:
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:  # no driver
        return False


pytestmark = pytest.mark.skipif(not gpu(), reason="no CUDA device")


def device() -> Any:
    from sexpgpu.runtime.cuda.device import cuda_device

    return cuda_device("cuda")


def compare(got: dict[str, np.ndarray], want: dict[str, Any], program: Any, what: str, f32_tol: float = 2e-4) -> None:
    types = program.types()
    for key, w in want.items():
        g, t = got[key], types[program.outputs[key]]
        if t.dtype in (DType.i32, DType.i64, DType.bool):
            np.testing.assert_array_equal(g, w, err_msg=f"{what} {key}")
            continue
        g64, w64 = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        finite = np.isfinite(w64)
        assert (np.isfinite(g64) == finite).all(), f"{what} {key}: non-finite values differ"
        scale = max(1e-3, float(np.max(np.abs(w64[finite])))) if finite.any() else 1.0
        tol = 2.0**-6 if t.dtype == DType.bf16 else f32_tol
        np.testing.assert_allclose(g64[finite], w64[finite], rtol=tol, atol=tol * scale, err_msg=f"{what} {key}")


def test_every_op_case_on_the_gpu_matches_numpy() -> None:
    from sexpgpu.runtime.lower.executor import LoweredProgram
    from test_cuda_codegen import CASES, REDUCE_CASES, one_op_program, values

    dev = device()
    cases = [(op, dts, shapes, attrs) for op, dts, shapes, attrs in CASES]
    cases += [(op, [dt], [(3, 7, 5)], {"axis": axis, "keepdims": keep}) for op, dt, axis, keep in REDUCE_CASES]
    for op, dtypes, shapes, attrs in cases:
        program, ins = one_op_program(op, dtypes, shapes, **attrs)
        rng = np.random.default_rng(0)
        feeds = {i.name: values(s, d, rng, positive=op in ("log", "sqrt", "rsqrt", "log1p", "pow")) for i, d, s in zip(program.inputs, dtypes, shapes)}
        compare(LoweredProgram(program, dev).run(feeds), CompiledProgram(program).run_copy(feeds), program, f"{op} {dtypes} {shapes} {attrs}", f32_tol=1e-5)


def test_every_example_program_on_the_gpu_matches_the_numpy_backend() -> None:
    from sexpgpu.runtime.lower.executor import LoweredProgram
    from test_cuda_codegen import example_programs, feeds_for

    dev = device()
    rng = np.random.default_rng(11)
    for stem, name, program in example_programs():
        by_id = feeds_for(program, rng)
        feeds = {i.name: by_id[i.id] for i in program.inputs}
        compare(LoweredProgram(program, dev).run(feeds), CompiledProgram(program).run_copy(feeds), program, f"{stem} {name}")


@pytest.mark.parametrize("example,steps,rtol", [("quickstart", 100, 1e-4), ("charlm", 50, 1e-3), ("char-transformer", 50, 1e-3), ("cnn", 50, 1e-3)])
def test_examples_train_on_the_gpu_like_on_the_cpu(example: str, steps: int, rtol: float, tmp_path: Path) -> None:
    import json

    from sexpgpu.compile.pipeline import compile_file
    from sexpgpu.runtime.attempt import RunOptions, train
    from sexpgpu.runtime.devices import open_device

    experiment = compile_file(REPO / "examples" / f"{example}.lisp").experiment
    assert experiment is not None
    experiment.run.log_every = 1
    runs = {}
    for dev in ("cpu", "cuda"):
        resolved, backend = open_device(dev)  # the CPU side on the NumPy backend where no C compiler works
        result = train(experiment, RunOptions(store=str(tmp_path / dev), device=resolved, backend=backend, max_steps=steps, signals=False), say=lambda _: None)
        assert result.exit_code == 0
        events = [json.loads(line) for line in (tmp_path / dev / result.slug / "events.jsonl").read_text().splitlines()]
        runs[dev] = [e["loss"] for e in events if e["kind"] == "step"]
        if dev == "cuda":  # run.json names the GPU
            (device,) = json.loads((tmp_path / dev / result.slug / "run.json").read_text())["devices"]
            assert device["device"] == "cuda:0" and device["name"] and device["memory_bytes"] > 0, device
    np.testing.assert_allclose(runs["cuda"], runs["cpu"], rtol=rtol)


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
@pytest.mark.parametrize("shapes", [[(33, 17), (17, 9)], [(4, 33, 17), (17, 9)], [(2, 3, 33, 17), (2, 3, 17, 9)]])
def test_matmuls_through_cublas_match_numpy(dtype: DType, shapes: list[tuple[int, ...]]) -> None:
    from sexpgpu.runtime.lower.executor import LoweredProgram
    from test_cuda_codegen import one_op_program, values

    program, _ = one_op_program("matmul", [dtype, dtype], shapes)
    rng = np.random.default_rng(4)
    feeds = {i.name: values(s, dtype, rng) for i, s in zip(program.inputs, shapes)}
    compare(LoweredProgram(program, device()).run(feeds), CompiledProgram(program).run_copy(feeds), program, f"matmul {dtype} {shapes}", f32_tol=1e-5)



def test_every_reduction_strategy_and_row_layout_on_the_gpu_matches_numpy() -> None:
    """Each way a reduction spreads over the GPU (a thread, a warp or a block per output;
    thread or block chunks) and a row group (a thread, a warp or a block per row), at sizes where
    warps and blocks have real work, through NVRTC against NumPy."""
    from sexpgpu.ir.builder import Builder
    from sexpgpu.ir.graph import TensorType
    from sexpgpu.runtime.lower.fusion import lower
    from sexpgpu.runtime.lower.kernels import reduce_kernels
    from sexpgpu.runtime.lower.row_kernel import rows_kernel
    from sexpgpu.runtime.lower.steps import RowGroup
    from test_cuda_codegen import REDUCE_CASES, assert_close, assert_reduced, one_op_program, reference, strategies, values

    dev = device()
    runner = dev.runner

    def run(kernels: list[Any], inputs: list[np.ndarray]) -> np.ndarray:
        runner.prepare(kernels)
        arrays = [cupy.asarray(x.view(np.uint16) if x.dtype.itemsize == 2 and x.dtype.kind == "V" else x) for x in inputs]
        for kernel in kernels:
            outs = [cupy.zeros(p.shape, dtype={"f32": np.float32, "bf16": np.uint16, "i32": np.int32, "i64": np.int64, "f64": np.float64}[p.dtype.value])
                    for p in kernel.params if p.role == "out"]
            runner.launch(kernel, arrays + outs)
            arrays = outs
        return cupy.asnumpy(arrays[0])

    for op, dtype, axis, keep in REDUCE_CASES:
        for shape in ((3, 7, 5), (2, 300, 257)):
            program, (x,) = one_op_program(op, [dtype], [shape], axis=axis, keepdims=keep)
            rng = np.random.default_rng(1)
            feeds = {x: values(shape, dtype, rng)}
            vals = reference(program, feeds)
            lowering = lower(program)
            types = program.types()
            for red in lowering.reductions:
                for strategy in strategies(red, types):
                    got = run(reduce_kernels(red, program, lowering.constants, strategy), [np.asarray(vals[v]) for v in red.inputs])
                    if types[red.node.id].dtype == DType.bf16:
                        got = got.view(np.dtype(vals[red.node.id].dtype))
                    assert_reduced(got, vals[red.node.id], np.asarray(vals[red.node.args[0]]).astype(np.float64), red.node, f"{op} {dtype} {shape} {axis} {strategy}")
    b = Builder("rows")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(64, 1000)))
    m = b.op("max", x, axis=-1, keepdims=True)
    e = b.op("exp", b.op("sub", x, m))
    program = b.program({"soft": b.op("div", e, b.op("sum", e, axis=-1, keepdims=True))})
    vals = reference(program, {x: values((64, 1000), DType.f32, np.random.default_rng(2))})
    lowering = lower(program)
    (group,) = [g for g in lowering.steps if isinstance(g, RowGroup)]
    for lanes in ("thread", "warp", "block"):
        got = run([rows_kernel(group, program, lowering.constants, lanes)], [np.asarray(vals[v]) for v in group.inputs])
        assert_close(got, vals[group.outputs[0]], "f32", f"softmax rows, a {lanes} per row", scale_atol=True)


@pytest.mark.parametrize("shapes", [[(33, 17), (9, 17)], [(2, 3, 33, 17), (2, 3, 9, 17)], [(2, 17, 33), (2, 17, 9)]])
def test_bf16_matmuls_of_transposes_go_to_cublas_with_its_transpose_flags(shapes: list[tuple[int, ...]]) -> None:
    """`a @ b^T` and `a^T @ b` (the backward pass's shapes): the transpose is cuBLAS's flag on
    the stored operand, and the product equals NumPy's bf16 matmul."""
    from sexpgpu.ir.builder import Builder
    from sexpgpu.ir.graph import TensorType
    from sexpgpu.runtime.lower.executor import LoweredProgram
    from sexpgpu.runtime.lower.fusion import lower
    from sexpgpu.runtime.lower.steps import GemmCall
    from test_cuda_codegen import values

    b = Builder("mt")
    x = b.input("x", "data", TensorType(dtype=DType.bf16, shape=shapes[0]))
    y = b.input("y", "data", TensorType(dtype=DType.bf16, shape=shapes[1]))
    first = shapes[0][-1] != shapes[1][-1]  # (k x m)^T @ (k x n) when the last axes differ
    out = b.op("matmul", b.op("transpose", x, perm=list(range(len(shapes[0]) - 2)) + [len(shapes[0]) - 1, len(shapes[0]) - 2]), y) if first else \
        b.op("matmul", x, b.op("transpose", y, perm=list(range(len(shapes[1]) - 2)) + [len(shapes[1]) - 1, len(shapes[1]) - 2]))
    program = b.program({"out": out})
    (gemm,) = [s for s in lower(program).steps if isinstance(s, GemmCall)]
    assert gemm.trans_a or gemm.trans_b
    rng = np.random.default_rng(6)
    feeds = {"x": values(shapes[0], DType.bf16, rng), "y": values(shapes[1], DType.bf16, rng)}
    compare(LoweredProgram(program, device()).run(feeds), CompiledProgram(program).run_copy(feeds), program, f"transposed matmul {shapes}")


def test_the_whole_loop_keeps_its_tensors_on_the_gpu(tmp_path: Path) -> None:
    from sexpgpu.runtime.devices import open_backend
    from test_cuda_executor import check_whole_loop

    check_whole_loop(tmp_path, open_backend("cuda"))


def test_every_op_of_the_table_on_the_gpu_matches_the_numpy_backend() -> None:
    """Every case of the op tables (tests/test_cuda_ops.py's, edge cases included) through
    NVRTC kernels and cuBLAS, in f32 and bf16: bit for bit where the device adds in the
    CPU's order, within rounding elsewhere. The kernels compile as one module first."""
    from sexpgpu.ir.ops import OpError, all_ops
    from sexpgpu.runtime.lower.codegen import LoweringError
    from sexpgpu.runtime.lower.executor import LoweredProgram
    from sexpgpu.runtime.lower.fusion import lower
    from sexpgpu.runtime.lower.kernels import kernels_for
    from test_cuda_ops import EDGE_CASES, EXACT, assert_equal_or_close, cases_of, one_op, pool_edge_cases
    from test_ops import _rng

    dev = device()
    programs = []
    for op in sorted(all_ops()):
        cases = [(c, dt) for c in cases_of(op) for dt in ("f32", "bf16")] + [(c, dt) for o, c, dt in EDGE_CASES + pool_edge_cases() if o == op]
        for index, (case, float_dtype) in enumerate(cases):
            try:
                program = one_op(op, case, float_dtype)
                lowering = lower(program)
            except (OpError, LoweringError):
                continue
            programs.append((op, index, case, float_dtype, program, [k for step in lowering.steps for k in kernels_for(step, lowering.program, lowering.constants)]))
    dev.runner.prepare([k for *_, kernels in programs for k in kernels])  # one NVRTC module
    for op, index, case, float_dtype, program, _ in programs:
        lowered = LoweredProgram(program, dev)
        feeds = {f"x{i}": arg.draw(_rng(op, index, float_dtype, "gpu"), float_dtype) for i, arg in enumerate(case.args)}
        want = CompiledProgram(program).run_copy(feeds)
        out_t = program.types()[program.outputs["y"]]
        for run in range(2):  # a constant is made on the first run only
            assert_equal_or_close(lowered.run(feeds)["y"], want["y"], out_t.dtype, op in EXACT, f"{op} {case.label()} {float_dtype} run {run}")
    assert len(programs) > 250, len(programs)


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
@pytest.mark.parametrize("length,tile", [(37, 16), (70, 64), (1030, 64)])
def test_fused_attention_on_the_gpu_matches_the_unfused_numpy_path(dtype: DType, length: int, tile: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from sexpgpu.runtime.lower import attention
    from sexpgpu.runtime.lower.executor import LoweredProgram
    from test_cuda_attention import attention_program, compare, feeds

    monkeypatch.setattr(attention, "TILE", tile)
    data = feeds(length, dtype, length)
    wide = {k: v.astype(np.float32) for k, v in data.items()}
    want = CompiledProgram(attention_program(length, DType.f32, True, fused=False)).run_copy(wide)
    got = LoweredProgram(attention_program(length, dtype, True, fused=True), device()).run(data)
    compare(got, want, 1e-4 if dtype == DType.f32 else 1e-2, f"{dtype.value} length {length} tile {tile}")


def test_the_precompiled_kernels_are_loaded_not_compiled() -> None:
    """With the cubins bench/gpu_check.sh unpacks (built without a GPU by bench/gpu_ready.py),
    every kernel of the examples' programs comes from one: nothing goes to NVRTC, and the
    programs still match the NumPy backend."""
    from sexpgpu.runtime.cuda import cubins
    from sexpgpu.runtime.cuda.device import CupyRunner
    from sexpgpu.runtime.lower.executor import ArrayDevice, LoweredProgram
    from test_cuda_codegen import example_programs, feeds_for

    arch = str(cupy.cuda.Device().compute_capability)
    if not cubins.folder(arch).is_dir():
        pytest.skip(f"no precompiled kernels in {cubins.folder(arch)} (bench/gpu_check.sh unpacks them)")
    runner = CupyRunner(cupy)
    dev = ArrayDevice(cupy, runner)
    rng = np.random.default_rng(12)
    for stem, name, program in example_programs():
        lowered = LoweredProgram(program, dev)
        by_id = feeds_for(program, rng)
        feeds = {i.name: by_id[i.id] for i in program.inputs}
        compare(lowered.run(feeds), CompiledProgram(program).run_copy(feeds), program, f"{stem} {name}")
    compiled = [key for key in runner.modules if not key.endswith(".cubin")]
    assert not compiled, f"{len(compiled)} modules compiled by NVRTC; {len(runner.modules)} loaded"
