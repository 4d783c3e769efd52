"""Structural stand-ins: plain PyTorch modules with a real Bridge model's parameter names and shapes.

For fast unit tests that need no Megatron at all (``import torch`` only). The names are exactly those of
the real tiny Bridge ``Qwen3VLModel`` built by ``tiny.qwen3_vl`` (a test checks that), so the plugin
classifies a stand-in exactly as it classifies the real model. Numerics are not a model's: the
``toy_loss`` touches every parameter so that an optimizer step moves each trainable one.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


class _Node(nn.Module):
    """A module holding parameters and child modules created from dotted names."""


def module_tree(shapes: Iterable[tuple[str, tuple[int, ...]]]) -> nn.Module:
    """A module tree whose ``named_parameters()`` are exactly ``shapes`` (name -> shape), in order."""
    root = _Node()
    for name, shape in shapes:
        *path, leaf = name.split(".")
        node: nn.Module = root
        for part in path:
            child = node._modules.get(part)
            if child is None:
                child = _Node()
                node.add_module(part, child)
            node = child
        node.register_parameter(leaf, nn.Parameter(torch.randn(*shape) * 0.02))
    return root


def _linear(prefix: str, out_features: int, in_features: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}.weight", (out_features, in_features)), (f"{prefix}.bias", (out_features,))]


def _norm(prefix: str, size: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}.weight", (size,)), (f"{prefix}.bias", (size,))]


def qwen3_vl_shapes(
    hidden: int = 64, ffn: int = 128, vision_layers: int = 2, lm_layers: int = 2, deepstack: int = 2,
    vocab: int = 128, kv_channels: int = 16, query_groups: int = 2, heads: int = 4, merge: int = 2,
) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the tiny Bridge Qwen3-VL (``bridge_freeze_harness.tiny.qwen3_vl``)."""
    merged = hidden * merge * merge
    shapes: list[tuple[str, tuple[int, ...]]] = [
        *_linear_conv("vision_model.patch_embed.proj", hidden),
        ("vision_model.pos_embed.weight", (64, hidden)),
    ]
    for i in range(vision_layers):
        layer = f"vision_model.decoder.layers.{i}"
        shapes += _norm(f"{layer}.input_layernorm", hidden)
        shapes += _linear(f"{layer}.self_attention.linear_proj", hidden, hidden)
        shapes += _linear(f"{layer}.self_attention.linear_qkv", 3 * hidden, hidden)
        shapes += _norm(f"{layer}.pre_mlp_layernorm", hidden)
        shapes += _linear(f"{layer}.mlp.linear_fc1", ffn, hidden)
        shapes += _linear(f"{layer}.mlp.linear_fc2", hidden, ffn)
    for i in range(deepstack):
        merger = f"vision_model.decoder.deepstack_merger_list.{i}"
        shapes += _norm(f"{merger}.patch_norm", merged)
        shapes += _linear(f"{merger}.linear_fc1", merged, merged)
        shapes += _linear(f"{merger}.linear_fc2", hidden, merged)
    shapes += _norm("vision_model.merger.patch_norm", hidden)
    shapes += _linear("vision_model.merger.linear_fc1", merged, merged)
    shapes += _linear("vision_model.merger.linear_fc2", hidden, merged)
    shapes.append(("language_model.embedding.word_embeddings.weight", (vocab, hidden)))
    qkv = (heads + 2 * query_groups) * kv_channels
    for i in range(lm_layers):
        layer = f"language_model.decoder.layers.{i}"
        shapes += _norm(f"{layer}.input_layernorm", hidden)
        shapes += _linear(f"{layer}.self_attention.linear_proj", hidden, heads * kv_channels)
        shapes += _linear(f"{layer}.self_attention.linear_qkv", qkv, hidden)
        shapes += _norm(f"{layer}.self_attention.q_layernorm", kv_channels)
        shapes += _norm(f"{layer}.self_attention.k_layernorm", kv_channels)
        shapes += _norm(f"{layer}.pre_mlp_layernorm", hidden)
        shapes += _linear(f"{layer}.mlp.linear_fc1", ffn, hidden)
        shapes += _linear(f"{layer}.mlp.linear_fc2", hidden, ffn)
    shapes += _norm("language_model.decoder.final_layernorm", hidden)
    return shapes


def _linear_conv(prefix: str, hidden: int) -> list[tuple[str, tuple[int, ...]]]:
    return [(f"{prefix}.weight", (hidden, 3, 2, 4, 4)), (f"{prefix}.bias", (hidden,))]


class Qwen3VLModelShaped(nn.Module):
    """A ``Qwen3VLModel``-shaped stand-in: ``vision_model`` (with ``merger`` and the DeepStack mergers
    inside it) and ``language_model``, with the real tiny model's parameter names and shapes."""

    def __init__(self, **sizes: int) -> None:
        super().__init__()
        tree = module_tree(qwen3_vl_shapes(**sizes))
        for name, child in tree.named_children():
            self.add_module(name, child)

    def toy_loss(self) -> torch.Tensor:
        """A scalar that depends on every parameter (so every trainable one gets a gradient)."""
        return sum((p.float() ** 2).mean() for p in self.parameters())  # type: ignore[return-value]
