"""The plugin's guards on Bridge's adapter-only exports: Bridge's own signatures, and every full-rank choice.

Bridge's ``AutoBridge.export_adapter_weights`` / ``save_hf_adapter`` / ``export_adapter_ckpt`` write adapters only.
The plugin refuses them for a run that also trains tensors at full rank (they would be silently missing). The
wrappers must (1) accept every call Bridge's own method accepts, positional or keyword, with Bridge's
signature, and (2) see every full-rank choice: a part left trainable by the flags, or tensors chosen by a
train pattern.
"""

from __future__ import annotations

import inspect

import pytest
import yaml
from _shared import VLM_FLAGS

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin.export._adapters import (
    GUARDS,
    _guarded,
    full_rank_parts_of_checkpoint,
    full_rank_parts_of_model,
)

AUTO_BRIDGE_METHODS = sorted(GUARDS)


def _lora(targets):
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=list(targets), dim=4, alpha=8)


def _build(selection, targets):
    provider = bfp.make_freezable(make_provider("qwen3_vl"), selection)
    provider.register_pre_wrap_hook(_lora(targets))
    return build_tiny_chunks("qwen3_vl", provider=provider)


@pytest.mark.parametrize("method", AUTO_BRIDGE_METHODS)
def test_guards_keep_bridges_signature(cpu_bridge, method):
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    guarded = getattr(AutoBridge, method)
    original = guarded.__bridge_freeze_wrapped__
    assert inspect.signature(guarded) == inspect.signature(original)


def _recorder():
    """A function with ``save_hf_adapter``'s signature that records what reached it."""
    calls = []

    def save_hf_adapter(self, model, path, peft_config, base_model_name_or_path=None, show_progress=True,
                        exclude_adapter_base_prefixes=None):
        calls.append((model, path, peft_config, base_model_name_or_path))
        return "written"

    return save_hf_adapter, calls


def test_keyword_and_positional_calls_reach_bridge_or_are_refused(cpu_bridge):
    """The documented keyword form ``save_hf_adapter(model=..., path=..., peft_config=...)`` works as Bridge's."""
    adapters_only = _build(bfp.FreezeSelection(True, True, True), ["linear_qkv"])
    with_projection = _build(bfp.FreezeSelection(True, True, False), ["linear_qkv"])
    original, calls = _recorder()
    guarded = _guarded("save_hf_adapter", original, full_rank_parts_of_model)
    assert guarded(None, model=adapters_only, path="out", peft_config="cfg") == "written"
    assert guarded(None, adapters_only, "out", "cfg", base_model_name_or_path="base") == "written"
    assert guarded(None, adapters_only, path="out", peft_config="cfg") == "written"
    assert [c[1:] for c in calls] == [("out", "cfg", None), ("out", "cfg", "base"), ("out", "cfg", None)]
    for call in (lambda: guarded(None, model=with_projection, path="out", peft_config="cfg"),
                 lambda: guarded(None, with_projection, "out", "cfg")):
        with pytest.raises(bfp.AdapterExportError, match="vision_projection at full rank"):
            call()
    assert len(calls) == 3
    with pytest.raises(TypeError):  # a call Bridge rejects is still Bridge's TypeError
        guarded(None, model=adapters_only)


def test_real_autobridge_methods_refuse_keyword_calls_of_full_rank_runs(cpu_bridge, tmp_path):
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    chunks = _build(bfp.FreezeSelection(True, True, False), ["linear_qkv"])
    with pytest.raises(bfp.AdapterExportError, match="vision_projection at full rank"):
        AutoBridge.save_hf_adapter(None, model=chunks, path=tmp_path, peft_config=None)
    with pytest.raises(bfp.AdapterExportError, match="vision_projection at full rank"):
        list(AutoBridge.export_adapter_weights(None, model=chunks, cpu=True))


def test_a_train_pattern_is_a_full_rank_choice_for_the_model_guard(cpu_bridge):
    """All three flags (adapters only) plus a train pattern: the matched tensors train at full rank."""
    chunks = _build(
        bfp.FreezeSelection(True, True, True, train_patterns=[r"vision_model\.merger\..*"]),
        ["language_model.*linear_qkv"],
    )
    trained = {n for c in chunks for n, p in c.named_parameters() if p.requires_grad and ".adapter." not in n}
    assert trained and all(n.startswith("vision_model.merger.") for n in trained)
    assert full_rank_parts_of_model(chunks) == ["vision_projection"]


@pytest.mark.parametrize(
    ("flags", "patterns", "expected"),
    [
        ((True, True, True), [r"vision_model\.merger\..*"],
         [r"the tensors matched by train_patterns=['vision_model\\.merger\\..*']"]),
        ((True, False, True), ["language_model\\.embedding\\..*"],
         ["vision_model", "the tensors matched by train_patterns=['language_model\\\\.embedding\\\\..*']"]),
        ((True, True, True), [], []),
        ((False, False, False), [], []),
    ],
)
def test_a_train_pattern_is_a_full_rank_choice_for_the_checkpoint_guard(tmp_path, flags, patterns, expected):
    model = {**dict(zip(VLM_FLAGS, flags, strict=True)), "train_patterns": patterns}
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump({"model": model, "peft": {"dim": 4}}))
    assert full_rank_parts_of_checkpoint(tmp_path) == expected
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump({"model": model, "peft": None}))
    assert full_rank_parts_of_checkpoint(tmp_path) == []


def test_a_model_without_parameters_is_left_to_bridge(cpu_bridge):
    """Bridge's own test passes ``[object()]`` to ``export_adapter_weights``; the guard must not be what fails."""
    original, _ = _recorder()
    guarded = _guarded("save_hf_adapter", original, full_rank_parts_of_model)
    assert guarded(None, model=[object()], path="out", peft_config="cfg") == "written"
    assert full_rank_parts_of_model(object()) == []
