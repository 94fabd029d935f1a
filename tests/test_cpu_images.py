"""The host schedule of the image steps (runtime/cpu/images.py): im2col, col2im, the
gradient's row move and the max-pools as loops over rows; convolutions a chunk of images at
a time. Both change no bit: the compiled CPU equals the emulated CUDA device (one launch of
each kernel over the whole batch) on every convolution and pool case of the op tables."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest

from sexpgpu.ir.ops_conv import conv_geometry
from sexpgpu.runtime.cpu.hostc import host_kernels
from sexpgpu.runtime.cpu.images import COL2IM_PLANES, COL2IM_RUNS, CONV_ROWS, PLANES, POOL_ROWS, TILED_WINDOWS, WINDOWS_ONCE, host_schedule, prefix
from sexpgpu.runtime.lower.executor import LoweredProgram
from sexpgpu.runtime.lower.fusion import lower
from sexpgpu.ir.dtypes import DType
from sexpgpu.runtime.lower.images import ConvStep, ImageLaunch, PoolStep, chunk_images, conv_launch, pool_geom
from sexpgpu.runtime.lower.kernels import kernels_for
from test_cpu_device import assert_same_bits, emulated
from test_cuda_ops import one_op, pool_edge_cases
from test_ops import GRAD_CASES, Arg, Case, D, F, I, _rng

pytestmark = pytest.mark.skipif(shutil.which("cc") is None or shutil.which("g++") is None, reason="the compiled CPU device needs a C compiler")

CONVOLUTIONS = ("conv2d", "conv2d_input_grad", "conv2d_weight_grad")
POOLS = ("max_pool2d", "max_pool2d_grad")
# windows with gaps between them, padded (the disjoint windows' gradient finds each cell's one window)
GAPS = [
    Case([D(1, 2, 7, 8), F(1, 2, 3, 2)], {"kernel": [2, 3], "stride": [3, 3], "padding": [1, 0]}),
    Case([D(2, 1, 5, 7), F(2, 1, 2, 4)], {"kernel": [2, 2], "stride": [3, 2], "padding": [1, 1]}),
]

# unpadded windows (the host reads each window once; where they tile the input, the gradient
# is one kernel): ties, NaN and all -inf windows, overlapping windows, gaps after the last window
EDGES = pool_edge_cases()[0][1].args[0]
UNPADDED = [
    ("max_pool2d", Case([EDGES], {"kernel": [2, 2], "stride": [2, 2]}), ("f32",)),
    ("max_pool2d_grad", Case([EDGES, F(1, 1, 2, 2)], {"kernel": [2, 2], "stride": [2, 2]}), ("f32",)),
    ("max_pool2d_grad", Case([I(EDGES.draw(np.random.default_rng(0), "f32")[:, :, :, :4], "f32"), F(1, 1, 2, 2)], {"kernel": [2, 2], "stride": [2, 2]}), ("f32",)),  # tiled
    ("max_pool2d_grad", Case([EDGES, F(1, 1, 3, 4)], {"kernel": [2, 2], "stride": [1, 1]}), ("f32",)),
    ("max_pool2d_grad", Case([D(1, 2, 7, 8), F(1, 2, 2, 3)], {"kernel": [2, 2], "stride": [3, 3]}), ("f32", "bf16")),
    ("max_pool2d", Case([D(2, 3, 7, 8)], {"kernel": [3, 2], "stride": [2, 3]}), ("f32", "bf16")),
]

# 'same' convolutions at stride 1 (a plane of columns is one run of its image, copied at once)
SAME = [
    ("conv2d", Case([F(2, 3, 6, 5), F(4, 3, 3, 3)], {"stride": 1, "padding": 1, "dilation": 1, "groups": 1})),
    ("conv2d", Case([F(1, 2, 7, 6), F(3, 2, 5, 3)], {"stride": 1, "padding": [2, 1], "dilation": 1, "groups": 1})),
    ("conv2d_weight_grad", Case([F(2, 3, 6, 5), F(2, 4, 6, 5)], {"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "weight_shape": [4, 3, 3, 3]})),
    # the input gradient at stride 1 (a plane of sums per item): 'same', dilated, wider than the input
    ("conv2d_input_grad", Case([F(2, 4, 6, 5), F(4, 3, 3, 3)], {"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "input_shape": [2, 3, 6, 5]})),
    ("conv2d_input_grad", Case([F(1, 3, 7, 6), F(3, 2, 3, 3)], {"stride": 1, "padding": [2, 1], "dilation": [2, 1], "groups": 1, "input_shape": [1, 2, 7, 6]})),
    ("conv2d_input_grad", Case([F(1, 4, 7, 6), F(4, 2, 3, 3)], {"stride": 1, "padding": 2, "dilation": 1, "groups": 2, "input_shape": [1, 4, 5, 4]})),
]


@pytest.fixture(scope="module")
def runtimes() -> dict[str, Any]:
    """The C library's math (what the emulated CUDA kernels compute), with the default cache
    and with one so small that every convolution runs an image at a time."""
    from sexpgpu.runtime.cpu.device import CpuRuntime
    from sexpgpu.runtime.cpu.toolchain import open_toolchain

    toolchain = open_toolchain()
    return {"libm": CpuRuntime(toolchain, math="libm"), "chunked": CpuRuntime(toolchain, math="libm", cache_bytes=1)}


def image_cases() -> list[tuple[str, Any, dict[str, np.ndarray]]]:
    out = []
    for op in (*CONVOLUTIONS, *POOLS):
        own = GRAD_CASES[op] + (GAPS if op == "max_pool2d_grad" else [Case(case.args[:1], case.attrs) for case in GAPS] if op == "max_pool2d" else [])
        own += WIDE_WEIGHTS if op == "conv2d_weight_grad" else []  # the weight gradient's other schedule
        cases = [(case, dtype) for case in own for dtype in ("f32", "bf16")] + [(c, d) for o, c, d in pool_edge_cases() if o == op]
        cases += [(c, d) for o, c, dtypes in UNPADDED if o == op for d in dtypes] + [(c, d) for o, c in SAME if o == op for d in ("f32", "bf16")]
        for index, (case, dtype) in enumerate(cases):
            program = one_op(op, case, dtype)
            rng = _rng(op, index, dtype, "cpu-images")
            out.append((f"{op} {case.label()} {dtype}", program, {f"x{i}": arg.draw(rng, dtype) for i, arg in enumerate(case.args)}))
    return out


def test_the_image_kernels_are_row_loops_on_the_host() -> None:
    """Each im2col, col2im, row move and max-pool kernel is a host function over rows (the
    innermost axis of what it writes inside each item), not over its CUDA threads' elements."""
    seen = set()
    for what, program, _ in image_cases():
        lowering = lower(program)
        (step,) = lowering.steps
        kernels = kernels_for(step, lowering.program, lowering.constants)
        for cuda, host in zip(kernels, host_kernels(step, lowering.program, lowering.constants, kernels, "libm")):
            if prefix(cuda) not in {**CONV_ROWS, **POOL_ROWS}:
                continue
            seen.add(prefix(cuda))
            assert host.name == cuda.name and not host.launched_items, what
            assert host.size < cuda.size and cuda.size % host.size == 0, f"{what}: {cuda.name} has {host.size} items for {cuda.size} elements"
    assert seen == set(CONV_ROWS) | set(POOL_ROWS), seen


def test_im2col_is_a_loop_over_planes_and_unpadded_max_pools_read_each_window_once() -> None:
    """The im2col's item is a plane of columns (one kernel offset of one image); a max-pool
    without padding reads each window once (forward and index), and its gradient, where the
    windows tile the input, is a row of windows, each read once and writing its cells."""
    schedules: dict[str, set[str]] = {}
    for what, program, _ in image_cases():
        lowering = lower(program)
        (step,) = lowering.steps
        kernels = kernels_for(step, lowering.program, lowering.constants)
        unpadded = not isinstance(step, ConvStep) and pool_geom(step.node, lowering.program.types()).padding == (0, 0)
        for cuda, host in zip(kernels, host_kernels(step, lowering.program, lowering.constants, kernels, "libm")):
            schedules.setdefault(f"{prefix(cuda)} {'unpadded' if unpadded else 'padded'}", set()).add(host.schedule)
            if prefix(cuda) == "sx_im2col":
                d = step.shape(lowering.program.types())
                assert host.size * d.oh * d.ow == cuda.size, what
    assert schedules["sx_im2col padded"] == {PLANES}
    assert {COL2IM_RUNS, COL2IM_PLANES} <= schedules["sx_col2im padded"] and len(schedules["sx_col2im padded"]) == 3  # rows as wide as the image's, other stride 1, rows
    assert schedules["sx_max_pool unpadded"] == schedules["sx_max_pool_index unpadded"] == {WINDOWS_ONCE}
    assert WINDOWS_ONCE not in schedules["sx_max_pool padded"] | schedules["sx_max_pool_index padded"]
    assert schedules["sx_max_pool_tiled_grad unpadded"] == {TILED_WINDOWS} and "sx_max_pool_tiled_grad padded" not in schedules


def test_a_max_pool_gradient_whose_windows_tile_the_input_is_one_kernel() -> None:
    """Windows that tile the input (no padding, strides equal to the kernel, sides that
    divide): one kernel, each window writing its cells, no index in scratch; other windows
    the index and the gather."""
    for op, case, _ in UNPADDED:
        if op != "max_pool2d_grad":
            continue
        lowering = lower(one_op(op, case, "f32"))
        (step,) = lowering.steps
        names = [prefix(k) for k in kernels_for(step, lowering.program, lowering.constants)]
        tiled = case.args[0].shape[-2:] == (4, 4) and case.attrs["stride"] == [2, 2]
        assert names == (["sx_max_pool_tiled_grad"] if tiled else ["sx_max_pool_index", "sx_max_pool_grad"]), (case.label(), names)
        assert (step.scratch_bytes(lowering.program.types()) == 0) == tiled


def test_the_weight_gradient_is_each_images_product_of_its_transpose_then_their_sum() -> None:
    """conv2d_weight_grad's gemms compute each image's dW^T (K x Og per group: cuBLAS's m =
    Og, n = K, one image deep, batched over the images, in f32), which a kernel adds in image
    order and transposes into dW; on the host the images go a chunk at a time, the products
    shared by the chunks and the columns each chunk's own."""
    for case in GRAD_CASES["conv2d_weight_grad"]:
        lowering = lower(one_op("conv2d_weight_grad", case, "f32"))
        (step,) = lowering.steps
        assert isinstance(step, ConvStep)
        geom = step.geometry(lowering.program.types())
        calls = step.calls(lowering.program.types())
        assert len(calls) == geom.groups, case.label()
        for call in calls:
            assert (call.m, call.n, call.k, call.batch, call.out_dtype) == (geom.og, geom.k, geom.size[0] * geom.size[1], geom.n, DType.f32), case.label()
        names = [prefix(k) for k in kernels_for(step, lowering.program, lowering.constants)]
        assert names == ["sx_im2col", "sx_conv_weight_sum"], names
        (columns, columns_count), (products, products_count) = step.scratch_parts(lowering.program.types())
        assert products == DType.f32 and products_count == geom.n * geom.groups * geom.k * geom.og, case.label()
        assert step.private_bytes() >= columns_count * 4 and step.private_bytes() < step.scratch_bytes(lowering.program.types()), case.label()


# weight gradients with more output channels per group than output cells: each image's
# product would take more memory than the batch's columns
WIDE_WEIGHTS = [
    Case([F(3, 3, 2, 2), F(3, 8, 2, 2)], {"stride": 1, "padding": 0, "dilation": 1, "groups": 1, "weight_shape": [8, 3, 1, 1]}),
    Case([F(2, 4, 3, 2), F(2, 12, 2, 1)], {"stride": 1, "padding": 0, "dilation": 1, "groups": 2, "weight_shape": [12, 2, 2, 2]}),
]


def test_a_weight_gradient_whose_products_outgrow_the_columns_is_one_product_over_the_batch(runtimes: dict[str, Any]) -> None:
    """Where each image's product (f32) would take more memory than the batch's columns
    (more output channels per group than output cells), the weight gradient is one gemm over
    the batch on the gradient's rows moved together, then a transpose; its bits are still the
    emulated device's, with the default cache and with one so small it would chunk."""
    from sexpgpu.runtime.cpu.device import CpuBackend

    device = emulated(runtimes)
    for case in WIDE_WEIGHTS:
        for dtype in ("f32", "bf16"):
            program = one_op("conv2d_weight_grad", case, dtype)
            lowering = lower(program)
            (step,) = lowering.steps
            assert isinstance(step, ConvStep) and not step.per_image, case.label()
            names = [prefix(k) for k in kernels_for(step, lowering.program, lowering.constants)]
            assert names == ["sx_im2col", "sx_conv_grad_rows", "sx_conv_grad_transpose"], names
            (call,) = step.calls(lowering.program.types())
            geom = step.geometry(lowering.program.types())
            assert (call.m, call.n, call.k, call.batch) == (geom.og, geom.k, geom.n * geom.size[0] * geom.size[1], geom.groups), case.label()
            feeds = {f"x{i}": arg.draw(_rng("wide weights", i, dtype), dtype) for i, arg in enumerate(case.args)}
            want = LoweredProgram(program, device).run(feeds)["y"]
            y_type = program.types()[program.outputs["y"]]
            for name in ("libm", "chunked"):
                backend = CpuBackend(runtimes[name])
                mine = backend.program(program)
                assert [s.chunk for s in mine.lowering.steps if isinstance(s, ConvStep)] == [0], case.label()
                got = mine.run(feeds)["y"]
                assert_same_bits(backend.get(got, y_type), backend.get(want, y_type), f"{case.label()} {dtype} ({name})")


def test_a_chunk_is_the_largest_divisor_of_the_batch_whose_columns_fit() -> None:
    def geom(n: int, c: int, hw: int) -> ImageLaunch:
        return conv_launch(conv_geometry("conv2d", (n, c, hw, hw), (8, c, 3, 3), {"padding": 1}, ""), DType.f32, DType.f32, DType.f32)

    assert chunk_images(geom(64, 32, 28), 4, 1 << 20) == 1  # the CNN: 0.9 MB of columns per image
    assert chunk_images(geom(64, 1, 28), 4, 1 << 20) == 32  # 28 KB per image: 37 fit, 32 divides 64
    assert chunk_images(geom(6, 1, 28), 4, 4 * 28 * 1024) == 3
    assert chunk_images(geom(5, 32, 28), 4, 1) == 1
    assert chunk_images(geom(5, 1, 8), 4, 1 << 20) == 5


def test_chunked_convolutions_and_row_loops_equal_the_emulated_device_bit_for_bit(runtimes: dict[str, Any]) -> None:
    """Every convolution and max-pool case, f32 and bf16: the compiled CPU (row loops, and with
    a cache of one byte, a launch per image) against the emulated CUDA kernels, bit for bit."""
    from sexpgpu.runtime.cpu.device import CpuBackend

    device = emulated(runtimes)
    cases = image_cases()
    chunked = 0
    for name in ("libm", "chunked"):
        runtime = runtimes[name]
        runtime.preload([p for _, p, _ in cases])
        backend = CpuBackend(runtime)
        for what, program, feeds in cases:
            mine = backend.program(program)
            steps = [s for s in mine.lowering.steps if isinstance(s, ConvStep)]
            types = mine.lowering.program.types()
            if name == "chunked" and steps and types[steps[0].node.args[0]].shape[0] > 1 and (steps[0].node.op != "conv2d_weight_grad" or steps[0].per_image):
                assert steps[0].chunk == 1, what
                chunked += 1
            got, want = mine.run(feeds)["y"], LoweredProgram(program, device).run(feeds)["y"]
            assert_same_bits(backend.get(got, program.types()[program.outputs["y"]]), backend.get(want, program.types()[program.outputs["y"]]), f"{what} ({name})")
    assert chunked >= 4, chunked


def special_gradient(*shape: int) -> Arg:
    """A random gradient (in the dtype under test) with zeros of both signs at the rows' ends,
    an infinity of each sign and a NaN inside."""
    def make(rng: np.random.Generator) -> np.ndarray:
        g = rng.standard_normal(shape)
        g[..., 0], g[..., -1] = -0.0, 0.0
        g.flat[3], g.flat[g.size // 2], g.flat[g.size - 4] = np.inf, -np.inf, np.nan  # a few, so most sums stay finite
        return g

    return Arg(shape, make)


# the input gradient at stride 1 whose columns' rows are as wide as the image's ('same' widths, or kernels no wider than 1)
RUNS = [
    Case([special_gradient(2, 4, 6, 5), F(4, 3, 3, 3)], {"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "input_shape": [2, 3, 6, 5]}),
    Case([special_gradient(1, 3, 7, 6), F(3, 2, 5, 3)], {"stride": 1, "padding": [2, 1], "dilation": 1, "groups": 1, "input_shape": [1, 2, 7, 6]}),
    Case([special_gradient(1, 4, 5, 6), F(4, 2, 3, 5)], {"stride": 1, "padding": [2, 4], "dilation": [2, 2], "groups": 2, "input_shape": [1, 4, 5, 6]}),
    Case([special_gradient(2, 4, 4, 3), F(4, 3, 3, 1)], {"stride": 1, "padding": [0, 0], "dilation": 1, "groups": 1, "input_shape": [2, 3, 6, 3]}),
]


def test_a_col2im_whose_rows_are_as_wide_as_the_images_adds_each_offset_over_the_plane_as_one_run(runtimes: dict[str, Any]) -> None:
    """At stride 1 with the columns' rows as wide as the image's (issue 25's CNN), each kernel
    offset's columns are one run over the plane, the cells they miss given +0 by a mask; the
    bits are the emulated device's threads', also with zeros of both signs, infinities and NaN
    in the gradient (f32 and bf16)."""
    from sexpgpu.runtime.cpu.device import CpuBackend

    device = emulated(runtimes)
    backend = CpuBackend(runtimes["libm"])
    for case in RUNS:
        for dtype in ("f32", "bf16"):
            program = one_op("conv2d_input_grad", case, dtype)
            what = f"{case.label()} {dtype}"
            lowering = lower(program)
            (step,) = lowering.steps
            kernels = kernels_for(step, lowering.program, lowering.constants)
            schedules = {prefix(k): h.schedule for k, h in zip(kernels, host_kernels(step, lowering.program, lowering.constants, kernels, "libm"))}
            assert schedules["sx_col2im"] == COL2IM_RUNS, what
            feeds = {f"x{i}": arg.draw(_rng("col2im runs", i), dtype) for i, arg in enumerate(case.args)}
            got, want = backend.program(program).run(feeds)["y"], LoweredProgram(program, device).run(feeds)["y"]
            y_type = program.types()[program.outputs["y"]]
            assert_same_bits(backend.get(got, y_type), backend.get(want, y_type), what)


def test_each_image_step_builds_its_launch_once_and_both_dialects_read_it() -> None:
    """A convolution's or pool's launch (every extent by name, an ImageLaunch) is
    built once per step, again only when the host's schedule changes its chunk; the CUDA
    kernels and the host's loops are written from that one object (their items agree)."""
    for what, program, _ in image_cases():
        lowering = lower(program)
        host_schedule(lowering, 1)  # an image at a time where a convolution can chunk
        (step,) = lowering.steps
        assert isinstance(step, (ConvStep, PoolStep)), what
        types = lowering.program.types()
        d = step.shape(types)
        assert step.shape(types) is d, what
        if isinstance(step, ConvStep):
            assert d.n == (step.chunk or step.geometry(types).n), what
        kernels = kernels_for(step, lowering.program, lowering.constants)
        assert step.shape(types) is d, what
        for cuda, host in zip(kernels, host_kernels(step, lowering.program, lowering.constants, kernels, "libm")):
            if prefix(cuda) in ("sx_im2col", "sx_col2im"):
                per_item = d.oh * d.ow if prefix(cuda) == "sx_im2col" else d.h * d.w if host.schedule in (COL2IM_PLANES, COL2IM_RUNS) else d.w
                assert host.size * per_item == cuda.size, what
        assert step.shape(types) is d, what


def test_the_default_schedule_leaves_small_batches_whole() -> None:
    """A batch whose columns fit in the cache is one launch (the CUDA device's schedule)."""
    case = GRAD_CASES["conv2d"][1]
    lowering = lower(one_op("conv2d", case, "f32"))
    host_schedule(lowering)
    (step,) = lowering.steps
    assert isinstance(step, ConvStep) and step.chunk == 0


# batches large enough that a chunk per image is worth sharing between threads (bf16: the gemms widen into each thread's workspace)
SHARED = [
    ("conv2d", Case([F(64, 8, 16, 16), F(16, 8, 3, 3)], {"stride": 1, "padding": 1, "dilation": 1, "groups": 1})),
    ("conv2d", Case([F(12, 4, 11, 9), F(6, 2, 3, 2)], {"stride": [2, 1], "padding": [1, 0], "dilation": 1, "groups": 2})),
    ("conv2d_input_grad", Case([F(16, 8, 12, 12), F(8, 3, 3, 3)], {"stride": 1, "padding": 1, "dilation": 1, "groups": 1, "input_shape": [16, 3, 12, 12]})),
    ("conv2d_input_grad", Case([F(12, 6, 6, 8), F(6, 2, 3, 2)], {"stride": [2, 1], "padding": [1, 0], "dilation": 1, "groups": 2, "input_shape": [12, 4, 11, 9]})),
]


def test_chunks_of_images_are_one_repeat_whose_items_the_threads_share_with_the_bits_of_one_thread(runtimes: dict[str, Any]) -> None:
    """A chunked convolution's chunks are one repeat op on the tape (each chunk's im2col and
    gemms, or gemms and col2im, on one thread, in its own copy of the step's scratch). With
    2 and 3 threads sharing the chunks (the BLAS held to one thread, the pool's pieces forced
    on), f32 and bf16, the bits are one thread's and the emulated device's."""
    from threadpoolctl import threadpool_limits

    from sexpgpu.runtime.cpu.device import CpuBackend, Tape

    device = emulated(runtimes)
    runtime = runtimes["chunked"]
    backend = CpuBackend(runtime)
    cases = [(f"{op} {case.label()} {dtype}", one_op(op, case, dtype), case, dtype) for op, case in SHARED for dtype in ("f32", "bf16")]
    runtime.preload([p for _, p, _, _ in cases])
    with threadpool_limits(limits=1, user_api="blas"):
        for index, (what, program, case, dtype) in enumerate(cases):
            rng = _rng("shared", index, dtype, "cpu-images")
            feeds = {f"x{i}": arg.draw(rng, dtype) for i, arg in enumerate(case.args)}
            mine = backend.program(program)
            ops = [op for part in mine.later_tape if isinstance(part, Tape) for op in part.ops]
            repeats = [op for op in ops if op.kind == 2]
            assert len(repeats) == 1 and repeats[0].size == case.args[0].shape[0], (what, [(op.kind, op.size) for op in ops])
            out_type = program.types()[program.outputs["y"]]
            want = backend.get(LoweredProgram(program, device).run(feeds)["y"], out_type)
            try:
                for threads in (1, 2, 3):
                    runtime.set_threads(threads)
                    runtime.library.sx_pool_split_gemms(runtime.pool, int(threads > 1))
                    for _ in range(2):
                        assert_same_bits(backend.get(mine.run(feeds)["y"], out_type), want, f"{what} on {threads} threads")
            finally:
                runtime.set_threads(1)
