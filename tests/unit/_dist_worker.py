"""One rank of a multi-process CPU run (gloo, loopback) for tests/unit/integration/test_distributed.py and
test_plan_per_rank.py.

``rank_main(rank, world, out_dir, scenarios_json, port)`` (and ``plan_main``, plan's side of
tests/unit/planning/test_plan_per_rank.py) runs in a process forked from the session's forkserver
(``bridge_forkserver`` in tests/unit/conftest.py: Bridge imported once); ``python _dist_worker.py RANK WORLD_SIZE
OUT_DIR SCENARIOS_JSON`` with MASTER_ADDR / MASTER_PORT set does the same in a process of its own.
Runs the scenarios in order in one process group (the model-parallel state is rebuilt for each) and
writes what this rank saw to ``OUT_DIR/rank{RANK}.json`` after every scenario, so a parent that has to
kill a hung run still gets the scenarios that finished.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _gappy_provider_class() -> type:
    """A Qwen3-VL provider whose family table forgets ``language_model.output_layer`` (last stage only)."""
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider

    import bridge_freeze_plugin as bfp

    @dataclasses.dataclass
    class GappyQwen3VLProvider(Qwen3VLModelProvider):
        pass

    GappyQwen3VLProvider.__module__ = __name__
    GappyQwen3VLProvider.__qualname__ = "GappyQwen3VLProvider"
    globals()["GappyQwen3VLProvider"] = GappyQwen3VLProvider
    bfp.register_family(
        "gappy_qwen3_vl",
        providers=[f"{__name__}:GappyQwen3VLProvider"],
        language_model=["language_model.embedding", "language_model.decoder", "language_model.rotary_pos_emb"],
        vision_model=["vision_model"],
        vision_projection=["vision_model.merger", "vision_model.decoder.deepstack_merger_list"],
        source="test",
    )
    return GappyQwen3VLProvider


@contextlib.contextmanager
def _tied_embedding_on_cpu() -> Iterator[None]:
    """Let megatron-core tie the embedding across pipeline stages on the CPU.

    With PP > 1 and tied embedding / output weights, megatron-core 0.19.2's
    ``LanguageModule.setup_embeddings_and_output_layer`` (common/language_module/language_module.py,
    ``weight.data = weight.data.cuda()`` before the first/last-stage all_reduce) moves the weight to CUDA
    unconditionally, which fails without a driver. While the model is built here, ``Tensor.cuda`` returns
    the tensor itself, so that all_reduce runs over gloo on the CPU; everything else is the real build.
    The unpatched path is covered by tests/gpu/test_gpu_distributed.py.
    """
    import torch

    with mock.patch.object(torch.Tensor, "cuda", lambda self, *args, **kwargs: self):
        yield


def _provider(sc: dict[str, Any]) -> Any:
    from bridge_freeze_harness.tiny import make_provider

    sizes = {
        "tensor_model_parallel_size": sc["tp"],
        "pipeline_model_parallel_size": sc["pp"],
        "virtual_pipeline_model_parallel_size": sc.get("vp"),
    }
    if sc.get("ep"):
        sizes["expert_model_parallel_size"] = sc["ep"]
    if sc.get("num_layers"):
        sizes["num_layers"] = sc["num_layers"]
    if "tied" in sc:
        sizes["share_embeddings_and_output_weights"] = sc["tied"]
    base = make_provider(sc["family"], **sizes)
    if sc.get("inject") == "unclassified_last_stage":
        cls = _gappy_provider_class()
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
        base = cls(**fields)
        base.finalize()
    return base


def _with_patterns(provider: Any, selection: Any) -> Any:
    """Write the selection's train / freeze patterns to the provider (attributes read like the flags)."""
    for key, values in selection.patterns_dict().items():
        setattr(provider, key, values)
    return provider


def _run(sc: dict[str, Any], rank: int, world: int, capture: _Capture) -> dict[str, Any]:
    import torch
    from megatron.core import parallel_state

    import bridge_freeze_plugin as bfp
    from bridge_freeze_harness.cpu_runtime import init_cpu_distributed
    from bridge_freeze_harness.tiny import build_tiny_chunks

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    init_cpu_distributed(sc["tp"], sc["pp"], sc.get("vp"), sc.get("ep", 1), rank=rank, world_size=world)
    selection = bfp.FreezeSelection(**sc["selection"])
    if sc.get("inject") == "unsupported":
        from megatron.bridge.models.gpt_provider import GPTModelProvider

        provider = GPTModelProvider(num_layers=1, hidden_size=8, num_attention_heads=1, hf_model_id="acme/text-7b")
        bfp.make_freezable(provider, selection)  # raises, identically, on every rank
        raise AssertionError("make_freezable accepted a flag on an unsupported provider")
    provider = _with_patterns(bfp.make_freezable(_provider(sc), selection), selection)
    if sc.get("inject") == "guarantee_last_stage":

        def unfreeze_lm_on_last_stage(model: list[Any]) -> list[Any]:
            if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
                for name, param in model[-1].named_parameters():
                    if name.startswith("language_model."):
                        param.requires_grad_(True)
            return model

        provider.register_pre_wrap_hook(unfreeze_lm_on_last_stage)
    capture.messages.clear()
    with _tied_embedding_on_cpu() if sc.get("tied_on_cpu") else contextlib.nullcontext():
        chunks = build_tiny_chunks(sc["family"], provider=provider)
    params = [(n, p) for c in chunks for n, p in c.named_parameters()]
    report = bfp.last_report(provider)
    return {
        "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
        "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
        "dp_rank": parallel_state.get_data_parallel_rank(),
        "ep_rank": parallel_state.get_expert_model_parallel_rank(),
        "expert": sorted(n for n, p in params if not getattr(p, "allreduce", True)),
        "n_chunks": len(chunks),
        "names": sorted(n for n, _ in params),
        "trainable": sorted(n for n, p in params if p.requires_grad),
        "numel": {n: p.numel() for n, p in params},
        "tp_sharded": sorted(n for n, p in params if getattr(p, "tensor_model_parallel", False)),
        "report": None if report is None else report.as_dict(),
        "logged": [m for m in capture.messages if m.startswith("bridge-freeze:")],
        "torch_threads": torch.get_num_threads(),
    }


def main() -> None:
    rank_main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4])


def rank_main(rank: int, world: int, out_dir: str, scenarios: str, port: int | None = None) -> None:
    """One rank: the scenarios (a JSON list) in order; ``port``: the master port (else MASTER_PORT is set)."""
    folder = Path(out_dir)
    if port is not None:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    # Own hard timeout: dump every thread's stack (where it hangs) and exit before the parent kills us.
    faulthandler.dump_traceback_later(float(os.environ.get("BFP_WORKER_TIMEOUT_S", "200")), exit=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch

    torch.set_num_threads(1)
    from bridge_freeze_harness.cpu_runtime import import_bridge

    import_bridge()
    capture = _Capture()
    logger = logging.getLogger("bridge_freeze_plugin")
    logger.addHandler(capture)
    logger.setLevel(logging.INFO)
    import megatron.bridge

    results: dict[str, Any] = {"_bridge": megatron.bridge.__file__}  # which Bridge ran (the lane's, in the lane)
    out = folder / f"rank{rank}.json"
    for sc in json.loads(scenarios):
        try:
            results[sc["name"]] = {"ok": True, **_run(sc, rank, world, capture)}
        except Exception as exc:  # noqa: BLE001  (recorded for the parent to check)
            results[sc["name"]] = {
                "ok": False,
                "error": type(exc).__name__,
                "message": str(exc),
                "traceback": traceback.format_exc(),
            }
        out.write_text(json.dumps(results))


def plan_main(out: str, scenarios: str) -> None:
    """``bridge-freeze plan``'s per-rank figures (its own fake-backend world, which replaces this process's group)
    for each scenario (a JSON list), written to ``out`` as {scenario: [per-rank entries]}."""
    import torch

    torch.set_num_threads(1)
    from bridge_freeze_plugin import planning
    from bridge_freeze_plugin.request import FreezeSelection

    results = {}
    for sc in json.loads(scenarios):
        selection = sc["selection"]
        plan = planning.plan_model(
            sc["family"],
            FreezeSelection(freeze_language_model=selection.get("freeze_language_model", False),
                            train_patterns=tuple(selection.get("train_patterns", ()))),
            planning.MemoryAssumptions(),
            tiny=True,
            layout=planning.Layout(tp=sc["tp"], pp=sc["pp"], ep=sc.get("ep", 1)),
        )
        results[sc["name"]] = [r.as_dict() for r in plan.per_rank]
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
