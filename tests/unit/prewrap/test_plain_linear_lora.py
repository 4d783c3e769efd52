"""LoRA on a plain ``torch.nn.Linear`` (an HF-implemented tower) is refused before training where the installed
Bridge's exports drop it (issue 37, item 5), and allowed where they carry it (issue 49).

Bridge 0.6.2's LoRA turns such a module into a bare ``LinearAdapter`` (no ``to_wrap``): its adapters train, but the
merged HF export merges only ``to_wrap`` bases, the adapter exports keep ``.adapter.`` weights only, and the RL sync
follows the export, so the training was lost while the demo printed OK. Bridge 0.7.0's keeps the layer as
``to_wrap`` next to the adapter, and its exports carry it. Which one the installed Bridge does is what its LoRA
builds; ``check-config`` asks its ``LoRA.transform`` once (``bridge_lora_wraps_plain_linear``), and both must agree.

The modules are found by scanning EVERY tiny family's real build for ``torch.nn.Linear`` (a new family is covered
by adding its harness module), never by a list:

- the family's ``plain_linear`` table (what ``check-config`` reads) covers exactly the modules the scan finds, and
  no Megatron linear layer lies under it;
- per family and per part holding such modules, Bridge's real LoRA targeting one of them, with every part's flag
  set (adapters only), is refused by the build (``UnexportableAdapterError`` naming the module) and by
  ``check-config`` where the installed Bridge makes a bare ``LinearAdapter``; where it keeps the layer as
  ``to_wrap`` (0.7.0), the build trains ``<module>.adapter.*`` only and ``check-config`` accepts the target.
  (``test_plain_linear_kept.py`` runs the kept form on any Bridge, with a stand-in LoRA.)
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from _family_parts import part_of

from bridge_freeze_harness.tiny import TINY_FAMILIES, build_tiny_chunks, build_tiny_model, family_module, make_provider
from bridge_freeze_plugin import UnexportableAdapterError, get_family
from bridge_freeze_plugin.prewrap import bridge_lora_wraps_plain_linear, linear_adapters
from bridge_freeze_plugin.request import INFO, Part


def _family(name: str) -> Any:
    module = family_module(name)
    return get_family(getattr(module, "FAMILY", module.__name__.rpartition(".")[2]))


def _plain_linears(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]


def _megatron_linears(model: torch.nn.Module) -> list[str]:
    return [n for n, m in model.named_modules()
            if type(m).__module__.startswith("megatron.core") and type(m).__name__.endswith("Linear")]


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.fixture(scope="module")
def scans(cpu_bridge) -> dict[str, dict[str, list[str]]]:
    found = {}
    for name in TINY_FAMILIES:
        provider = make_provider(name)
        model = build_tiny_model(name, provider)
        # the table of the layout this provider's class builds (Nemotron Omni on 0.7.0: `sound_model`, top level)
        table = _family(name).for_class(type(provider)).plain_linear
        found[name] = {"plain": _plain_linears(model), "megatron": _megatron_linears(model), "table": table}
    return found


@pytest.mark.parametrize("name", list(TINY_FAMILIES))
def test_the_family_table_covers_exactly_the_plain_linears_the_scan_finds(scans, name):
    plain, megatron, table = scans[name]["plain"], scans[name]["megatron"], scans[name]["table"]
    assert [n for n in plain if not _under(n, table)] == []
    assert [p for p in table if not any(_under(n, (p,)) for n in plain)] == []
    assert [n for n in megatron if _under(n, table)] == []


def _one_per_part(name: str, plain: list[str]) -> dict[str, str]:
    """part (by the tests' own table) -> the first plain ``torch.nn.Linear`` module the scan found in it."""
    chosen: dict[str, str] = {}
    for module in plain:
        chosen.setdefault(part_of(name, f"{module}.weight"), module)
    return chosen


def _lora(target: str) -> Any:
    from megatron.bridge.peft.lora import LoRA

    peft = LoRA(target_modules=[target], dim=4, alpha=8)

    def peft_pre_wrap_hook(model: Any) -> Any:
        model = peft(model, training=True)
        peft.set_params_to_save(model)
        return model

    return peft_pre_wrap_hook


def _every_flag(name: str) -> dict[str, bool]:
    return {INFO[Part(p)].flag: True for p in ("language_model", "vision_model", "vision_projection",
                                                  "audio_model", "audio_projection")
            if _family(name).has_part(Part(p))}


@pytest.mark.parametrize("name", list(TINY_FAMILIES))
def test_lora_on_a_plain_linear_follows_what_the_installed_bridge_exports(scans, name, capsys):
    from bridge_freeze_plugin.cli import main

    chosen = _one_per_part(name, scans[name]["plain"])
    if not chosen:
        assert _family(name).plain_linear == ()  # no HF linear layer in this family: nothing to refuse
        return
    kept = bridge_lora_wraps_plain_linear()
    assert kept is not None  # Bridge's LoRA imports in the test process: the probe answers
    flags = _every_flag(name)
    for part, module in chosen.items():
        provider = make_provider(name, **flags)
        provider.register_pre_wrap_hook(_lora(module))
        config = [f"megatron_config.{flag}=true" for flag in flags]
        if kept:  # this Bridge keeps the Linear as to_wrap: built, adapters only, check-config agrees
            (chunk,) = build_tiny_chunks(name, provider=provider)
            trained = sorted(n for n, p in chunk.named_parameters() if p.requires_grad)
            assert trained and all(n.startswith(f"{module}.adapter.") for n in trained), (part, trained)
            assert linear_adapters(chunk) == []
        else:
            with pytest.raises(UnexportableAdapterError) as err:
                build_tiny_chunks(name, provider=provider)
            assert err.value.modules == (module,), part
            assert module in str(err.value) and "LinearAdapter" in str(err.value)
        code = main(["check-config", "--layout", "sft", "--family", _family(name).name, *config,
                     "model.lora.rank=4", f"model.lora.target_modules=['{module}']"])
        message = capsys.readouterr().err
        if kept:
            assert code == 0, (part, message[-400:])
        else:
            assert code != 0 and module in message and "LinearAdapter" in message, (part, message[-400:])


def test_lora_on_megatron_layers_next_to_an_hf_tower_still_builds(cpu_bridge):
    provider = make_provider("qwen25_vl", freeze_language_model=True, freeze_vision_model=True)
    provider.register_pre_wrap_hook(_lora("language_model.*linear_qkv"))
    (chunk,) = build_tiny_chunks("qwen25_vl", provider=provider)
    adapters = {n for n, p in chunk.named_parameters() if p.requires_grad and ".adapter." in n}
    assert adapters and all(n.startswith("language_model.") for n in adapters)
