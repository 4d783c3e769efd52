"""Nemotron-VL (Nano V2 VL): real ``NemotronVLModelProvider`` / ``NemotronVLModel``.

``provide()`` builds a real megatron-core ``LLaVAModel`` (``llava_model``) whose language model is
a real hybrid ``HybridModel`` (Mamba + attention + MLP layers), whose vision model is a real
``RADIOViTModel`` and whose projection is a real ``MultimodalProjector``, and wraps it in Bridge's
``NemotronVLModel``. Everything around ``provide()`` is Bridge's own code.

CPU patches, active only while building: points 1-3 are :func:`cpu_patches` (any build of the family),
point 4 is :func:`tiny_patches` (the tiny configuration only).

1. Language spec: the provider hands megatron-core's ``hybrid_stack_spec`` (TransformerEngine
   classes, fixed at import) to ``LLaVAModel``. It sees a copy of that spec with the same layout
   in which each TE class is swapped for a local one: ``TELayerNormColumnParallelLinear`` ->
   ``LayerNormColumnParallelLinear`` (from :mod:`bridge_freeze_harness.local_layers`: a ``ColumnParallelLinear`` with
   the fused norm's ``layer_norm_weight`` / ``layer_norm_bias``, so parameter names are TE's),
   ``TERowParallelLinear`` / ``TEColumnParallelLinear`` -> ``RowParallelLinear`` /
   ``ColumnParallelLinear``, ``TEDotProductAttention`` -> ``DotProductAttention``, ``TENorm`` ->
   ``WrappedTorchNorm``. The vision projection's MLP spec is cloned from that spec by the
   provider, so it gets the same local classes.
2. ``HybridStack.final_norm`` is built from ``TENorm`` named inside ``hybrid_block``: swapped for
   ``WrappedTorchNorm`` (same ``final_norm.weight`` name).
3. Mamba: ``MambaMixer.__init__`` refuses to run without the ``mamba-ssm`` package (not
   installable here: CUDA-only wheels) and builds its gated RMSNorm from it. While building,
   ``mamba_mixer.HAVE_MAMBA_SSM`` reads True and its gated norm is ``local_layers.GatedRMSNorm``
   (same ``norm.weight`` parameter). The rest of ``MambaMixer`` (``in_proj``, ``conv1d_weight``,
   ``conv1d_bias``, ``dt_bias``, ``A_log``, ``D``, ``out_proj``) is the real constructor's.
   A Mamba layer's forward / backward runs on the CPU under :func:`forward_patches` (applied by
   ``train.forward_patches(name)``): megatron-core's training kernel becomes the harness's pure-PyTorch
   SSD scan (:mod:`bridge_freeze_harness._mamba_cpu`). A pattern without ``M``
   (``make_provider(hybrid_layer_pattern=FORWARD_PATTERN)``) builds a model without Mamba layers.
4. Sizes: the provider hard-codes the vision tower (32 layers, hidden 1280) and the projection
   FFN (20480) inside ``provide()``: about 700M parameters. ``LLaVAModel`` as named in the
   provider module is a thin function that shrinks those two configs (2 layers, hidden 64,
   FFN 128) and then calls the real ``LLaVAModel``.

5. Environment: building a megatron-core language model writes its attention backend into
   ``NVTE_FLASH_ATTN`` / ``NVTE_FUSED_ATTN`` / ``NVTE_UNFUSED_ATTN`` and asserts that values already
   there agree. This provider's backend is ``flash`` (Hybrid default); most other families' is
   ``auto``. ``local_specs.cpu_build_patches`` clears them while building and restores them
   afterwards, so building this family and another one in the same process works in either order.

Layer implementations are megatron-core's local ones; module names and tree are the real ones.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Iterator
from typing import Any

import torch

from bridge_freeze_harness._bridge_steps import LLAVA_STEP
from bridge_freeze_harness.batches import TrainSpec, next_token_targets, random_text, token_row
from bridge_freeze_harness.patching import patched
from bridge_freeze_harness.tiny._common import TINY_LM, finalized

REAL = True
#: One Mamba, one MLP, one attention, one MLP layer: every layer kind of Nano V2's pattern.
TINY_PATTERN = "M-*-"

#: No Mamba layer: pass as ``hybrid_layer_pattern`` where a test needs a CPU forward of the LM.
FORWARD_PATTERN = "*-"

#: Mamba sizes: 4 heads x 16 = d_inner 64, 2 groups, state 16.
TINY_MAMBA: dict[str, Any] = {
    "mamba_num_heads": 4,
    "mamba_head_dim": 16,
    "mamba_num_groups": 2,
    "mamba_state_dim": 16,
}

#: Vision tower / projection sizes forced onto the configs ``provide()`` hard-codes.
TINY_VISION: dict[str, Any] = {
    "num_layers": 2,
    "hidden_size": 64,
    "ffn_hidden_size": 128,
    "num_attention_heads": 4,
    "num_query_groups": 4,
    "kv_channels": 16,
}
TINY_PROJECTION_FFN = 128



def _local_classes() -> list[tuple[Any, type]]:
    """(TE name as megatron-core holds it, local replacement). Without TE those names are mocks, not classes."""
    from megatron.core.extensions import transformer_engine as te_ext
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from bridge_freeze_harness.local_layers import LayerNormColumnParallelLinear

    return [
        (te_ext.TELayerNormColumnParallelLinear, LayerNormColumnParallelLinear),
        (te_ext.TEColumnParallelLinear, ColumnParallelLinear),
        (te_ext.TERowParallelLinear, RowParallelLinear),
        (te_ext.TEDotProductAttention, DotProductAttention),
        (te_ext.TENorm, WrappedTorchNorm),
    ]


def _swap_classes(obj: Any, table: list[tuple[Any, type]]) -> Any:
    """A copy of a spec tree (ModuleSpec / submodule dataclasses / partials) with TE names swapped."""
    for original, replacement in table:
        if obj is original:
            return replacement
    if isinstance(obj, type):
        return obj
    if isinstance(obj, functools.partial):
        args = [_swap_classes(a, table) for a in obj.args]
        keywords = {k: _swap_classes(v, table) for k, v in obj.keywords.items()}
        return functools.partial(obj.func, *args, **keywords)
    if dataclasses.is_dataclass(obj):
        fields = [f.name for f in dataclasses.fields(obj) if f.init]
        return dataclasses.replace(obj, **{name: _swap_classes(getattr(obj, name), table) for name in fields})
    if isinstance(obj, (list, tuple)):
        return type(obj)(_swap_classes(item, table) for item in obj)
    if isinstance(obj, dict):
        return {k: _swap_classes(v, table) for k, v in obj.items()}
    return obj


@functools.cache
def local_hybrid_stack_spec() -> Any:
    """megatron-core's ``hybrid_stack_spec`` with every TE class replaced by a local one."""
    from megatron.core.models.hybrid.hybrid_layer_specs import hybrid_stack_spec

    return _swap_classes(hybrid_stack_spec, _local_classes())


def _shrink(config: Any, **sizes: Any) -> Any:
    for name, value in sizes.items():
        setattr(config, name, value)
    return config


def tiny_llava(**kwargs: Any) -> Any:
    """Shrink the vision and projection configs ``provide()`` hard-codes, then build the real LLaVAModel."""
    from megatron.core.models.multimodal.llava_model import LLaVAModel

    _shrink(kwargs["vision_transformer_config"], **TINY_VISION)
    _shrink(kwargs["vision_projection_config"], ffn_hidden_size=TINY_PROJECTION_FFN)
    return LLaVAModel(**kwargs)


def make_provider(**overrides: Any) -> Any:
    from megatron.bridge.models.nemotron_vl.nemotron_vl_provider import NemotronVLModelProvider

    lm = {k: v for k, v in TINY_LM.items() if k != "num_layers"}  # finalize() derives it from the pattern
    provider = NemotronVLModelProvider(
        **lm,
        **TINY_MAMBA,
        hybrid_layer_pattern=TINY_PATTERN,
        first_last_layers_bf16=False,
        moe_grouped_gemm=False,
        moe_permute_fusion=False,
        moe_shared_expert_overlap=False,
    )
    return finalized(provider, **overrides)


#: The names a provider module gives megatron-core's hybrid stack spec: Bridge 0.6.0 (SkyRL's pin, in the lane)
#: imports it as ``mamba_stack_spec`` (megatron-core 0.18's alias of ``hybrid_stack_spec``).
STACK_SPEC_NAMES = ("hybrid_stack_spec", "mamba_stack_spec")


def hybrid_build_patches(provider_module: Any) -> list[tuple[Any, str, Any]]:
    """Points 1-3 for a provider module that names the hybrid stack spec (Nemotron-VL's, Nemotron Omni's)."""
    from megatron.core.models.hybrid import hybrid_block
    from megatron.core.ssm import mamba_mixer
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from bridge_freeze_harness.local_layers import GatedRMSNorm

    names = [name for name in STACK_SPEC_NAMES if hasattr(provider_module, name)]
    if not names:
        raise AttributeError(f"{provider_module.__name__} names none of {STACK_SPEC_NAMES}: the harness cannot give "
                             f"it the local hybrid stack spec")
    return [
        *((provider_module, name, local_hybrid_stack_spec()) for name in names),
        (hybrid_block, "TENorm", WrappedTorchNorm),
        (mamba_mixer, "HAVE_MAMBA_SSM", True),
        (mamba_mixer, "ExtendedRMSNorm", GatedRMSNorm),
    ]


@contextlib.contextmanager
def cpu_patches() -> Iterator[None]:
    """Any Nemotron-VL build: local hybrid spec and final norm, a buildable Mamba mixer (points 1-3 above)."""
    from megatron.bridge.models.nemotron_vl import nemotron_vl_provider

    with patched(hybrid_build_patches(nemotron_vl_provider)):
        yield


@contextlib.contextmanager
def tiny_patches() -> Iterator[None]:
    """The tiny configuration only: the vision tower and projection sizes ``provide()`` hard-codes (point 4)."""
    from megatron.bridge.models.nemotron_vl import nemotron_vl_provider

    with patched([(nemotron_vl_provider, "LLaVAModel", tiny_llava)]):
        yield


@contextlib.contextmanager
def forward_patches() -> Iterator[None]:
    """A forward / backward of a Mamba layer: megatron-core's training kernel (mamba-ssm's
    ``mamba_split_conv1d_scan_combined``, CUDA-only) -> the harness's pure-PyTorch reference
    (:mod:`bridge_freeze_harness._mamba_cpu`)."""
    from bridge_freeze_harness._mamba_cpu import mamba_forward_patches

    with patched(mamba_forward_patches()):
        yield


#: why no HF checkpoint of it can be written here (collected by
#: :data:`bridge_freeze_harness.hf_checkpoint.NO_HF_CHECKPOINT`).
NO_HF_CHECKPOINT = {
    "nemotron_vl": (
        "its HF model (NemotronH_Nano_VL_V2, model_type nemotron_vl) is remote code on the hub, not in "
        "transformers 5.12.1 (AutoConfig: 'Unrecognized model identifier: nemotron_vl'), so no checkpoint can be "
        "written, converted or loaded back here"
    ),
}
#: The image token id and tile size ``provide()`` hard-codes (131072, above the tiny vocabulary: LLaVA puts the
#: image's embeddings in its place before any embedding lookup; ``img_h = img_w = 512``).
IMAGE_TOKEN = 131072
IMAGE_SIZE = 512
_BOS, _EOS = 1, 2


def llava_batch(provider: Any, spec: TrainSpec, batch_size: int, gen: torch.Generator) -> dict[str, Any]:
    """``model(**batch)`` keywords, and what Bridge's llava_step reads (``_bridge_steps.LLAVA_STEP``): per row
    ``bos text <image> text eos`` and one 512x512 tile (``images`` [b, 3, 512, 512], ``num_image_tiles`` one per
    image). No loss where the next token is the image or the end; the labels there are 0 (the image token is
    outside the vocabulary). ``position_ids`` / ``attention_mask`` are ``None``: the hybrid language model builds
    its positions and causal mask."""
    high = int(provider.vocab_size)
    rows = [token_row([_BOS, random_text(gen, spec.text_before, 3, high), IMAGE_TOKEN,
                       random_text(gen, spec.text_after, 3, high), _EOS]) for _ in range(batch_size)]
    input_ids = torch.stack(rows)
    labels, loss_mask = next_token_targets(input_ids, _EOS, [IMAGE_TOKEN])
    labels[loss_mask == 0] = 0
    return {"images": torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=gen, dtype=provider.params_dtype),
            "num_image_tiles": torch.ones(batch_size, dtype=torch.int), "input_ids": input_ids,
            "position_ids": None, "attention_mask": None, "labels": labels, "loss_mask": loss_mask}


def llava_loss(output: Any, batch: Any) -> torch.Tensor:
    """LLaVA returns ``(per-token loss, loss mask)`` over the sequence with the image's embeddings in place of its
    token (longer than the batch's): the mean over that mask."""
    per_token, mask = output
    return (per_token * mask).sum() / mask.sum().clamp_min(1.0)


#: Trains through Bridge's llava_step (``_bridge_steps.LLAVA_STEP``): one 512x512 tile per row (:func:`llava_batch`).
#: ``seq_length``: LLaVA cuts the sequence, the tile's 256 embeddings in place of its token, to it (the tiny 64 would
#: drop every token after the image, and with them every gradient of the vision side).
TRAIN_SPECS = {"nemotron_vl": TrainSpec(projection_prefixes=("llava_model.vision_projection.",),
                                        cpu_overrides={"cross_entropy_loss_fusion": False, "seq_length": 288},
                                        make_batch=llava_batch, loss=llava_loss)}

#: Bridge's LLaVA step trains it (:data:`bridge_freeze_harness._bridge_steps.LLAVA_STEP`: images as tiles and
#: ``num_image_tiles``).
FORWARD_STEPS = {"nemotron_vl": LLAVA_STEP}
