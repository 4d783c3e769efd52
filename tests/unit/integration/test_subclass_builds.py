"""Provider subclasses that change the build (issue 46 items 1-3): what they add keeps what they decided, a pattern
exempts only what it names, and their own ``provide_distributed_model()`` keeps the plugin's hook chain.

Each subclass is written here, as a user or Bridge 0.7.0 writes one, over the real Qwen3.5-VL provider built tiny
on the CPU. Expected trainable sets come from parameter names and the rules stated in each test, never from the
plugin.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_context, make_provider

FAMILY = "qwen35_vl"
HEAD = "language_model.output_layer."
TABLE = "language_model.label_table.weight"
PROJECTION = ("vision_model.merger.", "vision_model.decoder.deepstack")
ADAPTER = re.compile(r"\.adapter\.|lora_")
LABELS = 3


def _vision(name: str) -> bool:
    return name.startswith("vision_model.") and not name.startswith(PROJECTION)


@pytest.fixture(scope="module")
def classes(cpu_bridge) -> dict[str, type]:
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider

    @dataclasses.dataclass
    class HeadAndTable(Qwen35VLModelProvider):
        """A fresh trainable head, and a fixed label table the subclass freezes itself."""

        def provide(self, pre_process=None, post_process=None, vp_stage=None):
            model = super().provide(pre_process=pre_process, post_process=post_process, vp_stage=vp_stage)
            model.language_model.output_layer = torch.nn.Linear(self.hidden_size, LABELS, bias=True)
            model.language_model.label_table = torch.nn.Embedding(LABELS, self.hidden_size).requires_grad_(False)
            return model

    @dataclasses.dataclass
    class StrictDistributed(Qwen35VLModelProvider):
        """Its own provide_distributed_model with a strict signature (no **kwargs): builds without the plugin."""

        def provide_distributed_model(self, wrap_with_ddp=True, use_cpu_initialization=False,
                                      mixed_precision_wrapper=None):
            return super().provide_distributed_model(wrap_with_ddp=wrap_with_ddp,
                                                     use_cpu_initialization=use_cpu_initialization,
                                                     mixed_precision_wrapper=mixed_precision_wrapper)

    @dataclasses.dataclass
    class ForwardsWhatItKnows(Qwen35VLModelProvider):
        """Takes **kwargs but forwards only the keywords it knows."""

        def provide_distributed_model(self, wrap_with_ddp=True, **kwargs):
            known = {k: kwargs[k] for k in ("use_cpu_initialization", "mixed_precision_wrapper") if k in kwargs}
            return super().provide_distributed_model(wrap_with_ddp=wrap_with_ddp, **known)

    return {"head_and_table": HeadAndTable, "strict": StrictDistributed, "forwards": ForwardsWhatItKnows}


def build(cls: type, path: str, hook: Any = None, **selection: Any) -> tuple[Any, torch.nn.Module]:
    provider = make_provider(FAMILY, **selection)
    provider.__class__ = cls
    if hook is not None:
        provider.register_pre_wrap_hook(hook)
    with build_context(FAMILY):
        if path == "provide":
            return provider, provider.provide(pre_process=True, post_process=True)
        (chunk,) = provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True,
                                                     mixed_precision_wrapper=None)
        return provider, chunk


def trainable(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def names(model: torch.nn.Module) -> set[str]:
    return {n for n, _ in model.named_parameters()}


PATHS = ["provide", "provide_distributed_model"]


# -- item 1: a pattern exempts only the additions it names ---------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_an_unrelated_freeze_pattern_does_not_let_a_flag_freeze_the_new_head(classes, path):
    """On main the additions check returned early once any freeze pattern was set: the head built frozen."""
    with pytest.raises(bfp.UnsupportedFreezeFlagError) as err:
        build(classes["head_and_table"], path, freeze_language_model=True,
              freeze_patterns=(r"vision_model\.patch_embed\..*",))
    message = str(err.value)
    assert f"{HEAD}bias, {HEAD}weight" in message and "no train or freeze pattern names them" in message
    assert TABLE not in message  # the subclass froze the table itself: nothing a flag takes from it


@pytest.mark.parametrize("path", PATHS)
def test_a_freeze_pattern_naming_the_head_freezes_it_on_purpose(classes, path):
    provider, model = build(classes["head_and_table"], path, freeze_language_model=True,
                            freeze_patterns=(r"language_model\.output_layer\..*",))
    assert trainable(model) == {n for n in names(model) if not n.startswith("language_model.")}
    assert bfp.last_report(provider).trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)


# -- item 2: what a subclass froze stays frozen unless a pattern names it ------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_a_table_the_subclass_froze_stays_frozen_with_no_flag_set(classes, path):
    """On main the plugin made it train: installing the plugin changed what trains."""
    provider, model = build(classes["head_and_table"], path)
    assert trainable(model) == names(model) - {TABLE}
    report = bfp.last_report(provider)
    assert report.trainable == sum(p.numel() for n, p in model.named_parameters() if n != TABLE)
    (note,) = [n for n in report.notes if "added after the family's build" in n]
    assert note.startswith("language_model: 1 tensor(s)") and "stay frozen" in note and TABLE in note


@pytest.mark.parametrize("path", PATHS)
def test_the_subclasss_frozen_table_stays_frozen_next_to_a_flag(classes, path):
    provider, model = build(classes["head_and_table"], path, freeze_vision_model=True)
    assert trainable(model) == {n for n in names(model) if not _vision(n)} - {TABLE}
    assert any(TABLE in note for note in bfp.last_report(provider).notes)


@pytest.mark.parametrize("path", PATHS)
def test_a_train_pattern_naming_the_table_makes_it_train(classes, path):
    provider, model = build(classes["head_and_table"], path, train_patterns=(r"language_model\.label_table\..*",))
    assert trainable(model) == names(model)
    assert not any("added after the family's build" in note for note in bfp.last_report(provider).notes)


@pytest.mark.parametrize("path", PATHS)
def test_the_plugin_installed_trains_what_the_subclass_trains_without_it(classes, path):
    """Installing the plugin (no flag set) changes nothing a subclass decided: the same build deactivated."""
    _, active = build(classes["head_and_table"], path)
    bfp.deactivate()
    try:
        _, plain = build(classes["head_and_table"], path)
    finally:
        bfp.activate()
    assert not plain.language_model.label_table.weight.requires_grad  # the subclass's own decision
    assert trainable(active) == trainable(plain)


# -- item 3: a subclass's own provide_distributed_model() keeps the hook chain -------------------------------------


def _lora() -> Any:
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=["linear_qkv"], dim=4, alpha=8)


@pytest.mark.parametrize("kind", ["strict", "forwards"])
def test_a_subclasss_own_provide_distributed_model_keeps_the_chain(classes, kind):
    """On main: the strict one raised TypeError (pre_wrap_hook=), the other dropped the chain and LoRA froze the
    projection (0 merger tensors trained) with no report."""
    provider, model = build(classes[kind], "provide_distributed_model", hook=_lora(),
                            freeze_language_model=True, freeze_vision_model=True)
    everything = names(model)
    expected = {n for n in everything if n.startswith(PROJECTION) or ADAPTER.search(n)}
    assert any(n.startswith(PROJECTION) for n in expected) and any(ADAPTER.search(n) for n in expected)
    assert trainable(model) == expected
    report = bfp.last_report(provider)
    assert report is not None and report.trainable == sum(p.numel() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("kind", ["strict", "forwards"])
def test_a_subclasss_own_provide_distributed_model_keeps_the_guarantee(classes, kind):
    """A hook that unfreezes a frozen part is still caught through the subclass's method."""
    def unfreeze(chunks):
        for chunk in chunks:
            for name, param in chunk.named_parameters():
                if name.startswith("language_model."):
                    param.requires_grad_(True)
        return chunks

    with pytest.raises(bfp.FreezeGuaranteeError):
        build(classes[kind], "provide_distributed_model", hook=unfreeze, freeze_language_model=True)
