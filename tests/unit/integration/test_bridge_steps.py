"""Which of Bridge's own forward steps trains each family in Bridge's loop (``cpu_training.FORWARD_STEPS``), and the
batch the harness's synthetic dataset lays out for it, checked against Bridge's step modules themselves.

The Omni thinkers take their audio (``input_features`` / ``feature_attention_mask``) and their image from the batch:
Bridge's vlm_step passes one ``GenericVisualInputs`` (no audio field), its Qwen3-Omni step passes the media as
top-level keys. That the audio reaches the model in Bridge's real loop is shown end to end by the demo test
(tests/unit/cli/test_cli.py: the audio projection's HF tensors change); here, the pieces.
"""

from __future__ import annotations

import pytest

OMNI = ("qwen25_omni", "qwen3_omni")

#: Bridge imported (TE stub) through the session's fixture, which also marks every test here ``bridge``.
pytestmark = pytest.mark.usefixtures("cpu_bridge")


def test_each_family_trains_with_bridges_own_step_function():
    from megatron.bridge.models.qwen_omni import qwen3_omni_step
    from megatron.bridge.training import vlm_step

    from bridge_freeze_harness.cpu_training import forward_step_of

    for family in OMNI:
        assert forward_step_of(family).load() is qwen3_omni_step.forward_step
    for family in ("qwen3_vl", "qwen2_audio", "qwen25_vl"):
        assert forward_step_of(family).load() is vlm_step.forward_step
    from megatron.bridge.training import llava_step, nemotron_omni_step

    assert forward_step_of("nemotron_vl").load() is llava_step.forward_step
    assert forward_step_of("nemotron_omni").load() is nemotron_omni_step.forward_step


def test_the_nemotron_omni_batch_is_what_its_step_reads_and_packs_the_images_as_the_model_does():
    """Two samples in one micro-batch: the images' patches side by side (packed), the sound clips along the batch;
    the vision packing Bridge's step builds from ``imgs_sizes`` is the one the harness's own forward passes."""
    import torch
    from megatron.bridge.training import nemotron_omni_step

    from bridge_freeze_harness import train
    from bridge_freeze_harness.cpu_training import SyntheticVLMDataset
    from bridge_freeze_harness.tiny import nemotron_omni

    provider = train.make_provider("nemotron_omni")
    dataset = SyntheticVLMDataset("nemotron_omni", provider, samples=2)
    batch = dataset.collate_fn([dataset[0], dataset[1]])
    assert {k for k, v in batch.items() if v is not None} == {
        "input_ids", "labels", "loss_mask", "attention_mask", "pixel_values", "imgs_sizes", "sound_clips",
        "sound_length"}
    together = nemotron_omni.forward_inputs(provider, batch_size=2)  # the harness's own two-row forward input
    assert batch["pixel_values"].shape == together["images"].shape
    assert batch["sound_clips"].shape == together["sound_clips"].shape
    packed = nemotron_omni_step._build_vision_packed_seq_params(batch["imgs_sizes"])
    assert torch.equal(packed.cu_seqlens_q, together["vision_packed_seq_params"].cu_seqlens_q)


def test_the_omni_media_keys_are_those_bridges_step_passes_to_the_model():
    from megatron.bridge.models.qwen_omni import qwen3_omni_step

    from bridge_freeze_harness.cpu_training import QWEN_OMNI_MEDIA_KEYS

    # the step's own list (a private name of Bridge 0.6.2's module: a rename shows here first)
    assert set(QWEN_OMNI_MEDIA_KEYS) == set(qwen3_omni_step._MULTIMODAL_KEYS) - {"visual_inputs"}


@pytest.mark.parametrize("family", OMNI)
def test_the_omni_batch_carries_audio_and_image_as_the_steps_top_level_keys(family):
    import torch
    from megatron.bridge.models.qwen_omni import qwen3_omni_step

    from bridge_freeze_harness import train
    from bridge_freeze_harness.cpu_training import SyntheticVLMDataset

    provider = train.make_provider(family)
    dataset = SyntheticVLMDataset(family, provider, samples=2)
    sample = dataset[0]
    batch = dataset.collate_fn([sample])
    assert set(batch) == {"input_ids", "labels", "loss_mask", "pixel_values", "image_grid_thw", "input_features",
                          "feature_attention_mask"}
    assert all(torch.equal(batch[k], sample[k]) for k in batch)  # a batch of one: the sample itself
    # what the step hands the model besides input_ids / labels / loss_mask (no .cuda() here: its normaliser only)
    media = qwen3_omni_step._normalize_multimodal_inputs(batch)
    assert set(media) == {"pixel_values", "image_grid_thw", "input_features", "feature_attention_mask"}
    mel = int(provider.thinker_config.audio_config.num_mel_bins)
    assert media["input_features"].shape[:2] == (1, mel)
    assert media["feature_attention_mask"].shape == (1, media["input_features"].shape[2])
    assert (batch["input_ids"] == int(provider.audio_token_id)).any()  # the clip's placeholders in the text


def test_qwen3_omni_refuses_a_micro_batch_of_two_clips_and_qwen25_omni_takes_it():
    from bridge_freeze_harness import train
    from bridge_freeze_harness.cpu_training import SyntheticVLMDataset

    for family, allowed in (("qwen25_omni", True), ("qwen3_omni", False)):
        dataset = SyntheticVLMDataset(family, train.make_provider(family), samples=2)
        samples = [dataset[0], dataset[1]]
        if allowed:
            batch = dataset.collate_fn(samples)
            assert batch["input_ids"].shape[0] == 2 and batch["input_features"].shape[0] == 2
        else:
            with pytest.raises(ValueError, match="at most 1 sample"):
                dataset.collate_fn(samples)


#: family -> (its Bridge model class, the media keys its forward takes from the batch: independent of the harness,
#: read off the class's forward signature in Bridge 0.6.2).
VLM_STEP_MEDIA = {
    "ministral3": ("megatron.bridge.models.ministral3.modeling_ministral3:Ministral3Model",
                   {"pixel_values", "image_sizes"}),
    "ernie45_vl": ("megatron.bridge.models.ernie_vl.modeling_ernie45_vl.model:Ernie45VLModel",
                   {"pixel_values", "image_grid_thw", "mm_token_type_ids", "moe_mm_token_type_ids"}),
    "gemma4_vl": ("megatron.bridge.models.gemma_vl.modeling_gemma4_vl:Gemma4VLModel",
                  {"pixel_values", "image_position_ids", "input_features"}),
}


@pytest.mark.parametrize("family", sorted(VLM_STEP_MEDIA))
def test_vlm_step_hands_the_model_every_media_key_of_the_sample(family):
    """Ministral 3's image_sizes, ERNIE's MoE routing types, Gemma 4's audio next to its image: vlm_step passes the
    ``visual_inputs`` object's fields that the model's forward names, so each must be a field of that object."""
    import importlib
    import types

    import torch
    from megatron.bridge.training import vlm_step

    from bridge_freeze_harness import train
    from bridge_freeze_harness.cpu_training import SyntheticVLMDataset, forward_step_of

    path, media = VLM_STEP_MEDIA[family]
    module, _, name = path.partition(":")
    model_class = getattr(importlib.import_module(module), name)
    assert forward_step_of(family).load() is vlm_step.forward_step
    dataset = SyntheticVLMDataset(family, train.make_provider(family), samples=2)
    samples = [dataset[0], dataset[1]]
    batch = dataset.collate_fn(samples)
    # vlm_step.forward_step: visual_inputs.normalized_for_model(), filtered by the model's forward signature
    passed = vlm_step._filter_visual_kwargs_for_model(types.SimpleNamespace(forward=model_class.forward),
                                                      batch["visual_inputs"].normalized_for_model())
    assert set(passed) == media
    for key in media:
        assert torch.equal(passed[key], torch.cat([s[key] for s in samples])), key


def test_each_training_and_forward_starts_from_a_fresh_processs_moe_state(cpu_bridge):
    """megatron-core keeps per-process MoE state: the first aux-loss scale a process sets (later ones are copied into
    it: a ``[]`` scale left by one training made every later MoE finetune in that test worker fail with "output with
    shape [] doesn't match the broadcast shape [1]") and a metrics tracker sized by the first model's layer count (a
    deeper model's forward later: "index 2 is out of bounds"). The harness starts each training and each forward
    from a fresh process's state."""
    import torch
    from megatron.core.transformer.moe import moe_logging
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    from bridge_freeze_harness.cpu_training import cpu_training
    from bridge_freeze_harness.forward import forward_patches

    def poison() -> None:
        MoEAuxLossAutoScaler.main_loss_backward_scale = torch.tensor(1.0)
        moe_logging.get_moe_metrics_tracker().record("load_balancing_loss", torch.tensor(1.0), 1, 1)

    try:
        poison()
        with cpu_training("qwen3_vl"):
            assert MoEAuxLossAutoScaler.main_loss_backward_scale is None
            MoEAuxLossAutoScaler.set_loss_scale(torch.ones(1))  # what Bridge's step sets, shape [1]
            assert MoEAuxLossAutoScaler.main_loss_backward_scale.shape == (1,)
            moe_logging.get_moe_metrics_tracker().record("load_balancing_loss", torch.tensor(1.0), 3, 3)
        poison()
        with forward_patches("qwen3_vl"):
            assert MoEAuxLossAutoScaler.main_loss_backward_scale is None
            moe_logging.get_moe_metrics_tracker().record("load_balancing_loss", torch.tensor(1.0), 3, 3)
    finally:
        MoEAuxLossAutoScaler.main_loss_backward_scale = None
        moe_logging.destroy_moe_metrics_tracker()


def _bridge_step37_keywords() -> set[str]:
    """The model keywords Bridge's own Step-3.7 step sets (``forward_args["<key>"] = ...`` in its source)."""
    import inspect
    import re

    from megatron.bridge.models.stepfun import step37_flickr8k_step

    return set(re.findall(r'forward_args\["(\w+)"\]\s*=', inspect.getsource(step37_flickr8k_step)))


class _StragglerTimer:
    """Bridge's straggler timer, used as ``timer(bdata=True)`` and as ``timer`` itself: a no-op context."""

    def __call__(self, **_: object) -> _StragglerTimer:
        return self

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def test_the_step37_step_hands_the_model_what_bridges_step_does_on_bshd_rows():
    """Bridge's step37_flickr8k_step cannot run on the CPU (THD packs; tiny/_step37_step.py): the harness's step sets
    the same model keywords less the two that carry the packing, and the images reach the loss."""
    import types

    import torch

    from bridge_freeze_harness import train
    from bridge_freeze_harness.cpu_training import SyntheticVLMDataset, forward_step_of
    from bridge_freeze_harness.forward import forward_patches
    from bridge_freeze_harness.tiny import build_tiny_model

    provider = train.make_provider("step37", hidden_dropout=0.0, attention_dropout=0.0)
    dataset = SyntheticVLMDataset("step37", provider, samples=2)
    samples = [dataset[0], dataset[1]]
    batch = dataset.collate_fn(samples)
    (images,) = batch["images"]  # one group: every row's image after its <im_start>
    assert torch.equal(images.images, torch.cat([s["images"][0].images for s in samples]))
    # each row's insert token is the one just before its image tokens (the model fills those with the features)
    first_image = (batch["tokens"] == int(provider.image_token_id)).int().argmax(dim=1)
    assert batch["tokens"][torch.arange(2), first_image - 1].tolist() == [images.insert_start_token] * 2
    assert (batch["tokens"] == images.insert_start_token).sum() == 2

    model = build_tiny_model("step37", provider)
    seen: dict[str, object] = {}
    model.register_forward_pre_hook(lambda _m, _a, kwargs: seen.update(kwargs), with_kwargs=True)
    # Bridge's GlobalState stubbed to the step's bookkeeping (timers, straggler timer, NaN checks): not under test
    rerun = types.SimpleNamespace(check_for_nan_in_loss=True, check_for_spiky_loss=False)
    state = types.SimpleNamespace(timers=lambda *_, **__: types.SimpleNamespace(start=lambda: None, stop=lambda: None),
                                  straggler_timer=_StragglerTimer(),
                                  cfg=types.SimpleNamespace(rerun_state_machine=rerun))
    with forward_patches("step37"):
        output, loss_function = forward_step_of("step37").load()(state, iter([batch]), model)
        loss, tokens, _ = loss_function(output)
        loss.backward()
    assert set(seen) == _bridge_step37_keywords() - {"packed_seq_params", "cu_seqlens"}
    assert seen["position_ids"] is None and int(tokens) == int(batch["loss_mask"].sum())
    grads = {n: p.grad for n, p in model.named_parameters()}
    for part in ("vision_model.", "image_insert_embedding.align_projector."):
        assert any(g is not None and g.abs().sum() > 0 for n, g in grads.items() if n.startswith(part)), part
