"""Kimi K2.5-VL: real ``KimiK25VLModelProvider`` / ``KimiK25VLModel`` with an offline vision tower.

``KimiK25VLModel.__init__`` builds its vision side from HuggingFace *remote code*: it calls
``transformers.dynamic_module_utils.get_class_from_dynamic_module("modeling_kimi_k25.<Class>",
config.hf_model_path, trust_remote_code=True)`` for ``MoonViT3dPretrainedModel``, ``PatchMergerMLP``,
``ProjectorConfig``, ``VisionTowerConfig`` and ``MoonViT3dEncoder``, and reloads the vision config with
``safe_load_config_with_retry(config.hf_model_path, trust_remote_code=True)`` (``AutoConfig``). Both
need ``modeling_kimi_k25.py`` / ``config.json`` from the model repository on the hub, which is not
reachable here and whose code is not part of transformers. It also refuses ``hf_model_path=None``
even when no vision tower is built.

So the real provider and the real model class are used, and :func:`tiny_patches` answers those two
calls, for this module's offline ``hf_model_path`` only, with the local classes below. They are
structural re-implementations of the remote MoonViT3d tower and patch-merger projector: the same
module and parameter names as the checkpoint keys Bridge maps one to one (``vision_tower.**``,
``mm_projector.**``), i.e. ``patch_embed.{proj,pos_emb}``, ``encoder.blocks.N.{norm0,norm1,wqkv,wo,
mlp.fc0,mlp.fc1}``, ``encoder.final_layernorm``, ``mm_projector.{pre_norm,proj.0,proj.2}``, with a
simple forward. The language model is Bridge's real MLA + MoE GPT model on megatron-core's local
layers (first layer dense, second MoE, as Kimi K2's ``first_k_dense_replace=1``).

Its tiny HF checkpoint (``HF_CHECKPOINTS``) is written from the same stand-ins plus transformers' DeepSeek-V3 causal
LM, its routed experts INT4 as published (:mod:`._kimi_hf`); :func:`hf_cpu_fields` lets the converted provider's
model find the stand-ins for the checkpoint's folder.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import types
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._hf_configs import HFFamily
from bridge_freeze_harness.batches import TrainSpec, image_rows
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, finalized
from bridge_freeze_harness.tiny._kimi_remote_code import REMOTE_CLASSES, KimiK25VisionConfig

REAL = True
#: What is not real in this family's tiny model (REAL is about the provider and model class).
VISION_STAND_IN_REASON = (
    "vision_tower / mm_projector classes come from HF remote code (modeling_kimi_k25.py on the hub, "
    "loaded by get_class_from_dynamic_module); offline, local structural re-implementations are used"
)

#: ``hf_model_path`` values this module answers offline -> the vision config to hand back.
OFFLINE_PATH_PREFIX = "offline-tiny/kimi_k25_vl/"
_OFFLINE_VISION_CONFIGS: dict[str, Any] = {}
_counter = itertools.count()
#: Any-size models answered offline by :func:`cpu_patches`: ``hf_model_path`` -> the vision config
#: (registered by :func:`register_offline_model`, e.g. by ``bridge-freeze plan`` for a published config.json).
_OFFLINE_MODELS: dict[str, Any] = {}


def register_offline_model(path: str, vision_config: Any) -> None:
    """Let a build whose ``hf_model_path`` is ``path`` get the remote classes and ``vision_config`` offline.

    For a real (any-size) Kimi K2.5 config read without its remote code: the look-ups for ``path`` are
    answered by :func:`cpu_patches` with this module's structural stand-ins (same parameter names and shapes
    as the published checkpoint's ``vision_tower.**`` / ``mm_projector.**`` tensors).
    """
    _OFFLINE_MODELS[path] = vision_config


def read_offline_config(doc: dict[str, Any], cfg_file: Any) -> Any:
    """A published ``kimi_k25`` config.json (its JSON object ``doc``) read offline for ``bridge-freeze plan``
    (the family's ``OfflineConfig`` reader): the text config is DeepSeek-V3's (transformers' own), the vision
    config keeps the published keys (:class:`KimiK25VisionConfig`), and the model's hub look-ups for the file's
    folder are answered by :func:`cpu_patches` (:func:`register_offline_model`)."""
    from pathlib import Path

    from transformers import AutoConfig, PretrainedConfig

    from bridge_freeze_plugin.errors import PlanError

    cfg_file = Path(cfg_file)
    for key in ("text_config", "vision_config"):
        if not isinstance(doc.get(key), dict):
            raise PlanError(f"{cfg_file}: a kimi_k25 config needs a `{key}` object (the published config.json "
                            f"has one): give the model's own config.json")
    remote_keys = ("auto_map", "architectures", "model_type")  # they describe the remote code, not the model
    text = {k: v for k, v in doc["text_config"].items() if k not in remote_keys}
    text_config = AutoConfig.for_model("deepseek_v3", **text)  # Kimi K2's text model is DeepSeek-V3's
    vision_config = KimiK25VisionConfig(**{k: v for k, v in doc["vision_config"].items() if k != "model_type"})
    top = {k: v for k, v in doc.items() if k not in ("text_config", "vision_config", "model_type")}
    config = PretrainedConfig(**top)
    config.text_config = text_config
    config.vision_config = vision_config
    path = str(cfg_file.resolve().parent)
    config._name_or_path = path  # Bridge's hf_model_path: where the model looks its remote classes up
    # The model refuses to look them up without it; the look-ups for ``path`` are answered by the stand-ins above,
    # and plan runs with the hub offline, so no remote code is fetched or run.
    config.trust_remote_code = True
    register_offline_model(path, vision_config)
    return config

TINY_MLA = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_head_dim": 16, "qk_pos_emb_head_dim": 8, "v_head_dim": 16}
TINY_MOE = {
    "num_moe_experts": 4,
    "moe_router_topk": 2,
    "moe_ffn_hidden_size": 32,
    "moe_shared_expert_intermediate_size": 32,
    "moe_layer_freq": [0, 1],
}
#: Special tokens inside the tiny vocabulary (the real ids are ~163k).
MEDIA_PLACEHOLDER_TOKEN_ID = TINY_LM["vocab_size"] - 1
PAD_TOKEN_ID = 0


# --- patches and provider -----------------------------------------------------------------------------


def _is_offline(path: Any) -> bool:
    return isinstance(path, str) and path.startswith(OFFLINE_PATH_PREFIX)


@contextlib.contextmanager
def tiny_patches() -> Iterator[None]:
    """Answer the two hub look-ups of ``KimiK25VLModel.__init__`` for offline tiny paths only."""
    from megatron.bridge.models.hf_pretrained import safe_config_loader
    from megatron.bridge.models.kimi_vl import modeling_kimi_k25_vl

    original_get_class = modeling_kimi_k25_vl.get_class_from_dynamic_module
    original_load_config = safe_config_loader.safe_load_config_with_retry

    def get_class(class_reference: str, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_offline(pretrained_model_name_or_path):
            return REMOTE_CLASSES[class_reference]
        return original_get_class(class_reference, pretrained_model_name_or_path, *args, **kwargs)

    def load_config(path: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_offline(path):
            return types.SimpleNamespace(vision_config=_OFFLINE_VISION_CONFIGS[path])
        return original_load_config(path, *args, **kwargs)

    patches = [
        (modeling_kimi_k25_vl, "get_class_from_dynamic_module", get_class),
        (safe_config_loader, "safe_load_config_with_retry", load_config),
    ]
    with patched(patches):
        yield


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Any Kimi K2.5 build: MLA on local layers, and the hub look-ups for :func:`register_offline_model` paths.

    1. Bridge's conversion sets the layer spec to megatron-core's ``get_gpt_decoder_block_spec`` (local layers
       without TE), whose core attention, megatron-core's local ``DotProductAttention``, does not accept the
       ``k_channels`` / ``v_channels`` that ``MLASelfAttention`` passes: while building, the local spec
       provider hands out :func:`_mla_local_core_attention` instead (no parameters; the tiny configuration's
       own spec already does the same).
    2. ``KimiK25VLModel.__init__``'s two hub look-ups are answered offline for registered paths; any other path
       goes to the real look-ups unchanged (tiny paths are :func:`tiny_patches`').
    """
    from megatron.bridge.models.hf_pretrained import safe_config_loader
    from megatron.bridge.models.kimi_vl import modeling_kimi_k25_vl
    from megatron.core.models.backends import LocalSpecProvider

    original_get_class = modeling_kimi_k25_vl.get_class_from_dynamic_module
    original_load_config = safe_config_loader.safe_load_config_with_retry

    def get_class(class_reference: str, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        if pretrained_model_name_or_path in _OFFLINE_MODELS:
            return REMOTE_CLASSES[class_reference]
        return original_get_class(class_reference, pretrained_model_name_or_path, *args, **kwargs)

    def load_config(path: Any, *args: Any, **kwargs: Any) -> Any:
        if path in _OFFLINE_MODELS:
            return types.SimpleNamespace(vision_config=_OFFLINE_MODELS[path])
        return original_load_config(path, *args, **kwargs)

    patches = [
        (LocalSpecProvider, "core_attention", lambda _self: _mla_local_core_attention()),
        (modeling_kimi_k25_vl, "get_class_from_dynamic_module", get_class),
        (safe_config_loader, "safe_load_config_with_retry", load_config),
    ]
    with patched(patches):
        yield


@functools.cache
def _mla_local_core_attention() -> type:
    """megatron-core's local ``DotProductAttention``, accepting the head sizes MLA passes.

    ``MLASelfAttention`` hands its core attention ``k_channels`` / ``v_channels``, which only the TE
    class accepts; the local class reads head sizes from ``kv_channels`` instead, so the tiny
    configuration keeps ``kv_channels == v_head_dim``.
    """
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class MLALocalDotProductAttention(DotProductAttention):
        def __init__(self, *args: Any, k_channels: int | None = None, v_channels: int | None = None, **kwargs: Any):
            del k_channels, v_channels
            super().__init__(*args, **kwargs)

    return MLALocalDotProductAttention


def local_block_spec(config: Any) -> Any:
    """Bridge's Kimi choice (``get_gpt_decoder_block_spec``) on megatron-core's local layers."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    core_attention = _mla_local_core_attention()
    for layer_spec in spec.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = core_attention
    return spec


def vision_config() -> KimiK25VisionConfig:
    return KimiK25VisionConfig(text_hidden_size=TINY_LM["hidden_size"])


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.kimi_vl.kimi_k25_vl_provider import KimiK25VLModelProvider

    vc = overrides.pop("vision_config", None) or vision_config()
    path = overrides.pop("hf_model_path", None) or f"{OFFLINE_PATH_PREFIX}{next(_counter)}"
    if _is_offline(path):
        _OFFLINE_VISION_CONFIGS[path] = vc
    provider = KimiK25VLModelProvider(
        # MLA has one key/value head per query head: no query groups (megatron-core's local attention would
        # otherwise repeat MLA's keys and values as for grouped-query attention and fail in forward).
        **{**TINY_LM, "num_query_groups": TINY_LM["num_attention_heads"]},
        **TINY_MLA,
        **TINY_MOE,
        transformer_layer_spec=local_block_spec,
        normalization="RMSNorm",
        gated_linear_unit=True,
        add_bias_linear=False,
        share_embeddings_and_output_weights=False,
        qk_layernorm=True,
        multi_latent_attention=True,
        position_embedding_type="rope",
        rope_type="rope",
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_token_dispatcher_type="allgather",
        moe_router_pre_softmax=True,
        moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True,
        moe_router_load_balancing_type="seq_aux_loss",
        moe_aux_loss_coeff=1e-3,
        vision_config=vc,
        hf_model_path=path,
        **_trust_remote_code(KimiK25VLModelProvider),
        image_token_id=MEDIA_PLACEHOLDER_TOKEN_ID,
        media_placeholder_token_id=MEDIA_PLACEHOLDER_TOKEN_ID,
        pad_token_id=PAD_TOKEN_ID,
    )
    return finalized(provider, **overrides)


def _trust_remote_code(provider_class: type) -> dict[str, bool]:
    """``trust_remote_code=True`` where the provider has the field (0.6.2 refuses remote code without it); nothing
    where it does not (0.6.0's model always loads the repository's code, which the harness answers offline)."""
    fields = getattr(provider_class, "__dataclass_fields__", {})
    return {"trust_remote_code": True} if "trust_remote_code" in fields else {}


def train_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One 8x8-patch image per row, pre-expanded: 16 placeholders (one per merged 2x2 group).

    ``pixel_values`` is ``[patches, 3, P, P]`` (what MoonViT's patch embedding takes), ``image_grid_thw`` in patches.
    """
    grid = spec.image_grid_thw
    kh, kw = provider.vision_config.merge_kernel_size
    batch = image_rows(provider, spec, batch_size, gen, grid[1] * grid[2] // (kh * kw))
    patch = provider.vision_config.patch_size
    n = batch_size * grid[0] * grid[1] * grid[2]
    batch["pixel_values"] = torch.randn(n, 3, patch, patch, generator=gen, dtype=provider.params_dtype)
    batch["image_grid_thw"] = torch.tensor([grid] * batch_size, dtype=torch.long)
    return batch


TRAIN_SPECS = {
    "kimi_k25_vl": TrainSpec(
        token_ids={"bos_token_id": 1, "eos_token_id": 2, "image_token_id": MEDIA_PLACEHOLDER_TOKEN_ID},
        projection_prefixes=("mm_projector.",),
        make_batch=train_batch,
    ),
}


def hf_checkpoint_config() -> Any:
    """The tiny checkpoint's ``KimiK25Config`` (``AutoConfig`` knows it inside :func:`_registered`): the tiny
    provider's sizes in DeepSeek-V3's names (first layer dense, second MoE with one shared expert)."""
    from bridge_freeze_harness._hf_configs import TEXT, TEXT_IDS
    from bridge_freeze_harness.tiny._kimi_hf import KimiK25Config

    text = {**TEXT, **TEXT_IDS, "num_key_value_heads": TINY_LM["num_attention_heads"],
            "q_lora_rank": TINY_MLA["q_lora_rank"], "kv_lora_rank": TINY_MLA["kv_lora_rank"],
            "qk_nope_head_dim": TINY_MLA["qk_head_dim"], "qk_rope_head_dim": TINY_MLA["qk_pos_emb_head_dim"],
            "v_head_dim": TINY_MLA["v_head_dim"], "n_routed_experts": TINY_MOE["num_moe_experts"],
            "num_experts_per_tok": TINY_MOE["moe_router_topk"],
            "moe_intermediate_size": TINY_MOE["moe_ffn_hidden_size"],
            "n_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}
    return KimiK25Config(text_config=text, vision_config=vision_config(), pad_token_id=PAD_TOKEN_ID,
                         media_placeholder_token_id=MEDIA_PLACEHOLDER_TOKEN_ID, tie_word_embeddings=False)


def hf_cpu_fields(provider: Any) -> dict[str, Any]:
    """The converted provider on the CPU: the checkpoint's folder answered offline (its remote-code look-ups get
    the stand-ins, :func:`register_offline_model`, which is why the model may be told to trust it), local layers
    (their core attention sizes heads by ``kv_channels``: MLA's value head size, as in :func:`make_provider`)."""
    register_offline_model(provider.hf_model_path, provider.vision_config)
    return {"trust_remote_code": True, "transformer_layer_spec": local_block_spec, "kv_channels": provider.v_head_dim,
            "seq_length": TINY_LM["seq_length"], "make_vocab_size_divisible_by": 128}


def _registered() -> Any:
    from bridge_freeze_harness.tiny._kimi_hf import registered_config

    return registered_config()


def _int4_experts(directory: Any) -> None:
    from bridge_freeze_harness.tiny._kimi_hf import store_experts_int4

    store_experts_int4(directory)


#: the tiny HF checkpoint recipe (collected by :data:`bridge_freeze_harness.hf_checkpoint.HF_FAMILIES`): the HF
#: classes are the harness's stand-ins for the hub's remote code, the routed experts stored INT4 as published.
HF_CHECKPOINTS = {
    "kimi_k25_vl": HFFamily("KimiK25ForConditionalGeneration", hf_checkpoint_config, hf_cpu_fields,
                            model_module="bridge_freeze_harness.tiny._kimi_hf", load_patches=_registered,
                            stored_as=_int4_experts),
}
