"""``check-config`` knows stages (issue 45 item 4): what a config's ``checkpoint`` section makes Bridge load, read
before anything is built, and whether its selection matches the checkpoint's.

Which directory and which iteration are decided as Megatron-Bridge 0.6.2 decides them (``load_checkpoint``, then
``_resolve_checkpoint_iteration``): ``checkpoint.load`` when it holds a checkpoint (an iteration directory itself,
or a root with a tracker file: ``latest_train_state.pt``, else Megatron-LM's ``latest_checkpointed_iteration.txt``),
else ``checkpoint.pretrained_checkpoint`` (Bridge then sets ``finetune``); at ``checkpoint.ckpt_step`` when it is
set, else at the tracker's iteration. Optimizer state is loaded unless ``finetune`` (set or implied by the
pretrained path), ``load_optim=false``, a ``release`` checkpoint or a checkpoint saved with ``save_optim=false``
(its own ``run_config.yaml``) says otherwise: the rules of :mod:`._resume_check`, which refuses the same resume at
run time with the same message. The comparison is :mod:`._saved_selection`'s.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import BridgeFreezeError, SelectionChange, SelectionChangedError
from bridge_freeze_plugin.stages._resume_check import refusal_message
from bridge_freeze_plugin.stages._saved_selection import change_text, changes, run_settings, saved_settings

#: Files that make a directory one iteration of a checkpoint (Bridge's ``is_checkpoint_iteration_directory``).
_ITERATION_MARKERS = ("run_config.yaml", "train_state.pt", "metadata.json", ".metadata")
_TRAIN_STATE_TRACKER = "latest_train_state.pt"
_LEGACY_TRACKER = "latest_checkpointed_iteration.txt"


@dataclass(frozen=True)
class StageCheck:
    """What a config's checkpoint settings load, and how the checkpoint's selection compares with the config's.

    ``status``: ``resumes`` (optimizer state loaded, same selection), ``refused`` (optimizer state loaded, another
    selection: :attr:`error` is what the run would raise), ``new_stage`` (weights without optimizer state),
    ``not_compared`` (no ``run_config.yaml`` to read, or it cannot be read), ``no_checkpoint`` (nothing to load
    there: the run starts from scratch, or Bridge stops, as :attr:`line` says).
    """

    status: str
    line: str
    checkpoint: str | None = None
    run_config: str | None = None
    optimizer_state: bool = False
    changes: tuple[SelectionChange, ...] = ()
    error: BridgeFreezeError | None = field(default=None, compare=False)

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "line": self.line, "checkpoint": self.checkpoint,
                "run_config": self.run_config, "optimizer_state": self.optimizer_state,
                "changes": [{"key": c.key, "checkpoint": _plain(c.saved), "run": _plain(c.run)} for c in self.changes]}


def _plain(value: bool | tuple[str, ...]) -> bool | list[str]:
    return value if isinstance(value, bool) else list(value)


def _is_iteration(path: Path) -> bool:
    return any((path / marker).exists() for marker in _ITERATION_MARKERS)


def _has_checkpoint(path: Path) -> bool:
    return _is_iteration(path) or (path / _TRAIN_STATE_TRACKER).is_file() or (path / _LEGACY_TRACKER).is_file()


def _is_hf_folder(path: Path) -> bool:
    return (path / "config.json").is_file() and not _is_iteration(path)


def _tracker_iteration(root: Path) -> tuple[int | None, bool, str]:
    """(iteration, release, which file said so) from a root's tracker files, as Bridge reads them."""
    tracker = root / _TRAIN_STATE_TRACKER
    if tracker.is_file():
        try:
            import torch

            step = torch.load(tracker, map_location="cpu", weights_only=True).get("step")
            return int(step), False, f"{tracker.name}: step {int(step)}"
        except (OSError, EOFError, RuntimeError, ValueError, TypeError, AttributeError, pickle.UnpicklingError) as exc:
            # Bridge's reader raises on it too: say so, do not crash
            return None, False, f"{tracker} cannot be read ({type(exc).__name__}: {exc})"
    try:
        text = (root / _LEGACY_TRACKER).read_text(encoding="utf-8", errors="replace").strip()[:64]
    except OSError as exc:
        return None, False, f"{root / _LEGACY_TRACKER} cannot be read ({exc})"
    if text == "release":
        return 0, True, f"{_LEGACY_TRACKER}: release"
    if text.isdigit():
        return int(text), False, f"{_LEGACY_TRACKER}: {int(text)}"
    return None, False, f"{root / _LEGACY_TRACKER} holds {text!r}, not an iteration"


def _iteration_dir(root: Path, ckpt_step: Any) -> tuple[Path | None, bool, str]:
    """The iteration directory Bridge loads from ``root`` (None: none, and why), whether it is a release one."""
    if _is_iteration(root):
        return root, root.name == "release", "an iteration directory given directly"
    if ckpt_step is not None:
        chosen = root / f"iter_{int(ckpt_step):07d}"
        if not chosen.is_dir():
            return None, False, (f"checkpoint.ckpt_step={ckpt_step} but {chosen} does not exist: Bridge stops with "
                                 "FileNotFoundError")
        return chosen, False, f"checkpoint.ckpt_step={ckpt_step}"
    iteration, release, said = _tracker_iteration(root)
    if iteration is None:
        return None, False, said
    chosen = root / ("release" if release else f"iter_{iteration:07d}")
    if not chosen.is_dir():
        return None, False, f"{said}, but {chosen} does not exist"
    return chosen, release, said


def stage_check(checkpoint: Mapping[str, Any] | None, selection: Any, read: Callable[[str], Mapping[str, Any]],
                label: str = "this config") -> StageCheck | None:
    """The stage a config's ``checkpoint`` section starts (``None``: it loads nothing).

    ``selection``: what the config trains (a :class:`~bridge_freeze_plugin.FreezeSelection`); ``read``: reads a
    ``run_config.yaml`` into a mapping (the caller's config reader), raising a :class:`BridgeFreezeError` or an
    ``OSError`` when it cannot; ``label``: who is asked (the provider class), for the refusal's message.
    """
    ckpt = checkpoint or {}
    load, pretrained = ckpt.get("load"), ckpt.get("pretrained_checkpoint")
    if not load and not pretrained:
        return None
    if load and _has_checkpoint(Path(str(load))):
        root, key, implied_finetune = Path(str(load)), f"checkpoint.load={load}", False
    elif pretrained:
        root, key, implied_finetune = Path(str(pretrained)), f"checkpoint.pretrained_checkpoint={pretrained}", True
        if load:
            key += f"; checkpoint.load={load} holds no checkpoint yet"
        if not root.exists():
            return StageCheck("no_checkpoint", f"stage: {key}, but {root} does not exist: Bridge stops with "
                                               "FileNotFoundError (no checkpoint in the load or pretrained directory)")
        if _is_hf_folder(root):
            return StageCheck("new_stage", f"stage: a new stage from the Hugging Face weights in {root} ({key}): no "
                                           "optimizer state, no saved selection to compare", checkpoint=str(root))
        if not _has_checkpoint(root):
            return StageCheck("no_checkpoint", f"stage: {key}, but {root} holds no checkpoint (no iteration marker, "
                                               "no tracker file): Bridge stops with FileNotFoundError")
    else:
        there = "does not exist" if not Path(str(load)).exists() else "holds no checkpoint yet (no tracker file)"
        return StageCheck("no_checkpoint", f"stage: checkpoint.load={load} {there}: the run starts from scratch "
                                           "(nothing is loaded, so no selection to compare)")
    chosen, release, how = _iteration_dir(root, ckpt.get("ckpt_step"))
    if chosen is None:
        return StageCheck("no_checkpoint", f"stage: {key}: {how}: nothing to compare")
    why_not = [why for why, holds in (
        ("Bridge's finetune path from pretrained_checkpoint, at iteration 0", implied_finetune),
        ("checkpoint.finetune=true", not implied_finetune and ckpt.get("finetune") is True),
        ("checkpoint.load_optim=false", ckpt.get("load_optim") is False),
        ("a release checkpoint", release),
    ) if holds]
    return _compared(chosen, f"{key}, {how}", why_not, selection, read, label, str(load or pretrained))


def _compared(chosen: Path, where: str, why_not: list[str], selection: Any, read: Callable[[str], Mapping[str, Any]],
              label: str, load_dir: str) -> StageCheck:
    path = chosen / "run_config.yaml"
    if not path.is_file():
        return StageCheck("not_compared", f"stage: loads {chosen} ({where}), which has no run_config.yaml "
                                          "(Megatron-LM's own or a local checkpoint): its selection cannot be compared",
                          checkpoint=str(chosen))
    try:
        saved = read(str(path))
        model = saved.get("model")
        if not isinstance(model, Mapping):
            raise BridgeFreezeError(f"{path} holds no model section")
        found = changes(saved_settings(model, str(path)), run_settings(selection))
    except (BridgeFreezeError, OSError) as exc:
        return StageCheck("not_compared", f"stage: loads {chosen} ({where}), but its selection cannot be read: {exc}",
                          checkpoint=str(chosen), run_config=str(path))
    section = saved.get("checkpoint")
    if isinstance(section, Mapping) and section.get("save_optim") is False:
        why_not.append("saved without optimizer state (save_optim=false)")
    said = "; ".join(change_text(c) for c in found)
    common = {"checkpoint": str(chosen), "run_config": str(path), "changes": tuple(found)}
    if why_not:
        same = f"saved with another selection ({said})" if found else "saved with this config's selection"
        return StageCheck("new_stage", f"stage: a new stage from {chosen}'s weights ({where}; no optimizer state: "
                                       f"{', '.join(why_not)}); it was {same}", **common)
    if found:
        error = SelectionChangedError(refusal_message(label, load_dir, str(path), found), path=str(path), changes=found)
        return StageCheck("refused", f"stage: resumes {chosen} with its optimizer state ({where}), but it was saved "
                                     f"with another selection: {said}", optimizer_state=True, error=error, **common)
    return StageCheck("resumes", f"stage: resumes {chosen} with its optimizer state ({where}): its selection "
                                 f"({path}) is this config's", optimizer_state=True, **common)
