"""One rank of Bridge's real ``pretrain()`` over gloo with the run-time audit, for
tests/unit/audit/test_audit_distributed.py.

``rank_main(rank, world, out_dir, scenarios_json, port)`` runs in a process forked from the session's forkserver
(``bridge_forkserver``: Bridge imported once). Each scenario trains the tiny model of its family for 4 iterations
in its parallel layout (``tp``, ``pp``, ``ep``; the rest is data parallel), and this rank writes to
``OUT_DIR/rank{RANK}.json`` the audit's verdict as every rank has it (``AuditReport.as_dict()``), or the error it
raised, after every scenario (a parent that kills a hung run still gets the scenarios that finished).
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def _detach_merger(chunks: list[Any]) -> list[Any]:
    for chunk in chunks:
        merger = getattr(getattr(chunk, "vision_model", None), "merger", None)
        if merger is not None:  # the first pipeline stage only
            merger.register_forward_hook(lambda _m, _i, output: output.detach())
    return chunks


class _WriteFrozenOnLastStage:
    """A Bridge callback that writes a frozen language-model weight on the last pipeline stage only."""

    def on_train_step_end(self, context: Any) -> None:
        import torch
        from megatron.core import parallel_state

        if not parallel_state.is_pipeline_last_stage():
            return
        chunk = context.model[-1]
        while hasattr(chunk, "module"):
            chunk = chunk.module
        with torch.no_grad():
            next(p for n, p in chunk.named_parameters() if n.startswith("language_model.decoder.")).add_(1.0)


def _run(sc: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    from megatron.core import parallel_state

    from bridge_freeze_harness.cpu_runtime import init_cpu_distributed
    from bridge_freeze_harness.cpu_training import run_training, training_config
    from bridge_freeze_harness.train import make_provider
    from bridge_freeze_plugin import FreezeSelection, last_audit, make_freezable

    if parallel_state.model_parallel_is_initialized():  # Bridge's setup keeps a state it finds: the scenario's
        parallel_state.destroy_model_parallel()
    init_cpu_distributed(sc.get("tp", 1), sc.get("pp", 1), None, sc.get("ep", 1), rank=rank, world_size=world)
    sizes = {"tensor_model_parallel_size": sc.get("tp", 1), "pipeline_model_parallel_size": sc.get("pp", 1),
             "expert_model_parallel_size": sc.get("ep", 1), "hidden_dropout": 0.0}
    if sc.get("num_layers"):
        sizes["num_layers"] = sc["num_layers"]
    if sc.get("pp", 1) > 1:  # the activations a stage sends are [seq_length, micro-batch, hidden]: the batch's length
        from bridge_freeze_harness.train import synthetic_batch

        sizes["seq_length"] = int(synthetic_batch(sc["family"], make_provider(sc["family"]))["input_ids"].shape[1])
    if "tied" in sc:
        sizes["share_embeddings_and_output_weights"] = sc["tied"]
    provider = make_freezable(make_provider(sc["family"], **sizes), FreezeSelection(**sc["selection"]))
    provider.audit_strict = bool(sc.get("strict"))
    if sc.get("detach"):
        provider.register_pre_wrap_hook(_detach_merger)
    with tempfile.TemporaryDirectory() as workdir:
        dp = world // (sc.get("tp", 1) * sc.get("pp", 1))
        cfg = training_config(provider, workdir, 4, family=sc["family"], distributed_optimizer=sc.get("dist", False),
                              global_batch_size=dp)
        cfg.checkpoint.save = None
        run_training(cfg, family=sc["family"], callbacks=[_WriteFrozenOnLastStage()] if sc.get("write") else None)
    report = last_audit(provider)
    return {"report": None if report is None else report.as_dict()}


def rank_main(rank: int, world: int, out_dir: str, scenarios: str, port: int) -> None:
    """One rank: the scenarios (a JSON list) in order, in one process group."""
    folder = Path(out_dir)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    faulthandler.dump_traceback_later(float(os.environ.get("BFP_WORKER_TIMEOUT_S", "200")), exit=True)
    import torch

    torch.set_num_threads(1)
    from bridge_freeze_harness.cpu_runtime import import_bridge

    import_bridge()
    results: dict[str, Any] = {}
    out = folder / f"rank{rank}.json"
    for sc in json.loads(scenarios):
        try:
            results[sc["name"]] = {"ok": True, **_run(sc, rank, world)}
        except Exception as exc:  # noqa: BLE001  (recorded for the parent to check)
            results[sc["name"]] = {"ok": False, "error": type(exc).__name__, "message": str(exc),
                                   "traceback": traceback.format_exc()}
        out.write_text(json.dumps(results))
