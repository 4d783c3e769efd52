"""A Megatron-Bridge outside the tested range is named once, at activation, on rank 0, with the range (issue 36).

The real Bridge 0.6.2 is imported; its ``package_info.VERSION`` is set to another version for the duration of a
test (the only way to meet another Bridge in CI, which installs the pinned release), then the plugin is
deactivated and activated again, as a process importing that Bridge would activate it."""

from __future__ import annotations

import logging

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin.activation import _version

MESSAGE = "outside the tested range (>= 0.6.0, < 0.8.0)"


@pytest.fixture
def reactivate(cpu_bridge, monkeypatch, caplog):
    """``reactivate(version)``: Bridge says ``version``; deactivate + activate; the plugin's WARNING lines."""
    import megatron.bridge.package_info as info

    monkeypatch.setattr(_version, "_WARNED", set())
    caplog.set_level(logging.WARNING, logger="bridge_freeze_plugin")

    def run(version: tuple[object, ...]) -> list[str]:
        monkeypatch.setattr(info, "VERSION", version)
        caplog.clear()
        bfp.deactivate()
        bfp.activate()
        return [r.getMessage() for r in caplog.records if r.name == "bridge_freeze_plugin"
                and r.levelno == logging.WARNING and "tested range" in r.getMessage()]

    yield run
    monkeypatch.undo()
    bfp.deactivate()
    bfp.activate()


@pytest.mark.parametrize("version", [(0, 6, 0, ""), (0, 6, 2, ""), (0, 7, 0, ""), (0, 7, 1, "rc0")])
def test_a_bridge_in_the_tested_range_activates_silently(reactivate, version):
    assert reactivate(version) == []


@pytest.mark.parametrize(("version", "named"), [((0, 5, 9, ""), "0.5.9"), ((0, 8, 0, "rc1"), "0.8.0rc1"),
                                                 ((1, 0, 0, ""), "1.0.0")])
def test_a_bridge_outside_the_range_is_named_once_with_the_range(reactivate, version, named):
    (line,) = reactivate(version)
    assert line.startswith(f"bridge-freeze: Megatron-Bridge {named} is {MESSAGE}")
    assert reactivate(version) == []  # once per process: a second activation says nothing more


def test_only_rank_0_names_it(reactivate, monkeypatch):
    monkeypatch.setattr(_version, "is_rank0", lambda: False)  # the session's world is one rank: be rank 1
    assert reactivate((0, 9, 0, "")) == []
