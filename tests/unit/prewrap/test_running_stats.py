"""A frozen part keeps its forward-updated state: running statistics do not drift (issue 37, item 2).

``requires_grad=False`` does not stop a BatchNorm in train mode from updating ``running_mean`` / ``running_var`` /
``num_batches_tracked`` at every forward: Nemotron Omni's "frozen" conformer sound encoder drifted at every step.

The scans here build EVERY tiny family of the harness (a new family is covered by adding its module) and look
for any state a forward changes, found two ways, independent of the plugin's own rule:

- dynamically: with every part frozen, a few train-mode forwards leave every persistent buffer of the model (its
  state dict less its parameters) bit-identical (families that can run a forward on the CPU);
- structurally: every running-statistics module found by type (torch's norm base with ``track_running_stats``),
  fed a batch directly, keeps its statistics while its part is frozen and updates them once its part trains
  (every family, Mamba ones included).

Nemotron Omni (the family the scan finds with BatchNorm: its sound encoder's conformer convolutions) then trains a
few AdamW steps through Bridge's real build path with each audio selection: frozen parameters AND buffers stay
bit-identical, a trained encoder's statistics move, and the hooks survive ``model.train()``, deep copies and
pickling.
"""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
import torch

from bridge_freeze_harness import train
from bridge_freeze_harness.forward import forward_patches
from bridge_freeze_harness.tiny import TINY_FAMILIES, build_tiny_chunks, build_tiny_model, family_module, make_provider
from bridge_freeze_plugin import FreezeSelection, apply_selection, get_family
from bridge_freeze_plugin.request import INFO

OMNI = "nemotron_omni"


def _sound(model: torch.nn.Module) -> str:
    """The sound encoder's prefix as the model names it: ``llava_model.sound_model.`` in the LLaVA model (0.6.x),
    ``sound_model.`` at the top level of 0.7.0's NemotronOmniModel."""
    wrapped = any(n.startswith("llava_model.") for n, _ in model.named_parameters())
    return ("llava_model." if wrapped else "") + "sound_model."


def _family(name: str) -> Any:
    module = family_module(name)
    return get_family(getattr(module, "FAMILY", module.__name__.rpartition(".")[2]))


def _all_frozen(name: str) -> FreezeSelection:
    return FreezeSelection(**{INFO[part].flag: True for part in _family(name).part_names()})


def _buffers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The persistent buffers: the state dict less the parameters (what a checkpoint and Bridge's export hold)."""
    params = {n for n, _ in model.named_parameters()}
    return {n: t.detach().clone() for n, t in model.state_dict().items()
            if n not in params and not n.endswith("_extra_state") and isinstance(t, torch.Tensor)}


def _stats_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Found by type, not by the plugin's rule: torch's BatchNorm / InstanceNorm base with running statistics."""
    from torch.nn.modules.batchnorm import _NormBase

    return [(n, m) for n, m in model.named_modules() if isinstance(m, _NormBase) and m.track_running_stats]


def _omni_forward(provider: Any) -> Any:
    from bridge_freeze_harness.tiny import nemotron_omni

    inputs = nemotron_omni.forward_inputs(provider)

    def loss(m: torch.nn.Module) -> torch.Tensor:
        with forward_patches(OMNI):  # the loss as the provider's layout returns it (0.7.0: no mask beside it)
            return nemotron_omni.omni_loss(m(**inputs), inputs)

    return loss


def _forward_setup(name: str) -> tuple[torch.nn.Module, Any]:
    """A tiny model and one train-mode forward of it (the loss), for a family that can run one on the CPU."""
    if name == OMNI:  # the faster Mamba-free build (the harness's attention + MoE layer pattern)
        from bridge_freeze_harness.tiny import nemotron_omni

        provider = make_provider(OMNI, hybrid_layer_pattern=nemotron_omni.FORWARD_PATTERN)
        return build_tiny_model(OMNI, provider), _omni_forward(provider)
    if train.cannot_train_reason(name) is not None:
        pytest.skip(train.cannot_train_reason(name))
    provider = train.make_provider(name)
    model = build_tiny_model(name, provider)
    batch = train.synthetic_batch(name, provider)
    return model, lambda m: train.loss_fn(m, batch, name)


@pytest.mark.parametrize("name", list(TINY_FAMILIES))
def test_with_every_part_frozen_a_train_mode_forward_moves_no_buffer(cpu_bridge, name):
    torch.manual_seed(0)
    model, loss = _forward_setup(name)
    apply_selection(model, _family(name), _all_frozen(name))
    before = _buffers(model)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            loss(model)
    after = _buffers(model)
    moved = sorted(n for n, t in before.items() if not torch.equal(t, after[n]))
    assert moved == []


@pytest.mark.parametrize("name", list(TINY_FAMILIES))
def test_every_buffer_a_training_forward_moves_is_one_the_rules_know(cpu_bridge, name):
    """With every part training, each persistent buffer a train-mode forward moves must be one the freeze keeps
    still when its part is frozen and the RL sync sends when it trains (a running-statistics module's): a new
    family with forward state of another kind fails here instead of drifting or going unsent."""
    from bridge_freeze_plugin.prewrap import stats_move

    torch.manual_seed(0)
    model, loss = _forward_setup(name)
    apply_selection(model, _family(name), FreezeSelection())
    before = _buffers(model)
    model.train()
    with torch.no_grad():
        for _ in range(2):
            loss(model)
    after = _buffers(model)
    moved = [n for n, t in before.items() if not torch.equal(t, after[n])]
    unknown = [n for n in moved if not stats_move(model.get_submodule(n.rpartition(".")[0]))]
    assert unknown == []
    assert bool(moved) == bool(_stats_modules(model))  # today: Nemotron Omni's sound encoder, and only it


def _feed(module: torch.nn.Module) -> None:
    """One batch straight into a norm module (the input rank its class checks: 3, 4 or 5 dimensions)."""
    for rank in (3, 4, 5):
        shape = (4, module.num_features, *(3,) * (rank - 2))
        try:
            module(torch.randn(*shape))
            return
        except ValueError:
            continue
    raise AssertionError(f"no input rank fits {type(module).__name__}")


@pytest.mark.parametrize("name", list(TINY_FAMILIES))
def test_each_running_stats_module_keeps_its_statistics_while_its_part_is_frozen(cpu_bridge, name):
    model = build_tiny_model(name)
    found = _stats_modules(model)
    if not found:
        return  # nothing of the kind in this family (the dynamic scan above covers any other forward state)
    family = _family(name)
    model.train()
    apply_selection(model, family, _all_frozen(name))
    for module_name, module in found:
        before = {n: b.clone() for n, b in module.named_buffers()}
        _feed(module)
        assert all(torch.equal(b, before[n]) for n, b in module.named_buffers()), module_name
        assert module.training  # the module's mode is the caller's; only its forward runs in eval mode
    apply_selection(model, family, FreezeSelection())  # every part trains: statistics move again
    for module_name, module in found:
        count = int(module.num_batches_tracked)
        _feed(module)
        assert int(module.num_batches_tracked) == count + 1, module_name


def _omni_chunk(**flags: Any) -> tuple[torch.nn.Module, Any]:
    """Nemotron Omni through Bridge's build path (the plugin's pre-wrap hook chain), forwardable on the CPU."""
    from bridge_freeze_harness.tiny import nemotron_omni

    provider = make_provider(OMNI, hybrid_layer_pattern=nemotron_omni.FORWARD_PATTERN, **flags)
    torch.manual_seed(0)
    (chunk,) = build_tiny_chunks(OMNI, provider=provider)
    return chunk, _omni_forward(provider)


def _steps(model: torch.nn.Module, loss: Any, steps: int = 3) -> None:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        model.train()  # as Bridge's training loop does at every step
        optimizer.zero_grad(set_to_none=True)
        with forward_patches(OMNI):
            loss(model).backward()
        optimizer.step()


@pytest.mark.parametrize("flags", [{"freeze_audio_model": True}, {"freeze_sound_encoder": True},
                                   {"freeze_language_model": True, "freeze_vision_model": True,
                                    "freeze_vision_projection": True, "freeze_audio_model": True}])
def test_a_frozen_omni_sound_encoder_is_bit_identical_after_training(cpu_bridge, flags):
    chunk, loss = _omni_chunk(**flags)
    sound_prefix = _sound(chunk)
    stats = [n for n, _ in _stats_modules(chunk)]
    assert stats and all(n.startswith(sound_prefix) for n in stats)
    frozen = {n for n, p in chunk.named_parameters() if not p.requires_grad}
    assert {n for n, _ in chunk.named_parameters() if n.startswith(sound_prefix)} <= frozen
    state = {n: t.detach().clone() for n, t in chunk.state_dict().items() if isinstance(t, torch.Tensor)}
    _steps(chunk, loss)
    after = chunk.state_dict()
    sound = {n for n in state if n.startswith(sound_prefix) and "_extra_state" not in n}
    assert {n for n in sound if n.endswith(("running_mean", "running_var", "num_batches_tracked"))}
    assert sorted(n for n in sound if not torch.equal(state[n], after[n])) == []
    assert sorted(n for n in frozen if not torch.equal(state[n], after[n])) == []
    assert all(m.training for _, m in _stats_modules(chunk))


def test_a_trained_omni_sound_encoder_updates_its_statistics(cpu_bridge):
    chunk, loss = _omni_chunk(freeze_language_model=True)
    before = {n: b.clone() for n, b in chunk.named_buffers() if n.startswith(_sound(chunk)) and "running_" in n}
    counts = [int(m.num_batches_tracked) for _, m in _stats_modules(chunk)]
    assert before
    _steps(chunk, loss, steps=2)
    buffers = dict(chunk.named_buffers())
    assert all(not torch.equal(b, buffers[n]) for n, b in before.items())
    assert all(int(m.num_batches_tracked) > c for (_, m), c in zip(_stats_modules(chunk), counts, strict=True))


def test_the_rule_survives_a_deep_copy_pickling_and_a_checkpoint_load(cpu_bridge):
    """The hooks live on the modules themselves (module-level functions): a copy of the sound encoder (the whole
    Megatron chunk holds process groups, which neither copies nor pickles) and a fresh build that loads the
    trained state keep the frozen statistics."""
    chunk, loss = _omni_chunk(freeze_audio_model=True)
    encoder = chunk.get_submodule(_sound(chunk).rstrip("."))
    for copied in (copy.deepcopy(encoder), pickle.loads(pickle.dumps(encoder))):
        copied.train()
        for module_name, module in _stats_modules(copied):
            before = {n: b.clone() for n, b in module.named_buffers()}
            _feed(module)
            assert all(torch.equal(b, before[n]) for n, b in module.named_buffers()), module_name
    fresh, _ = _omni_chunk(freeze_audio_model=True)
    fresh.load_state_dict(chunk.state_dict())
    before = {n: b.clone() for n, b in fresh.named_buffers() if n.startswith(_sound(fresh))}
    fresh.train()
    with torch.no_grad():
        loss(fresh)
    assert all(torch.equal(b, dict(fresh.named_buffers())[n]) for n, b in before.items())
