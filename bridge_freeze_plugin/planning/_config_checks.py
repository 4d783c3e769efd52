"""Check a local HF ``config.json`` before ``plan --hf-config`` converts and builds it.

Each refusal is a :class:`~bridge_freeze_plugin.errors.PlanError` naming the file, the key and the fix:

- the file itself: UTF-8 text, not empty, valid JSON, one JSON object at the top level;
- ``model_type``: present, a string, and a type the installed transformers knows or that
  :mod:`.offline_configs` reads offline (no remote code runs); otherwise the message lists the types plan reads;
- the sizes the build reads (:data:`SIZE_KEYS`, in every (sub-)config, under the key its class keeps each in:
  :mod:`.config_sizes`): a positive integer when they are integers (other wrong types are transformers' own
  field validation, translated by :func:`field_error`); and every integer size a (sub-)config holds at most
  :data:`~.config_sizes.MAX_SIZE`;
- the size of the build: a meta-device build takes time in proportion to the modules it creates, about
  one per layer and one per expert of a layer. :func:`layer_blocks` counts, over every (sub-)config,
  layers x (1 + experts per layer), each read by what the sub-config's class declares (a Whisper-style audio
  encoder's ``encoder_layers``); above ``max_layer_blocks`` (default :data:`DEFAULT_MAX_LAYER_BLOCKS`,
  0: no limit) the plan is refused before anything is built.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.errors import PlanError
from bridge_freeze_plugin.planning._config_sizes import aliases, check_size_limits, config_nodes, stack

#: Integer sizes the build reads: when one holds an integer, it must be positive (``null``: the default).
SIZE_KEYS = frozenset({
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "moe_intermediate_size", "vocab_size", "head_dim", "depth", "num_heads", "out_hidden_size", "patch_size",
    "num_layers",
})

#: Refuse a build above this many layer blocks: about twice Kimi K2.5's (61 layers x (384 + 1) + vision, about
#: 23,500), the largest family config. Measured on 2 shared cores: about 2 ms and 50 KB of memory per block
#: (Qwen3-VL-30B-A3B, 6,219 blocks: 15 s, 1 GB in all), so the limit is about 2 minutes and 3 GB.
DEFAULT_MAX_LAYER_BLOCKS = 50_000


#: A config.json is a few KB (Kimi K2.5's, the largest family config, about 10 KB; with a quantization section at
#: most tens of KB): a file larger than this, or nesting deeper, is not one, and is refused before it is parsed
#: whole (a JSON nested thousands deep overflows the parser's stack).
MAX_CONFIG_BYTES = 8 * 2**20
MAX_CONFIG_DEPTH = 64


def _nesting(doc: Any) -> int:
    """How deep ``doc``'s objects and arrays nest (iteratively: no recursion of ours to overflow)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, level = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_CONFIG_DEPTH:
            break
        stack.extend((child, level + 1) for child in children)
    return deepest


def read_config(cfg_file: Path) -> dict[str, Any]:
    """The JSON object in ``cfg_file``; a :class:`PlanError` for a file that is not one."""
    size = cfg_file.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise PlanError(f"{cfg_file} is {size / 2**20:.1f} MiB: a config.json is a few KB (at most "
                        f"{MAX_CONFIG_BYTES // 2**20} MiB are read); give the model's own config.json, not a "
                        f"weights or index file")
    raw = cfg_file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(f"{cfg_file} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
                        f"save config.json as UTF-8") from exc
    if not text.strip():
        raise PlanError(f"{cfg_file} is empty: give the model's config.json, one JSON object with its "
                        f"model_type and sizes")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{cfg_file} is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
                        f"fix the file; a config.json is one JSON object") from exc
    except RecursionError as exc:  # nested past the parser's stack
        raise PlanError(_too_deep(cfg_file)) from exc
    if _nesting(doc) > MAX_CONFIG_DEPTH:
        raise PlanError(_too_deep(cfg_file))
    if not isinstance(doc, dict):
        raise PlanError(f"{cfg_file} holds a JSON {_json_kind(doc)} at the top level: a config.json is one "
                        f'JSON object, {{"model_type": ..., ...}}; give the model\'s own config.json')
    return doc


def _too_deep(cfg_file: Path) -> str:
    return (f"{cfg_file} nests objects and arrays more than {MAX_CONFIG_DEPTH} levels deep: no model's config.json "
            f"does (a few levels: the model, its text and vision sub-configs); give the model's own config.json")


def _json_kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number", type(None): "null"}
    return kinds.get(type(value), type(value).__name__)


#: Where the families' model types are listed, for messages.
_TYPES_HINT = "e.g. \"qwen3_vl_moe\"; `bridge-freeze families --json` lists each family's hf_model_types"


def check_model_type(doc: dict[str, Any], cfg_file: Path) -> str:
    """``model_type``: present, a string, and either known to the installed transformers or read offline here."""
    if "model_type" not in doc:
        raise PlanError(f"{cfg_file} has no `model_type` key: add the model's Hugging Face type ({_TYPES_HINT})")
    model_type = doc["model_type"]
    if not isinstance(model_type, str):
        raise PlanError(f"{cfg_file}: `model_type` is {json.dumps(model_type)}, not a string: write the model's "
                        f"Hugging Face type as a string ({_TYPES_HINT})")
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from bridge_freeze_plugin.planning._offline_configs import OFFLINE_TYPES

    if model_type not in CONFIG_MAPPING_NAMES and model_type not in OFFLINE_TYPES \
            and not bridge_registers(model_type):
        raise PlanError(unknown_type_message(model_type, cfg_file, remote="auto_map" in doc))
    return model_type


def bridge_registers(model_type: str) -> bool:
    """Whether Megatron-Bridge registers ``model_type``'s config class with transformers when imported (its
    vendored configs: Qwen3-ASR, Step-3.7). Asked only for a registered family's type transformers does not know
    (the plan imports Bridge next anyway); any other type is answered without importing it."""
    from bridge_freeze_plugin.registry import list_families

    if not any(model_type in family.hf_model_types for family in list_families()):
        return False
    from transformers import CONFIG_MAPPING

    from bridge_freeze_harness.cpu_runtime import import_bridge

    import_bridge()
    return model_type in CONFIG_MAPPING


def unknown_type_message(model_type: str, cfg_file: Path, *, remote: bool) -> str:
    """What to do with a config whose ``model_type`` neither transformers nor the offline readers know."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    from bridge_freeze_harness.tiny import TINY_FAMILIES
    from bridge_freeze_plugin.planning._offline_configs import OFFLINE_TYPES
    from bridge_freeze_plugin.registry import list_families

    readable, tiny_only = [], []
    for family in list_families():
        for hf_type in family.hf_model_types:
            known = hf_type in CONFIG_MAPPING_NAMES or hf_type in OFFLINE_TYPES or _registered_now(hf_type)
            if known:
                readable.append(f"{hf_type} ({family.name})")
            elif family.name in TINY_FAMILIES:
                tiny_only.append(f"{hf_type} ({family.name})")
    what = ("remote code (its auto_map names files on the hub, which plan never runs nor downloads)" if remote
            else "a model type")
    owner = next((family for family in list_families() if model_type in family.hf_model_types), None)
    if owner is not None:
        siblings = [
            f"{t}: " + ("the maker's remote-code format of the same model, read offline" if t in OFFLINE_TYPES
                        else "transformers' own format of the same model")
            for t in owner.hf_model_types if f"{t} ({owner.name})" in readable
        ]
        options = [f"plan a config of the family's type that plan reads ({'; '.join(siblings)})"] if siblings else []
        if owner.name in TINY_FAMILIES:
            options.append(f"plan the family's tiny configuration (bridge-freeze plan {owner.name} --tiny: the "
                           f"full model's parts and prefixes, not its sizes)")
        else:
            options.append(f"plan it from a config.json once transformers knows {model_type!r} (there is no tiny "
                           f"configuration of {owner.name} here)")
        return (
            f"{cfg_file}: `model_type` {model_type!r} is the {owner.name} family's, and {what} that neither "
            f"transformers {transformers.__version__} nor plan's offline readers build: {', or '.join(options)}"
        )
    return (
        f"{cfg_file}: `model_type` {model_type!r} is {what} that neither transformers {transformers.__version__} "
        f"nor plan's offline readers know. plan reads configs of these types: {', '.join(readable)}; these "
        f"registered types can be planned only with --tiny here: {', '.join(tiny_only) or 'none'}. For a model "
        f"of another family, plan it once a bridge-freeze family covers it (bridge-freeze families); for a newer "
        f"transformers model, install a transformers that has {model_type!r}"
    )


def _registered_now(model_type: str) -> bool:
    """Registered with transformers by an import already made (Bridge's vendored configs); imports nothing."""
    import sys

    if "megatron.bridge" not in sys.modules:
        return False
    from transformers import CONFIG_MAPPING

    return model_type in CONFIG_MAPPING


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every JSON object in the config, with its dotted path ("" for the top level)."""
    yield path, node
    for key, value in node.items():
        if isinstance(value, dict):
            yield from _walk(value, f"{path}{key}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_sizes(doc: dict[str, Any], cfg_file: Path) -> None:
    """Every integer size the build reads is positive (under the name its class keeps it, e.g. ``d_model``)."""
    for path, node, cls in config_nodes(doc):
        keys = {alias for name in SIZE_KEYS for alias in aliases(cls, name)}
        for key in sorted(keys & node.keys()):
            value = node[key]
            if _is_int(value) and value < 1:
                raise PlanError(f"{cfg_file}: `{path}{key}` is {value}, but a size must be a positive integer: "
                                f"fix `{path}{key}` in config.json")


def layer_blocks(doc: dict[str, Any]) -> list[tuple[str, int, int, int]]:
    """``(dotted layer key, layers, experts per layer, layers x (1 + experts))`` for every stack of the config
    (:func:`.config_sizes.stack`: by what each sub-config's class declares), largest first."""
    blocks = []
    for path, node, cls in config_nodes(doc):
        found = stack(node, cls)
        if found is not None:
            key, layers, experts = found
            blocks.append((f"{path}{key}", layers, experts, layers * (1 + experts)))
    return sorted(blocks, key=lambda item: -item[3])


def check_build_size(doc: dict[str, Any], cfg_file: Path, max_layer_blocks: int) -> None:
    """Refuse a config whose build would create more than ``max_layer_blocks`` layer blocks (0: no limit)."""
    blocks = layer_blocks(doc)
    total = sum(item[3] for item in blocks)
    if max_layer_blocks and total > max_layer_blocks:
        where = ", ".join(f"`{key}` = {layers:,}" + (f" x (1 + {experts:,} experts)" if experts else "") + f": {n:,}"
                          for key, layers, experts, n in blocks[:3])
        raise PlanError(
            f"{cfg_file} would build {total:,} layer blocks (layers x (1 + experts), per stack: {where}), more "
            f"than the limit of {max_layer_blocks:,} (a build takes time in proportion): check those keys, or "
            f"raise the limit with --max-layer-blocks N (0: no limit)"
        )


def check_hf_config(cfg_file: Path, *, max_layer_blocks: int = DEFAULT_MAX_LAYER_BLOCKS) -> dict[str, Any]:
    """All the checks above, in order; the config's JSON object."""
    doc = read_config(cfg_file)
    check_model_type(doc, cfg_file)
    check_sizes(doc, cfg_file)
    check_size_limits(doc, cfg_file)
    check_build_size(doc, cfg_file, max_layer_blocks)
    return doc


_FIELD = re.compile(r"field '([^']+)'")
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")


def field_error(exc: Exception, doc: dict[str, Any], cfg_file: Path) -> PlanError:
    """transformers' own field validation error, as one line naming the file, the key and the fix."""
    text = str(exc)
    found = _FIELD.search(text)
    field = found.group(1) if found else "?"
    cause = " ".join(line.strip() for line in text.splitlines()[1:] if line.strip()) or text
    cause = _CLASS.sub(r"\1", cause.split(". Errors:", 1)[0])
    paths = [f"{path}{field}" for path, node in _walk(doc) if field in node]
    wrong = [p for p in paths if re.search(rf"value:? {re.escape(repr(_value_at(doc, p)))}(?![\w.])", text)]
    keys = ", ".join(f"`{p}` = {json.dumps(_value_at(doc, p))}" for p in (wrong or paths or [field])[:3])
    return PlanError(f"{cfg_file}: {keys} is not what transformers accepts ({cause}): fix the value in config.json")


def _value_at(doc: dict[str, Any], dotted: str) -> Any:
    node: Any = doc
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return node
