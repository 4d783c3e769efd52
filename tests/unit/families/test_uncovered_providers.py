"""Every Bridge provider with one of the three flags is covered by a family, refused by name, or (its own flag)
left to Bridge's freeze."""

from __future__ import annotations

import dataclasses
import importlib
import re

import pytest

import bridge_freeze_plugin as bfp

# ---- 2. every Bridge provider with one of the three flags is covered by a family, or refused ----


def _bridge_provider_classes_with_a_flag():
    import dataclasses
    import pkgutil

    import megatron.bridge.models as models
    from megatron.bridge.models.model_provider import ModelProviderMixin

    for info in pkgutil.walk_packages(models.__path__, models.__name__ + "."):
        try:
            importlib.import_module(info.name)
        except ImportError:  # data-loading helpers needing packages Bridge does not require (qwen_vl_utils...)
            continue
    found, stack = [], list(ModelProviderMixin.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        # A private base (Bridge 0.7.0's _NemotronOmniModelProviderBase declares freeze_sound_*) is nobody's
        # provider: its public subclasses, which inherit its flags, are checked instead.
        # Only what the walk imports: another test may already have imported (or stood in for) a provider outside
        # megatron.bridge.models (the diffusion LM of test_freeze_providers_listing), which __subclasses__ then sees.
        if cls.__module__.startswith("megatron.bridge.models.") and fields & set(bfp.FLAGS) and not _private(cls):
            found.append(cls)
    return found


def _private(cls: type) -> bool:
    return cls.__name__.startswith("_")


def test_every_bridge_provider_with_a_flag_is_covered_or_refused_by_name(cpu_bridge):
    from bridge_freeze_plugin.families import class_path
    from bridge_freeze_plugin.families.unsupported import UNSUPPORTED_PROVIDERS

    classes = _bridge_provider_classes_with_a_flag()
    assert len(classes) >= 20  # Bridge 0.6.2 ships 25: the enumeration itself works
    uncovered = {class_path(c) for c in classes if bfp.family_for_provider(c) is None}
    walked = {p for p in UNSUPPORTED_PROVIDERS if p.startswith("megatron.bridge.models.")}  # what the walk imports
    assert uncovered == walked  # a new Bridge provider fails here until it is decided
    for cls in classes:
        if class_path(cls) not in uncovered:
            assert hasattr(cls.provide, "__bridge_freeze_wrapped__"), cls
            continue
        why = re.escape(UNSUPPORTED_PROVIDERS[class_path(cls)])
        own = {f.name for f in dataclasses.fields(cls)}
        for flag in bfp.FLAGS:
            provider = cls.__new__(cls)  # no config needed: the refusal comes before anything is read
            provider.__dict__[flag] = True
            for method in (provider.provide, provider.provide_distributed_model):
                if flag in own:  # the class's own flag: Bridge's own freeze applies it, never our refusal
                    with pytest.raises(Exception) as err:  # a config-less provider fails inside Bridge
                        method()
                    assert not isinstance(err.value, bfp.UnsupportedFreezeFlagError), (cls, flag)
                else:
                    with pytest.raises(bfp.UnsupportedFreezeFlagError, match=why):
                        method()


def test_a_providers_own_flag_is_left_to_bridges_freeze_and_said_once(cpu_bridge, caplog):
    """MegatronMIMOProvider declares and applies freeze_language_model itself (issue 21: it was refused)."""
    import logging

    from megatron.bridge.models.megatron_mimo.megatron_mimo_provider import MegatronMIMOProvider

    from bridge_freeze_plugin.prewrap import STATE

    STATE.left_to_bridge.discard(MegatronMIMOProvider)
    calls = []
    original = MegatronMIMOProvider.provide.__bridge_freeze_guarded__
    provider = MegatronMIMOProvider.__new__(MegatronMIMOProvider)
    provider.__dict__["freeze_language_model"] = True
    with caplog.at_level(logging.WARNING, logger="bridge_freeze_plugin"):
        for _ in range(2):
            with pytest.raises(Exception) as err:  # reaches Bridge's own provide()
                provider.provide()
            calls.append(err.value)
    assert not any(isinstance(e, bfp.UnsupportedFreezeFlagError) for e in calls)
    said = [r.getMessage() for r in caplog.records if "MegatronMIMOProvider" in r.getMessage()]
    assert len(said) == 1 and "freeze_language_model=True is applied by Bridge's freeze" in said[0]
    assert callable(original)
    provider.__dict__["freeze_vision_model"] = True  # not a MIMO field: nothing would honour it
    with pytest.raises(bfp.UnsupportedFreezeFlagError, match="MegatronMIMOProvider"):
        provider.provide()


def test_a_text_provider_with_a_flag_refuses_instead_of_training_everything(cpu_bridge):
    from megatron.bridge.models.gpt_provider import GPTModelProvider

    provider = GPTModelProvider(num_layers=1, hidden_size=16, num_attention_heads=2)
    provider.freeze_language_model = True
    with pytest.raises(bfp.UnsupportedFreezeFlagError, match="GPTModelProvider"):
        provider.provide()
    with pytest.raises(bfp.UnsupportedFreezeFlagError, match="GPTModelProvider"):
        provider.provide_distributed_model(wrap_with_ddp=False, use_cpu_initialization=True)


def test_a_provider_class_defined_after_activation_is_guarded_and_deactivate_removes_guards(cpu_bridge):
    import dataclasses

    from megatron.bridge.models.gpt_provider import GPTModelProvider

    @dataclasses.dataclass
    class MyText(GPTModelProvider):
        def provide(self, pre_process=None, post_process=None, vp_stage=None):
            return "built"

    mine = MyText(num_layers=1, hidden_size=16, num_attention_heads=2)
    mine.freeze_vision_model = True
    with pytest.raises(bfp.UnsupportedFreezeFlagError, match="MyText"):
        mine.provide()
    bfp.deactivate()
    try:
        assert mine.provide() == "built"  # stock behaviour: nothing checks the flag
        assert not hasattr(GPTModelProvider.provide, "__bridge_freeze_guarded__")
    finally:
        bfp.activate()
    with pytest.raises(bfp.UnsupportedFreezeFlagError):
        mine.provide()
