"""Convolutions and pools on the device (NCHW), with the CPU backend's numbers.

conv2d is im2col + cuBLAS, as the CPU computes it: a generated kernel writes the windows
of the (zero-padded) input as the matrix cols [C, KH, KW, N, OH, OW] (= [G, K, N*OH*OW]) in
the step's scratch, then one strided-batched gemm per group multiplies the group's weights
[Og, K] by each image's columns, straight into the output [N, O, OH, OW] (the weights' batch
stride is 0, the columns' and the output's are one image's). conv2d_input_grad is the
transpose: gemms W_g^T @ g into f32 columns, then a generated col2im kernel in which each
input cell adds the columns that read it in kernel-offset order (the CPU's order of
additions: no atomics). conv2d_weight_grad: im2col of x and a kernel that moves g to
[O, N, OH*OW], then one gemm batched over the groups, cols @ g_rows^T (dW transposed, the
orientation OpenBLAS computes faster), and a kernel that transposes it into dW. bf16
operands are multiplied in f32 and rounded once, as the CPU does.

The pools are generated kernels, a thread per output element: max (NaN-propagating), the
max's gradient and select through each window's first maximum in window order (an index
kernel, then a kernel in which each input cell gathers the windows that chose it; where the
windows tile the input, one kernel in which each window writes its own cells), and the
average and its gradient with the CPU's order of additions and its f32 reciprocal.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Optional

import numpy as np

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, TensorType, shape_size
from ...ir.ops_conv import ConvGeom, PoolGeom, conv_geometry, pool_geometry
from .blas import BlasCall, Rows, row_major
from .codegen import BYTES, STORAGE, KernelSource, Param, assemble, c_types, declare, from_storage, literal, to_storage
from .lowering import KernelLine, Lowered, LoweringContext, Placement, StepRun, register_lowering
from .steps import NodeStep, launch_group

ALIGN = 256


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def conv_geom(node: Node, types: dict[int, TensorType]) -> ConvGeom:
    a, b = (tuple(types[v].shape) for v in node.args)
    if node.op == "conv2d":
        return conv_geometry(node.op, a, b, node.attrs, "")
    if node.op == "conv2d_input_grad":
        return conv_geometry(node.op, tuple(node.attrs["input_shape"]), b, node.attrs, "")
    return conv_geometry(node.op, a, tuple(node.attrs["weight_shape"]), node.attrs, "")


@dataclass(frozen=True)
class ImageLaunch:
    """One launch of a convolution or pool step as the kernels of both dialects read it (the
    CUDA kernels here, the host's loops in runtime/cpu/images.py): every extent by name,
    built once per step (`ConvStep.shape`, again when the host's schedule sets its chunk;
    `PoolStep.shape`)."""

    n: int  # images in the launch
    c: int
    h: int  # the input's height and width
    w: int
    oh: int  # the output's
    ow: int
    kh: int  # the kernel's (the window's)
    kw: int
    sh: int  # strides, padding
    sw: int
    ph: int
    pw: int
    first: DType  # the dtype of the op's first operand (x; g for the input gradient and the average's)
    out: DType
    second: Optional[DType] = None  # of its second, where it has one
    o: int = 0  # a convolution's output channels, groups and dilation
    groups: int = 1
    dh: int = 1
    dw: int = 1

    @property
    def og(self) -> int:
        return self.o // self.groups

    @property
    def k(self) -> int:  # the contraction per group: Cg * KH * KW
        return self.c // self.groups * self.kh * self.kw

    @property
    def cells(self) -> int:  # N * OH * OW
        return self.n * self.oh * self.ow

    @property
    def columns(self) -> int:
        """Elements of the im2col matrix [C, KH, KW, N, OH, OW]."""
        return self.c * self.kh * self.kw * self.cells

    @property
    def padded(self) -> bool:
        return (self.ph, self.pw) != (0, 0)

    @property
    def windows(self) -> int:  # a pool's outputs: N * C * OH * OW
        return self.n * self.c * self.oh * self.ow


def conv_launch(geom: ConvGeom, first: DType, second: DType, out: DType) -> ImageLaunch:
    """A launch of GEOM's images (a chunk's, or the batch), its operands FIRST and SECOND."""
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = geom.kernel, geom.stride, geom.padding, geom.dilation
    return ImageLaunch(n=geom.n, c=geom.c, h=geom.hw[0], w=geom.hw[1], oh=geom.size[0], ow=geom.size[1], kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw,
                       first=first, out=out, second=second, o=geom.o, groups=geom.groups, dh=dh, dw=dw)


def node_dtypes(node: Node, types: dict[int, TensorType]) -> tuple[DType, DType, DType]:
    """The dtypes of a convolution NODE's operands and result."""
    return types[node.args[0]].dtype, types[node.args[1]].dtype, node.type.dtype


def im2col_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """cols[c, i, j, n, p, q] = x[n, c, p*sh + i*dh - ph, q*sw + j*dw - pw], 0 in the padding."""
    x = node.args[0]
    x_t = program.types()[x]
    store, _ = c_types(x_t.dtype)
    body = [
        f"    const long long q = e % {d.ow}LL, p = (e / {d.ow}LL) % {d.oh}LL, n = (e / {d.oh * d.ow}LL) % {d.n}LL;",
        f"    const long long j = (e / {d.cells}LL) % {d.kw}LL, i = (e / {d.kw * d.cells}LL) % {d.kh}LL, c = e / {d.kh * d.kw * d.cells}LL;",
        f"    const long long y = p * {d.sh}LL + i * {d.dh}LL - {d.ph}LL, x = q * {d.sw}LL + j * {d.dw}LL - {d.pw}LL;",
        f"    out0[e] = (y >= 0 && y < {d.h}LL && x >= 0 && x < {d.w}LL) ? in0[((n * {d.c}LL + c) * {d.h}LL + y) * {d.w}LL + x] : ({store})0;",
    ]
    decls, _ = declare([x], [], program.types())
    decls.append(f"{store}* __restrict__ out0")
    params = [Param("in", x, x_t.dtype, (d.n, d.c, d.h, d.w)), Param("out", -1, x_t.dtype, (d.columns,))]
    return assemble("sx_im2col", decls, "e", body, params, d.columns, 0)


def col2im_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """gx[n, c, y, x] = the f32 columns that read the cell, added in kernel-offset order."""
    dtype = node.type.dtype
    store, _ = c_types(dtype)
    body = [
        f"    const long long x = e % {d.w}LL, y = (e / {d.w}LL) % {d.h}LL, c = (e / {d.h * d.w}LL) % {d.c}LL, n = e / {d.c * d.h * d.w}LL;",
        "    float acc = 0.0f;",
        f"    for (long long i = 0; i < {d.kh}LL; ++i) {{",
        f"      const long long py = y + {d.ph}LL - i * {d.dh}LL;",
        f"      if (py < 0 || py % {d.sh}LL != 0 || py / {d.sh}LL >= {d.oh}LL) continue;",
        f"      for (long long j = 0; j < {d.kw}LL; ++j) {{",
        f"        const long long px = x + {d.pw}LL - j * {d.dw}LL;",
        f"        if (px < 0 || px % {d.sw}LL != 0 || px / {d.sw}LL >= {d.ow}LL) continue;",
        f"        acc += in0[((c * {d.kh}LL + i) * {d.kw}LL + j) * {d.cells}LL + n * {d.oh * d.ow}LL + (py / {d.sh}LL) * {d.ow}LL + px / {d.sw}LL];",
        "      }",
        "    }",
        f"    out0[e] = {to_storage('acc', dtype)};",
    ]
    shape = (d.n, d.c, d.h, d.w)
    params = [Param("in", -1, DType.f32, (d.columns,)), Param("out", node.id, dtype, shape)]
    return assemble("sx_col2im", ["const float* __restrict__ in0", f"{store}* __restrict__ out0"], "e", body, params, shape_size(shape),
                    shape_size(shape) * d.kh * d.kw)


def grad_rows_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """g [N, O, OH*OW] moved to [O, N, OH*OW] (a gemm's rows, every image's together)."""
    g = node.args[1]
    g_t = program.types()[g]
    store, _ = c_types(g_t.dtype)
    cells = d.oh * d.ow
    body = [f"    const long long l = e % {cells}LL, n = (e / {cells}LL) % {d.n}LL, o = e / {d.n * cells}LL;",
            f"    out0[e] = in0[(n * {d.o}LL + o) * {cells}LL + l];"]
    params = [Param("in", g, g_t.dtype, tuple(g_t.shape)), Param("out", -1, g_t.dtype, (shape_size(g_t.shape),))]
    return assemble("sx_conv_grad_rows", [f"const {store}* __restrict__ in0", f"{store}* __restrict__ out0"], "e", body, params, shape_size(g_t.shape), 0)


def transpose_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """dW[g, o, kk] = the product's [g, kk, o] (each group's K x Og matrix transposed)."""
    dtype = node.type.dtype
    store, _ = c_types(dtype)
    body = [f"    const long long kk = e % {d.k}LL, o = (e / {d.k}LL) % {d.og}LL, g = e / {d.og * d.k}LL;",
            f"    out0[e] = in0[(g * {d.k}LL + kk) * {d.og}LL + o];"]
    shape = tuple(node.type.shape)
    params = [Param("in", -1, dtype, (shape_size(shape),)), Param("out", node.id, dtype, shape)]
    return assemble("sx_conv_grad_transpose", [f"const {store}* __restrict__ in0", f"{store}* __restrict__ out0"], "e", body, params, shape_size(shape), 0)


def weight_sum_kernel(node: Node, program: Program, d: ImageLaunch, images: int) -> KernelSource:
    """dW[g, o, kk] = the images' products [n, g, kk, o] (each group's K x Og matrix, f32)
    added in image order from the first, rounded once to dW's dtype. A thread per product
    element, in the products' order: the images' reads are contiguous across threads."""
    dtype = node.type.dtype
    store, _ = c_types(dtype)
    each = d.groups * d.k * d.og
    body = [f"    const long long o = e % {d.og}LL, kk = (e / {d.og}LL) % {d.k}LL, g = e / {d.og * d.k}LL;",
            "    float acc = in0[e];",
            f"    for (long long i = 1; i < {images}LL; ++i) acc += in0[i * {each}LL + e];",
            f"    out0[(g * {d.og}LL + o) * {d.k}LL + kk] = {to_storage('acc', dtype)};"]
    shape = tuple(node.type.shape)
    params = [Param("in", -1, DType.f32, (images * each,)), Param("out", node.id, dtype, shape)]
    return assemble("sx_conv_weight_sum", ["const float* __restrict__ in0", f"{store}* __restrict__ out0"], "e", body, params, each, each * (images - 1))


def products_fit(d: ImageLaunch) -> bool:
    """Whether the weight gradient of the whole batch D keeps each image's product (f32):
    where those take no more memory than the batch's columns would (Og <= OH*OW, for f32
    columns), so that the step's scratch is never more than twice what one gemm over the
    batch needs. A rule of the shapes alone, the same on every device."""
    return 4 * d.n * d.groups * d.k * d.og <= BYTES[d.first] * d.columns


def conv_calls(node: Node, d: ImageLaunch, dtype: DType, per_image: bool = False) -> list[BlasCall]:
    """The gemms of the convolution op NODE, with cuBLAS's first matrix our B (see
    `ConvStep.launch` for the buffers each reads and writes); PER_IMAGE: the weight
    gradient's products image by image (`products_fit`)."""
    og, k, cells, n, groups = d.og, d.k, d.oh * d.ow, d.n, d.groups
    wide = n * cells
    if node.op == "conv2d":  # y[n, g] (Og x L) = W_g (Og x K) @ cols[g][:, n] (K x L), batched over n
        return [row_major(og, cells, k, Rows(k, g * og * k, 0), Rows(wide, g * k * wide, cells), Rows(cells, g * og * cells, d.o * cells),
                          False, False, n, dtype, dtype) for g in range(groups)]
    if node.op == "conv2d_input_grad":  # cols[g][:, n] (K x L) = W_g^T (K x Og) @ g[n, g] (Og x L), into f32 columns
        return [row_major(k, cells, og, Rows(k, g * og * k, 0), Rows(cells, g * og * cells, d.o * cells), Rows(wide, g * k * wide, cells),
                          True, False, n, dtype, DType.f32) for g in range(groups)]
    if per_image:
        # each image's product, f32: P[n, g] (K x Og) = cols[g][:, n] (K x L) @ g[n, g]^T (L x Og),
        # batched over the images (`weight_sum_kernel` adds them in image order into dW): per
        # image, so that a chunk's columns are still in the cache when its gemm reads them, and
        # the gradient's rows are read where they are
        return [row_major(k, og, cells, Rows(wide, g * k * wide, cells), Rows(cells, g * og * cells, d.o * cells), Rows(og, g * k * og, groups * k * og),
                          False, True, n, dtype, DType.f32) for g in range(groups)]
    # dW_g^T (K x Og) = cols_g (K x N*L) @ rows_g^T (N*L x Og), batched over the groups, into
    # scratch (`transpose_kernel` moves it to dW): OpenBLAS's AVX-512 kernels compute this
    # orientation (K x Og) 1.1-1.4x as fast as dW_g's own
    return [row_major(k, og, wide, Rows(wide, 0, k * wide), Rows(wide, 0, og * wide), Rows(og, 0, k * og), False, True, groups, dtype, dtype)]


CHUNKED = ("conv2d", "conv2d_input_grad")  # and the weight gradient where it keeps each image's product (products_fit)


def chunk_images(d: ImageLaunch, column_bytes: int, cache_bytes: int) -> int:
    """Images per launch whose columns fit in CACHE_BYTES (COLUMN_BYTES per column element):
    the largest divisor of the batch that fits, at least 1 (every launch the same size, so
    one kernel serves them all)."""
    fit = max(1, cache_bytes // max(1, replace(d, n=1).columns * column_bytes))
    return max(chunk for chunk in range(1, min(fit, d.n) + 1) if d.n % chunk == 0)


@dataclass
class ConvStep(NodeStep):
    """conv2d, conv2d_input_grad or conv2d_weight_grad: generated kernels around cuBLAS
    calls, the im2col matrix (and the moved gradient rows) in the step's scratch.

    A chunk of `chunk` images at a time where a device asks for it (`fit_cache`: the CPU,
    so that a chunk's columns are still in its cache when the gemm reads them, or the col2im
    reads what the gemm wrote): each chunk's im2col and gemms, or gemms and col2im, on views
    of the chunk's images, the chunks one `StepRun.each` (the CPU's threads take whole chunks,
    each in its own copy of the columns). The same bits: no image's columns, products or sums
    involve another's; the weight gradient's per-image products (where they fit:
    `products_fit`) go to a part of the scratch the chunks share (each its own images'), then
    one kernel adds them in image order. A weight gradient whose products would outgrow the
    batch's columns is one gemm over the batch, on the gradient's rows moved together."""

    parts: list[tuple[DType, int]] = field(default_factory=list)  # scratch_parts, worked out when lowered
    gemms: list[BlasCall] = field(default_factory=list)  # calls, likewise
    chunk: int = 0  # images per launch; 0: the whole batch, one launch of each kernel and gemm
    launch_shape: Optional[ImageLaunch] = None  # `shape`, kept
    per_image: bool = False  # a weight gradient that keeps each image's product (`products_fit`), decided when lowered
    kind: ClassVar[str] = "image"

    def geometry(self, types: dict[int, TensorType]) -> ConvGeom:
        return conv_geom(self.node, types)

    def shape(self, types: dict[int, TensorType]) -> ImageLaunch:
        """One launch: a chunk's images, or the whole batch (built once per chunk)."""
        if self.launch_shape is None or self.launch_shape.n != (self.chunk or self.geometry(types).n):
            geom = self.geometry(types)
            self.launch_shape = conv_launch(replace(geom, n=self.chunk) if self.chunk else geom, *node_dtypes(self.node, types))
        return self.launch_shape

    def fit_cache(self, types: dict[int, TensorType], cache_bytes: int) -> None:
        """Launch a chunk of images at a time when the batch's columns outgrow CACHE_BYTES."""
        whole = conv_launch(self.geometry(types), *node_dtypes(self.node, types))
        if self.node.op not in CHUNKED and not self.per_image:
            return
        column_bytes = BYTES[DType.f32] if self.node.op == "conv2d_input_grad" else BYTES[whole.first]
        chunk = chunk_images(whole, column_bytes, cache_bytes)
        self.chunk = 0 if chunk == whole.n else chunk
        self.parts, self.gemms = self.scratch_parts(types), self.calls(types)

    def scratch_parts(self, types: dict[int, TensorType]) -> list[tuple[DType, int]]:
        """The scratch buffers, in order: (storage dtype, elements)."""
        d = self.shape(types)
        if self.node.op == "conv2d":
            return [(d.first, d.columns)]
        if self.node.op == "conv2d_input_grad":
            return [(DType.f32, d.columns)]
        if self.per_image:
            return [(d.first, d.columns), (DType.f32, self.geometry(types).n * shape_size(self.node.type.shape))]
        return [(d.first, d.columns), (d.first, shape_size(types[self.node.args[1]].shape)), (d.first, shape_size(self.node.type.shape))]

    def private_bytes(self) -> int:
        """The scratch a chunk takes as its own: the columns (the weight gradient's products,
        after them, are every chunk's, each writing its own images')."""
        dtype, count = self.parts[0]
        return aligned(count * BYTES[dtype])

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        return sum(aligned(count * BYTES[dtype]) for dtype, count in self.scratch_parts(types))

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        d = self.shape(program.types())
        if self.node.op == "conv2d":
            return [im2col_kernel(self.node, program, d)]
        if self.node.op == "conv2d_input_grad":
            return [col2im_kernel(self.node, program, d)]
        if self.per_image:
            return [im2col_kernel(self.node, program, d), weight_sum_kernel(self.node, program, d, self.geometry(program.types()).n)]
        return [im2col_kernel(self.node, program, d), grad_rows_kernel(self.node, program, d), transpose_kernel(self.node, program, d)]

    def calls(self, types: dict[int, TensorType]) -> list[BlasCall]:
        d = self.shape(types)
        return conv_calls(self.node, d, d.first, self.per_image)

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        node = self.node
        out = run.buffer(node.id)
        parts = self.part_arrays(run)
        first, second = run.contiguous(node.args[0]), run.contiguous(node.args[1])
        batch = first.shape[0] if node.op == "conv2d_weight_grad" else out.shape[0]  # x's images; dW has none
        chunk = self.chunk or batch

        def forward(item: int) -> None:  # x, w
            images = slice(item * chunk, (item + 1) * chunk)
            run.launch(kernels[0], [first[images], parts[0]])
            for call in self.gemms:
                run.gemm(call, parts[0], second, out[images])

        def input_grad(item: int) -> None:  # g, w
            images = slice(item * chunk, (item + 1) * chunk)
            for call in self.gemms:
                run.gemm(call, first[images], second, parts[0])
            run.launch(kernels[0], [parts[0], out[images]])

        def weight_grad(item: int) -> None:  # x, g: each image's product into its part of the shared scratch
            images = slice(item * chunk, (item + 1) * chunk)
            run.launch(kernels[0], [first[images], parts[0]])
            products = parts[1].reshape(batch, -1)[images]
            for call in self.gemms:
                run.gemm(call, second[images], parts[0], products)

        if node.op == "conv2d_weight_grad" and not self.per_image:  # one gemm over the batch, on the rows moved together
            run.launch(kernels[0], [first, parts[0]])
            run.launch(kernels[1], [second, parts[1]])
            for call in self.gemms:
                run.gemm(call, parts[1], parts[0], parts[2])
            run.launch(kernels[2], [parts[2], out])
        else:
            body = forward if node.op == "conv2d" else input_grad if node.op == "conv2d_input_grad" else weight_grad
            run.each(batch // chunk, body, self.private_bytes() if node.op == "conv2d_weight_grad" else None)
            if node.op == "conv2d_weight_grad":
                run.launch(kernels[1], [parts[1], out])
        run.set(node.id, out)

    def part_arrays(self, run: StepRun) -> list[Any]:
        """The scratch buffers of `parts`, typed, each at an aligned offset."""
        offset, arrays = 0, []
        for dtype, count in self.parts:
            arrays.append(run.scratch(STORAGE[dtype], count, offset))
            offset += aligned(count * BYTES[dtype])
        return arrays

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        program = lowered.program
        types = program.types()
        kernels = self.kernels(program, lowered.constants)
        calls = self.calls(types)
        gemm = f"{len(calls)} x {calls[0].name}" if len(calls) > 1 else calls[0].name
        shape = f"{calls[0].batch}x{calls[0].n}x{calls[0].m}x{calls[0].k}" if calls[0].batch > 1 else f"{calls[0].n}x{calls[0].m}x{calls[0].k}"
        dtype = types[self.node.args[0]].dtype
        precision = "bf16 in, f32 accumulate" if dtype == DType.bf16 else dtype.value
        names = [k.name for k in kernels]
        gemm_text = f"{gemm} {shape} ({precision})"
        text = ([names[0], gemm_text] if self.node.op == "conv2d" else [gemm_text, names[0]] if self.node.op == "conv2d_input_grad"
                else [names[0], gemm_text, names[1]] if len(names) == 2 else [*names[:2], gemm_text, names[2]])
        chunks = self.geometry(types).n // self.chunk if self.chunk else 1
        per_chunk, once = (kernels[:1], kernels[1:]) if self.per_image else (kernels, [])  # the products' sum: once
        gemm_bytes = sum(call.batch * (call.m * call.k * BYTES[call.in_dtype] + call.k * call.n * BYTES[call.in_dtype] + call.m * call.n * BYTES[call.out_dtype])
                         for call in calls)
        how = {"conv2d": "im2col in the step's scratch", "conv2d_input_grad": "f32 columns in the step's scratch, added back per input cell",
               "conv2d_weight_grad": "im2col in the step's scratch, " + ("each image's product in f32, added in image order" if self.per_image
                                                                          else "one product over the batch (each image's would outgrow the columns)")}[self.node.op]
        return KernelLine(step=index, kind=self.kind, kernel=" + ".join(text), nodes=[lowered.label(self.node)], elements=shape_size(self.node.type.shape),
                          bytes=chunks * (sum(k.bytes for k in per_chunk) + gemm_bytes) + sum(k.bytes for k in once),
                          flops=chunks * (sum(c.flops for c in calls) + sum(k.flops for k in per_chunk)) + sum(k.flops for k in once),
                          launches=chunks * (len(per_chunk) + len(calls)) + len(once), cublas=chunks * len(calls),
                          how=how + (f", {chunks} chunks of {self.chunk} images" if self.chunk else ""))


@register_lowering("conv2d", "conv2d_input_grad", "conv2d_weight_grad")
def _convolution(node: Node, context: LoweringContext) -> Placement:
    step = ConvStep(node)
    step.per_image = node.op == "conv2d_weight_grad" and products_fit(conv_launch(step.geometry(context.types), *node_dtypes(node, context.types)))
    step.parts, step.gemms = step.scratch_parts(context.types), step.calls(context.types)
    return step


# -- pools -------------------------------------------------------------------------------------------
def pool_geom(node: Node, types: dict[int, TensorType]) -> PoolGeom:
    shape = tuple(node.attrs["input_shape"]) if node.op == "avg_pool2d_grad" else tuple(types[node.args[0]].shape)
    return pool_geometry(node.op, shape, node.attrs, "")


def pool_launch(node: Node, types: dict[int, TensorType]) -> ImageLaunch:
    geom = pool_geom(node, types)
    (kh, kw), (sh, sw), (ph, pw) = geom.kernel, geom.stride, geom.padding
    return ImageLaunch(n=geom.n, c=geom.c, h=geom.hw[0], w=geom.hw[1], oh=geom.size[0], ow=geom.size[1], kh=kh, kw=kw, sh=sh, sw=sw, ph=ph, pw=pw,
                       first=types[node.args[0]].dtype, out=node.type.dtype, second=types[node.args[1]].dtype if len(node.args) > 1 else None)


def offsets_loop(d: ImageLaunch, indent: str, lines: list[str]) -> tuple[str, str]:
    """`for k` over the KH * KW offsets of a window, opened with LINES: (head, tail)."""
    head = "\n".join([f"{indent}for (int k = 0; k < {d.kh * d.kw}; ++k) {{", *(f"{indent}  {line}" for line in lines)])
    return head, f"{indent}}}"


def window_cells(d: ImageLaunch, indent: str) -> tuple[str, str]:
    """The loop over a window's cells in window order (row by row), for output (n, c, p, q):
    opens `for k` with `real` (the cell is inside the input) and `cell` (its flat index)."""
    return offsets_loop(d, indent, [
        f"const long long y = p * {d.sh}LL + k / {d.kw} - {d.ph}LL, x = q * {d.sw}LL + k % {d.kw} - {d.pw}LL;",
        f"const bool real = y >= 0 && y < {d.h}LL && x >= 0 && x < {d.w}LL;",
        f"const long long cell = (nc * {d.h}LL + y) * {d.w}LL + x;"])


def output_coords(d: ImageLaunch) -> str:
    return f"    const long long q = e % {d.ow}LL, p = (e / {d.ow}LL) % {d.oh}LL, nc = e / {d.oh * d.ow}LL;"


def argmax_lines(d: ImageLaunch, x_dtype: DType) -> list[str]:
    """`at`: the window's first maximum in window order: the first NaN if it has one, else
    the first real cell equal to the maximum; padding never wins (an all -inf window goes to
    its first real cell), as the CPU backend's _argmax."""
    value = from_storage("in0[cell]", x_dtype)
    head, tail = window_cells(d, "    ")
    second, second_tail = window_cells(d, "      ")
    return [
        "    float peak = -sx_inf();", "    int first_real = -1, first_nan = -1;",
        head, "      if (!real) continue;", f"      const float v = {value};",
        "      if (first_real < 0) first_real = k;", "      if (v != v && first_nan < 0) first_nan = k;", "      peak = sx_maxf(peak, v);", tail,
        "    int at = first_nan >= 0 ? first_nan : first_real;",
        "    if (first_nan < 0 && peak != -sx_inf()) {",
        second, f"        if (real && {value} == peak) {{ at = k; break; }}", second_tail, "    }",
    ]


def max_pool_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    types = program.types()
    dtype = node.type.dtype
    head, tail = window_cells(d, "    ")
    body = [output_coords(d), "    float peak = -sx_inf();", head, f"      if (real) peak = sx_maxf(peak, {from_storage('in0[cell]', dtype)});", tail,
            f"    out0[e] = {to_storage('peak', dtype)};"]
    decls, params = declare([node.args[0]], [node.id], types)
    return assemble("sx_max_pool", decls, "e", body, params, shape_size(node.type.shape), node.type.size * d.kh * d.kw)


def max_pool_select_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """out[window] = 0 + h[its first maximum's cell] (the CPU adds into zeros)."""
    types = program.types()
    dtype = node.type.dtype
    body = [output_coords(d), *argmax_lines(d, types[node.args[0]].dtype),
            f"    const long long chosen = (nc * {d.h}LL + p * {d.sh}LL + at / {d.kw} - {d.ph}LL) * {d.w}LL"
            f" + q * {d.sw}LL + at % {d.kw} - {d.pw}LL;",
            f"    out0[e] = {to_storage('0.0f + ' + from_storage('in1[chosen]', dtype), dtype)};"]
    decls, params = declare(list(node.args), [node.id], types)
    return assemble("sx_max_pool_select", decls, "e", body, params, shape_size(node.type.shape), node.type.size * d.kh * d.kw)


def max_pool_index_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """Each window's first maximum (its offset in window order), as int, in scratch."""
    types = program.types()
    x = node.args[0]
    x_t = types[x]
    windows = d.n * d.c * d.oh * d.ow
    body = [output_coords(d), *argmax_lines(d, x_t.dtype), "    out0[e] = at;"]
    params = [Param("in", x, x_t.dtype, tuple(x_t.shape)), Param("out", -1, DType.i32, (windows,))]
    return assemble("sx_max_pool_index", [f"const {c_types(x_t.dtype)[0]}* __restrict__ in0", "int* __restrict__ out0"], "e", body, params, windows,
                    windows * d.kh * d.kw)


def cell_windows(d: ImageLaunch, indent: str) -> tuple[str, str]:
    """The loop over the windows that hold input cell (nc, y, x), in kernel-offset order:
    opens `for k` with `window` (the flat index of the output element)."""
    return offsets_loop(d, indent, [
        f"const long long py = y + {d.ph}LL - k / {d.kw}, px = x + {d.pw}LL - k % {d.kw};",
        f"if (py < 0 || px < 0 || py % {d.sh}LL != 0 || px % {d.sw}LL != 0 || py / {d.sh}LL >= {d.oh}LL || px / {d.sw}LL >= {d.ow}LL) continue;",
        f"const long long window = (nc * {d.oh}LL + py / {d.sh}LL) * {d.ow}LL + px / {d.sw}LL;"])


def input_coords(d: ImageLaunch) -> str:
    return f"    const long long x = e % {d.w}LL, y = (e / {d.w}LL) % {d.h}LL, nc = e / {d.h * d.w}LL;"


def max_pool_grad_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """gx[cell] = 0 + the gradients of the windows whose first maximum it is, in offset order."""
    types = program.types()
    g = node.args[1]
    g_t = types[g]
    windows = d.n * d.c * d.oh * d.ow
    store, _ = c_types(node.type.dtype)
    head, tail = cell_windows(d, "    ")
    body = [input_coords(d), "    float acc = 0.0f;", head, f"      if (index[window] == k) acc += {from_storage('in0[window]', g_t.dtype)};", tail,
            f"    out0[e] = {to_storage('acc', node.type.dtype)};"]
    decls = ["const int* __restrict__ index", f"const {c_types(g_t.dtype)[0]}* __restrict__ in0", f"{store}* __restrict__ out0"]
    params = [Param("in", -1, DType.i32, (windows,)), Param("in", g, g_t.dtype, tuple(g_t.shape)), Param("out", node.id, node.type.dtype, tuple(node.type.shape))]
    return assemble("sx_max_pool_grad", decls, "e", body, params, shape_size(node.type.shape), 0)


def tiles(d: ImageLaunch) -> bool:
    """Whether the windows tile the input: no padding, strides equal to the kernel, every
    cell in exactly one window."""
    return not d.padded and (d.sh, d.sw) == (d.kh, d.kw) and d.h % d.kh == 0 and d.w % d.kw == 0


def max_pool_tiled_grad_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """max_pool2d_grad where the windows tile the input: a thread per window finds its first
    maximum (as `argmax_lines`) and writes each of its cells, 0 + the window's gradient at
    that cell and 0 elsewhere (what the gather of max_pool_grad_kernel adds up to when each
    cell has one window), with no index in scratch."""
    types = program.types()
    g_t = types[node.args[1]]
    dtype = node.type.dtype
    body = [output_coords(d), *argmax_lines(d, types[node.args[0]].dtype),
            f"    const float gradient = 0.0f + {from_storage('in1[e]', g_t.dtype)};",
            f"    for (int k = 0; k < {d.kh * d.kw}; ++k)",
            f"      out0[(nc * {d.h}LL + p * {d.kh}LL + k / {d.kw}) * {d.w}LL + q * {d.kw}LL + k % {d.kw}] = k == at ? {to_storage('gradient', dtype)} : {to_storage('0.0f', dtype)};"]
    decls, params = declare(list(node.args), [node.id], types)
    windows = shape_size(g_t.shape)
    return assemble("sx_max_pool_tiled_grad", decls, "e", body, params, windows, windows * d.kh * d.kw)


def reciprocal(d: ImageLaunch) -> str:
    """1 / (KH * KW) as the CPU's f32 (the f64 quotient rounded once)."""
    return literal(float(np.float32(1.0 / (d.kh * d.kw))), DType.f32)


def avg_pool_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """The window's cells added in window order from the first (a padding cell is 0), times
    the f32 reciprocal."""
    types = program.types()
    dtype = node.type.dtype
    head, tail = window_cells(d, "    ")
    body = [output_coords(d), "    float acc = 0.0f;", head, f"      const float v = real ? {from_storage('in0[cell]', dtype)} : 0.0f;",
            "      acc = k == 0 ? v : acc + v;", tail, f"    out0[e] = {to_storage(f'sx_fmul(acc, {reciprocal(d)})', dtype)};"]
    decls, params = declare([node.args[0]], [node.id], types)
    return assemble("sx_avg_pool", decls, "e", body, params, shape_size(node.type.shape), node.type.size * d.kh * d.kw)


def avg_pool_grad_kernel(node: Node, program: Program, d: ImageLaunch) -> KernelSource:
    """gx[cell] = 0 + each covering window's g times the f32 reciprocal, in offset order."""
    types = program.types()
    g_t = types[node.args[0]]
    head, tail = cell_windows(d, "    ")
    body = [input_coords(d), "    float acc = 0.0f;", head, f"      acc += sx_fmul({from_storage('in0[window]', g_t.dtype)}, {reciprocal(d)});", tail,
            f"    out0[e] = {to_storage('acc', node.type.dtype)};"]
    decls, params = declare([node.args[0]], [node.id], types)
    return assemble("sx_avg_pool_grad", decls, "e", body, params, shape_size(node.type.shape), node.type.size * d.kh * d.kw)


@dataclass
class PoolStep(NodeStep):
    """A pool op as generated kernels (max_pool2d_grad: the windows' first maxima into
    scratch, then the gather of each input cell's windows)."""

    launch_shape: Optional[ImageLaunch] = None  # `shape`, kept
    per_image: bool = False  # a weight gradient that keeps each image's product (`products_fit`), decided when lowered
    kind: ClassVar[str] = "image"

    def shape(self, types: dict[int, TensorType]) -> ImageLaunch:
        """The launch's extents and dtypes (built once)."""
        if self.launch_shape is None:
            self.launch_shape = pool_launch(self.node, types)
        return self.launch_shape

    def gathers(self, types: dict[int, TensorType]) -> bool:
        """Whether this is a max-pool gradient through an index in scratch (windows that do
        not tile the input: each cell gathers the windows that chose it)."""
        return self.node.op == "max_pool2d_grad" and not tiles(self.shape(types))

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        d = self.shape(program.types())
        if self.gathers(program.types()):
            return [max_pool_index_kernel(self.node, program, d), max_pool_grad_kernel(self.node, program, d)]
        if self.node.op == "max_pool2d_grad":
            return [max_pool_tiled_grad_kernel(self.node, program, d)]
        return [POOLS[self.node.op](self.node, program, d)]

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        return aligned(4 * self.shape(types).windows) if self.gathers(types) else 0

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        node = self.node
        if len(kernels) == 1:
            launch_group(run, kernels[0], list(node.args), [node.id])
            return
        index = run.scratch(np.int32, kernels[0].size)
        run.launch(kernels[0], [run.contiguous(node.args[0]), index])
        out = run.buffer(node.id)
        run.launch(kernels[1], [index, run.contiguous(node.args[1]), out])
        run.set(node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        kernels = self.kernels(lowered.program, lowered.constants)
        tiled = self.node.op == "max_pool2d_grad" and len(kernels) == 1
        how = "a thread per window, then a thread per input cell" if len(kernels) == 2 else "a thread per window, writing its cells" if tiled else "a thread per output element"
        return KernelLine(step=index, kind=self.kind, kernel=" + ".join(k.name for k in kernels), how=how, nodes=[lowered.label(self.node)],
                          elements=shape_size(self.node.type.shape), bytes=sum(k.bytes for k in kernels), flops=sum(k.flops for k in kernels),
                          launches=len(kernels))


POOLS = {"max_pool2d": max_pool_kernel, "max_pool2d_select": max_pool_select_kernel, "avg_pool2d": avg_pool_kernel, "avg_pool2d_grad": avg_pool_grad_kernel}


@register_lowering("max_pool2d", "max_pool2d_grad", "max_pool2d_select", "avg_pool2d", "avg_pool2d_grad")
def _pool(node: Node, context: LoweringContext) -> Placement:
    return PoolStep(node)

