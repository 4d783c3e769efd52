"""The plugin is invisible to what Bridge and users do with a provider (issue 21, point 1).

A Bridge provider IS its model's config: Bridge copies it, pickles it, walks its ``__dict__`` during the HF
export (``remove_non_pickleables``, which copies every object it reaches and assigns its attributes back: a
frozen plugin object there crashed every export), serialises it to ``run_config.yaml`` and compares it. On a
provider of every tiny family, after a build with a flag and after a build without, each operation must give
what it gives on a provider the plugin never touched: the provider's own fields, nothing of the plugin's.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle

import pytest
import torch
from _family_parts import parts_of

from bridge_freeze_harness.tiny import TINY_FAMILIES, build_context, build_tiny_chunks, make_provider
from bridge_freeze_plugin.prewrap import bridge_class
from bridge_freeze_plugin.request import FLAGS

FAMILIES = sorted(TINY_FAMILIES)


def _plugin_objects(value, depth=0, seen=None):
    """Every object of the plugin's own modules reachable from ``value`` (its ``__dict__``, containers)."""
    seen = set() if seen is None else seen
    if id(value) in seen or depth > 6:
        return []
    seen.add(id(value))
    found = [value] if type(value).__module__.startswith("bridge_freeze_plugin") else []
    children = []
    if isinstance(value, dict):
        children = list(value.values())
    elif isinstance(value, (list, tuple, set, frozenset)):
        children = list(value)
    elif hasattr(value, "__dict__") and not isinstance(value, (type, torch.nn.Module, torch.Tensor)):
        children = list(vars(value).values())
    for child in children:
        found += _plugin_objects(child, depth + 1, seen)
    return found


def _fields(provider) -> dict:
    return {f.name: getattr(provider, f.name) for f in dataclasses.fields(provider)}


@pytest.fixture(scope="module", params=FAMILIES)
def built(request, cpu_bridge):
    """(family, provider built with a flag, provider built without, chunks of the flagged build)."""
    import bridge_freeze_plugin as bfp

    name = request.param
    encoder = "vision_model" if "vision_model" in parts_of(name) else "audio_model"  # a part the family has
    flagged = bfp.make_freezable(make_provider(name), bfp.FreezeSelection(**{f"freeze_{encoder}": True}))
    chunks = build_tiny_chunks(name, provider=flagged)
    plain = make_provider(name)
    build_tiny_chunks(name, provider=plain)
    assert bfp.last_report(flagged) is not None  # the plugin did build and remember its report
    return name, flagged, plain, chunks


def _providers(built):
    _, flagged, plain, _ = built
    return [flagged, plain]


def test_nothing_of_the_plugin_is_reachable_from_the_provider(built):
    for provider in _providers(built):
        assert _plugin_objects(vars(provider)) == []
        assert not [k for k in vars(provider) if "bridge_freeze" in k]


def test_copy_and_deepcopy_keep_every_field(built):
    for provider in _providers(built):
        for twin in (copy.copy(provider), copy.deepcopy(provider)):
            assert type(twin) is type(provider)
            assert twin.freeze_vision_model == provider.freeze_vision_model
            assert [f.name for f in dataclasses.fields(twin)] == [f.name for f in dataclasses.fields(provider)]
            assert _plugin_objects(vars(twin)) == []


def test_pickle_round_trip(built):
    for provider in _providers(built):
        clone = copy.copy(provider)
        clone._pg_collection = None  # process groups never pickle (Bridge drops them the same way)
        again = pickle.loads(pickle.dumps(clone))
        assert type(again) is type(provider)
        assert _fields(again).keys() == _fields(provider).keys()
        assert [getattr(again, f) for f in FLAGS] == [getattr(provider, f) for f in FLAGS]
        assert _plugin_objects(vars(again)) == []


@pytest.mark.parametrize("depth", [1, 2, 3, 4, 6])
def test_remove_non_pickleables_at_any_depth(built, depth):
    """What Bridge's QKV / gate-up / GDN mappings call on the model config during ``export_hf_weights``."""
    from megatron.bridge.models.conversion.utils import remove_non_pickleables

    for provider in _providers(built):
        before = _fields(provider)
        cleaned = remove_non_pickleables(provider, max_depth=depth)
        assert type(cleaned) is type(provider)
        assert cleaned.freeze_vision_model == provider.freeze_vision_model
        after = _fields(provider)
        assert before.keys() == after.keys()
        assert all(before[k] is after[k] for k in before)  # the provider itself is untouched


def test_dataclasses_fields_asdict_replace(built):
    for provider in _providers(built):
        names = [f.name for f in dataclasses.fields(provider)]
        assert len(names) == len(set(names))
        assert not [n for n in names if n.startswith("__bridge_freeze")]
        replaced = dataclasses.replace(provider, freeze_language_model=True)
        assert replaced.freeze_language_model is True
        assert replaced.freeze_vision_model == provider.freeze_vision_model
        shallow = {f.name: getattr(provider, f.name) for f in dataclasses.fields(provider)}
        assert _plugin_objects(shallow) == []


def test_equality_hash_and_repr(built):
    for provider in _providers(built):
        twin = copy.copy(provider)
        assert twin == provider
        assert type(provider).__hash__ is bridge_class(provider).__hash__
        text = repr(provider)
        assert "FreezeReport" not in text and "ProviderState" not in text and "bridge_freeze" not in text


def test_run_config_round_trip(built, tmp_path):
    """Bridge's own serialiser for ``run_config.yaml`` (``ConfigContainer`` writes providers with it)."""
    from megatron.bridge.training.utils.config_utils import _ConfigContainerBase as Container

    _, flagged, plain, _ = built
    for provider in (flagged, plain):
        as_dict = Container._convert_value_to_dict(provider)
        text = repr(as_dict)
        assert "FreezeReport" not in text and "ProviderState" not in text
        # a flag the class does not declare is written only when set (issue 46 item 5: a load without the plugin)
        assert as_dict.get("freeze_vision_model", False) is provider.freeze_vision_model


def test_provider_config_serialisation(built, tmp_path):
    """``provider.save_hf_pretrained(dir)`` (Bridge's own config file of a provider) writes and reads back."""
    _, flagged, _, _ = built
    clone = copy.copy(flagged)
    clone._pg_collection = None
    try:
        clone.save_hf_pretrained(tmp_path)
    except Exception as error:  # noqa: BLE001 - compare with the same call on a provider without the plugin
        pytest.fail(f"save_hf_pretrained failed on a plugin provider: {error!r}")
    written = list(tmp_path.iterdir())
    assert written
    text = "".join(p.read_text(errors="ignore") for p in written if p.is_file())
    assert "FreezeReport" not in text and "ProviderState" not in text and "__bridge_freeze__" not in text


def test_parameter_marks_stay_out_of_state_dicts(built):
    """The part mark on parameters (``bridge_freeze_part``) is no tensor: state dicts carry tensors only."""
    _, _, _, chunks = built
    chunk = chunks[0]
    state = chunk.state_dict()
    assert not [k for k in state if "bridge_freeze" in k]
    assert all(not hasattr(v, "bridge_freeze_part") for v in state.values() if isinstance(v, torch.Tensor))
    flat = _flatten(chunk.sharded_state_dict())
    assert flat and not [k for k in flat if "bridge_freeze" in k]


def _flatten(tree, prefix=""):
    out = {}
    if isinstance(tree, dict):
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
    else:
        out[prefix.rstrip(".")] = tree
    return out


def test_a_model_that_is_not_a_module_passes_through_when_nothing_is_asked(cpu_bridge, monkeypatch):
    """Bridge's own provider tests stub the model class with a Mock: with no selection the plugin must not
    touch what ``provide()`` returns; with a flag set it cannot be honoured, so it raises (never silently)."""
    from unittest.mock import Mock

    import bridge_freeze_plugin as bfp

    built = Mock()
    monkeypatch.setattr("megatron.bridge.models.qwen_vl.qwen3_vl_provider.Qwen3VLModel", Mock(return_value=built))
    provider = make_provider("qwen3_vl")
    with build_context("qwen3_vl"):
        assert provider.provide(pre_process=True, post_process=True) is built
        provider.freeze_vision_model = True
        with pytest.raises(bfp.UnsupportedFreezeFlagError, match=r"freeze_vision_model=True.*not a torch module"):
            provider.provide(pre_process=True, post_process=True)
