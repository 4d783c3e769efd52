"""On a GPU machine: the layouts tests/unit/integration/test_distributed.py cannot build on the CPU.

- PP2 with tied embedding / output weights WITHOUT the CPU patch: megatron-core 0.19.2's
  ``LanguageModule.setup_embeddings_and_output_layer`` moves the tied weight to CUDA
  (``weight.data.cuda()``) before its first/last-stage all_reduce, so on the CPU it needs a patch;
- TP2 x PP2 on 4 ranks (4 processes do not fit the CPU suite's budget).

Same worker and expectations as the CPU test (4 processes, gloo on 127.0.0.1, hard timeout). It needs a machine
with 4 GPUs (one per rank: the tied weight goes to each rank's own device); on fewer it skips, saying so. The
lent machine so far had one: the one-GPU checks are in test_gpu_freeze.py and test_gpu_training.py.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 4,
                       reason="TP2 x PP2 takes 4 GPUs, one per rank; this machine has fewer"),
]

_UNIT = Path(__file__).resolve().parents[1] / "unit"
if str(_UNIT) not in sys.path:  # the CPU test imports its helpers (_shared, _family_parts) from there
    sys.path.insert(0, str(_UNIT))
_SPEC = importlib.util.spec_from_file_location(
    "_bfp_cpu_distributed_tests", _UNIT / "integration" / "test_distributed.py"
)
_CPU = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(_CPU)  # the CPU test's launcher and expectations (no test runs from here)
PROJECTION_ONLY = _CPU.PROJECTION_ONLY
assert_logged_once_by_rank0 = _CPU.assert_logged_once_by_rank0
expected_parts = _CPU.expected_parts
expected_trainable = _CPU.expected_trainable
launch = _CPU.launch
report_parts = _CPU.report_parts

L4 = {"family": "qwen3_vl", "num_layers": 4, "selection": PROJECTION_ONLY}


def test_tp2_pp2_tied_embeddings_on_four_ranks(tmp_path):
    scenarios = [
        {"name": "ref", **L4, "tp": 1, "pp": 1},  # DP4: each rank holds the whole model
        {"name": "tp2pp2", **L4, "tp": 2, "pp": 2},  # tied embeddings, no CPU patch
    ]
    runs = launch(scenarios, tmp_path, world=4, timeout_s=400)
    assert not runs["_hung"], "\n".join(log[-3000:] for log in runs["_logs"])
    for rank in range(4):
        for name in ("ref", "tp2pp2"):
            result = runs[rank].get(name)
            assert result is not None and result["ok"], (rank, name, result and result.get("traceback"))
    whole = runs[0]["ref"]
    per_rank = [runs[rank]["tp2pp2"] for rank in range(4)]
    assert sorted((r["pp_rank"], r["tp_rank"]) for r in per_rank) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for r in per_rank:
        assert r["trainable"] == expected_trainable(r["names"], "qwen3_vl", PROJECTION_ONLY)
        assert any(n.startswith("vision_model.") for n in r["names"]) == (r["pp_rank"] == 0)
    assert report_parts(per_rank[0]["report"]) == expected_parts(whole, "qwen3_vl", PROJECTION_ONLY)
    assert_logged_once_by_rank0(per_rank)
