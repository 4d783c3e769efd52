"""The run-time audit model-wide: Bridge's real ``pretrain()`` on 2 gloo ranks (forked from the session's
forkserver, Bridge imported once; a hard timeout), in tensor-, pipeline-, expert- and data-parallel layouts.

Each layout's verdict (the same on both ranks) must equal the verdict on the whole model: the same tensors learned,
the same counts per part, computed here from the tiny model's names with the tests' own table. The data-parallel
runs with and without the distributed optimizer see the same batches, so their gradient norms (a sum of each rank's
shard of the reduced gradient, against the whole reduced gradient) must agree too. A strict finding, or a frozen
weight written on one pipeline stage only, raises on both ranks, and neither hangs.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from _family_parts import part_of
from _shared import join_or_kill, start_forked

from bridge_freeze_harness.cpu_runtime import free_port

WORLD = 2
TIMEOUT_S = 300
PROJECTION_ONLY = {"freeze_language_model": True, "freeze_vision_model": True}
VISION_FROZEN = {"freeze_vision_model": True}
L4 = {"family": "qwen3_vl", "num_layers": 4, "tied": False}  # PP2: Qwen3-VL's DeepStack layers on stage 0

SCENARIOS = [
    {"name": "pp2", **L4, "pp": 2, "selection": VISION_FROZEN},
    {"name": "dp2", "family": "qwen3_vl", "selection": VISION_FROZEN},
    {"name": "dp2_dist", "family": "qwen3_vl", "selection": VISION_FROZEN, "dist": True},
    {"name": "tp2", "family": "qwen3_vl", "tp": 2, "selection": VISION_FROZEN},
    {"name": "l4_dp2", **L4, "selection": VISION_FROZEN},
    {"name": "moe_dp2", "family": "qwen3_vl_moe", "selection": VISION_FROZEN},
    {"name": "moe_ep2", "family": "qwen3_vl_moe", "ep": 2, "selection": VISION_FROZEN},
    # a finding on stage 0 only, strict: both ranks raise it
    {"name": "strict_pp2", **L4, "pp": 2, "selection": PROJECTION_ONLY, "detach": True, "strict": True},
    # a frozen weight written on stage 1 only: both ranks raise
    {"name": "frozen_written_pp2", **L4, "pp": 2, "selection": PROJECTION_ONLY, "write": True},
    {"name": "after", "family": "qwen3_vl", "selection": PROJECTION_ONLY},
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, bridge_forkserver) -> dict[int, dict[str, Any]]:
    out = tmp_path_factory.mktemp("audit_dist")
    port = free_port()
    logs = [out / f"rank{rank}.log" for rank in range(WORLD)]
    procs = [start_forked(bridge_forkserver, logs[r], logs[r], "_audit_worker", "rank_main", r, WORLD, str(out),
                          json.dumps(SCENARIOS), port) for r in range(WORLD)]
    hung = join_or_kill(procs, TIMEOUT_S)
    tail = "\n".join(log.read_text()[-3000:] for log in logs if log.exists())
    assert not hung, f"ranks {hung} hung past {TIMEOUT_S}s and were killed:\n{tail}"
    results = {r: json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)}
    return results


def _verdict(runs: dict[int, dict[str, Any]], name: str) -> dict[str, Any]:
    per_rank = [runs[r][name] for r in range(WORLD)]
    for result in per_rank:
        assert result["ok"], result.get("traceback")
    first, second = (r["report"] for r in per_rank)
    assert first == {**second, "seconds": first["seconds"]}  # every rank has the same verdict
    return first


def _names(family: str, **fields: Any) -> dict[str, str]:
    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.train import make_provider

    model = build_tiny_model(family, make_provider(family, **fields))
    return {n: part_of(family, n) for n, _ in model.named_parameters()}


def _counts(report: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {p["part"]: (p["trainable_tensors"], p["with_gradient"]) for p in report["parts"]}


@pytest.mark.usefixtures("cpu_bridge")
@pytest.mark.parametrize(("name", "reference", "family", "fields"), [
    ("tp2", "dp2", "qwen3_vl", {}),
    ("pp2", "l4_dp2", "qwen3_vl", {"num_layers": 4, "share_embeddings_and_output_weights": False}),
    ("moe_ep2", "moe_dp2", "qwen3_vl_moe", {}),
])
def test_a_parallel_layouts_verdict_is_the_whole_models(runs, name, reference, family, fields):
    names = _names(family, **fields)
    trained = {n for n, p in names.items() if p != "vision_model"}
    whole = _verdict(runs, reference)
    split = _verdict(runs, name)
    routed = {n for f in split["findings"] if f["cause"] == "routing" for n in f["names"]}
    assert set(split["learned"]) | routed == trained  # every trainable tensor, once, by its model-wide name
    assert [f for f in split["findings"] if f["warned"]] == []
    assert _counts(split) == {p: (t, t - sum(1 for n in routed if names[n] == p)) for p, (t, _) in
                              _counts(whole).items()}
    assert _counts(whole)["language_model"][0] == sum(1 for p in trained if names[p] == "language_model")
    assert split["held"]["tensors"] == whole["held"]["tensors"] == sum(1 for p in names.values()
                                                                        if p == "vision_model")


def test_the_distributed_optimizers_shards_sum_to_the_whole_gradient_norm(runs):
    plain, sharded = _verdict(runs, "dp2"), _verdict(runs, "dp2_dist")
    assert plain["learned"] == sharded["learned"] and _counts(plain) == _counts(sharded)
    for a, b in zip(plain["parts"], sharded["parts"], strict=True):
        assert all(math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-9) for x, y in zip(a["grad_norms"], b["grad_norms"],
                                                                                   strict=True)), (a, b)
    assert any(n > 0 for p in sharded["parts"] for n in p["grad_norms"])


def test_a_strict_finding_on_one_stage_raises_on_every_rank(runs):
    results = [runs[r]["strict_pp2"] for r in range(WORLD)]
    assert [r["error"] for r in results] == ["TrainingAuditError"] * WORLD, results
    assert all("vision_model.merger.linear_fc1.weight" in r["message"] for r in results)


def test_a_frozen_weight_written_on_one_stage_raises_on_every_rank(runs):
    results = [runs[r]["frozen_written_pp2"] for r in range(WORLD)]
    assert [r["error"] for r in results] == ["FrozenPartTrainedError"] * WORLD, results
    assert "language_model.decoder.layers." in results[1]["message"]  # the stage that holds it names it
    assert "global rank 1" in results[0]["message"]  # the other says who


def test_the_ranks_train_on_after_the_errors(runs):
    assert _verdict(runs, "after")["ok"]
