"""Activation: importing the plugin, or merely having it installed, makes every registered family's
Bridge provider honour the flags, however the provider was made; an opt-out variable; idempotence;
and the build-time guarantee against later pre-wrap hooks (Bridge's real LoRA among them)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest
from _shared import QWEN3_PROJECTION

import bridge_freeze_plugin as bfp
from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
from bridge_freeze_plugin import FreezeGuaranteeError, FreezeSelection, make_freezable

ADAPTER = re.compile(r"\.adapter\.linear_(in|out)\.weight$")
TINY_QWEN3_VL_MOE = Path(__file__).resolve().parents[2] / "fixtures" / "tiny_hf_configs" / "qwen3_vl_moe.json"

# A fresh interpreter that never imports the plugin itself: the TE stub and the tiny builders come
# from bridge_freeze_harness, which does not import bridge_freeze_plugin.
FRESH = textwrap.dedent(
    """
    import json, sys
    from bridge_freeze_harness.cpu_runtime import import_bridge
    import_bridge()                       # = import megatron.bridge (with the CPU TE stub)
    loaded = "bridge_freeze_plugin" in sys.modules
    from bridge_freeze_harness.tiny import build_tiny_chunks
    (chunk,) = build_tiny_chunks("qwen3_vl_moe")
    params = dict(chunk.named_parameters())
    print(json.dumps({"loaded": loaded, "trainable": sorted(n for n, p in params.items() if p.requires_grad),
                      "all": sorted(params)}))
    """
)


def _start_fresh(env_extra: dict[str, str]) -> tuple[subprocess.Popen[str], Any, Any]:
    """FRESH in a new interpreter, its output in files (a full pipe would stall it while the other one is read)."""
    env = {k: v for k, v in os.environ.items() if k != "BRIDGE_FREEZE_DISABLE_AUTOLOAD"}
    env.update({"HF_HUB_OFFLINE": "1", **env_extra})
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    return subprocess.Popen([sys.executable, "-c", FRESH], stdout=out, stderr=err, text=True, env=env), out, err


@pytest.fixture(scope="module")
def fresh():
    """``fresh(name)``: what FRESH printed in a fresh interpreter, with the plugin's autoload (``"autoload"``) or
    opted out (``"opted_out"``). Both interpreters start together, on first use (each imports Bridge: side by side
    on two cores)."""
    procs = {"autoload": _start_fresh({}), "opted_out": _start_fresh({"BRIDGE_FREEZE_DISABLE_AUTOLOAD": "1"})}

    def result(name: str) -> dict:
        proc, out, err = procs[name]
        try:
            proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        out.seek(0)
        err.seek(0)
        assert proc.returncode == 0, err.read()[-3000:]
        return json.loads(out.read().strip().splitlines()[-1])

    yield result
    for proc, out, err in procs.values():  # only the processes this fixture started
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        err.close()


def test_installed_plugin_activates_in_a_process_that_only_imports_megatron_bridge(fresh):
    result = fresh("autoload")
    assert result["loaded"] is True
    assert result["trainable"] == result["all"]  # the MoE provider's freeze-by-default no longer leaks


def test_opt_out_variable_leaves_bridge_alone(fresh):
    result = fresh("opted_out")
    assert result["loaded"] is False
    # Bridge's own default: only the projection trains.
    assert result["trainable"] == sorted(n for n in result["all"] if QWEN3_PROJECTION.match(n))


def test_bare_interpreter_start_imports_nothing_heavy():
    names = "('_bridge_freeze_autoload', 'bridge_freeze_plugin', 'torch')"
    code = f"import sys; print(sorted(m for m in {names} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['_bridge_freeze_autoload']"


def test_wheel_ships_the_autoload_line(tmp_path):
    """What a user installs: the wheel puts the .pth and its start-up module at the top of site-packages."""
    import shutil
    import zipfile

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    # setuptools builds in the source tree (build/, *.egg-info): build a copy, so the checkout stays as it was
    source = tmp_path / "source"
    skip = shutil.ignore_patterns(".*", "__pycache__", "build", "dist", "*.egg-info", "tests", "benchmarks", "docs")
    shutil.copytree(root, source, ignore=skip)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path),
         "--disable-pip-version-check", str(source)],
        check=True, capture_output=True, timeout=240, cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("bridge_freeze_plugin-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"bridge_freeze_plugin.pth", "_bridge_freeze_autoload.py", "bridge_freeze_plugin/py.typed"} <= names
    pth = zipfile.ZipFile(wheel).read("bridge_freeze_plugin.pth").decode()
    assert pth.startswith("import ") and "_bridge_freeze_autoload" in pth and pth.count("\n") == 1


def test_directly_constructed_provider_uses_the_plugin_defaults(cpu_bridge, caplog):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider

    assert bfp.is_active()
    assert Qwen3VLMoEModelProvider in bfp.activation.patched_classes()
    provider = make_provider("qwen3_vl_moe")  # plain construction, no make_freezable
    assert (provider.freeze_language_model, provider.freeze_vision_model) == (False, False)
    with caplog.at_level("INFO", logger="bridge_freeze_plugin"):
        (chunk,) = build_tiny_chunks("qwen3_vl_moe", provider=provider)
    assert all(p.requires_grad for p in chunk.parameters())
    (block,) = [r.getMessage() for r in caplog.records if r.name == "bridge_freeze_plugin"]
    assert "freeze_language_model=True replaced by False, freeze_vision_model=True replaced by False" in block


def test_user_subclass_defined_after_activation(cpu_bridge):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider

    @dataclasses.dataclass
    class MyMoE(Qwen3VLMoEModelProvider):
        pass

    assert MyMoE.__dataclass_fields__["freeze_language_model"].default is False
    base = make_provider("qwen3_vl_moe")
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init}
    fields.pop("freeze_vision_model")
    provider = MyMoE(**fields)
    provider.freeze_vision_model = True
    (chunk,) = build_tiny_chunks("qwen3_vl_moe", provider=provider)
    names = {n for n, _ in chunk.named_parameters()}
    vision_encoder = {n for n in names if n.startswith("vision_model.") and not QWEN3_PROJECTION.match(n)}
    assert {n for n, p in chunk.named_parameters() if p.requires_grad} == names - vision_encoder


def test_autobridge_made_provider_honours_the_flags(cpu_bridge):
    from megatron.bridge import AutoBridge
    from transformers import Qwen3VLMoeConfig

    hf = Qwen3VLMoeConfig(architectures=["Qwen3VLMoeForConditionalGeneration"])
    provider = AutoBridge.from_hf_config(hf).to_megatron_provider(load_weights=False)
    # Bridge's default for this class is True/True; activation made the config (all false) win.
    assert (provider.freeze_language_model, provider.freeze_vision_model) == (False, False)
    assert bfp.family_for_provider(provider).name == "qwen3_vl_moe"
    provider.freeze_vision_model = "yes"  # not a bool: refused before anything is built
    with pytest.raises(TypeError, match="freeze_vision_model must be a bool"):
        provider.provide()


def _tiny_hf_qwen3_vl_moe_config():
    """A tiny HF Qwen3-VL-MoE config (tests/fixtures/tiny_hf_configs/qwen3_vl_moe.json; no hub access)."""
    from transformers import Qwen3VLMoeConfig

    return Qwen3VLMoeConfig.from_dict(json.loads(TINY_QWEN3_VL_MOE.read_text()))


def test_autobridge_made_provider_builds_what_was_asked(cpu_bridge, caplog):
    from megatron.bridge import AutoBridge

    from bridge_freeze_harness.tiny._common import TINY_LM
    from bridge_freeze_harness.tiny.qwen3_vl_moe import TINY_MOE

    provider = AutoBridge.from_hf_config(_tiny_hf_qwen3_vl_moe_config()).to_megatron_provider(load_weights=False)
    # CPU-only settings (float32, no fused kernels, a dispatcher that needs no CUDA stream); sizes from the HF config
    for key in ("params_dtype", "bf16", "fp16", "gradient_accumulation_fusion", "bias_activation_fusion",
                "bias_dropout_fusion", "masked_softmax_fusion", "persist_layer_norm", "apply_rope_fusion"):
        setattr(provider, key, TINY_LM[key])
    for key in ("moe_grouped_gemm", "moe_permute_fusion", "moe_token_dispatcher_type"):
        setattr(provider, key, TINY_MOE[key])
    provider.finalize()
    provider.freeze_vision_model = True  # as a config override would: nothing else is touched
    caplog.set_level(logging.INFO, logger="bridge_freeze_plugin")
    (chunk,) = build_tiny_chunks("qwen3_vl_moe", provider=provider)
    names = {n for n, _ in chunk.named_parameters()}
    vision_encoder = {n for n in names if n.startswith("vision_model.") and not QWEN3_PROJECTION.match(n)}
    assert vision_encoder and any(".mlp.experts." in n for n in names)  # the MoE model, vision tower included
    assert {n for n, p in chunk.named_parameters() if p.requires_grad} == names - vision_encoder
    report = "\n".join(r.getMessage() for r in caplog.records if r.name == "bridge_freeze_plugin")
    assert "provider defaults overridden: freeze_language_model=True replaced by False" in report


def test_activate_is_idempotent_and_deactivate_restores(cpu_bridge):
    from megatron.bridge.models.qwen_vl.qwen3_vl_provider import Qwen3VLMoEModelProvider as MoE

    wrapped = MoE.provide
    bfp.activate()
    bfp.activate()
    assert MoE.provide is wrapped
    assert not hasattr(wrapped.__bridge_freeze_wrapped__, "__bridge_freeze_wrapped__")  # wrapped once
    try:
        bfp.deactivate()
        assert MoE.__dataclass_fields__["freeze_language_model"].default is True
        assert getattr(MoE.provide, "__bridge_freeze_wrapped__", None) is None
    finally:
        bfp.activate()
    assert MoE.__dataclass_fields__["freeze_language_model"].default is False
    assert getattr(MoE.provide, "__bridge_freeze_wrapped__", None) is not None


def test_a_family_registered_in_code_after_activation_is_patched(cpu_bridge):
    """register_family() while active patches the new family's provider: its flags are honoured."""
    from megatron.bridge.models.ministral3.ministral3_provider import Ministral3ModelProvider as Provider

    spec = bfp.REGISTRY.unregister("ministral3")
    try:
        bfp.deactivate()
        bfp.activate()  # ministral3 is not registered now, so its provider is not patched
        assert getattr(Provider.provide, "__bridge_freeze_wrapped__", None) is None
        bfp.register_family(
            "ministral3", providers=spec.providers, language_model=spec.language_model,
            vision_model=spec.vision_model, vision_projection=spec.vision_projection, source="test",
        )
        assert getattr(Provider.provide, "__bridge_freeze_wrapped__", None) is not None
        provider = make_provider("ministral3")  # a plain Bridge provider: no make_freezable
        provider.freeze_language_model = True
        names, trainable = _names_and_trainable(build_tiny_chunks("ministral3", provider=provider))
        assert trainable == {n for n in names if not n.startswith("language_model.")} != names
    finally:
        bfp.REGISTRY.unregister("ministral3")
        bfp.REGISTRY.register(spec)
        bfp.deactivate()
        bfp.activate()


def _names_and_trainable(chunks):
    params = [(n, p) for c in chunks for n, p in c.named_parameters()]
    return {n for n, _ in params}, {n for n, p in params if p.requires_grad}


# ---------------------------------------------------------------------------------------------
# The build-time guarantee, with Bridge's real LoRA as a pre-wrap hook.
# ---------------------------------------------------------------------------------------------


def _lora():
    from megatron.bridge.peft.lora import LoRA

    return LoRA(target_modules=["linear_qkv"], dim=4, alpha=8)


def test_lora_with_all_three_flags_trains_only_adapters(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"), FreezeSelection(True, True, True))
    provider.register_pre_wrap_hook(_lora())
    (chunk,) = build_tiny_chunks("qwen3_vl", provider=provider)
    trainable = {n for n, p in chunk.named_parameters() if p.requires_grad}
    assert trainable and trainable == {n for n, _ in chunk.named_parameters() if ADAPTER.search(n)}


def test_lora_with_a_partial_selection_trains_adapters_and_the_full_rank_part(cpu_bridge):
    """Was refused before LoRA with full-rank parts existed: now the projection trains at full rank."""
    provider = make_freezable(make_provider("qwen3_vl"), FreezeSelection(True, True, False))
    provider.register_pre_wrap_hook(_lora())
    (chunk,) = build_tiny_chunks("qwen3_vl", provider=provider)
    names, trainable = _names_and_trainable([chunk])
    assert trainable == {n for n in names if ADAPTER.search(n) or QWEN3_PROJECTION.match(n)}


def test_plain_lora_without_flags_is_left_to_lora(cpu_bridge):
    provider = make_freezable(make_provider("qwen3_vl"))
    provider.register_pre_wrap_hook(_lora())
    (chunk,) = build_tiny_chunks("qwen3_vl", provider=provider)
    trainable = {n for n, p in chunk.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in chunk.named_parameters() if ADAPTER.search(n)}


def test_lora_wrapped_full_rank_weights_are_named_under_their_to_wrap_names(cpu_bridge):
    """LoRA renames a wrapped base weight to ``<target>.to_wrap.weight``: it is still the language model,
    which this selection trains at full rank, so the wrap is an overlap (Bridge would drop it from checkpoints)."""
    provider = make_freezable(make_provider("qwen3_vl"), FreezeSelection(freeze_vision_model=True))
    provider.register_pre_wrap_hook(_lora())
    with pytest.raises(bfp.LoraOverlapError) as err:
        build_tiny_chunks("qwen3_vl", provider=provider)
    listed = set(err.value.parameters)
    assert listed == {
        f"language_model.decoder.layers.{i}.self_attention.linear_qkv.{w} (wrapped by LoRA as "
        f"language_model.decoder.layers.{i}.self_attention.linear_qkv.to_wrap.{w})"
        for i in range(2) for w in ("weight", "bias")}


def test_plain_lora_on_a_stock_moe_provider_trains_only_adapters(cpu_bridge):
    """Qwen3-VL-MoE's instance says freeze LM + vision (Bridge's defaults); the written config (no flag) wins."""
    stock = make_provider("qwen3_vl_moe", freeze_language_model=True, freeze_vision_model=True)
    provider = make_freezable(stock)  # the user's config: no flag set
    assert (provider.freeze_language_model, provider.freeze_vision_model) == (False, False)
    provider.register_pre_wrap_hook(_lora())
    (chunk,) = build_tiny_chunks("qwen3_vl_moe", provider=provider)
    trainable = {n for n, p in chunk.named_parameters() if p.requires_grad}
    assert trainable and trainable == {n for n, _ in chunk.named_parameters() if ADAPTER.search(n)}


def _replace_first_qkv_weight(model):
    """A hook that swaps a frozen base weight for a new, trainable tensor of the same name."""
    import torch

    attention = model[0].language_model.decoder.layers[0].self_attention.linear_qkv
    attention.weight = torch.nn.Parameter(attention.weight.detach().clone(), requires_grad=True)
    return model


@pytest.mark.parametrize("selection", [FreezeSelection(True, True, True), FreezeSelection(True, False, False)],
                         ids=["all-three", "language-model"])
def test_a_hook_that_replaces_a_frozen_weight_is_not_an_adapter(cpu_bridge, selection):
    provider = make_freezable(make_provider("qwen3_vl"), selection)
    provider.register_pre_wrap_hook(_replace_first_qkv_weight)
    with pytest.raises(FreezeGuaranteeError) as err:
        build_tiny_chunks("qwen3_vl", provider=provider)
    message = str(err.value)
    assert ("language_model.decoder.layers.0.self_attention.linear_qkv.weight "
            "(replaced by a hook and trains in a frozen part)") in message, message
    assert "_replace_first_qkv_weight" in message


def test_a_hook_that_unfreezes_is_named(cpu_bridge):
    def sneaky_unfreeze(model):
        for chunk in model:
            for p in chunk.language_model.parameters():
                p.requires_grad_(True)
        return model

    provider = make_freezable(make_provider("qwen3_vl"), FreezeSelection(freeze_language_model=True))
    provider.register_pre_wrap_hook(sneaky_unfreeze)
    with pytest.raises(FreezeGuaranteeError, match=r"after pre-wrap hook .*sneaky_unfreeze"):
        build_tiny_chunks("qwen3_vl", provider=provider)


# ---------------------------------------------------------------------------------------------
# Third-party families through entry points, with real installed distributions.
# ---------------------------------------------------------------------------------------------


def _make_project(root, name, module_body, ep_value):
    project = root / name
    pkg = project / name.replace("-", "_")
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(module_body))
    (project / "pyproject.toml").write_text(
        textwrap.dedent(
            f"""
            [build-system]
            requires = ["setuptools"]
            build-backend = "setuptools.build_meta"
            [project]
            name = "{name}"
            version = "1.0"
            [project.entry-points."bridge_freeze_plugin.families"]
            fam = "{ep_value}"
            """
        )
    )
    return project


def test_entry_point_families_from_installed_distributions(tmp_path):
    good = _make_project(
        tmp_path,
        "acme-vlm",
        """
        from bridge_freeze_plugin import FamilySpec
        FAMILY = FamilySpec(
            name="acme_vlm", providers=("acme_vlm.provider:AcmeVLMProvider",),
            language_model=("lm",), vision_model=("vit",), vision_projection=("vit.proj",),
        )
        """,
        "acme_vlm:FAMILY",
    )
    broken = _make_project(tmp_path, "broken-vlm", "raise RuntimeError('boom')\n", "broken_vlm:FAMILY")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "--disable-pip-version-check", "--target", str(site), str(good), str(broken)],
        check=True, capture_output=True, timeout=240, cwd=tmp_path,
    )
    code = textwrap.dedent(
        """
        import json, warnings
        warnings.simplefilter("always")
        with warnings.catch_warnings(record=True) as caught:
            import bridge_freeze_plugin as b
            fams = {f.name: f.source for f in b.list_families()}
        print(json.dumps({"fams": fams, "warnings": [str(w.message) for w in caught]}))
        """
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["fams"]["acme_vlm"] == "acme-vlm"
    assert "qwen3_vl" in result["fams"]  # the run goes on
    assert any("broken-vlm" in w and "boom" in w for w in result["warnings"])
