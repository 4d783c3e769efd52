"""A recipe run as ``run_recipe.py --recipe NAME [overrides]`` runs it, up to the config it trains with.

1. the recipe function is called (:func:`._find.find_recipe`), its ``config.json`` served offline
   (:func:`._serve.offline_hub`);
2. its ``ConfigContainer`` is written as Bridge writes ``run_config.yaml`` (``ConfigContainer.to_yaml``): the recipe's
   own config;
3. the overrides are applied with Bridge's own code, as ``run_recipe.py`` applies them
   (``megatron.bridge.training.utils.omegaconf_utils.process_config_with_overrides``), then ``model.seq_length``
   follows ``dataset.seq_length`` as ``run_recipe.py`` makes it; the result is written too: what the run trains with.

:func:`._check.check_recipe` reads both with the plugin's own config reading.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import RecipeError
from bridge_freeze_plugin.recipes._find import find_recipe
from bridge_freeze_plugin.recipes._serve import config_json, offline_hub
from bridge_freeze_plugin.request import FLAGS


@dataclass(frozen=True)
class RecipeRun:
    """One recipe's config: before and after the overrides, and where its model's config came from."""

    name: str
    #: the function called, ``module.qualname`` (an alias name is the legacy name of an H100-style function)
    function: str
    overrides: tuple[str, ...]
    #: the ``ConfigContainer`` after the overrides (Bridge's own objects: ``.model`` is the provider)
    container: Any
    #: hub ids the recipe read a ``config.json`` for, and from where
    hub_ids: tuple[str, ...]
    served_from: str
    #: the ``config.json`` the recipe's provider was converted from (``None``: the recipe read none)
    config_file: Path | None
    #: each plugin flag the recipe's provider has -> its value before the overrides (``None``: not on the provider)
    recipe_flags: dict[str, Any]
    #: the recipe's config before the overrides, and the one the run trains with, as Bridge writes them
    recipe_yaml: Path
    final_yaml: Path

    @property
    def hub_id(self) -> str | None:
        return self.hub_ids[0] if self.hub_ids else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "function": self.function, "overrides": list(self.overrides),
                "hub_ids": list(self.hub_ids), "config_from": self.served_from,
                "provider": type(self.container.model).__name__,
                "config_file": None if self.config_file is None else str(self.config_file)}


def _call(name: str, function: Any, hf_config: Path | None) -> tuple[Any, Any]:
    with offline_hub(hf_config) as asked:
        try:
            container = function()
        except RecipeError as exc:
            raise RecipeError(f"recipe {name}: {exc}", recipe=name) from exc
        except Exception as exc:  # the recipe's own failure offline (e.g. remote code the cache lacks): one line
            raise RecipeError(_failed(name, asked, exc), recipe=name) from exc
    return container, asked


def _config_file(asked: Any) -> Path | None:
    """The file the recipe read: ``--hf-config``'s, else the HF cache's for its hub id."""
    if asked.hf_config is not None or not asked.hub_ids:
        return asked.hf_config
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(asked.hub_ids[0], "config.json", cache_dir=asked.cache)
    return Path(found) if isinstance(found, str) else None


def _failed(name: str, asked: Any, exc: Exception) -> str:
    hub = f" (its model: {', '.join(asked.hub_ids)}, from {asked.served_from})" if asked.hub_ids else ""
    first = " ".join(str(exc).split())[:400] or type(exc).__name__
    return (f"recipe {name} fails while it builds its config{hub}: {type(exc).__name__}: {first}. The plugin calls "
            f"the recipe as run_recipe.py does, offline: what it needs (a remote-code model's code, too) must be in "
            f"the HF cache")


def _apply_overrides(name: str, container: Any, overrides: tuple[str, ...]) -> Any:
    """Bridge's own override code, as ``run_recipe.py`` calls it (``apply_cli_overrides``)."""
    from megatron.bridge.training.utils.omegaconf_utils import process_config_with_overrides

    if not overrides:
        return container
    try:
        return process_config_with_overrides(container, cli_overrides=list(overrides))
    except Exception as exc:  # Bridge's OverridesError, or a value its dataclasses refuse
        message = " ".join(str(exc).split())
        raise RecipeError(f"recipe {name}: Bridge's override code refuses {' '.join(overrides)}: {message}. "
                          f"Name a field the recipe's ConfigContainer has (key=value), or add one with +key=value",
                          recipe=name) from exc


def _sync_sequence_length(container: Any) -> None:
    """``run_recipe.py``: after the overrides, the model's sequence length is the dataset's."""
    dataset = getattr(container, "dataset", None)
    model = getattr(container, "model", None)
    if dataset is None or model is None or not hasattr(model, "seq_length"):
        return
    length = getattr(dataset, "seq_length", None)
    length = getattr(dataset, "sequence_length", None) if length is None else length
    if length is not None and model.seq_length != length:
        model.seq_length = length


def run_recipe(name: str, overrides: Iterable[str] = (), *, hf_config: str | os.PathLike[str] | None = None,
               workdir: str | os.PathLike[str]) -> RecipeRun:
    """Call recipe ``name``, apply ``overrides`` with Bridge's code; both configs written under ``workdir``.

    ``hf_config``: the model's ``config.json`` (or a folder holding one), served under the recipe's hub id; without
    it, the HF cache. Nothing is downloaded. Bridge must be importable (on the CPU: through the CPU harness).
    """
    function = find_recipe(name)
    served = config_json(hf_config) if hf_config is not None else None
    overrides = tuple(overrides)
    container, asked = _call(name, function, served)
    folder = Path(workdir)
    # The file's name is the label check-config gives every value read from it.
    recipe_yaml = folder / f"the recipe {name}"
    container.to_yaml(str(recipe_yaml))
    recipe_flags = {flag: getattr(container.model, flag, None) for flag in FLAGS}
    container = _apply_overrides(name, container, overrides)
    _sync_sequence_length(container)
    final_yaml = folder / f"{name} with the overrides"
    container.to_yaml(str(final_yaml))
    return RecipeRun(name=name, function=f"{function.__module__}.{function.__qualname__}", overrides=overrides,
                     container=container, hub_ids=tuple(dict.fromkeys(asked.hub_ids)), served_from=asked.served_from,
                     config_file=_config_file(asked),
                     recipe_flags=recipe_flags, recipe_yaml=recipe_yaml, final_yaml=final_yaml)
