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

from bridge_freeze_plugin.config._yaml_files import read_yaml_file
from bridge_freeze_plugin.config._yaml_overrides import Provenance, brief, check_depth
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
    """``cfg`` with its ``defaults:`` list composed, and the files it pulled in (relative to ``folder``).

    A defaults list of YAML file paths (``defaults: parent.yaml``, or a list of ``.yaml`` paths) is NeMo-RL's
    inheritance (:func:`_compose_inheritance`); anything else is read as Hydra's defaults list.
    """
    if "defaults" not in cfg:
        provenance.record("", cfg, label)
        return cfg, ()
    if _is_inheritance(cfg._get_node("defaults")):
        return _compose_inheritance(cfg, folder / label, folder, label, provenance)
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


# ---- NeMo-RL's inheritance (nemo_rl/utils/config.py: load_config_with_inheritance, merge_with_override) ---------

#: How many files one inheritance chain may hold (NeMo-RL's recipes use three or four).
MAX_CHAIN = 32
_YAML_SUFFIXES = (".yaml", ".yml")


def _is_inheritance(node: Any) -> bool:
    """Whether a ``defaults`` value is NeMo-RL's inheritance: a YAML file path, or a list of them."""
    value = OmegaConf.to_container(node) if OmegaConf.is_config(node) else node._value() if hasattr(
        node, "_value") else node
    if isinstance(value, str):
        return True
    return (isinstance(value, list) and bool(value)
            and all(isinstance(item, str) and item.endswith(_YAML_SUFFIXES) for item in value))


def _merge_with_override(base: DictConfig, override: DictConfig) -> DictConfig:
    """NeMo-RL's merge: a top-level section of ``override`` holding ``_override_: true`` replaces the base's section
    (the marker removed); everything else merges (OmegaConf.merge: later wins; ``???`` keeps the base's value)."""
    base = base.copy()
    override = override.copy()
    for key in list(override.keys()):
        node = override._get_node(key)
        if isinstance(node, DictConfig) and not node._is_missing() and not node._is_none() \
                and not node._is_interpolation() and node.get("_override_", False):
            node.pop("_override_")
            if key in base:
                base.pop(key)
    merged = OmegaConf.merge(base, override)
    assert isinstance(merged, DictConfig)
    return merged


def _compose_inheritance(cfg: DictConfig, file: Path, root: Path, label: str, provenance: Provenance,
                        chain: tuple[Path, ...] = ()) -> tuple[DictConfig, tuple[str, ...]]:
    """``cfg`` (read from ``file``) composed as NeMo-RL's ``load_config`` composes it; and the files it pulled in.

    ``defaults`` is one path or a list of paths, each relative to the folder of the file that names it (an
    absolute path as written; ``..`` allowed, as NeMo-RL allows it). Each parent is composed first (its own
    defaults, depth-first), the parents merge in order (a later one wins), then the file's own values. Unlike
    Hydra: no groups, packages, ``_self_`` or ``optional``; a parent may have its own defaults; a top-level
    section with ``_override_: true`` replaces the inherited section instead of merging into it. A file that
    inherits from itself (a loop) or a missing parent is a :class:`ConfigLoadError`.
    """
    chain = (*chain, file.resolve())
    if len(chain) > MAX_CHAIN:
        raise ConfigLoadError(f"{label}: the defaults chain is longer than {MAX_CHAIN} files: check for a loop")
    raw = cfg._get_node("defaults")
    value = OmegaConf.to_container(raw) if OmegaConf.is_config(raw) else raw._value()
    entries = [value] if isinstance(value, str) else list(value)
    own = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "defaults"])
    base: DictConfig = OmegaConf.create({})
    pulled: list[str] = []
    for entry in entries:
        if not isinstance(entry, str) or not entry.strip():
            raise ConfigLoadError(f"{label}: defaults entry {brief(repr(entry))} is not a file path")
        parent = Path(entry) if entry.startswith("/") else file.parent / entry
        shown = _relative(parent, root)
        if parent.resolve() in chain:
            raise ConfigLoadError(f"{label}: defaults entry {entry!r} ({shown}) inherits from a file already in the "
                                  "chain (a loop): NeMo-RL would recurse without end. Remove it")
        if not parent.is_file():
            raise ConfigLoadError(f"{label}: defaults entry {entry!r} names {shown}, which does not exist (NeMo-RL "
                                  "reads it relative to the folder of the file that names it)")
        content = read_yaml_file(parent)
        if "defaults" in content:
            content, deeper = _compose_inheritance(content, parent, root, shown, provenance, chain)
            pulled += deeper
        else:
            provenance.record("", _written(content), f"{label} > {shown}")
        base = _merge_with_override(base, content)
        pulled.append(shown)
    provenance.record("", _written(own), label)
    return _merge_with_override(base, own), tuple(pulled)


def _written(cfg: DictConfig) -> Any:
    """``cfg`` as plain Python without its ``???`` values (they keep what a parent wrote, as OmegaConf merges)."""
    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if v != "???"}
        return node

    return strip(OmegaConf.to_container(cfg, resolve=False))


def _relative(path: Path, root: Path) -> str:
    import os

    try:
        return os.path.relpath(path, root)
    except ValueError:  # another drive
        return str(path)
