"""Per-part learning rates: the config keys, then megatron-core's real optimizer on a tiny real Bridge Qwen3-VL.

Every optimizer test compares one step with per-part LRs against single-LR steps from the same weights and
gradients: each part must move exactly as a run at its own LR moves it. megatron-core's ``FP32Optimizer`` runs
here (fp32 weights, no DDP buffers); its one CUDA tensor (a constant loss scale of 1.0) is made on the CPU.
The distributed optimizer (DDP's gradient buffers) runs inside Bridge's real training loop in
tests/unit/integration/test_bridge_training.py.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import torch

from bridge_freeze_plugin import FreezeSelection, get_family
from bridge_freeze_plugin.errors import InvalidFreezeConfigError, PartLearningRateError
from bridge_freeze_plugin.optim import PartLearningRates, read_part_learning_rates

PART_ATTR = "bridge_freeze_part"
GLOBAL_LR, GLOBAL_MIN_LR = 1e-3, 1e-4


# ---------------------------------------------------------------- the config keys (no torch)


def test_reads_each_part_and_keeps_zero():
    rates = read_part_learning_rates(
        {"lr_vision_projection": 0.0, "lr_vision_model": 2, "min_lr_vision_model": 1e-6, "lr_decay_style": "cosine"}
    )
    assert rates.as_dict() == {"lr_vision_model": 2.0, "min_lr_vision_model": 1e-6, "lr_vision_projection": 0.0}
    assert rates.resolved(GLOBAL_LR, GLOBAL_MIN_LR) == {"vision_model": (2.0, 1e-6), "vision_projection": (0.0, 0.0)}


def test_unset_minimum_keeps_the_global_shape():
    rates = read_part_learning_rates({"lr_language_model": 5e-4})
    assert rates.resolved(1e-3, 1e-4) == {"language_model": (5e-4, 5e-4 * 0.1)}
    assert rates.resolved(1e-3, None) == {"language_model": (5e-4, 0.0)}
    assert not read_part_learning_rates({}) and read_part_learning_rates(None).parts == ()


@pytest.mark.parametrize(
    ("section", "named"),
    [
        ({"lr_vision_model": True}, "megatron_config.lr_vision_model must be a number"),
        ({"lr_vision_model": "1e-4"}, "megatron_config.lr_vision_model must be a number"),
        ({"lr_language_model": -1e-4}, "megatron_config.lr_language_model=-0.0001"),
        ({"lr_language_model": math.nan}, "megatron_config.lr_language_model=nan"),
        ({"lr_adapters": math.inf}, "megatron_config.lr_adapters=inf"),
        ({"lr_vision_model": 1e-4, "min_lr_vision_model": 1e-3}, "min_lr_vision_model=0.001 is above"),
        ({"min_lr_vision_projection": 1e-5}, "min_lr_vision_projection=1e-05 is set without"),
        ({"lr_vision_models": 1e-4}, "did you mean megatron_config.lr_vision_model?"),
        ({"lr_vision_model": 1e-4, "min_lr_vision_model": None}, None),
    ],
)
def test_invalid_values_name_the_key(section, named):
    if named is None:  # a null minimum is "unset", not an error
        assert read_part_learning_rates(section).get("vision_model").min_lr is None
        return
    with pytest.raises(PartLearningRateError, match=named.replace("?", r"\?").replace(".", r"\.")) as info:
        read_part_learning_rates(section)
    assert isinstance(info.value, InvalidFreezeConfigError)


def test_frozen_part_and_adapters_without_lora_are_errors():
    where = "trainer.policy.megatron_config"
    with pytest.raises(PartLearningRateError, match=r"policy\.megatron_config\.lr_vision_model is set.*frozen"):
        read_part_learning_rates({"lr_vision_model": 1e-4}, where=where, frozen=["vision_model"])
    with pytest.raises(PartLearningRateError, match="set lr_adapters instead"):
        read_part_learning_rates({"lr_language_model": 1e-4}, frozen=["language_model"], lora=True)
    with pytest.raises(PartLearningRateError, match="LoRA is off"):
        read_part_learning_rates({"lr_adapters": 1e-4}, lora=False)
    rates = read_part_learning_rates({"lr_adapters": 1e-4}, frozen=["language_model"], lora=True)
    assert rates.names() == ("adapters",)


# ---------------------------------------------------------------- megatron-core's optimizer on a real model


@contextlib.contextmanager
def _cpu_for_cuda() -> Iterator[None]:
    """megatron-core's optimizer makes two scalars on "cuda" (``FP32Optimizer``'s constant loss scale of 1.0,
    the gradient norm's accumulator): make them on the CPU instead, nothing else changes."""
    real = {name: getattr(torch, name) for name in ("tensor", "zeros")}

    def on_cpu(make):
        def made(*args, **kwargs):
            if kwargs.get("device") == "cuda":
                kwargs["device"] = "cpu"
            return make(*args, **kwargs)

        return made

    for name, make in real.items():
        setattr(torch, name, on_cpu(make))
    try:
        yield
    finally:
        for name, make in real.items():
            setattr(torch, name, make)


class Rig:
    """One tiny Qwen3-VL with fixed weights and gradients; each run restores both, then steps once."""

    def __init__(self, chunks):
        self.chunks = chunks
        self.named = dict(chunks[0].named_parameters())
        self.weights = {n: p.detach().clone() for n, p in self.named.items()}
        self.grads = {n: (p.grad.detach().clone() if p.grad is not None else None) for n, p in self.named.items()}

    def restore(self) -> None:
        with torch.no_grad():
            for name, param in self.named.items():
                param.copy_(self.weights[name])
                param.grad = None if self.grads[name] is None else self.grads[name].clone()

    def config(self, optimizer: str = "adam", lr: float = GLOBAL_LR, **kw):
        from megatron.core.optimizer import OptimizerConfig

        return OptimizerConfig(optimizer=optimizer, lr=lr, min_lr=kw.pop("min_lr", GLOBAL_MIN_LR), clip_grad=0.0,
                               weight_decay=0.1, **kw)

    def build(self, config, overrides=None):
        from megatron.core.optimizer import get_megatron_optimizer

        self.restore()
        with _cpu_for_cuda():
            return get_megatron_optimizer(config, self.chunks, config_overrides=overrides)

    def step(self, config, overrides=None) -> dict[str, torch.Tensor]:
        """One step; the change of every parameter, by name."""
        optimizer = self.build(config, overrides)
        for group in optimizer.param_groups:  # what the scheduler does at step 0 with no warm-up
            group["lr"] = group["max_lr"]
        with _cpu_for_cuda():
            optimizer.step()
        return {n: p.detach() - self.weights[n] for n, p in self.named.items()}

    def part_of(self, name: str) -> str:
        return getattr(self.named[name], PART_ATTR)


@pytest.fixture(scope="module")
def rig(cpu_bridge):
    from megatron.core.distributed import DistributedDataParallelConfig

    from bridge_freeze_harness.tiny import build_tiny_chunks
    from bridge_freeze_harness.train import forward_backward, make_provider, synthetic_batch
    from bridge_freeze_plugin import make_freezable

    provider = make_freezable(make_provider("qwen3_vl"), FreezeSelection())
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)
    chunks[0].ddp_config = DistributedDataParallelConfig()  # what get_megatron_optimizer reads off a chunk
    forward_backward(chunks[0], synthetic_batch("qwen3_vl", provider), "qwen3_vl")
    return Rig(chunks)


def _overrides(rig: Rig, config, **rates):
    from bridge_freeze_plugin.optim import part_lr_overrides

    return part_lr_overrides(config, rig.chunks, PartLearningRates.of(**rates))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_each_part_moves_as_a_run_at_its_own_lr(rig, kind):
    config = rig.config(kind)
    asked = {"vision_projection": 2e-2, "vision_model": 3e-5}  # the language model: the global LR
    moved = rig.step(config, _overrides(rig, config, **{f"lr_{p}": lr for p, lr in asked.items()}))
    single = {lr: rig.step(rig.config(kind, lr=lr)) for lr in {*asked.values(), GLOBAL_LR}}
    parts = {"language_model", "vision_model", "vision_projection"}
    assert {rig.part_of(n) for n in moved} == parts
    for name, delta in moved.items():
        expected = single[asked.get(rig.part_of(name), GLOBAL_LR)][name]
        assert torch.equal(delta, expected), name
    # and the runs differ: the test could fail
    assert all(torch.count_nonzero(single[2e-2][n] - single[GLOBAL_LR][n]) for n in moved)


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_lr_zero_leaves_the_part_unchanged_while_another_moves(rig, kind):
    config = rig.config(kind)
    moved = rig.step(config, _overrides(rig, config, lr_vision_projection=0.0))
    for name, delta in moved.items():
        if rig.part_of(name) == "vision_projection":
            assert not torch.count_nonzero(delta), name
        else:
            assert torch.count_nonzero(delta), name


def _group_keys(optimizer) -> set[tuple[float, float, float]]:
    return {(g["max_lr"], g["min_lr"], g["wd_mult"]) for g in optimizer.param_groups if g["params"]}


def test_standard_weight_decay_groups_are_kept(rig):
    config = rig.config()
    optimizer = rig.build(config, _overrides(rig, config, lr_vision_projection=2e-2, min_lr_vision_projection=1e-3))
    own = {"vision_projection": (2e-2, 1e-3)}
    expected = {
        (*own.get(rig.part_of(n), (GLOBAL_LR, GLOBAL_MIN_LR)), 0.0 if p.ndim == 1 or n.endswith(".bias") else 1.0)
        for n, p in rig.named.items()
    }
    assert _group_keys(optimizer) == expected
    assert {k[2] for k in expected} == {0.0, 1.0} and {k[:2] for k in expected} == {(2e-2, 1e-3), (1e-3, 1e-4)}


def test_decoupled_lr_keeps_the_embedding_and_output_layer(rig):
    config = rig.config(decoupled_lr=7e-3, decoupled_min_lr=7e-4)
    optimizer = rig.build(config, _overrides(rig, config, lr_language_model=5e-4))
    decoupled = [p for p in rig.named.values() if getattr(p, "is_embedding_or_output_parameter", False)]
    assert decoupled
    for group in optimizer.param_groups:
        for param in group["params"]:
            if any(param is d for d in decoupled):
                assert (group["max_lr"], group["min_lr"]) == (7e-3, 7e-4)
            elif getattr(param, PART_ATTR) == "language_model":
                assert (group["max_lr"], group["min_lr"]) == (5e-4, 5e-5)


def test_verify_accepts_applied_and_raises_when_ignored(rig):
    from bridge_freeze_plugin.optim import verify_part_learning_rates

    config = rig.config()
    rates = PartLearningRates.of(lr_vision_model=0.0, lr_vision_projection=2e-2)
    optimizer = rig.build(config, _overrides(rig, config, **rates.as_dict()))
    applied = verify_part_learning_rates(optimizer, rig.chunks, rates)
    assert applied == {"vision_model": (0.0, 0.0), "vision_projection": (2e-2, pytest.approx(2e-3, rel=1e-12))}
    # built without the overrides (megatron-core's defaults): the per-part LRs were never applied
    plain = rig.build(config)
    with pytest.raises(PartLearningRateError, match=r"lr_vision_model=0 \(min 0\) was asked.*max_lr=0\.001"):
        verify_part_learning_rates(plain, rig.chunks, rates)
    # a group changed afterwards (e.g. restored from a checkpoint made with other LRs)
    for group in optimizer.param_groups:
        if group["max_lr"] == 2e-2:
            group["min_lr"] = 0.0
    with pytest.raises(PartLearningRateError, match=r"lr_vision_projection=0\.02"):
        verify_part_learning_rates(optimizer, rig.chunks, rates)


def test_a_resume_gives_each_part_its_own_groups_back(rig):
    """A checkpoint's groups go back to the groups of the same part: megatron-core 0.18 pairs them by wd_mult,
    lr_mult, is_expert_parallel and is_decoupled_lr only, so a part's groups and the global ones collapsed and a
    resumed part trained at another part's LR (SkyRL's pin); a checkpoint made with other per-part LRs is refused."""
    from bridge_freeze_plugin.optim import verify_part_learning_rates

    config = rig.config()
    rates = PartLearningRates.of(lr_vision_projection=2e-2, min_lr_vision_projection=1e-3)
    saved = rig.build(config, _overrides(rig, config, **rates.as_dict())).state_dict()
    resumed = rig.build(config, _overrides(rig, config, **rates.as_dict()))
    verify_part_learning_rates(resumed, rig.chunks, rates)
    resumed.load_state_dict(saved)
    held = {id(p): (g["max_lr"], g["min_lr"]) for g in resumed.param_groups for p in g["params"]}
    own = {"vision_projection": (2e-2, 1e-3)}
    assert sum(len(g["params"]) for g in resumed.param_groups) == len(rig.named)
    assert held == {id(p): own.get(rig.part_of(n), (GLOBAL_LR, GLOBAL_MIN_LR)) for n, p in rig.named.items()}
    other = rig.build(config, _overrides(rig, config, lr_vision_projection=3e-2)).state_dict()
    with pytest.raises(ValueError, match="Could not find parameter group"):
        resumed.load_state_dict(other)


def test_a_load_that_moves_a_global_groups_lr_is_an_error(rig, monkeypatch):
    """After a load every group keeps the LRs it was built with, a part at the global LR too (what megatron-core
    0.18's collapse did to the LoRA run's projection: no per-part LR of its own, so the per-part check missed it)."""
    from megatron.core.optimizer.optimizer import MegatronOptimizer

    from bridge_freeze_plugin.optim import verify_part_learning_rates

    config = rig.config()
    rates = PartLearningRates.of(lr_vision_projection=2e-2)
    saved = rig.build(config, _overrides(rig, config, **rates.as_dict())).state_dict()
    resumed = rig.build(config, _overrides(rig, config, **rates.as_dict()))
    verify_part_learning_rates(resumed, rig.chunks, rates)
    real = MegatronOptimizer._filter_and_reorder_param_groups

    def collapsed(current, loaded):  # the global groups come back with the projection's LR
        groups = real(current, loaded)
        for group in groups:
            if group["max_lr"] == GLOBAL_LR:
                group.update(max_lr=2e-2, min_lr=2e-3)
        return groups

    monkeypatch.setattr(MegatronOptimizer, "_filter_and_reorder_param_groups", staticmethod(collapsed))
    with pytest.raises(PartLearningRateError, match=r"a checkpoint load gave the parameter group of language_model"):
        resumed.load_state_dict(saved)


def test_frozen_part_and_a_model_not_built_by_the_plugin_raise(rig):
    config = rig.config()
    family = get_family("qwen3_vl")
    from bridge_freeze_plugin import apply_selection

    apply_selection(rig.chunks, family, FreezeSelection(freeze_vision_model=True))
    try:
        with pytest.raises(PartLearningRateError, match="lr_vision_model is set, but the vision_model is frozen"):
            _overrides(rig, config, lr_vision_model=1e-4)
        with pytest.raises(PartLearningRateError, match="no LoRA adapter"):
            _overrides(rig, config, lr_adapters=1e-4)
    finally:
        apply_selection(rig.chunks, family, FreezeSelection())
    bare = torch.nn.Linear(2, 2)
    with pytest.raises(PartLearningRateError, match="a model the plugin did not build"):
        _bare_overrides(bare, config)


def _bare_overrides(model, config):
    from bridge_freeze_plugin.optim import part_lr_overrides

    return part_lr_overrides(config, [model], PartLearningRates.of(lr_vision_model=1e-4))


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"optimizer": "muon"}, "optimizer='muon'"),
        ({"warmup": (1e-5, 10)}, "lr_warmup_init=1e-05"),
    ],
)
def test_settings_under_which_a_part_lr_would_not_apply_raise(rig, change, named):
    from bridge_freeze_plugin.optim import part_lr_overrides

    config = rig.config(change.get("optimizer", "adam"))
    init, steps = change.get("warmup", (0.0, 0))
    with pytest.raises(PartLearningRateError, match=named):
        part_lr_overrides(config, rig.chunks, PartLearningRates.of(lr_vision_model=1e-4),
                          lr_warmup_init=init, lr_warmup_steps=steps)


def test_bridge_provider_and_scheduler_follow_the_global_shape(rig):
    """The provider as Bridge's ``setup_optimizer`` uses it: ``build_config_overrides(context)``, then
    ``get_megatron_optimizer(config_overrides=...)`` and megatron-core's ``OptimizerParamScheduler``. (Bridge's own
    ``setup_optimizer``: the last test here, and tests/unit/integration/test_bridge_training.py inside
    ``pretrain()``.)"""
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    from bridge_freeze_plugin.optim import PartLROverrideProvider, verify_part_learning_rates

    config = rig.config()
    scheduler_config = SimpleNamespace(lr_warmup_init=0.0, lr_warmup_steps=4)
    provider = PartLROverrideProvider(lr_vision_projection=2e-2, lr_vision_model=0.0)
    overrides = provider.build_config_overrides(SimpleNamespace(
        optimizer_config=config, scheduler_config=scheduler_config, model=rig.chunks))
    optimizer = rig.build(config, overrides)
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=GLOBAL_LR, min_lr=GLOBAL_MIN_LR, lr_warmup_steps=4, lr_decay_steps=20,
        lr_decay_style="linear", start_wd=0.1, end_wd=0.1, wd_incr_steps=20, wd_incr_style="constant")
    verify_part_learning_rates(optimizer, rig.chunks, provider.rates(), scheduler=scheduler)
    by_part = {}
    for group in optimizer.param_groups:
        for part in {getattr(p, PART_ATTR) for p in group["params"]}:
            by_part.setdefault(part, group)
    assert set(by_part) == {"language_model", "vision_model", "vision_projection"}
    for steps in (2, 4, 6, 20):  # warm-up, peak, decay, end: each part's LR is its peak times the global ratio
        scheduler.step(steps - scheduler.num_steps)
        base = by_part["language_model"]
        span = base["max_lr"] - base["min_lr"]
        ratio = (base["lr"] - base["min_lr"]) / span if steps > 4 else base["lr"] / GLOBAL_LR
        for part, group in by_part.items():
            low = group["min_lr"] if steps > 4 else 0.0
            assert group["lr"] == pytest.approx(low + ratio * (group["max_lr"] - low), rel=1e-12, abs=0.0), part
    assert by_part["vision_model"]["lr"] == 0.0 and by_part["vision_projection"]["max_lr"] == 2e-2
    assert by_part["vision_projection"]["lr"] == pytest.approx(2e-3, rel=1e-12)  # its minimum, at the end


def test_bridge_provider_rejects_a_malformed_value_when_made():

    from bridge_freeze_plugin.optim import PartLROverrideProvider

    with pytest.raises(PartLearningRateError, match="lr_vision_model must be a number"):
        PartLROverrideProvider(lr_vision_model="1e-4")
    assert PartLROverrideProvider.from_rates(PartLearningRates.of(lr_adapters=0.0)).lr_adapters == 0.0


@pytest.fixture(scope="module")
def lora_rig(cpu_bridge):
    """Qwen3-VL with LoRA on the attention of the frozen language model and vision encoder; projection full-rank."""
    from megatron.bridge.peft.lora import LoRA
    from megatron.core.distributed import DistributedDataParallelConfig

    from bridge_freeze_harness.tiny import build_tiny_chunks
    from bridge_freeze_harness.train import forward_backward, make_provider, synthetic_batch
    from bridge_freeze_plugin import make_freezable

    selection = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)
    provider = make_freezable(make_provider("qwen3_vl"), selection)
    provider.register_pre_wrap_hook(LoRA(target_modules=["linear_qkv", "linear_proj"], dim=4, alpha=8))
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)
    chunks[0].ddp_config = DistributedDataParallelConfig()
    forward_backward(chunks[0], synthetic_batch("qwen3_vl", provider), "qwen3_vl")
    return Rig(chunks)


def test_lora_adapters_move_at_their_own_lr(lora_rig):
    rig = lora_rig
    trained = {n for n, p in rig.named.items() if p.requires_grad}
    adapters = {n for n in trained if not hasattr(rig.named[n], PART_ATTR)}
    assert adapters and all(".adapter." in n for n in adapters)  # the adapters, as Bridge's LoRA names them
    assert {rig.part_of(n) for n in trained - adapters} == {"vision_projection"}
    config = rig.config()
    moved = rig.step(config, _overrides(rig, config, lr_adapters=5e-3, lr_vision_projection=0.0))
    single = rig.step(rig.config(lr=5e-3))
    for name in trained:
        if name in adapters:
            assert torch.equal(moved[name], single[name]), name
        else:
            assert not torch.count_nonzero(moved[name]), name
    assert all(not torch.count_nonzero(moved[n]) for n in rig.named if n not in trained)
    with pytest.raises(PartLearningRateError, match="the language_model is frozen"):
        _overrides(rig, config, lr_language_model=1e-4)


def test_bridges_setup_optimizer_is_checked_automatically(rig, caplog):
    """Bridge's real ``setup_optimizer`` (``megatron.bridge.training.optim``), as activation wraps it: it builds the
    optimizer from the provider's overrides, then the plugin checks what it built. A provider whose per-part
    overrides never reach the optimizer (it hands Bridge only Bridge's default overrides) is caught."""
    from megatron.bridge.training import optim as bridge_optim
    from megatron.bridge.training import setup as bridge_setup
    from megatron.bridge.training.config import OptimizerConfigOverrideProvider, SchedulerConfig

    import bridge_freeze_plugin as bfp
    from bridge_freeze_plugin.optim import PartLROverrideProvider

    class IgnoredByTheBuild(PartLROverrideProvider):
        def build_config_overrides(self, context):
            return OptimizerConfigOverrideProvider().build_config_overrides(context)

    original = getattr(bridge_optim.setup_optimizer, "__bridge_freeze_wrapped__", None)
    # wrapped while active, in both modules (setup.py's name is the optim module's, or, after a deactivate /
    # activate cycle, a wrapper of its own around the same function)
    assert original is not None and bridge_setup.setup_optimizer.__bridge_freeze_wrapped__ is original
    scheduler_config = SchedulerConfig(lr_decay_style="linear", start_weight_decay=0.1, end_weight_decay=0.1,
                                       weight_decay_incr_style="constant")
    # the step counts Bridge's ConfigContainer derives from the training length
    scheduler_config.lr_warmup_steps, scheduler_config.lr_decay_steps, scheduler_config.wd_incr_steps = 0, 20, 20
    config = rig.config()
    with _cpu_for_cuda(), caplog.at_level(logging.INFO, logger="bridge_freeze_plugin"):
        optimizer, _scheduler = bridge_optim.setup_optimizer(
            config, scheduler_config, rig.chunks,
            optimizer_config_override_provider=PartLROverrideProvider(lr_vision_projection=2e-2))
    assert "per-part learning rates applied: vision_projection 0.02 (min 0.002)" in caplog.text  # the rank-0 line
    for group in optimizer.param_groups:
        parts = {rig.part_of(n) for n, p in rig.named.items() if any(p is q for q in group["params"])}
        assert group["max_lr"] == (2e-2 if parts == {"vision_projection"} else GLOBAL_LR), parts
    with _cpu_for_cuda(), pytest.raises(PartLearningRateError, match=r"lr_vision_projection=0\.02"):
        bridge_optim.setup_optimizer(config, scheduler_config, rig.chunks,
                                     optimizer_config_override_provider=IgnoredByTheBuild(lr_vision_projection=2e-2))
    bfp.deactivate()
    try:
        assert bridge_optim.setup_optimizer is original  # undone, in both modules
        assert bridge_setup.setup_optimizer is original
    finally:
        bfp.activate()
    assert bridge_optim.setup_optimizer.__bridge_freeze_wrapped__ is original


def test_megatrons_own_schedule_settings_are_never_unknown_per_part_keys(cpu_bridge):
    """A trainer's ``megatron_config`` carries Megatron's schedule settings (``lr_decay_style``...): shaped like an LR
    key, they are not per-part keys and must read (the list is checked against Bridge's own dataclasses)."""
    import dataclasses

    from megatron.bridge.training.config import OptimizerConfig, SchedulerConfig

    from bridge_freeze_plugin.optim._settings import MEGATRON_LR_SETTINGS, looks_like_lr_key

    fields = {f.name for c in (OptimizerConfig, SchedulerConfig) for f in dataclasses.fields(c)}
    shaped = {name for name in fields if name in MEGATRON_LR_SETTINGS or looks_like_lr_key(name)}
    assert shaped <= MEGATRON_LR_SETTINGS
    assert not any(looks_like_lr_key(name) for name in MEGATRON_LR_SETTINGS)
    assert looks_like_lr_key("lr_llm") and looks_like_lr_key("lr_vision")
