"""`ir`, `explain` and `diff`: what the compiler made of a file."""

from __future__ import annotations

import argparse
import sys
import textwrap
from typing import Any, Optional

from ..ir.experiment import Experiment
from ..compile.pipeline import CompileResult, compile_file
from ..ir.graph import Program, shape_size
from ..ir.ops import program_flops
from ..lisp.diagnostics import SourceMap
from ..lisp.program import has_errors
from ..runtime.memory import device_memory_plan, host_memory_plan
from ..outcome import Exit
from ..records import dump, dump_json
from .common import existing_file, exit_for, fail_usage, print_diagnostics, print_json
from .flags import add_limit_flags, add_selection_flags, limits_from, selection_from

PROGRAMS = ("forward", "train", "backward", "update")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    i = sub.add_parser("ir")
    i.add_argument("file")
    i.add_argument("--program", default="train", help="forward | train | backward | update | eval:NAME | train@STAGE | curriculum | train:diagnostics | train:diagnostics@STAGE (default train)")
    i.add_argument("--json", action="store_true", help="the machine form")
    add_selection_flags(i)
    add_limit_flags(i)
    i.set_defaults(run=run_ir)

    e = sub.add_parser("explain")
    e.add_argument("file")
    e.add_argument("--json", action="store_true")
    e.add_argument("--cuda", action="store_true", help="the CUDA lowering report: kernels, the IR nodes each fuses, cuBLAS calls, bytes, FLOPs, the arena")
    e.add_argument("--cpu", action="store_true", help="the compiled CPU device: compile each program's kernels (or find them in the disk cache) and say what it cost")
    e.add_argument("--program", action="append", default=None, metavar="NAME", help="with --cuda or --cpu: the programs to report (default train and update)")
    add_selection_flags(e)
    add_limit_flags(e)
    e.set_defaults(run=run_explain)

    d = sub.add_parser("diff")
    d.add_argument("a")
    d.add_argument("b", nargs="?", help="the second file (default: the same file)")
    d.add_argument("--json", action="store_true")
    d.add_argument("--set-b", dest="set_b", action="append", default=[], metavar="KNOB=VALUE", help="--set for the second side only")
    d.add_argument("--variant-b", dest="variant_b", help="--variant for the second side only")
    add_selection_flags(d)
    add_limit_flags(d)
    d.set_defaults(run=run_diff)


def compiled(args: argparse.Namespace, file: str, selection: Any = None) -> tuple[Optional[Experiment], int]:
    path = existing_file(file)
    result: CompileResult = compile_file(path, selection if selection is not None else selection_from(args), limits_from(args), output=sys.stderr.write)
    print_diagnostics(result.diagnostics, result.program.sources if result.program else SourceMap())
    if has_errors(result.diagnostics):
        return None, exit_for(result.diagnostics)
    if result.experiment is None:
        print(f"{file} is not a run file (no defrun): nothing to compile into IR", file=sys.stderr)
        return None, Exit.CHECK_FAILED
    return result.experiment, Exit.OK


def backward_view(train: Program, forward: Program) -> Program:
    """The backward program: the nodes autodiff appended after the forward ones."""
    forward_ids = {n.id for n in forward.nodes}
    nodes = [n for n in train.nodes if n.id not in forward_ids]
    outputs = {k: v for k, v in train.outputs.items() if k.startswith("grad:")}
    return Program(name="backward", inputs=train.inputs, nodes=nodes, outputs=outputs)


def select_program(experiment: Experiment, name: str) -> Program:
    programs = experiment.module.programs
    if name == "backward":
        return backward_view(programs["train"], programs["forward"])
    if name not in programs:
        fail_usage(f"--program {name}: choose one of {', '.join(['backward', *programs])}")
    return programs[name]


def run_ir(args: argparse.Namespace) -> int:
    experiment, code = compiled(args, args.file)
    if experiment is None:
        return code
    program = select_program(experiment, args.program)
    if args.json:
        print(dump_json(program, indent=2).decode())
    else:
        print(program.text())
    return Exit.OK


def explain_document(experiment: Experiment) -> dict[str, Any]:
    programs = experiment.module.programs
    params = [{"path": p.path, "shape": list(p.shape), "dtype": p.dtype.value, "count": shape_size(p.shape), "init": p.init.kind} for p in experiment.params]
    return {
        "file": experiment.file,
        "ir_hash": experiment.ir_hash,
        "knobs": {k.name: k.value for k in experiment.knobs},
        "params": params,
        "param_count": sum(p["count"] for p in params),
        "ties": dict(experiment.ties),
        "groups": [{"name": g.name, "selector": g.selector, "optimizer": g.optimizer or "frozen", "params": g.params, "states": [s.name for s in g.states]} for g in experiment.groups],
        "flops_per_step": {"forward": program_flops(programs["forward"]), "train": program_flops(programs["train"]), "update": program_flops(programs["update"])},
        "memory": host_memory_plan(experiment).model_dump(),
        "run": dump(experiment.run, mode="python"),
        "precision": experiment.run.precision,
        "casts": cast_points(programs["forward"]),
    }


def cast_points(program: Program) -> list[dict[str, Any]]:
    """Where the forward program changes element type (in :bf16 runs: parameters and data
    into bf16, f32 islands in and out), with the source form that staged each cast."""
    types = program.types()
    out = []
    for n in program.nodes:
        if n.op == "cast":
            out.append({"from": types[n.args[0]].dtype.value, "to": n.type.dtype.value, "shape": list(n.type.shape), "loc": n.loc, "path": n.path})
    return out



def _bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


def run_explain(args: argparse.Namespace) -> int:
    experiment, code = compiled(args, args.file)
    if experiment is None:
        return code
    doc = explain_document(experiment)
    cuda = cuda_document(experiment, args.program or ["train", "update"]) if args.cuda else None
    if cuda is not None:
        doc["cuda"] = cuda
    cpu = cpu_document(experiment, args.program or ["train", "update"]) if args.cpu else None
    if cpu is not None:
        doc["cpu"] = cpu
    if args.json:
        print_json(doc)
        return Exit.OK
    out = [f"{doc['file']}  (IR {doc['ir_hash'][:12]})", "", "knobs"]
    out += [f"  {k} = {v}" for k, v in doc["knobs"].items()] or ["  (none)"]
    out += ["", f"parameters: {doc['param_count']:,}"]
    width = max((len(p["path"]) for p in doc["params"]), default=10)
    for p in doc["params"]:
        out.append(f"  {p['path']:<{width}}  {p['dtype']}[{','.join(map(str, p['shape']))}]  {p['count']:>10,}  {p['init']}")
    for place, source in doc["ties"].items():
        out.append(f"  {place} is tied to {source}")
    out += ["", "optimizer groups"]
    for g in doc["groups"]:
        out.append(f"  {g['name']} \"{g['selector']}\" -> {g['optimizer']}: {len(g['params'])} parameter(s)" + (f", state {', '.join(g['states'])}" if g["states"] else ""))
    float_casts = [c for c in doc["casts"] if c["from"] in ("f32", "bf16", "f16") and c["to"] in ("f32", "bf16", "f16")]
    if doc["precision"] != "f32" or float_casts:
        out += ["", f"precision {doc['precision']}: {len(float_casts)} float cast(s) in the forward program"]
        for c in float_casts[:40]:
            out.append(f"  {c['from']} -> {c['to']} {c['shape']}  {c['loc'] or ''} {c['path'] or ''}".rstrip())
        if len(float_casts) > 40:
            out.append(f"  ... {len(float_casts) - 40} more (sexpgpu explain --json lists them all)")
    f = doc["flops_per_step"]
    out += ["", f"FLOPs per step: {f['train'] + f['update']:,} (forward {f['forward']:,}, forward+backward {f['train']:,}, update {f['update']:,})"]
    m = doc["memory"]
    out += ["", "memory plan (cpu)"]
    for key in ("params", "grads", "optimizer_state", "activations_peak", "update_peak", "total"):
        out.append(f"  {key.replace('_', ' '):<18} {_bytes(m[key]):>12}")
    if cuda is not None:
        out += cuda_text(cuda)
    if cpu is not None:
        out += cpu_text(cpu)
    print("\n".join(out))
    return Exit.OK


def cuda_document(experiment: Experiment, names: list[str]) -> dict[str, Any]:
    """The CUDA lowering of the selected programs and the device memory plan (no GPU needed);
    a program the lowering cannot express is `{"error": why}` and leaves the plan out."""
    from ..runtime.backend import DeviceError
    from ..runtime.lower.plan import report

    programs: dict[str, Any] = {}
    for name in names:
        try:
            programs[name] = report(select_program(experiment, name)).model_dump()
        except DeviceError as exc:
            programs[name] = {"error": str(exc)}
    arenas = {name: programs[name]["arena"]["size"] for name in names if name in experiment.module.programs and "arena" in programs[name]}
    try:
        memory: Optional[dict[str, Any]] = device_memory_plan(experiment, arenas).model_dump()
    except DeviceError:
        memory = None
    return {"programs": programs, "memory": memory}


def cpu_document(experiment: Experiment, names: list[str]) -> dict[str, Any]:
    """The compiled CPU device's compile cost for the selected programs, compiling them now
    (so a run finds them in the disk cache); without a C compiler, why not."""
    from ..runtime.backend import DeviceError
    from ..runtime.cpu.device import CpuRuntime
    from ..runtime.cpu.toolchain import NoCompiler, open_toolchain

    try:
        toolchain = open_toolchain()
    except NoCompiler as exc:
        return {"compiler": None, "error": f"{exc}: --device cpu runs on the NumPy backend"}
    runtime = CpuRuntime(toolchain)
    programs: dict[str, Any] = {}
    for name in names:
        try:
            programs[name] = runtime.compile_cost(select_program(experiment, name))
        except DeviceError as exc:
            programs[name] = {"error": str(exc)}
    return {"compiler": toolchain.describe(), "cache": str(toolchain.cache), "programs": programs}


def cpu_text(cpu: dict[str, Any]) -> list[str]:
    if cpu["compiler"] is None:
        return ["", f"compiled CPU device: {cpu['error']}"]
    out: list[str] = []
    for name, rep in cpu["programs"].items():
        if "error" in rep:
            continue
        # the kernels of explain --cuda, by the same names and step numbers, with the host's schedule
        out += ["", f"CPU kernels: {name}", f"  {'#':>3}  {'kernel':<44} {'items':>10}  schedule"]
        for k in rep["steps"]:
            lines = textwrap.wrap(k["schedule"], 60) or [""]
            out.append(f"  {k['step']:>3}  {k['kernel'][:44]:<44} {k['items']:>10,}  {lines[0]}")
            out += [f"  {'':>3}  {'':<44} {'':>10}  {line}" for line in lines[1:]]
    out += ["", f"compiled CPU device: kernels compiled by {cpu['compiler']}, cached in {cpu['cache']}"]
    for name, rep in cpu["programs"].items():
        if "error" in rep:
            out.append(f"  {name:<10} cannot run on the compiled CPU device: {rep['error']}")
        elif rep["cached"]:
            out.append(f"  {name:<10} {rep['kernels']:>4} kernels: from the disk cache (0 s)")
        else:
            out.append(f"  {name:<10} {rep['kernels']:>4} kernels: compiled in {rep['seconds']:.2f} s, paid once (now in the disk cache)")
    return out


def cuda_text(cuda: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for name, rep in cuda["programs"].items():
        if "error" in rep:
            out += ["", f"CUDA lowering: {name}  cannot run on the CUDA device: {rep['error']}"]
            continue
        cublas = sum(k["cublas"] for k in rep["kernels"])
        out += ["", f"CUDA lowering: {name}  ({rep['launches']} launches: {rep['launches'] - cublas} generated kernels, {cublas} cuBLAS calls; "
                f"{_bytes(rep['total_bytes'])} moved, {rep['total_flops']:,} FLOPs)"]
        out += [f"  warning: %{k['nodes'][0].split()[0][1:]} {k['warning']}" for k in rep["kernels"] if k["warning"]]
        out.append(f"  {'#':>3}  {'kernel':<44} {'elements':>10} {'bytes':>10} {'FLOPs':>12}  IR nodes")
        for k in rep["kernels"]:
            if k["kind"] == "view":
                continue
            # the kernel's name, then (below it) the next launches' and who computes what
            names = k["kernel"].split(" + ")
            column = [names[0]] + [f"+ {n}" for n in names[1:]] + (textwrap.wrap(f"({k['how']})", 44) if k.get("how") else [])
            nodes = k["nodes"]
            out.append(f"  {k['step']:>3}  {column[0][:44]:<44} {k['elements']:>10,} {k['bytes']:>10,} {k['flops']:>12,}  {nodes[0]}")
            for i in range(1, max(len(nodes), len(column))):
                left = column[i][:44] if i < len(column) else ""
                out.append(f"  {'':>3}  {left:<44} {'':>10} {'':>10} {'':>12}  {nodes[i] if i < len(nodes) else ''}".rstrip())
        arena = rep["arena"]
        out.append(f"  arena: {_bytes(arena['size'])} ({len(arena['buffers'])} buffers by liveness; peak live {_bytes(arena['peak_live'])})")
    m = cuda["memory"]
    if m is None:
        return out
    out += ["", "memory plan (cuda)", f"  {'params':<18} {_bytes(m['params']):>12}", f"  {'optimizer state':<18} {_bytes(m['optimizer_state']):>12}"]
    for name, size in m["arenas"].items():
        out.append(f"  {('arena ' + name):<18} {_bytes(size):>12}")
    if m["gradient_accumulator"]:
        out.append(f"  {'grad accumulator':<18} {_bytes(m['gradient_accumulator']):>12}")
    if m.get("allreduce_buckets"):
        out.append(f"  {'all-reduce buckets':<18} {_bytes(m['allreduce_buckets']):>12}")
    out.append(f"  {'total':<18} {_bytes(m['total']):>12}")
    return out


def run_diff(args: argparse.Namespace) -> int:
    first, code = compiled(args, args.a)
    if first is None:
        return code
    second_args = argparse.Namespace(**vars(args))
    second_args.set_values = list(args.set_values) + list(args.set_b)
    if args.variant_b:
        second_args.variant = args.variant_b
    second, code = compiled(second_args, args.b or args.a, selection_from(second_args))
    if second is None:
        return code
    a, b = explain_document(first), explain_document(second)
    changes = diff_documents(a, b, first, second)
    if args.json:
        print_json(changes)
    else:
        if not any(changes.values()):
            print("no differences")
        for section, items in changes.items():
            if items:
                print(section)
                for item in items:
                    print(f"  {item}")
    return Exit.OK


def diff_documents(a: dict[str, Any], b: dict[str, Any], ea: Experiment, eb: Experiment) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"knobs": [], "parameters": [], "groups": [], "run": [], "loaders": [], "ir": [], "flops": [], "memory": []}
    for key in sorted(set(a["run"]) | set(b["run"])):
        if a["run"].get(key) != b["run"].get(key):
            out["run"].append(f"{key}: {as_lisp(a['run'].get(key))} -> {as_lisp(b['run'].get(key))}")
    for name in sorted(set(ea.loaders) | set(eb.loaders)):
        la = dump(ea.loaders[name], exclude={"base_dir", "root"}) if name in ea.loaders else None
        lb = dump(eb.loaders[name], exclude={"base_dir", "root"}) if name in eb.loaders else None
        if la is None or lb is None:
            out["loaders"].append(f"{name}: {'added' if lb else 'removed'}")
        elif la != lb:
            for key in sorted(k for k in set(la) | set(lb) if la.get(k) != lb.get(k)):
                out["loaders"].append(f"{name} {key}: {as_lisp(la.get(key))} -> {as_lisp(lb.get(key))}")
    for k in sorted(set(a["knobs"]) | set(b["knobs"])):
        if a["knobs"].get(k) != b["knobs"].get(k):
            out["knobs"].append(f"{k}: {as_lisp(a['knobs'].get(k))} -> {as_lisp(b['knobs'].get(k))}")
    pa = {p["path"]: p for p in a["params"]}
    pb = {p["path"]: p for p in b["params"]}
    for path in sorted(set(pa) | set(pb)):
        if path not in pb:
            out["parameters"].append(f"- {path} {pa[path]['shape']}")
        elif path not in pa:
            out["parameters"].append(f"+ {path} {pb[path]['shape']}")
        elif pa[path]["shape"] != pb[path]["shape"]:
            out["parameters"].append(f"~ {path} {pa[path]['shape']} -> {pb[path]['shape']}")
    ga = {g["name"]: g for g in a["groups"]}
    gb = {g["name"]: g for g in b["groups"]}
    for name in sorted(set(ga) | set(gb)):
        if ga.get(name) != gb.get(name):
            out["groups"].append(f"{name}: {_group(ga.get(name))} -> {_group(gb.get(name))}")
    for prog in ("forward", "train", "update"):
        ca, cb = _op_counts(ea.module.programs[prog]), _op_counts(eb.module.programs[prog])
        for op in sorted(set(ca) | set(cb)):
            if ca.get(op, 0) != cb.get(op, 0):
                out["ir"].append(f"{prog}: {op} x{ca.get(op, 0)} -> x{cb.get(op, 0)}")
    if ea.ir_hash != eb.ir_hash and not out["ir"]:
        out["ir"].append(f"same ops, different constants or attributes (IR {ea.ir_hash[:12]} -> {eb.ir_hash[:12]})")
    for key in a["flops_per_step"]:
        if a["flops_per_step"][key] != b["flops_per_step"][key]:
            out["flops"].append(f"{key}: {a['flops_per_step'][key]:,} -> {b['flops_per_step'][key]:,}")
    for key in a["memory"]:
        if a["memory"][key] != b["memory"][key]:
            out["memory"].append(f"{key}: {a['memory'][key]:,} -> {b['memory'][key]:,}")
    return out


def as_lisp(value: Any, limit: int = 120) -> str:
    """VALUE as the run file would write it: nil, t, a plist for a record, a list."""
    def text(v: Any) -> str:
        if v is None or v is False:
            return "nil"
        if v is True:
            return "t"
        if isinstance(v, dict):
            return "(" + " ".join(f":{k.replace('_', '-')} {text(x)}" for k, x in v.items()) + ")"
        if isinstance(v, (list, tuple)):
            return "(" + " ".join(text(x) for x in v) + ")"
        if isinstance(v, str):
            return v if v.startswith(":") else f'"{v}"'
        return f"{v:g}" if isinstance(v, float) else str(v)

    shown = text(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def _group(g: Optional[dict[str, Any]]) -> str:
    if g is None:
        return "(none)"
    return f"\"{g['selector']}\" {g['optimizer']} ({len(g['params'])} params)"


def _op_counts(program: Program) -> dict[str, int]:
    counts: dict[str, int] = {}
    for n in program.nodes:
        counts[n.op] = counts.get(n.op, 0) + 1
    return counts
