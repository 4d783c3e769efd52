"""Every parameter that trains leaves with the trainable-only weight sync, or the sync refuses (issue 37, item 3).

Real tiny Bridge models built from tiny random HF checkpoints (the user's flow: ``AutoBridge.from_hf_pretrained``
-> provider -> build). A bridge whose mappings do not cover a trainable parameter (another model's bridge; a
LoRA ``LinearAdapter`` that no export carries) made :func:`export_trainable_hf_weights` send nothing for it, every
step, with no error; it now raises :class:`TrainableSyncError` naming the parameter, the model and what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _family_parts import part_of


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, cpu_bridge) -> Callable[[str], Path]:
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    root = tmp_path_factory.mktemp("hf")
    written: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in written:
            written[family] = write_tiny_hf_checkpoint(family, root / family, seed=0)
        return written[family]

    return get


def _built(checkpoint: Path, family: str, hook: Any = None, **fields: Any) -> tuple[Any, list[Any]]:
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.hf_checkpoint import build_hf_chunks, cpu_provider

    bridge = AutoBridge.from_hf_pretrained(str(checkpoint))
    provider = cpu_provider(bridge, family, **fields)
    if hook is not None:
        provider.register_pre_wrap_hook(hook)
    return bridge, build_hf_chunks(family, provider)


def test_another_models_bridge_is_refused_naming_a_trainable_parameter(checkpoints):
    from megatron.bridge import AutoBridge

    from bridge_freeze_plugin import TrainableSyncError, export_trainable_hf_weights

    _, chunks = _built(checkpoints("qwen3_vl"), "qwen3_vl", freeze_language_model=True, freeze_vision_model=True)
    trainable = sorted(n for c in chunks for n, p in c.named_parameters() if p.requires_grad)
    assert trainable and all(n.startswith("vision_model.") for n in trainable)
    other = AutoBridge.from_hf_pretrained(str(checkpoints("gemma3_vl")))
    with pytest.raises(TrainableSyncError) as err:
        list(export_trainable_hf_weights(other, chunks, show_progress=False))
    message = str(err.value)
    assert f"{len(trainable)} trainable parameter(s) of {type(chunks[0]).__name__}" in message
    assert trainable[0] in message and "AutoBridge the model was built from" in message


def test_the_right_bridge_still_syncs(checkpoints):
    from bridge_freeze_plugin import export_trainable_hf_weights

    bridge, chunks = _built(checkpoints("qwen3_vl"), "qwen3_vl", freeze_language_model=True,
                            freeze_vision_model=True)
    sent = [n for n, _ in export_trainable_hf_weights(bridge, chunks, show_progress=False)]
    assert sent and all(n.startswith("model.visual.") for n in sent)


def _plain_lora_on_qwen25_vision_qkv(checkpoints: Callable[[str], Path]) -> tuple[Any, list[Any], list[str]]:
    """LoRA with no plugin flag (left to Bridge) on Qwen2.5-VL's HF ``visual.blocks.*.attn.qkv``. Bridge 0.6.2 makes
    bare ``LinearAdapter`` copies (``<target>.linear_{in,out}``), which no conversion task carries (the merge handles
    ``to_wrap`` bases only); 0.7.0 keeps the layer as ``to_wrap`` (``<target>.adapter.linear_{in,out}``), exported."""
    from megatron.bridge.peft.lora import LoRA

    peft = LoRA(target_modules=["visual.blocks.*qkv"], dim=4, alpha=8)

    def lora(model: Any) -> Any:
        model = peft(model, training=True)
        peft.set_params_to_save(model)
        return model

    bridge, chunks = _built(checkpoints("qwen25_vl"), "qwen25_vl", hook=lora)
    adapters = sorted(n for c in chunks for n, p in c.named_parameters() if p.requires_grad)
    form = ".attn.qkv.adapter.linear_" if _kept() else ".attn.qkv.linear_"
    assert adapters and all(form in n for n in adapters)
    return bridge, chunks, adapters


def _kept() -> bool:
    """Whether the installed Bridge's LoRA keeps a plain ``torch.nn.Linear`` as ``to_wrap`` (its exports carry it)."""
    from bridge_freeze_plugin.prewrap import bridge_lora_wraps_plain_linear

    kept = bridge_lora_wraps_plain_linear()
    assert kept is not None
    return kept


def test_plain_lora_on_an_hf_towers_linear_follows_the_installed_bridge_in_the_sync(checkpoints):
    """Refused where the installed Bridge's exports drop the adapters; where they carry them (0.7.0), the trainable
    sync sends the merged tower weights, the same tensors as Bridge's merged export, and the receiver's layout
    says the same names (issue 49)."""
    import torch

    from bridge_freeze_plugin import TrainableSyncError, export_trainable_hf_weights
    from bridge_freeze_plugin.export import trainable_hf_weights_info

    bridge, chunks, adapters = _plain_lora_on_qwen25_vision_qkv(checkpoints)
    if not _kept():
        with pytest.raises(TrainableSyncError) as err:
            list(export_trainable_hf_weights(bridge, chunks, show_progress=False))
        assert adapters[0] in str(err.value) and "LinearAdapter" in str(err.value)
        return
    sent = dict(export_trainable_hf_weights(bridge, chunks, cpu=True, show_progress=False))
    bases = sorted({n.partition(".adapter.")[0] for n in adapters})
    assert sorted(sent) == [f"{base}.weight" for base in bases]
    merged = {n: t for n, t in bridge.export_hf_weights(chunks, cpu=True, show_progress=False) if n in sent}
    assert sorted(merged) == sorted(sent) and all(torch.equal(sent[n], merged[n]) for n in sent)
    assert list(trainable_hf_weights_info(bridge, chunks)) == list(sent)


def test_plain_lora_on_an_hf_towers_linear_follows_the_installed_bridge_in_the_adapter_exports(checkpoints, tmp_path):
    """Sibling: 0.6.2's adapter-only exports keep '.adapter.' weights only, so they drop LinearAdapter's too, and are
    refused; 0.7.0's write each target's lora_A / lora_B, and are let through."""
    from bridge_freeze_plugin import AdapterExportError

    bridge, chunks, _ = _plain_lora_on_qwen25_vision_qkv(checkpoints)
    if _kept():
        written = [n for n, _ in bridge.export_adapter_weights(chunks, cpu=True, show_progress=False)]
        assert sorted(written) == [f"visual.blocks.{i}.attn.qkv.lora_{ab}.weight" for i in (0, 1) for ab in "AB"]
        return
    with pytest.raises(AdapterExportError) as err:
        list(bridge.export_adapter_weights(chunks, cpu=True, show_progress=False))
    assert "visual.blocks.0.attn.qkv, visual.blocks.1.attn.qkv" in str(err.value)
    with pytest.raises(AdapterExportError):
        bridge.save_hf_adapter(chunks, tmp_path / "adapter", peft_config=None)


# --- running statistics (issue 37, item 2): sent when the part that owns them trains, never when it is frozen ------
OMNI = "nemotron_omni"
SOUND_STATS = ("running_mean", "running_var", "num_batches_tracked")


def _omni_bridge_and_tasks(chunk: Any) -> tuple[Any, list[Any]]:
    """Conversion tasks built as Bridge's export builds them, with NemotronOmniBridge's own mapping registry (which
    maps the sound encoder's persistent buffers too); the bridge is a stand-in holding that model bridge, because
    no tiny HF checkpoint of this family can be written offline (its HF model is remote code)."""
    import itertools
    from types import SimpleNamespace

    from megatron.bridge.models.conversion.model_bridge import WeightConversionTask
    from megatron.bridge.models.conversion.utils import get_module_and_param_from_name, persistent_buffers
    from megatron.bridge.models.nemotron_omni.nemotron_omni_bridge import NemotronOmniBridge

    model_bridge = NemotronOmniBridge()
    registry = model_bridge.mapping_registry()
    tasks = []
    for name, _ in itertools.chain(chunk.named_parameters(), persistent_buffers(chunk)):
        mapping = registry.megatron_to_hf_lookup(name)
        if mapping is not None:
            module, tensor = get_module_and_param_from_name([chunk], name)
            tasks.append(WeightConversionTask(param_name=name, global_param_name=name, mapping=mapping, pp_rank=0,
                                              vp_stage=0, megatron_module=module, param_weight=tensor))
    return SimpleNamespace(_model_bridge=model_bridge, hf_pretrained=None), tasks


def _omni_trained(**flags: Any) -> tuple[Any, list[str], list[str]]:
    """Nemotron Omni built with ``flags``, two AdamW steps; the chunk, its moved buffers, the names the sync keeps."""
    import torch

    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider, nemotron_omni
    from bridge_freeze_harness.tiny.nemotron_omni import omni_loss
    from bridge_freeze_plugin.export import trainable_conversion_tasks

    provider = make_provider(OMNI, hybrid_layer_pattern=nemotron_omni.FORWARD_PATTERN, **flags)
    torch.manual_seed(0)
    (chunk,) = build_tiny_chunks(OMNI, provider=provider)
    inputs = nemotron_omni.forward_inputs(provider)
    before = {n: b.clone() for n, b in chunk.named_buffers()}
    optimizer = torch.optim.AdamW([p for p in chunk.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        chunk.train()
        optimizer.zero_grad(set_to_none=True)
        with forward_patches(OMNI):  # the loss as the provider's layout returns it (0.7.0: no mask beside it)
            omni_loss(chunk(**inputs), inputs).backward()
        optimizer.step()
    moved = sorted(n for n, b in chunk.named_buffers() if n in before and not torch.equal(b, before[n]))
    bridge, tasks = _omni_bridge_and_tasks(chunk)
    kept = trainable_conversion_tasks(bridge, [chunk], conversion_tasks=tasks, merge_adapter_weights=False)
    return chunk, moved, [task.param_name for task in kept]


# the parts by the tests' own table, which holds either layout (`llava_model.sound_model.` on 0.6.x, top-level
# `sound_model.` on 0.7.0's NemotronOmniModel)
def test_a_trained_sound_encoders_running_statistics_are_sent(cpu_bridge):
    chunk, moved, kept = _omni_trained(freeze_language_model=True, freeze_vision_model=True)
    stats = sorted(n for n, _ in chunk.named_buffers() if n.endswith(SOUND_STATS))
    assert stats and {part_of(OMNI, n) for n in stats} == {"audio_model"}
    assert set(stats) <= set(moved)  # they did move, without a gradient
    assert set(stats) <= set(kept)
    assert not [n for n in kept if part_of(OMNI, n) == "language_model"]


def test_a_frozen_sound_encoders_running_statistics_stay_and_are_not_sent(cpu_bridge):
    chunk, moved, kept = _omni_trained(freeze_audio_model=True, freeze_language_model=True)
    assert [n for n, _ in chunk.named_buffers() if n.endswith(SOUND_STATS) and part_of(OMNI, n) == "audio_model"]
    assert not [n for n in moved if part_of(OMNI, n) == "audio_model"]
    assert kept and not [n for n in kept if part_of(OMNI, n) == "audio_model"]
