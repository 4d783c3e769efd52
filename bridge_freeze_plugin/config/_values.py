"""Values as a config holds them, the layer every reading stage reads through: read (:func:`select`,
:func:`section`; :class:`Sections`: a stage's sections in one place), written back as a user writes them
(:func:`as_yaml`), and each with the key it lives at and where it came from (:class:`Setting`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.config._yaml_overrides import brief
from bridge_freeze_plugin.errors import InvalidFreezeConfigError

#: Where a value came from when nothing recorded it (a config passed in code).
IN_CONFIG = "config"


def as_yaml(value: Any) -> str:
    """A value as a user would write it in YAML / on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def join_problems(problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} problems in the freeze configuration:\n" + "\n".join(f"  - {p}" for p in problems)


@dataclass(frozen=True)
class Setting:
    """One value, the key it lives at (``None``: no key, e.g. an API argument) and where it came from."""

    value: Any
    key: str | None
    source: str = IN_CONFIG

    @property
    def written(self) -> str:
        """``key=value`` (with its source when that is not the config itself)."""
        text = f"{self.key}={as_yaml(self.value)}" if self.key else as_yaml(self.value)
        return text if self.source == IN_CONFIG else f"{text} ({self.source})"


def plain(node: Any, key: str) -> Any:
    """A config node as plain Python (interpolations resolved); mappings stay mappings."""
    if isinstance(node, DictConfig) or OmegaConf.is_config(node):
        try:
            return OmegaConf.to_container(node, resolve=True)
        except OmegaConfBaseException as exc:
            raise InvalidFreezeConfigError(f"cannot resolve {key}: {brief(exc)}") from exc
        except RecursionError:
            raise InvalidFreezeConfigError(f"cannot resolve {key}: it nests, or refers to itself, too deep") from None
    return node


def select(cfg: Any, key: str) -> Any:
    """``cfg[key]`` for a dotted key, ``None`` when any level is missing (or null).

    A level above the key that holds something other than a mapping (``megatron_config: 5``, a list) is an
    error naming it: the key cannot be there, and reading it as unset would drop what the user wrote.
    """
    node: Any = cfg
    done: list[str] = []
    for part in key.split("."):
        if isinstance(node, DictConfig):
            if part not in node:
                return None
            try:
                node = node[part]
            except OmegaConfBaseException as exc:
                raise InvalidFreezeConfigError(f"cannot resolve {key}: {brief(exc)}") from exc
            except RecursionError:
                raise InvalidFreezeConfigError(f"cannot resolve {key}: it refers to itself") from None
        elif isinstance(node, Mapping):
            node = node.get(part)
        else:
            where = ".".join(done)
            raise InvalidFreezeConfigError(
                f"{where} must be a mapping of settings (it holds {key}), got {brief(repr(plain(node, where)))} "
                f"({type_label(plain(node, where))}); write it as {where}: {{...}}"
            )
        done.append(part)
        if node is None:
            return None
    return plain(node, key)


def type_label(value: Any) -> str:
    return "a list" if isinstance(value, list | tuple) else type(value).__name__


def section(cfg: Any, key: str) -> Mapping[str, Any]:
    value = select(cfg, key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidFreezeConfigError(
            f"{key} must be a mapping of settings, got {brief(repr(value))} ({type_label(value)}); write it as "
            f"{key}: {{...}}"
        )
    return value


class Sections:
    """The mapping at each of some keys (:func:`section`), read in one place; a key whose value is no mapping, or
    cannot be resolved, raises its error when it is asked for, so a reader meets its problems in its own order."""

    def __init__(self, cfg: Any, keys: Iterable[str | None]) -> None:
        self._read: dict[str, Mapping[str, Any] | InvalidFreezeConfigError] = {}
        for key in dict.fromkeys(k for k in keys if k is not None):
            try:
                self._read[key] = section(cfg, key)
            except InvalidFreezeConfigError as exc:
                self._read[key] = exc

    def __getitem__(self, key: str) -> Mapping[str, Any]:
        value = self._read[key]
        if isinstance(value, InvalidFreezeConfigError):
            raise value
        return value


Source = Callable[[str], str]
