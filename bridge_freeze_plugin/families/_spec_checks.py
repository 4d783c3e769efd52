"""The checks a :class:`~bridge_freeze_plugin.families._spec.FamilySpec` makes of its fields when it is made:
string lists, text fields, provider paths and prefixes."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from bridge_freeze_plugin.errors import FamilyRegistrationError
from bridge_freeze_plugin.request import FLAGS, Part

#: Wrappers (Float16Module, DDP) put their wrapped module under this attribute.
WRAPPER_PREFIX = "module."


def class_path(cls: type) -> str:
    """``"module:QualName"`` of a class, the form provider paths are registered in."""
    return f"{cls.__module__}:{cls.__qualname__}"


#: A family name: what ``plan``, ``check-config --family`` and ``get_family()`` take.
_FAMILY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
#: One segment of a module path as ``named_parameters()`` spells it: an attribute name, or a list index.
_SEGMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+")


#: The fields that hold a sequence of strings (a provider may also be given as a class).
SEQUENCE_FIELDS = ("providers", "language_model", "vision_model", "vision_projection", "other", "hf_model_types",
                   "no_full_recompute", "full_recompute_affects", "plain_linear", "provider_flag_defaults")
#: The parts with a keyword of their own (the vision-language parts); any part may be given in ``parts=``.
_KEYWORD_PARTS = ("language_model", "vision_model", "vision_projection")
#: The fields that hold one string.
TEXT_FIELDS = ("description", "recompute_note", "source")


def _string_tuple(family: Any, attr: str, value: Any) -> tuple[str, ...]:
    """``value`` as a tuple of strings (a provider class object is written as its import path).

    A ``str`` (or ``bytes``) is refused rather than split into single letters, a mapping rather than read for its
    keys, and so is an empty string in the list.
    """
    example = "['package.module:ClassName']" if attr == "providers" else "['language_model']"
    if isinstance(value, str | bytes | bytearray | memoryview):
        kind = "string" if isinstance(value, str) else type(value).__name__
        raise FamilyRegistrationError(
            f"family {family!r}: {attr} must be a list of strings, e.g. {example}, not the {kind} {value!r} (which "
            f"would be read one letter at a time); write {attr}=[{value!r}] (a one-element tuple needs a trailing "
            f"comma: ({value!r},))"
        )
    if isinstance(value, Mapping) or not isinstance(value, Iterable):
        raise FamilyRegistrationError(
            f"family {family!r}: {attr} must be a list of strings, e.g. {example}, not {type(value).__name__} "
            f"{value!r}"
        )
    items = []
    for item in value:
        if attr == "providers" and isinstance(item, type):
            item = class_path(item)
        if not isinstance(item, str) or not item:
            what = "'package.module:ClassName' strings or classes" if attr == "providers" else "non-empty strings"
            raise FamilyRegistrationError(
                f"family {family!r}: {attr} must hold {what}, got {type(item).__name__} {item!r} in {value!r}"
            )
        items.append(item)
    return tuple(items)


def _check_scalars(spec: Any) -> None:
    for attr in TEXT_FIELDS:
        value = getattr(spec, attr)
        if not isinstance(value, str):
            raise FamilyRegistrationError(
                f"family {spec.name!r}: {attr} must be a string, not {type(value).__name__} {value!r}"
            )


def _check_providers(family: str, providers: tuple[str, ...]) -> None:
    if not providers:
        raise FamilyRegistrationError(f"family {family!r} names no provider class")
    for path in providers:
        module, sep, qualname = path.partition(":")
        dotted = [*module.split("."), *(s for s in qualname.split(".") if s != "<locals>")]
        if not sep or not module or not qualname or not all(s.isidentifier() for s in dotted):
            raise FamilyRegistrationError(
                f"family {family!r}: provider {path!r} must be written 'package.module:ClassName'"
            )


def _check_prefix(family: str, part: Part, prefix: str) -> None:
    """A prefix names a module as a bare chunk's ``named_parameters()`` does, or it could never match."""
    segments = prefix.split(".")
    if all(_SEGMENT.fullmatch(s) for s in segments) and segments[0] != WRAPPER_PREFIX.rstrip("."):
        return
    if segments[0] == WRAPPER_PREFIX.rstrip("."):
        why = "names a wrapper's 'module.' level, which a bare chunk does not have: drop the 'module.'"
    else:
        why = ("is not a dotted module path (attribute names and list indices only: no spaces, wildcards or "
               "regular expressions; a prefix covers every parameter below it)")
    raise FamilyRegistrationError(
        f"family {family!r}: bad prefix {prefix!r} for {part.value}: it can never match a parameter, since it {why}"
    )


def _check_flag_defaults(spec: Any) -> None:
    """``provider_flag_defaults`` names flags of the vocabulary, each once."""
    wrong = [f for f in spec.provider_flag_defaults if f not in FLAGS]
    if wrong or len(set(spec.provider_flag_defaults)) != len(spec.provider_flag_defaults):
        raise FamilyRegistrationError(
            f"family {spec.name!r}: provider_flag_defaults names the flags its provider defaults to true, each once "
            f"({', '.join(FLAGS)}); got {list(spec.provider_flag_defaults)}")


def _check_offline_configs(spec: Any, offline_type: type) -> tuple[Any, ...]:
    """``offline_configs`` as a tuple of ``offline_type`` (:class:`~._spec.OfflineConfig`), each for one of the
    family's ``hf_model_types``, read by a ``reader`` path or by its ``sub_configs``, not both."""
    given = spec.offline_configs
    if isinstance(given, str | bytes | Mapping) or not isinstance(given, Iterable):
        given = (given,)
    configs = tuple(given)
    seen: set[str] = set()
    for item in configs:
        if not isinstance(item, offline_type):
            raise FamilyRegistrationError(
                f"family {spec.name!r}: offline_configs must hold OfflineConfig(model_type=..., ...), got {item!r}")
        if item.model_type not in spec.hf_model_types or item.model_type in seen:
            raise FamilyRegistrationError(
                f"family {spec.name!r}: offline config {item.model_type!r} must be one of its hf_model_types "
                f"{list(spec.hf_model_types)}, listed once")
        seen.add(item.model_type)
        module, sep, function = item.reader.partition(":")
        path_ok = not item.reader or (sep and all(s.isidentifier() for s in (*module.split("."), function)))
        if not path_ok or bool(item.reader) == bool(item.sub_configs):
            raise FamilyRegistrationError(
                f"family {spec.name!r}: offline config {item.model_type!r} is read either by a reader "
                f"('package.module:function') or by its sub_configs (keys of types transformers has), one of the "
                f"two; got reader={item.reader!r}, sub_configs={list(item.sub_configs)}")
    return configs


def linear_leaf_table(spec: Any, given: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``linear_leaves`` as sorted ``(part, leaves)`` pairs: each key a part the family has (or ``"other"``), each
    leaf one module-name segment."""
    items = given.items() if isinstance(given, Mapping) else given
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise FamilyRegistrationError(f"family {spec.name!r}: linear_leaves must map part names to leaf names, e.g. "
                                      f"{{'language_model': ['linear_qkv']}}, not {type(given).__name__} {given!r}")
    known = {p.value for p in spec.part_names()} | {Part.OTHER.value}
    table = {}
    for item in items:
        if not (isinstance(item, tuple | list) and len(item) == 2) or str(item[0]) not in known:
            raise FamilyRegistrationError(
                f"family {spec.name!r}: linear_leaves names {item!r}; its keys are the family's parts "
                f"({', '.join(sorted(known))})")
        leaves = _string_tuple(spec.name, f"linear_leaves[{item[0]!r}]", item[1])
        bad = [leaf for leaf in leaves if not _SEGMENT.fullmatch(leaf)]
        if bad:
            raise FamilyRegistrationError(
                f"family {spec.name!r}: linear_leaves[{item[0]!r}] holds {bad}, which are no module-name segment")
        table[str(item[0])] = tuple(sorted(set(leaves)))
    return tuple(sorted(table.items()))
