"""Qwen3.5-VL, dense and MoE: real ``Qwen35VLModelProvider`` / ``Qwen35VLMoEModelProvider`` / ``Qwen3VLModel``.

Both configurations live here (``qwen35_vl``, ``qwen35_vl_moe``): they are one registry family, share the
vision tower, the hybrid language model, its CPU patches and its forward; the MoE one only makes every
language-model MLP a routed MoE (MoE CPU notes as in :mod:`.qwen3_vl_moe`) plus a gated shared expert.

The language model mixes Gated DeltaNet (GDN, linear attention) layers with gated standard-attention
layers; here ``linear_attention_freq=2`` gives layer 0 = GDN, layer 1 = attention. The vision tower
is Qwen3-VL's Megatron one; Qwen3.5's HF vision config has no DeepStack indexes, so
``vision_model.decoder.deepstack_merger_list`` is empty and the projection is ``vision_model.merger``.

CPU patches any build of the family needs (:func:`cpu_patches`), all inside megatron-core's hybrid-spec code path, which
is written for TransformerEngine only:

- ``_get_backend_spec_provider`` asserts ``transformer_impl == "transformer_engine"`` and returns a
  ``TESpecProvider`` (not importable without TE): answer megatron-core's ``LocalSpecProvider``.
- ``get_gated_delta_net_module_spec`` asks the backend for a fused layernorm+linear ``in_proj``,
  which the local backend does not have: build the GDN with a plain ``ColumnParallelLinear``
  ``in_proj`` and a separate ``input_layernorm`` instead (TE fuses that norm into ``in_proj``).
- ``get_gpt_layer_with_transformer_engine_spec`` in ``gpt_layer_specs`` (imported at call time by
  the hybrid spec for its standard-attention layers): megatron-core's local spec.
- ``GatedDeltaNet.__init__`` refuses to build without flash-linear-attention (``fla``), a
  CUDA/Triton package that is not installed here; building uses nothing from it, so the guard
  (``HAVE_FLA``) is lifted while building, and the GDN layer is given megatron-core's own pure
  PyTorch ``torch_chunk_gated_delta_rule`` in place of FLA's ``chunk_gated_delta_rule`` kernel (it
  keeps that reference after the build).
- The MTP block (the published configs have ``mtp_num_hidden_layers: 1``): Bridge's MTP spec helper asks
  megatron-core for TransformerEngine MTP layers unconditionally; while building it gets the local ones
  (:func:`~bridge_freeze_harness.tiny._common.local_mtp_block_spec`). The tiny configurations have no MTP.
- Zero-centred gamma (Bridge converts every published Qwen3.5 config with it): megatron-core's torch norm
  refuses it; every CPU build gives such a config the harness's ``Norm``
  (:func:`~bridge_freeze_harness.local_specs.zero_centred_torch_norms`; same parameters).

Forward on the CPU: ``deterministic_mode=True`` (set here) makes the GDN use ``F.conv1d`` instead of
FLA's ``causal_conv1d``; the one FLA function left, ``l2norm`` (q/k normalisation), is swapped for a
PyTorch one by :func:`forward_patches`, which a forward/backward must run inside.

``layernorm_zero_centered_gamma`` is ``False`` in the tiny configurations (Qwen3.5 uses ``True``, which a
full-size build gets through the patch above). Names and structure are the real ones; norm numerics are not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from bridge_freeze_harness._hf_configs import QWEN_IDS, TEXT, TEXT_IDS, HFFamily, qwen3_rope
from bridge_freeze_harness.batches import QWEN_TOKEN_IDS, TrainSpec
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, finalized, local_mtp_block_spec
from bridge_freeze_harness.tiny.qwen3_vl import TINY_IMAGE, TINY_VISION
from bridge_freeze_harness.tiny.qwen3_vl_moe import TINY_MOE

CONFIGS = {"qwen35_vl": "make_provider", "qwen35_vl_moe": "make_moe_provider"}
REAL = True

#: Hybrid GDN + gated-attention language-model fields shared by the dense and MoE variants.
TINY_HYBRID: dict[str, Any] = {
    "linear_attention_freq": 2,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "layernorm_zero_centered_gamma": False,
    "rotary_percent": 0.5,
    "mrope_section": [2, 1, 1],
    "share_embeddings_and_output_weights": False,
    "deterministic_mode": True,
}


def vision_config() -> Any:
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig

    return Qwen3_5VisionConfig(**TINY_VISION)


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider

    provider = Qwen35VLModelProvider(
        **TINY_LM,
        **TINY_HYBRID,
        vision_config=vision_config(),
        **TINY_IMAGE,
    )
    return finalized(provider, **overrides)


#: Qwen3.5 MoE has one gated shared expert next to the routed ones.
TINY_SHARED_EXPERT: dict[str, Any] = {
    "moe_shared_expert_intermediate_size": 32,
    "moe_shared_expert_gate": True,
}


def moe_vision_config() -> Any:
    from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeVisionConfig

    return Qwen3_5MoeVisionConfig(**TINY_VISION)


def make_moe_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLMoEModelProvider

    provider = Qwen35VLMoEModelProvider(
        **TINY_LM,
        **TINY_HYBRID,
        **TINY_MOE,
        **TINY_SHARED_EXPERT,
        vision_config=moe_vision_config(),
        **TINY_IMAGE,
    )
    return finalized(provider, **overrides)


def _local_backend(config: Any) -> Any:
    from megatron.core.models.backends import LocalSpecProvider

    return LocalSpecProvider()


def _local_gated_delta_net_spec(config: Any, backend: Any = None) -> Any:
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.ssm.gated_delta_net import GatedDeltaNet, GatedDeltaNetSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec

    backend = backend if backend is not None else LocalSpecProvider()
    return ModuleSpec(
        module=GatedDeltaNet,
        submodules=GatedDeltaNetSubmodules(
            in_proj=backend.column_parallel_linear(),
            out_norm=backend.layer_norm(rms_norm=config.normalization == "RMSNorm", for_qk=False),
            out_proj=backend.row_parallel_linear(),
        ),
        # No fused norm in in_proj: the layer builds its own input_layernorm.
        metainfo={"fuse_input_layernorm": False},
    )


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Local (pure PyTorch) specs for the hybrid GDN/attention block, and the FLA build guard lifted."""
    from megatron.core.models.gpt import experimental_attention_variant_module_specs as hybrid_specs
    from megatron.core.models.gpt import gpt_layer_specs

    from bridge_freeze_harness.local_specs import _filtered

    gdn_common, gdn = _gdn_modules()

    patches: list[tuple[Any, str, Any]] = [
        (hybrid_specs, "_get_backend_spec_provider", _local_backend),
        (hybrid_specs, "get_gated_delta_net_module_spec", _local_gated_delta_net_spec),
        (
            gpt_layer_specs,
            "get_gpt_layer_with_transformer_engine_spec",
            _filtered(gpt_layer_specs.get_gpt_layer_local_spec),
        ),
        (gdn_common, "HAVE_FLA", True),
        # megatron-core 0.20 moved the PyTorch rule from common.py to gdn.py
        (gdn, "chunk_gated_delta_rule", getattr(gdn, "torch_chunk_gated_delta_rule", None)
         or gdn_common.torch_chunk_gated_delta_rule),
    ]
    with patched(patches), local_mtp_block_spec():
        yield


def _gdn_modules() -> tuple[Any, Any]:
    """(the module holding ``HAVE_FLA`` / ``l2norm``, the one whose ``GatedDeltaNet`` calls ``chunk_gated_delta_rule``):
    ``common`` / ``gdn`` of the ``gated_delta_net`` package (megatron-core >= 0.19), the one module before it."""
    import importlib

    import megatron.core.ssm.gated_delta_net as package

    if not hasattr(package, "__path__"):
        return package, package
    return (importlib.import_module(f"{package.__name__}.common"), importlib.import_module(f"{package.__name__}.gdn"))


def _l2norm(x: Any, dim: int = -1, eps: float = 1e-6) -> Any:
    """``x / sqrt(sum(x**2) + eps)`` along ``dim``: what FLA's ``l2norm`` computes, in PyTorch."""
    import torch

    return x * torch.rsqrt(x.pow(2).sum(dim=dim, keepdim=True) + eps)


@contextlib.contextmanager
def forward_patches() -> Iterator[None]:
    """PyTorch ``l2norm`` for the GDN layers while a forward/backward runs (FLA is not installed)."""
    gdn_common, _ = _gdn_modules()
    with patched([(gdn_common, "l2norm", _l2norm)]):
        yield


#: Qwen-style image-text batches (Qwen3.5 providers hold the same special-token fields as Qwen3-VL).
_TRAIN_SPEC = TrainSpec(token_ids=QWEN_TOKEN_IDS, projection_prefixes=("vision_model.merger.",))
TRAIN_SPECS = {"qwen35_vl": _TRAIN_SPEC, "qwen35_vl_moe": _TRAIN_SPEC}


def _hf_text() -> dict[str, Any]:
    linear = {k: TINY_HYBRID[k] for k in ("linear_conv_kernel_dim", "linear_key_head_dim", "linear_value_head_dim",
                                          "linear_num_key_heads", "linear_num_value_heads")}
    rope = qwen3_rope(TINY_HYBRID["mrope_section"], partial_rotary_factor=TINY_HYBRID["rotary_percent"])
    return {**TEXT, **TEXT_IDS, **linear, "head_dim": TINY_LM["kv_channels"], "rope_parameters": rope,
            "layer_types": ["linear_attention", "full_attention"]}


def hf_checkpoint_config() -> Any:
    from transformers import Qwen3_5Config

    return Qwen3_5Config(text_config=_hf_text(), vision_config=dict(TINY_VISION), **QWEN_IDS,
                         tie_word_embeddings=False)


def hf_moe_checkpoint_config() -> Any:
    from transformers import Qwen3_5MoeConfig

    text = {**_hf_text(), "moe_intermediate_size": TINY_MOE["moe_ffn_hidden_size"],
            "shared_expert_intermediate_size": TINY_SHARED_EXPERT["moe_shared_expert_intermediate_size"],
            "num_experts": TINY_MOE["num_moe_experts"], "num_experts_per_tok": TINY_MOE["moe_router_topk"]}
    return Qwen3_5MoeConfig(text_config=text, vision_config=dict(TINY_VISION), **QWEN_IDS,
                            tie_word_embeddings=False)


def hf_cpu_fields(provider: Any) -> dict[str, Any]:
    """As the tiny Qwen3.5 configs: the GDN's PyTorch conv path, no zero-centred gamma (torch norms lack it)."""
    return {"deterministic_mode": True, "layernorm_zero_centered_gamma": False}


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`).
HF_CHECKPOINTS = {
    "qwen35_vl": HFFamily("Qwen3_5ForConditionalGeneration", hf_checkpoint_config, hf_cpu_fields),
    "qwen35_vl_moe": HFFamily("Qwen3_5MoeForConditionalGeneration", hf_moe_checkpoint_config, hf_cpu_fields),
}
