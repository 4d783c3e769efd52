"""LoRA with full-rank parts (issue "LoRA plus full-rank parts"), on real tiny Bridge models with Bridge's real LoRA.

With LoRA on, a part whose flag is false trains at full rank next to the adapters; a part whose flag is set
trains through its adapters only. Expected sets are written here from the models' parameter names (regexes
over the module layout), independently of the plugin.
"""

from __future__ import annotations

import functools
import re
from types import SimpleNamespace

import pytest
from _shared import QWEN3_PROJECTION, VLM_FLAGS, names, trainable

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import FreezeSelection, LoraOverlapError, make_freezable

FLAGGED = [s for s in FreezeSelection.all_selections() if s.any_set]  # 7: LoRA with no flag is plain LoRA

QWEN3_PARTS = {  # Qwen3-VL: the projection lives inside vision_model
    "vision_projection": QWEN3_PROJECTION,
    "vision_model": re.compile(r"^vision_model\."),
    "language_model": re.compile(r"^language_model\."),
}
#: LoRA's adapters on a Megatron linear (LoRALinear): "<target>.adapter.linear_{in,out}.weight";
#: on a plain nn.Linear (LinearAdapter, HF towers): "<target>.linear_{in,out}.weight".
MEGATRON_ADAPTER = re.compile(r"\.adapter\.linear_(in|out)\.weight$")


def part_of(name: str, parts: dict[str, re.Pattern[str]]) -> str:
    return next(part for part, rx in parts.items() if rx.match(name.replace(".to_wrap.", ".")))


def lora(targets):
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=list(targets), dim=4, alpha=8)


def bridge_peft_hook(peft):
    """Bridge's own PEFT step (``setup._apply_peft_transformation``: apply for training, record params_to_save) as a
    pre-wrap hook. Bridge's ``setup()`` wraps it in a closure over ``cfg`` that first loads the pretrained
    checkpoint (``setup._create_peft_pre_wrap_hook``): that whole path runs in
    tests/unit/integration/test_bridge_training.py."""
    from megatron.bridge.training.setup import _apply_peft_transformation

    return functools.partial(_apply_peft_transformation, peft)


def bridge_checkpoint_filter(state_dict, peft):
    """Bridge's own filter of what a PEFT checkpoint saves, on the model section."""
    from megatron.bridge.training.checkpointing import apply_peft_adapter_filter_to_state_dict

    return apply_peft_adapter_filter_to_state_dict({"model": state_dict}, peft)["model"]


def build_qwen3(selection, peft, *, as_bridge_hook=True):
    provider = make_freezable(make_provider("qwen3_vl"), selection)
    provider.register_pre_wrap_hook(bridge_peft_hook(peft) if as_bridge_hook else peft)
    return provider, build_tiny_chunks("qwen3_vl", provider=provider)


# Targets: LoRA on the attention of the LM and of the Megatron vision encoder (never the mergers), or on the
# LM only (full names, Bridge's wildcard syntax).
TARGETS = {
    "attention-everywhere": (["linear_qkv", "linear_proj"], {"language_model", "vision_model"}),
    "language-model-only": (["language_model.*linear_qkv", "language_model.*linear_proj"], {"language_model"}),
}


@pytest.mark.parametrize("targets", list(TARGETS), ids=list(TARGETS))
@pytest.mark.parametrize("selection", FLAGGED, ids=lambda s: s.describe().replace(" ", "_"))
def test_each_selection_with_lora_trains_adapters_plus_full_rank_parts_or_refuses_overlap(
    cpu_bridge, selection, targets
):
    target_modules, wrapped_parts = TARGETS[targets]
    full_rank_parts = {p.value for p in selection.trained_parts()}
    overlap = full_rank_parts & wrapped_parts
    peft = lora(target_modules)
    if overlap:
        with pytest.raises(LoraOverlapError) as err:
            build_qwen3(selection, peft)
        plain = names(build_tiny_chunks("qwen3_vl", provider=make_provider("qwen3_vl")))
        expected = {n for n in plain if n.rpartition(".")[0] in _attention_modules(overlap)}
        assert {p.split(" ")[0] for p in err.value.parameters} == expected
        assert "target_modules" in str(err.value) and "full rank" in str(err.value)
        return
    provider, chunks = build_qwen3(selection, peft)
    all_names = names(chunks)
    adapters = {n for n in all_names if MEGATRON_ADAPTER.search(n)}
    assert {part_of(n, QWEN3_PARTS) for n in adapters} == wrapped_parts
    full_rank = {n for n in all_names - adapters if part_of(n, QWEN3_PARTS) in full_rank_parts}
    assert trainable(chunks) == adapters | full_rank
    # Bridge's checkpoint filter keeps exactly what trains: the adapters and the full-rank parts.
    kept = {n for n in all_names if peft.adapter_key_filter(n)}
    assert kept == adapters | full_rank
    report = bfp.last_report(provider)
    for count in report.parts:
        part_adapters = {n for n in adapters if part_of(n, QWEN3_PARTS) == count.part.value}
        assert count.adapter_tensors == len(part_adapters)
        assert count.trainable_tensors - count.adapter_tensors == len(
            {n for n in full_rank if part_of(n, QWEN3_PARTS) == count.part.value})


def _attention_modules(parts: set[str]) -> set[str]:
    out = set()
    for layer in range(2):
        if "language_model" in parts:
            out |= {f"language_model.decoder.layers.{layer}.self_attention.linear_{m}" for m in ("qkv", "proj")}
        if "vision_model" in parts:
            out |= {f"vision_model.decoder.layers.{layer}.self_attention.linear_{m}" for m in ("qkv", "proj")}
    return out


def test_lora_without_a_flag_is_plain_lora(cpu_bridge):
    provider, chunks = build_qwen3(FreezeSelection(), lora(["linear_qkv"]))
    assert trainable(chunks) == {n for n in names(chunks) if MEGATRON_ADAPTER.search(n)}
    # the report's headline says what check-config says (was: "train language_model + vision_model +
    # vision_projection (+ LoRA adapters)" with 0 full-rank parameters)
    first = bfp.last_report(provider).format().splitlines()[0]
    assert first.endswith(": train LoRA adapters only"), first


def test_lora_with_a_partial_selection_headline_names_the_full_rank_parts(cpu_bridge):
    provider, _ = build_qwen3(FreezeSelection(True, True, False), lora(["language_model.*linear_qkv"]))
    first = bfp.last_report(provider).format().splitlines()[0]
    assert first.endswith(": train vision_projection at full rank, and LoRA adapters"), first


def test_bridges_default_targets_overlap_the_qwen3_mergers(cpu_bridge):
    """Bridge's default LoRA targets include linear_fc1 / linear_fc2: the merger's own linears."""
    from megatron.bridge.peft.lora import LoRA

    with pytest.raises(LoraOverlapError) as err:
        build_qwen3(FreezeSelection(True, True, False), LoRA(dim=4, alpha=8))
    listed = {p.split(" ")[0] for p in err.value.parameters}
    assert listed == {n for n in _qwen3_projection_linears()}


def _qwen3_projection_linears() -> set[str]:
    merger = {f"vision_model.merger.linear_fc{i}.{w}" for i in (1, 2) for w in ("weight", "bias")}
    deepstack = {f"vision_model.decoder.deepstack_merger_list.{k}.linear_fc{i}.{w}"
                 for k in range(2) for i in (1, 2) for w in ("weight", "bias")}
    return merger | deepstack


@pytest.mark.parametrize("order", ["lora-first", "lora-last", "lora-prepended"])
def test_hook_order_does_not_change_what_trains(cpu_bridge, order):
    import torch

    def perturb_in_place(model):  # like HF weight loading: copies into the existing tensors
        with torch.no_grad():
            for chunk in model:
                for p in chunk.parameters():
                    p.add_(0.0)
        return model

    selection = FreezeSelection(True, True, False)
    provider = make_freezable(make_provider("qwen3_vl"), selection)
    peft_hook = bridge_peft_hook(lora(["linear_qkv"]))
    if order == "lora-first":
        provider.register_pre_wrap_hook(peft_hook)
        provider.register_pre_wrap_hook(perturb_in_place)
    elif order == "lora-last":
        provider.register_pre_wrap_hook(perturb_in_place)
        provider.register_pre_wrap_hook(peft_hook)
    else:
        provider.register_pre_wrap_hook(perturb_in_place)
        provider.register_pre_wrap_hook(peft_hook, prepend=True)
    chunks = build_tiny_chunks("qwen3_vl", provider=provider)
    all_names = names(chunks)
    expected = {n for n in all_names if MEGATRON_ADAPTER.search(n) or QWEN3_PARTS["vision_projection"].match(n)}
    assert trainable(chunks) == expected


def test_a_peft_object_registered_as_the_hook_works_too(cpu_bridge):
    peft = lora(["linear_qkv"])
    _, chunks = build_qwen3(FreezeSelection(True, True, False), peft, as_bridge_hook=False)
    projection = {n for n in names(chunks) if QWEN3_PARTS["vision_projection"].match(n)}
    assert projection and projection <= trainable(chunks)
    assert projection <= peft.params_to_save


def test_the_peft_behind_a_hook_is_found_wherever_it_is_held(cpu_bridge):
    from megatron.bridge.training.setup import _create_peft_pre_wrap_hook

    from bridge_freeze_plugin.prewrap._lora import find_peft

    peft = lora(["linear_qkv"])
    setup_hook = _create_peft_pre_wrap_hook(SimpleNamespace(peft=peft), state=None)  # Bridge's setup() makes this
    assert find_peft(setup_hook) is peft  # a closure over cfg (cfg.peft)
    assert find_peft(bridge_peft_hook(peft)) is peft
    assert find_peft(peft) is peft
    assert find_peft(lambda model: model) is None


# ---- an HF-implemented vision tower (Qwen2.5-VL: plain nn.Linear, LoRA's LinearAdapter) ----

def build_qwen25(selection, peft):
    provider = make_freezable(make_provider("qwen25_vl"), selection)
    provider.register_pre_wrap_hook(bridge_peft_hook(peft))
    return provider, build_tiny_chunks("qwen25_vl", provider=provider)


def test_hf_vision_tower_adapters_next_to_a_full_rank_projection_follow_the_installed_bridge(cpu_bridge):
    """LoRA on the HF vision attention is refused before training, naming those modules, where the installed Bridge
    makes bare LinearAdapter copies that no export carries (0.6.2; issue 37, item 5); where it keeps the layer as
    to_wrap (0.7.0; issue 49) it builds: the adapters train, and the projection at full rank
    (tests/unit/prewrap/test_plain_linear_lora.py covers every family)."""
    from bridge_freeze_plugin.prewrap import bridge_lora_wraps_plain_linear

    peft = lora(["linear_qkv", "qkv"])  # LM attention (LoRALinear) + HF vision attention (LinearAdapter)
    if bridge_lora_wraps_plain_linear():
        _, (chunk,) = build_qwen25(FreezeSelection(True, True, False), peft)
        trained = {n for n, p in chunk.named_parameters() if p.requires_grad}
        assert {n for n in trained if n.startswith("visual.blocks.")} == {
            f"visual.blocks.{i}.attn.qkv.adapter.linear_{side}.weight" for i in (0, 1) for side in ("in", "out")}
        assert any(n.startswith("visual.merger.") for n in trained)
        return
    with pytest.raises(bfp.UnexportableAdapterError) as err:
        build_qwen25(FreezeSelection(True, True, False), peft)
    assert err.value.modules == ("visual.blocks.0.attn.qkv", "visual.blocks.1.attn.qkv")
    assert "freeze_vision_model=False" in str(err.value) and "'language_model.*linear_qkv'" in str(err.value)


def test_a_linear_adapter_on_a_full_rank_projection_is_refused(cpu_bridge):
    """Refused either way: a bare LinearAdapter copy (0.6.2) or the layer kept as to_wrap (0.7.0)."""
    with pytest.raises(LoraOverlapError) as err:
        build_qwen25(FreezeSelection(True, True, False), lora(["*merger.mlp.0"]))
    assert {p.split(" ")[0] for p in err.value.parameters} == {"visual.merger.mlp.0.weight", "visual.merger.mlp.0.bias"}
    assert all("LinearAdapter" in p or "to_wrap" in p for p in err.value.parameters)


# ---- checkpoints: what Bridge saves, and resume ----


def test_checkpoint_round_trip_keeps_adapters_and_full_rank_parts(cpu_bridge, tmp_path):
    """Bridge's own PEFT key filter over the model's sharded state dict, saved, rebuilt, loaded (strict=False)."""
    import torch

    selection = FreezeSelection(True, True, False)
    peft = lora(["linear_qkv"])
    _, chunks = build_qwen3(selection, peft)
    (chunk,) = chunks
    trained = trainable(chunks)
    with torch.no_grad():  # stands for training: every trained tensor moves
        for name, p in chunk.named_parameters():
            if name in trained:
                p.add_(torch.randn_like(p))
    saved = bridge_checkpoint_filter(dict(chunk.sharded_state_dict()), peft)
    expected_keys = {n.replace(".to_wrap.", ".") for n in trained}
    assert set(saved) == expected_keys  # nothing trained is dropped, nothing frozen is kept
    tensors = {k: v.data.clone() for k, v in saved.items()}
    torch.save(tensors, tmp_path / "ckpt.pt")

    _, (fresh,) = build_qwen3(selection, lora(["linear_qkv"]))
    missing, unexpected = fresh.load_state_dict(torch.load(tmp_path / "ckpt.pt"), strict=False)
    assert not unexpected and expected_keys.isdisjoint(missing)
    restored = dict(fresh.state_dict())
    for key, value in tensors.items():
        assert torch.equal(restored[key], value), key


def test_trainable_state_dict_holds_adapters_and_full_rank_parts_under_checkpoint_names(cpu_bridge):
    _, chunks = build_qwen3(FreezeSelection(True, True, False), lora(["linear_qkv"]))
    (chunk,) = chunks
    state = bfp.trainable_state_dict(chunk)
    assert set(state) == {n.replace(".to_wrap.", ".") for n in trainable(chunks)}
    assert set(state) <= set(chunk.state_dict())
    assert all(not v.requires_grad for v in state.values())  # detached copies' views, not the parameters
    assert [set(d) for d in bfp.trainable_state_dict(chunks)] == [set(state)]



# ---- Bridge's adapter-only exports would lose the full-rank parts: they refuse ----


def test_adapter_only_exports_of_a_model_with_full_rank_parts_refuse(cpu_bridge):
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    _, chunks = build_qwen3(FreezeSelection(True, True, False), lora(["linear_qkv"]))
    for export in (AutoBridge.export_adapter_weights, AutoBridge.save_hf_adapter):
        with pytest.raises(bfp.AdapterExportError, match="vision_projection at full rank"):
            export(None, chunks, "out", None)  # refused before the bridge itself is used


def test_adapter_only_export_of_a_checkpoint_with_full_rank_parts_refuses(cpu_bridge, tmp_path):
    import yaml
    from megatron.bridge.models.conversion.auto_bridge import AutoBridge

    run = {"model": {"freeze_language_model": True, "freeze_vision_model": False, "freeze_vision_projection": True},
           "peft": {"_target_": "megatron.bridge.peft.lora.LoRA", "dim": 4}}
    (tmp_path / "iter_0000010").mkdir()
    (tmp_path / "run_config.yaml").write_text(yaml.safe_dump(run))
    with pytest.raises(bfp.AdapterExportError, match="vision_model at full rank"):
        AutoBridge.export_adapter_ckpt(None, tmp_path / "iter_0000010", tmp_path / "out")


def test_adapter_exports_of_adapter_only_runs_are_left_to_bridge(cpu_bridge, tmp_path):
    import yaml

    from bridge_freeze_plugin.export import full_rank_parts_of_checkpoint, full_rank_parts_of_model

    _, chunks = build_qwen3(FreezeSelection(True, True, True), lora(["linear_qkv"]))
    assert full_rank_parts_of_model(chunks) == []
    _, chunks = build_qwen3(FreezeSelection(True, False, False), lora(["language_model.*linear_qkv"]))
    assert full_rank_parts_of_model(chunks) == ["vision_model", "vision_projection"]
    cases = [((True, True, True), {"dim": 4}, []), ((False, False, False), {"dim": 4}, []),
             ((True, False, True), None, []), ((True, False, True), {"dim": 4}, ["vision_model"])]
    for flags, peft, expected in cases:
        model = dict(zip(VLM_FLAGS, flags, strict=True))
        (tmp_path / "run_config.yaml").write_text(yaml.safe_dump({"model": model, "peft": peft}))
        assert full_rank_parts_of_checkpoint(tmp_path) == expected
