"""The tests' forked commands exit as a console script does: what the command leaves for the interpreter's exit
runs (megatron-core's torch_dist save starts a Manager process that only exit shuts down; a leftover one outlived
pytest, holding its output pipe open)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from _shared import join_or_kill, start_forked


def leave_a_manager(pid_file: str) -> int:
    """In the forked process: start a Manager (spawned, as megatron-core's does) and return without closing it."""
    manager = multiprocessing.get_context("spawn").Manager()
    globals()["_MANAGER"] = manager  # kept alive to the end, as a module-level queue's owner is
    with open(pid_file, "w", encoding="utf-8") as f:
        f.write(str(manager._process.pid))
    return 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:  # reparented and not yet reaped: a zombie is gone
        return f.read().split(") ", 1)[1][0] != "Z"


def test_a_forked_command_runs_its_exit_work(bridge_forkserver, tmp_path):
    pid_file = tmp_path / "manager.pid"
    proc = start_forked(bridge_forkserver, tmp_path / "out", tmp_path / "err", "test_forked_commands",
                        "leave_a_manager", str(pid_file))
    assert not join_or_kill([proc], 120), (tmp_path / "err").read_text()
    assert proc.exitcode == 0, (tmp_path / "err").read_text()
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftover = _alive(pid)
    if leftover:  # not left to hold pytest's output open
        os.kill(pid, signal.SIGKILL)
    assert not leftover, f"the Manager process {pid} outlived the command"


def test_every_file_using_the_bridge_server_is_scheduled_with_the_others():
    """Under ``make test`` (pytest-xdist, --dist loadfile) the files that use the Bridge server are one scheduling
    unit (tests/conftest.py, ``FORKSERVER_FILES``), so that one worker starts it; a file missing from that list
    starts a second server (another Bridge import, about 15 CPU-seconds) in the other worker."""
    import ast
    import importlib.util
    from pathlib import Path

    tests = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("_top_conftest", tests / "conftest.py")
    assert spec is not None and spec.loader is not None
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    users = set()
    for path in sorted((tests / "unit").rglob("test_*.py")):
        nodes = list(ast.walk(ast.parse(path.read_text())))
        names = {n.id for n in nodes if isinstance(n, ast.Name)} | {n.arg for n in nodes if isinstance(n, ast.arg)}
        names |= {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}  # getfixturevalue
        if names & {"bridge_forkserver", "forked_command"}:
            users.add(path.name)
    assert {"test_cli.py", "test_distributed.py", "test_refit_info.py", "test_trainable_sync.py"} <= users
    assert users <= conftest.FORKSERVER_FILES, users - conftest.FORKSERVER_FILES
