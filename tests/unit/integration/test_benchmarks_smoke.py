"""The benchmark suite runs (``--quick``) and writes every figure's keys. Not a benchmark itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

EXPECTED = {
    "overhead": {"sizes", "max_ratio", "target_ratio", "ratio_ok", "growth_100k_over_10k"},
    "memory": {"selections", "all_exact", "naive_freeze_after_optimizer"},
    "step": {"ratio", "full_step_ms", "vision_layer_backward_calls", "vision_backward_skipped_when_frozen"},
    "activation": {"python_c_pass", "import_megatron_bridge"},
    "plan": {"available", "time_ratio", "peak_rss_ratio", "ratio_arm"},
    "recompute": {"cpu_tiny", "full_size_estimate"},
    "sync": {"selections", "all_bytes_ratios_are_shares", "checkpoint_bytes"},
    "audit": {"selections", "max_ratio_after", "cpu_checksum", "audited_steps"},
    # measured only on CUDA (elsewhere "skipped" beside plan's figures for the same config.json)
    "gpu": {"config", "geometry", "plan", "attention_scores_bytes"},
}


@pytest.mark.slow
def test_quick_run_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    # Earlier tests in this process may have set up a CPU process group: its port is taken.
    dist_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    env["PYTHONWARNINGS"] = "ignore"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--quick", "--out", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["quick"] is True
    assert {"cpu", "cores", "memory_gib"} <= set(result["machine"])
    assert set(result["figures"]) == set(EXPECTED)
    for name, keys in EXPECTED.items():
        assert keys <= set(result["figures"][name]), (name, keys - set(result["figures"][name]))
    memory = result["figures"]["memory"]
    assert memory["all_exact"], memory["selections"]
    lora = memory["selections"]["LoRA + freeze LM+VM+VP"]  # adapters only
    assert lora["lora"]["adapters_and_full_rank_parts_train"] and 0 < lora["trainable_params"] < lora["total_params"]
    assert lora["grad_ratio"] == lora["trainable_fraction"] < 0.1
    projection = memory["selections"]["freeze LM+VM"]  # full-rank projection, no LoRA
    mixed = memory["selections"]["LoRA (attention) + full-rank projection"]
    assert mixed["lora"]["adapters_and_full_rank_parts_train"] and mixed["exact"]
    adapters = mixed["lora"]["adapter_params"]
    assert mixed["trainable_params"] == projection["trainable_params"] + adapters  # exactly adapters + projection
    assert result["figures"]["step"]["vision_backward_skipped_when_frozen"]
    plan = result["figures"]["plan"]
    # --quick plans a tiny config (the full-size arms: make bench)
    assert plan["available"] and plan["ratio_arm"] == "plan_tiny" and plan["time_ratio"] > 1
    recompute = result["figures"]["recompute"]["cpu_tiny"]
    assert recompute["vision_recompute"] == {"everywhere": "full", "fix": None}
    assert recompute["full_recompute_everywhere_bytes"] < recompute["vision_recompute_off_bytes"]
    assert recompute["vision_recompute_off_bytes"] < recompute["no_recompute_bytes"]
    audit = result["figures"]["audit"]["selections"]
    assert audit["projection only"]["held_tensors"] > 0 and audit["full fine-tuning"]["held_tensors"] == 0
    assert set(audit["projection only"]["ratio"]) == {"audited steps", "last check", "after the audit"}
    assert "written:" in proc.stdout


def test_only_rejects_unknown_figures():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.run", "--only", "nope"], cwd=ROOT, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "unknown figure" in proc.stderr
