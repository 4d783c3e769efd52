"""The Qwen omni families (Qwen2.5-Omni, Qwen3-Omni with its MoE thinker) on their real tiny Bridge models (issue 25).

Expectations are computed without the plugin's tables:

- Bridge's own ``freeze()`` (``Qwen25OmniThinkerModel`` / ``Qwen3OmniThinkerModel``) with one of Bridge's three
  flags at a time (``freeze_language_model``, ``freeze_vision_model``, ``freeze_audio_model``), through Bridge's own
  ``provide()`` with the plugin bypassed, gives the language model, the whole vision tower and the whole audio
  encoder; Bridge has no flag for either projection, so this file's own module-path rules
  (:data:`PROJECTIONS`, written from reading transformers' encoders) cut the projection out of each tower;
- every one of the 32 selections of the five parts, set as the provider's flags and built through
  ``provide_distributed_model`` (the pre-wrap hook), trains exactly the complement of the frozen parts;
- where Bridge's flags can say the same thing (each projection frozen with its encoder: 8 selections), the plugin
  trains exactly what Bridge's own freeze leaves trainable; where they cannot, the difference is tested
  (Bridge's vision flag freezes the merger(s), its audio flag the audio projection);
- a few real CPU AdamW steps per selection, with an image AND an audio clip in the batch: every trainable parameter
  gets a gradient and changes, every frozen one has none and stays bit for bit;
- the talker and the token2wav / code2wav vocoder are not built, even when their configs are given.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
import torch
from test_family_gradients import ExpertSignal

from bridge_freeze_harness import train
from bridge_freeze_harness.tiny import build_context, build_tiny_chunks, build_tiny_model
from bridge_freeze_plugin import FreezeSelection, Part, apply_selection, get_family, make_freezable

CONFIGS = ("qwen25_omni", "qwen3_omni")
PARTS = (Part.LANGUAGE_MODEL, Part.VISION_MODEL, Part.VISION_PROJECTION, Part.AUDIO_MODEL, Part.AUDIO_PROJECTION)
SELECTIONS = list(FreezeSelection.all_selections(PARTS))
#: Bridge's three provider flags (``Qwen25OmniModelProvider`` / ``Qwen3OmniModelProvider``).
BRIDGE_FLAGS = ("freeze_language_model", "freeze_vision_model", "freeze_audio_model")


#: config -> (vision projection, audio projection): the exact parameter names, written from transformers' classes.
#: Qwen2.5-Omni: ``Qwen2_5OmniPatchMerger`` (RMSNorm ``ln_q``, no bias) and the audio encoder's ``proj`` Linear.
#: Qwen3-Omni: ``Qwen3OmniMoeVisionPatchMerger`` (LayerNorm ``ln_q``) as ``merger`` and two DeepStack mergers
#: (``merger_list.0/1``, one per ``deepstack_visual_indexes`` entry), and the audio encoder's ``proj1`` / ``proj2``.
PROJECTIONS: dict[str, tuple[set[str], set[str]]] = {
    "qwen25_omni": (
        {"thinker.visual.merger.ln_q.weight"}
        | {f"thinker.visual.merger.mlp.{i}.{w}" for i in (0, 2) for w in ("weight", "bias")},
        {"thinker.audio_model.proj.weight", "thinker.audio_model.proj.bias"},
    ),
    "qwen3_omni": (
        {
            f"thinker.visual.{m}.{sub}.{w}"
            for m in ("merger", "merger_list.0", "merger_list.1")
            for sub in ("ln_q", "mlp.0", "mlp.2")
            for w in ("weight", "bias")
        },
        {f"thinker.audio_model.proj{i}.{w}" for i in (1, 2) for w in ("weight", "bias")},
    ),
}

#: Parameters the thinker's forward never reads: trainable with their part, but no gradient ever.
#: Qwen2.5-Omni's audio encoder builds ``audio_bos_eos_token`` (an nn.Embedding(2, output_dim)) and never uses it.
NEVER_READ: dict[str, set[str]] = {
    "qwen25_omni": {"thinker.audio_model.audio_bos_eos_token.weight"},
    "qwen3_omni": set(),
}


def trainable(model: torch.nn.Module) -> set[str]:
    return {n for n, p in model.named_parameters() if p.requires_grad}


def _pg_collection():
    from megatron.core.process_groups_config import ProcessGroupCollection

    return ProcessGroupCollection.use_mpu_process_groups()


def bridge_build(config: str, **flags: bool) -> torch.nn.Module:
    """Bridge's own ``provide()`` (its own ``freeze()`` with ``flags``), the plugin bypassed."""
    provider = train.make_provider(config)
    for flag in BRIDGE_FLAGS:
        setattr(provider, flag, flags.get(flag, False))
    bridge_provide = get_family(config).resolve_providers()[0].provide.__bridge_freeze_wrapped__
    provider._pg_collection = _pg_collection()
    with build_context(config):
        return bridge_provide(provider, pre_process=True, post_process=True)


@pytest.fixture(scope="module")
def expected_parts(cpu_bridge) -> dict[str, dict[Part, set[str]]]:
    """config -> part -> names: Bridge's freeze for the LM and the two towers, the projections cut out by rule."""
    parts: dict[str, dict[Part, set[str]]] = {}
    for config in CONFIGS:
        names = {n for n, _ in bridge_build(config).named_parameters()}
        frozen_by = {flag: names - trainable(bridge_build(config, **{flag: True})) for flag in BRIDGE_FLAGS}
        # Bridge's three flags split the thinker: disjoint, and together every parameter (no talker, nothing else).
        assert sum(len(s) for s in frozen_by.values()) == len(names)
        assert set().union(*frozen_by.values()) == names
        vision_projection, audio_projection = PROJECTIONS[config]
        assert vision_projection <= frozen_by["freeze_vision_model"]
        assert audio_projection <= frozen_by["freeze_audio_model"]
        parts[config] = {
            Part.LANGUAGE_MODEL: frozen_by["freeze_language_model"],
            Part.VISION_MODEL: frozen_by["freeze_vision_model"] - vision_projection,
            Part.VISION_PROJECTION: vision_projection,
            Part.AUDIO_MODEL: frozen_by["freeze_audio_model"] - audio_projection,
            Part.AUDIO_PROJECTION: audio_projection,
        }
    return parts


def expected_trainable(parts: dict[Part, set[str]], selection: FreezeSelection) -> set[str]:
    return set().union(*(names for part, names in parts.items() if part not in selection.frozen_parts()))


@pytest.fixture(scope="module")
def plugin_builds(cpu_bridge) -> dict[str, dict[FreezeSelection, set[str]]]:
    """config -> selection -> trainable names, each built through the provider's flags and the pre-wrap hook."""
    builds: dict[str, dict[FreezeSelection, set[str]]] = {}
    for config in CONFIGS:
        builds[config] = {}
        for selection in SELECTIONS:
            provider = make_freezable(train.make_provider(config), selection)
            (chunk,) = build_tiny_chunks(config, provider=provider)
            builds[config][selection] = trainable(chunk)
    return builds


@pytest.mark.parametrize("config", CONFIGS)
def test_registered_with_five_parts_and_nothing_else(cpu_bridge, config):
    from bridge_freeze_plugin.families.unsupported import UNSUPPORTED_PROVIDERS

    family = get_family(config)
    assert family.part_names() == PARTS
    assert family.prefixes(Part.OTHER) == ()
    assert family.hf_model_types == ({"qwen25_omni": "qwen2_5_omni", "qwen3_omni": "qwen3_omni_moe"}[config],)
    (provider_cls,) = family.resolve_providers()
    assert isinstance(train.make_provider(config), provider_cls)
    assert not any(path.startswith("megatron.bridge.models.qwen_omni.") for path in UNSUPPORTED_PROVIDERS)
    assert "talker" in family.description and "not built" in family.description


@pytest.mark.parametrize("config", CONFIGS)
def test_the_family_table_partitions_the_model_as_bridges_freeze_and_the_rules_do(expected_parts, config):
    parts = expected_parts[config]
    family = get_family(config)
    got = {part: set() for part in PARTS}
    for part, names in parts.items():
        assert names, f"{config}: the tiny model has no {part.value}"  # no selection can pass vacuously
        for name in names:
            got[family.classify(name)].add(name)
    assert got == parts


@pytest.mark.parametrize("config", CONFIGS)
def test_every_selection_trains_exactly_the_unfrozen_parts(expected_parts, plugin_builds, config):
    problems = {}
    for selection, got in plugin_builds[config].items():
        want = expected_trainable(expected_parts[config], selection)
        if got != want:
            problems[selection.describe(PARTS)] = (sorted(got - want)[:4], sorted(want - got)[:4])
    assert problems == {}
    assert len(plugin_builds[config]) == 32


def bridge_equivalent(selection: FreezeSelection) -> dict[str, bool] | None:
    """Bridge's own flags for ``selection``; ``None`` when a projection is not frozen together with its encoder."""
    if selection.freeze_vision_model != selection.freeze_vision_projection:
        return None
    if selection.freeze_audio_model != selection.freeze_audio_projection:
        return None
    return {
        "freeze_language_model": selection.freeze_language_model,
        "freeze_vision_model": selection.freeze_vision_model,
        "freeze_audio_model": selection.freeze_audio_model,
    }


@pytest.mark.parametrize("config", CONFIGS)
def test_the_plugin_trains_what_bridges_own_freeze_leaves_trainable(plugin_builds, config):
    compared = 0
    for selection in SELECTIONS:
        flags = bridge_equivalent(selection)
        if flags is None:
            continue
        assert plugin_builds[config][selection] == trainable(bridge_build(config, **flags)), selection
        compared += 1
    assert compared == 8


@pytest.mark.parametrize("config", CONFIGS)
def test_bridges_encoder_flags_freeze_the_projections_too_the_plugins_do_not(plugin_builds, config):
    """The documented difference: Bridge's ``freeze_vision_model`` freezes all of ``thinker.visual`` (merger and
    DeepStack mergers too) and its ``freeze_audio_model`` all of ``thinker.audio_model`` (its projection too); the
    plugin's flags of the same names leave each projection to its own flag."""
    vision_projection, audio_projection = PROJECTIONS[config]
    ours = plugin_builds[config][FreezeSelection(freeze_vision_model=True)]
    bridge = trainable(bridge_build(config, freeze_vision_model=True))
    assert ours - bridge == vision_projection and bridge <= ours

    ours = plugin_builds[config][FreezeSelection(freeze_audio_model=True)]
    bridge = trainable(bridge_build(config, freeze_audio_model=True))
    assert ours - bridge == audio_projection and bridge <= ours


@pytest.mark.parametrize("config", CONFIGS)
def test_the_talker_and_the_vocoder_are_not_built_even_when_configured(cpu_bridge, config):
    if config == "qwen25_omni":
        from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
            Qwen2_5OmniTalkerConfig as Talker,
        )
        from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import (
            Qwen2_5OmniToken2WavConfig as Vocoder,
        )

        fields = {"talker_config": Talker(), "token2wav_config": Vocoder()}
    else:
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
            Qwen3OmniMoeCode2WavConfig as Vocoder,
        )
        from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
            Qwen3OmniMoeTalkerConfig as Talker,
        )

        fields = {"talker_config": Talker(), "code2wav_config": Vocoder()}
    plain = build_tiny_model(config, train.make_provider(config))
    configured = build_tiny_model(config, train.make_provider(config, **fields))
    assert [n for n, _ in configured.named_parameters()] == [n for n, _ in plain.named_parameters()]
    assert [n for n, _ in configured.named_children()] == ["thinker"]
    assert {n for n, _ in configured.thinker.named_children()} == {"visual", "audio_model", "language_model"}
    if config == "qwen3_omni":  # kept as plain config attributes, not modules
        assert configured.talker_transformer_config is fields["talker_config"]
        assert configured.code2wav_transformer_config is fields["code2wav_config"]


# ---- a few real training steps ------------------------------------------------------------------------------

#: Every part frozen alone, every part trained alone, and nothing frozen: each part trains and is frozen next to
#: each other part trained and frozen.
STEP_SELECTIONS = [
    FreezeSelection(),
    *(FreezeSelection(**{f"freeze_{p.value}": True}) for p in PARTS),
    *(FreezeSelection(**{f"freeze_{q.value}": q is not p for q in PARTS}) for p in PARTS),
]
EXPERT = re.compile(r"^(.*\.local_experts\.\d+)\.")


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


def test_the_training_batch_feeds_an_image_and_an_audio_clip(trained_models):
    for config in CONFIGS:
        provider = trained_models[config][0]
        batch = train.synthetic_batch(config, provider)
        ids = batch["input_ids"]
        assert {"pixel_values", "image_grid_thw", "input_features", "feature_attention_mask"} <= set(batch)
        assert int((ids == provider.audio_token_id).sum()) == 4
        assert int((ids == provider.image_token_id).sum()) == 16


@pytest.mark.parametrize("config", CONFIGS)
def test_train_steps_change_exactly_the_trainable_parameters(trained_models, expected_parts, config):
    provider, model, initial = trained_models[config]
    never_read = NEVER_READ[config]
    problems: dict[str, list[str]] = {}
    for selection in STEP_SELECTIONS:
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(initial[name])
        apply_selection(model, get_family(config), selection)
        params = dict(model.named_parameters())
        want = expected_trainable(expected_parts[config], selection)
        found = [f"trainable set differs: {sorted(trainable(model) ^ want)[:4]}"] if trainable(model) != want else []
        experts = ExpertSignal(model)

        def last_step_only(step: int, _loss: float, experts: ExpertSignal = experts) -> None:
            if step == 0:  # the signal of the last step only (its gradients are the ones left to check)
                experts.signal = dict.fromkeys(experts.signal, False)

        try:
            losses = train.train_steps(model, config, provider, steps=2, on_step=last_step_only)
        finally:
            experts.remove()
        assert all(torch.isfinite(torch.tensor(losses)))
        for name, param in params.items():
            changed = not torch.equal(param.detach(), initial[name])
            expert = EXPERT.match(name)
            if name not in want or name in never_read:
                if param.grad is not None:
                    found.append(f"{'never-read' if name in want else 'frozen'} {name} has a gradient")
                if changed:
                    found.append(f"{'never-read' if name in want else 'frozen'} {name} changed")
                continue
            if not changed:
                found.append(f"trainable {name} did not change")
            if param.grad is None:
                found.append(f"trainable {name}: no gradient")
            elif expert and not experts.signal[expert.group(1)]:
                if torch.any(param.grad != 0):
                    found.append(f"{name}: no loss-carrying token reached this expert, yet a non-zero gradient")
            elif not torch.any(param.grad != 0):
                found.append(f"trainable {name}: gradient all zeros")
        if found:
            problems[selection.describe(PARTS)] = found[:6]
        model.zero_grad(set_to_none=True)
    assert problems == {}


def test_the_never_read_parameter_is_in_the_audio_encoder_and_trains_with_it(expected_parts):
    """Qwen2.5-Omni's ``audio_bos_eos_token``: Bridge's audio flag freezes it, so it is the audio encoder's."""
    assert NEVER_READ["qwen25_omni"] <= expected_parts["qwen25_omni"][Part.AUDIO_MODEL]


def test_qwen3_omni_batches_one_audio_clip_bridge_splits_several_with_the_wrong_lengths(trained_models):
    """Why the Qwen3-Omni training batch is one row (see the harness module): Bridge's
    ``Qwen3OmniThinkerModel.get_audio_features`` splits the encoder's output per clip with the encoder's
    ``_get_feat_extract_output_lengths``, which in transformers 5.12.1 is the Qwen2.5 formula (one stride-2 conv,
    then a 2x pool), not the three stride-2 convolutions this encoder runs."""
    from bridge_freeze_harness.tiny.qwen3_omni import AUDIO_FRAMES, audio_token_count

    provider, model, _ = trained_models["qwen3_omni"]
    audio = model.thinker.audio_model
    lengths = torch.tensor([AUDIO_FRAMES, AUDIO_FRAMES])
    features = torch.randn(provider.thinker_config.audio_config.num_mel_bins, 2 * AUDIO_FRAMES)
    with torch.no_grad():
        produced = audio(features, feature_lens=lengths).last_hidden_state.shape[0]
    assert produced == 2 * audio_token_count(AUDIO_FRAMES) == 8
    assert audio._get_feat_extract_output_lengths(lengths)[1].tolist() == [8, 8]  # what Bridge splits by
    with pytest.raises(ValueError, match="batch of one"):
        train.synthetic_batch("qwen3_omni", provider, batch_size=2)
