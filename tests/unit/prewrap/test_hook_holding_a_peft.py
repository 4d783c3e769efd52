"""A pre-wrap hook that applies a PEFT held by an object it closes over is LoRA to the plugin (issue 34).

SkyRL 0.4.0's Megatron worker registers LoRA as a closure over the worker (``make_megatron_module``'s
``lora_pre_wrap_hook``: ``self.lora_cls(model, training=True)``, then ``set_params_to_save``): not Bridge's PEFT hook,
not a PEFT object, no ``.peft``. The plugin must still see the LoRA behind it, so that the parts left to train at
full rank train next to the adapters (before: a FreezeGuaranteeError on every partial selection with LoRA).
"""

from __future__ import annotations

from _shared import QWEN3_PROJECTION, names, trainable

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider


class SkyRLWorkerStandIn:
    """SkyRL's MegatronWorker as its LoRA hook sees it (the worker itself needs a Bridge newer than 0.6.2)."""

    def __init__(self, targets):
        from megatron.bridge.peft.lora import LoRA

        self.lora_cls = LoRA(target_modules=list(targets), dim=4, alpha=8, lora_B_init_method="zero")
        self.other_state = {"rank": 0}

    def lora_hook(self):
        def lora_pre_wrap_hook(model):
            lora_model = self.lora_cls(model, training=True)
            self.lora_cls.set_params_to_save(lora_model)
            return lora_model

        return lora_pre_wrap_hook


def test_lora_applied_by_a_hook_closing_over_its_holder_keeps_the_full_rank_projection(cpu_bridge):
    provider = bfp.make_freezable(make_provider("qwen3_vl"),
                                  bfp.FreezeSelection(freeze_language_model=True, freeze_vision_model=True))
    provider.register_pre_wrap_hook(SkyRLWorkerStandIn(["linear_qkv", "linear_proj"]).lora_hook())
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)
    every = names(chunks)
    adapters = {n for n in every if ".adapter." in n}
    projection = {n for n in every if QWEN3_PROJECTION.match(n)}
    assert adapters and projection and trainable(chunks) == adapters | projection
