"""``save_trainable_only`` on a model built for training without Bridge's ``ConfigContainer.validate()``.

The field acts through the config step the plugin adds to ``validate()`` (``cfg.peft``, the base checks). A trainer
that builds the model without it would save the whole model (or fail at its first save, after training): the
build that may train is refused before it starts. Builds that cannot train (unwrapped, as an export or ``plan``
makes them) are not refused. What a config that went through ``validate()`` builds is
``tests/unit/integration/test_trainable_checkpoints.py``'s subject (Bridge's real ``finetune()``).
"""

from __future__ import annotations

import pytest
from _shared import PROJECTION_ONLY, QWEN3_PROJECTION, trainable
from _shared import names as all_names

from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import TrainableOnlyCheckpointError, make_freezable

pytestmark = pytest.mark.usefixtures("cpu_bridge")


def _provider():
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    provider.save_trainable_only = True
    return provider


def test_a_training_build_without_validate_is_refused_before_it_builds():
    # refused before Bridge looks at its arguments (no ddp_config given: Bridge's own ValueError would come next)
    provider = _provider()
    with pytest.raises(TrainableOnlyCheckpointError,
                       match=r"Qwen3VLModelProvider.*save_trainable_only=true.*without Bridge's "
                             r"ConfigContainer\.validate\(\).*set save_trainable_only=false"):
        provider.provide_distributed_model(wrap_with_ddp=True, use_cpu_initialization=True)


def test_the_same_provider_builds_unwrapped_and_without_the_field():
    provider = _provider()
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)  # wrap_with_ddp=False: nothing trains it
    assert trainable(chunks) == {n for n in all_names(chunks) if QWEN3_PROJECTION.match(n)}
    provider.save_trainable_only = False  # the plugin lets the wrapped build through: Bridge's own check answers
    with pytest.raises(ValueError, match="ddp_config is required when wrap_with_ddp is True"):
        provider.provide_distributed_model(wrap_with_ddp=True, use_cpu_initialization=True)


def test_the_save_and_validate_steps_leave_a_config_without_a_model_to_bridge():
    """Bridge's own checkpoint tests save with a ``Mock(spec=[...])`` state whose config has no ``model``: the
    plugin's steps must hand such a call to Bridge's function untouched (they raised AttributeError)."""
    from types import SimpleNamespace
    from unittest import mock

    from bridge_freeze_plugin.stages._trainable_checkpoint import prepare_config, recording_base

    def save_checkpoint(state, model, optimizer, opt_param_scheduler, num_floating_point_operations_so_far,
                        checkpointing_context=None, non_persistent_ckpt=False):
        return ("saved", state)

    state = SimpleNamespace(cfg=mock.Mock(spec=["checkpoint"]))
    assert recording_base(save_checkpoint)(state, None, None, None, 0) == ("saved", state)
    assert prepare_config(mock.Mock(spec=["checkpoint"])) is None
