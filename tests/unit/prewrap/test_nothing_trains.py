"""A build wrapped for training that would train nothing is refused at the build (issue 46 item 7 and the SkyRL
case of its trainers' section): patterns that cover the whole model (``freeze_patterns=['.*']``), or every flag set
through a trainer's own keys, used to build 0 trainable parameters, and Bridge then crashed with ``'NoneType' object
has no attribute 'param_groups'``. A build no optimizer trains (``wrap_with_ddp=False``: a conversion, an export) is
still allowed to freeze everything."""

from __future__ import annotations

import pytest

from bridge_freeze_harness.cpu_training import cpu_training
from bridge_freeze_harness.ddp_steps import build_ddp_chunks
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import NothingTrainsError, make_freezable
from bridge_freeze_plugin.request import FreezeSelection

FAMILY = "qwen3_vl"


def _ddp_build(provider):
    with cpu_training(FAMILY):
        return build_ddp_chunks(provider, FAMILY, distributed_optimizer=False, bf16=False, device="cpu")


@pytest.mark.parametrize("selection", [
    FreezeSelection(freeze_patterns=(".*",)),
    FreezeSelection(freeze_language_model=True, freeze_patterns=(r"vision_model\..*",)),
    FreezeSelection(freeze_language_model=True, freeze_vision_model=True, freeze_vision_projection=True),
], ids=["every-name", "patterns-cover-the-rest", "every-flag"])
def test_a_training_build_that_trains_nothing_is_refused_naming_the_request(cpu_bridge, selection):
    provider = make_freezable(make_provider(FAMILY), selection)
    with pytest.raises(NothingTrainsError) as info:
        _ddp_build(provider)
    message = str(info.value)
    assert "has no trainable parameter" in message and "nothing would train" in message
    assert "Unset a freeze flag, narrow the freeze patterns" in message
    for pattern in selection.freeze_patterns:
        assert repr(pattern) in message


def test_every_flag_set_on_the_provider_as_a_trainer_sets_it_is_refused(cpu_bridge):
    """SkyRL's transformer_config_kwargs and NeMo-RL's megatron_cfg reach the provider as plain attributes."""
    provider = make_provider(FAMILY)
    provider.freeze_language_model = provider.freeze_vision_model = provider.freeze_vision_projection = True
    with pytest.raises(NothingTrainsError, match="freeze_language_model"):
        _ddp_build(provider)


def test_a_build_not_wrapped_for_training_may_freeze_everything(cpu_bridge):
    provider = make_freezable(make_provider(FAMILY), FreezeSelection(freeze_patterns=(".*",)))
    chunks = build_tiny_chunks(FAMILY, provider)
    params = [p for c in chunks for p in c.parameters()]
    assert params and not any(p.requires_grad for p in params)


def test_one_trained_tensor_is_enough(cpu_bridge):
    """The refusal is for nothing at all: a train pattern keeping one tensor trainable builds."""
    selection = FreezeSelection(freeze_patterns=(".*",), train_patterns=(r"vision_model\.merger\.linear_fc2\.bias",))
    chunks = _ddp_build(make_freezable(make_provider(FAMILY), selection))
    trained = {n for c in chunks for n, p in c.named_parameters() if p.requires_grad}
    assert trained == {"module.vision_model.merger.linear_fc2.bias"}, trained
