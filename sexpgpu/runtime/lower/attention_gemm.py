"""Attention as batched gemms and a softmax row kernel: the schedule of `attention` and
`attention_grad` when the scores of every head fit the step's scratch (SCORES_BYTES), on
every device (cuBLAS on the GPU, the host BLAS on the CPU: the same calls, the same row
kernels, so both devices compute the same sums in the same order).

Per head (q, k, v [..., S, H, D], a head's rows H * D elements apart, read where they are):

forward   P = q k^T          (a gemm per head into the scratch, [heads, S, S] f32)
          P = softmax(P * scale, causal mask)   (`softmax_kernel`: a thread per row, in place)
          o = P v            (a gemm per head, written into o's rows)

backward  P as the forward made it (the same calls and kernel: the same bits)
          dv = P^T g,  dP = g v^T
          dS = P (dP - g . o) * scale          (`softmax_grad_kernel`: in place of dP)
          dq = dS k,  dk = dS^T q               (into the stacked result's thirds)

The heads are the batch of strided-batched calls: one call per index of the smaller of the
batch and head axes, batched over the larger (a head's rows have one stride along each, not
one along both). Longer sequences, whose scores do not fit, and bf16 keep the tiled kernels
of attention.py, which hold no scores in memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from ...ir.dtypes import DType
from ...ir.graph import Node, Program, TensorType, shape_size
from .blas import BlasCall, Rows, row_major
from .codegen import KernelSource, Param, assemble, literal
from .lowering import KernelLine, Lowered, StepRun
from .steps import NodeStep

SCORES_BYTES = 256 << 20  # the most scratch (the backward's P and dP together) the gemm schedule takes


@dataclass(frozen=True)
class Heads:
    """The attentions of q, k, v [..., S, H, D]: `batch` x `per_position` heads of S x D."""

    batch: int  # the leading axes' product
    per_position: int  # H
    length: int  # S
    width: int  # D
    causal: bool
    scale: float

    @property
    def heads(self) -> int:
        return self.batch * self.per_position

    @property
    def elements(self) -> int:
        return self.heads * self.length * self.width

    @property
    def scores(self) -> int:
        """f32 elements of every head's S x S scores."""
        return self.heads * self.length * self.length


def heads_of(node: Node, types: dict[int, TensorType]) -> Heads:
    shape = types[node.args[0]].shape
    return Heads(shape_size(shape[:-3]), shape[-2], shape[-3], shape[-1], bool(node.attrs["causal"]), float(node.attrs["scale"]))


def uses_gemms(node: Node, types: dict[int, TensorType]) -> bool:
    """Whether attention NODE takes this schedule: f32, and its backward's scores (P and dP)
    within SCORES_BYTES."""
    return types[node.args[0]].dtype == DType.f32 and 2 * 4 * heads_of(node, types).scores <= SCORES_BYTES


# -- the calls: one per index of the outer of (batch, head), batched over the other -------------------------
def per_head(h: Heads, m: int, n: int, k: int, a: str, b: str, c: str, trans_a: bool = False, trans_b: bool = False, c_offset: int = 0) -> list[BlasCall]:
    """Row-major C = op(A) op(B) for every head, where each of A, B, C is "rows" (a head's S x D
    rows in [..., S, H, D]) or "scores" (its S x S block of the scratch)."""
    s, d, hh = h.length, h.width, h.per_position

    def where(kind: str, batch: int, head: int) -> int:
        return batch * s * hh * d + head * d if kind == "rows" else (batch * hh + head) * s * s

    def ld(kind: str) -> int:
        return hh * d if kind == "rows" else s

    heads_inside = h.per_position >= h.batch  # batched over the heads of one batch index, else over the batch
    outer, inner = (h.batch, h.per_position) if heads_inside else (h.per_position, h.batch)
    calls = []
    for o in range(outer):
        def at(kind: str, step: int = 0, o: int = o) -> int:
            return where(kind, o, step) if heads_inside else where(kind, step, o)

        def stride(kind: str) -> int:
            return at(kind, 1) - at(kind, 0) if inner > 1 else 0

        calls.append(row_major(m, n, k, Rows(ld(a), at(a), stride(a)), Rows(ld(b), at(b), stride(b)), Rows(ld(c), c_offset + at(c), stride(c)),
                               trans_a, trans_b, inner, DType.f32, DType.f32))
    return calls


def score_calls(h: Heads) -> list[BlasCall]:
    """P = q k^T per head."""
    return per_head(h, h.length, h.length, h.width, "rows", "rows", "scores", trans_b=True)


# -- the row kernels: a thread per row of the scores ---------------------------------------------------------
def row_head(h: Heads) -> list[str]:
    seen = "i + 1" if h.causal else f"{h.length}LL"
    return [f"    const long long i = r % {h.length}LL, seen = {seen};  /* the row's query, and the keys it sees */"]


def softmax_kernel(h: Heads) -> KernelSource:
    """Each row of the scores P (S per row) as softmax(P * scale) over the keys its query
    sees, zeros past them (causal), in place."""
    s, scale = h.length, literal(h.scale, DType.f32)
    lines = [
        *row_head(h),
        f"    float* const row = p + r * {s}LL;",
        "    float top = -sx_inf();",
        f"    for (long long j = 0; j < seen; ++j) top = sx_maxf(top, row[j] * {scale});",
        "    float sum = 0.0f;",
        f"    for (long long j = 0; j < seen; ++j) {{ const float e = expf(row[j] * {scale} - top); row[j] = e; sum += e; }}",
        "    for (long long j = 0; j < seen; ++j) row[j] = row[j] / sum;",
        f"    for (long long j = seen; j < {s}LL; ++j) row[j] = 0.0f;",
    ]
    rows = h.heads * s
    return assemble("sx_attention_softmax", ["float* __restrict__ p"], "r", lines, [Param("out", -1, DType.f32, (h.scores,))], rows,
                    5 * h.scores, moved=2 * 4 * h.scores)


def softmax_grad_kernel(h: Heads, node: Node) -> KernelSource:
    """dS = P (dP - D) * scale per row, in place of dP (zeros past the keys the row's query
    sees), D = g . o of the row's query (attention_grad's o and g, NODE's fourth and fifth
    arguments)."""
    s, d, scale = h.length, h.width, literal(h.scale, DType.f32)
    stride = h.per_position * d
    lines = [
        *row_head(h),
        f"    const long long head = r / {s}LL;",
        f"    const long long at = (head / {h.per_position}LL) * {s * stride}LL + (head % {h.per_position}LL) * {d}LL + i * {stride}LL;",
        f"    const float* const prow = p + r * {s}LL;",
        f"    float* const drow = dp + r * {s}LL;",
        "    float dsum = 0.0f;",
        f"    for (int e = 0; e < {d}; ++e) dsum += g[at + e] * o[at + e];",
        f"    for (long long j = 0; j < seen; ++j) drow[j] = prow[j] * (drow[j] - dsum) * {scale};",
        f"    for (long long j = seen; j < {s}LL; ++j) drow[j] = 0.0f;",
    ]
    shape = (h.batch, s, h.per_position, d)
    params = [Param("in", -1, DType.f32, (h.scores,)), Param("out", -2, DType.f32, (h.scores,)),
              Param("in", node.args[3], DType.f32, shape), Param("in", node.args[4], DType.f32, shape)]
    return assemble("sx_attention_softmax_grad", ["const float* __restrict__ p", "float* __restrict__ dp", "const float* __restrict__ o",
                                                  "const float* __restrict__ g"], "r", lines, params, h.heads * s, 3 * h.scores + 2 * h.elements,
                    moved=3 * 4 * h.scores + 2 * 4 * h.elements)


def gemm_flops(calls: list[BlasCall]) -> int:
    return sum(c.flops for c in calls)


def gemm_label(calls: list[BlasCall]) -> str:
    first = calls[0]
    return f"{len(calls)} x {first.name} {first.batch}x{first.n}x{first.m}x{first.k}"


# -- the steps ---------------------------------------------------------------------------------------------------
@dataclass
class AttentionGemms(NodeStep):
    """attention: the scores by gemms into the scratch, the softmax kernel, o by gemms."""

    h: Heads
    kind: ClassVar[str] = "attention"

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        return 4 * self.h.scores

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        return [softmax_kernel(self.h)]

    def calls(self, h: Heads) -> tuple[list[BlasCall], list[BlasCall]]:
        """The scores' calls and o's."""
        return score_calls(h), per_head(h, h.length, h.width, h.length, "scores", "rows", "rows")

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        h = self.h
        q, k, v = (run.contiguous(a) for a in self.node.args)
        out = run.buffer(self.node.id)
        p = run.scratch(np.float32, h.scores)
        self.probabilities(run, kernels[0], q, k, p)
        for call in self.calls(h)[1]:
            run.gemm(call, v, p, out)
        run.set(self.node.id, out)

    def probabilities(self, run: StepRun, softmax: KernelSource, q: Any, k: Any, p: Any) -> None:
        """P = softmax(q k^T * scale) into P (the scratch)."""
        for call in score_calls(self.h):  # cuBLAS's first matrix is B (row-major C is its C^T)
            run.gemm(call, k, q, p)
        run.launch(softmax, [p])

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        h = self.h
        scores, values = self.calls(h)
        return self.line(index, lowered, [scores, values], [softmax_kernel(h)], [0, -1, 1],
                         f"the scores q k^T by batched gemms into scratch ({h.heads} x {h.length}x{h.length} f32), a thread per row "
                         "for the softmax, then P v by batched gemms")

    def line(self, index: int, lowered: Lowered, groups: list[list[BlasCall]], kernels: list[KernelSource], order: list[int], how: str) -> KernelLine:
        """The report's line: the launches in ORDER (k >= 0: the calls GROUPS[k]; -1, -2, ..:
        the first, second.. of KERNELS)."""
        types = lowered.program.types()
        calls = [c for group in groups for c in group]
        text = " + ".join(gemm_label(groups[k]) if k >= 0 else kernels[-k - 1].name for k in order)
        return KernelLine(step=index, kind=self.kind, kernel=text, nodes=[lowered.label(n) for n in self.nodes], elements=shape_size(self.node.type.shape),
                          bytes=self.moved_bytes(types) + sum(k.bytes for k in kernels), flops=gemm_flops(calls) + sum(k.flops for k in kernels),
                          launches=len(calls) + len(kernels), cublas=len(calls), how=how)


@dataclass
class AttentionGradGemms(AttentionGemms):
    """attention_grad: P again (the forward's calls and kernel), dv and dP by gemms, the
    softmax gradient kernel, dq and dk by gemms."""

    def scratch_bytes(self, types: dict[int, TensorType]) -> int:
        return 2 * 4 * self.h.scores

    def kernels(self, program: Program, constants: dict[int, Node]) -> list[KernelSource]:
        h = self.h
        return [softmax_kernel(h), softmax_grad_kernel(h, self.node)]

    def grad_calls(self, h: Heads) -> list[list[BlasCall]]:
        """P's, then dv's, dP's, dq's and dk's calls."""
        s, d = h.length, h.width
        return [score_calls(h),
                per_head(h, s, d, s, "scores", "rows", "rows", trans_a=True, c_offset=2 * h.elements),  # dv = P^T g
                per_head(h, s, s, d, "rows", "rows", "scores", trans_b=True),  # dP = g v^T
                per_head(h, s, d, s, "scores", "rows", "rows"),  # dq = dS k
                per_head(h, s, d, s, "scores", "rows", "rows", trans_a=True, c_offset=h.elements)]  # dk = dS^T q

    def launch(self, run: StepRun, kernels: list[KernelSource]) -> None:
        h = self.h
        q, k, v, o, g = (run.contiguous(a) for a in self.node.args)
        out = run.buffer(self.node.id)
        p = run.scratch(np.float32, h.scores)
        dp = run.scratch(np.float32, h.scores, 4 * h.scores)
        _, dv, dps, dq, dk = self.grad_calls(h)
        self.probabilities(run, kernels[0], q, k, p)
        for call in dv:
            run.gemm(call, g, p, out)
        for call in dps:
            run.gemm(call, v, g, dp)
        run.launch(kernels[1], [p, dp, o, g])
        for call in dq:
            run.gemm(call, k, dp, out)
        for call in dk:
            run.gemm(call, q, dp, out)
        run.set(self.node.id, out)

    def describe(self, index: int, lowered: Lowered) -> KernelLine:
        h = self.h
        return self.line(index, lowered, self.grad_calls(h), self.kernels(lowered.program, lowered.constants), [0, -1, 1, 2, -2, 3, 4],
                         f"P recomputed as the forward makes it ({h.heads} x {h.length}x{h.length} f32 scratch), dv = P^T g and dP = g v^T "
                         "by batched gemms, a thread per row for dS, then dq = dS k and dk = dS^T q by batched gemms")
