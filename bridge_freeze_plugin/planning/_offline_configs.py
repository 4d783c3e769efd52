"""Read a ``config.json`` whose ``model_type`` is hub remote code, offline, the way the CPU harness builds it.

Some makers publish their model as remote code (``auto_map`` names ``configuration_*.py`` / ``modeling_*.py``
files in the model repository): the installed transformers does not know the ``model_type``, and ``plan``
never runs remote code nor contacts the hub. For the families whose remote pieces the harness has offline
stand-ins for, the config is read here into the objects Megatron-Bridge's conversion reads:

- ``kimi_k25`` (Kimi K2.5-VL): the text config is DeepSeek-V3's (transformers' own ``DeepseekV3Config``),
  the vision config keeps the published keys (the harness's ``KimiK25VisionConfig``), and the model's two
  hub look-ups (remote vision classes, vision config) are answered by the harness's ``kimi_k25_vl``
  ``cpu_patches`` for this config's folder (:func:`bridge_freeze_harness.tiny.kimi_k25_vl.register_offline_model`),
  with structural stand-ins whose parameter names and shapes are the published checkpoint's.
- ``NemotronH_Nano_VL_V2`` (Nemotron Nano V2 VL): a wrapper whose ``llm_config`` is transformers' own
  ``nemotron_h`` (read with transformers' ``NemotronHConfig``); Bridge's conversion reads nothing else and builds
  the RADIO tower and the projector from its provider alone, so no remote piece is needed. The other wrapper keys
  (``vision_config``, ``vit_hidden_size``, ...) are kept as published, as plain values.
- ``NemotronH_Nano_Omni_Reasoning_V3`` (Nemotron 3 Nano Omni): the same wrapper with a ``sound_config``; its
  ``llm_config`` is read the same way. Bridge's ``NemotronOmniBridge`` also reads ``sound_config`` (Parakeet sizes,
  by attribute and ``to_dict()``) and ``vision_config.separate_video_embedder`` (by attribute: the published
  ``true`` adds RADIO's video embedder), which the maker's config class holds as config objects of its own
  (``SoundConfig``, ``RADIOConfig``: each published key an attribute); they are read as such, as plain
  ``PretrainedConfig`` objects. The towers themselves come from Bridge's provider and transformers'
  ``ParakeetEncoder``, so no remote piece is needed.

:data:`OFFLINE_TYPES` lists them; :mod:`.config_checks` lets them through and names them in its message for a
``model_type`` nothing here knows.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import PlanError

#: Keys a config.json's sub-config may carry that describe the remote code, not the model.
_REMOTE_KEYS = ("auto_map", "architectures", "model_type")


def _kimi_k25(doc: dict[str, Any], cfg_file: Path) -> Any:
    from transformers import AutoConfig, PretrainedConfig

    from bridge_freeze_harness.tiny._kimi_remote_code import KimiK25VisionConfig
    from bridge_freeze_harness.tiny.kimi_k25_vl import register_offline_model

    for key in ("text_config", "vision_config"):
        if not isinstance(doc.get(key), dict):
            raise PlanError(f"{cfg_file}: a kimi_k25 config needs a `{key}` object (the published config.json "
                            f"has one): give the model's own config.json")
    text = {k: v for k, v in doc["text_config"].items() if k not in _REMOTE_KEYS}
    text_config = AutoConfig.for_model("deepseek_v3", **text)  # Kimi K2's text model is DeepSeek-V3's
    vision_config = KimiK25VisionConfig(**{k: v for k, v in doc["vision_config"].items() if k != "model_type"})
    top = {k: v for k, v in doc.items() if k not in ("text_config", "vision_config", "model_type")}
    config = PretrainedConfig(**top)
    config.text_config = text_config
    config.vision_config = vision_config
    path = str(cfg_file.resolve().parent)
    config._name_or_path = path  # Bridge's hf_model_path: where the model looks its remote classes up
    # The model refuses to look them up without it; the look-ups for ``path`` are answered by the harness's
    # stand-ins, and plan runs with the hub offline, so no remote code is fetched or run.
    config.trust_remote_code = True
    register_offline_model(path, vision_config)
    return config


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


#: Remote-code ``model_type`` -> (registry family, reader of the config.json's JSON object).
OFFLINE_TYPES: dict[str, tuple[str, Callable[[dict[str, Any], Path], Any]]] = {
    "kimi_k25": ("kimi_k25_vl", _kimi_k25),
    "NemotronH_Nano_VL_V2": ("nemotron_vl", native_sub_configs("llm_config")),
    "NemotronH_Nano_Omni_Reasoning_V3": ("nemotron_omni", native_sub_configs(
        "llm_config", objects=("vision_config", "sound_config"))),
}


def read_offline(doc: dict[str, Any], cfg_file: Path) -> Any:
    """The transformers-like config of ``doc`` (a ``model_type`` in :data:`OFFLINE_TYPES`)."""
    _, reader = OFFLINE_TYPES[doc["model_type"]]
    try:
        return reader(doc, cfg_file)
    except PlanError:
        raise
    except Exception as exc:  # transformers' own validation of a sub-config: the config's fault
        text = " ".join(str(exc).split())
        raise PlanError(f"cannot read {cfg_file} as a {doc['model_type']} config: {type(exc).__name__}: "
                        f"{text}") from exc
