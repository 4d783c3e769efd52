"""Activation state: deactivate vs autoload, subclass defaults after deactivate, a reloaded activation module,
two threads building from one provider."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

from _shared import PROJECTION_ONLY, projection_names, trainable

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_model, make_provider
from bridge_freeze_plugin import (
    make_freezable,
)

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

    from bridge_freeze_plugin.activation import _activate as activation

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
    from bridge_freeze_plugin.prewrap import provide_frozen

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


def test_a_provider_class_this_bridge_lacks_is_said_once_at_debug(cpu_bridge, caplog):
    """A family may name a class another Bridge version has (Gemma4DenseVLProvider is not in 0.6.0, SkyRL's pin):
    nothing can build it, so nothing goes unhonoured; it was a WARNING at every activation (issue 36, item 4)."""
    import logging

    absent = "NoSuchVLProviderInThisBridge"
    with caplog.at_level(logging.DEBUG, logger="bridge_freeze_plugin"), \
            _activated_with("absent_provider_probe", f"megatron.bridge.models.gpt_provider:{absent}"):
        pass  # what the activation inside logged is the subject
    said = [r for r in caplog.records if absent in r.getMessage()]
    assert [r.levelno for r in said] == [logging.DEBUG]
    assert "absent_provider_probe" in said[0].getMessage()


def test_a_provider_module_this_bridge_lacks_is_never_imported_and_says_nothing(cpu_bridge, caplog):
    """A family whose whole provider module is absent (EXAONE 4.5 and MiniMax-M3 on SkyRL's pin 91a15142): the
    plugin only watches for its import, so activation neither fails nor logs."""
    import importlib.util
    import logging

    module = "megatron.bridge.models.no_such_family_in_this_bridge.provider"
    with caplog.at_level(logging.DEBUG, logger="bridge_freeze_plugin"), \
            _activated_with("absent_module_probe", f"{module}:NoSuchVLProvider"):
        assert importlib.util.find_spec("megatron.bridge.models.no_such_family_in_this_bridge") is None
    assert [r.getMessage() for r in caplog.records if "no_such_family_in_this_bridge" in r.getMessage()] == []


@contextlib.contextmanager
def _activated_with(name: str, provider: str) -> Iterator[None]:
    """A probe family naming ``provider`` registered, the plugin re-activated inside; unregistered after."""
    bfp.register_family(name, providers=[provider], language_model=["language_model"], vision_model=["vision_model"])
    try:
        bfp.deactivate()
        bfp.activate()
        yield
    finally:
        bfp.REGISTRY.unregister(name)
        bfp.activate()
