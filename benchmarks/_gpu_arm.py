"""One arm of the GPU benchmark (:mod:`benchmarks.gpu_memory`), in a process of its own.

``python -m benchmarks._gpu_arm CONFIG_DIR SELECTION ARM STEPS OUT_JSON``. The model: Bridge's own conversion of
``CONFIG_DIR/config.json`` (``AutoBridge.from_hf_config``, no weights), bf16 under Float16Module, Megatron DDP
with the distributed optimizer, NCCL world 1, built in the harness's CUDA mode (Bridge's own specs where
TransformerEngine imports, local ones where it does not). A synthetic batch of 4 short image-text rows; ``STEPS``
steps (:mod:`bridge_freeze_harness.ddp_steps`). Arms:

- ``plugin``: the plugin imported and the selection given to ``make_freezable``;
- ``bridge``: the plugin NOT imported (run with ``BRIDGE_FREEZE_DISABLE_AUTOLOAD=1``), Bridge's own
  ``freeze_*`` provider fields set;
- ``none``: the plugin not imported, no flag: every parameter trains (or, with LoRA, Bridge's LoRA alone).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

FAMILY = "qwen3_vl"
BATCH_SIZE = 4
LORA = {"dim": 16, "alpha": 32, "target_modules": ["linear_qkv", "linear_proj"]}
LM, VM, VP = "freeze_language_model", "freeze_vision_model", "freeze_vision_projection"
#: selection -> (flags, LoRA with the projection at full rank, arms)
SELECTIONS: dict[str, tuple[dict[str, bool], bool, tuple[str, ...]]] = {
    "full": ({}, False, ("plugin", "none")),
    "projection only": ({LM: True, VM: True}, False, ("plugin", "bridge")),
    "LM frozen": ({LM: True}, False, ("plugin", "bridge")),
    "vision side frozen": ({VM: True, VP: True}, False, ("plugin", "bridge")),
    "LoRA + full-rank projection": ({LM: True, VM: True}, True, ("plugin", "none")),
}


def provider_from_config(config_dir: str, flags: dict[str, bool], lora: bool, arm: str) -> Any:
    """Bridge's provider of the config, bf16 on CUDA, the arm's selection on it (before any build)."""
    import torch
    from megatron.bridge import AutoBridge
    from transformers import AutoConfig

    from bridge_freeze_harness.cpu_runtime import CPU_FUSIONS_OFF
    from bridge_freeze_harness.gpu_runtime import spec_choice
    from bridge_freeze_harness.train import train_spec

    provider = AutoBridge.from_hf_config(AutoConfig.from_pretrained(config_dir)).to_megatron_provider(
        load_weights=False
    )
    fields: dict[str, Any] = {"params_dtype": torch.bfloat16, "bf16": True, "fp16": False,
                              "use_cpu_initialization": False, **train_spec(FAMILY).token_ids,
                              **train_spec(FAMILY).cpu_overrides}
    if spec_choice() == "local":  # the fused kernels need TransformerEngine / Apex
        fields.update(CPU_FUSIONS_OFF)
    for name, value in fields.items():
        setattr(provider, name, value)
    provider.finalize()
    if arm == "plugin":
        from bridge_freeze_plugin import FreezeSelection, make_freezable

        provider = make_freezable(provider, FreezeSelection(**flags))
    elif arm == "bridge":
        for name, value in flags.items():
            setattr(provider, name, value)
    if lora:
        from megatron.bridge.peft.lora import LoRA

        provider.register_pre_wrap_hook(LoRA(**LORA))
    return provider


def measure(config_dir: str, selection: str, arm: str, steps: int) -> dict[str, Any]:
    import torch

    from bridge_freeze_harness.cpu_runtime import import_bridge
    from bridge_freeze_harness.ddp_steps import build_ddp_chunks, megatron_optimizer, to_cuda, train_ddp
    from bridge_freeze_harness.gpu_runtime import init_gpu_distributed, spec_choice
    from bridge_freeze_harness.train import synthetic_batch, train_spec

    flags, lora, arms = SELECTIONS[selection]
    if arm not in arms:
        raise SystemExit(f"arm {arm!r} is not measured for {selection!r} (arms: {', '.join(arms)})")
    import_bridge()
    if arm == "plugin":
        import bridge_freeze_plugin  # noqa: F401 - activation
    init_gpu_distributed()
    provider = provider_from_config(config_dir, flags, lora, arm)
    chunks = build_ddp_chunks(provider, FAMILY)
    optimizer = megatron_optimizer(chunks)
    batch = to_cuda(synthetic_batch(FAMILY, provider, batch_size=BATCH_SIZE))
    run = train_ddp(chunks, optimizer, batch, FAMILY, train_spec(FAMILY), steps)
    timed = run.step_seconds[1:] or run.step_seconds  # the first step includes allocations and warm-up
    return {
        "selection": selection, "arm": arm, "specs": spec_choice(), "device": torch.cuda.get_device_name(0),
        "plugin_loaded": "bridge_freeze_plugin" in sys.modules, "lora": LORA if lora else None,
        "batch": {k: list(v.shape) for k, v in batch.items() if torch.is_tensor(v)},
        **run.as_dict(), "step_median_s": statistics.median(timed),
        "losses_fell": run.losses[-1] < run.losses[0],
    }


def main(argv: list[str]) -> int:
    config_dir, selection, arm, steps, out = argv
    Path(out).write_text(json.dumps(measure(config_dir, selection, arm, int(steps)), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
