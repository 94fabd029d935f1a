"""The host schedule of the image steps (runtime/lower/images.py): im2col, col2im, the
weight gradient's sum of its images' products and the max-pools as loops over rows or
planes, each row's inner loop contiguous.

The CUDA kernels give a thread to each element and find its coordinates by dividing its
flat index; on the host that costs more than the copy itself. Here an item is a row (the
innermost axis of what the kernel writes) or a plane of rows: its outer coordinates are
found once, the window offsets that depend on the item alone are hoisted out, and the inner
loop over a row's elements is a strided copy (a plain copy at stride 1, which the compiler
vectorizes) or, for a pool, one window offset applied to the whole row at a time. The
im2col's item is a plane (one kernel offset of one image: the rows and columns that fall
inside the image found once, and at stride 1 with rows as wide as the image the plane one
copy of the image's run, its out-of-image columns then set to 0); the col2im's at stride 1
a plane of the input (its sums on the stack, each kernel offset's columns added in turn); a
max-pool without padding reads each window's cells once. Every element gets the same
operations in the same order as its CUDA thread (a window's offsets in window order, a
cell's kernel offsets in kernel order, each skipped where the thread skips it), so the bits
are the device's: the emulated CUDA kernels check it (tests/test_cpu_device.py,
tests/test_cpu_images.py).

A kernel is matched to its row form by its name (the CUDA kernel's prefix); one without a
row form (the pools' select and the average pools) is its CUDA threads' loop.

The host's schedule of a convolution (`host_schedule`): the forward and the input gradient
run a chunk of images at a time, the largest divisor of the batch whose columns fit in
CACHE_BYTES (1 MiB, about one core's L2 here), so that the gemm reads the columns the im2col
has just written (and the col2im those the gemm wrote) from the cache instead of memory. On
the issue's CNN (28x28, 32 -> 64 channels, batch 64) a chunk is one image: 0.9 MB of
columns instead of 58 MB. The weight gradient goes a chunk at a time too: each image's
product (f32) into a part of the scratch the chunks share, which one kernel then adds in
image order (lower/images.py, the same on a GPU), where the products fit in what the
batch's columns would take (`products_fit`; else one gemm over the batch, on both devices). The chunks change no bit (no image's
numbers involve another's). With threads, the chunks are the pool's items (a repeat on the
tape, runtime_c.py): a chunk's im2col, gemm and col2im run on one core, on its own copy of
the columns.

A max-pool's windows are read cell by cell into named scalars and its first maximum is
chosen without a branch (`first_maximum`), so that GCC vectorizes the loop over a row's
windows; the host's SX_UNORDERED (hostc.py) is what lets it vectorize sx_maxf at all.
"""

from __future__ import annotations

from typing import Callable

from ...ir.dtypes import DType
from ...ir.graph import Node, Program
from ..lower.codegen import KernelSource, c_types, from_storage, to_storage
from ..lower.emitters import register_emitter
from ..lower.fusion import Lowering
from ..lower.images import ConvStep, ImageLaunch, PoolStep
from ..lower.lowering import FitsCache
from .hostc import PLATFORM, HostKernel, function, thread_kernel


CACHE_BYTES = 1 << 20  # a chunk's scratch on the host: about one core's L2
PLANE_CELLS = 1 << 14  # the largest image whose f32 plane of sums the host keeps on the stack (64 KiB)
COL2IM_PLANES = "a plane of the input per item, its sums on the stack, each kernel offset's columns added in turn"
COL2IM_RUNS = COL2IM_PLANES + ", each over the plane as one run (the cells it misses add 0)"
KEEP_BYTES = 1 << 16  # the largest table of the run's masks (a word per kernel column and cell) the host keeps on the stack
PLANES = "a plane of columns (one kernel offset of one image) per item"
WINDOWS_ONCE = "a row of windows per item, each window's cells read once (no padding)"
TILED_WINDOWS = "a row of windows per item, each window's cells read once and written once (windows that tile the input)"


def host_schedule(lowering: Lowering, cache_bytes: int = CACHE_BYTES) -> None:
    """The host's launches of LOWERING's steps: each step that can split its work does so to
    keep its scratch within CACHE_BYTES."""
    types = lowering.program.types()
    for step in lowering.steps:
        if isinstance(step, FitsCache):
            step.fit_cache(types, cache_bytes)


def prefix(kernel: KernelSource) -> str:
    """The kernel's name without its hash: which generator wrote it."""
    return kernel.name.rsplit("_", 1)[0]


def rows_kernel(kernel: KernelSource, rows: int, body: list[str], schedule: str = "a row of the output per item", before: tuple[str, ...] = ()) -> HostKernel:
    """KERNEL's host function over rows [sx_begin, sx_end) of BODY (which reads `r`), after
    BEFORE; SCHEDULE says what an item is (explain --cpu)."""
    lines = [*before, "  for (long long r = sx_begin; r < sx_end; ++r) {", *body, "  }"]
    return HostKernel(kernel.name, function(kernel.name, kernel.decls, lines), rows, kernel.bytes + kernel.flops, schedule=schedule)


def first_inside(offset: str, stride: int, count: int, limit: int, names: tuple[str, str, str] = ("off", "lo", "hi")) -> list[str]:
    """`lo`, `hi` (NAMES' second and third, the first naming OFFSET): the positions t in
    [0, COUNT) with 0 <= t * STRIDE + OFFSET < LIMIT are [lo, hi) (OFFSET a C expression)."""
    off, lo, hi = names
    return [f"      const long long {off} = {offset};",
            f"      long long {lo} = {off} >= 0 ? 0 : (-{off} + {stride - 1}LL) / {stride}LL, {hi} = {limit}LL - {off} <= 0 ? 0 : ({limit}LL - {off} + {stride - 1}LL) / {stride}LL;",
            f"      if ({hi} > {count}LL) {hi} = {count}LL;",
            f"      if ({lo} > {hi}) {lo} = {hi};"]


# -- convolutions --------------------------------------------------------------------------------
def im2col_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """cols[c, i, j, n, :, :] for plane r = ((c * KH + i) * KW + j) * N + n: the kernel offset
    (i, j) and the image are found once per plane, the output rows p whose input row is inside
    the image ([plo, phi)) and the columns q whose cell is ([lo, hi)) once per plane too, and
    each such row is a copy (a plain one at stride 1) between its zeros."""
    store, _ = c_types(program.types()[node.args[0]].dtype)
    body = [
        f"    const long long n = r % {d.n}LL, j = (r / {d.n}LL) % {d.kw}LL, i = (r / {d.n * d.kw}LL) % {d.kh}LL, c = r / {d.n * d.kw * d.kh}LL;",
        f"    {store}* __restrict__ plane = out0 + r * {d.oh * d.ow}LL;",
        f"    const {store}* __restrict__ image = in0 + (n * {d.c}LL + c) * {d.h * d.w}LL;",
        "    {",
        *first_inside(f"i * {d.dh}LL - {d.ph}LL", d.sh, d.oh, d.h, ("yoff", "plo", "phi")),
        *first_inside(f"j * {d.dw}LL - {d.pw}LL", d.sw, d.ow, d.w),
        f"      for (long long q = 0; q < plo * {d.ow}LL; ++q) plane[q] = ({store})0;",
        *(flat_rows(store, d) if (d.sh, d.sw, d.ow) == (1, 1, d.w) else strided_rows(store, d)),
        f"      for (long long q = phi * {d.ow}LL; q < {d.oh * d.ow}LL; ++q) plane[q] = ({store})0;",
        "    }",
    ]
    return rows_kernel(kernel, d.c * d.kh * d.kw * d.n, body, PLANES)


def strided_rows(store: str, d: ImageLaunch) -> list[str]:
    """The im2col plane's rows [plo, phi): each a copy between its zeros."""
    return ["      for (long long p = plo; p < phi; ++p) {",
            f"        {store}* __restrict__ row = plane + p * {d.ow}LL;",
            f"        const {store}* __restrict__ src = image + (p * {d.sh}LL + yoff) * {d.w}LL + off;",
            f"        for (long long q = 0; q < lo; ++q) row[q] = ({store})0;",
            f"        for (long long q = lo; q < hi; ++q) row[q] = src[q * {d.sw}LL];",
            f"        for (long long q = hi; q < {d.ow}LL; ++q) row[q] = ({store})0;",
            "      }"]


def flat_rows(store: str, d: ImageLaunch) -> list[str]:
    """strided_rows at stride 1 with rows as wide as the image's: the plane's rows [plo, phi)
    are one run of the image (shifted by yoff rows and off columns), copied at once where it
    lies inside the image, then each row's columns outside [lo, hi) set to 0 (they held a
    neighbouring row's cells, or nothing)."""
    return ["      {",
            f"        const long long shift = yoff * {d.w}LL + off, first = plo * {d.w}LL, last = phi * {d.w}LL;",
            "        const long long t0 = first > -shift ? first : -shift;",
            f"        const long long t1 = last < {d.h * d.w}LL - shift ? last : {d.h * d.w}LL - shift;",
            f"        for (long long t = first; t < t0 && t < last; ++t) plane[t] = ({store})0;",
            "        for (long long t = t0; t < t1; ++t) plane[t] = image[t + shift];",
            f"        for (long long t = t1 > t0 ? t1 : t0; t < last; ++t) plane[t] = ({store})0;",
            "      }",
            "      for (long long p = plo; p < phi; ++p) {",
            f"        {store}* __restrict__ row = plane + p * {d.w}LL;",
            f"        for (long long q = 0; q < lo; ++q) row[q] = ({store})0;",
            f"        for (long long q = hi; q < {d.w}LL; ++q) row[q] = ({store})0;",
            "      }"]


def col2im_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """gx[n, c, y, :] for row r = (n * C + c) * H + y: each cell adds the f32 columns that read
    it in kernel-offset order, from 0."""
    if (d.sh, d.sw) == (1, 1) and d.ow == d.w and d.kw * d.h * d.w * 4 <= KEEP_BYTES:
        return col2im_runs(node, d, kernel)
    if (d.sh, d.sw) == (1, 1) and d.h * d.w <= PLANE_CELLS:
        return col2im_planes(node, d, kernel)
    body = [
        f"    const long long y = r % {d.h}LL, c = (r / {d.h}LL) % {d.c}LL, n = r / {d.h * d.c}LL;",
        f"    float acc[{d.w}];",
        f"    for (long long x = 0; x < {d.w}LL; ++x) acc[x] = 0.0f;",
        f"    for (long long i = 0; i < {d.kh}LL; ++i) {{",
        f"      const long long py = y + {d.ph}LL - i * {d.dh}LL;",
        f"      if (py < 0 || py % {d.sh}LL != 0 || py / {d.sh}LL >= {d.oh}LL) continue;",
        f"      for (long long j = 0; j < {d.kw}LL; ++j) {{",
        f"        const float* __restrict__ col = in0 + ((c * {d.kh}LL + i) * {d.kw}LL + j) * {d.cells}LL + n * {d.oh * d.ow}LL + (py / {d.sh}LL) * {d.ow}LL;",
        f"        const long long off = {d.pw}LL - j * {d.dw}LL;",  # px = x + off
    ]
    if d.sw == 1:
        body += [f"        const long long lo = off >= 0 ? 0 : -off, hi = {d.ow}LL - off < {d.w}LL ? {d.ow}LL - off : {d.w}LL;",
                 "        for (long long x = lo; x < hi; ++x) acc[x] += col[x + off];"]
    else:
        body += [f"        for (long long x = 0; x < {d.w}LL; ++x) {{",
                 "          const long long px = x + off;",
                 f"          if (px >= 0 && px % {d.sw}LL == 0 && px / {d.sw}LL < {d.ow}LL) acc[x] += col[px / {d.sw}LL];",
                 "        }"]
    body += ["      }", "    }",
             f"    for (long long x = 0; x < {d.w}LL; ++x) out0[r * {d.w}LL + x] = {to_storage('acc[x]', node.type.dtype)};"]
    return rows_kernel(kernel, d.n * d.c * d.h, body)


def col2im_planes(node: Node, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """col2im_rows at stride 1 for plane r = n * C + c: the plane's accumulators on the stack,
    each kernel offset (i, j) in turn adding its columns into the rows and columns it reaches
    (found once per offset, not per row), so each cell still adds its columns in
    kernel-offset order from 0."""
    body = [
        f"    const long long c = r % {d.c}LL, n = r / {d.c}LL;",
        f"    float acc[{d.h * d.w}];",
        f"    for (long long t = 0; t < {d.h * d.w}LL; ++t) acc[t] = 0.0f;",
        f"    for (long long i = 0; i < {d.kh}LL; ++i) {{",
        f"      const long long shift = {d.ph}LL - i * {d.dh}LL, ylo = shift >= 0 ? 0 : -shift, yhi = {d.oh}LL - shift < {d.h}LL ? {d.oh}LL - shift : {d.h}LL;",
        f"      for (long long j = 0; j < {d.kw}LL; ++j) {{",
        f"        const float* __restrict__ col = in0 + ((c * {d.kh}LL + i) * {d.kw}LL + j) * {d.cells}LL + n * {d.oh * d.ow}LL;",
        f"        const long long off = {d.pw}LL - j * {d.dw}LL, lo = off >= 0 ? 0 : -off, hi = {d.ow}LL - off < {d.w}LL ? {d.ow}LL - off : {d.w}LL;",
        "        for (long long y = ylo; y < yhi; ++y) {",
        f"          float* __restrict__ row = acc + y * {d.w}LL;",
        f"          const float* __restrict__ src = col + (y + shift) * {d.ow}LL + off;",
        "          for (long long x = lo; x < hi; ++x) row[x] += src[x];",
        "        }", "      }", "    }",
        f"    for (long long t = 0; t < {d.h * d.w}LL; ++t) out0[r * {d.h * d.w}LL + t] = {to_storage('acc[t]', node.type.dtype)};"]
    return rows_kernel(kernel, d.n * d.c, body, COL2IM_PLANES)


def col2im_runs(node: Node, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """col2im_planes where the columns' rows are as wide as the image's (stride 1, 'same'
    widths): a kernel offset's columns reach the plane's cells [first, last) as one run at a
    fixed distance, so each offset is one loop over that run instead of a short loop per row
    (28 cells on issue 25's CNN, which a 16-lane loop does in a vector and a tail). The cells
    of the run whose column the offset misses (x outside [lo, hi), at the rows' ends) read a
    neighbouring row's column and add it masked to +0 (a word of 0 or all ones per kernel
    column and cell, `sx_keep`, made once per call). A sum that starts at +0 is never -0, so
    adding +0 leaves its bits as they were: each cell adds the same columns, in kernel-offset
    order, with the bits of col2im_planes and the CUDA threads."""
    cells = d.h * d.w
    before = (f"  unsigned int sx_keep[{d.kw}][{cells}];",
              f"  for (long long j = 0; j < {d.kw}LL; ++j) {{",
              f"    const long long off = {d.pw}LL - j * {d.dw}LL, lo = off >= 0 ? 0 : -off, hi = {d.w}LL - off < {d.w}LL ? {d.w}LL - off : {d.w}LL;",
              f"    for (long long t = 0; t < {cells}LL; ++t) {{ const long long x = t % {d.w}LL; sx_keep[j][t] = x >= lo && x < hi ? 0xffffffffu : 0u; }}",
              "  }")
    body = [
        f"    const long long c = r % {d.c}LL, n = r / {d.c}LL;",
        f"    float acc[{cells}];",
        f"    for (long long t = 0; t < {cells}LL; ++t) acc[t] = 0.0f;",
        f"    for (long long i = 0; i < {d.kh}LL; ++i) {{",
        f"      const long long shift = {d.ph}LL - i * {d.dh}LL, ylo = shift >= 0 ? 0 : -shift, yhi = {d.oh}LL - shift < {d.h}LL ? {d.oh}LL - shift : {d.h}LL;",
        "      if (ylo >= yhi) continue;",
        f"      for (long long j = 0; j < {d.kw}LL; ++j) {{",
        f"        const float* __restrict__ col = in0 + ((c * {d.kh}LL + i) * {d.kw}LL + j) * {d.cells}LL + n * {d.oh * d.ow}LL;",
        f"        const long long off = {d.pw}LL - j * {d.dw}LL, lo = off >= 0 ? 0 : -off, hi = {d.w}LL - off < {d.w}LL ? {d.w}LL - off : {d.w}LL;",
        "        if (lo >= hi) continue;",
        f"        const long long first = ylo * {d.w}LL + lo, last = (yhi - 1) * {d.w}LL + hi, at = shift * {d.w}LL + off;",
        "        const unsigned int* __restrict__ keep = sx_keep[j];",
        f"        if (lo == 0 && hi == {d.w}LL) for (long long t = first; t < last; ++t) acc[t] += col[t + at];",
        "        else for (long long t = first; t < last; ++t) acc[t] += sx_bits_float(sx_float_bits(col[t + at]) & keep[t]);",
        "      }", "    }",
        f"    for (long long t = 0; t < {cells}LL; ++t) out0[r * {cells}LL + t] = {to_storage('acc[t]', node.type.dtype)};"]
    return rows_kernel(kernel, d.n * d.c, body, COL2IM_RUNS, before)


def grad_rows_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """g[n, o, :] copied to row r = o * N + n of [O, N, OH*OW]."""
    cells = d.oh * d.ow
    body = [f"    const long long n = r % {d.n}LL, o = r / {d.n}LL;",
            f"    for (long long l = 0; l < {cells}LL; ++l) out0[r * {cells}LL + l] = in0[(n * {d.o}LL + o) * {cells}LL + l];"]
    return rows_kernel(kernel, d.o * d.n, body)



def weight_sum_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """dW[g, :, kk] for row r = g * K + kk of the images' products: the row's Og sums on the
    stack, each image's row added in turn (image order, as each CUDA thread adds), then
    stored down dW's column."""
    images = kernel.params[0].shape[0] // (d.groups * d.k * d.og)
    each = d.groups * d.k * d.og
    body = [f"    const long long kk = r % {d.k}LL, g = r / {d.k}LL;",
            f"    const float* __restrict__ row = in0 + r * {d.og}LL;",
            f"    float acc[{d.og}];",
            f"    for (long long o = 0; o < {d.og}LL; ++o) acc[o] = row[o];",
            f"    for (long long i = 1; i < {images}LL; ++i) for (long long o = 0; o < {d.og}LL; ++o) acc[o] += row[i * {each}LL + o];",
            f"    for (long long o = 0; o < {d.og}LL; ++o) out0[(g * {d.og}LL + o) * {d.k}LL + kk] = {to_storage('acc[o]', node.type.dtype)};"]
    return rows_kernel(kernel, d.groups * d.k, body, "a row of the products per item (one kernel cell of a group), its sums on the stack, each image's row added in turn")


ConvRows = Callable[[Node, Program, ImageLaunch, KernelSource], HostKernel]
CONV_ROWS: dict[str, ConvRows] = {"sx_im2col": im2col_rows, "sx_col2im": col2im_rows, "sx_conv_grad_rows": grad_rows_rows,
                                  "sx_conv_weight_sum": weight_sum_rows}


@register_emitter(ConvStep, platform=PLATFORM)
def conv_host(step: ConvStep, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    d = step.shape(program.types())
    return [CONV_ROWS[prefix(k)](step.node, program, d, k) if prefix(k) in CONV_ROWS else thread_kernel(k) for k in kernels]


# -- max-pools -------------------------------------------------------------------------------------
def window_rows(d: ImageLaunch, indent: str) -> tuple[list[str], list[str]]:
    """For output row (nc, p): the loop over the window's offsets k in window order, skipping
    an offset whose input row is padding, with `src` that input row and [lo, hi) the outputs q
    whose cell (at src[q * SW + off]) is inside the input; and its end."""
    head = [f"{indent}for (int k = 0; k < {d.kh * d.kw}; ++k) {{",
            f"{indent}  const long long y = p * {d.sh}LL + k / {d.kw} - {d.ph}LL;",
            f"{indent}  if (y < 0 || y >= {d.h}LL) continue;",
            f"{indent}  const long long base = (nc * {d.h}LL + y) * {d.w}LL;",
            *[indent + line[4:] for line in first_inside(f"(long long)(k % {d.kw}) - {d.pw}LL", d.sw, d.ow, d.w)]]
    return head, [f"{indent}}}"]


def pool_out_coords(d: ImageLaunch) -> str:
    return f"    const long long p = r % {d.oh}LL, nc = r / {d.oh}LL;"


def max_pool_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """Each output's maximum over its window's real cells in window order (NaN-propagating)."""
    dtype = node.type.dtype
    if not d.padded:
        return unpadded_max_pool_rows(node, program, d, kernel, False)
    head, tail = window_rows(d, "    ")
    body = [pool_out_coords(d), f"    float peak[{d.ow}];", f"    for (long long q = 0; q < {d.ow}LL; ++q) peak[q] = -sx_inf();", *head,
            f"      for (long long q = lo; q < hi; ++q) peak[q] = sx_maxf(peak[q], {from_storage(f'in0[base + q * {d.sw}LL + off]', dtype)});",
            *tail, f"    for (long long q = 0; q < {d.ow}LL; ++q) out0[r * {d.ow}LL + q] = {to_storage('peak[q]', dtype)};"]
    return rows_kernel(kernel, d.n * d.c * d.oh, body)


def max_pool_index_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """Each window's first maximum in window order (the first NaN, else the first real cell
    equal to the maximum; an all -inf window its first real cell), as `argmax_lines` finds it."""
    if not d.padded:
        return unpadded_max_pool_rows(node, program, d, kernel, True)
    value = from_storage(f"in0[base + q * {d.sw}LL + off]", program.types()[node.args[0]].dtype)
    head, tail = window_rows(d, "    ")
    body = [pool_out_coords(d), f"    float peak[{d.ow}]; int first_real[{d.ow}], first_nan[{d.ow}], at[{d.ow}]; unsigned char found[{d.ow}];",
            f"    for (long long q = 0; q < {d.ow}LL; ++q) {{ peak[q] = -sx_inf(); first_real[q] = -1; first_nan[q] = -1; }}", *head,
            "      for (long long q = lo; q < hi; ++q) {",
            f"        const float v = {value};",
            "        if (first_real[q] < 0) first_real[q] = k;", "        if (v != v && first_nan[q] < 0) first_nan[q] = k;",
            "        peak[q] = sx_maxf(peak[q], v);", "      }", *tail,
            f"    for (long long q = 0; q < {d.ow}LL; ++q) {{ at[q] = first_nan[q] >= 0 ? first_nan[q] : first_real[q]; found[q] = !(first_nan[q] < 0 && peak[q] != -sx_inf()); }}",
            *head, f"      for (long long q = lo; q < hi; ++q) if (!found[q] && {value} == peak[q]) {{ at[q] = k; found[q] = 1; }}", *tail,
            f"    for (long long q = 0; q < {d.ow}LL; ++q) out0[r * {d.ow}LL + q] = at[q];"]
    return rows_kernel(kernel, d.n * d.c * d.oh, body)


def unpadded_max_pool_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource, index: bool) -> HostKernel:
    """max_pool_rows (INDEX: max_pool_index_rows) without padding, where every window's cells
    are real: each output's window read once, cell by cell in window order, into `v`, its
    maximum `peak` as sx_maxf folds them from -inf; its index the first cell that is NaN or
    equal to the peak (a NaN makes the peak NaN, which equals nothing: the first NaN; else
    the first maximum, and of an all -inf window its first cell)."""
    dtype = program.types()[node.args[0]].dtype
    result = [*first_maximum(d), f"      out0[r * {d.ow}LL + q] = at;"] if index else [f"      out0[r * {d.ow}LL + q] = {to_storage('peak', dtype)};"]
    return window_loop(d, dtype, kernel, result)


def first_maximum(d: ImageLaunch) -> list[str]:
    """`at`: the first of a window's cells `vK` that is NaN or equal to its `peak` (0 where
    none is, which cannot be: the peak is a cell, or NaN with a NaN cell), chosen without a
    branch so that the row's loop over its windows vectorizes."""
    cells = d.kh * d.kw
    marks = ", ".join(f"m{k} = SX_UNORDERED(v{k}, v{k}) ? 1 : v{k} == peak" for k in range(cells))
    return [f"      const int {marks};", f"      const int at = {' : '.join(f'm{k} ? {k}' for k in range(cells))} : 0;"]


def tile_grad_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """sx_max_pool_tiled_grad over rows of windows: each window read once (as in
    unpadded_max_pool_rows), its first maximum's cell given 0 + the window's gradient and its
    other cells 0."""
    dtype, g_dtype = node.type.dtype, program.types()[node.args[1]].dtype
    gradient, zero = to_storage("gradient", dtype), to_storage("0.0f", dtype)
    result = [*first_maximum(d), f"      const float gradient = 0.0f + {from_storage(f'in1[r * {d.ow}LL + q]', g_dtype)};",
              *(f"      out0[(nc * {d.h}LL + p * {d.kh}LL + {k // d.kw}LL) * {d.w}LL + q * {d.kw}LL + {k % d.kw}LL] = at == {k} ? {gradient} : {zero};"
                for k in range(d.kh * d.kw))]
    return window_loop(d, program.types()[node.args[0]].dtype, kernel, result, TILED_WINDOWS)


def window_loop(d: ImageLaunch, dtype: DType, kernel: KernelSource, result: list[str], schedule: str = "") -> HostKernel:
    """Over rows of unpadded windows: each window's cells read once into `v0`, `v1`, ...
    (window order) and folded into `peak`, then RESULT. The loop over a row's windows is kept
    a loop (GCC would unroll a short one whole, and then not vectorize it), and with the cells
    named one by one it has no branch: the compiler vectorizes it."""
    cells = d.kh * d.kw
    store = c_types(dtype)[0]
    reads = ", ".join(f"v{k} = {from_storage(f'cell[{(k // d.kw) * d.w + k % d.kw}LL]', dtype)}" for k in range(cells))
    body = [pool_out_coords(d),
            f"    const {store}* __restrict__ rows = in0 + (nc * {d.h}LL + p * {d.sh}LL) * {d.w}LL;",
            "    #pragma GCC unroll 1",
            f"    for (long long q = 0; q < {d.ow}LL; ++q) {{",
            f"      const {store}* __restrict__ cell = rows + q * {d.sw}LL;",
            f"      const float {reads};",
            "      float peak = -sx_inf();",
            "      " + " ".join(f"peak = sx_maxf(peak, v{k});" for k in range(cells)),
            *result, "    }"]
    return rows_kernel(kernel, d.n * d.c * d.oh, body, schedule or WINDOWS_ONCE)


def max_pool_grad_rows(node: Node, program: Program, d: ImageLaunch, kernel: KernelSource) -> HostKernel:
    """gx[nc, y, :] = 0 + the gradients of the windows whose first maximum each cell is, the
    windows in kernel-offset order."""
    g_dtype = program.types()[node.args[1]].dtype
    if d.sh >= d.kh and d.sw >= d.kw:
        return disjoint_max_pool_grad_rows(node, d, kernel, g_dtype)
    body = [f"    const long long y = r % {d.h}LL, nc = r / {d.h}LL;", f"    float acc[{d.w}];", f"    for (long long x = 0; x < {d.w}LL; ++x) acc[x] = 0.0f;",
            f"    for (int k = 0; k < {d.kh * d.kw}; ++k) {{",
            f"      const long long py = y + {d.ph}LL - k / {d.kw};",
            f"      if (py < 0 || py % {d.sh}LL != 0 || py / {d.sh}LL >= {d.oh}LL) continue;",
            f"      const long long windows = (nc * {d.oh}LL + py / {d.sh}LL) * {d.ow}LL, off = {d.pw}LL - k % {d.kw};",
            f"      for (long long x = 0; x < {d.w}LL; ++x) {{",
            "        const long long px = x + off;",
            f"        if (px < 0 || px % {d.sw}LL != 0 || px / {d.sw}LL >= {d.ow}LL) continue;",
            f"        const long long window = windows + px / {d.sw}LL;",
            f"        if (index[window] == k) acc[x] += {from_storage('in0[window]', g_dtype)};",
            "      }", "    }",
            f"    for (long long x = 0; x < {d.w}LL; ++x) out0[r * {d.w}LL + x] = {to_storage('acc[x]', node.type.dtype)};"]
    return rows_kernel(kernel, d.n * d.c * d.h, body)


def disjoint_max_pool_grad_rows(node: Node, d: ImageLaunch, kernel: KernelSource, g_dtype: DType) -> HostKernel:
    """max_pool_grad_rows where no two windows share a cell (strides no smaller than the
    kernel): a cell's one window, found by division, gives it 0 + its gradient or 0, which is
    what adding the windows that chose it from 0 comes to."""
    gradient = from_storage("in0[windows + q]", g_dtype)
    body = [f"    const long long y = r % {d.h}LL, nc = r / {d.h}LL, py = y + {d.ph}LL;",
            f"    {c_types(node.type.dtype)[0]}* __restrict__ row = out0 + r * {d.w}LL;",
            f"    const long long i = py % {d.sh}LL, p = py / {d.sh}LL;",
            f"    if (i >= {d.kh}LL || p >= {d.oh}LL) {{ for (long long x = 0; x < {d.w}LL; ++x) row[x] = {to_storage('0.0f', node.type.dtype)}; continue; }}",
            f"    const long long windows = (nc * {d.oh}LL + p) * {d.ow}LL;",
            f"    for (long long x = 0; x < {d.w}LL; ++x) {{",
            f"      const long long px = x + {d.pw}LL, j = px % {d.sw}LL, q = px / {d.sw}LL;",
            f"      const bool chosen = j < {d.kw}LL && q < {d.ow}LL && index[windows + q] == (int)(i * {d.kw}LL + j);",
            f"      row[x] = {to_storage(f'chosen ? 0.0f + {gradient} : 0.0f', node.type.dtype)};",
            "    }"]
    return rows_kernel(kernel, d.n * d.c * d.h, body)


PoolRows = Callable[[Node, Program, ImageLaunch, KernelSource], HostKernel]
POOL_ROWS: dict[str, PoolRows] = {"sx_max_pool": max_pool_rows, "sx_max_pool_index": max_pool_index_rows, "sx_max_pool_grad": max_pool_grad_rows,
                                   "sx_max_pool_tiled_grad": tile_grad_rows}


@register_emitter(PoolStep, platform=PLATFORM)
def pool_host(step: PoolStep, program: Program, constants: dict[int, Node], kernels: list[KernelSource], math: str) -> list[HostKernel]:
    d = step.shape(program.types())
    return [POOL_ROWS[prefix(k)](step.node, program, d, k) if prefix(k) in POOL_ROWS else thread_kernel(k) for k in kernels]

