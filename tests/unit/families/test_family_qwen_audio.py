"""The audio-language families Qwen2-Audio and Qwen3-ASR, on their real tiny Bridge models (issue 25).

Expectations come from this file's own rules over parameter names (written from reading Bridge's
``Qwen2AudioModel`` / ``Qwen3ASRModel`` and the transformers audio encoders they hold), and from Bridge's own
``freeze()`` with Bridge's own flags where Bridge has the same selection; never from the plugin's tables.

- every selection of the family's three parts (language model, audio encoder, audio projection) trains exactly
  the parameters the rules give, through the provider's flags and ``provide_distributed_model``;
- where Bridge's own provider has an equivalent flag set, the plugin trains exactly what Bridge's own freeze
  leaves trainable (Qwen2-Audio: all 8 selections; Qwen3-ASR: the 4 where the encoder and its projector are frozen
  together, since Bridge's ``freeze_audio_model`` freezes its whole ``audio_model``, projector included);
- a few real CPU AdamW steps per selection: every trainable parameter gets a non-zero gradient and changes, every
  other one has no gradient and stays bit for bit;
- a vision flag on these families is refused before any model is built.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch

from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_context, build_tiny_chunks, build_tiny_model
from bridge_freeze_plugin import FreezeSelection, Part, apply_selection, get_family, make_freezable
from bridge_freeze_plugin.errors import PartNotInFamilyError

AUDIO_PARTS = (Part.LANGUAGE_MODEL, Part.AUDIO_MODEL, Part.AUDIO_PROJECTION)

#: config -> part -> regex over parameter names; "as_built": frozen by transformers, no flag makes it train.
RULES: dict[str, dict[str, str]] = {
    "qwen2_audio": {
        "language_model": r"language_model\.",
        "audio_model": r"audio_tower\.(?!embed_positions\.)",
        "audio_projection": r"multi_modal_projector\.",
        "as_built": r"audio_tower\.embed_positions\.",
    },
    "qwen3_asr": {
        "language_model": r"thinker\.language_model\.",
        "audio_model": r"thinker\.audio_model\.(?!proj[12]\.)",
        "audio_projection": r"thinker\.audio_model\.proj[12]\.",
    },
}
CONFIGS = sorted(RULES)
SELECTIONS = list(FreezeSelection.all_selections(AUDIO_PARTS))
TRAINING_SELECTIONS = [s for s in SELECTIONS if s.trained_parts(AUDIO_PARTS)]


def part_of(config: str, name: str) -> str:
    found = [part for part, rule in RULES[config].items() if re.match(rule, name)]
    assert len(found) == 1, f"{config}: the test's rules put {name} in {found}"
    return found[0]


def expected_trainable(config: str, names: set[str], selection: FreezeSelection) -> set[str]:
    frozen = {p.value for p in selection.frozen_parts()}
    return {n for n in names if part_of(config, n) not in frozen | {"as_built"}}


def bridge_flags(config: str, selection: FreezeSelection) -> dict[str, bool] | None:
    """Bridge's own provider flags for ``selection``, or ``None`` where Bridge's freeze cannot express it."""
    lm, audio, projection = (getattr(selection, f"freeze_{p.value}") for p in AUDIO_PARTS)
    if config == "qwen2_audio":  # Qwen2AudioModel.freeze: language_model / audio_tower / multi_modal_projector
        return {"freeze_language_model": lm, "freeze_audio_model": audio, "freeze_audio_projection": projection}
    if audio != projection:  # Qwen3ASRThinkerModel.freeze: language_model / the whole audio_model
        return None
    return {"freeze_language_model": lm, "freeze_audio_model": audio}


def trainable(chunk: torch.nn.Module) -> set[str]:
    return {n for n, p in chunk.named_parameters() if p.requires_grad}


@pytest.fixture(scope="module")
def plugin_builds(cpu_bridge) -> dict[str, dict[FreezeSelection, tuple[set[str], set[str]]]]:
    """config -> selection -> (all names, trainable names), each built through the flags and the pre-wrap hook."""
    builds: dict[str, dict[FreezeSelection, tuple[set[str], set[str]]]] = {}
    for config in CONFIGS:
        builds[config] = {}
        for selection in SELECTIONS:
            provider = make_freezable(train.make_provider(config), selection)
            (chunk,) = build_tiny_chunks(config, provider=provider)
            builds[config][selection] = ({n for n, _ in chunk.named_parameters()}, trainable(chunk))
    return builds


def bridge_build(config: str, flags: dict[str, bool]) -> set[str]:
    """Trainable names after Bridge's own ``provide()`` (its own ``freeze()`` with ``flags``), plugin bypassed."""
    provider = train.make_provider(config)
    for flag, value in flags.items():
        setattr(provider, flag, value)
    bridge_provide = get_family(config).resolve_providers()[0].provide.__bridge_freeze_wrapped__
    provider._pg_collection = _pg_collection()
    with build_context(config):
        return trainable(bridge_provide(provider, pre_process=True, post_process=True))


def _pg_collection():
    from megatron.core.process_groups_config import ProcessGroupCollection

    return ProcessGroupCollection.use_mpu_process_groups()


def test_registered_with_their_hf_model_types_and_no_vision_part(cpu_bridge):
    for config, model_type in (("qwen2_audio", "qwen2_audio"), ("qwen3_asr", "qwen3_asr")):
        family = get_family(config)
        assert family.part_names() == AUDIO_PARTS
        assert family.prefixes(Part.VISION_MODEL) == () and family.prefixes(Part.VISION_PROJECTION) == ()
        assert family.hf_model_types == (model_type,)


@pytest.mark.parametrize("config", CONFIGS)
def test_every_selection_trains_exactly_what_the_rules_give(plugin_builds, config):
    problems = {}
    for selection, (names, got) in plugin_builds[config].items():
        want = expected_trainable(config, names, selection)
        if got != want:
            problems[selection.describe(AUDIO_PARTS)] = (sorted(got - want)[:4], sorted(want - got)[:4])
    assert problems == {}
    # Every part is really in the tiny model (no selection can pass vacuously), each name in exactly one part.
    names = next(iter(plugin_builds[config].values()))[0]
    assert {part_of(config, n) for n in names} == set(RULES[config])


@pytest.mark.parametrize("config", CONFIGS)
def test_the_plugin_trains_what_bridges_own_freeze_leaves_trainable(plugin_builds, config):
    compared = 0
    for selection in SELECTIONS:
        flags = bridge_flags(config, selection)
        if flags is None:
            continue
        assert plugin_builds[config][selection][1] == bridge_build(config, flags), selection
        compared += 1
    assert compared == (8 if config == "qwen2_audio" else 4)


def test_qwen3_asr_audio_flag_alone_keeps_the_projector_training_unlike_bridge(plugin_builds):
    """Bridge's freeze_audio_model freezes proj1/proj2 with the encoder; the plugin's leaves the projection to its
    own flag (the documented difference)."""
    encoder_only = FreezeSelection(freeze_audio_model=True)
    ours = plugin_builds["qwen3_asr"][encoder_only][1]
    projector = {n for n in ours if re.match(RULES["qwen3_asr"]["audio_projection"], n)}
    assert projector == {f"thinker.audio_model.proj{i}.{w}" for i in (1, 2) for w in ("weight", "bias")}
    bridge = bridge_build("qwen3_asr", {"freeze_language_model": False, "freeze_audio_model": True})
    assert ours - bridge == projector and bridge <= ours


@pytest.fixture(scope="module")
def trained_models(cpu_bridge) -> Iterator[dict[str, tuple[object, torch.nn.Module, dict[str, torch.Tensor]]]]:
    """config -> (provider, one plain tiny model, its initial parameters): shared by every selection's steps."""
    models = {}
    for config in CONFIGS:
        provider = train.make_provider(config)
        torch.manual_seed(0)
        model = build_tiny_model(config, provider)
        models[config] = (provider, model, {n: p.detach().clone() for n, p in model.named_parameters()})
    yield models


@pytest.mark.parametrize("config", CONFIGS)
def test_train_steps_change_exactly_the_trainable_parameters(trained_models, config):
    provider, model, initial = trained_models[config]
    problems: dict[str, list[str]] = {}
    for selection in TRAINING_SELECTIONS:
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(initial[name])
        apply_selection(model, get_family(config), selection)
        params = dict(model.named_parameters())
        want = expected_trainable(config, set(params), selection)
        got = trainable(model)
        found = [f"trainable set differs: {sorted(got ^ want)[:4]}"] if got != want else []
        losses = train.train_steps(model, config, provider, steps=2, batch_size=2)
        assert all(torch.isfinite(torch.tensor(losses)))
        for name, param in params.items():
            changed = not torch.equal(param.detach(), initial[name])
            if name in want:
                if param.grad is None or not torch.any(param.grad != 0):
                    found.append(f"trainable {name}: gradient {'None' if param.grad is None else 'all zeros'}")
                if not changed:
                    found.append(f"trainable {name} did not change")
            else:
                if param.grad is not None:
                    found.append(f"frozen {name} has a gradient")
                if changed:
                    found.append(f"frozen {name} changed")
        if found:
            problems[selection.describe(AUDIO_PARTS)] = found[:6]
        model.zero_grad(set_to_none=True)
    assert problems == {}


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("flag", ["freeze_vision_model", "freeze_vision_projection"])
def test_a_vision_flag_is_refused_before_any_build(cpu_bridge, mocker, config, flag):
    from megatron.bridge.models.qwen3_asr import qwen3_asr_provider
    from megatron.bridge.models.qwen_audio import modeling_qwen2_audio

    built = mocker.patch.object(modeling_qwen2_audio, "Qwen2AudioModel", side_effect=AssertionError("built"))
    built_asr = mocker.patch.object(qwen3_asr_provider, "Qwen3ASRModel", side_effect=AssertionError("built"))
    with pytest.raises(PartNotInFamilyError) as err:
        make_freezable(train.make_provider(config), FreezeSelection(**{flag: True}))
    message = str(err.value)
    assert f"{flag}=True" in message and repr(config) in message and f"Unset {flag}" in message
    assert "audio encoder" in message  # names the parts the family does have

    # Set after make_freezable: provide() and provide_distributed_model() refuse before Bridge builds anything.
    provider = make_freezable(train.make_provider(config))
    setattr(provider, flag, True)
    for method in (provider.provide, provider.provide_distributed_model):
        with pytest.raises(PartNotInFamilyError, match=f"{flag}=True"):
            with build_context(config):
                method()
    assert built.call_count == 0 and built_asr.call_count == 0
    # Control: without the flag, provide() does reach the (patched) model class, so the count above is meaningful.
    setattr(provider, flag, False)
    with pytest.raises(AssertionError, match="built"), build_context(config):
        provider.provide(pre_process=True, post_process=True)
    assert built.call_count + built_asr.call_count == 1
