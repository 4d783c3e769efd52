"""Figure: what the run-time audit costs, in the steps it audits and in the steps after, against the audit off.

The loop a Megatron trainer runs, on the CPU: step figure's Qwen3-VL (:mod:`benchmarks.step_time`: 4 + 4 layers,
hidden 256, a 32x32-patch image; ``--quick``: the tiny one) built once through the plugin
(``provide_distributed_model``: Megatron DDP, Megatron's Adam), then per step ``zero_grad_buffer``, megatron-core's
schedule (``get_forward_backward_func()``, ``config.finalize_model_grads_func`` set: the audit's seam) and the
optimizer step. Two selections: projection only (the most to fingerprint: everything else is frozen) and full
fine-tuning (the most gradients to count).

Each repeat, per selection: the audit armed again on the same model (the build's own :class:`TrainingBuild`, with
``audit_steps`` = 3), then ``1 + K + AFTER`` steps timed one by one: step 1 (the fingerprint is taken at its first
forward), steps 2..K (audited), step K + 1 (the last check of what must hold, then the audit removes itself), and
``AFTER`` steps with the audit gone; and the same number of steps with no audit, interleaved. Ratios within the
repeat, medians over repeats. The audit's own clock (``AuditReport.seconds``) is reported beside them.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from benchmarks._models import FAMILY, quiet

AUDITED = 3
AFTER = 4


def _loop(quick: bool, selection: Any) -> tuple[Any, list[Any], Any, Any, Any]:
    """(provider, DDP chunks, optimizer, its TrainingBuild, a step function) inside the CPU training context."""
    from benchmarks.step_time import make_batch, make_provider
    from bridge_freeze_harness.ddp_steps import build_ddp_chunks, megatron_optimizer
    from bridge_freeze_harness.train import train_spec
    from bridge_freeze_plugin import make_freezable
    from bridge_freeze_plugin.prewrap import on_training_build

    builds: list[Any] = []
    on_training_build(builds.append)
    provider = make_freezable(make_provider(quick), selection)
    provider.audit_steps = 0  # armed by hand below, for each repeat
    provider.hidden_dropout = 0.0
    chunks = build_ddp_chunks(provider, FAMILY, distributed_optimizer=False, bf16=False, device="cpu")
    optimizer = megatron_optimizer(chunks, distributed_optimizer=False, bf16=False)
    spec, batch = train_spec(FAMILY), make_batch(provider, quick)

    from megatron.core.distributed import finalize_model_grads
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.utils import get_model_config

    get_model_config(chunks[0]).finalize_model_grads_func = finalize_model_grads

    def forward_step(data: Any, model: Any) -> tuple[Any, Any]:
        sample = next(data)
        output = model(**spec.forward_kwargs(sample))
        return output, lambda out: (spec.loss(out, sample), {})

    def step() -> None:
        for chunk in chunks:
            chunk.zero_grad_buffer()
        optimizer.zero_grad()
        get_forward_backward_func()(forward_step_func=forward_step, data_iterator=iter([batch]), model=chunks,
                                    num_microbatches=1, seq_length=int(batch["input_ids"].shape[1]),
                                    micro_batch_size=1)
        optimizer.step()

    return provider, chunks, optimizer, builds[-1], step


def _timed(step: Any, count: int) -> list[float]:
    out = []
    for _ in range(count):
        started = time.perf_counter()
        step()
        out.append(time.perf_counter() - started)
    return out


def _selection_figure(quick: bool, selection: Any, repeat: int) -> dict[str, Any]:
    from bridge_freeze_plugin import last_audit
    from bridge_freeze_plugin.audit import RunAudit
    from bridge_freeze_plugin.request import AuditSettings

    provider, chunks, _, build, step = _loop(quick, selection)
    audited_build = dataclasses.replace(build, context=dataclasses.replace(build.context,
                                                                           audit=AuditSettings(steps=AUDITED)))
    _timed(step, 2)  # warm-up
    ratios: dict[str, list[float]] = {"audited steps": [], "last check": [], "after the audit": []}
    off_ms, audit_s = [], []
    for r in range(repeat):
        def audited() -> list[float]:
            RunAudit(audited_build)
            return _timed(step, 1 + AUDITED + AFTER)

        runs = [audited, lambda: _timed(step, 1 + AUDITED + AFTER)]
        on, off = (runs[0](), runs[1]()) if r % 2 == 0 else tuple(reversed((runs[1](), runs[0]())))
        base = statistics.median(off)
        off_ms.append(1e3 * base)
        ratios["audited steps"].append(statistics.median(on[:AUDITED]) / base)
        ratios["last check"].append(on[AUDITED] / base)
        ratios["after the audit"].append(statistics.median(on[AUDITED + 1:]) / base)
        audit_s.append(last_audit(provider).seconds)
    report = last_audit(provider)
    return {
        "trainable_tensors": sum(p.trainable_tensors for p in report.parts),
        "held_tensors": report.held_tensors,
        "step_ms_audit_off": statistics.median(off_ms),
        "ratio": {k: statistics.median(v) for k, v in ratios.items()},
        "ratio_min_max": {k: [min(v), max(v)] for k, v in ratios.items()},
        "audit_seconds_in_its_steps": statistics.median(audit_s),
        "parameters": sum(p.numel() for c in chunks for p in c.parameters()),
    }


def _checksum_rate(quick: bool) -> dict[str, Any]:
    """The accelerator fingerprint (two 64-bit sums of the bit pattern), timed on the CPU: bytes per second."""
    import torch

    from bridge_freeze_plugin.audit import checksum

    tensor = torch.randn((1 << 20) if quick else (1 << 24), dtype=torch.bfloat16)
    checksum(tensor)
    started = time.perf_counter()
    checksum(tensor)
    seconds = time.perf_counter() - started
    return {"bytes": tensor.numel() * tensor.element_size(), "seconds": seconds,
            "gib_per_s": tensor.numel() * tensor.element_size() / seconds / 2**30}


def run(quick: bool = False) -> dict[str, Any]:
    from bridge_freeze_harness.cpu_training import cpu_training
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_plugin.request import FreezeSelection

    selections = {"projection only": FreezeSelection(freeze_language_model=True, freeze_vision_model=True),
                  "full fine-tuning": FreezeSelection()}
    out: dict[str, Any] = {"family": FAMILY, "audited_steps": AUDITED, "steps_after": AFTER, "selections": {}}
    with quiet(), cpu_training(FAMILY), forward_patches(FAMILY):
        for name, selection in selections.items():
            out["selections"][name] = _selection_figure(quick, selection, repeat=3 if quick else 7)
    out["cpu_checksum"] = _checksum_rate(quick)
    out["max_ratio_after"] = max(s["ratio"]["after the audit"] for s in out["selections"].values())
    return out


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = []
    for name, figure in result["selections"].items():
        ratio = figure["ratio"]
        rows.append((f"audit {name}", f"{ratio['audited steps']:.2f}x audited, {ratio['last check']:.2f}x last check, "
                     f"{ratio['after the audit']:.2f}x after ({figure['step_ms_audit_off']:.0f} ms/step off)",
                     "after: 1.00x"))
    rows.append(("audit CPU checksum", f"{result['cpu_checksum']['gib_per_s']:.2f} GiB/s", ""))
    return rows
