"""Forward values and gradients of every differentiable op against PyTorch (CPU, f32): the
same inputs and the same cotangent, torch autograd as the oracle. |ours - torch| <=
1e-5 * max(1, |torch|) elementwise.

Uses the case tables of test_ops.py; an op with a gradient rule and no torch mapping here
fails `test_every_differentiable_op_has_a_torch_mapping`.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from sexpgpu.ir.ops import all_ops  # noqa: E402
from test_ops import GRAD_CASES, Arg, Case, D, F, I, build_grad_program, draw_feeds  # noqa: E402

RTOL = 1e-5
Tensors = list[Any]
TorchFn = Callable[[Tensors, dict[str, Any]], Any]


def _axes(attrs: dict[str, Any], rank: int) -> tuple[int, ...]:
    axis = attrs.get("axis")
    if axis is None:
        return tuple(range(rank))
    return tuple(a % rank for a in ([axis] if isinstance(axis, int) else axis))


def _reduce(fn: Callable[..., Any]) -> TorchFn:
    def run(xs: Tensors, attrs: dict[str, Any]) -> Any:
        x = xs[0]
        axes = _axes(attrs, x.dim())
        if not axes:  # torch reads an empty dim list as "every axis"; ours reduces none
            return x * 1
        return fn(x, dim=axes, keepdim=bool(attrs.get("keepdims", False)))

    return run


def _window(attrs: dict[str, Any]) -> tuple[slice, ...]:
    return tuple(slice(lo, hi) for lo, hi in zip(attrs["starts"], attrs["stops"]))


def _unslice(xs: Tensors, attrs: dict[str, Any]) -> Any:
    out = torch.zeros(attrs["shape"], dtype=xs[0].dtype)
    out[_window(attrs)] = xs[0]
    return out


def _take(xs: Tensors, attrs: dict[str, Any]) -> Any:
    x, idx = xs
    axis = attrs.get("axis", 0) % x.dim()
    return x[(slice(None),) * axis + (idx.long(),)]


def _scatter_add(xs: Tensors, attrs: dict[str, Any]) -> Any:
    g, idx = xs
    shape = list(attrs["shape"])
    axis = attrs.get("axis", 0) % len(shape)
    rows = g.reshape(shape[:axis] + [idx.numel()] + shape[axis + 1 :])
    return torch.zeros(shape, dtype=g.dtype).index_add(axis, idx.reshape(-1).long(), rows)


def _cast(xs: Tensors, attrs: dict[str, Any]) -> Any:
    return xs[0].to({"f32": torch.float32, "f64": torch.float64}[attrs["dtype"]])


def _conv_options(attrs: dict[str, Any]) -> dict[str, Any]:
    return {"stride": attrs.get("stride", 1), "padding": attrs.get("padding", 0), "dilation": attrs.get("dilation", 1), "groups": attrs.get("groups", 1)}


def _pool_options(attrs: dict[str, Any]) -> dict[str, Any]:
    stride = attrs.get("stride")
    return {"kernel_size": attrs["kernel"], "stride": attrs["kernel"] if stride is None else stride, "padding": attrs.get("padding", 0)}


def _vjp(fn: Callable[[Any], Any], shape: list[int], g: Any) -> Any:
    """The gradient of FN at zeros of SHAPE with cotangent G, itself differentiable (FN is
    linear, so the point does not matter)."""
    x = torch.zeros(shape, dtype=g.dtype, requires_grad=True)
    return torch.autograd.grad(fn(x), x, g, create_graph=True)[0]


def _max_pool_select(xs: Tensors, attrs: dict[str, Any]) -> Any:
    x, h = xs
    y, index = torch.nn.functional.max_pool2d(x.detach(), return_indices=True, **_pool_options(attrs))
    return h.flatten(2).gather(2, index.flatten(2)).reshape(y.shape)


def _max_pool_grad(xs: Tensors, attrs: dict[str, Any]) -> Any:
    x, g = xs
    leaf = x.detach().requires_grad_(True)
    return torch.autograd.grad(torch.nn.functional.max_pool2d(leaf, **_pool_options(attrs)), leaf, g, create_graph=True)[0]


IMAGES: dict[str, TorchFn] = {
    "conv2d": lambda xs, a: torch.nn.functional.conv2d(xs[0], xs[1], **_conv_options(a)),
    "conv2d_input_grad": lambda xs, a: torch.nn.grad.conv2d_input(a["input_shape"], xs[1], xs[0], **_conv_options(a)),
    "conv2d_weight_grad": lambda xs, a: torch.nn.grad.conv2d_weight(xs[0], a["weight_shape"], xs[1], **_conv_options(a)),
    "max_pool2d": lambda xs, a: torch.nn.functional.max_pool2d(xs[0], **_pool_options(a)),
    "max_pool2d_grad": _max_pool_grad,
    "max_pool2d_select": _max_pool_select,
    "avg_pool2d": lambda xs, a: torch.nn.functional.avg_pool2d(xs[0], **_pool_options(a)),
    "avg_pool2d_grad": lambda xs, a: _vjp(lambda z: torch.nn.functional.avg_pool2d(z, **_pool_options(a)), a["input_shape"], xs[0]),
}

TORCH: dict[str, TorchFn] = {
    "neg": lambda xs, a: torch.neg(xs[0]),
    "abs": lambda xs, a: torch.abs(xs[0]),
    "exp": lambda xs, a: torch.exp(xs[0]),
    "log": lambda xs, a: torch.log(xs[0]),
    "log1p": lambda xs, a: torch.log1p(xs[0]),
    "sqrt": lambda xs, a: torch.sqrt(xs[0]),
    "rsqrt": lambda xs, a: torch.rsqrt(xs[0]),
    "square": lambda xs, a: torch.square(xs[0]),
    "tanh": lambda xs, a: torch.tanh(xs[0]),
    "sigmoid": lambda xs, a: torch.sigmoid(xs[0]),
    "relu": lambda xs, a: torch.relu(xs[0]),
    "sin": lambda xs, a: torch.sin(xs[0]),
    "cos": lambda xs, a: torch.cos(xs[0]),
    "cast": _cast,
    "add": lambda xs, a: torch.add(xs[0], xs[1]),
    "sub": lambda xs, a: torch.sub(xs[0], xs[1]),
    "mul": lambda xs, a: torch.mul(xs[0], xs[1]),
    "div": lambda xs, a: torch.div(xs[0], xs[1]),
    "pow": lambda xs, a: torch.pow(xs[0], xs[1]),
    "maximum": lambda xs, a: torch.maximum(xs[0], xs[1]),
    "minimum": lambda xs, a: torch.minimum(xs[0], xs[1]),
    "where": lambda xs, a: torch.where(xs[0], xs[1], xs[2]),
    "sum": _reduce(torch.sum),
    "softmax": lambda xs, a: torch.softmax(xs[0], dim=a.get("axis", -1)),
    "log_softmax": lambda xs, a: torch.log_softmax(xs[0], dim=a.get("axis", -1)),
    "layer_norm": lambda xs, a: torch.nn.functional.layer_norm(xs[0], (xs[0].shape[-1],), eps=a["eps"]),
    "rms_norm": lambda xs, a: torch.nn.functional.rms_norm(xs[0], (xs[0].shape[-1],), eps=a["eps"]),
    "mean": _reduce(torch.mean),
    "max": _reduce(torch.amax),
    "min": _reduce(torch.amin),
    "matmul": lambda xs, a: torch.matmul(xs[0], xs[1]),
    "reshape": lambda xs, a: xs[0].reshape(a["shape"]),
    "transpose": lambda xs, a: xs[0].permute(a["perm"]),
    "broadcast_to": lambda xs, a: xs[0].expand(a["shape"]),
    "concat": lambda xs, a: torch.cat(xs, dim=a["axis"]),
    "slice": lambda xs, a: xs[0][_window(a)],
    "unslice": _unslice,
    "take": _take,
    "scatter_add": _scatter_add,
    "attention": lambda xs, a: torch.nn.functional.scaled_dot_product_attention(*(x.transpose(-3, -2) for x in xs), is_causal=a["causal"],
                                                                                 scale=a["scale"]).transpose(-3, -2),
    **IMAGES,
}

# Inputs where the gradient is defined by convention rather than by limits (not
# finite-differenceable, so only here): ties in max/min share the gradient evenly like
# torch.amax; relu and abs at exactly 0 have gradient 0 like torch's.
TIE_CASES: dict[str, list[Case]] = {
    "max": [Case([I([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], "f32")], {"axis": 1}), Case([I([[1.0, 3.0], [3.0, 0.0]], "f32")], {"axis": None})],
    "min": [Case([I([[1.0, 1.0, 3.0], [0.5, 2.0, 0.5]], "f32")], {"axis": [0, 1], "keepdims": True})],
    "relu": [Case([I([-1.0, 0.0, 2.0], "f32")])],
    "abs": [Case([I([-1.0, 0.0, 2.0], "f32")])],
    "pow": [Case([I([0.0, 0.0, 2.0], "f32"), I([2.0, 3.0, 1.5], "f32")])],  # base 0: torch masks the log
    # ties in a window: the first maximum in window order gets the gradient, like torch's CPU kernel
    "max_pool2d": [
        Case([I(np.array([[1.0, 3.0, 3.0, 0.0], [3.0, 2.0, 0.0, 0.0], [5.0, 5.0, 7.0, 7.0], [5.0, 5.0, 7.0, 7.0]]).reshape(1, 1, 4, 4), "f32")], {"kernel": [2, 2]}),
        Case([I(np.array([[2.0, 2.0, 2.0], [2.0, 1.0, 2.0], [0.0, 2.0, 2.0]]).reshape(1, 1, 3, 3), "f32")], {"kernel": [2, 2], "stride": [1, 1], "padding": [1, 1]}),
    ],
}


def test_every_differentiable_op_has_a_torch_mapping() -> None:
    missing = sorted(n for n, d in all_ops().items() if d.grad is not None and n not in TORCH)
    assert not missing, f"ops with a gradient rule but no torch equivalent in TORCH: {missing}"


def _close(ours: np.ndarray, theirs: np.ndarray, what: str) -> None:
    theirs = np.asarray(theirs, dtype=np.float64)
    ours = np.asarray(ours, dtype=np.float64)
    assert ours.shape == theirs.shape, f"{what}: shape {ours.shape}, torch gives {theirs.shape}"
    excess = np.abs(ours - theirs) - RTOL * np.maximum(1.0, np.abs(theirs))
    if np.any(excess > 0) or not np.all(np.isfinite(ours)):
        worst = np.unravel_index(int(np.argmax(excess)), excess.shape) if excess.size else ()
        raise AssertionError(f"{what}: at {worst} ours {ours[worst]!r}, torch {theirs[worst]!r}")


def _check_against_torch(op: str, case: Case, seed: int) -> None:
    rng = np.random.default_rng(seed)
    built = build_grad_program(op, case, "f32")
    feeds = draw_feeds(case, built, rng, "f32")
    ours = built.compiled.run_copy(feeds)
    tensors = []
    for i, name in enumerate(built.names):
        t = torch.from_numpy(feeds[name].copy())
        if case.args[i].differentiable:
            t.requires_grad_(True)
        tensors.append(t)
    y = TORCH[op](tensors, case.resolved_attrs("f32"))
    label = f"{op} {case.label()}"
    _close(ours["y"], y.detach().numpy(), f"{label}: forward")
    y.backward(torch.from_numpy(feeds["v"]))
    for i in built.diff:
        grad = tensors[i].grad
        expected = np.zeros(case.args[i].shape, dtype=np.float32) if grad is None else grad.numpy()
        _close(ours[f"g{i}"], expected, f"{label}: gradient of argument {i}")


@pytest.mark.parametrize("op", sorted(n for n, d in all_ops().items() if d.grad is not None))
def test_forward_and_gradient_match_torch(op: str) -> None:
    assert op in TORCH, f"{op}: no torch mapping"
    cases = GRAD_CASES.get(op)
    assert cases, f"{op} has a gradient rule but no entry in GRAD_CASES"
    for index, case in enumerate(cases):
        _check_against_torch(op, case, zlib.crc32(f"{op}/{index}".encode()))


@pytest.mark.parametrize("op", sorted(TIE_CASES))
def test_conventional_gradients_match_torch(op: str) -> None:
    for index, case in enumerate(TIE_CASES[op]):
        # the tie inputs are exact values, not drawn; they take the float dtype under test
        exact = Case([type(arg)(arg.shape, arg.make, None) for arg in case.args], case.attrs)
        _check_against_torch(op, exact, index)


def _weight(*shape: int) -> Arg:
    """A convolution weight at the usual scale, 1/sqrt(fan-in): with standard normal weights
    the input gradient sums hundreds of O(1) products, and the rounding of both libraries
    (ours is the closer one to f64) exceeds 1e-5 of a result that cancels to O(1)."""
    fan_in = shape[1] * shape[2] * shape[3]
    return Arg(shape, lambda r: r.standard_normal(shape) / np.sqrt(fan_in))


def test_larger_shapes_match_torch() -> None:
    """A few bigger instances, where accumulation order differs between the libraries."""
    for op, case in [
        ("matmul", Case([F(4, 33, 65), F(65, 17)])),
        ("sum", Case([F(16, 300)], {"axis": 1})),
        ("mean", Case([F(8, 64, 32)], {"axis": [0, 2]})),
        ("max", Case([D(12, 50)], {"axis": 0})),
        ("take", Case([F(50, 8), I(np.random.default_rng(1).integers(0, 50, (30, 4)))], {"axis": 0})),
        ("conv2d", Case([F(2, 16, 8, 7), _weight(32, 16, 3, 3)], {"padding": [1, 1]})),  # weight gradient: sums of 112 terms
        ("conv2d", Case([F(2, 32, 9, 9), _weight(32, 8, 3, 3)], {"stride": [2, 2], "padding": [1, 1], "dilation": [1, 1], "groups": 4})),
        ("max_pool2d", Case([D(4, 8, 12, 12)], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})),
        ("avg_pool2d", Case([F(4, 8, 12, 12)], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})),
        ("attention", Case([F(2, 37, 4, 16)] * 3, {"causal": True, "scale": 0.25})),  # the char transformer's heads, an odd length
    ]:
        _check_against_torch(op, case, 7)
