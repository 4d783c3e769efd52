"""A family's provider class made anew after activation is patched too (issue 22, item 11).

``importlib.reload`` of a Bridge provider module (a notebook's autoreload, a framework that reloads
configs) creates NEW class objects that the import-time patch never saw. Before the fix, GLM-4.5V then
trained five vision-encoder tensors that were asked frozen (Bridge's own freeze leaves them out), and
Qwen3-VL-MoE's provider default froze the language model and vision encoder again. Expected trainable sets
are computed from the parameter names, independently of the plugin's tables.
"""

from __future__ import annotations

import importlib

import pytest
from _shared import names, trainable

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider


@pytest.fixture
def reloaded(cpu_bridge):
    """Reload a Bridge module; afterwards put back the objects it held (other tests keep the old classes)."""
    saved = {}

    def reload(name):
        module = importlib.import_module(name)
        saved.setdefault(name, dict(module.__dict__))
        return importlib.reload(module)

    yield reload
    for name, namespace in saved.items():
        module = importlib.import_module(name)
        module.__dict__.clear()
        module.__dict__.update(namespace)


def test_reloaded_glm45v_provider_freezes_the_whole_vision_encoder(reloaded):
    old = importlib.import_module("megatron.bridge.models.glm_vl.glm_45v_provider").GLM45VModelProvider
    module = reloaded("megatron.bridge.models.glm_vl.glm_45v_provider")
    new = module.GLM45VModelProvider
    assert new is not old
    assert hasattr(new.provide, "__bridge_freeze_wrapped__")
    provider = make_provider("glm45v")
    assert type(provider) is new
    provider.freeze_vision_model = True
    chunks = build_tiny_chunks("glm45v", provider=provider)
    everything = names(chunks)
    expected = {n for n in everything if not n.startswith("visual.") or n.startswith("visual.merger.")}
    assert trainable(chunks) == expected
    # the tensors Bridge's own freeze leaves out are among the frozen ones
    assert {n for n in everything if n.startswith(("visual.embeddings.", "visual.post_layernorm."))} - expected


def test_reloaded_qwen3_vl_moe_provider_defaults_to_train_everything(reloaded):
    module = reloaded("megatron.bridge.models.qwen_vl.qwen3_vl_provider")
    provider = make_provider("qwen3_vl_moe")
    assert type(provider) is module.Qwen3VLMoEModelProvider
    assert (provider.freeze_language_model, provider.freeze_vision_model) == (False, False)
    chunks = build_tiny_chunks("qwen3_vl_moe", provider=provider)
    assert trainable(chunks) == names(chunks)
    overridden = {o.flag for o in bfp.last_report(provider).overridden_defaults}
    assert overridden == {"freeze_language_model", "freeze_vision_model"}  # the class body's True, named


def test_a_reloaded_class_is_restored_by_deactivate(reloaded):
    module = reloaded("megatron.bridge.models.glm_vl.glm_45v_provider")
    new = module.GLM45VModelProvider
    wrapped = new.provide
    bfp.deactivate()
    try:
        assert new.provide is wrapped.__bridge_freeze_wrapped__
    finally:
        bfp.activate()
