"""The GPU benchmark's summary (benchmarks/gpu_memory.py), checked here on arm results shaped as an arm process
writes them (``DDPRun.as_dict()`` plus the arm's own keys): the measurement itself needs CUDA, the summary must
not fail after a GPU run has spent its minutes. No model is built."""

from __future__ import annotations

from benchmarks.gpu_memory import compare, summarize, table
from bridge_freeze_harness.ddp_steps import DDPRun

PROJECTION = 100_714_496
PLAN = {"parameters": 931_156_992, "trainable": PROJECTION, "weight_bytes": 1_862_313_984,
        "grad_bytes": 4 * PROJECTION, "optimizer_bytes": 12 * PROJECTION, "activation_bytes": 1, "total_bytes": 2}


def _arm(arm: str, step_s: float, peak: int) -> dict:
    run = DDPRun(names=["a", "b"], trainable=["a"], in_buffers=["a"], trainable_on_cuda=True,
                 trainable_elements=PROJECTION, weight_bytes=1_862_313_984, grad_buffer_bytes=4 * PROJECTION + 512,
                 grad_bytes_unpadded=4 * PROJECTION, optimizer_state_bytes=8 * PROJECTION, optimizer_step_bytes=96,
                 main_param_bytes=4 * PROJECTION, memory_after_step1=peak - 10, peak_memory=peak,
                 losses=[2.0, 1.5], step_seconds=[1.0, step_s, step_s])
    return {"selection": "projection only", "arm": arm, "specs": "local", "device": "GPU", "plugin_loaded": True,
            "lora": None, "batch": {}, **run.as_dict(), "step_median_s": step_s, "losses_fell": True}


def test_medians_spreads_and_the_plan_beside_each_arm():
    results = [_arm("plugin", 0.08, 3_000), _arm("plugin", 0.10, 3_100), _arm("plugin", 0.09, 3_050),
               _arm("bridge", 0.12, 3_000), {"selection": "full", "arm": "plugin", "error": "boom"}]
    rows = {(r["selection"], r["arm"]): r for r in summarize(results, {"projection only": PLAN})}
    plugin = rows[("projection only", "plugin")]
    assert plugin["repeats"] == 3 and plugin["exact_bytes_same_in_every_repeat"]
    assert plugin["step_s"] == {"median": 0.09, "min": 0.08, "max": 0.10, "n": 3}
    assert plugin["peak_memory"]["median"] == 3_050
    diff = plugin["against_plan"]["diff_bytes"]
    assert diff == {"weights": 0, "grad_unpadded": 0, "grad_buffer_padding": 512, "optimizer": 0, "trainable": 0}
    assert any("pads" in note for note in plugin["against_plan"]["notes"])
    assert rows[("full", "plugin")]["errors"] == ["boom"] and rows[("full", "plugin")]["repeats"] == 0
    assert len(rows) == 10  # every (selection, arm) has a row, measured or not
    lines = table({"arms": list(rows.values())})
    assert any("not measured: boom" in value for _, value, _ in lines)


def test_an_arm_without_the_plugin_is_flagged_where_it_differs_from_plan():
    other = {**_arm("bridge", 0.1, 1), "optimizer_state_bytes": 0}
    assert any("does not use the plugin" in note for note in compare(other, PLAN)["notes"])
