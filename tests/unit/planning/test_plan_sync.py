"""``bridge-freeze plan``'s weight-sync figures (``sync`` in ``--json``) against REAL exports of tiny CPU builds.

For each case a tiny random HF checkpoint is written (``write_tiny_hf_checkpoint``, via test_trainable_sync.py's
``checkpoints`` fixture) and

- planned through the real path: ``plan_model(hf_config=<its config.json>)`` builds the model on the meta device
  from Bridge's conversion of that config and sizes the sync there (no tensor data);
- loaded, built on the CPU, trained 2 steps and exported for real by test_trainable_sync.py's ``train_and_export``:
  Bridge's ``export_hf_weights`` and the plugin's ``export_trainable_hf_weights``.

The plan's ``full_bytes`` / ``tensors`` must equal the byte sum (``numel * element_size``) and count of what the
real full export yields, and its ``trainable_bytes`` / ``trainable_tensors`` both what the real trainable-only
export yields and the full export's tensors that the selection can change, picked by HF-name rules written here
(independent of the plugin and of Bridge's mapping tables). The CPU builds are float32: the plans assume fp32
weights (``param_dtype="fp32"``); one case is repeated in bf16 against ``export_hf_weights(weight_dtype=bf16)``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _shared import as_skyrl_pin  # the stand-in for SkyRL's Bridge pin (its signature)

# test_trainable_sync's folder, as pytest puts it on sys.path when it collects that file first (the whole suite);
# this file run alone, or with its own folder only (the compatibility lane's runs), found no such module
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "export"))
from test_trainable_sync import (  # the shared builds: checkpoint fixture, load + build + train + export
    PROJECTION_ONLY,
    QWEN3_LM_ATTENTION,
    QWEN3_PROJECTION,
    QWEN3_VISION,
    VISION_FROZEN,
    checkpoints,  # noqa: F401  (a fixture, used by name)
    train_and_export,
)

#: Qwen2.5-VL's HF tower (checkpoint names ``visual.``) with its projection (the merger) inside.
QWEN25_MERGER = re.compile(r"^visual\.merger\.")
QWEN25_VISUAL = re.compile(r"^visual\.")

#: family -> selection name -> which HF tensors of the full export can change (written from the HF layouts)
CAN_CHANGE: dict[str, dict[str, Callable[[str], bool]]] = {
    "qwen3_vl": {
        "projection_only": lambda n: bool(QWEN3_PROJECTION.search(n)),
        "vision_frozen": lambda n: not QWEN3_VISION.search(n) or bool(QWEN3_PROJECTION.search(n)),
    },
    "qwen25_vl": {
        "projection_only": lambda n: bool(QWEN25_MERGER.search(n)),
        "vision_frozen": lambda n: not QWEN25_VISUAL.search(n) or bool(QWEN25_MERGER.search(n)),
    },
}
CAN_CHANGE["qwen3_vl_moe"] = CAN_CHANGE["qwen3_vl"]  # the same HF layout of the vision side
SELECTIONS = {"projection_only": PROJECTION_ONLY, "vision_frozen": VISION_FROZEN}
LORA_TARGETS = ["language_model.*linear_qkv", "language_model.*linear_proj"]


def nbytes(stream: list[tuple[str, Any]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in stream)


def plan(checkpoint: Path, selection: dict[str, bool], *, dtype: str = "fp32", lora: list[str] | None = None) -> Any:
    from bridge_freeze_plugin import planning
    from bridge_freeze_plugin.request import FreezeSelection

    def make_lora(_provider: Any) -> Any:
        from megatron.bridge.peft.lora import LoRA

        return LoRA(target_modules=lora, dim=4, alpha=8)

    return planning.plan_model(None, FreezeSelection(**selection), planning.MemoryAssumptions(param_dtype=dtype),
                               hf_config=checkpoint / "config.json", lora=make_lora if lora else None)


def check_against_export(planned: Any, run: dict[str, Any], can_change: Callable[[str], bool], dtype: str) -> None:
    full, sent = run["full"], run["sent"]
    expected = [(n, t) for n, t in full if can_change(n)]
    assert expected and len(expected) < len(full)  # a real selection: some tensors can change, some cannot
    assert {n for n, _ in sent} == {n for n, _ in expected}
    assert {t.dtype for _, t in full} == {getattr(__import__("torch"), dtype)}
    assert planned.sync is not None and planned.sync_unavailable is None
    assert planned.sync.as_dict() == {
        "dtype": dtype,
        "full_bytes": nbytes(full),
        "trainable_bytes": nbytes(expected),
        "ratio": nbytes(expected) / nbytes(full),
        "tensors": len(full),
        "trainable_tensors": len(expected),
        "left_out_tensors": 0,
        "left_out_parameters": 0,
    }
    assert planned.sync.trainable_bytes == nbytes(sent) and planned.sync.trainable_tensors == len(sent)


@pytest.fixture(scope="module")
def exported(checkpoints) -> Callable[..., dict[str, Any]]:  # noqa: F811
    """``train_and_export`` once per (family, selection, LoRA targets)."""
    done: dict[tuple[Any, ...], dict[str, Any]] = {}

    def get(family: str, selection: str, lora: list[str] | None = None) -> dict[str, Any]:
        key = (family, selection, tuple(lora or ()))
        if key not in done:
            done[key] = train_and_export(checkpoints(family), family, lora=lora, **SELECTIONS[selection])
        return done[key]

    return get


@pytest.mark.parametrize("family", ["qwen3_vl", "qwen3_vl_moe", "qwen25_vl"])
@pytest.mark.parametrize("selection", ["projection_only", "vision_frozen"])
def test_plan_sync_bytes_equal_a_real_export(family, selection, checkpoints, exported):  # noqa: F811
    run = exported(family, selection)
    planned = plan(checkpoints(family), SELECTIONS[selection])
    check_against_export(planned, run, CAN_CHANGE[family][selection], "float32")


#: Qwen2-Audio with the language model and audio encoder frozen: only the audio projection can change.
AUDIO_PROJECTION_ONLY = {"freeze_language_model": True, "freeze_audio_model": True}


def test_plan_sync_of_qwen2_audio_equals_a_real_export(checkpoints):  # noqa: F811
    """transformers 5.12 would save Qwen2-Audio's language model as ``language_model.model.model.*``; published
    checkpoints (and the harness's, renamed) say ``language_model.model.*``, as Bridge's mapping does. The plan's
    layout listing is transformers' save, so Bridge left the whole language model out of the sized sync (2.6 of
    16.8 GB on the published 7B config); the real export of a real checkpoint sends it."""
    run = train_and_export(checkpoints("qwen2_audio"), "qwen2_audio", **AUDIO_PROJECTION_ONLY)
    assert any(n.startswith("language_model.model.layers.") for n, _ in run["full"])
    planned = plan(checkpoints("qwen2_audio"), AUDIO_PROJECTION_ONLY)
    check_against_export(planned, run, lambda n: n.startswith("multi_modal_projector."), "float32")


def test_plan_sync_of_qwen3_asr_equals_a_real_export(checkpoints):  # noqa: F811
    """Qwen3-ASR's HF class is not transformers' (the maker's, as Bridge vendors it), so the plan sizes the sync
    from Bridge's conversion of the config alone; the real export of a real checkpoint (the vendored class's
    ``save_pretrained``) must be what it planned. Audio projection only: ``proj1`` / ``proj2`` in the audio tower."""
    run = train_and_export(checkpoints("qwen3_asr"), "qwen3_asr", **AUDIO_PROJECTION_ONLY)
    assert any(n.startswith("thinker.model.layers.") for n, _ in run["full"])
    planned = plan(checkpoints("qwen3_asr"), AUDIO_PROJECTION_ONLY)
    check_against_export(planned, run, lambda n: bool(re.match(r"thinker\.audio_tower\.proj[12]\.", n)), "float32")


def test_plan_sync_in_bf16_equals_an_export_cast_to_bf16(checkpoints, exported):  # noqa: F811
    import torch

    run = exported("qwen3_vl", "projection_only")
    bf16 = {"full": list(run["bridge"].export_hf_weights(run["chunks"], cpu=True, show_progress=False,
                                                         weight_dtype=torch.bfloat16)),
            "sent": list(run["export"](run["bridge"], run["chunks"], show_progress=False,
                                       weight_dtype=torch.bfloat16))}
    planned = plan(checkpoints("qwen3_vl"), PROJECTION_ONLY, dtype="bf16")
    check_against_export(planned, bf16, CAN_CHANGE["qwen3_vl"]["projection_only"], "bfloat16")
    assert planned.sync.full_bytes * 2 == nbytes(run["full"])  # every tensor of this model is floating point


def test_plan_sync_with_lora_on_the_language_model_counts_the_merged_bases(checkpoints, exported):  # noqa: F811
    """LoRA on the LM's attention + the projection at full rank: the sync sends the projection and the attention
    weights the adapters are merged into (q/k/v/o of every layer)."""
    run = exported("qwen3_vl", "projection_only", LORA_TARGETS)
    planned = plan(checkpoints("qwen3_vl"), PROJECTION_ONLY, lora=LORA_TARGETS)
    assert planned.total.count.adapter_tensors > 0  # the plan did build the adapters
    check_against_export(planned, run,
                         lambda n: bool(QWEN3_PROJECTION.search(n) or QWEN3_LM_ATTENTION.search(n)), "float32")


def test_a_tiny_plan_says_why_it_has_no_sync_figure(cpu_bridge):
    from bridge_freeze_plugin import planning
    from bridge_freeze_plugin.planning._sync_bytes import TINY_UNAVAILABLE
    from bridge_freeze_plugin.request import FreezeSelection

    planned = planning.plan_model("qwen3_vl", FreezeSelection(**PROJECTION_ONLY), planning.MemoryAssumptions(),
                                  tiny=True)
    document = planned.as_dict(with_params=False)
    assert planned.sync is None and document["sync"] is None
    assert document["sync_unavailable"] == TINY_UNAVAILABLE and "--hf-config" in TINY_UNAVAILABLE


def test_the_plan_command_prints_the_sync_line_and_json_key(checkpoints, capsys):  # noqa: F811
    import json

    from bridge_freeze_plugin.cli import main

    config = str(checkpoints("qwen25_vl") / "config.json")
    flags = ["--freeze-language-model", "--freeze-vision-model", "--param-dtype", "fp32"]
    assert main(["plan", "--hf-config", config, *flags, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert set(document["sync"]) == {"dtype", "full_bytes", "trainable_bytes", "ratio", "tensors",
                                     "trainable_tensors", "left_out_tensors", "left_out_parameters"}
    assert "sync_unavailable" not in document
    assert main(["plan", "--hf-config", config, *flags]) == 0
    text = capsys.readouterr().out
    sync = document["sync"]
    line = next(line for line in text.splitlines() if line.startswith("one RL weight sync"))
    full, trainable = sync["full_bytes"], sync["trainable_bytes"]
    assert 10**6 <= full < 10**9 and 10**3 <= trainable < 10**6  # the units below
    assert line.startswith(f"one RL weight sync (float32): full {full / 1e6:.1f} MB ({full / 2**20:.1f} MiB) in "
                           f"{sync['tensors']:,} HF tensors (export_hf_weights), trainable {trainable / 1e3:.1f} kB "
                           f"({trainable / 2**10:.1f} KiB) in {sync['trainable_tensors']:,} ")


def test_plan_sync_is_the_same_on_a_build_conversion_tasks_without_weight_dtype(checkpoints, exported,  # noqa: F811
                                                                                 monkeypatch):
    """SkyRL's Bridge pin (91a15142) has no ``weight_dtype`` on ``build_conversion_tasks``: the plan's sizing
    passes only what the signature takes and sizes the dtype itself, so its figures are those of Bridge 0.6.2."""
    from bridge_freeze_plugin.planning import _sync_bytes

    run = exported("qwen3_vl", "projection_only")
    real = plan(checkpoints("qwen3_vl"), PROJECTION_ONLY, dtype="bf16").sync.as_dict()
    made = _sync_bytes.bridge_for_plan
    monkeypatch.setattr(_sync_bytes, "bridge_for_plan", lambda hf_config: as_skyrl_pin(made(hf_config)))
    assert plan(checkpoints("qwen3_vl"), PROJECTION_ONLY, dtype="bf16").sync.as_dict() == real
    check_against_export(plan(checkpoints("qwen3_vl"), PROJECTION_ONLY), run,
                         CAN_CHANGE["qwen3_vl"]["projection_only"], "float32")
