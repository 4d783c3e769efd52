"""Builds for tests/unit/export/test_refit_info.py and test_skyrl_weight_source.py, and their EP2 rank.

:func:`build` is the user's flow: a tiny HF checkpoint -> ``AutoBridge.from_hf_pretrained`` -> the CPU provider
with the freeze flags (and LoRA as a pre-wrap hook, as Bridge's training setup adds it) -> Bridge's build with the
HF weights loaded. :func:`rank_main` is one rank of Qwen3-VL-MoE with expert parallel 2 over gloo (forked from
the session's forkserver, Bridge imported once): it writes what its exports, the receiver layouts and SkyRL's
source gave to ``OUT/rank{RANK}.json`` (plain data; the test compares).
"""

from __future__ import annotations

import faulthandler
import json
import os
import traceback
from pathlib import Path
from typing import Any

PROJECTION_ONLY = {"freeze_language_model": True, "freeze_vision_model": True}
#: One expert of layer 0 trains on rank 0 only, one of layer 1 on rank 1 only (experts numbered model-wide).
EP_PATTERNS = [r"language_model\.decoder\.layers\.0\.mlp\.experts\.local_experts\.1\.linear_fc1",
               r"language_model\.decoder\.layers\.1\.mlp\.experts\.local_experts\.2\.linear_fc2"]
LORA_TARGETS = ["language_model.*linear_qkv", "language_model.*linear_proj"]


def lora_hook(target_modules: list[str]) -> Any:
    """Bridge's real LoRA, applied as Bridge's training setup applies it (a pre-wrap hook after the weight load)."""
    from megatron.bridge.peft.lora import LoRA

    peft = LoRA(target_modules=target_modules, dim=4, alpha=8)

    def peft_pre_wrap_hook(model: Any) -> Any:
        model = peft(model, training=True)
        peft.set_params_to_save(model)
        return model

    return peft_pre_wrap_hook


def build(checkpoint: Path, family: str, *, lora: list[str] | None = None, **fields: Any) -> tuple[Any, list[Any]]:
    """``(bridge, chunks)``: ``checkpoint`` loaded through AutoBridge and built on the CPU with ``fields``."""
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.hf_checkpoint import bridge_load_context, build_hf_chunks, cpu_provider

    with bridge_load_context(family):  # Kimi K2.5: AutoConfig knows the stand-in for the hub's config class
        bridge = AutoBridge.from_hf_pretrained(str(checkpoint))
    provider = cpu_provider(bridge, family, **fields)
    if lora:
        provider.register_pre_wrap_hook(lora_hook(lora))
    return bridge, build_hf_chunks(family, provider)


def receiver_facts(bridge: Any, chunks: list[Any], *, merge: bool = True) -> dict[str, Any]:
    """The export streams' layouts (Bridge's full export, the trainable one) and the receiver layouts."""
    from _skyrl_weight_sync import info_layout, layout

    from bridge_freeze_plugin.export import export_trainable_hf_weights, trainable_hf_weights_info

    kwargs = {"show_progress": False, "merge_adapter_weights": merge}
    return {
        "full": layout(bridge.export_hf_weights(chunks, cpu=True, **kwargs)),
        "sent": layout(export_trainable_hf_weights(bridge, chunks, cpu=True, **kwargs)),
        "info_everything": info_layout(trainable_hf_weights_info(bridge, chunks, everything=True, **kwargs)),
        "info": info_layout(trainable_hf_weights_info(bridge, chunks, **kwargs)),
    }


def skyrl_facts(bridge: Any, chunks: list[Any]) -> dict[str, Any]:
    """SkyRL's real ``MegatronWeightSource`` with the plugin's filter, against ``export_trainable_hf_weights``."""
    from _skyrl_weight_sync import layout, meta_layout, same_stream, skyrl_sources

    from bridge_freeze_plugin.export import export_trainable_hf_weights, trainable_param_filter

    sources = skyrl_sources()
    expected = list(export_trainable_hf_weights(bridge, chunks, cpu=True, show_progress=False))
    dtype = expected[0][1].dtype
    source = sources.MegatronWeightSource(bridge, chunks, dtype, param_filter=trainable_param_filter(bridge, chunks))
    metadata = meta_layout(source.metadata())
    streamed = list(source)
    return {"expected": layout(expected), "metadata": metadata, "streamed": layout(streamed),
            "same_values": same_stream(streamed, expected)}


def rank_main(rank: int, world: int, out_dir: str, checkpoint: str, port: int) -> None:
    """One rank of Qwen3-VL-MoE under EP ``world``: an expert trained by a pattern, then LoRA on attention."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    faulthandler.dump_traceback_later(float(os.environ.get("BFP_WORKER_TIMEOUT_S", "200")), exit=True)
    import torch

    torch.set_num_threads(1)
    result: dict[str, Any] = {}
    try:
        from bridge_freeze_harness.cpu_runtime import import_bridge, init_cpu_distributed

        import_bridge()
        init_cpu_distributed(expert_model_parallel_size=world, rank=rank, world_size=world)
        bridge, chunks = build(Path(checkpoint), "qwen3_vl_moe", **PROJECTION_ONLY,
                               expert_model_parallel_size=world, train_patterns=EP_PATTERNS)
        result["patterns"] = receiver_facts(bridge, chunks)
        result["skyrl"] = skyrl_facts(bridge, chunks)
        bridge, chunks = build(Path(checkpoint), "qwen3_vl_moe", **PROJECTION_ONLY, lora=LORA_TARGETS,
                               expert_model_parallel_size=world)
        result["lora_merged"] = receiver_facts(bridge, chunks, merge=True)
        result["lora_unmerged"] = receiver_facts(bridge, chunks, merge=False)
    except BaseException:  # noqa: BLE001 - reported to the parent test
        result["traceback"] = traceback.format_exc()
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(result))
