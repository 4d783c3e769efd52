"""check-config agrees with SkyRL 0.4.0's own loader (issue 34), and predicts what the plugin builds.

Each case of :data:`CASES` is a SkyRL run's config (SkyRL's default RL or SFT dump, or overrides over its defaults,
as its entry points take them): SkyRL's real loader (``SkyRLTrainConfig`` / ``SFTConfig``, installed from
requirements/skyrl-tests.txt) and check-config must accept exactly the same ones, except the cases marked
``differs``, where the plugin's rule deliberately refuses what SkyRL's loader lets through (each says why: the run
would silently do something other than what was written). Where both accept and a case names a family, the
selection check-config predicts is the one the plugin builds from the same settings, through the provider calls of
SkyRL 0.4.0's ``MegatronWorker.init_configs`` / ``make_megatron_module`` in the same order (SkyRL's own worker does
not import on Bridge 0.6.2: its ``megatron_model_wrapper`` needs two ``megatron.bridge.peft.utils`` names 0.6.2
lacks): ``AutoBridge.from_hf_pretrained`` -> ``to_megatron_provider()`` -> ``setattr(provider, k, v)`` for every
``transformer_config_kwargs`` item -> ``finalize()`` -> SkyRL's own ``freeze_moe_router`` hook registered ->
``provide_distributed_model``. The expected parameter names are computed here from the names, not by the plugin.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from _family_parts import part_of, parts_of
from _shared import names, trainable

from bridge_freeze_plugin.config import load_run
from bridge_freeze_plugin.errors import ConfigLoadError, InvalidFreezeConfigError

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "configs" / "skyrl"
DUMPS = {"rl": FIXTURES / "rl_defaults.yaml", "sft": FIXTURES / "sft_defaults.yaml"}
LISTING = Path(__file__).resolve().parents[3] / "bridge_freeze_plugin" / "config" / "skyrl_fields.json"
P = "trainer.policy.megatron_config"
K = f"{P}.transformer_config_kwargs"
MEGATRON = "trainer.strategy=megatron"
VLM = "trainer.policy.model.path=Qwen/Qwen3-VL-8B-Instruct"
#: SkyRL's Qwen3-VL-30B-A3B geometry3k RL example (examples/train/geometry3k/run_geometry3k_30b_a3b_megatron.sh): its
#: Megatron and model overrides, freeze_* included (it unfreezes what Qwen3VLMoEModelProvider freezes by default).
GEOMETRY3K_30B = [
    "trainer.algorithm.advantage_estimator=grpo", "trainer.policy.model.path=Qwen/Qwen3-VL-30B-A3B-Instruct",
    "trainer.placement.colocate_all=true", MEGATRON, f"{P}.tensor_model_parallel_size=4",
    f"{P}.pipeline_model_parallel_size=2", f"{P}.context_parallel_size=1", f"{P}.expert_model_parallel_size=8",
    f"{P}.expert_tensor_parallel_size=1", "trainer.ref.megatron_config.tensor_model_parallel_size=4",
    f"{K}.recompute_granularity=full", f"{K}.recompute_method=uniform", f"{K}.recompute_num_layers=1",
    f"{K}.freeze_language_model=false", f"{K}.freeze_vision_model=false", "trainer.remove_microbatch_padding=false",
    "trainer.algorithm.use_kl_loss=false", "generator.vision_language_generator=true",
    "environment.env_class=geometry3k", "generator.inference_engine.weight_sync_backend=nccl",
]
#: SkyRL's Megatron VLM SFT example (examples/train/sft/run_sft_megatron_vlm.sh), its model and Megatron overrides.
VLM_SFT = [
    "strategy=megatron", "model.path=Qwen/Qwen3-VL-2B-Instruct", "max_length=4096", "num_steps=30",
    "micro_train_batch_size_per_gpu=1", "remove_microbatch_padding=false", "train_on_what=last_assistant_message",
    "optimizer_config.lr=2e-6", "placement.num_gpus_per_node=4", "megatron_config.tensor_model_parallel_size=1",
    "megatron_config.pipeline_model_parallel_size=1", "megatron_config.context_parallel_size=1",
]
#: a model path for an SFT case that overrides model.lora (SkyRL then builds a fresh ModelConfig, whose path is None,
#: and its validate_sft_cfg refuses "model.path must be set")
SFT_MODEL = "model.path=Qwen/Qwen3-VL-2B-Instruct"
QAT = "fake_int4_qat.enabled=true"
SFT_ALL_FROZEN = [f"megatron_config.transformer_config_kwargs.freeze_{part}=true"
                  for part in ("language_model", "vision_model", "vision_projection")]
PROJECTION_ONLY = [f"{K}.freeze_language_model=true", f"{K}.freeze_vision_model=true"]


@dataclass(frozen=True)
class Case:
    id: str
    layout: str  # "rl" (SkyRLTrainConfig) or "sft" (SFTConfig)
    overrides: tuple[str, ...]
    skyrl_accepts: bool
    check_config_accepts: bool
    dump: bool = False  # over SkyRL's dump of its defaults (tests/fixtures/configs/skyrl)
    #: why the plugin's rule refuses what SkyRL's loader accepts (required where the two disagree)
    differs: str | None = None
    #: what check-config's refusal must say (a regular expression): SkyRL's own words, and what to write instead
    says: str | None = None
    #: a family to build it with, and the parts check-config must say train (the build must train exactly them)
    build: str | None = None
    trains: frozenset[str] = field(default_factory=frozenset)
    routers_frozen: bool = False
    #: the parts check-config says LoRA puts adapters in ("yes"; every other part "no"), checked on the build
    adapters: frozenset[str] | None = None
    #: the plugin's error that the build raises where check-config refuses what SkyRL's loader accepts
    build_refuses: str | None = None


def case(id, layout, overrides, skyrl, ours, **kw) -> pytest.param:
    return pytest.param(Case(id, layout, tuple(overrides), skyrl, ours, **kw), id=id)


ALL = frozenset({"language_model", "vision_model", "vision_projection"})
CASES = [
    case("rl-default-dump", "rl", [], True, True, dump=True),
    case("sft-default-dump", "sft", [], True, True, dump=True),
    case("rl-defaults", "rl", [], True, True),
    case("sft-defaults", "sft", [], True, True),
    case("rl-dump-megatron-freeze-dsa-indexer", "rl", [MEGATRON, f"{P}.freeze_dsa_indexer=true"], True, True,
         dump=True),
    case("rl-geometry3k-30b-a3b-example", "rl", GEOMETRY3K_30B, True, True),
    case("sft-megatron-vlm-example", "sft", VLM_SFT, True, True),
    case("rl-review-key-vision", "rl", [MEGATRON, VLM, f"{P}.freeze_vision_model=true"], False, False,
         says=(r"Invalid fields \{'freeze_vision_model'\} for MegatronConfig.*write trainer\.policy\.megatr"
               r"on_config\.transformer_config_kwargs\.freeze_vision_model")),
    case("rl-review-key-language-model", "rl", [MEGATRON, f"{P}.freeze_language_model=true"], False, False,
         says=(r"Invalid fields \{'freeze_language_model'\} for MegatronConfig.*transformer_config_kwargs\."
               r"freeze_language_model")),
    case("sft-review-key-projection", "sft", ["megatron_config.freeze_vision_projection=true"], False, False,
         says=(r"Invalid fields \{'freeze_vision_projection'\} for MegatronConfig.*write megatron_config\.t"
               r"ransformer_config_kwargs\.freeze_vision_projection")),
    case("rl-review-key-plus-prefix", "rl", [MEGATRON, f"+{P}.freeze_vision_model=true"], False, False,
         says=r"The '\+' prefix for adding new config fields is not supported.*write trainer\.policy"),
    case("sft-kwargs-plus-prefix", "sft", ["+megatron_config.transformer_config_kwargs.freeze_vision_model=true"],
         False, False,
         says=r"Invalid fields \{'\+megatron_config'\} for SFTConfig"),
    case("rl-dump-tilde-prefix", "rl", ["~trainer.seed"], False, False, dump=True,
         says=r"Invalid fields \{'~trainer'\} for SkyRLTrainConfig"),
    case("rl-ref-review-key", "rl", [MEGATRON, "trainer.ref.megatron_config.freeze_vision_model=true"], False, False,
         says=r"Invalid fields \{'freeze_vision_model'\} for MegatronConfig\)\. Remove it: the reference model"),
    case("rl-kwargs-vision-frozen", "rl", [MEGATRON, VLM, f"{K}.freeze_vision_model=true"], True, True,
         build="qwen3_vl", trains=frozenset({"language_model", "vision_projection"})),
    case("rl-kwargs-projection-only", "rl", [MEGATRON, VLM, *PROJECTION_ONLY], True, True,
         build="qwen3_vl", trains=frozenset({"vision_projection"})),
    case("sft-kwargs-projection-only", "sft", ["megatron_config.transformer_config_kwargs.freeze_language_model=true",
                                               "megatron_config.transformer_config_kwargs.freeze_vision_model=true"],
         True, True, build="qwen3_vl", trains=frozenset({"vision_projection"})),
    case("rl-dump-kwargs-projection-only", "rl", [MEGATRON, *PROJECTION_ONLY], True, True, dump=True),
    case("rl-vlm-example-flags-false-build", "rl", [MEGATRON, f"{K}.freeze_language_model=false",
                                                    f"{K}.freeze_vision_model=false"], True, True,
         build="qwen3_vl", trains=ALL),
    case("rl-moe-router-and-vision-frozen", "rl", [MEGATRON, f"{P}.freeze_moe_router=true",
                                                   f"{K}.freeze_vision_model=true"], True, True,
         build="qwen3_vl_moe", trains=frozenset({"language_model", "vision_projection"}), routers_frozen=True),
    case("sft-lora-plain", "sft", [SFT_MODEL, "model.lora.rank=8"], True, True),
    case("sft-lora-next-to-a-full-rank-projection", "sft", [
        SFT_MODEL, "model.lora.rank=4", "model.lora.alpha=8", "model.lora.target_modules=[linear_qkv,linear_proj]",
        "megatron_config.transformer_config_kwargs.freeze_language_model=true",
        "megatron_config.transformer_config_kwargs.freeze_vision_model=true"], True, True,
         build="qwen3_vl", trains=frozenset({"vision_projection"})),
    case("sft-lora-all-parts-frozen", "sft", [SFT_MODEL, "model.lora.rank=8",
                                              "megatron_config.transformer_config_kwargs.freeze_language_model=true",
                                              "megatron_config.transformer_config_kwargs.freeze_vision_model=true",
                                              "megatron_config.transformer_config_kwargs.freeze_vision_projection=true"],
         True, True),
    case("sft-lora-with-frozen-vision", "sft", [SFT_MODEL, "model.lora.rank=8",
                                                "megatron_config.transformer_config_kwargs.freeze_vision_model=true"],
         True, True),
    case("rl-lora-with-a-full-rank-part", "rl", [MEGATRON, "trainer.policy.model.lora.rank=8",
                                                 f"{K}.freeze_vision_model=true"], True, False,
         differs="the RL weight sync moves SkyRL's adapters (or merged weights) only: the full-rank parts next to "
                 "them would never reach the inference engine, which would generate from stale weights",
         says=r"transformer_config_kwargs\.freeze_vision_model=true with LoRA .* in an RL run"),
    # SkyRL's worker hands Bridge's LoRA "all-linear" (its default) as six Megatron leaf names: a part gets adapters
    # where it has modules of those names (Qwen3-VL's Megatron vision tower and merger do; Qwen2.5-VL's HF tower does
    # not; Gemma 3's SigLIP tower has a plain torch.nn.Linear out_proj)
    case("sft-lora-all-linear-everything-frozen", "sft", [SFT_MODEL, "model.lora.rank=8", *SFT_ALL_FROZEN], True,
         True,
         build="qwen3_vl", adapters=ALL),
    case("sft-lora-all-linear-next-to-a-full-rank-projection", "sft",
         [SFT_MODEL, "model.lora.rank=4", *SFT_ALL_FROZEN[:2]],
         True, False, build="qwen3_vl", build_refuses="LoraOverlapError",
         differs="SkyRL's all-linear list names linear_fc1 / linear_fc2, which Qwen3-VL's merger and DeepStack "
                 "mergers have: adapters on the projection it trains at full rank, which the build refuses",
         says=r"'linear_fc1' \(in vision_projection\).*LoraOverlapError"),
    case("sft-lora-all-linear-hf-vision-tower-trains", "sft", [SFT_MODEL, "model.lora.rank=4", SFT_ALL_FROZEN[0]],
         True, True,
         build="qwen25_vl", trains=frozenset({"vision_model", "vision_projection"}),
         adapters=frozenset({"language_model"})),
    case("sft-lora-narrow-list-hf-vision-tower", "sft", [
        SFT_MODEL, "model.lora.rank=4", "model.lora.target_modules=[linear_qkv,linear_proj]", *SFT_ALL_FROZEN[:2]],
         True, True,
         build="qwen25_vl", trains=frozenset({"vision_projection"}), adapters=frozenset({"language_model"})),
    case("sft-lora-narrow-list-megatron-vision-tower", "sft", [
        SFT_MODEL, "model.lora.rank=4", "model.lora.target_modules=[linear_qkv,linear_proj]", *SFT_ALL_FROZEN[:2]],
         True, True,
         build="qwen3_vl", trains=frozenset({"vision_projection"}),
         adapters=frozenset({"language_model", "vision_model"})),
    case("sft-lora-all-linear-siglip-out-proj", "sft", [SFT_MODEL, "model.lora.rank=4", *SFT_ALL_FROZEN], True, False,
         build="gemma3_vl", build_refuses="UnexportableAdapterError",
         differs="SkyRL's all-linear list names out_proj, a plain torch.nn.Linear of Gemma 3's SigLIP tower: Bridge "
                 "wraps it as LinearAdapter, whose training no export carries, and the build refuses it",
         says=r"'out_proj' \(reaches vision_tower\)"),
    # SkyRL's loader rewrites these before its key check (issue 46 item 9): accepted, never refused in its name
    case("rl-legacy-use-sample-packing", "rl", ["trainer.use_sample_packing=true"], True, True),
    case("sft-legacy-use-sample-packing", "sft", ["use_sample_packing=true"], True, True),
    case("rl-legacy-async-engine-true", "rl", ["generator.inference_engine.async_engine=true"], True, True),
    case("rl-dump-legacy-use-sample-packing", "rl", ["trainer.use_sample_packing=false"], True, True, dump=True),
    case("rl-legacy-key-and-its-new-name", "rl", ["trainer.use_sample_packing=true",
                                                  "trainer.remove_microbatch_padding=true"], False, False,
         says=r"Specify only one of trainer\.use_sample_packing \(deprecated\) and trainer\.remove_microbatch_padding"),
    case("rl-legacy-async-engine-false", "rl", ["generator.inference_engine.async_engine=false"], False, False,
         says=r"from_cli_overrides: ValueError: `async_engine=False` is no longer supported"),
    # SkyRL refuses these on their values when it builds its config (issue 46 item 15)
    case("sft-num-epochs-with-num-steps", "sft", ["num_epochs=2", "num_steps=3"], False, False,
         says=r"SkyRL 0\.4\.0 refuses .*Cannot specify both num_epochs and num_steps"),
    case("rl-fake-int4-qat-without-lora", "rl", [MEGATRON, f"trainer.policy.model.{QAT}"], False, False,
         says=r"AssertionError: `trainer\.policy\.model\.fake_int4_qat\.enabled=True` currently requires LoRA"),
    case("sft-fake-int4-qat-without-lora", "sft", [f"model.{QAT}"], False, False,
         says=r"from_dict_config: AssertionError: .*fake_int4_qat\.enabled=True` currently requires LoRA"),
    case("sft-lora-without-model-path", "sft", ["model.lora.rank=8"], False, False,
         says=r"validate_sft_cfg: ValueError: model\.path must be set"),
    case("rl-router-train-pattern-next-to-freeze-moe-router", "rl", [
        MEGATRON, f"{P}.freeze_moe_router=true", *PROJECTION_ONLY, rf"{K}.train_patterns=[.*mlp\.router\..*]"],
         True, False, build="qwen3_vl_moe", build_refuses="FreezeGuaranteeError",
         differs="SkyRL's freeze_moe_router hook runs after the plugin's freeze and freezes the routers the pattern "
                 "trains in the frozen language model: the build refuses the result (issue 46 item 12)",
         says=r"trains the MoE routers .*freeze_moe_router=true freezes those routers.*FreezeGuaranteeError"),
    case("rl-typo-section", "rl", ["trainer.polcy.model.path=x"], False, False,
         says=r"Invalid fields \{'polcy'\} for TrainerConfig\); did you mean trainer\.policy\?"),
    case("rl-typo-megatron-field", "rl", [f"{P}.tensor_model_paralel_size=2"], False, False,
         says=r"did you mean trainer\.policy\.megatron_config\.tensor_model_parallel_size"),
    case("rl-typo-review-key", "rl", [MEGATRON, f"{P}.freeze_vison_model=true"], False, False,
         says=(r"Invalid fields \{'freeze_vison_model'\}.*write trainer\.policy\.megatron_config\.transform"
               r"er_config_kwargs\.freeze_vision_model")),
    case("rl-typo-in-kwargs", "rl", [MEGATRON, f"{K}.freeze_vison_model=true"], True, False,
         differs="transformer_config_kwargs is a free mapping to SkyRL: it would set freeze_vison_model on the "
                 "provider, which nothing reads, and train the vision encoder silently",
         says=(r"transformer_config_kwargs\.freeze_vison_model is not a freeze flag; did you mean trainer\."
               r"policy\.megatron_config\.transformer_config_kwargs\.freeze_vision_model\?")),
    case("rl-wrong-type-flag", "rl", [MEGATRON, f"{K}.freeze_vision_model=maybe"], True, False,
         differs="SkyRL never checks a value's type; the string 'maybe' on the provider is not a boolean flag, which "
                 "the plugin refuses at the build (said here first)",
         says=r"transformer_config_kwargs\.freeze_vision_model must be a boolean"),
    case("rl-wrong-type-skyrl-field", "rl", [f"{P}.tensor_model_parallel_size=two"], True, True),
    case("rl-yes-is-a-boolean", "rl", [MEGATRON, f"{K}.freeze_vision_model=yes"], True, True),
    case("rl-scalar-for-a-section", "rl", [f"{P}=5"], True, False,
         differs="SkyRL keeps 5 in place of its MegatronConfig and fails only when its worker reads a setting of "
                 "it; the flags cannot be read from a scalar",
         says=(r"trainer\.policy\.megatron_config must be a mapping of settings \(it holds trainer\.policy"
               r"\.megatron_config\.transformer_config_kwargs\)")),
    case("rl-kwargs-router-hook", "rl", [MEGATRON, f"{K}.freeze_moe_router=true"], True, False,
         differs="in transformer_config_kwargs SkyRL sets freeze_moe_router on the provider, where nothing reads it: "
                 "the routers would train silently (SkyRL's own field is megatron_config.freeze_moe_router)",
         says=r"is SkyRL's own MegatronConfig field.*Write trainer\.policy\.megatron_config\.freeze_moe_router"),
    case("rl-kwargs-flag-under-fsdp", "rl", [f"{K}.freeze_vision_model=true"], True, False,
         differs="the default strategy is fsdp, which never builds a Megatron provider: the flag would never apply",
         says=(r"transformer_config_kwargs\.freeze_vision_model=true requires strategy=megatron, but traine"
               r"r\.strategy=fsdp")),
    case("rl-kwargs-learning-rate", "rl", [MEGATRON, f"{K}.lr_vision_projection=0.001"], True, False,
         differs="SkyRL builds its optimizer without per-part learning rates: one set on the provider never applies",
         says=r"transformer_config_kwargs\.lr_vision_projection: SkyRL 0\.4\.0 builds its optimizer without"),
    case("rl-ref-kwargs-flag", "rl", [MEGATRON, "trainer.ref.megatron_config.transformer_config_kwargs."
                                                "freeze_vision_model=true"], True, False,
         differs="the reference model never trains: a freeze flag there means nothing (the policy's go under "
                 f"{K})",
         says=(r"trainer\.ref\.megatron_config\.transformer_config_kwargs\.freeze_vision_model=true: the re"
               r"ference model never trains")),
]


# ---- SkyRL's side: its real loader ---------------------------------------------------------------------------


@pytest.fixture
def skyrl_as_released(monkeypatch):
    """SkyRL read from its installed classes (not the origin trainer's reading the other tests pin); SkyRL's
    ``SkyRLTrainConfig.__post_init__`` imports ``orjson`` / ``pybase64`` for its inference client's wire codecs only
    (outside the config path): empty stand-ins where they are not installed."""
    monkeypatch.delenv("BRIDGE_FREEZE_SKYRL_FIELDS", raising=False)
    for name in ("orjson", "pybase64"):
        if importlib.util.find_spec(name) is None:
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))


def skyrl_loads(c: Case) -> bool:
    """SkyRL's loader, and (SFT) the validation its SFT entry point runs first (``build_skyrl_config_for_sft`` ->
    ``validate_sft_cfg``; the RL entry point's ``validate_cfg`` imports Ray, not installed here)."""
    from omegaconf import OmegaConf
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.config.sft_config import SFTConfig, validate_sft_cfg

    cls = SkyRLTrainConfig if c.layout == "rl" else SFTConfig
    try:
        if not c.dump:
            built = cls.from_cli_overrides(list(c.overrides))
        else:  # SkyRL's own objects (its enum) from its own dump, then the overrides as its loader rewrites them
            written = yaml.load(DUMPS[c.layout].read_text(encoding="utf-8"), Loader=yaml.UnsafeLoader)
            handed = {}

            class Handed(cls):
                @classmethod
                def from_dict_config(cls, cfg):
                    handed["cfg"] = cfg

            Handed.from_cli_overrides(list(c.overrides))
            built = cls.from_dict_config(OmegaConf.merge(OmegaConf.create(written), handed["cfg"]))
        if c.layout == "sft":
            validate_sft_cfg(built)
    except (ValueError, TypeError, AttributeError, AssertionError):
        return False
    return True


def parts(found) -> set[str]:
    return {getattr(p, "value", p) for p in found}


def check_config(c: Case, overrides: tuple[str, ...] | None = None):
    """check-config's run of the case (``load_run`` + ``validate``): the run, or the exception it raised."""
    from bridge_freeze_plugin.errors import BridgeFreezeError

    try:
        # a LoRA case names its family (check-config --family): where adapters land depends on its modules
        family = c.build if overrides is None and (c.adapters is not None or c.build_refuses) else None
        run = load_run(DUMPS[c.layout] if c.dump else None, overrides or c.overrides, layout=c.layout,
                       family=family)
        run.validate()
    except BridgeFreezeError as exc:
        return exc
    return run


@pytest.mark.parametrize("c", CASES)
def test_check_config_accepts_what_skyrls_loader_accepts(c, skyrl_as_released):
    assert len(CASES) >= 20
    assert skyrl_loads(c) is c.skyrl_accepts, f"SkyRL 0.4.0's loader {'refused' if c.skyrl_accepts else 'took'} it"
    result = check_config(c)
    assert (not isinstance(result, Exception)) is c.check_config_accepts, result
    if isinstance(result, Exception):
        assert c.says and re.search(c.says, str(result), re.S), result
    else:  # read as SkyRL 0.4.0 reads it, and said so
        assert "checked against the installed skyrl 0.4.0's config classes" in result.loaded.layout_reason
        ran = "SFTConfig.from_dict_config and validate_sft_cfg" if c.layout == "sft" else (
            "SkyRLTrainConfig.from_dict_config; its validate_cfg (skyrl.train.utils.utils, which imports Ray) was not "
            "run")
        assert f"values checked by SkyRL's own {ran}" in result.loaded.layout_reason
        assert "conflicting evidence" not in result.loaded.layout_reason  # its own evidence is no conflict
    assert (c.skyrl_accepts == c.check_config_accepts) is (c.differs is None)
    if c.trains:
        assert parts(result.settings.selection.trained_parts()) == c.trains


def test_the_layout_is_read_as_skyrl_reads_it_from_the_committed_listing(monkeypatch):
    """Without skyrl importable, the committed listing (skyrl 0.4.0) decides: its dumps are valid, the review's key
    is refused naming the transformer_config_kwargs route, SkyRL's freeze_dsa_indexer is no typo."""
    monkeypatch.setenv("BRIDGE_FREEZE_SKYRL_FIELDS", str(LISTING))
    for layout in ("rl", "sft"):
        load_run(DUMPS[layout], layout=layout).validate()
    run = load_run(DUMPS["rl"], [MEGATRON, f"{P}.freeze_dsa_indexer=true", *PROJECTION_ONLY])
    assert parts(run.validate().trained_parts()) == {"vision_projection"}
    assert f"{P}.freeze_dsa_indexer" in {o.key for o in run.settings.sources.own_freeze}
    # SkyRL's own loader cannot run: its rewrites are not applied, and its refusals of values are not checked
    assert run.loaded.layout_reason.endswith(
        "values not checked: SkyRL refuses some values when it builds its config, and skyrl is not importable here "
        "to build it")
    with pytest.raises(InvalidFreezeConfigError, match=r"Invalid fields \{'freeze_vision_model'\} for MegatronConfig.*"
                                        rf"{K}\.freeze_vision_model"):
        load_run(DUMPS["rl"], [MEGATRON, f"{P}.freeze_vision_model=true"])


def test_check_config_prints_no_learning_rate_line_where_skyrl_refuses_per_part_rates(capsys, monkeypatch):
    """Before: a valid SkyRL run's summary said "learning rates (...transformer_config_kwargs): every part on the
    global schedule", a section where SkyRL 0.4.0 refuses every per-part rate; Bridge's layout still says it."""
    from bridge_freeze_plugin.cli import main

    monkeypatch.setenv("BRIDGE_FREEZE_SKYRL_FIELDS", str(LISTING))
    assert main(["check-config", str(DUMPS["rl"]), MEGATRON, f"{K}.freeze_vision_model=true"]) == 0
    out = capsys.readouterr().out
    assert "trains: language_model, vision_projection; frozen: vision_model" in out and "OK: valid" in out
    assert "learning rates (" not in out
    assert main(["check-config", "--layout", "bridge", "model.freeze_vision_model=true"]) == 0
    assert "learning rates (optimizer_config_override_provider): every part on the global schedule" in (
        capsys.readouterr().out)


def test_the_committed_dumps_and_listing_are_what_the_installed_skyrl_writes(skyrl_as_released):
    import importlib.util as iu
    import json

    from bridge_freeze_plugin.config._skyrl_fields import from_installed

    spec = iu.spec_from_file_location("write_skyrl_dumps", FIXTURES / "write_skyrl_dumps.py")
    writer = iu.module_from_spec(spec)
    spec.loader.exec_module(writer)
    assert writer.dumps() == {k: p.read_text(encoding="utf-8") for k, p in DUMPS.items()}
    installed, why = from_installed()
    assert installed is not None, why
    committed = json.loads(LISTING.read_text(encoding="utf-8"))
    assert {k: v for k, v in committed.items() if k != "generated_by"} == installed.as_json()


# ---- the build: SkyRL 0.4.0's provider calls, in its order, on the harness's tiny models ------------------------


#: SkyRL 0.4.0's MegatronWorker.configure_lora, lora_type "lora": what it gives Bridge's LoRA for "all-linear".
SKYRL_ALL_LINEAR = ["linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "in_proj", "out_proj"]


class SkyRLLoRAHolder:
    """SkyRL 0.4.0's MegatronWorker as its LoRA pre-wrap hook sees it (``configure_lora`` for ``lora_type="lora"``:
    ``"all-linear"`` as its six leaf names, less ``in_proj`` where SkyRL's own ``gdn_in_proj_lora_is_safe`` says so;
    ``make_megatron_module``'s closure over ``self``): the worker does not import here."""

    def __init__(self, lora, bridge) -> None:
        import torch
        from megatron.bridge.peft.lora import LoRA
        from skyrl.backends.skyrl_train.distributed.megatron.megatron_utils import gdn_in_proj_lora_is_safe

        targets = lora.target_modules
        if targets == "all-linear":
            targets = [t for t in SKYRL_ALL_LINEAR if t != "in_proj" or gdn_in_proj_lora_is_safe(bridge)]
        self.lora_cls = LoRA(target_modules=list(targets), dim=lora.rank, alpha=lora.alpha,
                             dropout=lora.dropout, lora_A_init_method=lora.init_method, lora_B_init_method="zero",
                             exclude_modules=list(lora.exclude_modules or []), lora_dtype=torch.float32,
                             share_expert_adapters=lora.share_expert_adapters)

    def hook(self):
        def lora_pre_wrap_hook(model):
            lora_model = self.lora_cls(model, training=True)
            self.lora_cls.set_params_to_save(lora_model)
            return lora_model

        return lora_pre_wrap_hook


def skyrl_build(checkpoint: Path, family: str, megatron_config, lora) -> list:
    """``init_configs`` -> ``make_megatron_module`` of SkyRL 0.4.0's MegatronWorker: the provider calls in its order
    (CPU settings first, where SkyRL sets the parallel sizes and MoE fields; no DDP, float32: the CPU harness)."""
    from megatron.bridge import AutoBridge
    from skyrl.backends.skyrl_train.distributed.megatron.megatron_utils import freeze_dsa_indexer, freeze_moe_router

    from bridge_freeze_harness.hf_checkpoint import build_hf_chunks, cpu_provider

    bridge = AutoBridge.from_hf_pretrained(str(checkpoint))
    # cpu_provider: to_megatron_provider() -> setattr(provider, k, v) for each item given, in order -> finalize()
    provider = cpu_provider(bridge, family, load_weights=False, **dict(megatron_config.transformer_config_kwargs))
    if megatron_config.freeze_moe_router:
        provider.register_pre_wrap_hook(freeze_moe_router)
    if megatron_config.freeze_dsa_indexer:
        provider.register_pre_wrap_hook(freeze_dsa_indexer)
    if lora.rank > 0:
        provider.register_pre_wrap_hook(SkyRLLoRAHolder(lora, bridge).hook())
    return build_hf_chunks(family, provider)


def _with_checkpoint(c: Case, tmp_path: Path) -> tuple[Path, tuple[str, ...]]:
    from bridge_freeze_harness.hf_checkpoint import write_tiny_hf_checkpoint

    checkpoint = write_tiny_hf_checkpoint(c.build, tmp_path / "hf")
    path_key = "trainer.policy.model.path" if c.layout == "rl" else "model.path"
    return checkpoint, (*[o for o in c.overrides if not o.startswith(path_key)], f"{path_key}={checkpoint}")


def _skyrl_policy(c: Case, overrides: tuple[str, ...]):
    from skyrl.train.config import SkyRLTrainConfig
    from skyrl.train.config.sft_config import SFTConfig

    cfg = (SkyRLTrainConfig if c.layout == "rl" else SFTConfig).from_cli_overrides(list(overrides))
    return cfg.trainer.policy if c.layout == "rl" else cfg


@pytest.mark.parametrize("c", [p for p in CASES if p.values[0].build and not p.values[0].build_refuses])
def test_the_predicted_selection_is_what_the_plugin_builds(c, cpu_bridge, skyrl_as_released, tmp_path):
    from bridge_freeze_plugin.config import lora_adapter_parts

    checkpoint, overrides = _with_checkpoint(c, tmp_path)
    run = check_config(c, overrides)
    assert not isinstance(run, Exception), run
    predicted = parts(run.settings.selection.trained_parts())
    assert predicted == c.trains and run.settings.family is not None and run.settings.family.name == c.build
    said = lora_adapter_parts(run.settings.lora, run.settings.family)
    if c.adapters is not None:
        assert said == {part: "yes" if part in c.adapters else "no" for part in parts_of(c.build)}
    policy = _skyrl_policy(c, overrides)
    chunks = skyrl_build(checkpoint, c.build, policy.megatron_config, policy.model.lora)
    every = names(chunks)
    expected = {n for n in every if part_of(c.build, n) in predicted}
    if policy.model.lora.rank > 0:  # the parts predicted train at full rank, next to every adapter
        adapters = {n for n in every if ".adapter." in n}
        expected |= adapters
        if c.adapters is not None:  # adapters in exactly the parts check-config said
            assert {part_of(c.build, n) for n in adapters} == c.adapters
    if c.routers_frozen:
        expected -= {n for n in every if n.startswith("language_model.") and ".mlp.router." in n}
    assert expected and trainable(chunks) == expected


@pytest.mark.parametrize("c", [p for p in CASES if p.values[0].build_refuses])
def test_what_check_config_refuses_for_lora_the_build_refuses(c, cpu_bridge, skyrl_as_released, tmp_path):
    """Where check-config refuses a LoRA target list (or a router train pattern next to SkyRL's freeze_moe_router)
    SkyRL's loader takes, the plugin's build (through SkyRL's provider calls, its all-linear mapping and its router
    hook included) refuses it too, before training, with the error check-config names."""
    from bridge_freeze_plugin import errors

    checkpoint, overrides = _with_checkpoint(c, tmp_path)
    refused = check_config(c, overrides)
    assert isinstance(refused, Exception) and re.search(c.says, str(refused), re.S), refused
    policy = _skyrl_policy(c, overrides)
    with pytest.raises(getattr(errors, c.build_refuses)):
        skyrl_build(checkpoint, c.build, policy.megatron_config, policy.model.lora)


def test_an_enum_tag_is_read_only_as_a_member_of_a_skyrl_enum(tmp_path, monkeypatch):
    """SkyRL's dump writes TrainOnWhat as a Python tag over its value: read as the value (the committed listing knows
    the enum and its members); a value that is no member, or a tag naming anything else, is refused, never built."""
    monkeypatch.setenv("BRIDGE_FREEZE_SKYRL_FIELDS", str(LISTING))
    text = DUMPS["sft"].read_text(encoding="utf-8")
    assert "train_on_what: !!python/object/apply:skyrl.train.config.sft_config.TrainOnWhat" in text
    assert load_run(DUMPS["sft"], layout="sft").loaded.cfg.train_on_what == "last_assistant_message"
    for bad in ("- no_such_value", "- all_assistant_messages\n- extra"):
        path = tmp_path / "sft.yaml"
        path.write_text(text.replace("- last_assistant_message", bad), encoding="utf-8")
        with pytest.raises(ConfigLoadError, match=r"is not valid YAML.*read only as a value of an enum of SkyRL"):
            load_run(path, layout="sft")
