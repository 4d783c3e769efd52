"""SkyRL's loader, as check-config runs it on a config read in a SkyRL layout: what it refuses, one check.

SkyRL's loader (``SkyRLTrainConfig.from_cli_overrides``, ``SFTConfig.from_cli_overrides``) builds its dataclasses
section by section and refuses a key that is no field of the section's class, and a ``+`` prefix (the RL loader
says so; the SFT loader reads ``+megatron_config`` as a field name): :func:`check` says so from SkyRL's fields
(installed or listed). SkyRL 0.4.0's ``from_cli_overrides`` also rewrites the command line before its key check: it
drops or renames legacy keys (``trainer.use_sample_packing``, ``generator.inference_engine.async_engine=true``...)
and refuses some values (``num_epochs`` with ``num_steps``, ``async_engine=false``). Its dataclasses then refuse
values when they are built (``__post_init__``: ``fake_int4_qat.enabled`` without LoRA...), and its SFT entry point
runs ``validate_sft_cfg``. Nothing of that is copied here: where skyrl is importable, :func:`_rewritten` runs
SkyRL's own ``from_cli_overrides`` on the overrides, stopped just before it builds the dataclasses (a subclass whose
``from_dict_config`` hands back what it was given), and :func:`_construct` builds SkyRL's root class from the config
and runs SkyRL's own SFT validation. SkyRL's RL checks of ``validate_cfg`` live in a module that imports Ray at its
top (``skyrl.train.utils.utils``): not run, and said.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import io
import logging
import warnings
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.config._skyrl_fields import KWARGS, ROOTS, SkyRLFields
from bridge_freeze_plugin.config._yaml_overrides import Override, brief
from bridge_freeze_plugin.errors import ConfigLoadError, InvalidFreezeConfigError
from bridge_freeze_plugin.optim import LR_KEYS, looks_like_lr_key
from bridge_freeze_plugin.request import ALIASES, FLAGS, PATTERN_KEYS

logger = logging.getLogger("bridge_freeze_plugin")

#: layout name -> SkyRL's own validation of a built config that needs neither Ray nor a GPU (module, function)
VALIDATORS: Mapping[str, tuple[str, str]] = {"sft": ("skyrl.train.config.sft_config", "validate_sft_cfg")}
#: what SkyRL runs at its start that is not run here, and why (said in check-config's layout line)
NOT_RUN: Mapping[str, str] = {
    "rl": "its validate_cfg (skyrl.train.utils.utils, which imports Ray) was not run",
}


def check(cfg: Any, layout: Layout, overrides: Iterable[Override], fields: SkyRLFields) -> str:
    """``cfg`` (with ``overrides``) read as SkyRL's loader reads it, in its order: the overrides' prefixes, its
    rewrites of the command line (skyrl importable), the keys, then the values; raises what it refuses; returns
    what it was checked against, in words."""
    assert layout.run.skyrl is not None
    skyrl = layout.run.skyrl
    problems = _refused_overrides(overrides, fields, layout)
    if problems:
        raise ConfigLoadError(_joined(problems))
    judged, rewrites = cfg, None
    if fields.installed:  # SkyRL's own loader: its rewrites of the command line come before its key check
        judged, rewrites = _apply_rewrites(cfg, [o.text for o in overrides], skyrl, fields)
    problems = _refused_keys(judged, fields, layout)
    if problems:
        raise InvalidFreezeConfigError(_joined(problems))
    values = _construct(judged, skyrl, fields) if fields.installed else (
        "values not checked: SkyRL refuses some values when it builds its config, and skyrl is not importable here "
        "to build it")
    return "; ".join(filter(None, [f"checked against {fields.source}", rewrites, values]))


def _plugin_key(key: str) -> bool:
    return key in FLAGS or key in ALIASES or key in PATTERN_KEYS or key in LR_KEYS or looks_like_lr_key(key)


def _unknown(fields: SkyRLFields, layout: Layout, where: str, key: str, cls: str) -> str:
    """Why SkyRL's loader refuses ``where.key`` (no field of ``cls``), and what to write instead."""
    dotted = f"{where}.{key}" if where else key
    name = fields.name(cls)
    said = (f"{dotted} is no field of SkyRL {fields.version}'s {name} ({fields.source}), so SkyRL's loader refuses "
            f"it (ValueError: Invalid fields {{'{key}'}} for {name})")
    if name == "MegatronConfig" and (_plugin_key(key) or difflib.get_close_matches(key, FLAGS, n=1, cutoff=0.8)):
        if where == layout.homes.reference_flags:
            return f"{said}. Remove it: the reference model never trains"
        if key in LR_KEYS or looks_like_lr_key(key):
            return (f"{said}. Remove it: a SkyRL {fields.version} run applies no per-part learning rate (it builds "
                    "its optimizer without them)")
        flag = key if _plugin_key(key) else difflib.get_close_matches(key, FLAGS, n=1, cutoff=0.8)[0]
        review = " (the review's fields: they need a SkyRL whose MegatronConfig has them)" if key in FLAGS else ""
        return (f"{said}{review}. With this SkyRL write {where}.{KWARGS}.{flag}: SkyRL's Megatron worker sets every "
                f"{KWARGS} item on the model provider, where the plugin reads it")
    close = difflib.get_close_matches(key, list(fields.fields(cls)), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(f'{where}.{c}' if where else c for c in close)}?" if close else (
        f"{name}'s fields are {', '.join(sorted(fields.fields(cls)))}")
    return f"{said}; {hint}"


def _refused_keys(cfg: Any, fields: SkyRLFields, layout: Layout) -> list[str]:
    """Every key of ``cfg`` that SkyRL's loader refuses (no field of its section's class), with what to write."""
    assert layout.run.skyrl is not None
    top = OmegaConf.to_container(cfg, resolve=False) if OmegaConf.is_config(cfg) else cfg
    problems: list[str] = []
    stack: list[tuple[str, Any, str]] = [("", top, fields.roots[layout.run.skyrl])]
    while stack:
        where, node, cls = stack.pop()
        known = fields.fields(cls)
        for key, value in node.items():
            key = str(key)
            if key not in known:
                problems.append(_unknown(fields, layout, where, key, cls))
            elif known[key] is not None and isinstance(value, Mapping):
                stack.append((f"{where}.{key}" if where else key, value, known[key]))
    return sorted(problems)


def _refused_overrides(overrides: Iterable[Override], fields: SkyRLFields, layout: Layout) -> list[str]:
    """The overrides SkyRL's loader refuses for their prefix (``+``, ``++``, ``~``): it reads ``key=value`` only."""
    assert layout.run.skyrl is not None
    root = fields.name(fields.roots[layout.run.skyrl])
    out = []
    for override in overrides:
        if override.operation == "set":
            continue
        text = override.text.strip()
        bare = text.lstrip("+~")
        said = ("ValueError: The '+' prefix for adding new config fields is not supported"
                if root == "SkyRLTrainConfig" and text.startswith("+") else  # its loader says so; SFTConfig's does not
                f"ValueError: Invalid fields {{'{text.split('.')[0].split('=')[0]}'}} for {root}")
        fix = (f"write {brief(bare)} (every field exists already: key=value sets it)" if override.operation != "delete"
               else f"remove it (a field cannot be deleted; write {brief(bare.split('=')[0])}=VALUE to set it)")
        out.append(f"override {brief(repr(override.text))}: SkyRL {fields.version}'s loader reads key=value only and "
                   f"refuses the '{text[0]}' prefix ({said}); {fix}")
    return out


def _joined(problems: list[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} keys SkyRL's loader refuses:\n" + "\n".join(f"  - {p}" for p in problems)


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


def _apply_rewrites(cfg: Any, args: list[str], layout: str, fields: SkyRLFields) -> tuple[Any, str | None]:
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


def _construct(cfg: Any, layout: str, fields: SkyRLFields) -> str:
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
