"""Checkpoints: parameters (f32 masters) and optimizer state as safetensors, the loop's state
as JSON, published by writing MANIFEST.json (every file's sha256) last, then LATEST.

    SLUG/checkpoints/step-000500/{params.safetensors, optim.safetensors, state.json, MANIFEST.json}
    SLUG/checkpoints/LATEST        ("step-000500")

A checkpoint without a MANIFEST, or whose files do not match it, is never loaded; nothing
is ever unpickled. The format does not depend on the number of data-parallel ranks.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timezone
from typing import Any, Callable, NamedTuple, Optional, Union

import numpy as np
from pydantic import BaseModel, Field
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from .data.stream import LoaderState
from ..ir.graph import Module
from .store import NotARegularFile, Store, UnexpectedSize

FORMAT_VERSION = 1
STEP_DIR = re.compile(r"^step-(\d{6,})$")


class ResumeError(Exception):
    """A checkpoint cannot be resumed: it belongs to another run, or it is corrupt (exit 6)."""


class CheckpointState(BaseModel):
    format_version: int = FORMAT_VERSION
    step: int
    slug: str
    source_hash: str
    ir_hash: str
    # what the slug is made from (Experiment.identity_hash); absent in checkpoints written
    # before it was recorded, which resume only into the same source and IR
    identity_hash: Optional[str] = None
    knobs: dict[str, Any] = Field(default_factory=dict)
    loaders: dict[str, LoaderState] = Field(default_factory=dict)  # stream per stage ("" = no stage)
    stage: Optional[str] = None
    ctx: dict[str, float] = Field(default_factory=dict)
    rng_step: int = 0  # random ops are keyed by (seed, step, node): the step is the counter
    guard: dict[str, Any] = Field(default_factory=dict)  # finite-guard counters and lr scale
    eval: dict[str, Any] = Field(default_factory=dict)  # last and best eval metrics
    created: str = Field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"))


class FileEntry(BaseModel):
    sha256: str
    bytes: int


class Manifest(BaseModel):
    format_version: int = FORMAT_VERSION
    step: int
    files: dict[str, FileEntry]


class CheckpointInfo(BaseModel):
    name: str
    step: int
    valid: bool
    reason: str = ""


def step_name(step: int) -> str:
    return f"step-{step:06d}"


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_tensors(arrays: dict[str, np.ndarray]) -> bytes:
    return save_tensors({k: np.ascontiguousarray(v) for k, v in arrays.items()}, metadata={"format": "sexpgpu-1"})


class Written(NamedTuple):
    name: str  # the checkpoint's folder, step-NNNNNN
    bytes: int  # its files' sizes, as MANIFEST.json records them (the manifest itself not counted)


def write_checkpoint(store: Store, slug: str, step: int, params: dict[str, np.ndarray], states: dict[str, np.ndarray], state: CheckpointState,
                     before_publish: Optional[Callable[[Written], None]] = None) -> Written:
    """Write and publish one checkpoint; returns its folder name and size. The MANIFEST is written
    last, so a crash before it leaves a folder that is never loaded (and is replaced the
    next time the same step is written). BEFORE_PUBLISH runs once the files are written, just
    before the MANIFEST (the attempt writes the checkpoint's event then); if it raises, the
    checkpoint is not published."""
    name = step_name(step)
    folder = f"{slug}/checkpoints/{name}"
    store.delete(f"{folder}/MANIFEST.json")
    files = {
        "params.safetensors": encode_tensors(params),
        "optim.safetensors": encode_tensors({k.split(":", 1)[1]: v for k, v in states.items()}),
        "state.json": state.model_dump_json(indent=2).encode(),
    }
    for file, data in files.items():
        store.write_bytes(f"{folder}/{file}", data)
    manifest = Manifest(step=step, files={k: FileEntry(sha256=_digest(v), bytes=len(v)) for k, v in files.items()})
    if before_publish is not None:
        before_publish(Written(name, sum(len(v) for v in files.values())))
    store.write_bytes(f"{folder}/MANIFEST.json", manifest.model_dump_json(indent=2).encode())
    store.write_text(f"{slug}/checkpoints/LATEST", name)
    return Written(name, sum(len(v) for v in files.values()))


def list_checkpoints(store: Store, slug: str, verify: bool = False, expected: Optional["Expected"] = None) -> list[CheckpointInfo]:
    """Every checkpoint folder, oldest first; `valid` says whether it is published (and,
    with verify, whether every file matches its hash and holds what it should)."""
    names = sorted({p.split("/")[2] for p in store.list(f"{slug}/checkpoints") if len(p.split("/")) > 3})
    out = []
    for name in names:
        match = STEP_DIR.match(name)
        if not match:
            continue
        problem = check(store, slug, name, deep=verify, expected=expected)
        out.append(CheckpointInfo(name=name, step=int(match.group(1)), valid=problem is None, reason=problem or ""))
    return out


class Expected(BaseModel):
    """The tensors a checkpoint of a run must hold: parameter path -> shape, and optimizer
    state `PATH:SLOT` -> shape."""

    params: dict[str, tuple[int, ...]]
    states: dict[str, tuple[int, ...]]

    @classmethod
    def of_module(cls, module: Module) -> "Expected":
        """From the run's IR: parameters are the train program's inputs that are not data
        (frozen ones included), optimizer state the update program's `state:` inputs."""
        train, update = module.programs["train"], module.programs["update"]
        params = {i.name: tuple(i.type.shape) for i in train.inputs if not i.name.startswith(("data.", "rng.", "ctx."))}
        states = {i.name.split(":", 1)[1]: tuple(i.type.shape) for i in update.inputs if i.name.startswith("state:")}
        return cls(params=params, states=states)


class CheckpointProblem(Exception):
    """Why a checkpoint cannot be loaded (corrupt, tampered, unpublished, another model)."""


CHECKPOINT_FILES = ("params.safetensors", "optim.safetensors", "state.json")
SMALL_FILE_LIMIT = 16 * 1024 * 1024  # MANIFEST.json, LATEST: a few KiB; anything this large is not one


def read_manifest(store: Store, folder: str) -> Manifest:
    try:
        manifest = Manifest.model_validate_json(store.read_bytes(f"{folder}/MANIFEST.json", limit=SMALL_FILE_LIMIT))
    except FileNotFoundError:
        raise CheckpointProblem("not published (no MANIFEST.json): the write did not finish") from None
    except (NotARegularFile, UnexpectedSize) as exc:
        raise CheckpointProblem(f"MANIFEST.json refused: {exc}") from None
    except ValueError as exc:
        raise CheckpointProblem(f"MANIFEST.json is unreadable ({exc.__class__.__name__})") from None
    if manifest.format_version != FORMAT_VERSION:
        raise CheckpointProblem(f"checkpoint format {manifest.format_version}, this sexpgpu reads {FORMAT_VERSION}")
    unknown = sorted(set(manifest.files) - set(CHECKPOINT_FILES))
    missing = sorted(set(CHECKPOINT_FILES) - set(manifest.files))
    if unknown or missing:
        raise CheckpointProblem(f"MANIFEST.json lists {', '.join(unknown) or 'no'} unknown file(s) and lacks {', '.join(missing) or 'none'}")
    return manifest


def read_files(store: Store, folder: str, manifest: Manifest) -> dict[str, bytes]:
    """Each file the manifest lists, read only if it is a regular file of the size it records,
    and only if its hash matches."""
    files = {}
    for file, entry in manifest.files.items():
        try:
            data = store.read_bytes(f"{folder}/{file}", exactly=entry.bytes)
        except FileNotFoundError:
            raise CheckpointProblem(f"{file} is missing") from None
        except UnexpectedSize as exc:
            raise CheckpointProblem(f"{exc} (truncated or replaced?)") from None
        except NotARegularFile as exc:
            raise CheckpointProblem(str(exc)) from None
        if _digest(data) != entry.sha256:
            raise CheckpointProblem(f"{file} does not match its sha256 in MANIFEST.json (tampered or corrupt)")
        files[file] = data
    return files


def decode(files: dict[str, bytes], expected: Optional[Expected]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], CheckpointState]:
    """The tensors and the loop state, checked for what they must hold."""
    try:
        params = dict(load_tensors(files["params.safetensors"]))
        optim = dict(load_tensors(files["optim.safetensors"]))
    except Exception as exc:  # safetensors' own errors: a malformed header or offsets
        raise CheckpointProblem(f"a tensor file is malformed ({type(exc).__name__}: {exc})") from None
    try:
        state = CheckpointState.model_validate(json.loads(files["state.json"]))
    except ValueError as exc:
        raise CheckpointProblem(f"state.json is malformed ({type(exc).__name__})") from None
    for key, value in optim.items():
        path = key.rsplit(":", 1)[0]
        if path in params and value.shape != params[path].shape:
            raise CheckpointProblem(f"optimizer state {key} has shape {value.shape}, its parameter {params[path].shape}")
    if expected is not None:
        wrong(params, expected.params, "parameter")
        wrong(optim, expected.states, "optimizer state")
    return params, {f"state:{k}": v for k, v in optim.items()}, state


def wrong(tensors: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]], what: str) -> None:
    for name, shape in shapes.items():
        if name not in tensors:
            raise CheckpointProblem(f"it lacks {what} {name}; it belongs to another model")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointProblem(f"{what} {name} has shape {tuple(tensors[name].shape)}, the run's is {shape}")


def open_checkpoint(store: Store, slug: str, name: str, expected: Optional[Expected] = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], CheckpointState]:
    """Parameters, optimizer state ("state:PATH:SLOT" keys) and loop state of a checkpoint,
    or CheckpointProblem. safetensors and JSON only: loading never executes code."""
    folder = f"{slug}/checkpoints/{name}"
    manifest = read_manifest(store, folder)
    params, states, state = decode(read_files(store, folder, manifest), expected)
    match = STEP_DIR.match(name)
    if match is not None and state.step != int(match.group(1)):
        raise CheckpointProblem(f"{store.url_of(folder + '/state.json')} records step {state.step}, but its folder {name} is step {int(match.group(1))} (tampered or corrupt)")
    if manifest.step != state.step:
        raise CheckpointProblem(f"{store.url_of(folder + '/MANIFEST.json')} records step {manifest.step}, but its state.json step {state.step} (tampered or corrupt)")
    return params, states, state


def check(store: Store, slug: str, name: str, deep: bool = True, expected: Optional[Expected] = None) -> Optional[str]:
    """Why the checkpoint cannot be loaded, or None when it can."""
    try:
        if deep:
            open_checkpoint(store, slug, name, expected)
        else:
            read_manifest(store, f"{slug}/checkpoints/{name}")
    except CheckpointProblem as problem:
        return str(problem)
    return None


def latest_named(store: Store, slug: str) -> tuple[str, list[str]]:
    """The folder LATEST names ("" when none), and a warning when what it holds is not one."""
    try:
        named = store.read_text(f"{slug}/checkpoints/LATEST", limit=SMALL_FILE_LIMIT).strip()
    except FileNotFoundError:
        return "", []
    except (NotARegularFile, UnexpectedSize, UnicodeDecodeError) as exc:
        return "", [f"LATEST skipped: {exc}"]
    if named and not STEP_DIR.match(named):
        return "", [f"LATEST skipped: it names {named[:80]!r}, not a checkpoint folder (step-NNNNNN)"]
    return named, []


def resolve(store: Store, slug: str, which: Union[str, int], expected: Optional[Expected] = None) -> tuple[str, list[str]]:
    """The checkpoint to resume: 'latest' falls back to the newest valid one (with a warning
    for each newer one skipped); a step or a folder name must itself be valid."""
    if which == "latest":
        named, warnings = latest_named(store, slug)
        problem = check(store, slug, named, deep=True, expected=expected) if named else None
        if named and problem is None:
            return named, warnings
        if named:
            warnings.append(f"checkpoint {named} (named by LATEST) skipped: {problem}")
        candidates = [c for c in reversed(list_checkpoints(store, slug)) if c.name != named]
        for info in candidates:
            problem = check(store, slug, info.name, deep=True, expected=expected)
            if problem is None:
                return info.name, warnings
            warnings.append(f"checkpoint {info.name} skipped: {problem}")
        raise ResumeError(f"no valid checkpoint in {store.url_of(slug + '/checkpoints')}" + (f" ({'; '.join(warnings)})" if warnings else ""))
    name = step_name(int(which)) if isinstance(which, int) or str(which).isdigit() else str(which).rstrip("/").split("/")[-1]
    if not STEP_DIR.match(name):
        raise ResumeError(f"--resume {which}: name a step (500), a folder (step-000500) or latest")
    known = [c.name for c in list_checkpoints(store, slug)]
    if name not in known:
        raise ResumeError(f"no checkpoint {name} in {store.url_of(slug + '/checkpoints')} (checkpoints: {', '.join(known) or 'none'})")
    problem = check(store, slug, name, deep=True, expected=expected)
    if problem is not None:
        raise ResumeError(f"checkpoint {name} cannot be resumed: {problem}")
    return name, []


def load_checkpoint(store: Store, slug: str, name: str, expected: Optional[Expected] = None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], CheckpointState]:
    """A checked checkpoint's contents; ResumeError when it cannot be loaded."""
    try:
        return open_checkpoint(store, slug, name, expected)
    except CheckpointProblem as problem:
        raise ResumeError(f"checkpoint {name}: {problem}") from None


def prune(store: Store, slug: str, keep: int, protect: Optional[str] = None) -> None:
    """Keep the newest KEEP published checkpoints (and PROTECT); delete the others. Each is
    unpublished first (its MANIFEST goes before its files), so a kill in the middle of a
    deletion leaves a folder that is never loaded, not a published one that fails."""
    published = [c for c in list_checkpoints(store, slug) if c.valid]
    for info in published[: max(len(published) - keep, 0)]:
        if info.name != protect:
            store.delete(f"{slug}/checkpoints/{info.name}/MANIFEST.json")
            store.delete(f"{slug}/checkpoints/{info.name}", recursive=True)
