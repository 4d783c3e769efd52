"""The plugin on every rank: tensor, pipeline and data parallel layouts, run as 2 processes on the CPU.

One module-scoped run (``tests/unit/_dist_worker.py``, 2 ranks forked from the session's forkserver that imported
Bridge once, gloo on 127.0.0.1, a hard timeout, stragglers killed) builds the tiny real Qwen3-VL through
``provide_distributed_model`` in several layouts, one after another in the same process group, plus error cases;
each test below checks one layout against expectations computed here from parameter names and sizes (not with the
plugin's code).

Built on the CPU: DP2, TP2 (Qwen3-VL, Qwen2.5-VL), EP2 (Qwen3-VL-MoE), PP2 with tied and untied embeddings, PP2 x VP2
(Qwen2.5-VL; Qwen3-VL cannot take virtual pipeline in Bridge 0.6.2 on any device, see SCENARIOS).
PP2 with tied embeddings needs one CPU patch while building (``_dist_worker._tied_embedding_on_cpu``:
megatron-core moves the tied weight to CUDA unconditionally); the unpatched path, and TP2 x PP2 on 4
ranks (4 processes do not fit this suite's CPU budget), run in tests/gpu/test_gpu_distributed.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _family_parts import part_of
from _shared import PROJECTION_ONLY_FLAGS as PROJECTION_ONLY
from _shared import QWEN3_PROJECTION, join_or_kill, start_forked

from bridge_freeze_harness.cpu_runtime import free_port

WORKER = Path(__file__).parents[1] / "_dist_worker.py"
ROOT = Path(__file__).resolve().parents[3]
WORLD = 2
TIMEOUT_S = 240  # the whole run; a hang anywhere fails the module instead of hanging CI

VISION_ONLY = {"freeze_vision_model": True}
PATTERNS = {**PROJECTION_ONLY, "train_patterns": [r"language_model\.decoder\.layers\.3"],
            "freeze_patterns": ["vision_model.merger.patch_norm"]}

# Independent of the registry: Qwen3-VL's projection is the merger and the DeepStack mergers.

# Qwen3-VL asserts that its DeepStack layers ([0, 1]) are on the first pipeline stage: PP2 needs 4 layers.
L4 = {"family": "qwen3_vl", "num_layers": 4}
SCENARIOS = [
    {"name": "dp2", "family": "qwen3_vl", "tp": 1, "pp": 1, "selection": PROJECTION_ONLY},
    {"name": "tp2", "family": "qwen3_vl", "tp": 2, "pp": 1, "selection": PROJECTION_ONLY},
    {"name": "qwen25_dp2", "family": "qwen25_vl", "tp": 1, "pp": 1, "selection": PROJECTION_ONLY},
    {"name": "qwen25_tp2", "family": "qwen25_vl", "tp": 2, "pp": 1, "selection": PROJECTION_ONLY},
    # whole-model references for the pipeline layouts (DP2: every rank holds one complete replica)
    {"name": "ref_l4", **L4, "tp": 1, "pp": 1, "selection": PROJECTION_ONLY},
    {"name": "ref_l4_untied", **L4, "tp": 1, "pp": 1, "selection": VISION_ONLY, "tied": False},
    # tied embedding / output weight (the tiny Qwen3-VL's default): a copy on each end stage, counted once
    {"name": "pp2", **L4, "tp": 1, "pp": 2, "selection": PROJECTION_ONLY, "tied_on_cpu": True},
    {"name": "pp2_vision", **L4, "tp": 1, "pp": 2, "selection": VISION_ONLY, "tied": False},
    # train / freeze patterns: global layer 3 is local layer 1 of stage 1 (stage 0's local layer 1 is layer 1)
    {"name": "pp2_patterns", **L4, "tp": 1, "pp": 2, "selection": PATTERNS, "tied": False},
    # Virtual pipeline on Qwen2.5-VL: Bridge 0.6.2's Qwen3VLModelProvider.provide() drops vp_stage (it never
    # passes it to Qwen3VLModel), so megatron-core's TransformerBlock asserts "vp_stage must be provided if
    # virtual pipeline model parallel size is set" -- on any device, CPU or GPU. Qwen2.5-VL passes it on.
    {"name": "qwen25_ref_l4", "family": "qwen25_vl", "num_layers": 4, "tp": 1, "pp": 1, "selection": PROJECTION_ONLY},
    {"name": "vpp", "family": "qwen25_vl", "num_layers": 4, "tp": 1, "pp": 2, "vp": 2, "selection": PROJECTION_ONLY},
    # Expert parallel 2 (Qwen3-VL-MoE, 4 experts): each rank holds 2 experts of every layer, dense weights whole
    {"name": "moe_ref", "family": "qwen3_vl_moe", "tp": 1, "pp": 1, "selection": VISION_ONLY},
    {"name": "moe_ep2", "family": "qwen3_vl_moe", "tp": 1, "pp": 1, "ep": 2, "selection": VISION_ONLY},
    # errors on one rank only
    {"name": "err_unclassified", **L4, "tp": 1, "pp": 2, "selection": VISION_ONLY, "tied": False,
     "inject": "unclassified_last_stage"},
    {"name": "err_guarantee", **L4, "tp": 1, "pp": 2, "selection": PROJECTION_ONLY, "tied": False,
     "inject": "guarantee_last_stage"},
    {"name": "err_bridge_build", "family": "qwen3_vl", "tp": 1, "pp": 2, "selection": PROJECTION_ONLY,
     "tied": False},  # 2 layers: Bridge's own DeepStack assertion fails in provide() on stage 0 only
    {"name": "err_unsupported", "family": "qwen3_vl", "tp": 1, "pp": 1, "selection": VISION_ONLY,
     "inject": "unsupported"},
    {"name": "after_errors", **L4, "tp": 1, "pp": 2, "selection": PROJECTION_ONLY, "tied": False},
]


def launch(scenarios: list[dict], out_dir: Path, world: int = WORLD, timeout_s: float = TIMEOUT_S,
           forkserver: Any = None) -> dict:
    """Run ``world`` ranks of the worker; kill them all at ``timeout_s``. Returns {rank: {scenario: result}}.

    The ranks are forked from ``forkserver`` (the session's ``bridge_forkserver``: Bridge imported once) when it is
    given, else processes of their own (tests/gpu: the real TransformerEngine and CUDA in each)."""
    port = free_port()
    logs = [out_dir / f"rank{rank}.log" for rank in range(world)]
    if forkserver is not None:
        procs = [start_forked(forkserver, logs[rank], logs[rank], "_dist_worker", "rank_main", rank, world,
                              str(out_dir), json.dumps(scenarios), port) for rank in range(world)]
        hung = join_or_kill(procs, timeout_s)
    else:
        hung = _launch_processes(scenarios, out_dir, world, timeout_s, port, logs)
    results = {}
    for rank in range(world):
        path = out_dir / f"rank{rank}.json"
        results[rank] = json.loads(path.read_text()) if path.exists() else {}
    results["_hung"] = hung
    results["_logs"] = [log.read_text() if log.exists() else "" for log in logs]
    return results


def _launch_processes(scenarios: list[dict], out_dir: Path, world: int, timeout_s: float, port: int,
                      logs: list[Path]) -> list[int]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
               # the repository first, then the caller's path (the compatibility lane's Bridge must stay ahead of
               # the venv's: a bare PYTHONPATH=ROOT ran the venv's Bridge in the lane's ranks)
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    procs = []
    for rank in range(world):
        with open(logs[rank], "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), str(rank), str(world), str(out_dir), json.dumps(scenarios)],
                env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True,
            ))
    deadline = time.monotonic() + timeout_s
    hung = []
    for rank, proc in enumerate(procs):
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            hung.append(rank)
            for other in procs:  # only the processes this function started
                if other.poll() is None:
                    other.kill()
            proc.wait()
    return hung


@pytest.fixture(scope="module")
def runs(tmp_path_factory, bridge_forkserver):
    results = launch(SCENARIOS, tmp_path_factory.mktemp("dist"), forkserver=bridge_forkserver)
    tail = "\n".join(log[-3000:] for log in results["_logs"])
    assert not results["_hung"], f"ranks {results['_hung']} hung past {TIMEOUT_S}s and were killed:\n{tail}"
    import importlib.util

    # the ranks ran the Bridge this process finds (in the compatibility lane: the lane's, not the venv's)
    bridge = importlib.util.find_spec("megatron.bridge").origin
    assert {results[rank].get("_bridge") for rank in range(WORLD)} == {bridge}, tail
    return results


def ok(runs, name: str) -> list[dict]:
    per_rank = []
    for rank in range(WORLD):
        result = runs[rank].get(name)
        assert result is not None, f"rank {rank} did not reach {name}:\n{runs['_logs'][rank][-3000:]}"
        assert result["ok"], f"{name} failed on rank {rank}: {result['traceback']}"
        per_rank.append(result)
    return per_rank


def expected_parts(result: dict, family: str, selection: dict) -> dict[str, tuple[int, int, int, int]]:
    """(trainable, total, trainable tensors, total tensors) per part of ONE complete model replica."""
    frozen = {part for part, flag in (("language_model", "freeze_language_model"),
                                      ("vision_model", "freeze_vision_model"),
                                      ("vision_projection", "freeze_vision_projection")) if selection.get(flag)}
    rows: dict[str, list[int]] = {}
    for name, numel in result["numel"].items():
        part = part_of(family, name)
        row = rows.setdefault(part, [0, 0, 0, 0])
        row[1] += numel
        row[3] += 1
        if part not in frozen:
            row[0] += numel
            row[2] += 1
    return {part: tuple(row) for part, row in rows.items()}


def report_parts(report: dict) -> dict[str, tuple[int, int, int, int]]:
    return {r["part"]: (r["trainable"], r["total"], r["trainable_tensors"], r["total_tensors"])
            for r in report["parts"] if r["total_tensors"]}


def expected_trainable(names, family: str, selection: dict) -> list[str]:
    frozen = {p for p, f in (("language_model", "freeze_language_model"), ("vision_model", "freeze_vision_model"),
                             ("vision_projection", "freeze_vision_projection")) if selection.get(f)}
    return sorted(n for n in names if part_of(family, n) not in frozen)


def assert_logged_once_by_rank0(per_rank: list[dict]) -> None:
    assert len(per_rank[0]["logged"]) == 1, per_rank[0]["logged"]
    assert all(not r["logged"] for r in per_rank[1:])
    assert all(r["report"] == per_rank[0]["report"] for r in per_rank)


# ---------------------------------------------------------------------------------------- layouts


def test_data_parallel_replicas_are_counted_once(runs):
    per_rank = ok(runs, "dp2")
    assert [r["dp_rank"] for r in per_rank] == [0, 1]
    assert per_rank[0]["names"] == per_rank[1]["names"]  # full replicas
    for r in per_rank:
        assert r["trainable"] == expected_trainable(r["names"], "qwen3_vl", PROJECTION_ONLY)
    # each rank holds the whole model: the model-wide report is one replica, not two
    assert report_parts(per_rank[0]["report"]) == expected_parts(per_rank[0], "qwen3_vl", PROJECTION_ONLY)
    assert_logged_once_by_rank0(per_rank)


@pytest.mark.parametrize(("family", "dp_name", "tp_name"), [("qwen3_vl", "dp2", "tp2"),
                                                          ("qwen25_vl", "qwen25_dp2", "qwen25_tp2")])
def test_tensor_parallel_totals_are_the_models_totals(runs, family, dp_name, tp_name):
    whole = ok(runs, dp_name)[0]  # a whole replica of the same config (TP1)
    per_rank = ok(runs, tp_name)
    assert [r["tp_rank"] for r in per_rank] == [0, 1]
    assert per_rank[0]["names"] == per_rank[1]["names"] == whole["names"]
    assert per_rank[0]["tp_sharded"], "no tensor-parallel shard: the layout is not TP2"
    shard_total = sum(per_rank[0]["numel"].values())
    assert shard_total < sum(whole["numel"].values())  # each rank holds a shard
    for r in per_rank:  # each rank freezes its own shard
        assert r["trainable"] == expected_trainable(r["names"], family, PROJECTION_ONLY)
    expected = expected_parts(whole, family, PROJECTION_ONLY)
    assert report_parts(per_rank[0]["report"]) == expected  # not one shard's, not doubled
    assert per_rank[0]["report"]["total"] == sum(whole["numel"].values())
    assert_logged_once_by_rank0(per_rank)


@pytest.mark.parametrize(("name", "ref", "selection"), [("pp2", "ref_l4", PROJECTION_ONLY),
                                                        ("pp2_vision", "ref_l4_untied", VISION_ONLY)])
def test_pipeline_stages_each_freeze_their_part_and_the_report_sums_them(runs, name, ref, selection):
    whole = ok(runs, ref)[0]
    first, last = ok(runs, name)
    assert (first["pp_rank"], last["pp_rank"]) == (0, 1)
    assert any(n.startswith("vision_model.") for n in first["names"])
    assert any(QWEN3_PROJECTION.match(n) for n in first["names"])
    assert not any(n.startswith("vision_model.") for n in last["names"])  # nothing of the vision flags here
    assert any(n.startswith("language_model.output_layer.") for n in last["names"])
    for stage in (first, last):
        assert stage["trainable"] == expected_trainable(stage["names"], "qwen3_vl", selection)
    # the two stages together are the whole model, so the model-wide report is the TP1/PP1 one
    assert report_parts(first["report"]) == expected_parts(whole, "qwen3_vl", selection)
    assert_logged_once_by_rank0([first, last])


def test_a_pattern_matching_on_the_second_stage_only_uses_model_wide_layer_numbers(runs):
    whole = ok(runs, "ref_l4_untied")[0]
    first, last = ok(runs, "pp2_patterns")
    layer3 = {n for n in whole["names"] if n.startswith("language_model.decoder.layers.3.")}
    norm = {n for n in whole["names"] if n.startswith("vision_model.merger.patch_norm.")}
    assert layer3 and len(norm) == 2
    # stage 1 holds layers 2 and 3 as its local 0 and 1; stage 0's local layer 1 is layer 1 and stays frozen
    assert last["trainable"] == sorted(n for n in last["names"] if n.startswith("language_model.decoder.layers.1."))
    assert first["trainable"] == sorted(n for n in expected_trainable(first["names"], "qwen3_vl", PROJECTION_ONLY)
                                        if n not in norm)
    report = first["report"]
    lm = next(r for r in report["parts"] if r["part"] == "language_model")
    projection = next(r for r in report["parts"] if r["part"] == "vision_projection")
    assert (lm["trainable"], lm["trainable_tensors"]) == (sum(whole["numel"][n] for n in layer3), len(layer3))
    projection_names = {n for n in whole["names"] if QWEN3_PROJECTION.match(n)}
    assert projection["trainable"] == sum(whole["numel"][n] for n in projection_names - norm)
    assert [(m["kind"], m["tensors"]) for m in report["patterns"]["matches"]] == [("freeze", 2), ("train", len(layer3))]
    assert_logged_once_by_rank0([first, last])


def test_virtual_pipeline_chunks_on_cpu(runs):
    whole = ok(runs, "qwen25_ref_l4")[0]
    per_rank = ok(runs, "vpp")
    assert [r["n_chunks"] for r in per_rank] == [2, 2]
    for r in per_rank:
        assert r["trainable"] == expected_trainable(r["names"], "qwen25_vl", PROJECTION_ONLY)
    assert any(n.startswith("visual.merger.") for n in per_rank[0]["names"])
    assert not any(n.startswith("visual.") for n in per_rank[1]["names"])  # the vision tower: stage 0 only
    assert report_parts(per_rank[0]["report"]) == expected_parts(whole, "qwen25_vl", PROJECTION_ONLY)
    assert_logged_once_by_rank0(per_rank)


def test_expert_parallel_experts_are_summed_and_dense_weights_counted_once(runs):
    whole = ok(runs, "moe_ref")[0]
    per_rank = ok(runs, "moe_ep2")
    assert [r["ep_rank"] for r in per_rank] == [0, 1]
    expert = re.compile(r"^language_model\.decoder\.layers\.\d+\.mlp\.experts\.")
    for r in per_rank:  # megatron-core marks the expert-parallel weights (allreduce=False)
        assert r["expert"] == sorted(n for n in r["names"] if expert.match(n))
    whole_experts = sum(v for n, v in whole["numel"].items() if expert.match(n))
    local_experts = [sum(r["numel"][n] for n in r["expert"]) for r in per_rank]
    assert whole_experts and whole_experts == 2 * local_experts[0] == 2 * local_experts[1]
    dense = [sum(v for n, v in r["numel"].items() if n not in r["expert"]) for r in per_rank]
    assert dense[0] == dense[1] == sum(whole["numel"].values()) - whole_experts  # replicated over EP ranks
    for r in per_rank:  # experts are language model: they train with the vision encoder frozen
        assert r["trainable"] == expected_trainable(r["names"], "qwen3_vl_moe", VISION_ONLY)
        assert set(r["expert"]) <= set(r["trainable"])
    # the model-wide report: all experts once (not one rank's half), the dense weights once (not doubled)
    assert report_parts(per_rank[0]["report"]) == expected_parts(whole, "qwen3_vl_moe", VISION_ONLY)
    assert per_rank[0]["report"]["total"] == sum(whole["numel"].values())
    assert_logged_once_by_rank0(per_rank)


# ----------------------------------------------------------------------------------------- errors


def errors(runs, name: str) -> list[dict]:
    per_rank = [runs[rank].get(name) for rank in range(WORLD)]
    assert all(r is not None for r in per_rank), f"a rank did not finish {name} (hang?)"
    assert not any(r["ok"] for r in per_rank), f"{name} did not raise on every rank"
    return per_rank


def test_unclassified_parameter_on_the_last_stage_only_raises_on_every_rank(runs):
    first, last = errors(runs, "err_unclassified")
    assert first["error"] == last["error"] == "UnclassifiedParameterError"
    assert "language_model.output_layer.weight" in last["message"]  # the stage that found it
    assert "global rank 1" in first["message"]  # the stage that did not says who did
    assert "language_model.output_layer.weight" in first["message"]


def test_guarantee_violation_on_one_stage_raises_on_every_rank(runs):
    first, last = errors(runs, "err_guarantee")
    assert first["error"] == last["error"] == "FreezeGuaranteeError"
    assert "unfreeze_lm_on_last_stage" in last["message"]
    assert "global rank 1" in first["message"]


def test_bridge_build_error_on_one_stage_stops_every_rank(runs):
    first, last = errors(runs, "err_bridge_build")
    assert first["error"] == "AssertionError"  # stage 0's own error, re-raised
    assert last["error"] == "PeerRankFreezeError"  # stage 1 built fine, and stops instead of waiting
    assert "global rank 0" in last["message"] and "deepstack" in last["message"]


def test_unsupported_flag_raises_on_every_rank(runs):
    per_rank = errors(runs, "err_unsupported")
    assert all(r["error"] == "UnsupportedFreezeFlagError" for r in per_rank)
    assert all("GPTModelProvider" in r["message"] for r in per_rank)


def test_ranks_stay_in_step_after_collective_errors(runs):
    per_rank = ok(runs, "after_errors")  # no rank left behind in a collective
    assert_logged_once_by_rank0(per_rank)
