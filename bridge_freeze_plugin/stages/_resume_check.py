"""A resume that loads optimizer state from a checkpoint saved with another selection is refused (issue 45 item 2).

Measured with Bridge 0.6.2 / megatron-core 0.19.2 (docs/stages.md): such a resume either stops deep inside
megatron-core's checkpoint load (the plain optimizer: ``KeyError`` on a parameter's ``exp_avg`` the checkpoint does
not hold; the distributed optimizer: ``Global shape mismatch`` of its flat buffers) or, where the trained sizes agree
(a pattern moved between two blocks of the same shape), loads with the distributed optimizer and gives one
tensor's Adam moments to another without a word. Either way the message names neither selection.

The seam is Bridge's ``checkpointing._load_checkpoint_from_path`` (``load_checkpoint`` looks it up there at each
call, after it has chosen between ``checkpoint.load`` and ``checkpoint.pretrained_checkpoint``): its wrapper notes
whether this load restores optimizer state (an optimizer, ``checkpoint.load_optim`` and not ``checkpoint.finetune``,
model and optimizer not skipped), and the check runs when that load reads the checkpoint's ``run_config.yaml``
(Bridge's ``read_run_config``, which ``prewrap`` wraps and tells its listeners of): the very file of the iteration
Bridge resolved, before any weight or optimizer state is read. Every rank reads that file; the verdicts meet in one
``all_reduce`` (:func:`~bridge_freeze_plugin.prewrap.agree_on_error`), so every rank raises alike. Global rank 0
logs what was decided. A load without optimizer state (a new stage: ``finetune()`` from ``pretrained_checkpoint``,
``load_optim=False``, ``finetune=True``), a ``release`` checkpoint or one saved without optimizer state is never
refused. A checkpoint with no ``run_config.yaml`` (Megatron-LM's, a local non-persistent one) is not checked.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, SelectionChange, SelectionChangedError
from bridge_freeze_plugin.prewrap import agree_on_error, keeps, provider_label
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.stages._saved_selection import (
    change_text,
    changes,
    run_settings,
    saved_settings,
    value_text,
)

logger = logging.getLogger("bridge_freeze_plugin")

#: Bridge's function that loads one checkpoint directory (``load_checkpoint`` calls it by this module's name).
LOAD_FROM_PATH = ("megatron.bridge.training.checkpointing", "_load_checkpoint_from_path")


@dataclass(frozen=True)
class _Load:
    """One checkpoint load in progress: where from, with which provider, and whether optimizer state comes too."""

    load_dir: str
    provider: Any
    optimizer_state: bool
    why_not: str  #: why no optimizer state is loaded ('' when it is)


_LOADING: ContextVar[_Load | None] = ContextVar("bridge_freeze_checkpoint_load", default=None)


def _load_of(bound: Mapping[str, Any]) -> _Load | None:
    state = bound.get("state")
    cfg = getattr(state, "cfg", None)
    ckpt = getattr(cfg, "checkpoint", None)
    if ckpt is None or getattr(cfg, "model", None) is None:
        return None
    optimizer = bound.get("optimizer")
    reasons = [why for why, holds in (
        ("checkpoint.finetune=true", getattr(ckpt, "finetune", False)),
        ("checkpoint.load_optim=false", not getattr(ckpt, "load_optim", True)),
        ("no optimizer", optimizer is None or getattr(optimizer, "is_stub_optimizer", False)),
        ("model and optimizer loading skipped", bound.get("skip_load_to_model_and_opt", False)),
    ) if holds]
    return _Load(str(bound.get("load_dir")), cfg.model, not reasons, ", ".join(reasons))


def checking_resume(load_from_path: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``_load_checkpoint_from_path`` with the selection check armed for the load it makes."""
    signature = inspect.signature(load_from_path)

    @keeps(load_from_path)
    def _load_checkpoint_from_path(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            load = _load_of(bound.arguments)
        except TypeError:  # a call Bridge's own function will refuse with its own message
            load = None
        token = _LOADING.set(load)
        try:
            return load_from_path(*args, **kwargs)
        finally:
            _LOADING.reset(token)

    return _load_checkpoint_from_path


def check_saved_selection(path: Any, config: Any) -> None:
    """A ``read_run_config`` listener: inside a checkpoint load, compare the file's selection with this run's."""
    load = _LOADING.get()
    if load is None:
        return
    _LOADING.set(None)  # the load's first read is its checkpoint's file; the wrapper restores the variable after
    error: BaseException | None = None
    try:
        _check(load, str(path), config)
    except BridgeFreezeError as exc:
        error = exc
    agree_on_error(error, when="while the checkpoint's selection was compared with this run's")


def _check(load: _Load, path: str, config: Any) -> None:
    model = config.get("model") if isinstance(config, Mapping) else None
    if not isinstance(model, Mapping):
        return
    found = changes(saved_settings(model, path), run_settings(load.provider))
    checkpoint = str(Path(path).parent)
    saved_optim = config.get("checkpoint", {}).get("save_optim", True) if isinstance(
        config.get("checkpoint"), Mapping) else True
    why_not = load.why_not or ("a release checkpoint" if Path(checkpoint).name == "release" else
                               "saved without optimizer state" if saved_optim is False else "")
    if not found:
        if is_rank0() and not why_not:
            logger.info("bridge-freeze: resuming from %s with its optimizer state: the checkpoint's selection (%s) "
                        "is this run's", checkpoint, path)
        return
    said = "; ".join(change_text(c) for c in found)
    if why_not:
        if is_rank0():
            logger.info("bridge-freeze: %s was saved with another selection (%s); its optimizer state is not loaded "
                        "(%s): this run starts a new stage from its weights", checkpoint, said, why_not)
        return
    message = refusal_message(provider_label(load.provider), load.load_dir, path, found)
    raise SelectionChangedError(message, path=path, changes=found)


def refusal_message(label: str, load_dir: str, path: str, found: list[SelectionChange]) -> str:
    """Why a resume with optimizer state from the checkpoint whose ``run_config.yaml`` is ``path`` is refused, and
    the two ways forward (the run's check and ``check-config``'s say the same)."""
    checkpoint, said = str(Path(path).parent), "; ".join(change_text(c) for c in found)
    keep = ", ".join(f"{c.key}={value_text(c.saved)}" for c in found)
    return (
        f"{label}: this run resumes from {checkpoint} with its optimizer state "
        f"(checkpoint.load={load_dir}, load_optim=true, finetune=false), but that checkpoint was saved with "
        f"another selection: {said} (the checkpoint's selection is the model section of {path}; a flag it leaves "
        "out is false). Its optimizer state belongs to the parameters that selection trained: megatron-core would "
        "stop with a shape mismatch or, where the sizes agree, give one tensor's Adam moments to another without a "
        f"word. Either keep the checkpoint's selection ({keep}) to resume it, or start a new stage from its weights "
        "without its optimizer state: set checkpoint.load_optim=false (or checkpoint.finetune=true), or give it as "
        f"checkpoint.pretrained_checkpoint={load_dir} with a new checkpoint.load and checkpoint.save "
        "(Bridge's finetune())."
    )
