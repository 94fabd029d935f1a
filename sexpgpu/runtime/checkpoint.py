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
from typing import Any, Optional, Union

import numpy as np
from pydantic import BaseModel, Field
from safetensors.numpy import load as load_tensors
from safetensors.numpy import save as save_tensors

from .data.stream import LoaderState
from .store import Store

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


def write_checkpoint(store: Store, slug: str, step: int, params: dict[str, np.ndarray], states: dict[str, np.ndarray], state: CheckpointState) -> str:
    """Write and publish one checkpoint; returns its folder name. The MANIFEST is written
    last, so a crash before it leaves a folder that is never loaded (and is replaced the
    next time the same step is written)."""
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
    store.write_bytes(f"{folder}/MANIFEST.json", manifest.model_dump_json(indent=2).encode())
    store.write_text(f"{slug}/checkpoints/LATEST", name)
    return name


def list_checkpoints(store: Store, slug: str, verify: bool = False) -> list[CheckpointInfo]:
    """Every checkpoint folder, oldest first; `valid` says whether it is published (and,
    with verify, whether every file matches its hash)."""
    names = sorted({p.split("/")[2] for p in store.list(f"{slug}/checkpoints") if len(p.split("/")) > 3})
    out = []
    for name in names:
        match = STEP_DIR.match(name)
        if not match:
            continue
        problem = check(store, slug, name, deep=verify)
        out.append(CheckpointInfo(name=name, step=int(match.group(1)), valid=problem is None, reason=problem or ""))
    return out


def check(store: Store, slug: str, name: str, deep: bool = True) -> Optional[str]:
    """Why the checkpoint cannot be loaded, or None when it can."""
    folder = f"{slug}/checkpoints/{name}"
    try:
        manifest = Manifest.model_validate_json(store.read_bytes(f"{folder}/MANIFEST.json"))
    except FileNotFoundError:
        return "not published (no MANIFEST.json): the write did not finish"
    except ValueError as exc:
        return f"MANIFEST.json is unreadable ({exc.__class__.__name__})"
    if manifest.format_version != FORMAT_VERSION:
        return f"checkpoint format {manifest.format_version}, this sexpgpu reads {FORMAT_VERSION}"
    if not deep:
        return None
    for file, entry in manifest.files.items():
        try:
            data = store.read_bytes(f"{folder}/{file}")
        except FileNotFoundError:
            return f"{file} is missing"
        if len(data) != entry.bytes:
            return f"{file} is {len(data)} bytes, the manifest says {entry.bytes} (truncated?)"
        if _digest(data) != entry.sha256:
            return f"{file} does not match its sha256 in MANIFEST.json (tampered or corrupt)"
    return None


def resolve(store: Store, slug: str, which: Union[str, int]) -> tuple[str, list[str]]:
    """The checkpoint to resume: 'latest' falls back to the newest valid one (with a warning
    for each newer one skipped); a step or a folder name must itself be valid."""
    warnings: list[str] = []
    if which == "latest":
        try:
            named = store.read_text(f"{slug}/checkpoints/LATEST").strip()
        except FileNotFoundError:
            named = ""
        if named and check(store, slug, named, deep=True) is None:
            return named, warnings
        if named:
            warnings.append(f"checkpoint {named} (named by LATEST) skipped: {check(store, slug, named, deep=True)}")
        candidates = [c for c in reversed(list_checkpoints(store, slug)) if c.name != named]
        for info in candidates:
            problem = check(store, slug, info.name, deep=True)
            if problem is None:
                return info.name, warnings
            warnings.append(f"checkpoint {info.name} skipped: {problem}")
        raise ResumeError(f"no valid checkpoint in {store.url_of(slug + '/checkpoints')}" + (f" ({'; '.join(warnings)})" if warnings else ""))
    name = step_name(int(which)) if isinstance(which, int) or str(which).isdigit() else str(which).rstrip("/").split("/")[-1]
    known = [c.name for c in list_checkpoints(store, slug)]
    if name not in known:
        raise ResumeError(f"no checkpoint {name} in {store.url_of(slug + '/checkpoints')} (checkpoints: {', '.join(known) or 'none'})")
    problem = check(store, slug, name, deep=True)
    if problem is not None:
        raise ResumeError(f"checkpoint {name} cannot be resumed: {problem}")
    return name, warnings


def load_checkpoint(store: Store, slug: str, name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], CheckpointState]:
    """Parameters, optimizer state ("state:PATH:SLOT" keys) and loop state of a verified
    checkpoint. safetensors and JSON only: loading never executes code."""
    folder = f"{slug}/checkpoints/{name}"
    problem = check(store, slug, name, deep=True)
    if problem is not None:
        raise ResumeError(f"checkpoint {name}: {problem}")
    params = dict(load_tensors(store.read_bytes(f"{folder}/params.safetensors")))
    optim = {f"state:{k}": v for k, v in load_tensors(store.read_bytes(f"{folder}/optim.safetensors")).items()}
    state = CheckpointState.model_validate(json.loads(store.read_bytes(f"{folder}/state.json")))
    return params, optim, state


def prune(store: Store, slug: str, keep: int, protect: Optional[str] = None) -> None:
    """Keep the newest KEEP published checkpoints (and PROTECT); delete the others."""
    published = [c for c in list_checkpoints(store, slug) if c.valid]
    for info in published[: max(len(published) - keep, 0)]:
        if info.name != protect:
            store.delete(f"{slug}/checkpoints/{info.name}", recursive=True)
