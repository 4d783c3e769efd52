"""Figure 3: forward + backward time per accepted selection, relative to full fine-tuning.

A real Bridge Qwen3-VL built on the CPU, big enough that compute (not Python overhead) dominates on two
cores: language model and vision encoder of 4 layers, hidden 256, a 32x32-patch image. One model, the
selection switched with :func:`bridge_freeze_plugin.freeze.apply_selection` between timings (untimed);
arms interleaved, median of per-repeat ratios.

To show that a frozen vision encoder's backward is skipped, not just its weight gradients, a hook on
each vision encoder layer's output counts the gradients that flow back through it in one backward.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from benchmarks._models import FAMILY, accepted_selections, label, quiet
from benchmarks._timing import compare

HIDDEN = 256
LAYERS = 4
HEADS = 4
GRID = (1, 32, 32)  # patches; 256 image tokens after the 2x2 merge
TEXT = 128
QUICK_GRID = (1, 8, 8)


def vision_config(quick: bool) -> Any:
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    from bridge_freeze_harness.tiny.qwen3_vl import TINY_IMAGE

    hidden = 64 if quick else HIDDEN
    return Qwen3VLVisionConfig(
        depth=2 if quick else LAYERS,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_heads=HEADS,
        out_hidden_size=hidden,
        num_position_embeddings=64 if quick else 1024,
        deepstack_visual_indexes=[0, 1],
        **TINY_IMAGE,
    )


def make_provider(quick: bool) -> Any:
    from bridge_freeze_harness.train import make_provider as tiny_provider

    if quick:
        return tiny_provider(FAMILY)
    kv = HIDDEN // HEADS
    return tiny_provider(
        FAMILY,
        num_layers=LAYERS,
        hidden_size=HIDDEN,
        ffn_hidden_size=4 * HIDDEN,
        num_attention_heads=HEADS,
        num_query_groups=HEADS // 2,
        kv_channels=kv,
        mrope_section=[kv // 8, 3 * kv // 16, 3 * kv // 16],
        seq_length=1024,
        vision_config=vision_config(quick),
        out_hidden_size=HIDDEN,
    )


def make_batch(provider: Any, quick: bool) -> dict[str, torch.Tensor]:
    """The family's synthetic batch, with this figure's image size and text length."""
    from bridge_freeze_harness import train

    base = train.train_spec(FAMILY)
    grid = QUICK_GRID if quick else GRID
    text = {} if quick else {"text_before": TEXT // 2, "text_after": TEXT // 2}
    return train.synthetic_batch(FAMILY, provider, spec=replace(base, image_grid_thw=grid, **text))


class VisionBackwardCounter:
    """Counts gradients arriving at the outputs of the vision encoder's transformer layers."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls = 0
        self.layers = list(model.vision_model.decoder.layers)
        self._handles = [layer.register_forward_hook(self._on_forward) for layer in self.layers]

    def _on_forward(self, _module: Any, _inputs: Any, output: Any) -> None:
        hidden = output[0] if isinstance(output, tuple) else output
        if torch.is_tensor(hidden) and hidden.requires_grad:
            hidden.register_hook(self._on_backward)

    def _on_backward(self, grad: torch.Tensor) -> None:
        self.calls += 1

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def run(quick: bool = False) -> dict[str, Any]:
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.train import loss_fn
    from bridge_freeze_plugin import apply_selection
    from bridge_freeze_plugin.registry import get_family
    from bridge_freeze_plugin.request import FreezeSelection

    family = get_family(FAMILY)
    with quiet():
        provider = make_provider(quick)
        torch.manual_seed(0)
        model = build_tiny_model(FAMILY, provider)
    model.train()
    batch = make_batch(provider, quick)
    selections = accepted_selections(provider)
    if quick:
        selections = [s for s in selections if s in (FreezeSelection(), FreezeSelection(freeze_vision_model=True))]

    def step() -> None:
        model.zero_grad(set_to_none=True)
        with quiet():
            loss = loss_fn(model, batch)
        loss.backward()

    def select(selection: Any) -> Any:
        return lambda: apply_selection(model, family, selection)

    # Vision-layer backward calls per selection (one forward + backward each).
    counter = VisionBackwardCounter(model)
    vision_backward_calls = {}
    for selection in selections:
        select(selection)()
        counter.calls = 0
        step()
        vision_backward_calls[label(selection)] = counter.calls
    counter.remove()

    arms = {label(s): step for s in selections}
    timing = compare(
        arms,
        baseline="full fine-tuning",
        repeat=3 if quick else 9,
        setups={label(s): select(s) for s in selections},
    )
    params = sum(p.numel() for p in model.parameters())
    vm_frozen = label(FreezeSelection(freeze_vision_model=True))
    return {
        "family": FAMILY,
        "model": {
            "parameters": params,
            "vision_layers": len(counter.layers),
            "language_layers": int(provider.num_layers),
            "hidden": int(provider.hidden_size),
            "sequence": int(batch["input_ids"].shape[1]),
            "image_patches": int(batch["pixel_values"].shape[0]),
        },
        "repeat": timing["repeat"],
        "full_step_ms": 1e3 * timing["seconds"]["full fine-tuning"],
        "ratio": timing["ratio"],
        "ratio_min_max": timing["ratio_min_max"],
        "vision_layer_backward_calls": vision_backward_calls,
        "vision_backward_skipped_when_frozen": vision_backward_calls.get(vm_frozen) == 0
        and vision_backward_calls["full fine-tuning"] == len(counter.layers),
    }


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    calls = result["vision_layer_backward_calls"]
    rows = [
        (f"step {name}", f"{ratio:.2f}x full ({calls[name]} vision-layer backward calls)",
         "VM frozen: 0 calls" if "VM" in name else "")
        for name, ratio in result["ratio"].items()
    ]
    rows.insert(0, ("step full fine-tuning", f"{result['full_step_ms']:.0f} ms fwd+bwd "
                    f"({result['model']['parameters']:,} params)", "baseline"))
    return rows[:1] + rows[2:] if len(rows) > 1 else rows
