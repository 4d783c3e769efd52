"""Bridge's module-level functions the plugin routes or checks, installed as their modules are imported: the
adapter-only exports refused with full-rank parts, ``get_model`` through the plugin's hook chain, ``read_run_config``
recorded (flag provenance), ``setup_optimizer`` checked for per-part learning rates, ``_load_checkpoint_from_path``
checked for a resume whose checkpoint was saved with another selection (``stages``). Each original is kept in
:data:`~bridge_freeze_plugin.prewrap.STATE` ``.guarded`` for ``deactivate()``."""

from __future__ import annotations

import functools
from types import ModuleType

from bridge_freeze_plugin.export import AUTO_BRIDGE, GUARDS
from bridge_freeze_plugin.optim import SETUP_OPTIMIZER, checked_setup_optimizer
from bridge_freeze_plugin.prewrap import (
    RUN_CONFIG_READERS,
    STATE,
    get_model_frozen,
    keeps,
    on_saved_read,
    recording,
)
from bridge_freeze_plugin.stages import LOAD_FROM_PATH, check_saved_selection, checking_resume


def guard_adapter_exports(module: ModuleType) -> None:
    """Bridge's adapter-only exports refuse a run with full-rank parts (:mod:`bridge_freeze_plugin.export`)."""
    cls = getattr(module, AUTO_BRIDGE[1], None)
    if cls is None or not STATE.active:
        return
    with STATE.lock:
        for name, guard in GUARDS.items():
            method = cls.__dict__.get(name)
            if callable(method) and not hasattr(method, "__bridge_freeze_wrapped__"):
                STATE.guarded.setdefault(cls, {})[name] = method
                setattr(cls, name, guard(name, method))


#: Bridge's public build function (NeMo-RL and other trainers call it directly with their own hooks).
GET_MODEL = ("megatron.bridge.models.model_provider", "get_model")


def route_get_model(module: ModuleType) -> None:
    """``get_model`` runs its hooks inside the plugin's chain (:func:`~.build.pipeline.get_model_frozen`)."""
    original = module.__dict__.get(GET_MODEL[1])
    if not STATE.active or not callable(original) or hasattr(original, "__bridge_freeze_wrapped__"):
        return
    with STATE.lock:
        STATE.guarded.setdefault(module, {})[GET_MODEL[1]] = original  # type: ignore[index]
        routed = keeps(original)(functools.partial(get_model_frozen, original))
        setattr(module, GET_MODEL[1], routed)


def record_run_configs(module: ModuleType) -> None:
    """Bridge's ``read_run_config`` records the saved configs it reads (``prewrap._saved``: flag provenance)."""
    name = RUN_CONFIG_READERS[0][1]
    original = module.__dict__.get(name)
    if not STATE.active or not callable(original):
        return
    with STATE.lock:
        if hasattr(original, "__bridge_freeze_wrapped__"):  # imported by name from the wrapped module
            STATE.guarded.setdefault(module, {})[name] = original.__bridge_freeze_wrapped__  # type: ignore[index]
            return
        STATE.guarded.setdefault(module, {})[name] = original  # type: ignore[index]
        setattr(module, name, recording(original))


def check_part_learning_rates(module: ModuleType) -> None:
    """Bridge's ``setup_optimizer`` verifies per-part learning rates (``optim._setup_check``)."""
    original = module.__dict__.get(SETUP_OPTIMIZER)
    if not STATE.active or not callable(original):
        return
    with STATE.lock:
        if hasattr(original, "__bridge_freeze_wrapped__"):
            # imported by name from a module already wrapped (setup.py takes it from optim.py): deactivate must
            # give this module Bridge's own function back too
            STATE.guarded.setdefault(module, {})[SETUP_OPTIMIZER] = original.__bridge_freeze_wrapped__  # type: ignore[index]
            return
        STATE.guarded.setdefault(module, {})[SETUP_OPTIMIZER] = original  # type: ignore[index]
        setattr(module, SETUP_OPTIMIZER, checked_setup_optimizer(original))


def check_resume_selection(module: ModuleType) -> None:
    """Bridge's ``_load_checkpoint_from_path`` refuses optimizer state saved with another selection (``stages``)."""
    name = LOAD_FROM_PATH[1]
    original = module.__dict__.get(name)
    if not STATE.active or not callable(original) or hasattr(original, "__bridge_freeze_wrapped__"):
        return
    with STATE.lock:
        STATE.guarded.setdefault(module, {})[name] = original  # type: ignore[index]
        setattr(module, name, checking_resume(original))
    on_saved_read(check_saved_selection)  # the check runs when the load reads its checkpoint's run_config.yaml
