"""The guarantee sees through wrappers and refuses unknown trainable modules."""

from __future__ import annotations

import pytest
from _shared import PROJECTION_ONLY, QWEN3_PROJECTION, names, trainable

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import (
    FreezeGuaranteeError,
    make_freezable,
)

# ---- 3. the guarantee sees through wrappers and refuses unknown trainable modules ----


class _Renamed:
    """A chunk wrapper that renames every parameter (as torch.compile's ``_orig_mod.`` does)."""

    @staticmethod
    def wrap(chunks):
        import torch

        out = []
        for chunk in chunks:
            holder = torch.nn.Module()
            holder.inner = chunk
            holder.config = chunk.config  # what Bridge reads off each chunk after the pre-wrap hook
            out.append(holder)
        return out


def _unfreeze_all(chunks):
    for chunk in chunks:
        for p in chunk.parameters():
            p.requires_grad_(True)
    return chunks


def test_a_renaming_hook_cannot_unfreeze_the_frozen_language_model(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    provider.register_pre_wrap_hook(lambda chunks: _unfreeze_all(_Renamed.wrap(chunks)))
    with pytest.raises(FreezeGuaranteeError) as err:
        build_tiny_chunks("qwen3_vl", provider=provider)
    bad = {v.name for v in err.value.violations}
    assert any(n.startswith("inner.language_model.") for n in bad)
    assert not any(".merger." in n or "deepstack_merger_list" in n for n in bad)


def test_a_renaming_hook_keeps_each_part_in_the_report(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    provider.register_pre_wrap_hook(_Renamed.wrap)
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)
    report = bfp.last_report(provider)
    assert report is not None and [c.part.value for c in report.parts] == [
        "language_model", "vision_model", "vision_projection"]  # nothing filed under "other"
    expected = {n.removeprefix("inner.") for n in names(chunks) if QWEN3_PROJECTION.match(n.removeprefix("inner."))}
    assert {n.removeprefix("inner.") for n in trainable(chunks)} == expected
    assert report.part(bfp.Part.VISION_PROJECTION).trainable_tensors == len(expected)


def _add_head(chunks):
    import torch

    chunks[0].head = torch.nn.Linear(4, 4)  # a new trainable module that no prefix covers
    return chunks


def test_a_new_trainable_module_outside_every_prefix_is_a_violation(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    provider.register_pre_wrap_hook(_add_head)
    with pytest.raises(FreezeGuaranteeError) as err:
        build_tiny_chunks("qwen3_vl", provider=provider)
    assert {v.name for v in err.value.violations} == {"head.weight", "head.bias"}
    assert "no prefix" in str(err.value)
