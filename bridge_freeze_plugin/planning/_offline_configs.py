"""Read a ``config.json`` whose ``model_type`` is hub remote code, offline, the way the CPU harness builds it.

Some makers publish their model as remote code (``auto_map`` names ``configuration_*.py`` / ``modeling_*.py``
files in the model repository): the installed transformers does not know the ``model_type``, and ``plan``
never runs remote code nor contacts the hub. A family declares the remote-code types it can read offline in its
family module (``FamilySpec.offline_configs``, one :class:`~bridge_freeze_plugin.families.OfflineConfig` each):

- a wrapper whose sub-configs are types transformers has itself (Nemotron Nano V2 VL's ``llm_config``, transformers'
  ``nemotron_h``; Nemotron 3 Nano Omni's, plus its ``vision_config`` / ``sound_config`` that Bridge reads by
  attribute) is read here, by :func:`native_sub_configs`;
- any other names its own reader (Kimi K2.5-VL: the harness's ``kimi_k25_vl.read_offline_config``, which answers
  the model's hub look-ups with the harness's offline stand-ins).

:data:`OFFLINE_TYPES` lists them; :mod:`.config_checks` lets them through and names them in its message for a
``model_type`` nothing here knows.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.families import OfflineConfig
from bridge_freeze_plugin.registry import list_families

#: Keys a config.json's sub-config may carry that describe the remote code, not the model.
_REMOTE_KEYS = ("auto_map", "architectures", "model_type")


def native_sub_configs(*keys: str, objects: tuple[str, ...] = ()) -> Callable[[dict[str, Any], Path], Any]:
    """A reader for a remote-code wrapper whose sub-configs ``keys`` are types transformers has itself.

    Each sub-config is read by transformers' own class for the ``model_type`` written in it (its remote-code keys
    dropped); the wrapper's other keys are kept as published, as plain values on a ``PretrainedConfig``, except
    ``objects``: keys whose JSON objects the maker's remote config class holds as config objects of its own (each
    published key an attribute, ``model_type`` included), read as such, a ``PretrainedConfig`` each, so that a
    conversion reading ``config.<key>.<field>`` sees the published value. One absent or null is kept as published.
    """

    def read(doc: dict[str, Any], cfg_file: Path) -> Any:
        import transformers
        from transformers import AutoConfig, PretrainedConfig
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        sub_configs = {}
        for key in keys:
            sub = doc.get(key)
            if not isinstance(sub, dict):
                raise PlanError(f"{cfg_file}: a {doc['model_type']} config needs a `{key}` object (the published "
                                f"config.json has one): give the model's own config.json")
            sub_type = sub.get("model_type")
            if sub_type not in CONFIG_MAPPING_NAMES:
                raise PlanError(f"{cfg_file}: `{key}.model_type` is {json.dumps(sub_type)}, not a type transformers "
                                f"{transformers.__version__} knows: give the model's own config.json")
            sub_configs[key] = AutoConfig.for_model(sub_type, **{k: v for k, v in sub.items()
                                                                 if k not in _REMOTE_KEYS})
        for key in objects:
            sub = doc.get(key)
            if sub is None:
                continue
            if not isinstance(sub, dict):
                raise PlanError(f"{cfg_file}: `{key}` is {json.dumps(sub)}, not a JSON object (the published "
                                f"config.json has one): give the model's own config.json")
            sub_configs[key] = PretrainedConfig(**sub)
        config = PretrainedConfig(**{k: v for k, v in doc.items() if k not in (*sub_configs, *keys, "model_type")})
        for key, sub_config in sub_configs.items():
            setattr(config, key, sub_config)
        return config

    return read


class _OfflineTypes(Mapping[str, tuple[str, OfflineConfig]]):
    """Remote-code ``model_type`` -> (registry family, its :class:`OfflineConfig`), read from the registered
    families' declarations on each use (an entry-point family's too)."""

    def _table(self) -> dict[str, tuple[str, OfflineConfig]]:
        return {c.model_type: (f.name, c) for f in list_families() for c in f.offline_configs}

    def __getitem__(self, model_type: str) -> tuple[str, OfflineConfig]:
        return self._table()[model_type]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


OFFLINE_TYPES: Mapping[str, tuple[str, OfflineConfig]] = _OfflineTypes()


def _reader(offline: OfflineConfig) -> Callable[[dict[str, Any], Path], Any]:
    """The reader an :class:`OfflineConfig` declares: its own function, else :func:`native_sub_configs`."""
    if not offline.reader:
        return native_sub_configs(*offline.sub_configs, objects=offline.objects)
    module, _, function = offline.reader.partition(":")
    return getattr(importlib.import_module(module), function)


def read_offline(doc: dict[str, Any], cfg_file: Path) -> Any:
    """The transformers-like config of ``doc`` (a ``model_type`` in :data:`OFFLINE_TYPES`)."""
    _, offline = OFFLINE_TYPES[doc["model_type"]]
    try:
        return _reader(offline)(doc, cfg_file)
    except PlanError:
        raise
    except Exception as exc:  # transformers' own validation of a sub-config: the config's fault
        text = " ".join(str(exc).split())
        raise PlanError(f"cannot read {cfg_file} as a {doc['model_type']} config: {type(exc).__name__}: "
                        f"{text}") from exc
