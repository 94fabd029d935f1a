"""Every kernel the CUDA device can be asked to compile, by where it comes from: the examples'
programs in f32 and in bf16 (every other lane and reduction choice of their steps too), every
case of the op tables (test_ops.py's, test_cuda_ops.py's edge cases, test_cuda_codegen.py's
elementwise cases, the random ops), and the benchmark configurations of bench/gpu_vs_torch.py
(the char transformer and the GPT-2-sized one, bf16). The NVRTC check (test_cuda_nvrtc.py,
bench/gpu_ready.py) compiles them all; the precompiled cache holds their cubins."""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterable

from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import Program, TensorType
from sexpgpu.ir.ops import OpError, all_ops
from sexpgpu.runtime.lower.codegen import KernelSource, LoweringError
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.runtime.lower.kernels import elementwise_kernel, kernels_for, reduce_kernels
from sexpgpu.runtime.lower.row_kernel import rows_kernel
from sexpgpu.runtime.lower.steps import RowGroup

REPO = Path(__file__).resolve().parents[1]
Kernels = dict[str, KernelSource]


def program_kernels(program: Program, variants: bool = True) -> Kernels:
    """The kernels PROGRAM's lowering launches, and with VARIANTS every other way each row
    group and reduction could be spread over the GPU."""
    from test_cuda_codegen import strategies

    out: Kernels = {}
    lowering = lower(program)
    lowered, types = lowering.program, lowering.program.types()
    for step in lowering.steps:
        out.update((k.name, k) for k in kernels_for(step, lowered, lowering.constants))
        if not variants:
            continue
        if isinstance(step, RowGroup):
            for lanes in ("thread", "warp", "block"):
                kernel = rows_kernel(step, lowered, lowering.constants, lanes)
                out[kernel.name] = kernel
        if step.kind == "reduce":
            for strategy in strategies(step, types):
                out.update((k.name, k) for k in reduce_kernels(step, lowered, lowering.constants, strategy))
    return out


def compiled_programs(path: Path) -> list[Program]:
    from sexpgpu.compile.pipeline import compile_file

    result = compile_file(path)
    if result.experiment is None:
        return []
    return list(result.experiment.module.programs.values())


def bf16_copy(path: Path, folder: Path) -> Path:
    """PATH with `:precision :bf16` in its defrun, reading the examples' data where it is."""
    text = path.read_text().replace("(defrun ", "(defrun :precision :bf16 ").replace('"data/', f'"{REPO / "examples" / "data"}/')
    copy = folder / path.name
    copy.write_text(text)
    return copy


def example_kernels(precision: str) -> Kernels:
    out: Kernels = {}
    with tempfile.TemporaryDirectory(prefix="sexpgpu-census-") as tmp:
        for path in sorted((REPO / "examples").glob("*.lisp")):
            source = path if precision == "f32" else bf16_copy(path, Path(tmp))
            for program in compiled_programs(source):
                out.update(program_kernels(program))
    return out


def op_case_kernels() -> Kernels:
    from test_cuda_codegen import CASES, one_op_program
    from test_cuda_ops import EDGE_CASES, cases_of, one_op, pool_edge_cases

    out: Kernels = {}
    for op in sorted(all_ops()):
        for case in cases_of(op) + [c for o, c, _ in EDGE_CASES + pool_edge_cases() if o == op]:
            for float_dtype in ("f32", "bf16"):
                try:
                    program = one_op(op, case, float_dtype)
                    out.update(program_kernels(program))
                except (OpError, LoweringError):  # not this dtype, or f64 (refused, not lowered another way)
                    continue
    for case in CASES:
        program, _ = one_op_program(case[0], case[1], case[2], **case[3])
        lowering = lower(program)
        for group in lowering.groups:  # over the lowered program: sigmoid and rsqrt are built from their parts
            kernel = elementwise_kernel(group, lowering.program, lowering.constants)
            out[kernel.name] = kernel
    for op, attrs in (("dropout_mask", {"rate": 0.25}), ("random_uniform", {"dtype": "bf16", "low": 0.0, "high": 1.0})):
        b = Builder("random")
        step = b.input("rng.step", "data", TensorType(dtype=DType.i64, shape=()))
        out.update(program_kernels(b.program({"out": b.op(op, step, shape=[9, 5], seed=1, key=2, **attrs)})))
    return out


def bench_kernels(only: str = "") -> Kernels:
    """The programs of bench/gpu_vs_torch.py's configurations (whose name contains ONLY), as
    they launch them (no variants: the benchmark runs what the lowering chose)."""
    sys.path.insert(0, str(REPO / "bench"))
    import gpu_vs_torch

    out: Kernels = {}
    for name, config in gpu_vs_torch.CONFIGS.items():
        if only not in name:
            continue
        with tempfile.TemporaryDirectory(prefix="sexpgpu-census-") as tmp:
            for program in compiled_programs(gpu_vs_torch.run_file(Path(tmp), config)):
                out.update(program_kernels(program, variants=False))
    return out


SOURCES: dict[str, Callable[[], Kernels]] = {
    "examples f32": lambda: example_kernels("f32"),
    "examples bf16": lambda: example_kernels("bf16"),
    "op cases": op_case_kernels,
    "bench configs": bench_kernels,
}


def census(names: Iterable[str] = tuple(SOURCES)) -> dict[str, Kernels]:
    """The kernels of each source NAMES names."""
    return {name: SOURCES[name]() for name in names}


def is_generated(name: str) -> bool:
    return re.match(r"^sx_[a-z0-9_]+_[0-9a-f]{12}$", name) is not None
