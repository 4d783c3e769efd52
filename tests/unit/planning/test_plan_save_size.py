"""``bridge-freeze plan`` prints the bytes of one checkpoint save, full and trainable-only (issue 45 item 4b).

The arithmetic on hand-made plans (each expected figure written out here), then the issue's own figure on the
published Qwen3-VL-235B-A22B config: only the projection trains; the expected parameter counts are computed here from
its config.json (the maker's layer sizes), not read from the plan. Each fails on the main of 2026-12-07 (266227e):
plan had no save size (no ``checkpoint_save`` in its JSON, no "per checkpoint save" line).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge_freeze_plugin import planning
from bridge_freeze_plugin.planning import MemoryAssumptions, ParamInfo, RankFigures, make_plan
from bridge_freeze_plugin.request import FreezeSelection, Part

CONFIG_235B = Path(__file__).parents[2] / "fixtures" / "hf_configs" / "qwen3_vl_moe_235b" / "config.json"
MiB, GiB = 2**20, 2**30


def _plan(assumptions: MemoryAssumptions, layout=None, per_rank=()):
    """1,000 frozen language-model elements, 100 trainable projection elements."""
    params = [ParamInfo("language_model.w", Part.LANGUAGE_MODEL, False, 1000, (1000,)),
              ParamInfo("vision_model.merger.w", Part.VISION_PROJECTION, True, 100, (100,))]
    return make_plan(params, family="qwen3_vl", provider="Qwen3VLModelProvider", assumptions=assumptions,
                     selection=FreezeSelection(freeze_language_model=True, freeze_vision_model=True),
                     layout=layout, per_rank=per_rank)


@pytest.mark.parametrize(("assumptions", "distributed", "per_param"), [
    (MemoryAssumptions(), False, 12),  # bf16: fp32_param + exp_avg + exp_avg_sq
    (MemoryAssumptions(param_dtype="fp32"), False, 8),  # fp32, plain optimizer: the moments only
    (MemoryAssumptions(param_dtype="fp32"), True, 12),  # the distributed optimizer always saves its fp32 param
    (MemoryAssumptions(optimizer="sgd"), False, 8),  # fp32_param + momentum
])
def test_one_save_holds_the_weights_and_the_optimizer_state_of_what_trains(assumptions, distributed, per_param):
    layout = planning.Layout(tp=1, dp=2, use_distributed_optimizer=distributed) if distributed else None
    size = planning.save_size(_plan(assumptions, layout))
    elem = 4 if assumptions.param_dtype == "fp32" else 2
    assert size.optimizer_bytes_per_param == per_param
    assert size.in_all.as_dict() == {
        "weight_bytes": 1100 * elem, "trainable_weight_bytes": 100 * elem, "optimizer_bytes": 100 * per_param,
        "full_bytes": 1100 * elem + 100 * per_param, "trainable_only_bytes": 100 * elem + 100 * per_param}


def test_per_rank_is_the_largest_ranks_shard_and_its_optimizer_shard():
    assumptions = MemoryAssumptions(dp_size=2)
    figures = dict(parameters=600, trainable=60, weight_bytes=0, grad_bytes=0, activation_bytes=0,
                   in_flight_micro_batches=1.0, dense_layers=1, moe_layers=0, vision_layers=1)
    ranks = (RankFigures(tp=0, pp=0, ep=0, optimizer_bytes=30 * 12, **figures),  # 30 elements of DP shard
             RankFigures(tp=1, pp=0, ep=0, optimizer_bytes=20 * 12, **{**figures, "parameters": 500}))
    layout = planning.Layout(tp=2, dp=2, use_distributed_optimizer=True)
    size = planning.save_size(_plan(assumptions, layout, ranks))
    assert size.rank == (0, 0, 0)
    assert (size.per_rank.weights, size.per_rank.trainable_weights, size.per_rank.optimizer) == (1200, 120, 360)
    assert size.in_all.optimizer == 100 * 12  # the checkpoint on disk holds every shard once
    lines = planning.save_lines(size, lambda n: f"{n} B")
    assert lines[0] == ("per checkpoint save, trainable-only (the frozen base as pretrained_checkpoint) vs full: in "
                        "all 200 B + optimizer 1200 B instead of 2200 B + optimizer 1200 B (1400 B instead of 3400 B)")
    assert lines[1] == ("  per rank (the largest, tp 0 pp 0 ep 0): 120 B + optimizer 360 B instead of 1200 B + "
                        "optimizer 360 B (480 B instead of 1560 B)")


def _counts_235b() -> tuple[int, int]:
    """(all parameters, the vision projection's) of Qwen3-VL-235B-A22B, from its config.json."""
    doc = json.loads(CONFIG_235B.read_text())
    t, v = doc["text_config"], doc["vision_config"]
    h, hd, heads, kv, experts = (t[k] for k in ("hidden_size", "head_dim", "num_attention_heads",
                                                "num_key_value_heads", "num_local_experts"))
    layer = (2 * h + h * heads * hd + 2 * h * kv * hd + heads * hd * h + 2 * hd  # norms, q k v o, q/k norms
             + experts * h + experts * 3 * h * t["moe_intermediate_size"])  # router, experts (gate, up, down)
    untied = 1 if doc.get("tie_word_embeddings") else 2  # the top-level flag: separate output layer
    lm = t["num_hidden_layers"] * layer + h + untied * t["vocab_size"] * h
    vh, vi, m = v["hidden_size"], v["intermediate_size"], v["spatial_merge_size"]
    block = 4 * vh + 3 * vh * vh + 3 * vh + vh * vh + vh + vh * vi + vi + vi * vh + vh
    tower = (v["in_channels"] * v["temporal_patch_size"] * v["patch_size"] ** 2 * vh + vh
             + v["num_position_embeddings"] * vh + v["depth"] * block)
    merged = vh * m * m
    mlp = merged * merged + merged + merged * v["out_hidden_size"] + v["out_hidden_size"]
    projection = (2 * vh + mlp) + len(v["deepstack_visual_indexes"]) * (2 * merged + mlp)  # merger + DeepStack
    return lm + tower + projection, projection


@pytest.mark.slow
def test_the_issues_figure_on_qwen3_vl_235b_with_only_the_projection_training(cpu_bridge, capsys):
    total, projection = _counts_235b()
    plan = planning.plan_model(None, FreezeSelection(freeze_language_model=True, freeze_vision_model=True),
                               MemoryAssumptions(), hf_config=CONFIG_235B)
    doc = plan.as_dict(with_params=False)["checkpoint_save"]
    assert doc["in_all"] == {"weight_bytes": 2 * total, "trainable_weight_bytes": 2 * projection,
                             "optimizer_bytes": 12 * projection, "full_bytes": 2 * total + 12 * projection,
                             "trainable_only_bytes": 14 * projection}
    assert round(2 * projection / MiB, 1) == 306.1 and round(2 * total / GiB, 1) == 439.0  # the issue's figure
    lines = planning.save_lines(planning.save_size(plan), lambda n: f"{n / MiB:.1f} MiB")
    assert lines[0].endswith(f"in all {2 * projection / MiB:.1f} MiB + optimizer {12 * projection / MiB:.1f} MiB "
                             f"instead of {2 * total / MiB:.1f} MiB + optimizer {12 * projection / MiB:.1f} MiB "
                             f"({14 * projection / MiB:.1f} MiB instead of {(2 * total + 12 * projection) / MiB:.1f} "
                             "MiB)")
