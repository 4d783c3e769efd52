"""Reading a training config as the user wrote it: a YAML file, its defaults list, and command-line overrides.

Nothing the user wrote is dropped: a file that holds no mapping, an override whose key has an empty
segment or whose value is not YAML, a Hydra ``+key`` that adds an existing key or a ``~key`` that deletes
a missing one are each a :class:`ConfigLoadError` naming the file or the override. Every value keeps
where it came from (:class:`Provenance`), so the rules can say it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.errors import ConfigLoadError

#: What an override does: ``key=v`` sets, ``+key=v`` adds a missing key, ``++key=v`` adds or sets,
#: ``~key`` (or ``~key=v``) deletes.
Operation = Literal["set", "add", "force", "delete"]
_PREFIXES: tuple[tuple[str, Operation], ...] = (("++", "force"), ("+", "add"), ("~", "delete"))


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
        return f"override {self.text!r}"


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
    if not sep:
        return Override(text, operation, key)
    try:
        value = OmegaConf.to_container(OmegaConf.from_dotlist([f"value={raw}"]))["value"]
    except (yaml.YAMLError, OmegaConfBaseException, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigLoadError(
            f"override {text!r}: its value {raw!r} is not valid YAML ({first}); quote it or fix the syntax"
        ) from exc
    return Override(text, operation, key, value)


def _exists(cfg: DictConfig, key: str) -> bool:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return True


def apply_override(cfg: DictConfig, override: Override, provenance: Provenance) -> DictConfig:
    """``cfg`` with one override applied, as Hydra would; what Hydra refuses is refused (never dropped)."""
    present = _exists(cfg, override.key)
    if override.operation == "delete":
        if not present:
            raise ConfigLoadError(f"override {override.text!r} deletes {override.key}, which the config does not have")
        parent, _, leaf = override.key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if "=" in override.text and OmegaConf.to_container(OmegaConf.create({"v": node[leaf]}))["v"] != override.value:
            raise ConfigLoadError(
                f"override {override.text!r} deletes {override.key} only if it is {override.value!r}, but it is "
                f"{node[leaf]!r}; write ~{override.key} to delete it whatever it holds"
            )
        del node[leaf]
        provenance.forget(override.key)
        return cfg
    if override.operation == "add" and present:
        bare = override.text.strip().lstrip("+")
        raise ConfigLoadError(
            f"override {override.text!r} adds {override.key}, which the config already has: write {bare} to "
            f"change it (or ++{bare} to add or change)"
        )
    try:
        merged = OmegaConf.merge(cfg, _nested(override.key, override.value))
    except OmegaConfBaseException as exc:
        raise ConfigLoadError(f"override {override.text!r} cannot be applied: {' '.join(str(exc).split())}") from exc
    assert isinstance(merged, DictConfig)
    provenance.record(override.key, override.value, override.label)
    return merged


def _nested(key: str, value: Any) -> DictConfig:
    node: Any = value
    for part in reversed(key.split(".")):
        node = {part: node}
    created = OmegaConf.create(node)
    assert isinstance(created, DictConfig)
    return created


def read_yaml_file(path: str | os.PathLike[str]) -> DictConfig:
    """The mapping at the top of a YAML file; an error for a directory, an empty file, ``null`` or a scalar."""
    file = Path(path)
    if file.is_dir():
        raise ConfigLoadError(f"{path} is a directory, not a config file: give the YAML file inside it")
    if not file.exists():
        raise ConfigLoadError(f"no such config file: {path}")
    try:
        text = file.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigLoadError(f"cannot read {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigLoadError(f"{path} is not valid YAML: {' '.join(str(exc).split())}") from exc
    if data is None:
        what = "is empty" if not text.strip() or all(
            not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()
        ) else "holds null"
        raise ConfigLoadError(
            f"{path} {what}: a config holds a mapping of settings at the top level; for a run configured on "
            "the command line only, give the overrides without a file"
        )
    if not isinstance(data, dict):
        raise ConfigLoadError(
            f"{path} holds a {type(data).__name__} ({str(data)[:40]!r}) at the top level, not a mapping of "
            "settings (key: value lines)"
        )
    try:
        cfg = OmegaConf.create(text)
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise ConfigLoadError(f"cannot load {path}: {' '.join(str(exc).split())}") from exc
    assert isinstance(cfg, DictConfig)
    return cfg


def apply_overrides(
    cfg: DictConfig, overrides: Iterable[str], provenance: Provenance
) -> tuple[DictConfig, tuple[Override, ...]]:
    """``cfg`` with every override applied in order, and the overrides as parsed (all parsed first)."""
    parsed = tuple(parse_override(text) for text in overrides)
    for override in parsed:
        cfg = apply_override(cfg, override, provenance)
    return cfg, parsed
