"""A subclass of a family's provider whose ``provide()`` changes the model after its base's build (issue 36).

Written here as Bridge 0.7.0 writes ``Qwen35TokenClassificationModelProvider`` (not in 0.6.2): a subclass of the
real Qwen3.5-VL provider whose ``provide()`` calls the (plugin-wrapped) ``super().provide()`` and then puts a
fresh classifier head at ``language_model.output_layer`` (0.7.0 builds megatron-core's ``LinearForLastLayer``; a
torch ``Linear`` of the same shape here: only the parameters matter). The plugin applies the selection to the
model the outermost ``provide()`` returns, on every build path; a head a flag would freeze is refused by name,
a train pattern keeps it training, and the report counts what trains. Expected sets come from names here.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_context, make_provider

FAMILY = "qwen35_vl"
HEAD = "language_model.output_layer."
LABELS = 3


@pytest.fixture(scope="module")
def classifier(cpu_bridge) -> type:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider

    @dataclasses.dataclass
    class Qwen35TokenClassificationModelProvider(Qwen35VLModelProvider):
        num_labels: int = LABELS

        def provide(self, pre_process=None, post_process=None, vp_stage=None):
            model = super().provide(pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
            if model.language_model is not None and model.language_model.post_process:
                model.language_model.output_layer = torch.nn.Linear(self.hidden_size, self.num_labels, bias=True)
            return model

    return Qwen35TokenClassificationModelProvider


def build(classifier: type, path: str, **selection: Any) -> tuple[Any, torch.nn.Module]:
    from megatron.bridge.models import model_provider as mp
    from megatron.core.process_groups_config import ProcessGroupCollection

    provider = make_provider(FAMILY, **selection)
    provider.__class__ = classifier
    with build_context(FAMILY):
        if path == "provide":
            return provider, provider.provide(pre_process=True, post_process=True)  # one stage: the whole model
        if path == "provide_distributed_model":
            (chunk,) = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True,
                                                         mixed_precision_wrapper=None)
            return provider, chunk
        provider._pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        (chunk,) = mp.get_model(provider, None, wrap_with_ddp=False, use_cpu_initialization=True,
                                mixed_precision_wrapper=None, pg_collection=provider._pg_collection)
        return provider, chunk


PATHS = ["provide", "provide_distributed_model", "get_model"]


def check(provider: Any, model: torch.nn.Module, expected: set[str]) -> None:
    params = dict(model.named_parameters())
    assert params[HEAD + "weight"].shape[0] == LABELS  # the subclass's head is in the model built
    assert {n for n, p in params.items() if p.requires_grad} == expected
    report = bfp.last_report(provider)
    assert report.trainable == sum(p.numel() for n, p in params.items() if n in expected)
    assert report.total == sum(p.numel() for p in params.values())


@pytest.mark.parametrize("path", PATHS)
def test_a_flag_that_would_freeze_the_subclasss_new_head_is_refused_by_name(classifier, path):
    with pytest.raises(bfp.UnsupportedFreezeFlagError) as err:
        build(classifier, path, freeze_language_model=True)
    message = str(err.value)
    assert "Qwen35TokenClassificationModelProvider.provide() adds or replaces parameters" in message
    assert f"{HEAD}bias, {HEAD}weight" in message and "train_patterns=['language_model.output_layer']" in message


@pytest.mark.parametrize("path", PATHS)
def test_a_frozen_backbone_classifier_trains_its_head_by_a_train_pattern(classifier, path):
    provider, model = build(classifier, path, freeze_language_model=True,
                            train_patterns=("language_model\\.output_layer",))
    names = {n for n, _ in model.named_parameters()}
    check(provider, model, {n for n in names if not n.startswith("language_model.") or n.startswith(HEAD)})


@pytest.mark.parametrize("path", PATHS)
def test_a_selection_that_leaves_the_head_training_builds_as_asked(classifier, path):
    provider, model = build(classifier, path, freeze_vision_model=True)
    names = {n for n, _ in model.named_parameters()}
    check(provider, model, {n for n in names if not n.startswith("vision_model.")
                            or n.startswith(("vision_model.merger.", "vision_model.decoder.deepstack"))})
