"""The plan's weight-sync sizing says how many of the tensors no conversion task exports TRAIN (issue 37, item 3
sibling): their training would never reach the inference engine, and ``export_trainable_hf_weights`` refuses such a
model, so the plan must not size it silently as if nothing were lost.

A real tiny Qwen2.5-VL from a tiny random HF checkpoint, plain LoRA (no flag) on its HF vision attention (Bridge
0.6.2's bare ``LinearAdapter``: two modules, a ``linear_in`` and a ``linear_out`` weight each, which no task exports).
Bridge 0.7.0 keeps those layers as ``to_wrap`` and its export merges the adapters into them: nothing is left out, and
the two merged weights are the trainable sync (issue 49).
"""

from __future__ import annotations

from typing import Any


def test_the_sync_line_counts_the_left_out_tensors_that_train(cpu_bridge, tmp_path):
    from megatron.bridge import AutoBridge
    from megatron.bridge.peft.lora import LoRA

    from bridge_freeze_harness.hf_checkpoint import build_hf_chunks, cpu_provider, write_tiny_hf_checkpoint
    from bridge_freeze_plugin.planning._sync_bytes import sync_bytes
    from bridge_freeze_plugin.prewrap import bridge_lora_wraps_plain_linear

    checkpoint = write_tiny_hf_checkpoint("qwen25_vl", tmp_path / "hf", seed=0)
    bridge = AutoBridge.from_hf_pretrained(str(checkpoint))
    provider = cpu_provider(bridge, "qwen25_vl")
    peft = LoRA(target_modules=["visual.blocks.*qkv"], dim=4, alpha=8)

    def lora(model: Any) -> Any:
        return peft(model, training=True)

    provider.register_pre_wrap_hook(lora)
    chunks = build_hf_chunks("qwen25_vl", provider)
    trained = sorted(n for n, p in chunks[0].named_parameters() if p.requires_grad)
    sync = sync_bytes(bridge, chunks, "fp32")
    if bridge_lora_wraps_plain_linear():
        assert len(trained) == 4 and all(".attn.qkv.adapter.linear_" in n for n in trained)
        assert sync.left_out_trainable == 0 and "TRAIN" not in sync.describe()
        assert sync.trainable_tensors == 2  # the two merged qkv weights
        return
    assert len(trained) == 4 and all(".attn.qkv.linear_" in n for n in trained)
    assert sync.left_out_trainable == 4 and sync.left_out_tensors >= 4
    assert "4 of which TRAIN" in sync.describe()
    assert sync.trainable_tensors == 0  # nothing that trains reaches an HF tensor
