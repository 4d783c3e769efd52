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
