"""Activation memory of one micro-batch on one rank: the published per-layer formula, generalised.

Pure arithmetic (no torch). The formula is Korthikanti et al., "Reducing Activation Recomputation in Large
Transformer Models" (arXiv 2205.05198), Table 2, the one Megatron-LM's ``theoretical_memory_usage.py`` uses:
per transformer layer and 16-bit activations, ``s*b*h*(18 + 4*ffn/h)`` bytes with tensor + sequence
parallelism (divided by the tensor-parallel size ``t``), the attention scores not stored (flash attention, or
selective recompute). Term by term, for ``T = s*b`` tokens, element size ``e`` (2 for bf16):

- the two layer-norm inputs ``2*e*T*h``, the QKV input ``e*T*h``, the MLP input ``e*T*h`` and, with dropout, the
  two 1-byte dropout masks ``2*T*h`` (these are split over ``t`` only with sequence parallelism);
- Q ``e*T*h``, K and V ``e*T*g*d`` each (``g`` query groups of head size ``d``; ``g*d = h`` without grouped
  query attention), the output-projection input ``e*T*h``, the activation input ``e*T*f*k`` (``k`` = 2 for a
  gated MLP such as SwiGLU, else 1) and the second MLP linear's input ``e*T*f`` (split over ``t``).

With ``e = 2``, ``g*d = h``, ``k = 1`` and dropout this is exactly ``T*h*(18 + 4*f/h)``. What the paper and
Megatron-LM leave out is generalised here and stated: grouped-query attention, gated MLPs, no dropout masks
when the dropouts are 0 (Bridge's VLM defaults), and MoE layers (each token goes through ``topk`` experts of
width ``moe_ffn`` plus the shared expert: ``f = topk * moe_ffn + shared``, the dispatched copies
``e*T*topk*h`` counted as MLP inputs, the fp32 router logits ``4*T*E``; tokens assumed spread evenly over the
experts). The vision encoder's layers are counted with the same formula over its patches; a vision tower
built from Hugging Face modules is not split over tensor-parallel ranks.

Around the layers (Megatron-LM's terms): the first stage holds the token ids ``8*T`` and, with dropout, the
embedding-dropout mask ``T*h``; the last stage the output layer's input and the logits for the loss,
``4*T*h*(1 + V/h)``; both divided by ``t`` like the layers. Recompute: ``none`` and ``selective`` store the
above (selective recompute of the core attention changes nothing once the scores are not stored);
``full`` (uniform, one layer per checkpoint) stores each layer's input ``e*T*h`` and, during the backward,
one layer's full activations. Not counted: the rotary tables, attention softmax statistics (``4*T*heads``
bytes per layer), temporary buffers of the kernels and the allocator's fragmentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Recompute settings the estimate knows (Megatron's ``recompute_granularity``; ``none`` = off).
RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Stack:
    """One transformer stack's per-layer sizes, as the formula needs them."""

    hidden: int
    ffn: int
    heads: int
    query_groups: int
    head_dim: int
    gated: bool = False
    dropout: bool = False
    #: MoE: routed experts, tokens per expert choice, expert width, shared-expert width (0: dense layers only)
    experts: int = 0
    topk: int = 0
    moe_ffn: int = 0
    shared_ffn: int = 0
    #: the tensor-parallel split of this stack (1: replicated on every rank, e.g. a Hugging Face vision tower)
    tp: int = 1
    sequence_parallel: bool = False

    def layer_bytes(self, tokens: int, elem: int, *, moe: bool = False) -> float:
        """One layer's stored activations for ``tokens`` tokens (``moe``: an MoE layer of this stack)."""
        t, h = self.tp, self.hidden
        kv = self.query_groups * self.head_dim
        mult = 2 if self.gated else 1
        routed = self.topk if moe else 0
        width = (self.topk * self.moe_ffn + self.shared_ffn) if moe else self.ffn
        masks = 2 * tokens * h if self.dropout else 0
        # norms (2), QKV input, MLP input(s: one per routed copy, plus the shared expert's / dense MLP's)
        inputs = elem * tokens * h * (3 + max(routed, 1)) + masks
        router = 4 * tokens * self.experts if moe else 0
        split = elem * tokens * (2 * h + 2 * kv) + elem * tokens * width * (mult + 1)
        return (inputs + router) / (t if self.sequence_parallel else 1) + split / t

    def input_bytes(self, tokens: int, elem: int) -> float:
        """A layer's input (what full recompute keeps per layer)."""
        return elem * tokens * self.hidden / (self.tp if self.sequence_parallel else 1)


@dataclass(frozen=True)
class StageLayers:
    """What one rank holds of the model, for the estimate."""

    dense_layers: int = 0
    moe_layers: int = 0
    vision_layers: int = 0
    first_stage: bool = False
    last_stage: bool = False


@dataclass(frozen=True)
class ActivationModel:
    """The sizes the estimate needs: the language stack, the vision stack and the vocabulary."""

    language: Stack
    vocab: int
    vision: Stack | None = None
    #: full recompute is turned off in the vision encoder (the plugin's fix, see prewrap/_recompute.py)
    vision_recompute_off: bool = False
    notes: tuple[str, ...] = field(default=())


def micro_batch_bytes(
    model: ActivationModel,
    layers: StageLayers,
    *,
    seq_length: int,
    micro_batch_size: int,
    vision_tokens: int,
    recompute: str,
    elem: int = 2,
) -> int:
    """Stored activations of one micro-batch on a rank holding ``layers`` (see the module docstring)."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    lm = model.language
    tokens = seq_length * micro_batch_size
    full = recompute == "full"
    total = 0.0
    peaks = [0.0]
    for count, moe in ((layers.dense_layers, False), (layers.moe_layers, True)):
        if not count:
            continue
        one = lm.layer_bytes(tokens, elem, moe=moe)
        total += count * (lm.input_bytes(tokens, elem) if full else one)
        peaks.append(one)
    if model.vision is not None and layers.vision_layers and vision_tokens:
        vt = vision_tokens * micro_batch_size
        one = model.vision.layer_bytes(vt, elem)
        vision_full = full and not model.vision_recompute_off
        total += layers.vision_layers * (model.vision.input_bytes(vt, elem) if vision_full else one)
        peaks.append(one if vision_full else 0.0)
    if full:
        total += max(peaks)  # one layer recomputed at a time during the backward
    split = lm.tp if lm.sequence_parallel else 1
    if layers.first_stage:
        total += (8 * tokens + (tokens * lm.hidden if lm.dropout else 0)) / split
    if layers.last_stage:
        total += 4 * tokens * lm.hidden * (1 + model.vocab / lm.hidden) / split
    return round(total)


def in_flight_micro_batches(pp: int, pp_rank: int, vp: int | None) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak (1F1B; interleaved: Megatron-LM's
    penalty ``1 + (pp - 1) / (pp * vp)``), assuming at least ``pp`` micro-batches per step."""
    held = float(pp - pp_rank)
    if vp:
        held *= 1 + (pp - 1) / (pp * vp)
    return held


def _get(obj: Any, *names: str, default: Any = None) -> Any:
    for name in names:
        value = getattr(obj, name, None)
        if value is not None:
            return value
    return default


def language_stack(provider: Any, *, tp: int, sequence_parallel: bool) -> Stack:
    """The language model's :class:`Stack` from a Megatron provider (a ``TransformerConfig``)."""
    hidden = int(provider.hidden_size)
    heads = int(provider.num_attention_heads)
    if getattr(provider, "multi_latent_attention", False):
        head_dim = int(_get(provider, "qk_head_dim", default=hidden // heads)) + int(
            _get(provider, "qk_pos_emb_head_dim", default=0))
        groups = heads
    else:
        head_dim = int(_get(provider, "kv_channels", default=hidden // heads))
        groups = int(_get(provider, "num_query_groups", default=heads))
    experts = int(getattr(provider, "num_moe_experts", None) or 0)
    return Stack(
        hidden=hidden,
        ffn=int(provider.ffn_hidden_size),
        heads=heads,
        query_groups=groups,
        head_dim=head_dim,
        gated=bool(getattr(provider, "gated_linear_unit", False)),
        dropout=bool(getattr(provider, "hidden_dropout", 0.0) or getattr(provider, "attention_dropout", 0.0)),
        experts=experts,
        topk=int(getattr(provider, "moe_router_topk", 0) or 0) if experts else 0,
        moe_ffn=int(getattr(provider, "moe_ffn_hidden_size", None) or 0) if experts else 0,
        shared_ffn=int(getattr(provider, "moe_shared_expert_intermediate_size", None) or 0) if experts else 0,
        tp=tp,
        sequence_parallel=sequence_parallel,
    )


def vision_stack(vision_config: Any, *, tp: int, sequence_parallel: bool) -> Stack | None:
    """The vision encoder's :class:`Stack` from a provider's vision config (HF or Megatron), if it has sizes."""
    if vision_config is None:
        return None
    hidden = _get(vision_config, "hidden_size", "vt_hidden_size", "width")
    ffn = _get(vision_config, "intermediate_size", "ffn_hidden_size", "vt_intermediate_size")
    heads = _get(vision_config, "num_heads", "num_attention_heads", "vt_num_attention_heads", "heads")
    if not (isinstance(hidden, int) and isinstance(heads, int) and heads):
        return None
    if not isinstance(ffn, int):
        ratio = _get(vision_config, "mlp_ratio", default=4.0)
        ffn = int(hidden * ratio)
    gated = _get(vision_config, "hidden_act", "activation_func", default="") in ("silu", "swiglu")
    return Stack(hidden=hidden, ffn=ffn, heads=heads, query_groups=heads, head_dim=hidden // heads, gated=bool(gated),
                 tp=tp, sequence_parallel=sequence_parallel)


def vision_depth(vision_config: Any) -> int:
    value = _get(vision_config, "depth", "num_hidden_layers", "num_layers", "vt_num_hidden_layers", "layers",
                 default=0)
    return int(value) if isinstance(value, int) else 0
