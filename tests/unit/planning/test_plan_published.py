"""``bridge-freeze plan --hf-config`` on makers' published ``config.json`` files: every part counted exactly.

Each fixture (tests/fixtures/hf_configs/<folder>/config.json, where it came from in its SOURCE file) is planned
through the real path (Bridge's own conversion, the real model class on the meta device, the plugin's freeze)
and each part's parameter count is compared with an INDEPENDENT count: transformers' own model class for the
same config, built on the meta device, its parameter names sorted into parts by the rule written here per
family (the maker's checkpoint names); for Kimi K2.5, whose model is hub remote code, the vision side is the
published checkpoint's tensor listing and the language model transformers' DeepSeek-V3 class. For an Omni model
only transformers' thinker is counted: Bridge builds no talker and no vocoder.

Five of these failed before (GLM-4.5V: the forced ``allgather`` dispatcher with Bridge's shared-expert overlap;
Gemma 3: zero-centred norms the CPU patches missed; Kimi K2.5: ``kimi_k25`` is remote code; Qwen3.5: its MTP
layer's TE-only spec and zero-centred norms; MiniMax-M3: zero-centred norms). Builds over about 15 s on 2 shared
cores are marked ``slow`` (see :data:`SLOW`).
"""

from __future__ import annotations

import functools
import json
import math
import re
from pathlib import Path

import pytest

from bridge_freeze_harness.tiny import TINY_FAMILIES

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf_configs"

#: fixture folder -> (registry family, transformers class, [(regex matched at the start of an HF parameter name,
#: part, or None for a module Bridge does not build)] first match wins, else language_model)
QWEN_VISUAL = [(r"model\.visual\.merger\.", "vision_projection"), (r"model\.visual\.", "vision_model")]
QWEN3_RULE = [(r"model\.visual\.deepstack_merger_list\.", "vision_projection"), *QWEN_VISUAL]
PROJECTOR_TOWER = [(r"model\.multi_modal_projector\.", "vision_projection"), (r"model\.vision_tower\.", "vision_model")]
HF_COUNTS = {
    "qwen25_vl": ("qwen25_vl", "Qwen2_5_VLForConditionalGeneration", QWEN_VISUAL),
    "qwen3_vl": ("qwen3_vl", "Qwen3VLForConditionalGeneration", QWEN3_RULE),
    "qwen3_vl_moe": ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", QWEN3_RULE),
    "qwen3_vl_moe_235b": ("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", QWEN3_RULE),
    "gemma3_vl": ("gemma3_vl", "Gemma3ForConditionalGeneration", PROJECTOR_TOWER),
    "glm45v": ("glm45v", "Glm4vMoeForConditionalGeneration", QWEN_VISUAL),
    "qwen35_vl": ("qwen35_vl", "Qwen3_5ForConditionalGeneration", QWEN3_RULE),
    "qwen35_vl_moe": ("qwen35_vl", "Qwen3_5MoeForConditionalGeneration", QWEN3_RULE),
    # transformers' multi_modal_projector holds both projector MLPs (Bridge: multi_modal_projector +
    # patch_merge_mlp); the sparse-attention indexers are checkpoint-only state Bridge builds frozen
    # (lightning_indexers, never run), which the plan lists as "other".
    "minimax_m3_vl": ("minimax_m3_vl", "MiniMaxM3SparseForConditionalGeneration",
                      [*PROJECTOR_TOWER, (r"model\.language_model\.layers\.\d+\.self_attn\.indexer\.", "other")]),
    # Gemma 4 31B (dense): Bridge's Gemma4DenseVLProvider
    "gemma4_vl": ("gemma4_vl", "Gemma4ForConditionalGeneration",
                  [(r"model\.embed_vision\.", "vision_projection"), (r"model\.vision_tower\.", "vision_model")]),
    # Qwen3-Omni-30B-A3B-Instruct: Bridge builds the thinker only, so only transformers' ``thinker.*`` is counted;
    # its talker (with the code predictor) and code2wav vocoder (3,540,613,057 parameters) are left out (None).
    # The audio projection is the encoder's last two linears (proj1 -> GELU -> proj2), the vision projection
    # the merger and the DeepStack merger_list.
    "qwen3_omni": ("qwen3_omni", "Qwen3OmniMoeForConditionalGeneration",
                   [(r"(talker|code2wav)\.", None),
                    (r"thinker\.audio_tower\.proj[12]\.", "audio_projection"),
                    (r"thinker\.audio_tower\.", "audio_model"),
                    (r"thinker\.visual\.merger(_list)?\.", "vision_projection"),
                    (r"thinker\.visual\.", "vision_model")]),
    # Qwen2.5-Omni-7B: thinker only (talker and token2wav left out); the audio projection is the encoder's last
    # linear ``proj``, the vision projection the merger.
    "qwen25_omni": ("qwen25_omni", "Qwen2_5OmniForConditionalGeneration",
                    [(r"(talker|token2wav)\.", None),
                     (r"thinker\.audio_tower\.proj\.", "audio_projection"),
                     (r"thinker\.audio_tower\.", "audio_model"),
                     (r"thinker\.visual\.merger\.", "vision_projection"),
                     (r"thinker\.visual\.", "vision_model")]),
    # Qwen2-Audio-7B: the encoder's fixed sinusoidal position table (an nn.Embedding parameter, requires_grad
    # False, in transformers and in Bridge alike) is "other" in the registry: no flag trains it.
    "qwen2_audio": ("qwen2_audio", "Qwen2AudioForConditionalGeneration",
                    [(r"model\.audio_tower\.embed_positions\.", "other"),
                     (r"model\.multi_modal_projector\.", "audio_projection"),
                     (r"model\.audio_tower\.", "audio_model")]),
    # Ministral 3 3B (text model_type ministral3, tied embeddings): Pixtral tower + the patch-merging projector
    "ministral3": ("ministral3", "Mistral3ForConditionalGeneration", PROJECTOR_TOWER),
    # EXAONE 4.5 33B: the projection ``merger`` lives inside transformers' ``visual`` as in Bridge's vision_model;
    # its MTP layer (Bridge's language_model.mtp, "other") is not in transformers' class: see PART_EXTRA
    "exaone45_vl": ("exaone45_vl", "Exaone4_5_ForConditionalGeneration", QWEN_VISUAL),
    # ERNIE-4.5-VL-28B-A3B (native layout): the resampler is the projection; each router's e_score_correction_bias
    # is a parameter in transformers' class and a buffer (router.expert_bias) in Bridge's, so it is not counted
    "ernie45_vl": ("ernie45_vl", "Ernie4_5_VLMoeForConditionalGeneration",
                   [(r"model\.language_model\.layers\.\d+\.mlp\.\w+\.gate\.moe_statics\.", None),
                    (r"model\.resampler_model\.", "vision_projection"), (r"model\.vision_tower\.", "vision_model")]),
}
def _listed(file_name: str):
    """The parameters of a published tensor listing (a fixture file: name -> shape)."""
    return lambda folder, doc: sum(math.prod(shape) for shape in
                                   json.loads((FIXTURES / folder / file_name).read_text()).values())


def _gemma4_k_eq_v_rows(folder: str, doc: dict) -> int:
    """Bridge's fused ``linear_qkv`` of a full-attention layer keeps V rows that the checkpoint shares with K
    (``attention_k_eq_v``: no v_proj there; Bridge fills them from k_proj): layers x KV heads x head dim x hidden."""
    text = doc["text_config"]
    assert text["attention_k_eq_v"]
    return (text["layer_types"].count("full_attention") * text["num_global_key_value_heads"]
            * text["global_head_dim"] * text["hidden_size"])


#: fixture folder -> language-model parameters Bridge builds that transformers' class does not: Qwen3.5's
#: multi-token-prediction layer (``mtp.*`` in the checkpoint, Bridge's ``language_model.mtp``), its names and
#: shapes from the same report's tensor listing; Gemma 4's K=V rows, from the config's fields.
LM_EXTRA = {"qwen35_vl": _listed("mtp_tensors.json"), "qwen35_vl_moe": _listed("mtp_tensors.json"),
            "gemma4_vl": _gemma4_k_eq_v_rows}


def _exaone45_mtp_layers(folder: str, doc: dict) -> int:
    """EXAONE 4.5's multi-token-prediction layers (``mtp.*`` in the checkpoint; transformers' class ignores them on
    load and builds none): per layer (``num_nextn_predict_layers``), transformers' own EXAONE 4 decoder layer for the
    same text config, plus the checkpoint's ``mtp.pre_fc_norm_embedding`` / ``mtp.pre_fc_norm_hidden`` (hidden each),
    ``mtp.fc`` (2 x hidden -> hidden, no bias) and ``mtp.norm`` (hidden)."""
    import torch
    import transformers
    from transformers.models.exaone4.modeling_exaone4 import Exaone4DecoderLayer

    text = transformers.AutoConfig.from_pretrained(str(FIXTURES / folder / "config.json")).text_config
    with torch.device("meta"):
        layer = sum(p.numel() for p in Exaone4DecoderLayer(text, layer_idx=0).parameters())
    hidden = text.hidden_size
    return doc["text_config"]["num_nextn_predict_layers"] * (layer + 2 * hidden + 2 * hidden * hidden + hidden)


#: fixture folder -> (part, parameters Bridge builds in that part that transformers' class does not)
PART_EXTRA = {"exaone45_vl": ("other", _exaone45_mtp_layers)}
#: measured on 2 cores shared with other work (load 2-23): 235B (94 layers x 128 experts) 16 s, Qwen3.5-35B-A3B
#: (40 x 256 experts) 14-37 s; Qwen3-Omni's thinker (48 x 128 experts, load 2) 8-11 s, like Qwen3-VL-30B-A3B; the
#: others under 5 s once Bridge is imported, except EXAONE 4.5 33B (64 dense layers + MTP, load 2-4) 11-18 s
SLOW = {"qwen3_vl_moe_235b", "qwen35_vl_moe", "exaone45_vl"}


def _plan(folder: str) -> object:
    """The plan of a fixture, nothing selected (a fresh build)."""
    from bridge_freeze_plugin import planning
    from bridge_freeze_plugin.request import FreezeSelection

    return planning.plan_model(None, FreezeSelection(), planning.MemoryAssumptions(),
                               hf_config=FIXTURES / folder / "config.json")


#: a fixture's plan, built once per test process (the counts and the sync tests read the same plan)
_shared_plan = functools.cache(_plan)


def _planned(folder: str, family: str | None = None, *, fresh: bool = False) -> dict[str, int]:
    """Each part's parameters in the fixture's plan (``fresh``: not the shared plan, e.g. under a patch)."""
    plan = _plan(folder) if fresh else _shared_plan(folder)
    assert plan.family == (family or folder)
    return {p.count.part.value: p.count.total for p in plan.parts}


@functools.cache
def _hf_counts(folder: str) -> dict[str, int]:
    import torch
    import transformers

    _, cls_name, rule = HF_COUNTS[folder]
    config_file = FIXTURES / folder / "config.json"
    config = transformers.AutoConfig.from_pretrained(str(config_file))
    with torch.device("meta"):
        model = getattr(transformers, cls_name)(config)
    counts = dict.fromkeys(("language_model", "vision_model", "vision_projection", "audio_model",
                            "audio_projection", "other"), 0)
    for name, param in model.named_parameters():  # a tied lm_head is listed once
        part = next((p for pattern, p in rule if re.match(pattern, name)), "language_model")
        if part is not None:  # None: a module of transformers' class that Bridge does not build
            counts[part] += param.numel()
    if folder in LM_EXTRA:
        counts["language_model"] += LM_EXTRA[folder](folder, json.loads(config_file.read_text()))
    if folder in PART_EXTRA:
        part, extra = PART_EXTRA[folder]
        counts[part] += extra(folder, json.loads(config_file.read_text()))
    return {part: n for part, n in counts.items() if n or part == "language_model"}


@pytest.mark.parametrize("folder", [pytest.param(f, marks=pytest.mark.slow) if f in SLOW else f for f in HF_COUNTS])
def test_each_part_of_a_published_config_is_counted_exactly(cpu_bridge, folder):
    assert _planned(folder, HF_COUNTS[folder][0]) == _hf_counts(folder)


#: Megatron parameters Bridge 0.6.2 maps to no HF tensor: the Qwen3.5 MTP layer's two norms (no mapping)
NOT_SENT = {"qwen35_vl": ["language_model.mtp.layers.0.mtp_model_layer.input_layernorm.weight",
                          "language_model.mtp.layers.0.mtp_model_layer.pre_mlp_layernorm.weight"]}


@pytest.mark.parametrize("folder", ["qwen25_vl", "qwen2_audio", "qwen35_vl",
                                    pytest.param("exaone45_vl", marks=pytest.mark.slow)])
def test_the_sync_of_a_published_config_sends_every_parameter_once(cpu_bridge, folder):
    """These checkpoints store every parameter as one HF tensor (no fused experts, no tied copy), so one full
    weight sync in bf16 is 2 bytes per parameter of the independent count (with the MTP layers, which
    transformers' class does not build, nor write), less what the plan says is not sent. Qwen2-Audio's language
    model and the MTP layers were left out before: the layout came from transformers' save alone (see
    sync_layout.add_mapped_names); nothing said so."""
    plan = _shared_plan(folder)
    assert plan.sync is not None and plan.sync.dtype == "bfloat16"
    frozen = sum(p.count.total - p.count.trainable for p in plan.parts)  # Qwen2-Audio's fixed positions
    assert plan.sync.trainable_bytes == plan.sync.full_bytes - 2 * frozen
    hidden = json.loads((FIXTURES / folder / "config.json").read_text()).get("text_config", {}).get("hidden_size")
    not_sent = NOT_SENT.get(folder, [])
    assert (plan.sync.left_out_tensors, plan.sync.left_out_parameters) == (len(not_sent), len(not_sent) * hidden
                                                                           if not_sent else 0)
    assert plan.sync.left_out_first == min(not_sent, default="")
    assert ("; not sent: " in plan.sync.describe()) == bool(not_sent)
    assert plan.sync.full_bytes == 2 * (sum(_hf_counts(folder).values()) - plan.sync.left_out_parameters)


@pytest.mark.slow  # 61 layers x 384 experts: about 25 s on 2 cores
def test_kimi_k25_published_config_plans_offline_with_the_published_tensor_sizes(cpu_bridge):
    import torch
    from transformers import AutoConfig, DeepseekV3ForCausalLM

    planned = _planned("kimi_k25_vl")
    listing = json.loads((FIXTURES / "kimi_k25_vl" / "vision_tensors.json").read_text())
    vision = sum(math.prod(s) for n, s in listing.items() if n.startswith("vision_tower."))
    projection = sum(math.prod(s) for n, s in listing.items() if n.startswith("mm_projector."))
    doc = json.loads((FIXTURES / "kimi_k25_vl" / "config.json").read_text())["text_config"]
    text = {k: v for k, v in doc.items() if k not in ("auto_map", "architectures", "model_type")}
    with torch.device("meta"):
        lm = DeepseekV3ForCausalLM(AutoConfig.for_model("deepseek_v3", **text))
    assert planned == {"language_model": sum(p.numel() for p in lm.parameters()), "vision_model": vision,
                       "vision_projection": projection}


def _bridge_routes(folder: str) -> type:
    """The provider class the installed Bridge's own conversion (``AutoBridge``) makes of a fixture's config (the
    config read by plan's offline reader: the file is hub remote code)."""
    from megatron.bridge import AutoBridge

    from bridge_freeze_plugin.planning._model_choice import load_hf_config

    hf_config, _ = load_hf_config(FIXTURES / folder / "config.json")
    return type(AutoBridge.from_hf_config(hf_config).to_megatron_provider(load_weights=False))


def test_nemotron_nano_v2_vl_config_plans_offline_with_each_part_counted_exactly(cpu_bridge):
    """Nemotron Nano V2 VL (``NemotronH_Nano_VL_V2``, hub remote code; the fixture is a reconstruction, each piece in
    its SOURCE), refused before: plan reads its ``llm_config`` with transformers' ``NemotronHConfig``. The language
    model is counted by transformers' NemotronHForCausalLM on the meta device (the checkpoint's
    ``language_model.backbone.*`` and ``language_model.lm_head``). transformers has no RADIO tower, so the vision
    side is counted term by term from the config's own fields: each term is one checkpoint tensor that Bridge's
    NemotronVLBridge.mapping_registry maps (``vision_model.radio_model.model.*``, ``mlp1.*``).

    Which provider builds it is Bridge's choice, asked here of the installed Bridge: since Bridge 012529a47 its
    NemotronVLBridge sends a V2 config whose ``llm_config`` has ``n_routed_experts`` (transformers' NemotronHConfig
    fills in 8 for this dense config) to the Omni provider, and the plan follows it as family nemotron_omni (no
    sound config: no audio parts); before, to NemotronVLModelProvider, family nemotron_vl."""
    import torch
    from megatron.bridge.models.nemotron_vl.nemotron_vl_provider import NemotronVLModelProvider
    from transformers import AutoConfig, NemotronHForCausalLM

    doc = json.loads((FIXTURES / "nemotron_vl" / "config.json").read_text())
    text = {k: v for k, v in doc["llm_config"].items() if k not in ("auto_map", "architectures", "model_type")}
    with torch.device("meta"):
        lm = NemotronHForCausalLM(AutoConfig.for_model("nemotron_h", **text))

    routed = _bridge_routes("nemotron_vl")
    if issubclass(routed, NemotronVLModelProvider):
        # The class/register tokens (patch_generator.cls_token.token): 16 rows. Bridge's provider passes
        # use_vision_backbone_fp8_arch=True, with which megatron-core's LLaVAModel builds RADIO's class tokens as 16
        # rows (llava_model.py: class_token_len = 16), and Bridge copies the checkpoint tensor onto it one to one
        # (AutoMapping), so a checkpoint Bridge imports holds 16 rows there too (Bridge documents importing this
        # one; no tensor listing of it was found to confirm). Not a config field.
        family, class_token_rows = "nemotron_vl", 16
    else:
        # The Omni provider: NemotronOmniBridge.provider_bridge sets vision_class_token_len = 10 for every config
        # it converts (C-RADIOv4-H's 4 teachers + 6 registers), this one too
        assert routed.__name__ == "NemotronOmniModelProvider", routed
        family, class_token_rows = "nemotron_omni", 10
    vision, projection = _radio_tower_and_mlp1(doc, class_token_rows=class_token_rows)
    assert _planned("nemotron_vl", family) == {"language_model": sum(p.numel() for p in lm.parameters()),
                                               "vision_model": vision, "vision_projection": projection}


def _radio_tower_and_mlp1(doc: dict, class_token_rows: int, video_frames: int = 0) -> tuple[int, int]:
    """(RADIO tower, ``mlp1`` projector) parameters of a Nemotron VL / Omni wrapper config ``doc``, term by term
    from its fields; each term is one checkpoint tensor Bridge's NemotronVLBridge.mapping_registry maps
    (``vision_model.radio_model.model.*``, ``mlp1.*``). ``video_frames``: the frames of the separate video patch
    embedder (0: none)."""
    width = doc["vit_hidden_size"]  # RADIO's width, 1280
    patch = doc["vision_config"]["patch_size"]  # 16
    # ViT-H/16 (radio_v2.5-h / c-radio_v4-h are timm's vit_huge_patch16_224): 32 blocks, MLP ratio 4. No config
    # field says so; Bridge's provider hard-codes the same (num_layers 32, ffn_hidden_size 5120).
    depth, mlp = 32, 4 * width
    block = (2 * width  # blocks.N.norm1.{weight,bias} (LayerNorm)
             + width * 3 * width + 3 * width  # blocks.N.attn.qkv.{weight,bias}
             + width * width + width  # blocks.N.attn.proj.{weight,bias}
             + 2 * width  # blocks.N.norm2.{weight,bias}
             + width * mlp + mlp  # blocks.N.mlp.fc1.{weight,bias}
             + mlp * width + width)  # blocks.N.mlp.fc2.{weight,bias}
    class_tokens = class_token_rows * width  # patch_generator.cls_token.token
    # patch_generator.pos_embed: RADIO's position table for images up to max_resolution px (2048 / 16 = 128 per side)
    positions = (doc["vision_config"]["max_resolution"] // patch) ** 2 * width
    embedder = 3 * patch * patch * width  # patch_generator.embedder.weight: RGB patch -> width, no bias
    # patch_generator.video_embedder.weight: a tubelet of video_frames RGB patches -> width, no bias
    video_embedder = video_frames * 3 * patch * patch * width
    vision = class_tokens + positions + embedder + video_embedder + depth * block  # no final norm: none is mapped
    # mlp1: the pixel shuffle (downsample_ratio 0.5) concatenates 2 x 2 patches, so its input is 4 x width
    projector_in = round(width / doc["downsample_ratio"] ** 2)
    projection = (projector_in  # mlp1.0.weight (the norm; no bias is mapped)
                  + projector_in * doc["projector_hidden_size"]  # mlp1.1.weight (no bias)
                  + doc["projector_hidden_size"] * doc["llm_config"]["hidden_size"])  # mlp1.3.weight (no bias)
    return vision, projection


def test_nemotron_omni_config_plans_offline_with_each_part_counted_exactly(cpu_bridge):
    """Nemotron 3 Nano Omni (``NemotronH_Nano_Omni_Reasoning_V3``, hub remote code; the fixture is a reconstruction
    from a field-by-field transcription of the published file, see its SOURCE), refused before: plan reads its
    ``llm_config`` with transformers' ``NemotronHConfig`` and its ``vision_config`` / ``sound_config`` as the
    maker's config class holds them (attribute objects). Independent counts: the language model by transformers'
    NemotronHForCausalLM, the sound encoder by transformers' ParakeetEncoder (both on the meta device); the RADIO
    tower, ``mlp1`` and the sound projection term by term from the config's fields (the sound projection's tensors
    are the ``sound_projection.*`` that NemotronOmniBridge.mapping_registry maps)."""
    import torch
    from transformers import AutoConfig, NemotronHForCausalLM, ParakeetEncoder, ParakeetEncoderConfig

    doc = json.loads((FIXTURES / "nemotron_omni" / "config.json").read_text())
    text = {k: v for k, v in doc["llm_config"].items() if k not in ("auto_map", "architectures", "model_type")}
    sound = doc["sound_config"]
    # attention_bias: the published sound_config does not say; vLLM, which loads this checkpoint, builds the same
    # transformers class with attention_bias=False (SOURCE). transformers' default (True) would add 14,336 per
    # layer: the q/k/v/o and feed-forward biases. The feature extractor (mel filter bank, window) and the
    # batch-norm running statistics are buffers, not parameters, in the checkpoint and in both builds.
    encoder_config = ParakeetEncoderConfig(**{k: v for k, v in sound.items() if k != "model_type"},
                                           attention_bias=False)
    with torch.device("meta"):
        lm = NemotronHForCausalLM(AutoConfig.for_model("nemotron_h", **text))
        sound_encoder = ParakeetEncoder(encoder_config)

    # RADIO's class tokens, C-RADIOv4-H's own: one per distillation teacher (cls_token_per_teacher), then
    # registers up to a multiple of register_multiple: 4 + 6 = 10 rows. Bridge's Omni provider builds 10
    # (vision_class_token_len) and copies the checkpoint tensor one to one.
    args = doc["vision_config"]["args"]
    teachers = len({t["name"] for t in args["teachers"]}) if args["cls_token_per_teacher"] else 1
    class_token_rows = teachers + (args["register_multiple"] - teachers % args["register_multiple"])
    assert args["cpe_max_size"] == doc["vision_config"]["max_resolution"]  # the position table's size, both ways
    # separate_video_embedder: a video patch embedder over video_temporal_patch_size frames
    frames = doc["vision_config"]["video_temporal_patch_size"] if doc["vision_config"]["separate_video_embedder"] else 0
    vision, projection = _radio_tower_and_mlp1(doc, class_token_rows, video_frames=frames)
    assert not sound["projection_bias"]
    sound_projection = (sound["hidden_size"]  # sound_projection.norm.weight (RMSNorm)
                        + sound["hidden_size"] * sound["projection_hidden_size"]  # sound_projection.linear1.weight
                        + sound["projection_hidden_size"] * doc["llm_config"]["hidden_size"])  # ...linear2.weight
    assert _planned("nemotron_omni") == {"language_model": sum(p.numel() for p in lm.parameters()),
                                         "vision_model": vision, "vision_projection": projection,
                                         "audio_model": sum(p.numel() for p in sound_encoder.parameters()),
                                         "audio_projection": sound_projection}


def test_kimi_k25_vision_stand_ins_have_the_published_tensor_names_and_shapes(cpu_bridge):
    """The offline stand-ins the plan builds Kimi's vision side with, at full size: name for name and shape for
    shape the published checkpoint's ``vision_tower.**`` / ``mm_projector.**`` tensors."""
    import torch

    from bridge_freeze_harness.tiny._kimi_remote_code import REMOTE_CLASSES, KimiK25VisionConfig

    doc = json.loads((FIXTURES / "kimi_k25_vl" / "config.json").read_text())
    vision_config = KimiK25VisionConfig(**{k: v for k, v in doc["vision_config"].items() if k != "model_type"})
    with torch.device("meta"):
        tower = REMOTE_CLASSES["modeling_kimi_k25.MoonViT3dPretrainedModel"](
            REMOTE_CLASSES["modeling_kimi_k25.VisionTowerConfig"](vision_config))
        projector = REMOTE_CLASSES["modeling_kimi_k25.PatchMergerMLP"](
            REMOTE_CLASSES["modeling_kimi_k25.ProjectorConfig"](vision_config))
    built = {f"vision_tower.{n}": list(p.shape) for n, p in tower.named_parameters()}
    built.update({f"mm_projector.{n}": list(p.shape) for n, p in projector.named_parameters()})
    assert built == json.loads((FIXTURES / "kimi_k25_vl" / "vision_tensors.json").read_text())


def test_every_fixture_says_where_it_came_from():
    for folder in sorted(p for p in FIXTURES.iterdir() if p.is_dir()):
        source = (folder / "SOURCE").read_text()
        json.loads((folder / "config.json").read_text())
        assert re.search(r"SOURCE:|NOT the published file", source), folder.name
        if "SOURCE:" in source and "github.com/" in source:
            assert re.search(r"commit [0-9a-f]{40}", source), folder.name


def test_a_full_size_build_needs_no_tiny_configuration_patch(cpu_bridge, monkeypatch):
    """Full-size builds run under the family's any-size ``cpu_patches`` only: every tiny module's
    ``tiny_patches`` made to fail, the published Gemma 3 config still plans (it needs the zero-centred norms of
    ``cpu_patches``), and so do Qwen2.5-VL's and Qwen3.5's (its MTP layer and zero-centred norms)."""
    from bridge_freeze_harness.tiny import _index

    def refuse():
        raise AssertionError("a tiny configuration's patch ran in a full-size build")

    for entry in _index.entries().values():
        module = __import__(f"bridge_freeze_harness.tiny.{entry.module}", fromlist=["_"])
        if hasattr(module, "tiny_patches"):
            monkeypatch.setattr(module, "tiny_patches", refuse)
    assert _planned("gemma3_vl", fresh=True)["vision_projection"] == 6_194_304
    assert _planned("qwen25_vl", fresh=True)["vision_model"] == 631_975_680
    assert _planned("qwen35_vl", fresh=True)["language_model"] == 4_326_350_848


def test_a_type_bridge_registers_itself_plans_from_its_config_json(cpu_bridge, tmp_path):
    """``qwen3_asr``: transformers does not know it; Bridge registers its vendored config class with transformers
    when imported, so plan imports Bridge before refusing (it used to say "only with --tiny"). The config.json is
    Bridge's vendored class written at the tiny sizes; each part equals the harness's tiny model (the provider built
    directly, not converted from the file), its names sorted into parts by the rule written here."""
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr.configuration_qwen3_asr import Qwen3ASRConfig

    from bridge_freeze_harness.tiny import build_tiny_model
    from bridge_freeze_harness.tiny.qwen3_asr import thinker_config
    from bridge_freeze_plugin import planning
    from bridge_freeze_plugin.request import FreezeSelection

    config = Qwen3ASRConfig(thinker_config=thinker_config().to_dict())
    config.architectures = ["Qwen3ASRForConditionalGeneration"]
    config.save_pretrained(tmp_path)
    plan = planning.plan_model(None, FreezeSelection(), planning.MemoryAssumptions(),
                               hf_config=tmp_path / "config.json")
    assert plan.family == "qwen3_asr"
    rule = [(r"thinker\.audio_model\.proj[12]\.", "audio_projection"), (r"thinker\.audio_model\.", "audio_model")]
    expected: dict[str, int] = {}
    for name, param in build_tiny_model("qwen3_asr").named_parameters():
        part = next((p for pattern, p in rule if re.match(pattern, name)), "language_model")
        expected[part] = expected.get(part, 0) + param.numel()
    assert {p.count.part.value: p.count.total for p in plan.parts} == expected


def test_qwen3_asr_published_config_is_counted_exactly(cpu_bridge):
    """Qwen3-ASR-0.6B's published config.json: transformers has no class for it, so the independent count is the
    maker's modelling code as Bridge vendors it (hf_qwen3_asr), on the meta device, built in the harness's
    context that closes its transformers-5 gaps (none of them a parameter: a rope init, a pad id, a tie list)."""
    import torch
    from megatron.bridge.models.qwen3_asr.hf_qwen3_asr.modeling_qwen3_asr import Qwen3ASRForConditionalGeneration
    from transformers import AutoConfig

    from bridge_freeze_harness.hf_checkpoint import hf_model_context

    config_file = FIXTURES / "qwen3_asr" / "config.json"
    with hf_model_context("qwen3_asr"):
        config = AutoConfig.from_pretrained(str(config_file))
        with torch.device("meta"):
            model = Qwen3ASRForConditionalGeneration(config)
    rule = [(r"thinker\.audio_tower\.proj[12]\.", "audio_projection"), (r"thinker\.audio_tower\.", "audio_model")]
    expected = {"language_model": 0, "audio_model": 0, "audio_projection": 0}
    for name, param in model.named_parameters():
        expected[next((p for pattern, p in rule if re.match(pattern, name)), "language_model")] += param.numel()
    # The maker's class keeps its own thinker.lm_head; Bridge ties the output layer to the embedding
    # (share_embeddings_and_output_weights from text_config.tie_word_embeddings), one vocab x hidden matrix fewer.
    text = json.loads(config_file.read_text())["thinker_config"]["text_config"]
    assert text["tie_word_embeddings"]
    expected["language_model"] -= text["vocab_size"] * text["hidden_size"]
    assert _planned("qwen3_asr") == expected


@pytest.mark.parametrize("name", sorted(set(TINY_FAMILIES) - {"kimi_k25_vl"}))  # kimi: built from a hub-style folder
def test_every_family_builds_full_size_with_zero_centred_norms(cpu_bridge, name):
    """A published config with zero-centred gamma (Gemma, Qwen3.5, MiniMax-M3, Step-3.7 convert with it) builds in
    the full-size CPU context of every family, not only of those whose configs we hold: the same parameters as
    without it (megatron-core's torch norm refuses it; the harness's norm takes its place, same names and shapes)."""
    from bridge_freeze_harness.tiny import make_provider
    from bridge_freeze_plugin.planning._meta_build import build_meta_model

    def names(zero_centred: bool) -> list[tuple[str, tuple[int, ...]]]:
        provider = make_provider(name, layernorm_zero_centered_gamma=zero_centred)
        model, _ = build_meta_model(provider, family_name=name)  # no tiny_name: the full-size context
        return sorted((n, tuple(p.shape)) for n, p in model.named_parameters())

    assert names(True) == names(False)
