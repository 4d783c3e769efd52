"""The promise tried as users and their frameworks treat providers and hooks (issue "Reliability").

Each test here failed before its fix: serialising a freezable provider, guarantee blind spots behind
wrappers and new modules, deactivation undone by the autoload hook, two threads building from one
provider, defaults of subclasses defined while active, a reloaded activation module, registry inputs.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, build_tiny_model, make_provider
from bridge_freeze_plugin import (
    EmptyPartError,
    FamilyRegistrationError,
    FreezeFlagTypeError,
    FreezeGuaranteeError,
    FreezeSelection,
    make_freezable,
)

QWEN3_PROJECTION = re.compile(r"^vision_model\.(merger|decoder\.deepstack_merger_list)\.")
PROJECTION_ONLY = FreezeSelection(freeze_language_model=True, freeze_vision_model=True)


def trainable(model) -> set[str]:
    chunks = model if isinstance(model, list) else [model]
    return {n for c in chunks for n, p in c.named_parameters() if p.requires_grad}


def names(model) -> set[str]:
    chunks = model if isinstance(model, list) else [model]
    return {n for c in chunks for n, _ in c.named_parameters()}


def projection_names(model) -> set[str]:
    return {n for n in names(model) if QWEN3_PROJECTION.match(n)}


# ---- 1. a make_freezable provider pickles, deep-copies and survives Bridge's run_config round trip ----


def test_freezable_provider_pickles_and_unpickles_in_a_fresh_process(cpu_bridge, tmp_path):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    again = pickle.loads(pickle.dumps(provider))
    assert type(again) is type(provider) and again.freeze_selection == PROJECTION_ONLY
    assert copy.deepcopy(provider).freeze_selection == PROJECTION_ONLY
    path = tmp_path / "provider.pkl"
    path.write_bytes(pickle.dumps(provider))
    script = textwrap.dedent(
        f"""
        import json, pickle
        from bridge_freeze_harness.cpu_runtime import import_bridge
        from bridge_freeze_harness.tiny import build_tiny_model
        import_bridge()  # TransformerEngine's CPU stand-in (a GPU machine imports Bridge as it is)
        provider = pickle.loads(open({str(path)!r}, "rb").read())
        model = build_tiny_model("qwen3_vl", provider=provider)
        print(json.dumps(sorted(n for n, p in model.named_parameters() if p.requires_grad)))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    model = build_tiny_model("qwen3_vl", provider=make_provider("qwen3_vl"))
    assert set(json.loads(out.stdout.strip().splitlines()[-1])) == projection_names(model)


def _bridge_yaml_round_trip(provider):
    """What Bridge does with ``cfg.model`` in run_config.yaml: to_dict + safe YAML, then instantiate."""
    import yaml
    from megatron.bridge.training.utils.config_utils import _ConfigContainerBase
    from megatron.bridge.utils.instantiate_utils import InstantiationMode, instantiate
    from megatron.training.config.yaml_utils import safe_yaml_representers

    as_dict = _ConfigContainerBase._convert_value_to_dict(provider)
    with safe_yaml_representers():
        text = yaml.safe_dump(as_dict)
    return as_dict["_target_"], instantiate(yaml.safe_load(text), mode=InstantiationMode.LENIENT)


def test_freezable_provider_survives_bridges_run_config_round_trip(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    target, loaded = _bridge_yaml_round_trip(provider)
    assert not any(segment.startswith("_") for segment in target.split("."))
    assert type(loaded) is type(provider) and loaded.freeze_selection == PROJECTION_ONLY
    model = build_tiny_model("qwen3_vl", provider=loaded)
    assert trainable(model) == projection_names(model)


def test_the_generated_module_only_extends_provider_classes():
    from bridge_freeze_plugin.mixins import generated

    forged = generated.class_name(subprocess.Popen)  # a class no family names, outside Bridge's allowlist
    with pytest.raises(AttributeError):
        getattr(generated, forged)


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


# ---- 4, 6, 7: activation state ----


def _fresh(script: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "BRIDGE_FREEZE_DISABLE_AUTOLOAD"}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True,
                         env={**env, "HF_HUB_OFFLINE": "1"}, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_deactivate_before_importing_bridge_is_not_undone_by_autoload():
    result = _fresh(
        """
        import json, bridge_freeze_plugin
        bridge_freeze_plugin.deactivate()
        from bridge_freeze_harness.cpu_runtime import import_bridge
        import_bridge()
        from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider
        f = Qwen3VLMoEModelProvider.__dataclass_fields__
        print(json.dumps({"active": bridge_freeze_plugin.is_active(),
                          "wrapped": hasattr(Qwen3VLMoEModelProvider.provide, "__bridge_freeze_wrapped__"),
                          "lm_default": f["freeze_language_model"].default}))
        """
    )
    assert result == {"active": False, "wrapped": False, "lm_default": True}


def test_a_subclass_defined_while_active_gets_bridges_defaults_back_after_deactivate(cpu_bridge):
    import dataclasses

    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider

    @dataclasses.dataclass
    class Mine(Qwen3VLMoEModelProvider):
        pass

    assert (Mine().freeze_language_model, Mine().freeze_vision_model) == (False, False)
    bfp.deactivate()
    try:
        assert (Mine().freeze_language_model, Mine().freeze_vision_model) == (True, True)  # stock Bridge
    finally:
        bfp.activate()
    assert (Mine().freeze_language_model, Mine().freeze_vision_model) == (False, False)


def test_reloading_the_activation_module_keeps_the_patch_record(cpu_bridge):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider

    from bridge_freeze_plugin import activation

    assert hasattr(Qwen3VLMoEModelProvider.provide, "__bridge_freeze_wrapped__")
    reloaded = importlib.reload(activation)
    try:
        reloaded.deactivate()
        assert not hasattr(Qwen3VLMoEModelProvider.provide, "__bridge_freeze_wrapped__")
        assert Qwen3VLMoEModelProvider().freeze_language_model is True
    finally:
        reloaded.activate()
    assert Qwen3VLMoEModelProvider().freeze_language_model is False


# ---- 5. two threads building from one provider ----


def test_a_second_thread_sees_and_builds_with_the_real_flags_while_the_first_builds(cpu_bridge):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLModelProvider

    from bridge_freeze_harness.tiny import build_context
    from bridge_freeze_plugin.build.pipeline import provide_frozen

    provider = make_freezable(make_provider("qwen3_vl"), PROJECTION_ONLY)
    bridge_provide = Qwen3VLModelProvider.provide.__bridge_freeze_wrapped__
    inside, release, seen = threading.Event(), threading.Event(), {}

    def slow_bridge_build(*args, **kwargs):
        seen["first thread, inside Bridge's provide"] = provider.freeze_language_model
        inside.set()
        assert release.wait(60)
        return bridge_provide(provider, *args, **kwargs)

    def first():
        with build_context("qwen3_vl"):
            seen["first model"] = provide_frozen(provider, slow_bridge_build, True, True, None)

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(120)
        seen["second thread"] = provider.freeze_language_model
        second = build_tiny_model("qwen3_vl", provider=provider)
    finally:
        release.set()
        thread.join(120)
    assert seen["first thread, inside Bridge's provide"] is False  # hidden from Bridge's own freeze()
    assert seen["second thread"] is True  # ... on that thread only
    assert trainable(second) == projection_names(second)
    assert trainable(seen["first model"]) == projection_names(seen["first model"])


# ---- 8. registry inputs, empty parts, flag values, the opt-out variable ----


def _spec(**kw):
    base = {"providers": ["pkg.mod:Prov"], "language_model": ["lm"], "vision_model": ["vis"],
            "vision_projection": ["proj"]}
    return bfp.FamilySpec(name="toy", **{**base, **kw})


@pytest.mark.parametrize("providers", [[None], [3], None, 7])
def test_register_family_refuses_non_string_providers_with_a_typed_error(providers):
    with pytest.raises(FamilyRegistrationError, match="providers"):
        _spec(providers=providers)


def test_a_provider_class_object_is_accepted_as_its_import_path():
    class Prov:
        pass

    assert _spec(providers=[Prov]).providers == (f"{__name__}:{Prov.__qualname__}",)


@pytest.mark.parametrize("prefix", [" lm", "module.lm", "language_model.*", "a..b", "lm ", "a.b-c"])
def test_prefixes_that_can_never_match_are_refused(prefix):
    with pytest.raises(FamilyRegistrationError, match="can never match"):
        _spec(language_model=[prefix])


def test_a_wrong_table_that_leaves_a_part_empty_raises_naming_it(cpu_bridge):
    import dataclasses

    from megatron.bridge.models.qwen_vl.qwen25_vl_provider import Qwen25VLModelProvider

    @dataclasses.dataclass
    class TypoQwen25(Qwen25VLModelProvider):
        pass

    path = f"{TypoQwen25.__module__}:{TypoQwen25.__qualname__}"
    bfp.register_family("typo_qwen25", providers=[path], language_model=["language_model"],
                        vision_model=["visual"], vision_projection=["visual.mergr"])
    try:
        provider = make_provider("qwen25_vl")
        provider.__class__ = TypoQwen25
        provider.freeze_vision_model = True
        with pytest.raises(EmptyPartError, match=r"typo_qwen25.*vision_projection.*visual\.mergr"):
            build_tiny_chunks("qwen25_vl", provider=provider)
    finally:
        bfp.REGISTRY.unregister("typo_qwen25")


def test_a_numpy_bool_flag_is_named_as_such():
    numpy = pytest.importorskip("numpy")
    with pytest.raises(FreezeFlagTypeError, match=r"numpy\.bool") as err:
        FreezeSelection(freeze_language_model=numpy.True_)
    assert "of type bool" not in str(err.value)


@pytest.mark.parametrize(("value", "disabled"), [("", False), ("0", False), ("off", False), ("No", False),
                                                  ("1", True), ("true", True), (" ON ", True), ("yes", True)])
def test_the_opt_out_variable_is_read_as_a_boolean(monkeypatch, value, disabled):
    import _bridge_freeze_autoload as autoload

    monkeypatch.setenv(autoload.ENV_DISABLE, value)
    assert autoload.autoload_disabled() is disabled


def test_an_opt_out_value_that_is_not_a_boolean_disables_with_a_warning(monkeypatch):
    import _bridge_freeze_autoload as autoload

    monkeypatch.setenv(autoload.ENV_DISABLE, "maybe")
    with pytest.warns(RuntimeWarning, match="not a boolean"):
        assert autoload.autoload_disabled() is True


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
        if cls.__module__.startswith("megatron.bridge.") and fields & set(bfp.FLAGS):
            found.append(cls)
    return found


def test_every_bridge_provider_with_a_flag_is_covered_or_refused_by_name(cpu_bridge):
    from bridge_freeze_plugin.families.unsupported import UNSUPPORTED_PROVIDERS
    from bridge_freeze_plugin.registry import class_path

    classes = _bridge_provider_classes_with_a_flag()
    assert len(classes) >= 20  # Bridge 0.6.2 ships 25: the enumeration itself works
    uncovered = {class_path(c) for c in classes if bfp.family_for_provider(c) is None}
    assert uncovered == set(UNSUPPORTED_PROVIDERS)  # a new Bridge provider fails here until it is decided
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

    from bridge_freeze_plugin.state import STATE

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


def test_patterns_written_by_make_freezable_reach_the_build_and_survive_run_config(cpu_bridge):
    layer_1 = r"language_model\.decoder\.layers\.1"
    selection = FreezeSelection(True, True, False, train_patterns=[layer_1])
    provider = make_freezable(make_provider("qwen3_vl"), selection)
    model = build_tiny_model("qwen3_vl", provider=provider)
    expected = projection_names(model) | {n for n in names(model) if n.startswith("language_model.decoder.layers.1.")}
    assert len(expected) > len(projection_names(model)) and trainable(model) == expected
    _, loaded = _bridge_yaml_round_trip(provider)
    assert list(loaded.train_patterns) == [layer_1]
    again = build_tiny_model("qwen3_vl", provider=loaded)
    assert trainable(again) == expected
