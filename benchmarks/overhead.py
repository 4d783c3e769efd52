"""Figure 1: plugin overhead. Classify, freeze and report a model of 1k / 10k / 100k parameter tensors.

The model is synthetic, on the meta device (no memory), with Qwen3-VL's module layout: a Megatron
language model whose layers hold MoE experts (what makes real models reach 10k+ tensors), a vision
encoder, and the vision projection both beside (``vision_model.merger``) and inside
(``vision_model.decoder.deepstack_merger_list``) the encoder. The plugin is timed through
:func:`bridge_freeze_plugin.freeze.apply_selection` with the registered ``qwen3_vl`` family, plus
formatting the report; the floor is one plain loop that sets ``requires_grad`` from hard-coded prefixes.
Both freeze the vision encoder and train the rest (the projection inside the encoder must stay trainable).
"""

from __future__ import annotations

from typing import Any

from benchmarks._timing import compare

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (1_000, 10_000)
TARGET_RATIO = 2.0

_ATTENTION = (
    "input_layernorm.weight",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_proj.weight",
    "self_attention.q_layernorm.weight",
    "self_attention.k_layernorm.weight",
    "pre_mlp_layernorm.weight",
    "mlp.router.weight",
)
_VISION_LAYER = (
    "input_layernorm.weight",
    "input_layernorm.bias",
    "self_attention.linear_qkv.weight",
    "self_attention.linear_qkv.bias",
    "self_attention.linear_proj.weight",
    "self_attention.linear_proj.bias",
    "pre_mlp_layernorm.weight",
    "pre_mlp_layernorm.bias",
    "mlp.linear_fc1.weight",
    "mlp.linear_fc1.bias",
    "mlp.linear_fc2.weight",
    "mlp.linear_fc2.bias",
)
_MERGER = (
    "patch_norm.weight",
    "patch_norm.bias",
    "linear_fc1.weight",
    "linear_fc1.bias",
    "linear_fc2.weight",
    "linear_fc2.bias",
)
EXPERTS_PER_LAYER = 32  # 64 tensors (fc1, fc2 per expert)
_PROJECTION_PREFIXES = ("vision_model.merger.", "vision_model.decoder.deepstack_merger_list.")


def parameter_names(n_tensors: int) -> list[str]:
    """About ``n_tensors`` names: ~15% vision encoder, 24 projection tensors, the rest language model."""
    names = ["vision_model.patch_embed.proj.weight", "vision_model.patch_embed.proj.bias"]
    names.append("vision_model.pos_embed.weight")
    for i in range(max(1, round(0.15 * n_tensors / len(_VISION_LAYER)))):
        names += [f"vision_model.decoder.layers.{i}.{p}" for p in _VISION_LAYER]
    for i in range(3):
        names += [f"vision_model.decoder.deepstack_merger_list.{i}.{p}" for p in _MERGER]
    names += [f"vision_model.merger.{p}" for p in _MERGER]
    names += ["language_model.embedding.word_embeddings.weight", "language_model.decoder.final_layernorm.weight"]
    names.append("language_model.output_layer.weight")
    per_layer = len(_ATTENTION) + 2 * EXPERTS_PER_LAYER
    layer = 0
    while len(names) + per_layer <= n_tensors or layer == 0:
        prefix = f"language_model.decoder.layers.{layer}"
        names += [f"{prefix}.{p}" for p in _ATTENTION]
        for e in range(EXPERTS_PER_LAYER):
            names += [f"{prefix}.mlp.experts.local_experts.{e}.linear_fc1.weight"]
            names += [f"{prefix}.mlp.experts.local_experts.{e}.linear_fc2.weight"]
        layer += 1
    while len(names) < n_tensors:  # top up with expert tensors of one extra layer
        e, which = divmod(len(names), 2)
        names.append(f"language_model.decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc{which + 1}.weight")
    return names


def build_meta_model(n_tensors: int) -> Any:
    """An ``nn.Module`` tree on the meta device with the names of :func:`parameter_names`."""
    import torch
    from torch import nn

    root = nn.Module()
    modules: dict[str, nn.Module] = {"": root}

    def module(path: str) -> nn.Module:
        found = modules.get(path)
        if found is None:
            parent, _, leaf = path.rpartition(".")
            found = nn.Module()
            module(parent).add_module(leaf, found)
            modules[path] = found
        return found

    with torch.device("meta"):
        for name in parameter_names(n_tensors):
            path, _, leaf = name.rpartition(".")
            module(path).register_parameter(leaf, nn.Parameter(torch.empty(256, 256)))
    return root


def floor_loop(model: Any) -> None:
    """The least any freeze can do: one pass, hard-coded prefixes, set ``requires_grad``."""
    for name, param in model.named_parameters():
        param.requires_grad_(not name.startswith("vision_model.") or name.startswith(_PROJECTION_PREFIXES))


def run(quick: bool = False) -> dict[str, Any]:
    from bridge_freeze_plugin import apply_selection
    from bridge_freeze_plugin.registry import get_family
    from bridge_freeze_plugin.request import FreezeSelection

    family = get_family("qwen3_vl")
    selection = FreezeSelection(freeze_vision_model=True)
    sizes = QUICK_SIZES if quick else SIZES
    rows: dict[str, Any] = {}
    for n in sizes:
        model = build_meta_model(n)
        n_actual = sum(1 for _ in model.parameters())

        def plugin(model: Any = model) -> None:
            apply_selection(model, family, selection, provider_name="Qwen3VLModelProvider").format()

        # Same outcome (checked): the comparison is between equal work.
        floor_loop(model)
        expected = [p.requires_grad for p in model.parameters()]
        plugin()
        assert [p.requires_grad for p in model.parameters()] == expected, "plugin and floor disagree"

        number = max(1, 20_000 // n)
        repeat = 3 if quick else (15 if n < 100_000 else 9)  # quick: the keys, not the numbers
        timing = compare({"floor": lambda m=model: floor_loop(m), "plugin": plugin}, baseline="floor",
                         repeat=repeat, number=number)
        rows[str(n)] = {
            "tensors": n_actual,
            "floor_ms": 1e3 * timing["seconds"]["floor"],
            "plugin_ms": 1e3 * timing["seconds"]["plugin"],
            "ratio": timing["ratio"]["plugin"],
            "ratio_min_max": timing["ratio_min_max"]["plugin"],
            "repeat": repeat,
            "number": number,
        }
        del model
    worst = max(r["ratio"] for r in rows.values())
    growth = rows["100000"]["plugin_ms"] / rows["10000"]["plugin_ms"] if "100000" in rows else None
    floor_growth = rows["100000"]["floor_ms"] / rows["10000"]["floor_ms"] if "100000" in rows else None
    # What the plugin adds on top of the floor, and how that grows.
    excess_growth = None
    if "100000" in rows:
        excess_growth = (rows["100000"]["plugin_ms"] - rows["100000"]["floor_ms"]) / (
            rows["10000"]["plugin_ms"] - rows["10000"]["floor_ms"]
        )
    return {
        "sizes": rows,
        "selection": selection.as_dict(),
        "max_ratio": worst,
        "target_ratio": TARGET_RATIO,
        "ratio_ok": worst <= TARGET_RATIO,
        "growth_100k_over_10k": growth,
        "floor_growth_100k_over_10k": floor_growth,
        "excess_growth_100k_over_10k": excess_growth,
        "growth_target": 10.0,
    }


def table(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    rows = [
        (f"overhead {n} tensors", f"{r['ratio']:.2f}x floor ({r['plugin_ms']:.2f} ms vs {r['floor_ms']:.2f} ms)",
         f"<= {TARGET_RATIO:.0f}x")
        for n, r in result["sizes"].items()
    ]
    if result["growth_100k_over_10k"] is not None:
        rows.append(("overhead growth 100k/10k", f"{result['growth_100k_over_10k']:.1f}x "
                     f"(floor {result['floor_growth_100k_over_10k']:.1f}x, plugin minus floor "
                     f"{result['excess_growth_100k_over_10k']:.1f}x)", "~10x"))
    return rows
