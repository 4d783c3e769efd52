"""SkyRL's own loader and construction, run on a config check-config reads in a SkyRL layout (skyrl importable).

SkyRL 0.4.0's ``from_cli_overrides`` rewrites the command line before its key check: it drops or renames legacy
keys (``trainer.use_sample_packing``, ``generator.inference_engine.async_engine=true``...) and refuses some values
(``num_epochs`` with ``num_steps``, ``async_engine=false``). Its dataclasses then refuse values when they are built
(``__post_init__``: ``fake_int4_qat.enabled`` without LoRA...), and its SFT entry point runs ``validate_sft_cfg``.
Nothing of that is copied here: :func:`_rewritten` runs SkyRL's own ``from_cli_overrides`` on the overrides, stopped
just before it builds the dataclasses (a subclass whose ``from_dict_config`` hands back what it was given), and
:func:`construct` builds SkyRL's root class from the config and runs SkyRL's own SFT validation. SkyRL's RL checks
of ``validate_cfg`` live in a module that imports Ray at its top (``skyrl.train.utils.utils``): not run, and said.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import logging
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bridge_freeze_plugin.config._skyrl_fields import ROOTS, SkyRLFields
from bridge_freeze_plugin.errors import InvalidFreezeConfigError

logger = logging.getLogger("bridge_freeze_plugin")

#: layout name -> SkyRL's own validation of a built config that needs neither Ray nor a GPU (module, function)
VALIDATORS: Mapping[str, tuple[str, str]] = {"sft": ("skyrl.train.config.sft_config", "validate_sft_cfg")}
#: what SkyRL runs at its start that is not run here, and why (said in check-config's layout line)
NOT_RUN: Mapping[str, str] = {
    "rl": "its validate_cfg (skyrl.train.utils.utils, which imports Ray) was not run",
}


class _Handed(Exception):
    """Carries the overrides SkyRL's ``from_cli_overrides`` was about to build its dataclasses from."""

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__("handed")
        self.cfg = cfg


def _root(layout: str) -> type:
    module, name = ROOTS[layout]
    return getattr(importlib.import_module(module), name)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """SkyRL's warnings and prints while it loads, relayed as log records (never on check-config's stdout)."""
    printed = io.StringIO()
    with warnings.catch_warnings(record=True) as said, contextlib.redirect_stdout(printed):
        warnings.simplefilter("always")
        yield
    for warning in said:
        logger.warning("bridge-freeze: SkyRL's loader: %s", warning.message)
    for line in printed.getvalue().splitlines():
        logger.info("bridge-freeze: SkyRL printed: %s", line)


def _refused(fields: SkyRLFields, what: str, exc: BaseException) -> InvalidFreezeConfigError:
    said = " ".join(str(exc).split()) or "(no message)"
    return InvalidFreezeConfigError(
        f"SkyRL {fields.version} refuses this config when it reads it ({what}: {type(exc).__name__}: {said}), so "
        "the run would stop before training. Change the settings SkyRL names")


def _hand_back(cls: type, cfg: DictConfig) -> Any:
    raise _Handed(cfg)


def _rewritten(args: list[str], layout: str, fields: SkyRLFields) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """(the overrides as written, as SkyRL's loader leaves them) for the command line ``args``; ``None`` when this
    SkyRL's loader builds its classes without handing its overrides to ``from_dict_config``. Raises what its loader
    refuses on values, as :class:`InvalidFreezeConfigError`."""
    root = _root(layout)
    capture = type(f"_Handed{root.__name__}", (root,), {"from_dict_config": classmethod(_hand_back)})
    try:
        with _quiet():
            capture.from_cli_overrides(list(args))
    except _Handed as handed:
        written = OmegaConf.to_container(OmegaConf.from_cli(list(args)), resolve=False)
        after = OmegaConf.to_container(handed.cfg, resolve=False)
        assert isinstance(written, dict) and isinstance(after, dict)
        return written, after
    except Exception as exc:
        raise _refused(fields, f"{root.__name__}.from_cli_overrides", exc) from exc
    return None


def _changes(before: Mapping[str, Any], after: Mapping[str, Any], where: str = "") -> tuple[list[str], dict[str, Any]]:
    """(dotted keys ``after`` no longer has, dotted key -> value ``after`` sets differently or newly)."""
    removed: list[str] = []
    set_: dict[str, Any] = {}
    for key, value in before.items():
        dotted = f"{where}.{key}" if where else str(key)
        if key not in after:
            removed.append(dotted)
        elif isinstance(value, Mapping) and isinstance(after[key], Mapping):
            more_removed, more_set = _changes(value, after[key], dotted)
            removed += more_removed
            set_.update(more_set)
        elif after[key] != value:
            set_[dotted] = after[key]
    for key, value in after.items():
        if key not in before:
            set_[f"{where}.{key}" if where else str(key)] = value
    return removed, set_


def apply_rewrites(cfg: Any, args: list[str], layout: str, fields: SkyRLFields) -> tuple[Any, str | None]:
    """``cfg`` with SkyRL's own rewrites of the command line applied (a copy), and what they were, in words."""
    found = _rewritten(args, layout, fields)
    if found is None:
        return cfg, None
    removed, set_ = _changes(*found)
    if not removed and not set_:
        return cfg, None
    out = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False)) if OmegaConf.is_config(cfg) else (
        OmegaConf.create(dict(cfg)))
    for key in removed:
        parent, _, last = key.rpartition(".")
        node = OmegaConf.select(out, parent) if parent else out
        if isinstance(node, DictConfig) and last in node:
            node.pop(last)
    for key, value in set_.items():
        OmegaConf.update(out, key, value, force_add=True)
    said = [f"dropped {k}" for k in removed] + [f"set {k}" for k in set_]
    return out, f"SkyRL {fields.version}'s loader's rewrites applied before its key check ({'; '.join(said)})"


def construct(cfg: Any, layout: str, fields: SkyRLFields) -> str:
    """SkyRL's own construction of ``cfg`` (its root class's ``from_dict_config``: every ``__post_init__`` check)
    and its own validation where it needs neither Ray nor a GPU; what was checked, in words. Raises what SkyRL
    refuses as :class:`InvalidFreezeConfigError`."""
    root = _root(layout)
    data = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else dict(cfg))
    ran = [f"{root.__name__}.from_dict_config"]
    try:
        with _quiet():
            built = root.from_dict_config(data)
            if layout in VALIDATORS:
                module, name = VALIDATORS[layout]
                ran.append(name)
                getattr(importlib.import_module(module), name)(built)
    except ImportError as exc:
        return (f"values not checked: SkyRL's own construction needs {exc.name or exc} here, which is not "
                "importable")
    except Exception as exc:
        raise _refused(fields, " + ".join(ran), exc) from exc
    extra = f"; {NOT_RUN[layout]}" if layout in NOT_RUN else ""
    return f"values checked by SkyRL's own {' and '.join(ran)}{extra}"
