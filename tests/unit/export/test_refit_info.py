"""A receiver prepared for exactly the trainable stream: ``trainable_hf_weights_info`` against the real export.

NeMo-RL's refit prepares its vLLM receiver with ``state_dict_info`` (HF name -> ``(shape, dtype)``, in the order
the producer sends) and the receiver then takes exactly those tensors. Here, on every family with a tiny HF
checkpoint (the HF round trip's cases: tests/unit/integration/test_hf_roundtrip.py, with its freeze flags), with
LoRA merged and unmerged, and under expert parallel 2 over gloo:

- ``trainable_hf_weights_info(...)`` is the layout of ``export_trainable_hf_weights``'s stream as it comes out
  (names, shapes, dtypes, order), and with ``everything=True`` the layout of Bridge's full ``export_hf_weights``;
  both expectations are read off the real streams;
- the names are the HF tensors the round trip's rule says train (a regex over HF names, written per family from
  the parts' definitions, independent of the plugin), so the subset is a real one.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
from _refit_worker import LORA_TARGETS, PROJECTION_ONLY, build, receiver_facts
from _shared import join_or_kill, start_forked

ROUNDTRIP_FILE = Path(__file__).parents[1] / "integration" / "test_hf_roundtrip.py"
EP_TIMEOUT_S = 300
EP_CASES = ("patterns", "lora_merged", "lora_unmerged")


def _roundtrip_cases() -> Any:
    """The HF round trip's module (its CASES: flags and the HF names that train, per family; FAMILIES)."""
    spec = importlib.util.spec_from_file_location("_hf_roundtrip_cases", ROUNDTRIP_FILE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


ROUNDTRIP = _roundtrip_cases()
#: HF tensors sent next to the round trip's rule: a router's expert bias, which megatron-core moves after every
#: step without gradients while the router trains (the round trip's steps run no finalize_model_grads, so its
#: rule leaves it out).
EXPERT_BIAS_ALSO_SENT = {"minimax_m3_vl": r"\.e_score_correction_bias$"}
QWEN3_PROJECTION = re.compile(ROUNDTRIP.QWEN3_PROJECTION)
QWEN3_LM_ATTENTION = re.compile(r"^model\.language_model\.layers\.\d+\.self_attn\.[qkvo]_proj\.weight$")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, cpu_bridge):
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("hf")
    written: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in written:
            written[family] = write_tiny_hf_checkpoint(family, root / family, seed=0)
        return written[family]

    return get


def check_layouts(facts: dict[str, Any]) -> set[str]:
    """The receiver layouts are the streams' layouts; returns the names of the trainable stream."""
    assert facts["info_everything"] == facts["full"]
    assert facts["info"] == facts["sent"]
    full_names = [name for name, _, _ in facts["full"]]
    sent_names = [name for name, _, _ in facts["sent"]]
    assert len(set(full_names)) == len(full_names)
    assert sent_names == [name for name in full_names if name in set(sent_names)]  # the full order, a subset
    return set(sent_names)


@pytest.mark.parametrize("family", ROUNDTRIP.FAMILIES)
def test_info_is_the_layout_of_the_trainable_stream(family, checkpoints):
    case = ROUNDTRIP.CASES[family]
    bridge, chunks = build(checkpoints(family), family, **case.flags)
    facts = receiver_facts(bridge, chunks)
    sent = check_layouts(facts)
    full = [name for name, _, _ in facts["full"]]
    rule = [case.trains] + ([EXPERT_BIAS_ALSO_SENT[family]] if family in EXPERT_BIAS_ALSO_SENT else [])
    expected = {name for name in full if any(re.search(pattern, name) for pattern in rule)}
    assert expected and expected != set(full)  # a real subset
    assert sent == expected


def test_lora_merged_and_unmerged(checkpoints):
    """LoRA on the language model's attention next to the full-rank projection (Qwen3-VL)."""
    bridge, chunks = build(checkpoints("qwen3_vl"), "qwen3_vl", **PROJECTION_ONLY, lora=LORA_TARGETS)
    facts = {merge: receiver_facts(bridge, chunks, merge=merge) for merge in (True, False)}
    full = {merge: [name for name, _, _ in facts[merge]["full"]] for merge in (True, False)}
    # merged: the attention weights (the adapters merged into them) and the projection
    assert check_layouts(facts[True]) == {
        n for n in full[True] if QWEN3_PROJECTION.search(n) or QWEN3_LM_ATTENTION.search(n)}
    # unmerged: Bridge exports the bases as loaded (PEFT names, "...q_proj.base_layer.weight"): the projection
    assert {n for n in full[False] if ".base_layer." in n}
    assert check_layouts(facts[False]) == {n for n in full[False] if QWEN3_PROJECTION.search(n)}


@pytest.fixture(scope="module")
def ep2(tmp_path_factory, checkpoints, bridge_forkserver) -> dict[int, dict[str, Any]]:
    """One EP2 run for the module: the receiver layouts, and SkyRL's source (installed for the tests)."""
    return run_ep2(tmp_path_factory.mktemp("ep2"), checkpoints("qwen3_vl_moe"), bridge_forkserver)


def test_an_export_dtype_is_the_streams(checkpoints):
    """weight_dtype (what a trainer exports in, e.g. bf16 from fp32 weights): the layout says it, as the stream."""
    import torch
    from _skyrl_weight_sync import info_layout, layout

    from bridge_freeze_plugin.export import export_trainable_hf_weights, trainable_hf_weights_info

    bridge, chunks = build(checkpoints("qwen3_vl"), "qwen3_vl", **PROJECTION_ONLY)
    for everything in (False, True):
        sent = layout(export_trainable_hf_weights(bridge, chunks, everything=everything, show_progress=False,
                                                  weight_dtype=torch.bfloat16))
        info = trainable_hf_weights_info(bridge, chunks, everything=everything, weight_dtype=torch.bfloat16)
        assert info_layout(info) == sent and {dtype for _, dtype in info.values()} == {torch.bfloat16}


def test_refusals_name_what_was_asked(checkpoints):
    from bridge_freeze_plugin.errors import TrainableSyncError
    from bridge_freeze_plugin.export import trainable_hf_weights_info, trainable_param_filter

    bridge, chunks = build(checkpoints("qwen3_vl"), "qwen3_vl", **PROJECTION_ONLY)
    with pytest.raises(TrainableSyncError, match=r"cpu=True.*leave cpu out"):
        trainable_hf_weights_info(bridge, chunks, cpu=True)
    # No tiny family has a parameter without a mapping (Bridge's None placeholder): one is added to the real list.
    real = bridge.get_conversion_tasks
    bridge.get_conversion_tasks = lambda model: [*real(model), None]
    with pytest.raises(TrainableSyncError, match=r"placeholders \(None\).*no param_filter"):
        trainable_param_filter(bridge, chunks)


def test_expert_parallel_2_over_gloo(ep2):
    """Qwen3-VL-MoE, EP2: an expert that one rank holds trains (the fused HF expert tensor is sent from both),
    then LoRA merged and unmerged. Every rank gets the same layouts, and they are its streams'."""
    ranks = ep2
    for case in EP_CASES:
        names = [check_layouts(ranks[rank][case]) for rank in (0, 1)]
        assert ranks[0][case]["info"] == ranks[1][case]["info"]
        assert ranks[0][case]["info_everything"] == ranks[1][case]["info_everything"]
        full = [name for name, _, _ in ranks[0][case]["full"]]
        assert names[0] == names[1] and names[0] != set(full)
    experts = {"model.language_model.layers.0.mlp.experts.gate_up_proj",
               "model.language_model.layers.1.mlp.experts.down_proj"}
    full = {case: [name for name, _, _ in ranks[0][case]["full"]] for case in EP_CASES}
    assert check_layouts(ranks[0]["patterns"]) == {n for n in full["patterns"] if QWEN3_PROJECTION.search(n)} | experts
    assert check_layouts(ranks[0]["lora_unmerged"]) == {
        n for n in full["lora_unmerged"] if QWEN3_PROJECTION.search(n)}
    assert check_layouts(ranks[0]["lora_merged"]) == {
        n for n in full["lora_merged"] if QWEN3_PROJECTION.search(n) or QWEN3_LM_ATTENTION.search(n)}


def run_ep2(out: Path, checkpoint: Path, forkserver: Any) -> dict[int, dict[str, Any]]:
    """Two ranks of ``_refit_worker.rank_main`` forked from the Bridge server; their results (killed when hung)."""
    from bridge_freeze_harness.cpu_runtime import free_port

    port = free_port()
    logs = [out / f"rank{rank}.log" for rank in (0, 1)]
    procs = [start_forked(forkserver, logs[rank], logs[rank], "_refit_worker", "rank_main", rank, 2, str(out),
                          str(checkpoint), port) for rank in (0, 1)]
    hung = join_or_kill(procs, EP_TIMEOUT_S)
    tails = "\n".join(log.read_text()[-3000:] for log in logs if log.exists())
    assert not hung, f"ranks {hung} hung past {EP_TIMEOUT_S}s:\n{tails}"
    ranks = {}
    for rank in (0, 1):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing:\n{tails}"
        ranks[rank] = json.loads(path.read_text())
        assert "traceback" not in ranks[rank], f"rank {rank}: {ranks[rank]['traceback']}"
    return ranks


def test_skyrls_source_with_the_plugins_filter_under_expert_parallel_2(ep2):
    """SkyRL's real MegatronWeightSource on each EP rank, with that rank's filter (the experts' Megatron names
    differ between ranks): its metadata and stream are that rank's export_trainable_hf_weights."""
    for rank in (0, 1):
        facts = ep2[rank]["skyrl"]
        assert facts["metadata"] == facts["expected"] == ep2[rank]["patterns"]["sent"]
        assert facts["streamed"] == facts["expected"] and facts["same_values"]
