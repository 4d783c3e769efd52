"""Bridge's ``instantiate``, wrapped so a provider made from a saved config is marked with its file (issue 35 item 1).

``read_run_config`` is wrapped in :mod:`._activate` (it records the file and its ``model`` section); the provider
Bridge's ``load_model_config`` then instantiates from that section is marked here, so the report can say which flag
values came from the file (``prewrap._origins``). Undone by ``deactivate`` with the other module guards.
"""

from __future__ import annotations

from types import ModuleType

from bridge_freeze_plugin.prewrap import INSTANTIATE, STATE, instantiating


def mark_instantiated(module: ModuleType) -> None:
    """``module.instantiate`` marks what it makes from a recorded saved ``model`` section."""
    name = INSTANTIATE[1]
    original = module.__dict__.get(name)
    if not STATE.active or not callable(original) or hasattr(original, "__bridge_freeze_wrapped__"):
        return
    with STATE.lock:
        STATE.guarded.setdefault(module, {})[name] = original  # type: ignore[index]
        setattr(module, name, instantiating(original))
