"""YAML loaders that read a Python enum tag as its plain value, never constructing a Python object.

SkyRL dumps its configs with PyYAML's ``yaml.dump(asdict(cfg))`` (``get_config_as_yaml_str``): an enum field
(``SFTConfig.train_on_what``, a ``TrainOnWhat``) comes out as ``!!python/object/apply:<module>.<Enum>`` over a
one-item list, its value. A safe loader refuses every Python tag; these loaders read that one shape as the value
(what SkyRL's loader turns back into the enum) when the tag names an enum of SkyRL's config classes and the value
is one of its members, and still refuse any other Python tag.
"""

from __future__ import annotations

from typing import Any

import yaml

_APPLY = "tag:yaml.org,2002:python/object/apply:"


def _enum_value(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    from bridge_freeze_plugin.config._skyrl_fields import known_enums

    members = known_enums().get(suffix)
    if members is not None and isinstance(node, yaml.SequenceNode) and len(node.value) == 1 \
            and isinstance(node.value[0], yaml.ScalarNode):
        value = loader.construct_object(node.value[0], deep=True)
        if value in members:
            return value
    raise yaml.constructor.ConstructorError(
        None, None, f"the tag !!python/object/apply:{suffix} is read only as a value of an enum of SkyRL's config "
        f"classes ({', '.join(sorted(known_enums())) or 'none known'}), as PyYAML dumps it; this one would construct "
        "a Python object, which a config reader never does", node.start_mark)


def with_enum_values(base: type[yaml.SafeLoader]) -> type[yaml.SafeLoader]:
    """``base`` (a safe loader class) reading ``!!python/object/apply:X [value]`` as ``value``."""
    loader = type(f"{base.__name__}WithEnumValues", (base,), {})
    loader.add_multi_constructor(_APPLY, _enum_value)
    return loader


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` reading enum tags as their values."""
    return yaml.load(text, Loader=_SAFE)  # a SafeLoader subclass: no object is built


_SAFE = with_enum_values(yaml.SafeLoader)
