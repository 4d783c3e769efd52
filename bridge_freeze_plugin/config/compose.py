"""A Hydra-style ``defaults:`` list, composed with OmegaConf from the config file's own folder.

The trainer's older YAML layout pulls whole sections in from other files::

    defaults:
      - _self_
      - megatron_config@trainer.policy.megatron_config: policy   # megatron_config/policy.yaml

Understood, as Hydra 1.1+ reads a primary config: ``_self_`` (where the file's own values merge; at the
end when not listed), ``group: option`` (``<folder>/group/option.yaml``, placed at the package
``group@package``, else the file's ``# @package`` header, else the group path; ``_global_`` is the top),
``optional group: option``, ``group: null`` (nothing) and a plain ``- name`` (``<folder>/name.yaml``
merged at the top). Every entry stays inside the config's folder, as Hydra's config search path does: a
leading ``/`` means the folder itself (Hydra's absolute group path, never the file system's root); a ``..``
or ``.`` segment, an empty segment, a ``~`` or a backslash is refused in one line, never read. Refused with a
clear error, never skipped: ``override`` entries, a list of options, and a defaults list inside a composed
file (nested defaults need Hydra itself: compose with ``--cfg job`` and check its output). Hydra is not a
dependency: this covers the layouts the rules read, and pulling Hydra (and its pinned ANTLR runtime) into
users' training images is not worth it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from bridge_freeze_plugin.config.loading import Provenance, brief, check_depth, read_yaml_file
from bridge_freeze_plugin.errors import ConfigLoadError

SELF = "_self_"
_HEADER = re.compile(r"^\s*#\s*@package\s+(\S+)\s*$")
_ENTRY = re.compile(r"^(?P<optional>optional\s+)?(?P<group>[\w./-]+)(?:@(?P<package>[\w.]+))?$")


def _header_package(file: Path) -> str | None:
    for line in file.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        match = _HEADER.match(line)
        if match:
            return match.group(1)
        if not line.lstrip().startswith("#"):
            return None
    return None


def _entry(item: Any, where: str) -> tuple[str, str | None, str | None, bool]:
    """(group, package, option, optional) of one defaults-list entry; group "" for a plain config name."""
    if isinstance(item, str):
        return "", None, item, False
    if not isinstance(item, (dict, DictConfig)) or len(item) != 1:
        raise ConfigLoadError(f"{where}: entry {item!r} is neither 'name' nor 'group: option'")
    (key, option), = item.items()
    key = str(key)
    if key.startswith("override "):
        raise ConfigLoadError(
            f"{where}: '{key}: {option}' overrides a default of a nested config, which check-config does not "
            "compose; compose the config with Hydra (your_app --cfg job > composed.yaml) and check that file"
        )
    match = _ENTRY.match(key)
    if match is None:
        raise ConfigLoadError(f"{where}: cannot read the entry key {key!r} (expected group[@package])")
    if isinstance(option, (list, ListConfig)):
        raise ConfigLoadError(f"{where}: '{key}' selects several options {list(option)}, which check-config "
                              "does not compose; compose with Hydra (--cfg job) and check the result")
    if option is not None and not isinstance(option, str):
        raise ConfigLoadError(f"{where}: '{key}: {option!r}': an option is a config name")
    return match["group"], match["package"], option, bool(match["optional"])


def _contained(name: str, where: str) -> str:
    """``name`` (``group/option`` or a plain name) as a path inside the config's folder, or a one-line error.

    As Hydra's config search path: a leading ``/`` is the folder itself (Hydra's absolute group path); the entry
    cannot leave the folder (``..``), and names no file-system path of its own (``~``, ``\\``, ``./``, ``//``).
    """
    relative = name[1:] if name.startswith("/") else name
    segments = relative.split("/")
    if not relative or any(s in ("", ".", "..") or s.startswith("~") or "\\" in s or ":" in s for s in segments):
        raise ConfigLoadError(
            f"{where}: entry {brief(repr(name))} leaves the config's folder or is not a config name; a "
            "defaults-list entry names a file inside the folder (group/option, '/' for the folder itself), as "
            "Hydra's config search path does: copy the file into the folder and name it from there"
        )
    return relative


def _load_entry(folder: Path, item: Any, where: str) -> tuple[str, DictConfig, str] | None:
    """(package, content, label) of one entry; ``None`` for ``group: null`` or a missing optional one."""
    group, package, option, optional = _entry(item, where)
    if option is None:
        return None
    written = f"{group}/{option}" if group else option
    name = _contained(written, where)
    if package is not None and any(not part for part in package.split(".")):
        raise ConfigLoadError(f"{where}: package {package!r} has an empty segment; write group@a.b")
    candidates = [folder / f"{name}.yaml", folder / f"{name}.yml"]
    file = next((c for c in candidates if _is_file(c)), None)
    if file is None:
        if optional:
            return None
        rooted = (" (a leading '/' is the config's folder, Hydra's absolute group path, not the file system's "
                  "root: a defaults list reads only files inside the folder)") if written.startswith("/") else ""
        raise ConfigLoadError(f"{where}: entry {brief(repr(written))} names {brief(candidates[0])}, which does not "
                              f"exist{rooted}")
    content = read_yaml_file(file)
    if "defaults" in content:
        raise ConfigLoadError(
            f"{file} has its own defaults list, which check-config does not compose; compose the config "
            "with Hydra (--cfg job) and check the result"
        )
    group_package = group.lstrip("/").replace("/", ".")
    if package is None:
        package = _header_package(file) or group_package
    if package == "_group_":
        package = group_package
    package = "" if package == "_global_" else package
    check_depth(content, str(file), base=len(package.split(".")) if package else 0)
    return package, content, f"{where} > {file.relative_to(folder)}"


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):  # a name too long for the file system: no such file
        return False


def compose(cfg: DictConfig, folder: Path, label: str, provenance: Provenance) -> tuple[DictConfig, tuple[str, ...]]:
    """``cfg`` with its ``defaults:`` list composed, and the files it pulled in (relative to ``folder``)."""
    if "defaults" not in cfg:
        provenance.record("", cfg, label)
        return cfg, ()
    entries = cfg.defaults
    if not isinstance(entries, ListConfig):
        raise ConfigLoadError(f"{label}: 'defaults' must be a list (a Hydra defaults list), got {entries!r}")
    own = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "defaults"])
    items = list(OmegaConf.to_container(entries))
    if SELF not in items:
        items.append(SELF)
    result: DictConfig = OmegaConf.create({})
    pulled: list[str] = []
    for item in items:
        if item == SELF:
            result = OmegaConf.merge(result, own)
            provenance.record("", own, label)
            continue
        loaded = _load_entry(folder, item, f"{label}'s defaults list")
        if loaded is None:
            continue
        package, content, source = loaded
        placed: Any = content
        for part in reversed(package.split(".") if package else []):
            placed = {part: placed}
        result = OmegaConf.merge(result, OmegaConf.create(placed) if package else content)
        provenance.record(package, content, source)
        pulled.append(source.rpartition(" > ")[2])
    assert isinstance(result, DictConfig)
    return result, tuple(pulled)
