"""Figure 7: one RL weight sync, full export against the trainable-only stream, per selection.

A tiny random Qwen3-VL HF checkpoint on disk (``write_tiny_hf_checkpoint``), loaded the user's way
(``AutoBridge.from_hf_pretrained`` -> ``to_megatron_provider(load_weights=True)``) with each selection's flags, one
AdamW step, then in the same run: Bridge's ``export_hf_weights`` (what a trainer sends today) and
``export_trainable_hf_weights`` (what can have changed), each consumed whole, arms interleaved, medians. Bytes are
the sum of the yielded tensors' ``nbytes``.

The bytes ratio must equal the trainable share in HF-tensor terms EXACTLY (asserted): the bytes of the HF
checkpoint's tensors that depend on a part that trains (read from the safetensors header, selected by HF name
prefixes written here per part), over the bytes of all of them. Float32 on both sides, so no dtype factor.

Rows: the selections config validation accepts without LoRA, and LoRA on the language model's attention next to a
full-rank projection (Bridge's real LoRA as a pre-wrap hook; the merged q/k/v/o bases are sent). Times on a tiny
model are per-tensor overhead more than bytes: the bytes ratio is what scales to a full-size model.
"""

from __future__ import annotations

import json
import re
import struct
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any

from benchmarks._models import FAMILY, LORA_ALPHA, LORA_DIM, accepted_selections, label, quiet
from benchmarks._timing import compare

STEPS = 1
#: HF names of each part of Qwen3-VL (the checkpoint's own layout), and LoRA's merged attention bases.
HF_PARTS: dict[str, re.Pattern[str]] = {
    "vision_projection": re.compile(r"^model\.visual\.(merger|deepstack_merger_list\.\d+)\."),
    "vision_model": re.compile(r"^model\.visual\."),  # after the projection: the rest of model.visual.
    "language_model": re.compile(r"^(model\.language_model\.|lm_head\.)"),
}
LM_ATTENTION = re.compile(r"^model\.language_model\.layers\.\d+\.self_attn\.[qkvo]_proj\.weight$")
LORA_ROW = "LoRA (LM attention) + full-rank projection"
LORA_TARGETS = ["language_model.*linear_qkv", "language_model.*linear_proj"]


def hf_part(name: str) -> str:
    return next(part for part, rx in HF_PARTS.items() if rx.search(name))


def checkpoint_bytes(directory: Path) -> dict[str, int]:
    """Name -> bytes of every tensor in ``model.safetensors``, from its JSON header (no tensor is read)."""
    with open(directory / "model.safetensors", "rb") as handle:
        (size,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(size))
    return {name: end - start for name, meta in header.items() if name != "__metadata__"
            for start, end in [meta["data_offsets"]]}


def _stream(iterable: Any) -> tuple[int, int]:
    count = nbytes = 0
    for _name, tensor in iterable:
        count += 1
        nbytes += tensor.nbytes
    return count, nbytes


def _build(checkpoint: Path, flags: dict[str, bool], lora: bool) -> tuple[Any, list[Any]]:
    import torch
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.hf_checkpoint import build_hf_chunks, cpu_provider
    from bridge_freeze_harness.train import train_steps

    with quiet():
        bridge = AutoBridge.from_hf_pretrained(str(checkpoint))
        provider = cpu_provider(bridge, FAMILY, **flags)
        if lora:
            from megatron.bridge.peft.lora import LoRA

            peft = LoRA(target_modules=LORA_TARGETS, dim=LORA_DIM, alpha=LORA_ALPHA)

            def peft_hook(model: Any) -> Any:
                model = peft(model, training=True)
                peft.set_params_to_save(model)
                return model

            provider.register_pre_wrap_hook(peft_hook)
        chunks = build_hf_chunks(FAMILY, provider)
        torch.manual_seed(0)
        train_steps(chunks[0], FAMILY, provider, steps=STEPS)
    return bridge, chunks


def _row(checkpoint: Path, sizes: dict[str, int], flags: dict[str, bool], can_change: Any, repeat: int,
         lora: bool = False) -> dict[str, Any]:
    from bridge_freeze_plugin import export_trainable_hf_weights

    bridge, chunks = _build(checkpoint, flags, lora)

    def full() -> tuple[int, int]:
        with quiet():
            return _stream(bridge.export_hf_weights(chunks, cpu=True, show_progress=False))

    def trainable() -> tuple[int, int]:
        with quiet():
            return _stream(export_trainable_hf_weights(bridge, chunks, cpu=True, show_progress=False))

    (full_tensors, full_bytes), (sent_tensors, sent_bytes) = full(), trainable()
    timing = compare({"full": full, "trainable": trainable}, baseline="full", repeat=repeat)
    share = Fraction(sum(b for n, b in sizes.items() if can_change(n)), sum(sizes.values()))
    assert full_bytes == sum(sizes.values()), (full_bytes, sum(sizes.values()))
    assert Fraction(sent_bytes, full_bytes) == share, (flags, sent_bytes, full_bytes, share)
    return {
        "full": {"tensors": full_tensors, "bytes": full_bytes, "seconds": timing["seconds"]["full"]},
        "trainable": {"tensors": sent_tensors, "bytes": sent_bytes, "seconds": timing["seconds"]["trainable"]},
        "bytes_ratio": sent_bytes / full_bytes,
        "hf_trainable_share": float(share),
        "bytes_ratio_is_share": True,  # asserted above, exactly (fractions)
        "time_ratio": timing["ratio"]["trainable"],
        "time_ratio_min_max": timing["ratio_min_max"]["trainable"],
        "repeat": repeat,
    }


def run(quick: bool = False) -> dict[str, Any]:
    from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint
    from bridge_freeze_harness.train import make_provider

    with quiet():
        import_bridge()
        init_cpu_distributed()
        selections = accepted_selections(make_provider(FAMILY))
    if quick:  # full fine-tuning and projection only (+ the LoRA row): the smoke test needs keys, not rows
        selections = [s for s in selections if not s.any_set or s.set_flags() == (
            "freeze_language_model", "freeze_vision_model")]
    repeat = 3 if quick else 15
    rows: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp:
        with quiet():
            checkpoint = write_tiny_hf_checkpoint(FAMILY, Path(tmp) / FAMILY)
        sizes = checkpoint_bytes(checkpoint)
        for selection in selections:
            trained = {part.value for part in selection.trained_parts()}
            rows[label(selection)] = _row(checkpoint, sizes, selection.as_dict(),
                                          lambda n, trained=trained: hf_part(n) in trained, repeat)
        projection_only = {"freeze_language_model": True, "freeze_vision_model": True}
        rows[LORA_ROW] = _row(checkpoint, sizes, projection_only,
                              lambda n: hf_part(n) == "vision_projection" or bool(LM_ATTENTION.search(n)),
                              repeat, lora=True)
    return {"family": FAMILY, "steps": STEPS, "checkpoint_tensors": len(sizes),
            "checkpoint_bytes": sum(sizes.values()), "selections": rows,
            "all_bytes_ratios_are_shares": all(r["bytes_ratio_is_share"] for r in rows.values())}


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [
        (f"sync {name}",
         f"bytes {r['bytes_ratio']:.4f} ({r['trainable']['tensors']}/{r['full']['tensors']} tensors), "
         f"time {r['time_ratio']:.2f}x full export",
         "bytes = trainable HF share OK")
        for name, r in result["selections"].items()
    ]
