"""What the docs say about which Bridge providers have a family, and whose freeze fields Bridge applies itself, is
what the code does (issue 37 item 13).

Before: docs/activation.md listed Qwen2.5/3-Omni, Qwen2-Audio and Qwen3-ASR among the providers with no family
(left to Bridge's own freeze), and docs/configuration.md listed their audio fields as Bridge's own (applied by
Bridge) or refused in the trainer's section, after the families ``qwen25_omni``, ``qwen3_omni``, ``qwen2_audio``
and ``qwen3_asr`` made those fields the plugin's flags.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin.families import UNSUPPORTED_PROVIDERS

DOCS = Path(__file__).resolve().parents[3] / "docs"
#: The Bridge provider classes of the Qwen audio families (Bridge 0.6.2's modules).
QWEN_AUDIO_PROVIDERS = {
    "qwen25_omni": "megatron.bridge.models.qwen_omni.qwen25_omni_provider:Qwen25OmniModelProvider",
    "qwen3_omni": "megatron.bridge.models.qwen_omni.qwen3_omni_provider:Qwen3OmniModelProvider",
    "qwen2_audio": "megatron.bridge.models.qwen_audio.qwen2_audio_provider:Qwen2AudioModelProvider",
    "qwen3_asr": "megatron.bridge.models.qwen3_asr.qwen3_asr_provider:Qwen3ASRModelProvider",
}
#: Bridge 0.6.2's freeze_* provider fields that are neither a flag nor a flag's alias (tests/unit/config/
#: test_config_trainers.py reads them from Bridge's source).
BRIDGE_OWN = {"freeze_mtp_model", "freeze_modality_encoders", "freeze_modality_projections"}
FLAGS_AND_ALIASES = {"freeze_language_model", "freeze_vision_model", "freeze_vision_projection", "freeze_audio_model",
                     "freeze_audio_projection", "freeze_sound_encoder", "freeze_sound_projection"}


def _text(page: str) -> str:
    return " ".join((DOCS / page).read_text(encoding="utf-8").split())


def _between(text: str, start: str, end: str) -> str:
    match = re.search(re.escape(start) + "(.*?)" + re.escape(end), text)
    assert match, f"{start!r} ... {end!r} not found"
    return match.group(1)


@pytest.mark.parametrize(("family", "provider"), sorted(QWEN_AUDIO_PROVIDERS.items()))
def test_the_qwen_audio_providers_have_families(family, provider):
    assert [p for p in bfp.get_family(family).providers] == [provider]
    assert provider not in UNSUPPORTED_PROVIDERS


def test_activation_md_lists_as_uncovered_exactly_the_providers_unsupported_py_lists():
    listed = _between(_text("activation.md"), "declare a flag but have no family (", ") are listed")
    assert set(re.findall(r"`(\w+)`", listed)) - {"nemotron_omni_provider"} == {
        path.rpartition(":")[2] for path in UNSUPPORTED_PROVIDERS}
    assert "Qwen" not in listed


def test_activation_md_says_the_qwen_audio_providers_flags_are_the_plugins():
    text = _text("activation.md")
    left = _between(text, "A provider no family covers whose own class declares a flag (", ") keeps Bridge's own")
    assert "Qwen" not in left
    assert all(f"`{family}`" in text for family in QWEN_AUDIO_PROVIDERS)


def test_configuration_md_lists_as_bridges_own_only_the_fields_that_are_no_flag():
    text = _text("configuration.md")
    bridge_row = _between(text, "| other `freeze_*` provider fields (Bridge's own, applied by Bridge, said in the "
                                "summary) | ", ": every `freeze_*` field")
    assert set(re.findall(r"`(?:model\.)?(freeze_\w+)`", bridge_row)) == BRIDGE_OWN
    sft_row = _between(text, "| Bridge's own provider fields here | ", " refused, saying what they are")
    refused = set(re.findall(r"`(?:megatron_config\.)?(freeze_\w+)`", sft_row))
    assert refused == BRIDGE_OWN and not refused & FLAGS_AND_ALIASES
