"""Every way Bridge builds from a provider gets the same freeze, hook chain, LoRA handling, guarantee and report,
and a hook that narrows a trained part (the trainers' ``freeze_moe_router``) is accepted and reported (issue 28).

Build paths of Bridge 0.6.2 that run pre-wrap hooks: ``provider.provide_distributed_model(...)`` (registered
hooks, or ``pre_wrap_hook=``), and the public ``megatron.bridge.models.model_provider.get_model(provider, ...,
pre_wrap_hook=[...])`` that NeMo-RL calls directly (it runs only the hooks it is given). ``provide()`` runs no
hook. The router hook is written from the two trainers' behaviour: freeze ``mlp.router.weight`` of every MoE
layer of the language model. Expected sets are computed from parameter names here, not by the plugin.
"""

from __future__ import annotations

import pytest
from _shared import names, trainable

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_context, make_provider


def freeze_moe_router(chunks):
    """The origin trainer's / NeMo-RL's ``freeze_moe_router`` pre-wrap hook, as they behave."""
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if name.startswith("language_model.") and name.endswith("mlp.router.weight"):
                param.requires_grad_(False)
    return chunks


def freeze_whole_language_model(chunks):
    for chunk in chunks:
        for name, param in chunk.named_parameters():
            if name.startswith("language_model."):
                param.requires_grad_(False)
    return chunks


def _lora(targets):
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=list(targets), dim=4, alpha=8)


def _build(path, name, selection, hooks):
    """Build bare chunks through ``path``: "provide_distributed_model" (registered hooks) or "get_model"."""
    from megatron.bridge.models import model_provider as mp
    from megatron.core.process_groups_config import ProcessGroupCollection

    provider = bfp.make_freezable(make_provider(name), selection)
    with build_context(name):
        if path == "provide_distributed_model":
            for hook in hooks:
                provider.register_pre_wrap_hook(hook)
            chunks = provider.provide_distributed_model(
                wrap_with_ddp=False, use_cpu_initialization=True, mixed_precision_wrapper=None)
        else:
            provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
            chunks = mp.get_model(provider, None, wrap_with_ddp=False, use_cpu_initialization=True,
                                  pre_wrap_hook=list(hooks) or None, mixed_precision_wrapper=None,
                                  pg_collection=provider._pg_collection)
    return provider, chunks


PATHS = ["provide_distributed_model", "get_model"]
PROJECTION = ("vision_model.merger.", "vision_model.decoder.deepstack_merger_list.")


def test_get_model_is_routed_through_the_plugin(cpu_bridge):
    from megatron.bridge.models import model_provider as mp

    assert hasattr(mp.get_model, "__bridge_freeze_wrapped__")
    bfp.deactivate()
    try:
        assert not hasattr(mp.get_model, "__bridge_freeze_wrapped__")
    finally:
        bfp.activate()
    assert hasattr(mp.get_model, "__bridge_freeze_wrapped__")


@pytest.mark.parametrize("path", PATHS)
def test_lora_with_a_full_rank_projection_on_every_path(cpu_bridge, path):
    selection = bfp.FreezeSelection(True, True, False)
    provider, chunks = _build(path, "qwen3_vl", selection, [_lora(["language_model.*linear_qkv"])])
    everything = names(chunks)
    adapters = {n for n in everything if ".adapter." in n}
    assert adapters and all(n.startswith("language_model.") for n in adapters)
    assert trainable(chunks) == adapters | {n for n in everything if n.startswith(PROJECTION)}
    report = bfp.last_report(provider)
    projection = report.part(bfp.Part.VISION_PROJECTION)
    assert projection.trainable == projection.total > 0
    assert report.part(bfp.Part.LANGUAGE_MODEL).trainable == sum(
        p.numel() for c in chunks for n, p in c.named_parameters() if n in adapters)


@pytest.mark.parametrize("path", PATHS)
def test_get_model_without_hooks_still_freezes_and_reports_model_wide(cpu_bridge, path):
    selection = bfp.FreezeSelection(freeze_vision_model=True)
    provider, chunks = _build(path, "qwen3_vl", selection, [])
    everything = names(chunks)
    expected = {n for n in everything if not n.startswith("vision_model.") or n.startswith(PROJECTION)}
    assert trainable(chunks) == expected
    assert bfp.last_report(provider).trainable == sum(
        p.numel() for c in chunks for n, p in c.named_parameters() if n in expected)


@pytest.mark.parametrize("path", PATHS)
def test_a_router_freezing_hook_narrows_the_language_model_and_is_reported(cpu_bridge, path):
    selection = bfp.FreezeSelection(freeze_vision_model=True)
    provider, chunks = _build(path, "qwen3_vl_moe", selection, [freeze_moe_router])
    everything = names(chunks)
    routers = {n for n in everything if n.startswith("language_model.") and n.endswith("mlp.router.weight")}
    assert len(routers) == 2
    expected = {n for n in everything if not n.startswith("vision_model.") or n.startswith(PROJECTION)} - routers
    assert trainable(chunks) == expected
    report = bfp.last_report(provider)
    lm = report.part(bfp.Part.LANGUAGE_MODEL)
    router_size = sum(p.numel() for c in chunks for n, p in c.named_parameters() if n in routers)
    assert lm.trainable == lm.total - router_size
    assert any("language_model: 2 tensor(s) frozen by pre-wrap hook" in n and "freeze_moe_router" in n
               for n in report.notes)


@pytest.mark.parametrize("path", PATHS)
def test_a_router_freezing_hook_with_no_flag_set_is_reported_too(cpu_bridge, path):
    """Issue 46 (SkyRL, Qwen3-VL-MoE with no flag and freeze_moe_router): check-config says the build reports the
    router hook per part; the build's report had no note (narrowing was looked for only while a flag was set)."""
    provider, chunks = _build(path, "qwen3_vl_moe", bfp.FreezeSelection(), [freeze_moe_router])
    everything = names(chunks)
    routers = {n for n in everything if n.startswith("language_model.") and n.endswith("mlp.router.weight")}
    assert len(routers) == 2 and trainable(chunks) == everything - routers
    notes = [n for n in bfp.last_report(provider).notes if "frozen by pre-wrap hook" in n]
    assert len(notes) == 1 and notes[0].startswith("language_model: 2 tensor(s) frozen by pre-wrap hook")
    assert "freeze_moe_router" in notes[0]


@pytest.mark.parametrize("path", PATHS)
def test_a_router_hook_before_lora_keeps_the_routers_frozen(cpu_bridge, path):
    """Bridge's setup() appends its PEFT hook after the trainer's: the full-rank restore must not undo it."""
    selection = bfp.FreezeSelection(freeze_vision_model=True)
    _, chunks = _build(path, "qwen3_vl_moe", selection,
                              [freeze_moe_router, _lora(["vision_model.*linear_qkv"])])
    everything = names(chunks)
    routers = {n for n in everything if n.endswith("mlp.router.weight") and n.startswith("language_model.")}
    adapters = {n for n in everything if ".adapter." in n}
    assert adapters and all(n.startswith("vision_model.decoder.layers.") for n in adapters)
    full_rank = {n for n in everything - adapters if n.startswith("language_model.") or n.startswith(PROJECTION)}
    assert trainable(chunks) == (full_rank - routers) | adapters


@pytest.mark.parametrize("path", PATHS)
def test_a_hook_that_freezes_a_whole_trained_part_is_still_refused(cpu_bridge, path):
    with pytest.raises(bfp.FreezeGuaranteeError, match="freeze_whole_language_model"):
        _build(path, "qwen3_vl", bfp.FreezeSelection(freeze_vision_model=True), [freeze_whole_language_model])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("targets", [["(_+)+linear_qkv"], ["language_model.*.*.*linear_qkv"]])
def test_a_lora_target_that_would_hang_bridges_matcher_is_refused_before_lora_runs(cpu_bridge, path, targets):
    with pytest.raises(bfp.InvalidPatternError, match="LoRA target_modules entry"):
        _build(path, "qwen3_vl", bfp.FreezeSelection(True, True, False), [_lora(targets)])


def test_every_error_class_is_importable_from_the_package():
    import inspect

    from bridge_freeze_plugin import errors

    defined = {n for n, c in vars(errors).items() if inspect.isclass(c) and c.__module__ == errors.__name__}
    assert defined <= set(bfp.__all__)
    assert all(getattr(bfp, n) is getattr(errors, n) for n in defined)


@pytest.mark.parametrize("pattern", ["a{4294967296}", "(" * 3000 + "a" + ")" * 3000])
def test_a_pattern_python_cannot_compile_is_an_invalid_pattern_error_in_the_api(pattern):
    with pytest.raises(bfp.InvalidPatternError, match="train_patterns entry"):
        bfp.FreezeSelection(train_patterns=[pattern])


@pytest.mark.parametrize(("backend", "cuda", "expected"), [
    ("gloo", False, "cpu"), ("gloo", True, "cpu"), ("nccl", True, "cuda"), ("cpu:gloo,cuda:nccl", True, "cpu"),
    ("nccl", False, "cpu"),
])
def test_plugin_collectives_put_their_tensors_where_the_backend_takes_them(monkeypatch, backend, cuda, expected):
    """Bridge's training starts NCCL by default, which refuses CPU tensors: the plugin's build-time collectives
    (errors agreed on every rank, the model-wide report, the sync's task marks) follow the backend."""
    import torch
    import torch.distributed as dist

    from bridge_freeze_plugin.ranks import collective_device

    monkeypatch.setattr(dist, "get_backend", lambda group=None: backend)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    assert collective_device().type == expected


def test_deactivate_takes_the_plugins_targets_off_bridges_allowlist(cpu_bridge):
    from megatron.bridge.utils import instantiate_utils

    target = "bridge_freeze_plugin.optim.bridge.PartLROverrideProvider"
    assert instantiate_utils.target_allowlist.is_allowed(target)
    bfp.deactivate()
    try:
        assert not instantiate_utils.target_allowlist.is_allowed(target)
    finally:
        bfp.activate()
    assert instantiate_utils.target_allowlist.is_allowed(target)
