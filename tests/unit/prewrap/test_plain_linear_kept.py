"""LoRA that keeps a plain ``torch.nn.Linear`` as ``to_wrap`` is allowed, on any Bridge (issue 49).

Since Bridge 2a030ca5c (in 0.7.0) LoRA wraps a plain ``torch.nn.Linear`` (an HF-implemented tower) the way it
wraps a Megatron layer: a wrapper holding the original layer as ``to_wrap`` and a ``LinearAdapter`` as
``adapter``; Bridge's exports carry it. Bridge 0.6.2 makes a bare ``LinearAdapter`` copy, which no export carries.
The plugin reads which form the installed Bridge built from the model, and check-config from Bridge's own
``LoRA.transform`` tried on a tiny ``torch.nn.Linear``, never from a version.

Here a stand-in LoRA (a subclass of the installed Bridge's ``LoRA``, written for this test) keeps the layer as
``to_wrap`` on any Bridge, so CI on 0.6.2 runs the kept form too; the bare form stays refused
(``test_plain_linear_lora.py``, the build; and below, the probe on 0.6.2).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from bridge_freeze_harness.tiny import build_tiny_chunks, build_tiny_model, make_provider
from bridge_freeze_plugin.prewrap import bridge_lora_wraps_plain_linear, linear_adapters

FAMILY = "qwen25_vl"  # its vision tower is HF-implemented (plain torch.nn.Linear)
FLAGS = {"freeze_language_model": True, "freeze_vision_model": True, "freeze_vision_projection": True}


class _Kept(torch.nn.Module):
    """The kept form: the original layer as ``to_wrap``, the LoRA delta as ``adapter``."""

    def __init__(self, to_wrap: torch.nn.Linear, adapter: torch.nn.Module) -> None:
        super().__init__()
        self.to_wrap = to_wrap
        self.adapter = adapter

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.to_wrap(x) + self.adapter(x)
        if isinstance(self.adapter, torch.nn.Linear):  # 0.6.2's LinearAdapter adds its own copy of the base
            out = out - torch.nn.functional.linear(x, self.adapter.weight, self.adapter.bias)
        return out


def _keeping_lora() -> type:
    """A LoRA whose ``transform`` keeps a targeted plain ``torch.nn.Linear`` as ``to_wrap`` (0.7.0's form)."""
    from megatron.bridge.peft.lora import LoRA
    from megatron.bridge.peft.lora_layers import LinearAdapter

    class KeepingLoRA(LoRA):
        def transform(self, module: torch.nn.Module, name: str | None = None, prefix: str | None = None) -> Any:
            if isinstance(module, (_Kept, LinearAdapter)):
                return module
            if type(module) is torch.nn.Linear and self.match(module, name, prefix) is not None:
                return _Kept(module, LinearAdapter(module, dim=self.dim, alpha=self.alpha))
            return super().transform(module, name, prefix)

    return KeepingLoRA


def _hook(peft: Any) -> Any:
    def peft_pre_wrap_hook(model: Any) -> Any:
        model = peft(model, training=True)
        peft.set_params_to_save(model)
        return model

    return peft_pre_wrap_hook


@pytest.fixture(scope="module")
def target(cpu_bridge) -> str:
    """The first plain ``torch.nn.Linear`` of the tiny model's vision tower (found by a scan, not named)."""
    model = build_tiny_model(FAMILY)
    return next(n for n, m in model.named_modules() if type(m) is torch.nn.Linear and n.startswith("visual."))


@contextlib.contextmanager
def _installed_lora(lora_class: type) -> Iterator[None]:
    """``megatron.bridge.peft.lora.LoRA`` is ``lora_class`` inside (the probe asked afresh), restored after."""
    import megatron.bridge.peft.lora as lora_module

    original = lora_module.LoRA
    bridge_lora_wraps_plain_linear.cache_clear()
    lora_module.LoRA = lora_class
    try:
        yield
    finally:
        lora_module.LoRA = original
        bridge_lora_wraps_plain_linear.cache_clear()


def test_the_kept_form_builds_with_every_flag_set_and_trains_the_adapter_only(target):
    provider = make_provider(FAMILY, **FLAGS)
    provider.register_pre_wrap_hook(_hook(_keeping_lora()(target_modules=[target], dim=4, alpha=8)))
    (chunk,) = build_tiny_chunks(FAMILY, provider=provider)
    trained = sorted(n for n, p in chunk.named_parameters() if p.requires_grad)
    assert trained == [f"{target}.adapter.linear_in.weight", f"{target}.adapter.linear_out.weight"]
    assert linear_adapters(chunk) == []
    assert isinstance(chunk.get_submodule(f"{target}.to_wrap"), torch.nn.Linear)


def test_a_bare_adapter_next_to_a_kept_one_is_still_named(target):
    from megatron.bridge.peft.lora_layers import LinearAdapter

    linear = torch.nn.Linear(4, 4)
    model = torch.nn.ModuleDict({"kept": _Kept(linear, LinearAdapter(linear, dim=2)),
                                 "bare": LinearAdapter(torch.nn.Linear(4, 4), dim=2)})
    assert linear_adapters(model) == ["bare"]


def test_check_config_follows_the_installed_lora(target, capsys):
    from bridge_freeze_plugin.cli import main

    args = ["check-config", "--layout", "sft", "--family", "qwen25_vl",
            *(f"megatron_config.{flag}=true" for flag in FLAGS), "model.lora.rank=4",
            f"model.lora.target_modules=['{target}']"]
    with _installed_lora(_keeping_lora()):
        assert bridge_lora_wraps_plain_linear() is True
        code = main(args)
        message = capsys.readouterr().err
    assert code == 0, message[-600:]
    import megatron.bridge.peft.lora as lora_module

    kept = bridge_lora_wraps_plain_linear()
    probe = lora_module.LoRA(target_modules=["x"], dim=1).transform(torch.nn.Linear(2, 2), name="x", prefix="")
    assert kept is (getattr(probe, "adapter", None) is not None and hasattr(probe, "to_wrap"))
    code = main(args)
    message = capsys.readouterr().err
    if kept:
        assert code == 0, message[-600:]
    else:  # 0.6.2: the bare copy, refused by name with what to do
        assert code != 0 and target in message and "bare LinearAdapter" in message, message[-600:]


def test_an_untried_lora_keeps_the_rule(target, capsys):
    from bridge_freeze_plugin.cli import main

    class Broken:
        def __init__(self, **_: Any) -> None:
            raise ImportError("transformer_engine")

    with _installed_lora(Broken):
        assert bridge_lora_wraps_plain_linear() is None
        code = main(["check-config", "--layout", "sft", "--family", "qwen25_vl",
                     *(f"megatron_config.{flag}=true" for flag in FLAGS), "model.lora.rank=4",
                     f"model.lora.target_modules=['{target}']"])
        message = capsys.readouterr().err
    assert code != 0 and "could not be tried" in message, message[-600:]
