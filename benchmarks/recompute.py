"""Figure 6: what turning full recompute off in the vision tower costs (the plugin's Qwen3-VL fix).

Measured, on the tiny real Qwen3-VL (plugin build, CPU): the activation bytes one forward keeps for its
backward (every tensor autograd saves, one count per storage, through
``torch.autograd.graph.saved_tensors_hooks``), three ways in one run: no recompute; full recompute everywhere
(what Bridge does, with wrong vision gradients: ``full_recompute_policy="refuse"`` and no flag keeps it);
and the plugin's fix (full recompute in the language model, none in the vision tower). Reported: fix /
everywhere, and fix / none. Medians are not needed: byte counts are exact.

Estimated for Qwen3-VL-30B-A3B's sizes (27 vision layers of 1152, 48 language layers of 2048), with the
per-layer activation model of Korthikanti et al. (2022, "Reducing Activation Recomputation in Large
Transformer Models"), 16-bit activations and flash attention: a layer keeps about 34·s·h bytes without
recompute and 2·s·h with full recompute (its input), for s tokens of hidden size h. Assumed micro-batch:
one 4096-token sequence holding one 1024x1024 image (64x64 = 4096 vision patches of 16 px).
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks._models import quiet

FAMILY = "qwen3_vl"
RECOMPUTE = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
#: Qwen3-VL-30B-A3B (published sizes) and the assumed micro-batch.
FULL_SIZE = {"vision_layers": 27, "vision_hidden": 1152, "text_layers": 48, "text_hidden": 2048,
             "vision_tokens": 4096, "text_tokens": 4096}
BYTES_PER_LAYER_TOKEN_HIDDEN = {"none": 34, "full": 2}


def _saved_bytes(model: torch.nn.Module, batch: Any) -> int:
    from bridge_freeze_harness.train import loss_fn

    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model, batch, FAMILY)
    del loss
    return sum(storages.values())


def _measure(**fields: Any) -> tuple[int, Any]:
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.train import make_provider, synthetic_batch
    from bridge_freeze_plugin import FreezeSelection, make_freezable

    policy = fields.pop("policy", "fix")
    with quiet():
        provider = make_freezable(make_provider(FAMILY, hidden_dropout=0.0, attention_dropout=0.0, **fields),
                                  FreezeSelection())
        provider.full_recompute_policy = policy
        torch.manual_seed(0)
        model = build_tiny_model(FAMILY, provider=provider)
    model.train()
    vision = model.vision_model.config.recompute_granularity
    with quiet():
        return _saved_bytes(model, synthetic_batch(FAMILY, provider)), vision


def estimate_full_size(sizes: dict[str, int] = FULL_SIZE) -> dict[str, Any]:
    """Activation bytes of the vision tower and language model, full recompute everywhere vs the fix."""
    per = BYTES_PER_LAYER_TOKEN_HIDDEN
    text = per["full"] * sizes["text_tokens"] * sizes["text_hidden"] * sizes["text_layers"]
    vision = {mode: per[mode] * sizes["vision_tokens"] * sizes["vision_hidden"] * sizes["vision_layers"]
              for mode in per}
    everywhere, fixed = text + vision["full"], text + vision["none"]
    return {"assumptions": sizes, "bytes_per_layer_token_hidden": per, "full_recompute_everywhere_bytes": everywhere,
            "vision_recompute_off_bytes": fixed, "ratio": fixed / everywhere,
            "extra_gib": (fixed - everywhere) / 2**30}


def run(quick: bool = False) -> dict[str, Any]:
    none, _ = _measure()
    everywhere, vision_everywhere = _measure(policy="refuse", **RECOMPUTE)
    fixed, vision_fixed = _measure(**RECOMPUTE)
    return {
        "family": FAMILY,
        "cpu_tiny": {
            "no_recompute_bytes": none, "full_recompute_everywhere_bytes": everywhere,
            "vision_recompute_off_bytes": fixed,
            "vision_recompute": {"everywhere": vision_everywhere, "fix": vision_fixed},
            "fix_vs_everywhere": fixed / everywhere, "fix_vs_none": fixed / none,
        },
        "full_size_estimate": estimate_full_size(),
    }


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    tiny, full = result["cpu_tiny"], result["full_size_estimate"]
    return [
        ("recompute fix, tiny Qwen3-VL (CPU)",
         f"activations {tiny['fix_vs_everywhere']:.2f}x full recompute everywhere, {tiny['fix_vs_none']:.2f}x none",
         "measured"),
        ("recompute fix, Qwen3-VL-30B-A3B sizes",
         f"activations {full['ratio']:.2f}x full recompute everywhere (+{full['extra_gib']:.2f} GiB per micro-batch)",
         "estimate"),
    ]
