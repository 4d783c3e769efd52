"""One rank of Bridge's real ``pretrain()`` over gloo, for tests/unit/integration/test_bridge_training.py (DP2).

``rank_main(rank, world, workdir, iters, port)`` runs in a process forked from the session's forkserver
(``bridge_forkserver`` in tests/unit/conftest.py), whose server imported Bridge once: the ``import_bridge()`` below
finds it loaded (one Bridge import costs about 15 CPU-seconds). Each rank runs ``iters`` iterations of
``pretrain()`` on the tiny Qwen3-VL with ``freeze_language_model`` and ``freeze_vision_model`` (the projection
trains), the distributed optimizer, one micro-batch per rank, no dropout, a checkpoint at the end under
``workdir/checkpoints`` (written by the ranks together), and writes ``workdir/rank{rank}.pt``: what its grad buffers
hold, its initial parameters, its losses, its time, or the traceback when it failed.
"""

from __future__ import annotations

import faulthandler
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from bridge_freeze_harness.cpu_runtime import import_bridge

import_bridge()


def run(rank: int, world: int, workdir: Path, iters: int) -> dict[str, Any]:
    from bridge_freeze_harness.cpu_runtime import init_cpu_distributed
    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.run_records import Recorder
    from bridge_freeze_harness.train import make_provider
    from bridge_freeze_plugin import FreezeSelection, make_freezable

    init_cpu_distributed(rank=rank, world_size=world)
    selection = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    provider = make_freezable(make_provider("qwen3_vl", hidden_dropout=0.0), selection)
    cfg = training_config(provider, workdir, iters, distributed_optimizer=True)  # saved at the end
    recorder = Recorder()
    run_training(cfg, callbacks=[recorder])  # pretrain()
    return {"grad_buffer_names": recorder.grad_buffer_names, "grad_buffer_numel": recorder.grad_buffer_numel,
            "initial": recorder.initial, "losses": recorder.losses}


def rank_main(rank: int, world: int, workdir: str, iters: int, port: int) -> None:
    """One rank, in a process of its own; writes ``workdir/rank{rank}.pt``."""
    # Own hard timeout: dump every thread's stack (where it hangs) and exit before the parent gives up.
    faulthandler.dump_traceback_later(float(os.environ.get("BFP_WORKER_TIMEOUT_S", "150")), exit=True)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    torch.set_num_threads(1)
    started, cpu = time.monotonic(), time.process_time()
    try:
        result = {"ok": True, **run(rank, world, Path(workdir), iters)}
    except Exception:  # noqa: BLE001  (recorded for the parent to check)
        result = {"ok": False, "traceback": traceback.format_exc()}
    result.update(wall_s=time.monotonic() - started, cpu_s=time.process_time() - cpu)
    torch.save(result, Path(workdir) / f"rank{rank}.pt")
