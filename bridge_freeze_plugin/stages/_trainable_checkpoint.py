"""Checkpoints of what trains (issue 45 item 1): ``save_trainable_only`` on the provider, Bridge's PEFT seams.

A freeze run saves the whole model at every checkpoint, although its frozen tensors cannot have changed. Bridge
already knows a run whose checkpoints keep only what trains: a PEFT run. Its checkpoints keep the model tensors
``cfg.peft.params_to_save`` names (``checkpointing.save_checkpoint`` filters the model section through the PEFT's
``adapter_key_filter``), with the optimizer state, scheduler, RNG and iteration; its frozen base is
``checkpoint.pretrained_checkpoint``, which ``setup()``'s PEFT hook loads into the raw model first; a resume then
loads the run's own checkpoint (``checkpoint.load``) filtered the same way, with ``strict=False``. So the field
makes a freeze run such a run, and fights nothing:

- **config** (Bridge's ``ConfigContainer.validate``, which ``pretrain()`` / ``finetune()`` call through
  ``runtime_config_update`` before ``setup()``): with ``save_trainable_only`` true, a config without
  ``checkpoint.pretrained_checkpoint``, or with one that does not exist, is refused
  (:class:`~bridge_freeze_plugin.errors.TrainableOnlyCheckpointError`); without ``cfg.peft`` it gets
  :class:`~bridge_freeze_plugin.stages.bridge.TrainableOnlyPEFT`, which adds and freezes nothing. With LoRA
  (``cfg.peft`` already set) nothing is added: Bridge's filter keeps the adapters and the plugin puts its full-rank
  parts into ``params_to_save`` under their checkpoint names (``prewrap._lora``; a full-rank weight LoRA wrapped,
  whose checkpoint key would not be its ``to_wrap`` name, is refused there with ``LoraOverlapError``);
- **save** (``checkpointing.save_checkpoint``): global rank 0 writes the base the run loaded into each
  trainable-only iteration directory (:mod:`._base_record`);
- **load** (``checkpointing._load_checkpoint_from_path``, when the load reads the checkpoint's
  ``run_config.yaml``, before any tensor): the PEFT hook's load of the base records which directory Bridge read;
  a trainable-only checkpoint is accepted only as the resume of a run on its own base (same fingerprint), and
  refused, on every rank, when it is loaded without a base (a plain resume, ``finetune()`` from it as
  ``pretrained_checkpoint``, a base of another run), or on another base. Never a model with random frozen weights.
  Before the base loads, a selection that trains part of a stacked tensor is refused (:mod:`._stacked`).

Not covered: Bridge's non-persistent checkpoints (no record is written: a load of one is not checked), and trainers
that build their config without ``ConfigContainer.validate`` (a save of such a run raises instead of writing the
whole model).
"""

from __future__ import annotations

import inspect
import logging
import sys
import weakref
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, TrainableOnlyCheckpointError
from bridge_freeze_plugin.prewrap import (
    STATE,
    add_training_build_check,
    agree_on_error,
    keeps,
    on_saved_read,
    provider_label,
)
from bridge_freeze_plugin.ranks import is_rank0
from bridge_freeze_plugin.stages._base_record import BaseRecord, SavedRecord, read_record, write_record
from bridge_freeze_plugin.stages._stacked import refuse_partly_trained

logger = logging.getLogger("bridge_freeze_plugin")

#: The provider field.
FIELD = "save_trainable_only"
#: Bridge's config container, whose ``validate`` the field's config step runs before.
CONFIG_CONTAINER = ("megatron.bridge.training.config", "ConfigContainer")
#: Bridge's checkpointing module and the two functions of it the field's save and load steps wrap.
CHECKPOINTING = "megatron.bridge.training.checkpointing"
_SAVE, _LOAD = "save_checkpoint", "_load_checkpoint_from_path"
_MARK = "__bridge_freeze_trainable_only__"
#: set on a provider whose config went through the config step (not a dataclass field: Bridge does not save it)
_PREPARED = "_bridge_freeze_trainable_only_prepared"

#: Bridge's ``GlobalState`` of a run -> the base its PEFT hook loaded.
_BASES: weakref.WeakKeyDictionary[Any, BaseRecord] = weakref.WeakKeyDictionary()


def trainable_only(provider: Any) -> bool:
    """Whether ``provider`` asks for trainable-only checkpoints (``save_trainable_only``; a non-bool raises)."""
    value = getattr(provider, FIELD, False)
    if not isinstance(value, bool):
        raise TrainableOnlyCheckpointError(f"{provider_label(provider)}: {FIELD} must be true or false, not "
                                           f"{value!r} ({type(value).__name__})")
    return value


def is_trainable_only_peft(value: Any) -> bool:
    """Whether ``value`` is the :class:`TrainableOnlyPEFT` the config step set (Bridge not imported)."""
    from bridge_freeze_plugin.stages.bridge import MARK

    return getattr(type(value), MARK, False) is True


def prepare_config(cfg: Any) -> None:
    """The config step: refuse a missing base; give a freeze run without PEFT the :class:`TrainableOnlyPEFT`."""
    if not trainable_only(getattr(cfg, "model", None)):
        return
    label = provider_label(cfg.model)
    object.__setattr__(cfg.model, _PREPARED, True)
    given = cfg.checkpoint.pretrained_checkpoint
    if not given:
        raise TrainableOnlyCheckpointError(
            f"{label}: {FIELD}=true keeps only the trainable parameters in each checkpoint, so the frozen base must "
            "come from checkpoint.pretrained_checkpoint, which this config leaves unset. Set "
            "checkpoint.pretrained_checkpoint to the checkpoint the frozen weights come from (a Megatron checkpoint "
            f"directory or an HF model directory), or set {FIELD}=false to save the whole model.")
    if not Path(str(given)).exists():
        raise TrainableOnlyCheckpointError(
            f"{label}: {FIELD}=true takes the frozen base from checkpoint.pretrained_checkpoint={given}, which does "
            "not exist. Give the checkpoint the frozen weights come from, or set "
            f"{FIELD}=false to save the whole model.", given=str(given))
    if cfg.peft is None and getattr(cfg.checkpoint, "also_save_hf_checkpoint", False):
        raise TrainableOnlyCheckpointError(
            f"{label}: {FIELD}=true with checkpoint.also_save_hf_checkpoint=true: the field makes this a PEFT run "
            "for Bridge, whose extra HF save of a PEFT run is an adapter folder, and this run has no adapters (the "
            "export would hold nothing it trained). Set checkpoint.also_save_hf_checkpoint=false and export the "
            f"trained model with AutoBridge.save_hf_pretrained after the run, or set {FIELD}=false.",
            given=str(given))
    if cfg.peft is None:
        from bridge_freeze_plugin.stages.bridge import TrainableOnlyPEFT

        cfg.peft = TrainableOnlyPEFT()
        if is_rank0():
            logger.info("bridge-freeze: %s=true: this run's checkpoints keep only what trains (with its optimizer "
                        "state); the frozen base is loaded from %s first, as Bridge does for PEFT (cfg.peft = "
                        "TrainableOnlyPEFT)", FIELD, given)


def refuse_unprepared(provider: Any) -> None:
    """Before a build that may train: the field set on a provider whose config never met the config step (a trainer
    that builds without ``ConfigContainer.validate``) is refused, before anything trains, not at the first save."""
    if trainable_only(provider) and not getattr(provider, _PREPARED, False):
        raise TrainableOnlyCheckpointError(
            f"{provider_label(provider)}: {FIELD}=true, but this model is built for training without Bridge's "
            "ConfigContainer.validate() having run on its config: that is where the plugin makes the run's "
            "checkpoints keep only what trains (cfg.peft = TrainableOnlyPEFT) and checks its base, so its saves "
            "would hold the whole model, or fail. Build through Bridge's pretrain() / finetune() (or call "
            f"cfg.validate() before setup()), or set {FIELD}=false.")


add_training_build_check(refuse_unprepared)


def with_trainable_only(validate: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``ConfigContainer.validate`` with the field's config step first."""

    @keeps(validate)
    def _validate(self: Any, *args: Any, **kwargs: Any) -> Any:
        prepare_config(self)
        return validate(self, *args, **kwargs)

    setattr(_validate, _MARK, True)
    return _validate


# ---------------------------------------------------------------- load


@dataclass(frozen=True)
class _Load:
    load_dir: str
    state: Any
    role: str  #: "base", "resume" or "full" (:func:`_role`)


_LOADING: ContextVar[_Load | None] = ContextVar("bridge_freeze_trainable_only_load", default=None)


def _role(cfg: Any, load_dir: str) -> str:
    """What Bridge makes of this load: the base (the PEFT hook's load, or ``finetune()``'s of its pretrained
    checkpoint), a PEFT resume (``checkpointing.py``'s ``is_peft_resume``, Bridge 0.6.2), or any other load."""
    ckpt = cfg.checkpoint
    if load_dir == ckpt.pretrained_checkpoint:
        return "base"
    if cfg.peft is not None and ckpt.load is not None and load_dir == ckpt.load and not ckpt.finetune:
        return "resume"
    return "full"


def checking_base(load_from_path: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``_load_checkpoint_from_path`` with the base check armed for the load it makes."""
    signature = inspect.signature(load_from_path)

    @keeps(load_from_path)
    def _load_checkpoint_from_path(*args: Any, **kwargs: Any) -> Any:
        load = None
        try:
            bound = signature.bind(*args, **kwargs).arguments
            state = bound["state"]
            cfg, load_dir = state.cfg, str(bound["load_dir"])
            load = _Load(load_dir, state, _role(cfg, load_dir))
            if load.role == "base":  # an HF directory is read without run_config.yaml: it is its own record
                _BASES[state] = BaseRecord(load_dir, load_dir)
        except (TypeError, KeyError, AttributeError):  # a call Bridge's own function will refuse or not check
            load = None
        if load is not None and load.role == "base" and trainable_only(load.state.cfg.model):
            _stacks_whole(bound.get("model"), load.state.cfg.model)
        token = _LOADING.set(load)
        try:
            return load_from_path(*args, **kwargs)
        finally:
            _LOADING.reset(token)

    setattr(_load_checkpoint_from_path, _MARK, True)
    return _load_checkpoint_from_path


def _stacks_whole(model: Any, provider: Any) -> None:
    """Every rank: no stacked tensor partly trained (:mod:`._stacked`), one verdict for all."""
    error: BaseException | None = None
    try:
        refuse_partly_trained(model, provider, FIELD)
    except BridgeFreezeError as exc:
        error = exc
    agree_on_error(error, when="while the trainable-only checkpoint's stacked tensors were checked")


def check_base(path: Any, config: Any) -> None:
    """A ``read_run_config`` listener: inside a load, the checkpoint's base against this run's (see above)."""
    load = _LOADING.get()
    if load is None:
        return
    _LOADING.set(None)  # the load's first read is its checkpoint's file; the wrapper restores the variable after
    iteration_dir = Path(str(path)).parent
    if load.role == "base" and load.state in _BASES:
        _BASES[load.state].loaded = str(iteration_dir)
    error: BaseException | None = None
    if is_rank0():  # one rank reads the base's files; the verdict reaches every rank in one all_reduce
        try:
            _check(load, iteration_dir)
        except BridgeFreezeError as exc:
            error = exc
    agree_on_error(error, when="while a trainable-only checkpoint's base was compared with this run's")


def _check(load: _Load, iteration_dir: Path) -> None:
    record = read_record(iteration_dir)
    if record is None:
        return
    cfg = load.state.cfg
    label = provider_label(cfg.model)
    given = str(cfg.checkpoint.pretrained_checkpoint or "")
    saved_on = _base_text(record.base)
    if load.role == "base":
        raise TrainableOnlyCheckpointError(
            f"{label}: checkpoint.pretrained_checkpoint={load.load_dir} ({iteration_dir}) is a trainable-only "
            f"checkpoint ({record.path}): it holds only what its run trained, on the frozen base {saved_on}, and "
            "cannot be the base of another run. Give that run's own base as checkpoint.pretrained_checkpoint, and "
            f"this checkpoint as checkpoint.load with {FIELD}=true to resume it.",
            checkpoint=str(iteration_dir), base=record.base.given, given=given)
    base = _BASES.get(load.state) if load.role == "resume" else None
    if base is None:
        how = (f"{FIELD} is false (no cfg.peft)" if cfg.peft is None else
               f"checkpoint.pretrained_checkpoint={given} is not loaded before it" if given else
               "no checkpoint.pretrained_checkpoint")
        raise TrainableOnlyCheckpointError(
            f"{label}: this run loads {iteration_dir} (from {load.load_dir}), a trainable-only checkpoint "
            f"({record.path}): it holds only what its run trained, on the frozen base {saved_on}; but this run "
            f"loads it without that base ({how}), which would leave every frozen weight as it was initialised. To "
            f"resume it, set {FIELD}=true and checkpoint.pretrained_checkpoint={record.base.given} (Bridge loads the "
            "base first, then this checkpoint on top).",
            checkpoint=str(iteration_dir), base=record.base.given, given=given)
    if base.fingerprint() != record.base.digest:
        raise TrainableOnlyCheckpointError(
            f"{label}: {iteration_dir} is a trainable-only checkpoint saved on the frozen base {saved_on} "
            f"({record.path}), but this run's base is {_base_text(base)}: another checkpoint, or the same one "
            "rewritten since. Its trained parameters would sit on frozen weights they were not trained with. Set "
            f"checkpoint.pretrained_checkpoint={record.base.given} (or a copy of it) to resume it.",
            checkpoint=str(iteration_dir), base=record.base.given, given=given)
    moved = "" if Path(base.loaded) == Path(record.base.loaded) else f" (saved on it as {record.base.loaded})"
    logger.info("bridge-freeze: resuming the trainable-only checkpoint %s on its frozen base %s%s", iteration_dir,
                base.loaded, moved)


def _base_text(base: BaseRecord) -> str:
    read = "" if base.loaded == base.given else f", read from {base.loaded}"
    return f"{base.given} ({base.fingerprint()[:12]}{read})"


# ---------------------------------------------------------------- save


def recording_base(save: Callable[..., Any]) -> Callable[..., Any]:
    """Bridge's ``save_checkpoint``; a trainable-only save also gets its base record (global rank 0)."""
    signature = inspect.signature(save)

    @keeps(save)
    def save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs).arguments
        state = bound.get("state")
        cfg = getattr(state, "cfg", None)
        asked = trainable_only(getattr(cfg, "model", None))  # a config without a model (a stand-in) asks nothing
        if asked and cfg.peft is None:
            raise TrainableOnlyCheckpointError(
                f"{provider_label(cfg.model)}: {FIELD}=true, but this run's config never went through Bridge's "
                "ConfigContainer.validate(), where the plugin sets cfg.peft to TrainableOnlyPEFT: this save would "
                f"write the whole model. Call cfg.validate() before setup(), or set {FIELD}=false.")
        result = save(*args, **kwargs)
        if asked and not bound.get("non_persistent_ckpt", False) and is_rank0():
            _write(state, cfg)
        return result

    setattr(save_checkpoint, _MARK, True)
    return save_checkpoint


def _write(state: Any, cfg: Any) -> None:
    name_of = sys.modules[CHECKPOINTING].get_checkpoint_name
    iteration_dir = name_of(cfg.checkpoint.save, state.train_state.step, release=False)
    given = str(cfg.checkpoint.pretrained_checkpoint)
    base = _BASES.get(state) or BaseRecord(given, given)
    write_record(iteration_dir, base, getattr(cfg.peft, "params_to_save", ()))


def saved_record(iteration_dir: str | Path) -> SavedRecord | None:
    """The base record of a trainable-only iteration directory (``None``: not one)."""
    return read_record(iteration_dir)


# ---------------------------------------------------------------- installed by activation


def install_config_step(module: ModuleType) -> None:
    """``ConfigContainer.validate`` runs the field's config step first (original kept for ``deactivate()``)."""
    cls = getattr(module, CONFIG_CONTAINER[1], None)
    method = getattr(cls, "validate", None) if isinstance(cls, type) else None
    if method is None or not STATE.active or getattr(method, _MARK, False):
        return
    with STATE.lock:
        STATE.guarded.setdefault(cls, {}).setdefault("validate", cls.__dict__.get("validate", method))
        cls.validate = with_trainable_only(method)  # type: ignore[union-attr]


def install_checkpoint_steps(module: ModuleType) -> None:
    """Bridge's ``save_checkpoint`` records the base, ``_load_checkpoint_from_path`` checks it. Installed after
    the selection check (which wraps the same load function): the original Bridge's stays what ``deactivate()``
    puts back."""
    if not STATE.active:
        return
    with STATE.lock:
        for name, wrap in ((_SAVE, recording_base), (_LOAD, checking_base)):
            current = module.__dict__.get(name)
            if not callable(current) or getattr(current, _MARK, False):
                continue
            STATE.guarded.setdefault(module, {}).setdefault(name, current)  # type: ignore[arg-type]
            setattr(module, name, wrap(current))
    on_saved_read(check_base)
