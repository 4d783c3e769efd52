"""The harness's import-time stubs: a stub module exists only while a chosen module executes, and the
harness package's docstring names every one of its modules."""

from __future__ import annotations

import ast
import sys
import types
from pathlib import Path

import pytest

from bridge_freeze_harness._stub_window import StubWindowFinder

HARNESS = Path(__file__).resolve().parents[3] / "bridge_freeze_harness"


@pytest.fixture
def target_module(tmp_path, monkeypatch):
    """A module ``stub_window_target`` on the path whose top-level code imports ``stub_window_dep`` (absent)."""
    (tmp_path / "stub_window_target.py").write_text(
        "import sys\nimport stub_window_dep\nSEEN = stub_window_dep.VALUE\n"
        "PRESENT_WHILE_EXECUTING = 'stub_window_dep' in sys.modules\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "stub_window_target"
    sys.modules.pop("stub_window_target", None)


def _stub() -> dict[str, types.ModuleType]:
    module = types.ModuleType("stub_window_dep")
    module.VALUE = 7  # type: ignore[attr-defined]
    return {"stub_window_dep": module}


def test_the_stub_exists_only_while_the_target_executes(target_module):
    finder = StubWindowFinder({target_module}, _stub)
    sys.meta_path.insert(0, finder)
    try:
        module = __import__(target_module)
    finally:
        sys.meta_path.remove(finder)
    assert (module.SEEN, module.PRESENT_WHILE_EXECUTING) == (7, True)
    assert "stub_window_dep" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        __import__("stub_window_dep")


def test_an_entry_present_before_is_put_back_and_other_modules_are_not_wrapped(target_module, monkeypatch):
    before = types.ModuleType("stub_window_dep")
    before.VALUE = 1  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "stub_window_dep", before)
    finder = StubWindowFinder({target_module}, _stub)
    assert finder.find_spec("json_not_a_target", None) is None
    sys.meta_path.insert(0, finder)
    try:
        module = __import__(target_module)
    finally:
        sys.meta_path.remove(finder)
    assert module.SEEN == 7
    assert sys.modules["stub_window_dep"] is before


def test_install_is_idempotent():
    finder = StubWindowFinder({"no_such_module_here"}, _stub)
    try:
        finder.install()
        finder.install()
        assert sum(entry is finder for entry in sys.meta_path) == 1
    finally:
        sys.meta_path.remove(finder)


def test_the_package_docstring_names_every_module():
    """Each module and subpackage of the harness (listed from the files, not from the docstring) is named there."""
    modules = {p.stem for p in HARNESS.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in HARNESS.glob("*/__init__.py")}
    doc = ast.get_docstring(ast.parse((HARNESS / "__init__.py").read_text(encoding="utf-8"))) or ""
    assert {m for m in modules if f":mod:`.{m}`" not in doc} == set()
    assert {"cpu_training", "run_records", "_resiliency_stub", "hf_checkpoint", "demo_flow", "tiny"} <= modules


def test_a_te_class_placeholder_answers_isinstance(cpu_bridge):
    """Without TE, megatron-core binds its TE class names to MagicMock instances; ``isinstance`` against one raises
    TypeError (Bridge 0.7.0's Qwen3-VL attention asks it in every forward). The harness's Bridge import makes each a
    class no real module is an instance of."""
    import torch
    from megatron.core.extensions import transformer_engine as te_extension

    if te_extension.HAVE_TE:
        pytest.skip("TransformerEngine is installed: its classes are real")
    module = torch.nn.Linear(2, 2)
    assert not isinstance(module, te_extension.TEDotProductAttention)
    assert not any(isinstance(module, getattr(te_extension, name)) for name in dir(te_extension)
                   if name.startswith("TE") and isinstance(getattr(te_extension, name), type))


def test_a_class_derived_from_a_te_placeholder_answers_isinstance(cpu_bridge, monkeypatch):
    """megatron-core 0.20 derives classes from its TE placeholders (``class InferenceColumnParallelLinear(
    TEColumnParallelLinear)``) and its multi-token-prediction layer asks ``isinstance`` against them: over a
    ``MagicMock`` instance such a class statement binds another instance, and ``plan`` on Qwen3.5-VL / EXAONE 4.5
    failed with ``TypeError: isinstance() arg 2 must be a type`` (issue 49). The stand-in makes each such name (and a
    class derived from it in turn) a class too."""
    from unittest import mock

    import torch
    from megatron.core.extensions import transformer_engine as te_extension

    from bridge_freeze_harness import _te_stub

    if te_extension.HAVE_TE:
        pytest.skip("TransformerEngine is installed: its classes are real")
    monkeypatch.setattr(te_extension, "TEStandInLinear", mock.MagicMock(), raising=False)
    derived = types.ModuleType("megatron.core.stand_in_derived")
    exec("from megatron.core.extensions.transformer_engine import TEStandInLinear\n"
         "class InferenceStandIn(TEStandInLinear):\n    pass\n"
         "class InferenceStandInTwice(InferenceStandIn):\n    pass\n", derived.__dict__)
    monkeypatch.setitem(sys.modules, derived.__name__, derived)
    assert not isinstance(derived.InferenceStandIn, type)  # what megatron-core 0.20 finds without TE
    _te_stub.te_placeholders_as_types()
    module = torch.nn.Linear(2, 2)
    for name in ("InferenceStandIn", "InferenceStandInTwice"):
        assert isinstance(getattr(derived, name), type), name
        assert not isinstance(module, getattr(derived, name))
    assert isinstance(te_extension.TEStandInLinear, type)
