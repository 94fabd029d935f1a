"""Fused attention on the emulated device against the unfused NumPy path, in both schedules:
the tiled kernels (runtime/lower/attention.py: the forward kernel and the two backward
kernels) and the batched gemms with their softmax row kernels (attention_gemm.py), reached
through autodiff of `attention`, give what matmul, scale, mask, softmax and matmul (and their
gradients, by autodiff too) give on the NumPy backend, in f32 and bf16, causal or not, with
several tiles per sequence and lengths that are not multiples of the tile. The tiled plan
holds no S x S buffer; the gemm schedule's scratch is its scores and nothing more."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

from cuda_host import HostRunner
from sexpgpu.compile.autodiff import backward
from sexpgpu.ir.builder import Builder
from sexpgpu.ir.dtypes import DType, numpy_dtype
from sexpgpu.ir.graph import Program, TensorType
from sexpgpu.runtime.lower import attention, attention_gemm
from sexpgpu.runtime.lower.executor import ArrayDevice, LoweredProgram
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.runtime.lower.plan import plan_arena
from sexpgpu.runtime.numpy_backend import CompiledProgram

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="the host emulation needs g++")

BATCH, HEADS, WIDTH = 2, 3, 8


def attention_program(length: int, dtype: DType, causal: bool, fused: bool, width: int = WIDTH) -> Program:
    """o = attention(q, k, v) fused or as the unfused ops; loss = sum(f32(o) * c); outputs o,
    loss and the gradients of q, k and v."""
    b = Builder("attention")
    t = TensorType(dtype=dtype, shape=(BATCH, length, HEADS, width))
    q, k, v = (b.input(name, "data", t) for name in "qkv")
    c = b.input("c", "data", TensorType(dtype=DType.f32, shape=t.shape))
    scale = width**-0.5
    if fused:
        o = b.op("attention", q, k, v, causal=causal, scale=scale)
    else:  # heads first, as nn:causal-attention does with dropout
        qh, kh, vh = (b.op("transpose", x, perm=[0, 2, 1, 3]) for x in (q, k, v))
        scores = b.op("mul", b.op("matmul", qh, b.op("transpose", kh, perm=[0, 1, 3, 2])), b.const(scale, dtype))
        if causal:
            scores = b.op("where", b.op("tril_mask", shape=[length, length], dtype="bool"), scores, b.const(-1e9, dtype))
        o = b.op("transpose", b.op("matmul", b.op("softmax", scores, axis=-1), vh), perm=[0, 2, 1, 3])
    wide = b.op("cast", o, dtype="f32") if dtype != DType.f32 else o
    loss = b.op("sum", b.op("mul", wide, c), axis=None, keepdims=False)
    grads = backward(b, loss, [q, k, v])
    return b.program({"o": o, "loss": loss, **{f"d{name}": grads[vid] for name, vid in zip("qkv", (q, k, v))}})  # type: ignore[misc]


def feeds(length: int, dtype: DType, seed: int, width: int = WIDTH) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shape = (BATCH, length, HEADS, width)
    out = {name: (rng.standard_normal(shape) * 1.5).astype(numpy_dtype(dtype)) for name in "qkv"}
    out["c"] = rng.standard_normal(shape).astype(np.float32)
    return out


def compare(got: dict[str, Any], want: dict[str, Any], rtol: float, what: str) -> None:
    for key in ("o", "dq", "dk", "dv"):
        g, w = np.asarray(got[key], dtype=np.float64), np.asarray(want[key], dtype=np.float64)
        scale = float(np.max(np.abs(w)))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * scale, err_msg=f"{what}: {key}")


def tiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiled kernels' schedule for every attention (no scores fit the gemms' scratch)."""
    monkeypatch.setattr(attention_gemm, "SCORES_BYTES", 0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length,tile", [(16, 16), (37, 16), (70, 16), (37, 64), (5, 64)])
def test_fused_attention_in_f32_equals_the_unfused_numpy_path(length: int, tile: int, causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    tiled(monkeypatch)
    monkeypatch.setattr(attention, "TILE", tile)
    data = feeds(length, DType.f32, length + tile)
    fused = attention_program(length, DType.f32, causal, fused=True)
    want = CompiledProgram(attention_program(length, DType.f32, causal, fused=False)).run_copy(data)
    lowered = LoweredProgram(fused, ArrayDevice(np, HostRunner()))
    kernels = [k for ks in lowered.kernels for k in ks]
    assert {k.threads for k in kernels if k.name.startswith("sx_attention")} == {tile}
    assert sum(k.name.startswith("sx_attention") for k in kernels) == 3  # forward, then dq and dk/dv
    for run in range(2):
        compare(lowered.run(data), want, 2e-5, f"f32 length {length} tile {tile} run {run}")
    # the NumPy kernels of the op itself: the same math as the unfused ops
    compare(CompiledProgram(fused).run_copy(data), want, 2e-5, "the op's NumPy kernels")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length", [2, 5, 37, 70])
def test_attention_as_batched_gemms_equals_the_unfused_numpy_path(length: int, causal: bool) -> None:
    """f32 attention whose scores fit the scratch: the scores, o, dv, dP, dq and dk by batched
    gemms, the softmax and its gradient by row kernels; no tiled kernel is left."""
    data = feeds(length, DType.f32, length + 1)
    fused = attention_program(length, DType.f32, causal, fused=True)
    want = CompiledProgram(attention_program(length, DType.f32, causal, fused=False)).run_copy(data)
    lowered = LoweredProgram(fused, ArrayDevice(np, HostRunner()))
    names = sorted(k.name.rsplit("_", 1)[0] for ks in lowered.kernels for k in ks if k.name.startswith("sx_attention"))
    assert names == ["sx_attention_softmax", "sx_attention_softmax", "sx_attention_softmax_grad"], names
    steps = [s for s in lowered.lowering.steps if s.kind == "attention"]
    assert [type(s) for s in steps] == [attention_gemm.AttentionGemms, attention_gemm.AttentionGradGemms]
    for run in range(2):
        compare(lowered.run(data), want, 2e-5, f"gemms, length {length} run {run}")


def test_the_gemm_calls_batch_the_larger_of_the_batch_and_head_axes() -> None:
    """A head's rows have one stride along the batch axis and another along the heads: one
    strided-batched call per index of the smaller axis, batched over the larger, every head's
    block of the scores written once."""
    for batch, heads, calls, inner in ((12, 4, 4, 12), (2, 12, 2, 12), (1, 3, 1, 3), (5, 1, 1, 5)):
        h = attention_gemm.Heads(batch, heads, 64, 32, True, 0.125)
        scores = attention_gemm.score_calls(h)
        assert (len(scores), {c.batch for c in scores}) == (calls, {inner}), (batch, heads)
        blocks = sorted(c.c.offset + i * c.c.stride for c in scores for i in range(c.batch))
        assert blocks == [j * 64 * 64 for j in range(batch * heads)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("length,tile", [(37, 16), (70, 64)])
def test_fused_attention_in_bf16_is_within_bf16_of_the_f32_result(length: int, tile: int, causal: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """bf16 q, k, v: the kernels compute in f32 and round each result once; within 1e-2 of
    the unfused f32 path (the quality bar for bf16), and as close to it as the unfused bf16
    path is."""
    monkeypatch.setattr(attention, "TILE", tile)
    data = feeds(length, DType.bf16, 3 * length)
    wide = {k: v.astype(np.float32) for k, v in data.items()}
    exact = CompiledProgram(attention_program(length, DType.f32, causal, fused=False)).run_copy(wide)
    got = LoweredProgram(attention_program(length, DType.bf16, causal, fused=True), ArrayDevice(np, HostRunner())).run(data)
    compare(got, exact, 1e-2, f"bf16 length {length} tile {tile}")
    unfused = CompiledProgram(attention_program(length, DType.bf16, causal, fused=False)).run_copy(data)
    for key in ("o", "dq", "dk", "dv"):
        ours = np.abs(np.asarray(got[key], np.float64) - np.asarray(exact[key], np.float64)).max()
        theirs = np.abs(np.asarray(unfused[key], np.float64) - np.asarray(exact[key], np.float64)).max()
        assert ours <= theirs * 1.5 + 1e-6, (key, ours, theirs)


@pytest.mark.parametrize("dtype", [DType.f32, DType.bf16])
def test_wide_heads_accumulate_dk_and_dv_in_separate_blocks_with_the_same_bits(dtype: DType, monkeypatch: pytest.MonkeyPatch) -> None:
    """Heads wider than SPLIT_WIDTH (GPT-2's 64): the key pass gives each key tile a block for
    dv and one for dk, so that a thread holds one row of accumulators (two spill on sm_90);
    the gradients are bit for bit those of one block doing both, and the unfused path's."""
    tiled(monkeypatch)
    monkeypatch.setattr(attention, "TILE", 16)
    length, width = 37, attention.SPLIT_WIDTH + 8
    data = feeds(length, dtype, 11, width)
    program = attention_program(length, dtype, True, fused=True, width=width)
    split = LoweredProgram(program, ArrayDevice(np, HostRunner()))
    (dkv,) = [k for ks in split.kernels for k in ks if k.name.startswith("sx_attention_dkv")]
    assert "dv_part" in dkv.source and dkv.size == 2 * BATCH * HEADS * -(-length // 16)
    got = split.run(data)
    monkeypatch.setattr(attention, "SPLIT_WIDTH", width)
    whole = LoweredProgram(program, ArrayDevice(np, HostRunner()))
    assert not any("dv_part" in k.source for ks in whole.kernels for k in ks)
    one = whole.run(data)
    for key in ("dq", "dk", "dv"):
        assert np.asarray(got[key]).tobytes() == np.asarray(one[key]).tobytes(), key
    if shutil.which("cc") is not None:  # the compiled CPU device's attention: the same sums, over its own items
        from sexpgpu.runtime.cpu.device import CpuBackend, CpuRuntime
        from sexpgpu.runtime.cpu.toolchain import open_toolchain

        monkeypatch.setattr(attention, "SPLIT_WIDTH", width - 1)
        on_cpu = CpuBackend(CpuRuntime(open_toolchain(), math="libm")).program(program).run(data)
        for key in ("dq", "dk", "dv"):
            assert np.asarray(on_cpu[key]).tobytes() == np.asarray(got[key]).tobytes(), f"cpu {key}"
    if dtype == DType.f32:
        compare(got, CompiledProgram(attention_program(length, dtype, True, fused=False, width=width)).run_copy(data), 2e-5, "wide heads")


def test_the_tiled_plan_holds_no_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scores over SCORES_BYTES take the tiled kernels: neither the forward nor the backward
    pass materializes an S x S buffer, and the largest buffer of the fused program is the
    stacked gradients (3 x S x D per head). Scores within it take the gemms, whose largest
    buffer is the backward's scratch, P and dP."""
    length = 96
    heads = BATCH * HEADS
    scores = heads * length * length * 4
    gemms = plan_arena(lower(attention_program(length, DType.f32, True, fused=True)))
    assert max(b.bytes for b in gemms.buffers) == 2 * scores
    monkeypatch.setattr(attention_gemm, "SCORES_BYTES", 2 * scores - 1)
    fused, unfused = (plan_arena(lower(attention_program(length, DType.f32, True, fused=f))) for f in (True, False))
    assert max(b.bytes for b in unfused.buffers) >= scores
    assert max(b.bytes for b in fused.buffers) == 3 * heads * length * WIDTH * 4


def test_a_bias_added_to_the_projections_is_computed_as_the_kernels_load_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """q, k, v = reshape(x W + b), as nn:causal-attention makes them: the tiled attention kernels
    compute the bias addition as they load (no kernel writes q, k or v), and give the NumPy
    backend's values, forward and backward."""
    tiled(monkeypatch)
    monkeypatch.setattr(attention, "TILE", 16)
    length, width = 37, HEADS * WIDTH
    for dtype in (DType.f32, DType.bf16):
        b = Builder("projected")
        h = {name: b.input(f"h{name}", "data", TensorType(dtype=dtype, shape=(BATCH, length, width))) for name in "qkv"}
        bias = {name: b.input(f"b{name}", "data", TensorType(dtype=dtype, shape=(width,))) for name in "qkv"}
        q, k, v = (b.op("reshape", b.op("add", h[n], bias[n]), shape=[BATCH, length, HEADS, WIDTH]) for n in "qkv")
        o = b.op("attention", q, k, v, causal=True, scale=WIDTH**-0.5)
        c = b.input("c", "data", TensorType(dtype=DType.f32, shape=(BATCH, length, HEADS, WIDTH)))
        loss = b.op("sum", b.op("mul", b.op("cast", o, dtype="f32") if dtype != DType.f32 else o, c), axis=None, keepdims=False)
        grads = backward(b, loss, list(h.values()) + list(bias.values()))
        program = b.program({"o": o, **{f"d{name}": grads[vid] for name, vid in {**{f"h{n}": h[n] for n in "qkv"}, **{f"b{n}": bias[n] for n in "qkv"}}.items()}})
        steps = lower(program).steps
        assert not [s for s in steps if s.kind == "fused" and any(n.op == "add" and n.args[0] in h.values() for n in s.nodes)], "a kernel still writes q, k or v"
        assert all(getattr(s, "prologues", None) for s in steps if s.kind == "attention")
        rng = np.random.default_rng(5)
        feeds = {f"h{n}": rng.standard_normal((BATCH, length, width)).astype(numpy_dtype(dtype)) for n in "qkv"}
        feeds |= {f"b{n}": rng.standard_normal(width).astype(numpy_dtype(dtype)) for n in "qkv"}
        feeds["c"] = rng.standard_normal((BATCH, length, HEADS, WIDTH)).astype(np.float32)
        want = CompiledProgram(program).run_copy(feeds)
        got = LoweredProgram(program, ArrayDevice(np, HostRunner())).run(feeds)
        tol = 2e-5 if dtype == DType.f32 else 2.0**-6
        # the key bias's gradient is zero up to rounding (softmax does not see a constant
        # added to every score of a row): compared at the scale of the other gradients
        scale = max(float(np.max(np.abs(np.asarray(w, np.float64)))) for w in want.values())
        for key, w in want.items():
            np.testing.assert_allclose(np.asarray(got[key], np.float64), np.asarray(w, np.float64), rtol=tol, atol=tol * scale, err_msg=f"{dtype.value} {key}")
