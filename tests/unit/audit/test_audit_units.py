"""The run-time audit's pieces without a model: its settings, its fingerprints, its names, its seam, its block."""

from __future__ import annotations

import inspect
import sys
import types

import pytest
import torch

from bridge_freeze_plugin import InvalidFreezeConfigError
from bridge_freeze_plugin.audit import AuditReport, Finding, PartAudit, compress
from bridge_freeze_plugin.audit._fingerprint import Fingerprints, checksum
from bridge_freeze_plugin.request import DEFAULT_STEPS, Part, audit_settings


def _source(**fields):
    return types.SimpleNamespace(**fields)


def test_settings_default_field_and_variables(monkeypatch):
    monkeypatch.delenv("BRIDGE_FREEZE_AUDIT_STEPS", raising=False)
    monkeypatch.delenv("BRIDGE_FREEZE_AUDIT_STRICT", raising=False)
    assert audit_settings(_source()).steps == DEFAULT_STEPS == 3
    assert audit_settings(_source()).strict is False and audit_settings(_source()).on
    assert audit_settings(_source(audit_steps=5)).steps_source == "audit_steps"
    off = audit_settings(_source(audit_steps=0))
    assert not off.on and "off (audit_steps=0)" in off.describe()
    monkeypatch.setenv("BRIDGE_FREEZE_AUDIT_STEPS", " 0 ")
    assert audit_settings(_source(audit_steps=5)).steps == 0  # the variable wins over the field
    monkeypatch.setenv("BRIDGE_FREEZE_AUDIT_STEPS", "")
    assert audit_settings(_source(audit_steps=5)).steps == 5  # empty: unset
    monkeypatch.setenv("BRIDGE_FREEZE_AUDIT_STRICT", "Yes")
    assert audit_settings(_source()).strict
    monkeypatch.setenv("BRIDGE_FREEZE_AUDIT_STRICT", "off")
    assert not audit_settings(_source(audit_strict=True)).strict


@pytest.mark.parametrize(("fields", "env", "match"), [
    ({"audit_steps": -1}, {}, r"audit_steps=-1 on P: .* 0 or more"),
    ({"audit_steps": True}, {}, r"audit_steps=True on P"),
    ({"audit_steps": 2.0}, {}, r"audit_steps=2\.0 on P"),
    ({"audit_strict": "yes"}, {}, r"audit_strict='yes' on P must be True or False"),
    ({}, {"BRIDGE_FREEZE_AUDIT_STEPS": "many"}, r"BRIDGE_FREEZE_AUDIT_STEPS='many' \(building P\)"),
    ({}, {"BRIDGE_FREEZE_AUDIT_STEPS": "-2"}, r"BRIDGE_FREEZE_AUDIT_STEPS='-2'"),
    ({}, {"BRIDGE_FREEZE_AUDIT_STRICT": "maybe"}, r"BRIDGE_FREEZE_AUDIT_STRICT='maybe' \(building P\) is not a bool"),
])
def test_a_malformed_setting_names_itself_the_model_and_the_fix(monkeypatch, fields, env, match):
    for name in ("BRIDGE_FREEZE_AUDIT_STEPS", "BRIDGE_FREEZE_AUDIT_STRICT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidFreezeConfigError, match=match):
        audit_settings(_source(**fields), "P")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool])
def test_a_cpu_fingerprint_sees_any_change_bit_for_bit(dtype):
    tensor = (torch.arange(64) % 3).to(dtype).reshape(8, 8)
    prints = Fingerprints([("t", tensor)])
    assert prints.changed() == [] and prints.bytes == tensor.numel() * tensor.element_size()
    flat = tensor.view(-1)
    flat[17] = 1 if flat[17] == 0 else 0
    assert prints.changed() == ["t"]


def test_a_cpu_fingerprint_tells_a_nan_payload_and_a_signed_zero():
    tensor = torch.zeros(4)
    prints = Fingerprints([("z", tensor)])
    tensor[1] = -0.0  # equal as a number, another bit pattern
    assert prints.changed() == ["z"]
    nan = torch.full((2,), float("nan"))
    prints = Fingerprints([("n", nan)])
    assert prints.changed() == []  # NaN compared by its bits: unchanged is unchanged


def test_the_checksum_changes_with_any_single_element_and_only_then():
    torch.manual_seed(0)
    tensor = torch.randn(1000, dtype=torch.bfloat16)
    reference = checksum(tensor)
    assert torch.equal(checksum(tensor.clone()), reference)
    for index in (0, 1, 511, 999):
        changed = tensor.clone()
        changed.view(torch.int16)[index] ^= 1  # the lowest bit of one element
        assert not torch.equal(checksum(changed), reference), index
    swapped = tensor.clone()
    swapped[[3, 4]] = swapped[[4, 3]]  # the same values elsewhere: the weighted sum sees the order
    assert tensor[3] == tensor[4] or not torch.equal(checksum(swapped), reference)


def test_checksum_slices_give_the_sums_of_the_whole(monkeypatch):
    from bridge_freeze_plugin.audit import _fingerprint

    tensor = torch.arange(10, dtype=torch.int32)
    whole = checksum(tensor)
    monkeypatch.setattr(_fingerprint, "SLICE", 3)
    assert torch.equal(checksum(tensor), whole)
    bits = tensor.to(torch.int64)
    assert whole.tolist() == [int(bits.sum()), int((bits * (torch.arange(10) * 2 + 1)).sum())]


def test_names_are_compressed_by_their_numbers():
    names = [f"m.layers.{i}.w" for i in range(3)] + ["m.head.weight", "m.experts.0.fc1.weight"]
    assert compress(names) == ["m.experts.0.fc1.weight", "m.head.weight", "m.layers.*.w (3)"]
    assert compress(["0.weight", "1.weight"]) == ["*.weight (2)"]


def _report(**fields):
    base = dict(provider="P", family="f", model_name=None, steps=3,
                parts=(PartAudit(Part.LANGUAGE_MODEL, 2, 2, (0.5, 0.25, 0.125)), PartAudit(Part.VISION_MODEL)))
    return AuditReport(**{**base, **fields})


def test_the_block_and_the_warning_name_what_was_found():
    detached = Finding(Part.LANGUAGE_MODEL, "detached", ("m.layers.0.w", "m.layers.1.w"))
    routed = Finding(Part.LANGUAGE_MODEL, "routing", ("m.experts.3.w",))
    report = _report(findings=(detached, routed), held_tensors=7, held_buffers=1, held_through=2)
    text = report.format()
    assert "bridge-freeze audit: P, family f, optimizer step(s) 1-3: what learned" in text
    assert "5.000e-01" in text and "2 trainable tensor(s) got no gradient" in text
    assert "7 tensor(s) and 1 buffer(s) unchanged through optimizer step 2" in text
    assert "an MoE expert to which no token was routed" in text  # said, not warned
    (warning,) = report.warnings()
    assert warning.startswith("bridge-freeze audit: 2 trainable tensor(s) of the language model got no gradient in "
                              "optimizer step(s) 1-3 (P, family f): m.layers.*.w (2).")
    assert not report.ok and report.as_dict()["findings"][1]["warned"] is False


def test_a_part_without_input_says_what_freezing_it_saves():
    finding = Finding(Part.VISION_MODEL, "no_input", ("v.w",), saving=(3 << 30, 6 << 30), saving_basis="b")
    sentence = finding.sentence("1-3", "P")
    assert "none of the vision encoder's modules ran in the audited steps (batches without image input)" in sentence
    assert "freeze the vision encoder (freeze_vision_model=True): that saves 3.0 GiB of gradient buffers and " \
           "6.0 GiB of optimizer state (b)" in sentence


def test_the_seam_keeps_everything_the_function_had_and_reaches_every_holder(monkeypatch):
    from bridge_freeze_plugin.audit import _seam
    from bridge_freeze_plugin.prewrap import STATE

    def finalize_model_grads(model, num_tokens=None, pg_collection=None, force_all_reduce=False):
        """megatron-core's docstring."""
        calls.append(model)

    calls: list = []
    home = types.ModuleType("fake_core_finalize")
    home.finalize_model_grads = finalize_model_grads
    holder = types.ModuleType("fake_trainer")
    holder.finalize_model_grads = finalize_model_grads
    monkeypatch.setitem(sys.modules, home.__name__, home)
    monkeypatch.setitem(sys.modules, holder.__name__, holder)
    monkeypatch.setattr(STATE, "active", True)
    try:
        _seam.install(home)
        wrapped = home.finalize_model_grads
        assert holder.finalize_model_grads is wrapped and wrapped is not finalize_model_grads
        assert wrapped.__wrapped__ is finalize_model_grads and wrapped.__doc__ == "megatron-core's docstring."
        assert wrapped.__name__ == "finalize_model_grads"
        assert inspect.signature(wrapped) == inspect.signature(finalize_model_grads)
        wrapped(["a model"], 3)
        assert calls == [["a model"]]
        _seam.install(home)  # idempotent: not wrapped twice
        assert home.finalize_model_grads is wrapped
    finally:
        for module in (home, holder):
            STATE.guarded.pop(module, None)
