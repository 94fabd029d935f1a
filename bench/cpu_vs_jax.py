"""Training steps/s on the CPU: SexpGPU's compiled CPU device (`cpu`) against JAX (`jax.jit` of
the whole training step: forward, backward and the optimizer update, with the parameters and
optimizer state donated), the same model, initial parameters, batches (16, taken before the
timing) and optimizer, at 1 and 2 threads. Runs where JAX installs (`pip install "jax[cpu]"`).

XLA sizes its CPU thread pool when JAX starts, so each thread count is one child process
(this script again, `--child N`): its cores limited to N (sched_setaffinity) and XLA told N
(`--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1` for one), and within it
the two sides alternate, several rounds, the median kept. Prints the machine (CPU model, SIMD
flags, the OpenBLAS kernels our device's BLAS ran in each child, JAX's version and devices)
and its cores' f32 FMA peak (bench/cpu_peak.py), then steps/s, cpu / jax (> 1: SexpGPU is
faster) by wall time and by CPU time, each side's GFLOP/s per CPU-second and share of one
core's peak, the first steps' loss gap, our build time, the C compiler's time (with --cold
also from an empty scratch cache) and JAX's setup time (tracing, XLA's compile and the first
steps).

The children inherit the environment; to benchmark the OpenBLAS kernels OpenBLAS picks for the
CPU where the environment pins them, unset both variables for this command alone:

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE python bench/cpu_vs_jax.py [--steps 200] [--repeats 3] [--threads 1,2] [--issue] [--cold] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from cpu_peak import describe, f32_peak, machine, peak, peak_lines
from cpu_workloads import (CHECKED_STEPS, OurSide, Rate, Workload, alternate, blas_warning, chosen, cold_compile_s, gflops, limited, loss_gap, timed,
                           workloads)


def jax_model(model: str, knobs: dict[str, Any]) -> Callable[[dict[str, Any], Any], Any]:
    """tests/torch_reference.py's models in jax.numpy, reading our parameter paths."""
    import jax
    import jax.numpy as jnp

    def linear(P: dict[str, Any], x: Any, prefix: str, bias: bool = True) -> Any:
        y = x @ P[prefix + ".w"]
        return y + P[prefix + ".b"] if bias else y

    def mlp(P: dict[str, Any], x: Any) -> Any:
        count = len([k for k in P if k.startswith("net.layers") and k.endswith(".w")])
        for i in range(count):
            x = linear(P, x, f"net.layers.{i}")
            if i < count - 1:
                x = jax.nn.relu(x)
        return x

    def norm(P: dict[str, Any], x: Any, prefix: str) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * P[prefix + ".weight"] + P[prefix + ".bias"]

    def char_transformer(P: dict[str, Any], tokens: Any) -> Any:
        d, heads, depth, context = knobs["width"], knobs["heads"], knobs["depth"], knobs["context"]
        b, s = tokens.shape
        x = P["model.embed.table"][tokens] + P["model.pos.table"][jnp.arange(context)]
        mask = jnp.tril(jnp.ones((s, s), dtype=bool))
        for i in range(depth):
            p = f"model.blocks.{i}"
            h = norm(P, x, p + ".norm1")
            q, k, v = (linear(P, h, f"{p}.attn.{w}").reshape(b, s, heads, d // heads).transpose(0, 2, 1, 3) for w in ("wq", "wk", "wv"))
            scores = (q @ k.transpose(0, 1, 3, 2)) / (d // heads) ** 0.5
            att = jax.nn.softmax(jnp.where(mask, scores, -1e9), axis=-1)
            x = x + linear(P, (att @ v).transpose(0, 2, 1, 3).reshape(b, s, d), f"{p}.attn.wo")
            h = norm(P, x, p + ".norm2")
            x = x + linear(P, jax.nn.gelu(linear(P, h, f"{p}.mlp.layers.0"), approximate=True), f"{p}.mlp.layers.1")
        return linear(P, norm(P, x, "model.norm"), "model.head", bias=False)

    def cnn(P: dict[str, Any], x: Any) -> Any:
        for layer in ("net.conv1", "net.conv2"):
            x = jax.lax.conv_general_dilated(x, P[layer + ".w"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
            x = jax.nn.relu(x + P[layer + ".b"].reshape(1, -1, 1, 1))
            x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return x.reshape(x.shape[0], -1) @ P["net.head.w"] + P["net.head.b"]

    def vgg(P: dict[str, Any], x: Any) -> Any:
        for layer in ("net.conv1", "net.conv2"):
            x = jax.lax.conv_general_dilated(x, P[layer + ".w"], (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))
            x = jax.nn.relu(x + P[layer + ".b"].reshape(1, -1, 1, 1))
        x = jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")
        return x.reshape(x.shape[0], -1) @ P["net.head.w"] + P["net.head.b"]

    return {"mlp": mlp, "char_transformer": char_transformer, "cnn": cnn, "vgg": vgg}[model]


class JaxSide:
    """One jitted training step (loss, gradients, the optimizer's update), state donated."""

    def __init__(self, workload: Workload, ours: OurSide) -> None:
        import jax
        import jax.numpy as jnp

        experiment = ours.experiment
        knobs = experiment.knob_values()
        forward = jax_model(workload.model, knobs)
        lr = float(knobs.get("lr", 0.01 if "wide" in workload.path.name else 0.1))
        optimizer = experiment.groups[0].optimizer or "sgd"

        def loss_of(P: dict[str, Any], x: Any, y: Any) -> Any:
            logits = forward(P, x)
            logits = logits.reshape(-1, logits.shape[-1])
            return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), y.reshape(-1, 1), axis=-1).mean()

        def step(P: dict[str, Any], S: dict[str, Any], x: Any, y: Any) -> tuple[dict[str, Any], dict[str, Any], Any]:
            loss, g = jax.value_and_grad(loss_of)(P, x, y)
            if optimizer == "sgd":
                return {k: P[k] - lr * g[k] for k in P}, S, loss
            if optimizer == "momentum":
                v = {k: 0.9 * S[k] + g[k] for k in P}
                return {k: P[k] - lr * v[k] for k in P}, v, loss
            t = S["t"] + 1.0
            m = {k: 0.9 * S["m"][k] + 0.1 * g[k] for k in P}
            v = {k: 0.999 * S["v"][k] + 0.001 * g[k] * g[k] for k in P}
            new = {k: P[k] - lr * (m[k] / (1 - 0.9**t)) / (jnp.sqrt(v[k] / (1 - 0.999**t)) + 1e-8) for k in P}
            return new, {"t": t, "m": m, "v": v}, loss

        began = time.perf_counter()
        self.P = {k: jnp.asarray(v) for k, v in ours.initial().items()}
        def zeros() -> dict[str, Any]:
            return {k: jnp.zeros_like(v) for k, v in self.P.items()}

        self.S: Any = {} if optimizer == "sgd" else zeros() if optimizer == "momentum" else {"t": jnp.float32(0.0), "m": zeros(), "v": zeros()}
        fields = [f.name for f in experiment.loaders["train"].fields]
        self.batches = [(jnp.asarray(b[fields[0]]), jnp.asarray(b[fields[1]])) for b in ours.batches]
        self.jitted = jax.jit(step, donate_argnums=(0, 1))
        self.turn = 0
        self.first_losses = [self.step() for _ in range(CHECKED_STEPS)]
        self.setup_s = time.perf_counter() - began

    def step(self) -> float:
        x, y = self.batches[self.turn % len(self.batches)]
        self.turn += 1
        self.P, self.S, loss = self.jitted(self.P, self.S, x, y)
        return float(loss)


def compare(workload: Workload, threads: int, repeats: int) -> dict[str, Any]:
    import jax

    cpu = OurSide(workload, "cpu")
    peer = JaxSide(workload, cpu)

    def ours(count: int) -> Rate:
        cpu.threads(count)
        with limited(count):
            return timed(cpu.step, workload.steps)

    median = alternate({"cpu": ours, "jax": lambda count: timed(peer.step, workload.steps)}, [threads], repeats)
    mine, theirs = median[("cpu", threads)], median[("jax", threads)]
    return {"workload": workload.name, "threads": threads, "step_gflop": cpu.flops / 1e9, "cpu": mine.wall, "jax_steps_per_s": theirs.wall,
            "cpu_per_cpu_s": mine.cpu, "jax_per_cpu_s": theirs.cpu, "ratio": mine.wall / theirs.wall, "ratio_cpu_time": mine.cpu / theirs.cpu,
            "cpu_gflops": gflops(cpu.flops, mine.wall), "jax_gflops": gflops(cpu.flops, theirs.wall),
            "cpu_gflops_per_cpu_s": gflops(cpu.flops, mine.cpu), "jax_gflops_per_cpu_s": gflops(cpu.flops, theirs.cpu),
            "loss_gap": loss_gap(cpu.first_losses, peer.first_losses), "step0_loss": {"cpu": cpu.first_losses[0], "jax": peer.first_losses[0]},
            "cpu_build_s": cpu.build_s, "cpu_compile_s": cpu.compile_s, "cpu_cache_warm": cpu.cache_warm,
            "cpu_setup_s": cpu.setup_s, "jax_setup_s": peer.setup_s, "jax_version": jax.__version__}


def child(threads: int, steps: int, repeats: int, only: str, issue: bool, cold: bool) -> dict[str, Any]:
    import jax

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for workload in workloads(Path(tmp), steps):
            if chosen(workload, only, issue):
                rows.append(compare(workload, threads, repeats))
                if cold:
                    rows[-1]["cpu_cold_compile_s"] = cold_compile_s(workload)
                compiled = f", cold compile {rows[-1]['cpu_cold_compile_s']:.1f} s" if cold else ""
                print(f"done: {workload.name} at {threads} thread(s): cpu/jax {rows[-1]['ratio']:.2f} (by CPU s {rows[-1]['ratio_cpu_time']:.2f})"
                      f"{compiled}", file=sys.stderr, flush=True)
    import jaxlib

    described = machine()  # after the sides ran: our BLAS with the kernels it chose
    described["jax"] = {"version": jax.__version__, "jaxlib": jaxlib.__version__, "devices": [str(d) for d in jax.devices()],
                        "xla_flags": os.environ.get("XLA_FLAGS", "")}
    return {"threads": threads, "machine": described, "load_average": os.getloadavg(), "rows": rows}


def run_child(threads: int, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ)
    flags = "--xla_force_host_platform_device_count=1"
    if threads == 1:
        flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " " + flags).strip()
    env["JAX_PLATFORMS"] = "cpu"
    command = [sys.executable, __file__, "--child", str(threads), "--steps", str(args.steps), "--repeats", str(args.repeats), "--only", args.only]
    done = subprocess.run(command + (["--issue"] if args.issue else []) + (["--cold"] if args.cold else []), env=env, stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the {threads}-thread child failed (exit {done.returncode})")
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="timed steps of the quickstart per sample (the others: a tenth, at least 10)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--only", default="")
    parser.add_argument("--issue", action="store_true", help="only issue 25's four realistic workloads")
    parser.add_argument("--cold", action="store_true", help="also compile each workload's kernels into an empty kernel cache and report the time")
    parser.add_argument("--peak", type=float, default=0.0, help="one core's f32 peak in GFLOP/s (default: measure it, bench/cpu_peak.py)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[: args.child])
        print(json.dumps(child(args.child, args.steps, args.repeats, args.only, args.issue, args.cold)))
        return
    try:
        import jax  # noqa: F401
    except ImportError:
        raise SystemExit("JAX is not installed here: pip install 'jax[cpu]' (this benchmark runs where JAX installs)") from None
    threads = [int(t) for t in args.threads.split(",")]
    peaks = [] if args.peak else peak(tuple(sorted({1, *threads})))
    per_core = args.peak or f32_peak(peaks)
    children = [run_child(t, args) for t in threads]
    rows = [row for c in children for row in c["rows"]]
    if args.json:
        print(json.dumps({"peaks": [asdict(p) for p in peaks], "f32_peak_per_core": per_core, "children": children}, indent=2))
        return
    for c in children:
        print(f"{c['threads']}-thread child: " + " | ".join(describe(c["machine"])) + f" | jax {c['machine']['jax']['version']} "
              f"(jaxlib {c['machine']['jax']['jaxlib']}) on {', '.join(c['machine']['jax']['devices'])}, XLA_FLAGS={c['machine']['jax']['xla_flags']}; "
              f"load average {' '.join(f'{x:.1f}' for x in c['load_average'])} at its end")
    print("\n".join(peak_lines(peaks)))
    warning = blas_warning()
    if warning:
        print(warning)
    print(f"steps/s (wall), the median of the rounds; cpu/jax > 1: SexpGPU is faster; 'by CPU s': the same ratio of steps per CPU-second; "
          f"GF/s: the step's FLOPs x steps per CPU-second (a core's rate while it ran this side; the wall rate is in --json); "
          f"% peak: that over one core's f32 peak ({per_core:.0f} GFLOP/s)")
    print(f"{'workload':<48} {'GFLOP':>6} {'threads':>7} {'cpu':>8} {'jax':>8} {'cpu/jax':>8} {'by CPU s':>8} {'cpu GF/s':>8} {'%peak':>5} "
          f"{'jax GF/s':>8} {'%peak':>5} {'loss gap':>9} {'build s':>7} {'compile s':>9} {'cold compile s':>14} {'jax setup s':>11}")
    for r in rows:
        print(f"{r['workload']:<48} {r['step_gflop']:>6.2f} {r['threads']:>7} {r['cpu']:>8.1f} {r['jax_steps_per_s']:>8.1f} {r['ratio']:>8.2f} "
              f"{r['ratio_cpu_time']:>8.2f} {r['cpu_gflops_per_cpu_s']:>8.1f} {100 * r['cpu_gflops_per_cpu_s'] / per_core:>5.0f} {r['jax_gflops_per_cpu_s']:>8.1f} "
              f"{100 * r['jax_gflops_per_cpu_s'] / per_core:>5.0f} {r['loss_gap']:>9.1e} {r['cpu_build_s']:>7.1f} {r['cpu_compile_s']:>9.1f} "
              f"{r.get('cpu_cold_compile_s', float('nan')):>14.1f} {r['jax_setup_s']:>11.1f}")


if __name__ == "__main__":
    main()
