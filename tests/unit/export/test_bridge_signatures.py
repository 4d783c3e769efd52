"""Calls into Bridge pass only the keywords the installed Bridge takes (issue 36): ``weight_dtype`` on
``build_conversion_tasks`` is in 0.6.2 and main (0.7.0), not in the 0.6.0-era commit SkyRL pins (91a15142).

Each case runs on the real Bridge 0.6.2 and on a stand-in for SkyRL's: the same real bridge whose model bridge's
``build_conversion_tasks`` has that commit's signature ``(hf_pretrained, megatron_model)`` (that Bridge cannot
be installed in CI, which has no network for git sources). The names sent must be exactly the HF tensors the
selection can change (written from the HF layout) on both.
"""

from __future__ import annotations

from typing import Any

import pytest
from _shared import as_skyrl_pin
from test_trainable_sync import (  # the shared build: checkpoint fixture, load + build + train + export
    PROJECTION_ONLY,
    QWEN3_PROJECTION,
    checkpoints,  # noqa: F401  (a fixture, used by name)
    takes_weight_dtype,
    train_and_export,
)


@pytest.fixture(scope="module")
def run(checkpoints) -> dict[str, Any]:  # noqa: F811
    return train_and_export(checkpoints("qwen3_vl"), "qwen3_vl", **PROJECTION_ONLY)


def test_the_trainable_export_adapts_to_a_build_conversion_tasks_without_weight_dtype(run):
    from bridge_freeze_plugin import export_trainable_hf_weights

    expected = [n for n, _ in run["full"] if QWEN3_PROJECTION.search(n)]
    assert expected and len(expected) < len(run["full"])
    assert [n for n, _ in run["sent"]] == expected  # Bridge 0.6.2
    older = as_skyrl_pin(run["bridge"])
    assert "weight_dtype" not in __import__("inspect").signature(older._model_bridge.build_conversion_tasks).parameters
    sent = list(export_trainable_hf_weights(older, run["chunks"], cpu=True, show_progress=False))
    assert [n for n, _ in sent] == expected
    assert all(a.equal(b) for (_, a), (_, b) in zip(sent, run["sent"], strict=True))


def test_a_weight_dtype_the_older_bridge_cannot_honour_is_refused_by_name(run):
    import torch

    from bridge_freeze_plugin import export_trainable_hf_weights
    from bridge_freeze_plugin.errors import TrainableSyncError

    if takes_weight_dtype(run["bridge"]):  # 0.6.2 takes it; the stand-in for SkyRL's pin does not
        cast = list(export_trainable_hf_weights(run["bridge"], run["chunks"], show_progress=False,
                                                weight_dtype=torch.bfloat16))
        assert {t.dtype for _, t in cast} == {torch.bfloat16}
    older = as_skyrl_pin(run["bridge"]) if takes_weight_dtype(run["bridge"]) else run["bridge"]  # the lane: 0.6.0
    with pytest.raises(TrainableSyncError, match=r"weight_dtype=torch.bfloat16.*takes no weight_dtype.*leave"):
        export_trainable_hf_weights(older, run["chunks"], weight_dtype=torch.bfloat16)
