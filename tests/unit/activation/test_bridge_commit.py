"""Which Megatron-Bridge commit is imported, where the installation records one (issue 49, item 5).

Two commits a week apart (8c46dc42, 067f987d) both say 0.7.0. Each case lays out an installation as pip or git
leaves it, in a temporary folder: a wheel's dist-info with and without pip's ``direct_url.json`` (PEP 610), a git
checkout made by ``git`` itself (the expected commit is what ``git rev-parse HEAD`` prints: loose ref, packed ref,
detached HEAD, a submodule's ``gitdir:`` file), a package inside another project's checkout (a venv in a repository:
Bridge's own ``package_info`` then names that repository's commit), and a source tree shadowing an installed
wheel (the compatibility lane). Then activation's INFO line on the real Bridge of this venv.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import subprocess
from pathlib import Path

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin.activation import _version
from bridge_freeze_plugin.activation._bridge_commit import bridge_commit

COMMIT = "8c46dc4259080c510b7455f43e836fdff222c5d3"  # NeMo-RL's pin (any 40 hex digits would do)
_GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **_GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def _package(root: Path) -> Path:
    package = root / "megatron" / "bridge"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    return package


def _wheel(site: Path, direct_url: dict | None) -> importlib.metadata.Distribution:
    info = site / "megatron_bridge-0.7.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: megatron-bridge\nVersion: 0.7.0\n")
    (info / "RECORD").write_text("megatron/bridge/__init__.py,,\n")
    if direct_url is not None:
        (info / "direct_url.json").write_text(json.dumps(direct_url))
    return importlib.metadata.PathDistribution(info)


def _checkout(top: Path) -> Path:
    """A Megatron-Bridge-shaped git checkout (``src/megatron/bridge``) with two commits; the package folder."""
    package = _package(top / "src")
    _git(top, "init", "-q", "-b", "main")
    for message in ("one", "two"):
        (top / "NOTES").write_text(message)
        _git(top, "add", "-A")
        _git(top, "commit", "-q", "-m", message)
    return package


def test_an_install_from_git_is_told_by_pips_direct_url(tmp_path):
    url = "https://github.com/NVIDIA-NeMo/Megatron-Bridge.git"
    dist = _wheel(tmp_path, {"url": url, "vcs_info": {"vcs": "git", "commit_id": COMMIT}})
    commit, how = bridge_commit(_package(tmp_path), dist)
    assert commit == COMMIT
    assert url in how and "direct_url.json" in how


def test_a_wheel_from_an_index_cannot_be_told(tmp_path):
    commit, how = bridge_commit(_package(tmp_path), _wheel(tmp_path, None))
    assert commit is None
    assert "records no source" in how and "lies in no git checkout" in how


def test_a_source_tree_shadowing_an_installed_wheel_is_not_given_the_wheels_commit(tmp_path):
    dist = _wheel(tmp_path / "site", {"url": "https://x", "vcs_info": {"vcs": "git", "commit_id": COMMIT}})
    _package(tmp_path / "site")
    shadow = _package(tmp_path / "side")  # the compatibility lane's side folder, first on PYTHONPATH
    commit, how = bridge_commit(shadow, dist)
    assert commit is None
    assert f"is not the imported package ({shadow.resolve()})" in how


@pytest.mark.parametrize("form", ["loose ref", "packed ref", "detached"])
def test_a_bridge_checkout_is_told_by_its_head(tmp_path, form):
    package = _checkout(tmp_path / "Megatron-Bridge")
    top = tmp_path / "Megatron-Bridge"
    if form == "packed ref":
        _git(top, "pack-refs", "--all")
        assert not (top / ".git" / "refs" / "heads" / "main").exists()
    elif form == "detached":
        _git(top, "checkout", "-q", "--detach", "HEAD~1")
    expected = _git(top, "rev-parse", "HEAD")
    commit, how = bridge_commit(package, _wheel(tmp_path / "elsewhere", None))
    assert commit == expected
    assert f"checkout {top.resolve()}" in how


def test_an_editable_install_in_a_submodule_is_told_by_the_submodules_head(tmp_path):
    """NeMo-RL's layout: Bridge a git submodule (its ``.git`` a ``gitdir:`` file), installed editable."""
    _checkout(tmp_path / "bridge-src")
    outer = tmp_path / "rl"
    outer.mkdir()
    _git(outer, "init", "-q", "-b", "main")
    _git(outer, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(tmp_path / "bridge-src"),
         "3rdparty/Megatron-Bridge")
    top = outer / "3rdparty" / "Megatron-Bridge"
    assert (top / ".git").is_file()
    dist = _wheel(tmp_path / "site", {"url": top.resolve().as_uri(), "dir_info": {"editable": True}})
    commit, how = bridge_commit(top / "src" / "megatron" / "bridge", dist)
    assert commit == _git(top, "rev-parse", "HEAD")
    assert "HEAD of the Megatron-Bridge git checkout" in how


def test_a_package_inside_another_projects_checkout_is_not_given_that_projects_commit(tmp_path):
    """A venv inside a project's repository (as this one's .venv): the enclosing commit is not Bridge's."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "README").write_text("x")
    _git(project, "init", "-q", "-b", "main")
    _git(project, "add", "-A")
    _git(project, "commit", "-q", "-m", "x")
    package = _package(project / ".venv" / "lib" / "site-packages")
    commit, how = bridge_commit(package, _wheel(tmp_path / "site", None))
    assert commit is None
    assert f"git checkout {project.resolve()}, which is not Megatron-Bridge's" in how


def test_activation_logs_the_bridge_and_its_commit_once_on_rank_0(cpu_bridge, monkeypatch, caplog):
    """The imported Bridge's version as its package_info says it, and what :func:`bridge_commit` (tested above)
    tells of it: in CI a wheel from PyPI in this repository's .venv, in the lane a side folder, neither told."""
    import megatron.bridge.package_info as info

    version = ".".join(str(v) for v in info.VERSION[:3]) + "".join(str(v) for v in info.VERSION[3:])
    commit, how = bridge_commit()
    expected = f"commit {commit} ({how})" if commit else f"commit not told: {how}"
    monkeypatch.setattr(_version, "_TOLD", set())
    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")

    def told() -> list[str]:
        caplog.clear()
        bfp.deactivate()
        bfp.activate()
        return [r.getMessage() for r in caplog.records if r.name == "bridge_freeze_plugin"
                and r.levelno == logging.INFO and "Megatron-Bridge" in r.getMessage()]

    assert told() == [f"bridge-freeze: Megatron-Bridge {version}, {expected}"]
    assert told() == []  # once per process
    monkeypatch.setattr(_version, "_TOLD", set())
    monkeypatch.setattr(_version, "is_rank0", lambda: False)
    assert told() == []
