"""The sizes of a ``config.json``'s (sub-)configs, read by what each config class declares.

A config is a tree of (sub-)configs: the top, and each JSON object its class declares a sub-config
(``sub_configs``: ``text_config``, ``vision_config``, ``audio_config``, ``thinker_config`` ...), that names a
``model_type`` of its own, or that its class does not declare at all (read by a conversion as it is, e.g.
MiniMax-M3's ``img_token_compression_config``); an object the class declares of another type (``rope_parameters``)
is a value, not a sub-config. Each node's class is the one its parent declares for it, else the transformers class of
its ``model_type``; a node no class describes (a maker's remote-code config, read offline as plain values) is
*plain*, and every object in it is read as part of it.

Per node, without building or even instantiating anything (a config class's ``__init__`` may itself make a list
per layer):

- :func:`config_nodes` walks the nodes;
- :func:`aliases` gives the JSON keys that hold a standard transformers size (``num_hidden_layers``,
  ``hidden_size`` ...): the name itself and what the class's ``attribute_map`` maps it to (a Whisper-style encoder
  keeps its layers in ``encoder_layers``, its width in ``d_model``);
- :func:`size_fields` gives the integer fields that are sizes: every integer the node holds except token ids
  (``*_id``, ``*_index``, ``*_ids``) and the fields its class declares of another type (a ``float`` such as
  ``rope_theta`` written as ``10000``). Any of them above :data:`MAX_SIZE` is refused
  (:func:`check_size_limits`);
- :func:`stack` gives a node's layer count and routed experts per layer, for the build-size check.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import PlanError

#: No size a config declares may exceed this: about 16 times the largest in any published config plan reads
#: (``max_position_embeddings`` 1,048,576; widths and vocabularies are far below). Above it a meta build may make
#: real tensors of that length (rotary tables) or take minutes; it is a typo, not a model.
MAX_SIZE = 2**24

#: transformers' standard names of a stack's layer count and of its routed experts per layer; a class's
#: ``attribute_map`` says which of its own keys holds them.
LAYER_KEYS = ("num_hidden_layers", "num_layers", "depth", "n_layers")
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")

_ID_SUFFIXES = ("_id", "_ids", "_index")


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _class_of(node: dict[str, Any], declared: Any) -> type | None:
    from transformers import CONFIG_MAPPING, PretrainedConfig

    if isinstance(declared, type) and issubclass(declared, PretrainedConfig):
        return declared
    model_type = node.get("model_type")
    if isinstance(model_type, str) and model_type in CONFIG_MAPPING:
        return CONFIG_MAPPING[model_type]
    return None


def config_nodes(doc: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], type | None]]:
    """Every (sub-)config: ``(dotted path prefix, JSON object, its config class or None: plain)``."""
    yield from _nodes(doc, "", _class_of(doc, None))


def _nodes(node: dict[str, Any], path: str, cls: type | None) -> Iterator[tuple[str, dict[str, Any], type | None]]:
    yield path, node, cls
    subs = getattr(cls, "sub_configs", None) or {}
    declared = _declared_types(cls)
    for key, value in node.items():
        if not isinstance(value, dict):
            continue
        if cls is None or key in subs or "model_type" in value or key not in declared:
            yield from _nodes(value, f"{path}{key}.", _class_of(value, subs.get(key)))


def aliases(cls: type | None, name: str) -> tuple[str, ...]:
    """The JSON keys that may hold the standard size ``name`` in a node of class ``cls``."""
    mapped = (getattr(cls, "attribute_map", None) or {}).get(name) if cls is not None else None
    return (name, mapped) if mapped and mapped != name else (name,)


def _declared_types(cls: type | None) -> dict[str, Any]:
    """Field -> annotation, over the class and its bases (transformers declares each field's type)."""
    if cls is None:
        return {}
    declared: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        declared.update(getattr(klass, "__annotations__", {}) or {})
    return declared


def _allows_int(annotation: Any) -> bool:
    if isinstance(annotation, str):
        words = annotation.replace("|", " ").replace("[", " ").replace("]", " ").replace(",", " ").split()
        return "int" in words or "Any" in words
    if annotation is int or annotation is Any:
        return True
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return any(_allows_int(arg) for arg in typing.get_args(annotation))
    return False


def size_fields(node: dict[str, Any], cls: type | None) -> Iterator[tuple[str, int]]:
    """``(key, value)`` of the node's integer sizes (module docstring)."""
    declared = _declared_types(cls)
    for key, value in node.items():
        if not is_int(value) or key.endswith(_ID_SUFFIXES):
            continue
        if key in declared and not _allows_int(declared[key]):
            continue  # the class reads it as another type (a float written as an integer)
        yield key, value


def stack(node: dict[str, Any], cls: type | None) -> tuple[str, int, int] | None:
    """``(layer key, layers, routed experts per layer)`` of a node that holds a layer count, else None.

    The layer count is the largest of the standard names (and the class's aliases of them); a plain node's
    other ``*layers`` integers count too (a remote-code config's own spelling, e.g. ``vt_num_hidden_layers``)."""
    keys = [alias for name in LAYER_KEYS for alias in aliases(cls, name)]
    if cls is None:
        keys += [k for k in node if k.endswith("layers") and k not in keys]
    layers = [(node[k], k) for k in keys if is_int(node.get(k))]
    if not layers:
        return None
    count, key = max(layers)
    experts = [0]
    for name in EXPERT_KEYS:
        for alias in aliases(cls, name):
            value = node.get(alias)
            if is_int(value):
                experts.append(max(value, 0))
            elif isinstance(value, list):
                experts.append(sum(max(v, 0) for v in value if is_int(v)))
    return key, max(count, 0), max(experts)


def check_size_limits(doc: dict[str, Any], cfg_file: Path) -> None:
    """Refuse any (sub-)config size above :data:`MAX_SIZE`, naming the key, its value and the class."""
    for path, node, cls in config_nodes(doc):
        for key, value in size_fields(node, cls):
            if value > MAX_SIZE:
                what = f"{cls.__name__} declares" if cls is not None else "plan reads"
                raise PlanError(
                    f"{cfg_file}: `{path}{key}` is {value:,}, more than {MAX_SIZE:,}, the largest size plan builds "
                    f"({what} it as an integer size; no published model comes near, and a meta build of such a "
                    f"size makes real tensors of that length or runs for minutes): fix `{path}{key}` in config.json")

