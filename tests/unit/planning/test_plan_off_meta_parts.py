"""``plan`` per rank with the distributed optimizer on a provider that builds a part off the meta device.

EXAONE 4.5's provider builds its vision tower and merger on the CPU even in a meta-device build (Bridge 0.6.2). With
the distributed optimizer, megatron-core's DDP lays every trainable parameter into a parameter buffer on the
buffers' device (meta here), and a CPU parameter cannot take that data: ``plan`` failed on the published config
(``RuntimeError: ... variable.set_data(tensor) ... incompatible tensor type``), as Bridge's own EXAONE 4.5 recipe
plans it (``plan --recipe exaone45_vl_33b_sft_16gpu_h100_bf16_config``).
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "fixtures" / "hf_configs" / "exaone45_vl" / "config.json"


def _plan(*extra: str) -> dict:
    from bridge_freeze_plugin.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(["plan", "--hf-config", str(CONFIG), "--pipeline-model-parallel-size", "2",
                     "--freeze-vision-model", "--json", *extra])
    document = json.loads(buffer.getvalue())
    assert code == 0, document.get("error")
    return document


@pytest.mark.usefixtures("cpu_bridge")
def test_exaone45_plans_per_rank_with_the_distributed_optimizer():
    distributed = _plan("--use-distributed-optimizer")
    assert distributed["layout"]["use_distributed_optimizer"] is True
    rows = distributed["per_rank"]
    assert sorted(r["pp"] for r in rows) == [0, 1]
    # the merger (the projection, built on the CPU) trains on the first stage: vision frozen, the LM's first layers
    # and the merger train there, so the first stage trains less than it holds by exactly the frozen tower
    frozen_tower = sum(p["numel"] for p in distributed["parameters"]
                       if p["name"].startswith("vision_model.") and not p["name"].startswith("vision_model.merger."))
    first = next(r for r in rows if r["pp"] == 0)
    assert first["parameters"] - first["trainable"] == frozen_tower
