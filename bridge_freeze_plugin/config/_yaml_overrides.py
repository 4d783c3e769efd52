"""Safe YAML reading and Hydra-style command-line overrides: a config as the user wrote it, each value with its source.

Nothing the user wrote is dropped: a file that holds no mapping, an override whose key has an empty
segment or whose value is not YAML, a Hydra ``+key`` that adds an existing key or a ``~key`` that deletes
a missing one are each a :class:`ConfigLoadError` naming the file or the override. So is a config nested
deeper than :data:`MAX_DEPTH` levels (OmegaConf recurses once per level and would run out of stack), YAML whose
aliases expand past :data:`MAX_NODES` values or refer to themselves, a file that is not a regular file or is
larger than :data:`MAX_FILE_BYTES`, and an override that sets a key below a scalar or a list (below null, a key
starts the section, as Hydra does). Every value keeps where it came from
(:class:`Provenance`), so the rules can say it. Reading a file: :mod:`._yaml_files`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.errors import ConfigLoadError

#: How deep a config may nest (mappings and lists). Real training configs nest under ten levels; OmegaConf
#: recurses once per level (several frames each) and fails past about seventy.
MAX_DEPTH = 32
#: How many values a config may hold once YAML aliases are expanded (OmegaConf expands them: ``&a [*b, *b...]``
#: nested a few times is billions). Real training configs hold a few thousand.
MAX_NODES = 200_000
#: The largest config file read (real ones are kilobytes; a device or a runaway file is refused, never read).
MAX_FILE_BYTES = 16 * 1024 * 1024
#: How much of an offending value or library message an error quotes.
_QUOTE = 160
#: What an override does: ``key=v`` sets, ``+key=v`` adds a missing key, ``++key=v`` adds or sets,
#: ``~key`` (or ``~key=v``) deletes.
Operation = Literal["set", "add", "force", "delete"]
_PREFIXES: tuple[tuple[str, Operation], ...] = (("++", "force"), ("+", "add"), ("~", "delete"))


def brief(value: Any) -> str:
    """``value``'s text, cut to a readable length for a one-line error."""
    text = " ".join(str(value).split())
    return text if len(text) <= _QUOTE else text[: _QUOTE - 3] + "..."


def depth(value: Any) -> int:
    """How many mapping / list levels ``value`` nests (0 for a scalar); counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, DictConfig | ListConfig):
            node = node._content if isinstance(node._content, dict | list) else ()
            node = node.values() if isinstance(node, dict) else node
        elif isinstance(node, Mapping):
            node = node.values()
        elif not isinstance(node, list | tuple):
            continue
        deepest = max(deepest, level)
        if level <= MAX_DEPTH:  # deeper is already too deep: no need to walk on
            stack.extend((child, level + 1) for child in node)
    return deepest


def check_depth(value: Any, what: str, base: int = 0) -> None:
    """A :class:`ConfigLoadError` when ``value`` (placed ``base`` levels down) nests deeper than :data:`MAX_DEPTH`."""
    if base + depth(value) > MAX_DEPTH:
        raise ConfigLoadError(
            f"{what} nests more than {MAX_DEPTH} levels deep (mappings and lists): no training config does; "
            "check for a runaway or generated structure and flatten it"
        )


def check_yaml(text: str, what: str) -> None:
    """Refuse YAML that nests past :data:`MAX_DEPTH`, expands past :data:`MAX_NODES` values through its aliases, or
    refers to itself (an alias inside its own anchor), before anything expands it. Unparsable text passes: the
    reader that follows says what is wrong with it."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except RecursionError:
        raise ConfigLoadError(f"{what} nests more than {MAX_DEPTH} levels deep (mappings and lists): no training "
                              "config does; check for a runaway or generated structure and flatten it") from None
    except yaml.YAMLError:
        return
    if root is None:
        return
    # Post-order walk over the node graph (an alias is the same node object): expanded size and depth, memoised.
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _yaml_children(node)
        if done:
            open_.discard(key)
            size = 1 + sum(sizes[id(c)][0] for c in children)
            deep = 1 + max((sizes[id(c)][1] for c in children), default=0) if children else 0
            sizes[key] = (size, deep)
            if size > MAX_NODES:
                raise ConfigLoadError(
                    f"{what} expands to more than {MAX_NODES} values (YAML aliases repeat their anchor): no "
                    "training config does; write the values out, or reuse them with ${{interpolations}}"
                )
            if deep > MAX_DEPTH:
                raise ConfigLoadError(
                    f"{what} nests more than {MAX_DEPTH} levels deep (mappings and lists): no training config does; "
                    "check for a runaway or generated structure and flatten it"
                )
            continue
        if key in sizes:
            continue
        if key in open_:
            raise ConfigLoadError(f"{what} refers to itself (a YAML alias inside its own anchor), which has no "
                                  "finite value; remove the alias")
        open_.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in children if id(child) not in sizes)


def _yaml_children(node: Any) -> list[Any]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


#: What :func:`lookup` finds at a dotted key.
ABSENT, FOUND, BLOCKED = "absent", "found", "blocked"


def lookup(cfg: DictConfig, key: str) -> tuple[str, Any, str]:
    """``(state, node, where)`` of a dotted key, never resolving an interpolation.

    ``FOUND``: the key's node; ``ABSENT``: a level is missing (every level above it a mapping); ``BLOCKED``: a
    level above the key holds something other than a mapping (a scalar, a list, null, an interpolation), and
    ``where`` names that level.
    """
    node: Any = cfg
    done: list[str] = []
    for part in key.split("."):
        if not isinstance(node, DictConfig) or node._is_none() or node._is_missing() or node._is_interpolation():
            return BLOCKED, node, ".".join(done)
        child = node._get_node(part, validate_access=False, throw_on_missing_key=False)
        if child is None:
            return ABSENT, None, ".".join(done)
        node = child
        done.append(part)
    return FOUND, node, key


class Provenance:
    """Where each value came from: dotted key path -> a label (``sft.yaml``, ``override 'a=1'``...)."""

    def __init__(self) -> None:
        self._labels: dict[str, str] = {}

    def record(self, key: str, value: Any, label: str) -> None:
        """Label ``key`` and, for a mapping, every key below it."""
        if isinstance(value, DictConfig):
            value = OmegaConf.to_container(value, resolve=False)
        self._labels[key] = label
        if isinstance(value, Mapping):
            for name, child in value.items():
                self.record(f"{key}.{name}" if key else str(name), child, label)

    def forget(self, key: str) -> None:
        for name in [k for k in self._labels if k == key or k.startswith(key + ".")]:
            del self._labels[name]

    def source(self, key: str) -> str | None:
        """The label of ``key``, or of its closest labelled parent; ``None`` when nothing wrote it."""
        probe = key
        while True:
            if probe in self._labels:
                return self._labels[probe]
            if not probe:
                return None
            probe = probe.rpartition(".")[0]


@dataclass(frozen=True)
class Override:
    """One ``key=value`` command-line override, parsed."""

    text: str
    operation: Operation
    key: str
    value: Any = None

    @property
    def label(self) -> str:
        return f"override {brief(repr(self.text))}"


def parse_override(text: str) -> Override:
    """``[+|++|~]dotted.key[=value]``; the value is read as YAML, as OmegaConf reads a dotlist."""
    if not isinstance(text, str):
        raise ConfigLoadError(f"override {text!r} is not a string of the form dotted.key=value")
    body, operation = text.strip(), "set"
    for prefix, op in _PREFIXES:
        if body.startswith(prefix):
            body, operation = body[len(prefix):], op
            break
    key, sep, raw = body.partition("=")
    key = key.strip()
    if not sep and operation != "delete":
        raise ConfigLoadError(f"override {text!r} is not of the form dotted.key=value")
    if not key or any(not part.strip() for part in key.split(".")):
        raise ConfigLoadError(
            f"override {text!r} has an empty key segment ({key!r}): every part of a dotted key must be named, "
            "e.g. megatron_config.freeze_vision_model=true"
        )
    segments = len(key.split("."))
    if segments > MAX_DEPTH:
        raise ConfigLoadError(
            f"override {brief(repr(text))}: its key has {segments} levels; a config nests at most {MAX_DEPTH} "
            "(check for a runaway or generated key)"
        )
    if not sep:
        return Override(text, operation, key)
    check_yaml(raw, f"override {brief(repr(text))}")
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={raw}"]))["value"]
    except RecursionError:
        raise ConfigLoadError(
            f"override {brief(repr(text))}: its value nests more than {MAX_DEPTH} levels deep (mappings and "
            "lists): no training config does; flatten it"
        ) from None
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigLoadError(
            f"override {brief(repr(text))}: its value {brief(repr(raw))} is not valid YAML ({brief(first)}); "
            "quote it or fix the syntax"
        ) from exc
    check_depth(value, f"override {brief(repr(text))}", base=segments)
    return Override(text, operation, key, value)


def apply_override(cfg: DictConfig, override: Override, provenance: Provenance) -> DictConfig:
    """``cfg`` with one override applied, as Hydra would; what Hydra refuses is refused (never dropped)."""
    label = override.label
    state, node, where = lookup(cfg, override.key)
    if override.operation == "delete":
        if state != FOUND:
            raise ConfigLoadError(f"{label} deletes {override.key}, which the config does not have")
        parent, _, leaf = override.key.rpartition(".")
        holder = lookup(cfg, parent)[1] if parent else cfg
        if "=" in override.text:
            current = _resolved(holder, leaf, override.key, label)
            if current != override.value:
                raise ConfigLoadError(
                    f"{label} deletes {override.key} only if it is {brief(repr(override.value))}, but it is "
                    f"{brief(repr(current))}; write ~{override.key} to delete it whatever it holds"
                )
        del holder[leaf]
        provenance.forget(override.key)
        return cfg
    if state == BLOCKED and not (node._is_none() or node._is_missing()):  # below null: a new section, as Hydra
        held = brief(shown(node))
        raise ConfigLoadError(
            f"{label} sets {override.key}, but {where} holds {held}, not a mapping of settings: a key cannot go "
            f"below it (it would silently replace that value). Fix {where} first (e.g. {where}={{...}}), or set "
            "the key on a mapping"
        )
    if override.operation == "add" and state == FOUND:
        bare = override.text.strip().lstrip("+")
        raise ConfigLoadError(
            f"{label} adds {override.key}, which the config already has: write {brief(bare)} to "
            f"change it (or ++{brief(bare)} to add or change)"
        )
    try:
        try:
            merged = OmegaConf.merge(cfg, _nested(override.key, override.value))
        except TypeError:  # a mapping set to a list or back: replaced, as Hydra's OmegaConf.update replaces it
            merged = cfg.copy()
            OmegaConf.update(merged, override.key, override.value, merge=False, force_add=True)
    except RecursionError:
        raise ConfigLoadError(f"{label} cannot be applied: the config nests too deep") from None
    except (OmegaConfBaseException, TypeError, ValueError) as exc:
        raise ConfigLoadError(f"{label} cannot be applied: {brief(exc)}") from exc
    assert isinstance(merged, DictConfig)
    provenance.record(override.key, override.value, override.label)
    return merged


def _resolved(holder: DictConfig, leaf: str, key: str, label: str) -> Any:
    """``holder[leaf]`` as plain Python, interpolations resolved (for a ``~key=value`` comparison)."""
    try:
        value = holder[leaf]
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
    except (OmegaConfBaseException, RecursionError) as exc:
        raise ConfigLoadError(f"{label}: cannot read {key}: {brief(exc)}") from None


def shown(node: Any) -> str:
    """A config node as written (interpolations not resolved), for a message."""
    if OmegaConf.is_config(node):
        if node._is_none():
            return "null"
        if node._is_interpolation() or node._is_missing():
            return repr(node._content)
        return repr(OmegaConf.to_container(node, resolve=False))
    value = node._value() if hasattr(node, "_value") else node
    return "null" if value is None else repr(value)


def _nested(key: str, value: Any) -> DictConfig:
    node: Any = value
    for part in reversed(key.split(".")):
        node = {part: node}
    created = OmegaConf.create(node)
    assert isinstance(created, DictConfig)
    return created


def _apply_overrides(
    cfg: DictConfig, overrides: Iterable[str], provenance: Provenance
) -> tuple[DictConfig, tuple[Override, ...]]:
    """``cfg`` with every override applied in order, and the overrides as parsed (all parsed first)."""
    parsed = tuple(parse_override(text) for text in overrides)
    for override in parsed:
        cfg = apply_override(cfg, override, provenance)
    return cfg, parsed
