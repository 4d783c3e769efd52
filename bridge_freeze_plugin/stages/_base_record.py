"""Which frozen base a trainable-only checkpoint was saved on: a small file in its iteration directory.

A trainable-only checkpoint (``save_trainable_only``) holds only what its run trained; the rest is the base its run
loaded from ``checkpoint.pretrained_checkpoint``. Each such iteration directory gets :data:`SIDECAR`, a JSON file
written by global rank 0 next to Bridge's ``run_config.yaml``: the base as the config named it, the directory
Bridge read it from (an iteration directory, or an HF model directory) and that directory's
:func:`fingerprint`, and the parameter names the checkpoint keeps. A load of such a checkpoint compares this
run's base with it (:mod:`._trainable_checkpoint`).

The fingerprint is cheap at any size, and not a content hash of every byte: each regular file of the directory by
name and size; a small file (``.metadata``, ``common.pt``, ``train_state.pt``, ``run_config.yaml``, ``config.json``,
an index) hashed whole; a large one (the ``.distcp`` / ``.safetensors`` data) by :data:`_SAMPLES` evenly spaced
slices of :data:`_SLICE` bytes, so at most about 1 MiB is read per file. It tells apart two models, two iterations
of a run (their ``train_state.pt``) and a directory rewritten since; a copy of the base elsewhere keeps it.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The record's file name in a trainable-only iteration directory.
SIDECAR = "bridge_freeze_base.json"
_FORMAT = 1
#: A file up to this size is hashed whole.
_WHOLE = 4 << 20
_SAMPLES = 16
_SLICE = 64 << 10


def fingerprint(directory: str | Path) -> str:
    """A sha256 hex digest of ``directory``'s regular files (top level; :data:`SIDECAR` left out), as above."""
    digest = hashlib.sha256()
    root = Path(directory)
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name == SIDECAR or not entry.is_file():
            continue
        size = entry.stat().st_size
        digest.update(f"{entry.name}\0{size}\0".encode())
        with open(entry.path, "rb") as handle:
            if size <= _WHOLE:
                digest.update(handle.read())
                continue
            step = (size - _SLICE) // (_SAMPLES - 1)
            for i in range(_SAMPLES):
                handle.seek(i * step)
                digest.update(handle.read(_SLICE))
    return digest.hexdigest()


@dataclass
class BaseRecord:
    """The frozen base of a run: ``given`` as ``checkpoint.pretrained_checkpoint`` names it, ``loaded`` the
    directory Bridge read (an iteration directory under it, or the HF directory itself)."""

    given: str
    loaded: str
    digest: str = field(default="", compare=False)

    def fingerprint(self) -> str:
        if not self.digest:
            self.digest = fingerprint(self.loaded)
        return self.digest

    def as_dict(self) -> dict[str, str]:
        return {"pretrained_checkpoint": self.given, "loaded_from": self.loaded, "fingerprint": self.fingerprint()}


@dataclass(frozen=True)
class SavedRecord:
    """What :data:`SIDECAR` of a trainable-only iteration directory says."""

    path: str  #: the sidecar file itself
    base: BaseRecord
    saved: tuple[str, ...]  #: the parameter names the checkpoint keeps


def write_record(iteration_dir: str | Path, base: BaseRecord, saved: Any) -> Path:
    """Write :data:`SIDECAR` into ``iteration_dir`` (atomically: a reader never sees half a file)."""
    target = Path(iteration_dir) / SIDECAR
    body = {"bridge_freeze": "trainable-only checkpoint", "format": _FORMAT, "base": base.as_dict(),
            "saved_parameters": sorted(str(name) for name in saved)}
    partial = target.with_name(f".{SIDECAR}.{os.getpid()}")
    partial.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
    os.replace(partial, target)
    return target


def read_record(iteration_dir: str | Path) -> SavedRecord | None:
    """The record of a trainable-only iteration directory; ``None`` for any other (no :data:`SIDECAR`)."""
    path = Path(iteration_dir) / SIDECAR
    if not path.is_file():
        return None
    body = json.loads(path.read_text(encoding="utf-8"))
    base = body.get("base", {})
    return SavedRecord(str(path), BaseRecord(str(base.get("pretrained_checkpoint", "")),
                                             str(base.get("loaded_from", "")), str(base.get("fingerprint", ""))),
                       tuple(body.get("saved_parameters", ())))
