"""Fixtures the unit tests share (plain helpers: ``_shared.py``; ``cpu_bridge`` and the markers: tests/conftest.py).

``bridge_forkserver``: one ``multiprocessing`` forkserver for the session whose server imported Bridge once
(``_bridge_preload.py``): the gloo ranks, plan's fake-backend worlds and the ``bridge-freeze`` commands the tests
start are forked from it (:func:`_shared.start_forked`), each a process of its own without a Bridge import each.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from _shared import join_or_kill, preloaded_forkserver, start_forked, stop_forkserver

_SERVER: dict[str, Any] = {}


def _start_server() -> Any:
    if "ctx" not in _SERVER:
        _SERVER["ctx"] = preloaded_forkserver("_bridge_preload", "_shared")
    return _SERVER["ctx"]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the server as soon as a selected test will use it: its Bridge import (about 15 CPU-seconds) then runs
    on the other core while the tests before it run. Not in a pytest-xdist worker: each collects every test, but
    only the one that gets the files using the server (one scheduling unit: tests/conftest.py) starts it, on first
    use."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any("bridge_forkserver" in getattr(item, "fixturenames", ()) for item in session.items):
        _start_server()


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _SERVER.pop("ctx", None) is not None:
        stop_forkserver()


@pytest.fixture(scope="session")
def bridge_forkserver():
    """The forkserver context (its server started at the end of collection, or now); stopped at the session's end."""
    return _start_server()


@pytest.fixture(scope="session")
def forked_command(bridge_forkserver):
    """``forked_command(*args)``: ``bridge-freeze ARGS`` (the command's own ``main``) in a process forked from the
    Bridge server, returned as ``subprocess.run`` returns it (exit status, stdout, stderr). A hard timeout: the
    process is killed and the test fails."""

    def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
            proc = start_forked(bridge_forkserver, out, err, "_shared", "cli_main", list(args))
            if join_or_kill([proc], timeout):
                pytest.fail(f"bridge-freeze {' '.join(args)} ran past {timeout}s and was killed:\n"
                            f"{err.read_text()[-3000:]}")
            return subprocess.CompletedProcess(["bridge-freeze", *args], proc.exitcode, out.read_text(),
                                               err.read_text())

    return run
