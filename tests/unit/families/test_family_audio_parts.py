"""The audio parts of Nemotron Omni and Gemma 4-VL: ``audio_model`` / ``audio_projection`` like the vision parts.

Real tiny Bridge builds on the CPU, WITH their audio modules (Nemotron Omni: Bridge's Parakeet
``BridgeSoundEncoder`` ``llava_model.sound_model`` and the ``MultimodalProjector`` ``llava_model.sound_projection``;
Gemma 4: HF's ``audio_tower`` and ``embed_audio``). The expected sets come from the tests' own module table
(:data:`PARTS`, read off the Bridge model trees) and from Bridge's own ``freeze()`` of each model, which has an
argument for every part, audio included (Nemotron Omni: ``freeze_sound_model`` / ``freeze_sound_projection``;
Gemma 4: ``freeze_audio_model`` / ``freeze_audio_projection``); never from the plugin's registry.

- partition: for every flag, the plugin freezes exactly what Bridge's own freeze of that part freezes, and the
  five parts cover every parameter once (no ``other`` left);
- training: a few AdamW steps on a batch WITH audio (and an image): exactly the trainable parameters change,
  the frozen ones stay bitwise equal and get no gradient;
- Bridge's own provider fields ``freeze_sound_encoder`` / ``freeze_sound_projection`` (Nemotron Omni) under the
  plugin: aliases of ``freeze_audio_model`` / ``freeze_audio_projection``.

Nemotron Omni's forward here runs with a Mamba-free layer pattern (``FORWARD_PATTERN``: attention + MoE), the
faster build; tests/unit/integration/test_mamba_cpu.py runs its Mamba layers on the harness's CPU scan. The partition
test uses the real pattern (with Mamba).
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable

import pytest
import torch

import bridge_freeze_plugin as bfp
from bridge_freeze_harness import train
from bridge_freeze_harness.forward import forward_patches
from bridge_freeze_harness.tiny import build_tiny_chunks, build_tiny_model, make_provider
from bridge_freeze_plugin import FreezeSelection, apply_selection, get_family

OMNI, GEMMA = "nemotron_omni", "gemma4_vl"

#: family -> plugin flag -> the module prefix it covers (read off the Bridge model trees; the tests' own table).
#: Nemotron Omni's are under ``llava_model.`` where the provider builds the LLaVA model (0.6.x, 0.7.0's legacy
#: provider) and at the top level on 0.7.0's NemotronOmniModel: :func:`_parts` reads which off the model.
PARTS: dict[str, dict[str, str]] = {
    OMNI: {
        "freeze_language_model": "language_model.",
        "freeze_vision_model": "vision_model.",
        "freeze_vision_projection": "vision_projection.",
        "freeze_audio_model": "sound_model.",
        "freeze_audio_projection": "sound_projection.",
    },
    GEMMA: {
        "freeze_language_model": "language_model.",
        "freeze_vision_model": "vision_tower.",
        "freeze_vision_projection": "embed_vision.",
        "freeze_audio_model": "audio_tower.",
        "freeze_audio_projection": "embed_audio.",
    },
}
FLAGS = tuple(PARTS[OMNI])

#: plugin flag -> the keyword of Bridge's own ``model.freeze()`` for the same part.
BRIDGE_FREEZE_KEYWORD: dict[str, dict[str, str]] = {
    OMNI: {**{f: f for f in FLAGS[:3]}, "freeze_audio_model": "freeze_sound_model",
           "freeze_audio_projection": "freeze_sound_projection"},
    GEMMA: {f: f for f in FLAGS},
}


def _parts(family: str, model: torch.nn.Module) -> dict[str, str]:
    """:data:`PARTS` of ``family`` as ``model`` names them (Nemotron Omni's LLaVA model: ``llava_model.`` first)."""
    wrapped = family == OMNI and any(n.startswith("llava_model.") for n, _ in model.named_parameters())
    return {flag: ("llava_model." if wrapped else "") + prefix for flag, prefix in PARTS[family].items()}


def _bridge_frozen(model: torch.nn.Module, family: str, flag: str) -> set[str]:
    """What Bridge's own ``model.freeze(<that part>=True)`` freezes (the model is made all-trainable first)."""
    for param in model.parameters():
        param.requires_grad_(True)
    keywords = {kw: False for kw in BRIDGE_FREEZE_KEYWORD[family].values()}
    keywords[BRIDGE_FREEZE_KEYWORD[family][flag]] = True
    with contextlib.redirect_stdout(io.StringIO()):  # Nemotron-VL's freeze() prints one line per parameter
        model.freeze(**keywords)
    return {n for n, p in model.named_parameters() if not p.requires_grad}


def _frozen(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if not p.requires_grad}


@pytest.fixture(scope="module")
def omni_model(cpu_bridge):
    """Nemotron Omni as Bridge builds it (real layer pattern: Mamba, attention, MoE), plugin flags all False."""
    return build_tiny_model(OMNI)


@pytest.fixture(scope="module")
def gemma_model(cpu_bridge):
    return build_tiny_model(GEMMA)


def _model(request: pytest.FixtureRequest, family: str) -> torch.nn.Module:
    return request.getfixturevalue({OMNI: "omni_model", GEMMA: "gemma_model"}[family])


@pytest.mark.parametrize("family", [OMNI, GEMMA])
def test_the_tiny_build_has_its_audio_modules(cpu_bridge, request, family):
    model = _model(request, family)
    names = [n for n, _ in model.named_parameters()]
    parts = _parts(family, model)
    for flag, prefix in parts.items():
        assert any(n.startswith(prefix) for n in names), f"{family}: nothing under {prefix} ({flag})"
    uncovered = [n for n in names if not n.startswith(tuple(parts.values()))]
    assert uncovered == []


@pytest.mark.parametrize("family", [OMNI, GEMMA])
def test_each_flag_freezes_what_bridges_own_freeze_of_that_part_freezes(cpu_bridge, request, family):
    model = _model(request, family)
    names = {n for n, _ in model.named_parameters()}
    spec = get_family(family)
    expected = {flag: _bridge_frozen(model, family, flag) for flag in FLAGS}
    # Bridge's sets are the tests' module table, and a partition of the model: every parameter exactly once.
    for flag, prefix in _parts(family, model).items():
        assert expected[flag] == {n for n in names if n.startswith(prefix)}, flag
    assert sum(len(s) for s in expected.values()) == len(names)
    assert set().union(*expected.values()) == names
    for flag in FLAGS:
        apply_selection(model, spec, FreezeSelection(**{flag: True}))
        assert _frozen(model) == expected[flag], flag
    apply_selection(model, spec, FreezeSelection())
    assert _frozen(model) == set()


# ------------------------------------------------------------------ training with an audio input


def _omni_setup() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    from bridge_freeze_harness.tiny import nemotron_omni

    provider = make_provider(OMNI, hybrid_layer_pattern=nemotron_omni.FORWARD_PATTERN)
    torch.manual_seed(0)
    model = build_tiny_model(OMNI, provider)
    inputs = nemotron_omni.forward_inputs(provider)

    def step_loss(m: torch.nn.Module) -> torch.Tensor:
        with forward_patches(OMNI):  # the loss as the provider's layout returns it (0.7.0: no mask beside it)
            loss = nemotron_omni.omni_loss(m(**inputs), inputs)
            loss.backward()
        return loss

    assert int((inputs["input_ids"] == nemotron_omni.TOKEN_IDS["sound_context_token_id"]).sum()) > 0
    return model, step_loss


def _gemma_setup() -> tuple[torch.nn.Module, Callable[[torch.nn.Module], torch.Tensor]]:
    provider = train.make_provider(GEMMA)
    torch.manual_seed(0)
    model = build_tiny_model(GEMMA, provider)
    batch = train.synthetic_batch(GEMMA, provider)
    assert "input_features" in batch  # the audio input

    def step_loss(m: torch.nn.Module) -> torch.Tensor:
        return train.forward_backward(m, batch, GEMMA)

    return model, step_loss


SETUPS = {OMNI: _omni_setup, GEMMA: _gemma_setup}

#: Each flag alone, and each part alone trained (every other flag set).
SELECTIONS = [{f: True} for f in FLAGS] + [{g: g != f for g in FLAGS} for f in FLAGS]


def _train(model: torch.nn.Module, step_loss: Callable[[torch.nn.Module], torch.Tensor], steps: int) -> set[str]:
    """``steps`` AdamW steps (no weight decay: a parameter moves only by its gradient); the names with a
    gradient after the last backward."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-2, weight_decay=0.0)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        step_loss(model)
        optimizer.step()
    return {n for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", [OMNI, GEMMA])
def test_a_few_steps_with_audio_change_exactly_the_trainable_parameters(cpu_bridge, family):
    model, step_loss = SETUPS[family]()
    model.train()
    spec = get_family(family)
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    initial = {n: t.detach().clone() for n, t in tensors.items()}
    names = {n for n, _ in model.named_parameters()}

    # Everything trains: every parameter (audio included) gets a non-zero gradient from this batch, so a
    # trainable parameter that does not move below is a real failure, not a quiet one.
    apply_selection(model, spec, FreezeSelection())
    model.zero_grad(set_to_none=True)
    step_loss(model)
    silent = sorted(n for n, p in model.named_parameters() if p.grad is None or not torch.any(p.grad != 0))
    assert silent == []

    problems: dict[str, list[str]] = {}
    for flags in SELECTIONS:
        with torch.no_grad():
            for n, t in tensors.items():
                t.copy_(initial[n])
        model.zero_grad(set_to_none=True)
        apply_selection(model, spec, FreezeSelection(**flags))
        frozen_prefixes = tuple(_parts(family, model)[f] for f, on in flags.items() if on)
        want_frozen = {n for n in names if n.startswith(frozen_prefixes)}
        with_grad = _train(model, step_loss, steps=2)
        params = dict(model.named_parameters())
        changed = {n for n in names if not torch.equal(params[n].detach(), initial[n])}
        found = []
        if changed != names - want_frozen:
            found.append(f"changed: extra {sorted(changed & want_frozen)[:3]}, "
                         f"missing {sorted(names - want_frozen - changed)[:3]}")
        if with_grad & want_frozen:
            found.append(f"frozen with a gradient: {sorted(with_grad & want_frozen)[:3]}")
        if found:
            problems[str(flags)] = found
    assert problems == {}


# ------------------------------------------------------------------ Bridge's own sound flags under the plugin


@pytest.mark.parametrize(
    ("fields", "plugin_flag"),
    [
        ({"freeze_sound_encoder": True}, "freeze_audio_model"),  # Bridge's name, read as the plugin's flag
        ({"freeze_sound_projection": True}, "freeze_audio_projection"),
        ({"freeze_audio_model": True}, "freeze_audio_model"),  # the plugin's own flag
        ({"freeze_audio_projection": True}, "freeze_audio_projection"),
    ],
)
def test_bridges_sound_field_on_the_omni_provider_is_the_plugins_audio_flag(cpu_bridge, fields, plugin_flag):
    provider = make_provider(OMNI, **fields)
    assert FreezeSelection.from_object(provider) == FreezeSelection(**{plugin_flag: True})
    (chunk,) = build_tiny_chunks(OMNI, provider=provider)
    names = {n for n, _ in chunk.named_parameters()}
    assert _frozen(chunk) == {n for n in names if n.startswith(_parts(OMNI, chunk)[plugin_flag])}


#: Bridge's provider fields that are its own names of the plugin's flags (read off Bridge's providers: only
#: NemotronOmniModelProvider declares any; tests/unit/config/test_config_trainers.py checks Bridge's source).
BRIDGE_ALIASES = {"freeze_sound_encoder": "freeze_audio_model", "freeze_sound_projection": "freeze_audio_projection"}


def test_every_alias_the_plugin_reads_is_tested_here():
    from bridge_freeze_plugin.request import ALIASES

    assert ALIASES == BRIDGE_ALIASES


@pytest.mark.parametrize("value", [1, "yes", 0, None], ids=repr)
@pytest.mark.parametrize("alias", sorted(BRIDGE_ALIASES))
def test_bridges_sound_field_that_is_not_a_bool_is_refused_before_the_build(cpu_bridge, alias, value):
    """Issue 37 item 4: ``freeze_sound_encoder=1`` was ignored (the encoder trained; Bridge alone freezes it). Like
    the plugin's own flags, an alias must be a real bool: refused when the selection is read, so before any build."""
    provider = make_provider(OMNI, **{alias: value})
    with pytest.raises(bfp.FreezeFlagTypeError) as err:
        FreezeSelection.from_object(provider)
    message = str(err.value)
    assert f"{alias} (Bridge's name of {BRIDGE_ALIASES[alias]}) must be a bool" in message
    assert f"got {value!r} of type {type(value).__name__}" in message and "NemotronOmniModelProvider" in message
    with pytest.raises(bfp.FreezeFlagTypeError, match=alias):
        build_tiny_chunks(OMNI, provider=provider)


def test_an_audio_flag_on_an_omni_built_without_sound_is_refused_before_training(cpu_bridge):
    """``has_sound=False`` (a checkpoint without ``sound_config``): Bridge builds no sound module at all."""
    provider = make_provider(OMNI, has_sound=False, freeze_audio_model=True)
    with pytest.raises(bfp.PartNotInFamilyError) as err:
        build_tiny_chunks(OMNI, provider=provider)
    assert "freeze_audio_model=True on NemotronOmniModelProvider" in str(err.value)
    assert "built without one" in str(err.value) and "Unset freeze_audio_model" in str(err.value)
    # Without the flag it builds, and its report has no audio row (the model has no audio side).
    provider = make_provider(OMNI, has_sound=False, freeze_language_model=True)
    (chunk,) = build_tiny_chunks(OMNI, provider=provider)
    assert not any(n.startswith(("llava_model.sound_model.", "llava_model.sound_projection."))
                   for n, _ in chunk.named_parameters())
    assert [c.part.value for c in bfp.last_report(provider).parts] == [
        "language_model", "vision_model", "vision_projection"]


@pytest.mark.parametrize(("family", "line"), [
    ("nemotron_omni", "freeze_language_model=false freeze_vision_model=false freeze_vision_projection=false "
                      "freeze_audio_model=true freeze_audio_projection=false"),
    ("qwen2_audio", "freeze_language_model=false freeze_audio_model=true freeze_audio_projection=false"),
])
def test_check_config_lists_the_flags_of_the_models_parts(capsys, family, line):
    """check-config's selection line: every part of the family (an unset audio projection too), no other."""
    from bridge_freeze_plugin.cli import main

    assert main(["check-config", "--layout", "sft", "--family", family, "megatron_config.freeze_audio_model=true"]) == 0
    out = capsys.readouterr().out
    assert f"selection (megatron_config): {line}\n" in out
