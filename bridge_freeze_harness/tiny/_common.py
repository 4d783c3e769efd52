"""Sizes shared by every tiny configuration (small enough for a 2-core CPU, big enough to be real)."""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bridge_freeze_harness.cpu_runtime import CPU_FUSIONS_OFF
from bridge_freeze_harness.patching import patched

#: Language-model fields common to every tiny Megatron GPT-style text config.
TINY_LM: dict[str, Any] = {
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "kv_channels": 16,
    "vocab_size": 128,
    "seq_length": 64,
    "params_dtype": torch.float32,
    "bf16": False,
    "fp16": False,
    "use_cpu_initialization": True,
    **CPU_FUSIONS_OFF,
}


def finalized(provider: Any, **overrides: Any) -> Any:
    for name, value in overrides.items():
        if not hasattr(provider, name):
            raise AttributeError(f"{type(provider).__name__} has no field {name!r}")
        setattr(provider, name, value)
    provider.finalize()
    return provider

#: A two-layer MoE text stack: layer 0 dense, layer 1 with 4 routed experts (top-2) and a shared expert.
#: The CPU-only settings (no grouped GEMM, no permute fusion, no shared-expert overlap, the ``allgather``
#: dispatcher) change no module or parameter names.
TINY_MOE_WITH_SHARED_EXPERT: dict[str, Any] = {
    "num_moe_experts": 4,
    "moe_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "moe_router_topk": 2,
    "moe_layer_freq": [0, 1],
    "moe_grouped_gemm": False,
    "moe_permute_fusion": False,
    "moe_shared_expert_overlap": False,
    "moe_token_dispatcher_type": "allgather",
}


def _mtp_spec_without_te(fn: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.arguments["use_transformer_engine"] = False
        return fn(*bound.args, **bound.kwargs)

    return call


@contextlib.contextmanager
def local_mtp_block_spec() -> Iterator[None]:
    """megatron-core's MTP block spec with local layers while building.

    Bridge's MTP spec helpers (``gpt_provider.mtp_block_spec``, EXAONE 4.5's ``exaone_45_mtp_block_spec``)
    import megatron-core's ``get_gpt_mtp_block_spec`` at call time and always pass
    ``use_transformer_engine=True``, which fails without TE (``TESpecProvider`` is ``None``).
    """
    from megatron.core.models.gpt import gpt_layer_specs

    original = gpt_layer_specs.get_gpt_mtp_block_spec
    with patched([(gpt_layer_specs, "get_gpt_mtp_block_spec", _mtp_spec_without_te(original))]):
        yield
