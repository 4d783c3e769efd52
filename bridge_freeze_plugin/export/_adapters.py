"""Bridge's adapter exports keep the adapters only: with full-rank parts that would be a silent loss.

A LoRA run with full-rank parts (a partial selection) trains adapters AND full-rank weights. Bridge's
adapter exports write the adapters alone: ``AutoBridge.export_adapter_weights(model)``,
``AutoBridge.save_hf_adapter(model, ...)`` (its ``adapter_config.json`` says ``"modules_to_save": null``)
and ``AutoBridge.export_adapter_ckpt(checkpoint, ...)`` (it rebuilds LoRA from ``run_config.yaml`` and
loads adapters only). While the plugin is active, each refuses such a run with
:class:`~bridge_freeze_plugin.errors.AdapterExportError`, naming the alternative: export the whole model
(``AutoBridge.save_hf_pretrained`` after merging) or write :func:`~bridge_freeze_plugin.trainable_state_dict`
(adapters + full-rank parts under checkpoint names). Runs with every part's flag set, or plain LoRA, are
untouched, except for one loss of their own: adapters on plain ``torch.nn.Linear`` modules made bare
``LinearAdapter`` copies (Bridge up to 0.6.2, in HF-implemented towers) have no ``.adapter.`` in their names, so
the adapter exports drop them too; the model guards refuse such a model whatever the flags (the build refuses them
while a flag is set). Where the installed Bridge kept the layer as ``to_wrap`` (0.7.0), read from the model
(``prewrap.linear_adapters``), its exports carry them and nothing is refused.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import AdapterExportError, some_of
from bridge_freeze_plugin.prewrap import PART_ATTR, keeps, linear_adapters
from bridge_freeze_plugin.request import FLAGS, INFO, SELECTABLE_PARTS, Part

AUTO_BRIDGE = ("megatron.bridge.models.conversion.auto_bridge", "AutoBridge")
_SELECTABLE = {p.value for p in SELECTABLE_PARTS}


def full_rank_parts_of_model(model: Any) -> list[str]:
    """The parts of ``model`` (a module or chunks) whose base weights train at full rank."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    # Bridge hands the model on as it is: anything without parameters (a test double) is Bridge's to judge
    chunks = [c for c in chunks if callable(getattr(c, "parameters", None))]
    parts = {getattr(p, PART_ATTR, None) for c in chunks for p in c.parameters() if p.requires_grad}
    return sorted(parts & _SELECTABLE)


def full_rank_parts_of_checkpoint(checkpoint: str | Path) -> list[str]:
    """What a checkpoint's ``run_config.yaml`` trains at full rank next to LoRA (``[]`` if none / unknown).

    Parts whose flag is false while another flag is set, and the train patterns (each a full-rank choice of
    its own, whatever the flags): ``["vision_projection", "train_patterns=['...']"]``.
    """
    import yaml

    path = Path(checkpoint).expanduser()
    config = next((c for c in (path / "run_config.yaml", path.parent / "run_config.yaml") if c.is_file()), None)
    if config is None:
        return []
    try:
        run = yaml.safe_load(config.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []
    model = run.get("model") or {}
    if not run.get("peft") or not isinstance(model, dict):
        return []
    frozen = {flag for flag in FLAGS if model.get(flag) is True}
    trained = [part.value for part in _parts_of_run(model) if INFO[part].flag not in frozen]
    parts = trained if frozen and trained else []
    patterns = model.get("train_patterns") or []
    if isinstance(patterns, (list, tuple)) and patterns:
        parts.append(f"the tensors matched by train_patterns={list(patterns)!r}")
    return parts


def _parts_of_run(model: dict[str, Any]) -> tuple[Part, ...]:
    """The model's parts, from the family of the provider class the run config names (``_target_``); unknown:
    the parts assumed for a vision-language model."""
    from bridge_freeze_plugin.errors import UnknownFamilyError
    from bridge_freeze_plugin.registry import REGISTRY

    target = str(model.get("_target_") or "")
    for name in (target.rpartition(".")[2], target.rpartition(".")[2].removeprefix("Freezable")):
        if not name:
            continue
        try:
            return REGISTRY.find(name).part_names()
        except UnknownFamilyError:
            continue
    return tuple(part for part in SELECTABLE_PARTS if INFO[part].assumed)


def _refuse(what: str, parts: Iterable[str]) -> None:
    parts = list(parts)
    if parts:
        raise AdapterExportError(
            f"{what} writes LoRA adapters only, but this run also trains {', '.join(parts)} at full rank "
            f"(LoRA with a partial freeze selection): those weights would be silently missing from the export. "
            f"Export the whole model instead (merge the adapters, then AutoBridge.save_hf_pretrained), or write "
            f"bridge_freeze_plugin.trainable_state_dict(model): the adapters and the full-rank parts under "
            f"checkpoint names."
        )


def _refuse_linear_adapters(what: str, model: Any) -> None:
    """Adapters on plain ``torch.nn.Linear`` modules: the adapter exports keep ``.adapter.`` weights only."""
    chunks = model if isinstance(model, (list, tuple)) else [model]
    if not all(callable(getattr(c, "named_modules", None)) for c in chunks):
        return  # not a model (a test double): Bridge's to judge
    found = linear_adapters(list(chunks))
    if found:
        shown = some_of(found, 8)
        raise AdapterExportError(
            f"{what} writes LoRA adapters named '.adapter.' only, but this model has {len(found)} LoRA adapter(s) on "
            f"plain torch.nn.Linear modules (bare LinearAdapter copies, no to_wrap, in an HF-implemented tower): "
            f"{shown}. Their training would be silently missing from the export (and from the merged HF export). "
            f"Retrain with LoRA targets on Megatron linear layers, or train that part at full rank; the Megatron "
            f"checkpoint keeps them."
        )


def _guarded(
    name: str, original: Callable[..., Any], full_rank_parts: Callable[[Any], list[str]]
) -> Callable[..., Any]:
    """``original`` (an AutoBridge method whose first argument is a model or a checkpoint), refusing first.

    The wrapper keeps Bridge's signature (``inspect.signature`` follows ``__wrapped__``): the model or
    checkpoint is found by binding the call, so positional and keyword calls behave as Bridge's own do,
    and a call Bridge would reject is left to Bridge to reject with its own error.
    """
    signature = inspect.signature(original)
    source_name = list(signature.parameters)[1]  # after self: model / peft_checkpoint

    @keeps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)
        source = bound.arguments.get(source_name)
        what = f"AutoBridge.{name}" if full_rank_parts is full_rank_parts_of_model else f"AutoBridge.{name}({source})"
        _refuse(what, full_rank_parts(source))
        if full_rank_parts is full_rank_parts_of_model and source is not None:
            _refuse_linear_adapters(what, source)
        return original(*args, **kwargs)

    return guarded


def _guard_model(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    return _guarded(name, original, full_rank_parts_of_model)


def _guard_checkpoint(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    return _guarded(name, original, full_rank_parts_of_checkpoint)


#: AutoBridge method -> how it is guarded.
GUARDS: dict[str, Callable[[str, Callable[..., Any]], Callable[..., Any]]] = {
    "export_adapter_weights": _guard_model,
    "save_hf_adapter": _guard_model,
    "export_adapter_ckpt": _guard_checkpoint,
}
