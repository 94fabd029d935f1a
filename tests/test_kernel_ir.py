"""The kernel description (runtime/lower/kernel_ir.py) and its two renderers.

A reduction is declared by its op-table entry and its reducer spec alone: the CUDA kernels
and the host C are both rendered from the same description, so a reduction nobody wrote a
kernel for computes the same bits on the compiled CPU device as on the emulated CUDA device,
in every strategy, and NumPy's value. `explain --cpu` lists the kernels `explain --cuda`
lists, by the same names at the same steps, each with the host's schedule."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any, Optional

import numpy as np
import pytest

from conftest import REPO, environment
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType
from sexpgpu.ir.graph import TensorType
from sexpgpu.ir.ops import OPS, OpDef, OpKind, ReducerSpec, all_ops, op_def
from sexpgpu.ir.ops_reduce import _reduce_flops, _reduce_type
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.runtime.lower.lowering import LOWERINGS_BY_OP
from sexpgpu.runtime.lower.steps import ReduceGroup, RowGroup
from sexpgpu.runtime.numpy_backend import CompiledProgram

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("g++") is None, reason="the compiled CPU device needs a C compiler")

PROD = ReducerSpec(identity="1", identity_integer="1", combine="{0} * {1}")


def prod_kernel(xs: list[np.ndarray], attrs: dict[str, Any], out: Optional[np.ndarray]) -> np.ndarray:
    axis = attrs.get("axis")
    return np.asarray(np.prod(xs[0], axis=None if axis is None else tuple(np.atleast_1d(axis)), keepdims=bool(attrs.get("keepdims", False))), dtype=xs[0].dtype)


@pytest.fixture
def prod(monkeypatch: pytest.MonkeyPatch) -> None:
    """A product reduction, declared by its op-table entry with its reducer spec, lowered by
    the reductions' rule: no kernel of its own anywhere."""
    all_ops()
    entry = OpDef("prod", _reduce_type("prod"), prod_kernel, grad=None, kind=OpKind.REDUCTION, arity=1, flops=_reduce_flops, reducer=PROD)
    monkeypatch.setitem(OPS, entry.name, entry)
    monkeypatch.setitem(LOWERINGS_BY_OP, entry.name, LOWERINGS_BY_OP["sum"])


def test_the_reductions_kernels_read_their_semantics_from_the_op_table() -> None:
    """Every reduction the kernels compute has its reducer spec in the op table: identity,
    pairwise combine, the extremes' comparison (their NaN rule) and mean's division."""
    for name in ("sum", "mean", "max", "min"):
        assert op_def(name).reducer is not None, name
    assert op_def("mean").reducer.divides and not op_def("sum").reducer.divides  # type: ignore[union-attr]
    assert op_def("max").reducer.better == ">" and op_def("min").reducer.better == "<"  # type: ignore[union-attr]
    # an extreme takes a NaN once and keeps it (NumPy's rule); a sum combines each element as it combines partials
    assert "!= x" in op_def("max").reducer.update("acc", "x", False)  # type: ignore[union-attr]
    assert op_def("sum").reducer.update("acc", "x", False) == "acc = acc + (double)x;"  # type: ignore[union-attr]


def test_a_reduction_declared_by_its_reducer_spec_alone_is_the_same_on_both_devices(prod: None) -> None:
    """`prod` (identity 1, combine a * b) in every strategy of the device (a thread, a warp or
    a block per output, chunks), over the last axis, the first, and all of them, with a
    prologue, and in a row group: the host's bits are the emulated CUDA kernels' and the
    value is NumPy's (products of powers of two are exact)."""
    from test_cpu_device import DeviceBlocks, assert_same_bits, both_sides, every_value
    from test_cuda_codegen import strategies

    from sexpgpu.runtime.cpu.device import CpuRunner, CpuRuntime
    from sexpgpu.runtime.cpu.hostc import reduce_host, rows_host
    from sexpgpu.runtime.cpu.toolchain import open_toolchain
    from sexpgpu.runtime.lower.kernels import reduce_kernels
    from sexpgpu.runtime.lower.row_kernel import rows_kernel

    b = Builder("prods")
    x = b.input("x", "data", TensorType(dtype=DType.f32, shape=(6, 40)))
    sq = b.op("mul", x, x)
    row = b.op("prod", sq, axis=[-1], keepdims=True)
    outputs = {"last": b.op("prod", x, axis=[-1]), "first": b.op("prod", sq, axis=[0]), "all": b.op("prod", x),
               "rows": b.op("div", sq, b.op("add", row, b.scalar_like(1.0, row)))}
    program = b.program(outputs)
    rng = np.random.default_rng(3)
    feeds = {"x": (rng.choice([-2.0, -1.0, 0.5, 1.0, 2.0], size=(6, 40))).astype(np.float32)}
    want = CompiledProgram(program).run_copy(feeds)
    np.testing.assert_array_equal(want["last"], np.prod(feeds["x"], axis=-1))

    runtime = CpuRuntime(open_toolchain(), math="libm")
    lowering = lower(program)
    lowered = lowering.program
    types = lowered.types()
    steps = [s for s in lowering.steps if isinstance(s, (ReduceGroup, RowGroup))]
    assert any(isinstance(s, RowGroup) for s in steps) and sum(isinstance(s, ReduceGroup) for s in steps) >= 3
    values = every_value(lowered, {i.id: feeds[i.name] for i in lowered.inputs})
    jobs: list[tuple[str, list[Any], list[Any], Any]] = []
    for step in steps:
        if isinstance(step, ReduceGroup):
            for strategy in strategies(step, types):
                cuda = reduce_kernels(step, lowered, lowering.constants, strategy)
                jobs.append((f"%{step.node.id} {strategy}", cuda, reduce_host(step, lowered, lowering.constants, "libm", cuda, strategy), step))
        else:
            for lanes in ("thread", "warp", "block"):
                cuda = [rows_kernel(step, lowered, lowering.constants, lanes)]
                jobs.append((f"rows {lanes}", cuda, [rows_host(step, lowered, lowering.constants, "libm", cuda[0], lanes)], step))
    functions, _ = runtime.load([k for job in jobs for k in job[2]])
    device = DeviceBlocks(CpuRunner(runtime))
    device.prepare([k for job in jobs for k in job[1]])
    for what, cuda, host, step in jobs:
        results = both_sides(cuda, host, [values[v] for v in step.inputs], functions, device)
        for k, (a, c) in enumerate(zip(*results)):
            assert_same_bits(a, c, f"{what}: output {k}")
        written = step.writes if isinstance(step, ReduceGroup) else step.outputs
        for value, got in zip(written, results[0]):
            np.testing.assert_array_equal(got.reshape(np.shape(values[value])), values[value], err_msg=f"{what}: %{value}")


def test_explain_cpu_lists_the_kernels_of_explain_cuda_each_with_its_schedule(tmp_path: Any) -> None:
    """The same launches at the same step numbers on both devices (generated kernels by their
    names, each BLAS call by the host's name for it), and a schedule for each on both."""
    from sexpgpu.runtime.cpu.device import BLAS_SCHEDULE, host_blas

    proc = subprocess.run([sys.executable, "-m", "sexpgpu", "explain", "examples/quickstart.lisp", "--cpu", "--cuda", "--json"], cwd=REPO,
                          env=environment(SEXPGPU_CACHE=str(tmp_path / "cache")), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    for name in ("train", "update"):
        lines = doc["cuda"]["programs"][name]["kernels"]
        cuda = [(k["step"], n if n.startswith("sx_") else host_blas(n)) for k in lines for n in k["kernel"].split(" + ")
                if n.startswith("sx_") or host_blas(n) is not None]
        cpu = doc["cpu"]["programs"][name]["steps"]
        assert [(k["step"], k["kernel"]) for k in cpu] == cuda, name
        assert name == "update" or any(k["schedule"] == BLAS_SCHEDULE and k["kernel"].startswith("sgemm ") for k in cpu), cpu
        assert all(k["schedule"] and k["items"] >= 1 for k in cpu), cpu
        assert all(k["how"] for k in lines if "sx_" in k["kernel"]), [k for k in lines if not k["how"]]
    text = subprocess.run([sys.executable, "-m", "sexpgpu", "explain", "examples/quickstart.lisp", "--cpu"], cwd=REPO,
                          env=environment(SEXPGPU_CACHE=str(tmp_path / "cache")), capture_output=True, text=True, timeout=600).stdout
    assert "CPU kernels: train" in text and "32 lane partials over blocks of 256 elements" in text, text


def test_both_dialects_render_attention_from_the_same_per_query_steps(monkeypatch: Any) -> None:
    """The tiled attention kernels' per-query work (the online softmax, the log-sum-exp, dq,
    dk and dv) is written once: the CUDA kernels hold each step as a lane renders it, the host
    functions the same step for query t of a tile, in every pass, causal or not, narrow heads
    and heads wide enough that the device splits dk from dv."""
    sys.path.insert(0, str(REPO / "tests"))
    from test_cuda_attention import attention_program

    from sexpgpu.ir.dtypes import DType
    from sexpgpu.runtime.cpu.hostc import host_kernels, tile_own
    from sexpgpu.runtime.lower import attention, attention_gemm
    from sexpgpu.runtime.lower.attention import AttentionStep, backward_geometry, dkv_step, dq_step, geometry, key_scores, lane_own, lse_step, softmax_step
    from sexpgpu.runtime.lower.codegen import literal
    from sexpgpu.runtime.lower.fusion import lower
    from sexpgpu.runtime.lower.kernels import kernels_for

    monkeypatch.setattr(attention_gemm, "SCORES_BYTES", 0)
    monkeypatch.setattr(attention, "TILE", 16)
    seen: set[str] = set()
    for causal in (True, False):
        for width in (8, 64):
            lowered = lower(attention_program(37, DType.f32, causal, True, width))
            for step in (s for s in lowered.steps if s.kind == "attention"):
                assert isinstance(step, AttentionStep)
                node = step.node
                cuda = kernels_for(step, lowered.program, lowered.constants)
                host = [k.source for k in host_kernels(step, lowered.program, lowered.constants, cuda, "numpy")]
                if node.op == "attention":
                    g = geometry(node, lowered.program.types(), 16)
                    scale = literal(g.scale, DType.f32)
                    forward = [softmax_step(g, own, scale, "") for own in (lane_own, tile_own)]
                    passes = [(cuda[0].source, host[0], *forward)]
                else:
                    g = backward_geometry(node, lowered.program.types(), 16)
                    scale = literal(g.scale, DType.f32)
                    # a device that splits dk from dv shares P's lines; the host computes both together
                    lane_dkv = (key_scores if attention.splits(g) else dkv_step)(g, lane_own, scale, "")
                    passes = [(cuda[0].source, host[0], [lse_step(g, lane_own, scale), *dq_step(g, lane_own, scale, "")],
                               [lse_step(g, tile_own, scale), *dq_step(g, tile_own, scale, "")]),
                              (cuda[1].source, host[1], lane_dkv, dkv_step(g, tile_own, scale, ""))]
                for device, on_host, lane_lines, tile_lines in passes:
                    assert all(line.strip() in device for line in lane_lines), (lane_lines, device)
                    assert all(line.strip() in on_host for line in tile_lines), (tile_lines, on_host)
                seen.add(node.op + ("/split" if node.op == "attention_grad" and attention.splits(g) else ""))
    assert seen == {"attention", "attention_grad", "attention_grad/split"}, seen
