"""LoRA with full-rank parts: adapters where LoRA puts them, full-rank training where the flags say.

With LoRA on, the flags say which parts train at FULL RANK next to the adapters: a part whose flag
is false trains at full rank, a part whose flag is true is frozen except for the adapters inside it (every
part's flag set: adapters only). No flag set is plain LoRA, left to LoRA (adapters only): a full fine-tune
plus adapters would give the adapters nothing to learn that the full-rank weights do not.

Bridge's PEFT hook freezes the WHOLE model, then adds adapters, then (in Bridge's ``setup()``) records
the trainable parameter names it will checkpoint (``params_to_save``). Right after a PEFT hook runs in the
plugin's hook chain, :func:`after_peft`:

1. refuses an overlap: a full-rank parameter that LoRA wrapped (``<target>.to_wrap.weight``: its
   checkpoint key is the unwrapped name, which ``params_to_save`` does not hold, so Bridge would silently
   drop it from every checkpoint) or replaced (``LinearAdapter`` copies a plain ``nn.Linear`` weight into
   a new, frozen tensor); never train one weight through an adapter and at full rank at once;
2. makes every full-rank parameter trainable again, by identity (whatever the hook order, every chunk);
3. adds their names to the PEFT object's ``params_to_save``, so Bridge's checkpoint filter keeps them.

Before 2, adapters on plain ``torch.nn.Linear`` modules (Bridge's ``LinearAdapter``, carried by no export) are
refused (:mod:`._plain_linear`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

from bridge_freeze_plugin.errors import LoraOverlapError
from bridge_freeze_plugin.prewrap._adapters import WRAPPER_SEGMENTS
from bridge_freeze_plugin.prewrap._classify import Classifier, as_chunks
from bridge_freeze_plugin.prewrap._context import BuildContext
from bridge_freeze_plugin.prewrap._plain_linear import check_linear_adapters

_SHOWN = 12
#: Bridge's PEFT base class (a PEFT object is recognised by it, never by a name).
_PEFT_CLASS = ("megatron.bridge.peft.base", "PEFT")


def _is_peft(obj: Any) -> bool:
    import sys

    base = getattr(sys.modules.get(_PEFT_CLASS[0]), _PEFT_CLASS[1], None)
    return base is not None and isinstance(obj, base)


def _candidates(hook: Any) -> Iterator[Any]:
    """The objects a hook may carry its PEFT in: itself, a partial's arguments, its closure, ``self``."""
    yield hook
    if isinstance(hook, functools.partial):
        yield hook.func
        yield from hook.args
        yield from hook.keywords.values()
    yield getattr(hook, "__self__", None)
    for cell in getattr(hook, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # an empty cell
            continue


def find_peft(hook: Any) -> Any | None:
    """The PEFT object a pre-wrap hook applies: the object itself, Bridge's ``setup()`` hook's ``cfg.peft``, or one
    held by an object the hook closes over (SkyRL's worker: its LoRA hook calls ``self.lora_cls(model)``)."""
    held = []
    for obj in _candidates(hook):
        if _is_peft(obj):
            return obj
        nested = getattr(obj, "peft", None)
        if _is_peft(nested):
            return nested
        if obj is not hook and not isinstance(obj, type) and isinstance(getattr(obj, "__dict__", None), dict):
            held += [value for value in vars(obj).values() if _is_peft(value)]
    return held[0] if len(held) == 1 else None


def full_rank(classifier: Classifier, context: BuildContext) -> dict[int, tuple[str, Any]]:
    """id -> (bare name, parameter) of every base parameter the selection trains at full rank."""
    out = {}
    for bare, part, param in classifier.remembered():
        if context.wants_trainable(bare, part, param):
            out[id(param)] = (bare, param)
    return out


def _overlaps(model: Any, wanted: dict[int, tuple[str, Any]]) -> list[str]:
    present: set[int] = set()
    found = []
    for chunk in as_chunks(model):
        for name, param in chunk.named_parameters():
            present.add(id(param))
            if id(param) in wanted and WRAPPER_SEGMENTS & set(name.split(".")):
                found.append(f"{wanted[id(param)][0]} (wrapped by LoRA as {name})")
    found += [f"{bare} (replaced by a LoRA LinearAdapter copy)" for key, (bare, _) in wanted.items()
              if key not in present]
    return found


def after_peft(
    model: Any, context: BuildContext, classifier: Classifier, peft: Any, hook_label: str,
    trained_before: set[int] | None = None,
) -> int:
    """Check overlaps, restore the full-rank parts and add them to ``peft.params_to_save``; how many restored.

    Only what trained right before the PEFT hook (``trained_before``, ids) is restored: a parameter an
    earlier hook froze inside a trained part (a router-freezing hook) stays frozen.
    """
    if not context.selection.any_set:
        return 0  # plain LoRA: the plugin is not asked
    wanted = full_rank(classifier, context)
    if trained_before is not None:
        wanted = {key: value for key, value in wanted.items() if key in trained_before}
    overlaps = _overlaps(model, wanted)
    if overlaps:
        raise LoraOverlapError(_overlap_message(overlaps, context, peft, hook_label), overlaps)
    check_linear_adapters(model, context, peft, hook_label)
    names: set[str] = set()
    for chunk in as_chunks(model):
        for name, param in chunk.named_parameters():
            if id(param) in wanted:
                param.requires_grad_(True)
                names.add(name)
    saved = getattr(peft, "params_to_save", None)
    if isinstance(saved, set):
        saved |= names
    return len(wanted)


def _overlap_message(overlaps: list[str], context: BuildContext, peft: Any, hook_label: str) -> str:
    shown = "; ".join(overlaps[:_SHOWN])
    more = f"; and {len(overlaps) - _SHOWN} more" if len(overlaps) > _SHOWN else ""
    targets = getattr(peft, "target_modules", None)
    trained = context.describe().removeprefix("train ")
    return (
        f"{context.asked} with LoRA ({type(peft).__name__}, target_modules={targets}, hook {hook_label}) asks for "
        f"{trained} at full rank next to the adapters, but LoRA put adapters on {len(overlaps)} of those full-rank "
        f"parameter(s): {shown}{more}. A weight cannot train through an adapter and at full rank at once (and "
        f"Bridge's checkpoint would silently drop a wrapped one). Scope LoRA away from them (target_modules with "
        f"full names that name a part trained through adapters, e.g. {_scoped_example(context)}, or "
        f"exclude_modules), or set the freeze flag of their part so that it trains through adapters only."
    )


def _scoped_example(context: BuildContext) -> str:
    """A target naming a part the selection trains through adapters only (``'<prefix>.*linear_qkv'``)."""
    family = context.family
    frozen = [p for p in context.selection.frozen_parts()] if family is not None else []
    prefixes = [prefix for part in frozen for prefix in family.prefixes(part)] if family is not None else []
    return f"'{prefixes[0]}.*linear_qkv'" if prefixes else "a part whose freeze flag is set"


def trainable_state_dict(model: Any) -> Any:
    """What trains, under the names a checkpoint load expects: the adapters and the full-rank parts.

    ``model`` is one module (a ``dict`` name -> tensor) or a list of chunks (a list of such dicts). Names
    are ``state_dict()`` keys (LoRA's ``to_wrap`` segment folded back, as Bridge's checkpoints write them);
    tensors are detached (no copy). Matching is by identity: ``state_dict(keep_vars=True)`` hands back the
    parameters themselves. This is what an exporter should write, or an RL trainer sync, for a LoRA run
    with full-rank parts (Bridge's adapter exports keep the adapters only).
    """
    if isinstance(model, (list, tuple)):
        return [trainable_state_dict(chunk) for chunk in model]
    trains = {id(p) for p in model.parameters() if p.requires_grad}
    return {key: value.detach() for key, value in model.state_dict(keep_vars=True).items() if id(value) in trains}
