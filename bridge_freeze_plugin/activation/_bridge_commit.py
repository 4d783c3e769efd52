"""Which Megatron-Bridge commit this process imported, where the installation records one.

Bridge's version string does not tell commits apart: every commit of its main branch from 80754e51b (2026-08-04)
on says 0.7.0, NeMo-RL's pin 8c46dc42 and the snapshot 067f987d a week later among them. What can tell them, read
from files only (no ``git`` process, nothing imported):

1. ``direct_url.json`` in the ``megatron-bridge`` distribution's metadata, which pip / uv write for an install from
   a URL (PEP 610): ``vcs_info.commit_id`` for ``pip install git+https://...@<commit>``. Trusted only when that
   distribution is the one imported (its files hold the imported package; a source tree on ``PYTHONPATH`` shadows
   an installed wheel's metadata, as the compatibility lane does), or, for an editable install
   (``dir_info.editable``), when the imported package lies under its directory.
2. The git checkout the imported package lies in (an editable install, NeMo-RL's submodule, a ``PYTHONPATH``
   checkout): its ``HEAD``, read from the git directory, only where the checkout is Bridge's own layout
   (``<top>/src/megatron/bridge`` is the imported package). Bridge's own ``package_info`` appends
   ``git rev-parse HEAD`` run in the package's folder to ``__version__``, which names the enclosing repository's
   commit for a venv inside another project's checkout; this check does not. Uncommitted changes are not seen.

A wheel from a package index records no commit, and neither does a copied source tree: then the commit cannot be
told, and :func:`bridge_commit` says so.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

__all__ = ["bridge_commit"]

_DISTRIBUTION = "megatron-bridge"
_HASH = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


def bridge_commit(package_dir: Path | None = None, distribution: Any = None) -> tuple[str | None, str]:
    """``(commit, how it was told)``, or ``(None, why it cannot be told)``, for the imported ``megatron.bridge``.

    ``package_dir``: the package's folder (default: the imported one, else where it would be imported from);
    ``distribution``: an ``importlib.metadata.Distribution`` (default: the installed ``megatron-bridge``'s)."""
    package_dir = package_dir if package_dir is not None else _imported_dir()
    if package_dir is None:
        return None, "no megatron.bridge package is found"
    package_dir = package_dir.resolve()
    recorded = _from_direct_url(package_dir, distribution)
    if recorded[0] is not None:
        return recorded
    checkout = _from_checkout(package_dir)
    if checkout[0] is not None:
        return checkout
    return None, f"{recorded[1]}, and {checkout[1]}"


def _imported_dir() -> Path | None:
    module = sys.modules.get("megatron.bridge")
    locations = list(getattr(module, "__path__", None) or ())
    if not locations:
        try:
            spec = importlib.util.find_spec("megatron.bridge")
        except (ImportError, ValueError):
            spec = None
        locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    return Path(locations[0]) if locations else None


def _from_direct_url(package_dir: Path, distribution: Any) -> tuple[str | None, str]:
    if distribution is None:
        try:
            distribution = importlib.metadata.distribution(_DISTRIBUTION)
        except importlib.metadata.PackageNotFoundError:
            return None, f"no {_DISTRIBUTION} distribution is installed"
    name = f"{_DISTRIBUTION} {distribution.version}"
    try:
        direct = json.loads(distribution.read_text("direct_url.json") or "null")
    except ValueError:
        direct = None
    if not isinstance(direct, dict):
        if not _owns(distribution, package_dir):
            return None, f"the installed {name} is not the imported package ({package_dir})"
        return None, f"the installed {name} records no source (an install from a package index)"
    url = str(direct.get("url", ""))
    if (direct.get("dir_info") or {}).get("editable"):
        source = Path(unquote(urlparse(url).path)).resolve()
        if package_dir.is_relative_to(source):
            return None, f"the installed {name} is editable from {source}, which records no commit itself"
        return None, f"the installed {name} is editable from {source}, not the imported package ({package_dir})"
    if not _owns(distribution, package_dir):
        return None, f"the installed {name} is not the imported package ({package_dir})"
    commit = str((direct.get("vcs_info") or {}).get("commit_id", ""))
    if _HASH.match(commit):
        return commit, f"recorded by the install of {name} from {url} (direct_url.json)"
    return None, f"the installed {name} came from {url}, which names no commit"


def _owns(distribution: Any, package_dir: Path) -> bool:
    """The distribution's files hold the imported package (its ``__init__.py`` is the one imported)."""
    try:
        located = Path(str(distribution.locate_file("megatron/bridge/__init__.py"))).resolve()
    except (OSError, TypeError):
        return False
    return located == package_dir / "__init__.py"


def _from_checkout(package_dir: Path) -> tuple[str | None, str]:
    for top in package_dir.parents:
        dot_git = top / ".git"
        if not dot_git.exists():
            continue
        if (top / "src" / "megatron" / "bridge").resolve() != package_dir:
            return None, (f"{package_dir} lies in the git checkout {top}, which is not Megatron-Bridge's "
                          f"(no src/megatron/bridge there is the imported package)")
        git_dir = _git_dir(dot_git)
        commit = _head(git_dir) if git_dir is not None else None
        if commit is None:
            return None, f"the HEAD of the Megatron-Bridge checkout {top} cannot be read"
        return commit, f"the HEAD of the Megatron-Bridge git checkout {top} (uncommitted changes not seen)"
    return None, f"{package_dir} lies in no git checkout"


def _git_dir(dot_git: Path) -> Path | None:
    """The git directory of a work tree: ``.git`` itself, or the one a ``gitdir:`` file names (submodule,
    worktree)."""
    if dot_git.is_dir():
        return dot_git
    text = dot_git.read_text(encoding="utf-8", errors="replace").strip()
    if not text.startswith("gitdir:"):
        return None
    target = Path(text.partition(":")[2].strip())
    return target if target.is_absolute() else (dot_git.parent / target).resolve()


def _head(git_dir: Path) -> str | None:
    """The commit ``HEAD`` names: a detached hash, or its branch's, from the loose ref or ``packed-refs`` (a
    worktree's branches live in the main git directory, its ``commondir``)."""
    try:
        head = (git_dir / "HEAD").read_text(encoding="utf-8").strip()
    except OSError:
        return None
    if _HASH.match(head):
        return head
    if not head.startswith("ref:"):
        return None
    ref = head.partition(":")[2].strip()
    common = git_dir
    if (git_dir / "commondir").is_file():
        common = (git_dir / (git_dir / "commondir").read_text(encoding="utf-8").strip()).resolve()
    for folder in dict.fromkeys((git_dir, common)):
        loose = folder / ref
        if loose.is_file():
            value = loose.read_text(encoding="utf-8").strip()
            return value if _HASH.match(value) else None
        packed = folder / "packed-refs"
        if packed.is_file():
            for line in packed.read_text(encoding="utf-8").splitlines():
                value, _, name = line.partition(" ")
                if name.strip() == ref and _HASH.match(value):
                    return value
    return None
