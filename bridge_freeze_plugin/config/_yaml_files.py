"""Reading a YAML config file safely: a regular file of bounded size (:data:`._yaml_overrides.MAX_FILE_BYTES`), its
YAML checked before anything expands it (:func:`._yaml_overrides.check_yaml`), a mapping at the top, loaded as
OmegaConf loads it (SkyRL's dumped enum tags read as their values). A saved config Bridge wrote (``run_config.yaml``,
NeMo-RL's conversion cache) goes through the same checks with its own bound, read as Bridge reads it
(:func:`read_saved_config`: YAML's safe schema, so a Python tag is refused as Bridge refuses it)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from bridge_freeze_plugin.config import _yaml_tags as enum_tags
from bridge_freeze_plugin.config._yaml_overrides import MAX_FILE_BYTES, brief, check_yaml
from bridge_freeze_plugin.errors import ConfigLoadError

#: The most a saved config (a ``run_config.yaml``) may hold: Bridge writes tens of kilobytes (every provider field,
#: the nested HF configs, the other sections); at this bound YAML's Python reader already takes seconds.
MAX_SAVED_CONFIG_BYTES = 1024 * 1024


def _read_bounded_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_FILE_BYTES,
                      what: str = "config file") -> str:
    """The UTF-8 text of a regular file of at most ``max_bytes``, its YAML nesting and aliases checked
    (:func:`check_yaml`); every failure is one :class:`ConfigLoadError` line naming the file."""
    file = Path(path)
    shown_path = brief(os.fspath(path))
    try:
        if file.is_dir():
            raise ConfigLoadError(f"{shown_path} is a directory, not a {what}: give the YAML file inside it")
        if not file.exists():
            raise ConfigLoadError(f"no such {what}: {shown_path}")
        if not file.is_file():
            raise ConfigLoadError(f"{shown_path} is not a regular file (a device, a pipe...): give a YAML file")
        size = file.stat().st_size
        if size > max_bytes:
            raise ConfigLoadError(f"{shown_path} holds {size} bytes; a {what} holds at most {max_bytes} "
                                  f"(real ones hold kilobytes): check that this is the {what}")
        text = file.read_text(encoding="utf-8")
    except ConfigLoadError:
        raise
    except UnicodeDecodeError as exc:
        raise ConfigLoadError(f"{shown_path} is not UTF-8 text ({brief(exc)}): a {what} is YAML, in UTF-8") from exc
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        raise ConfigLoadError(f"cannot read {shown_path}: {brief(exc)}") from exc
    check_yaml(text, shown_path)
    return text


def read_saved_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping a saved config (``run_config.yaml``) holds, read with YAML's safe schema as Bridge's
    ``read_run_config`` reads it (libyaml's parser where PyYAML has it: the same documents, faster), after the
    checks of :func:`_read_bounded_text` (at most :data:`MAX_SAVED_CONFIG_BYTES`)."""
    text = _read_bounded_text(path, max_bytes=MAX_SAVED_CONFIG_BYTES, what="saved config")
    shown_path = brief(os.fspath(path))
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)  # a safe loader (C or Python)
    except yaml.YAMLError as exc:
        raise ConfigLoadError(f"{shown_path} is not valid YAML for Bridge's safe reader: {brief(exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigLoadError(f"{shown_path} holds {'nothing' if data is None else 'a ' + type(data).__name__} at the "
                              "top level, not the mapping of sections Bridge saves")
    return data


#: (real path, inode, size, mtime in ns) -> the plain mapping a file read to: a file read again unchanged (a run's
#: defaults list names the same files over and over, check-config reads a NeMo-RL example's bases for each config)
#: is not parsed again. A fresh config is made from it at each read, so no caller shares one.
_READ: dict[tuple[str, int, int, int], Any] = {}
_READ_MAX = 256


def _stamp(path: str | os.PathLike[str]) -> tuple[str, int, int, int] | None:
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, ValueError):
        return None
    return real, st.st_ino, st.st_size, st.st_mtime_ns


def read_yaml_file(path: str | os.PathLike[str]) -> DictConfig:
    """The mapping at the top of a YAML file; an error for a directory, an empty file, ``null`` or a scalar."""
    stamp = _stamp(path)
    if stamp is not None and stamp in _READ:
        cfg = OmegaConf.create(_READ[stamp])
        assert isinstance(cfg, DictConfig)
        return cfg
    cfg = _read_yaml_file(path)
    if stamp is not None and stamp == _stamp(path):  # unchanged while it was read
        if len(_READ) >= _READ_MAX:
            _READ.pop(next(iter(_READ)))
        _READ[stamp] = OmegaConf.to_container(cfg, resolve=False)
    return cfg


def _read_yaml_file(path: str | os.PathLike[str]) -> DictConfig:
    shown_path = brief(os.fspath(path))
    text = _read_bounded_text(path)
    try:
        data = enum_tags.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigLoadError(f"{shown_path} is not valid YAML: {brief(exc)}") from exc
    if data is None:
        what = "is empty" if not text.strip() or all(
            not line.strip() or line.lstrip().startswith("#") for line in text.splitlines()
        ) else "holds null"
        raise ConfigLoadError(
            f"{shown_path} {what}: a config holds a mapping of settings at the top level; for a run configured on "
            "the command line only, give the overrides without a file"
        )
    if not isinstance(data, dict):
        raise ConfigLoadError(
            f"{shown_path} holds a {type(data).__name__} ({str(data)[:40]!r}) at the top level, not a mapping of "
            "settings (key: value lines)"
        )
    try:
        cfg = OmegaConf.create(_omegaconf_values(_load_as_omegaconf(text)))
    except RecursionError:
        raise ConfigLoadError(f"{shown_path} nests too deep to load (mappings and lists): flatten it") from None
    except (yaml.YAMLError, OmegaConfBaseException) as exc:
        raise ConfigLoadError(f"cannot load {shown_path}: {brief(exc)}") from exc
    assert isinstance(cfg, DictConfig)
    return cfg


def _load_as_omegaconf(text: str) -> Any:
    """``text`` loaded by OmegaConf's own YAML loader (a safe loader: no Python tag is ever constructed; its float
    and duplicate-key rules), as plain Python: what ``OmegaConf.create(text)`` reads, before it checks types."""
    import omegaconf

    module = getattr(omegaconf, "_yaml", None) or getattr(omegaconf, "_utils", None)
    loader = getattr(module, "get_yaml_loader", None)
    if loader is None:  # an OmegaConf without it: its own reading of the text
        return OmegaConf.to_container(OmegaConf.create(text), resolve=False)
    return yaml.load(text, Loader=enum_tags.with_enum_values(loader()))  # OmegaConf's: a SafeLoader subclass


def _omegaconf_values(value: Any) -> Any:
    """``value`` with what YAML's safe schema builds but OmegaConf cannot hold made plain: a set (``!!set``, as
    Bridge writes a PEFT's ``params_to_save``) becomes its sorted list, a date or a timestamp its ISO text."""
    import datetime

    stack = [value]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in list(items):
            if isinstance(child, set | frozenset):
                child = sorted(child, key=lambda item: (type(item).__name__, str(item)))
            elif isinstance(child, datetime.date):
                child = child.isoformat()
            else:
                if isinstance(child, dict | list):
                    stack.append(child)
                continue
            node[key] = child
            stack.append(child)
    return value
