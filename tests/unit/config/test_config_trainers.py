"""check-config for the other trainers and for Bridge's own files (issues 27 and 28).

Bridge's own ``freeze_*`` provider fields and the trainers' router freeze (read, said, never refused as
misspellings); Bridge's PEFT ``run_config.yaml`` as Bridge writes it (``!!set``); a forced layout never reads a
foreign config silently; LoRA in the summary (plain LoRA, adapters next to full-rank parts, ``VLMLoRA``'s own
switches); NeMo-RL's GRPO / SFT configs (its published examples, composed as NeMo-RL composes them).

Expected values are written here by hand from the trainers' and Bridge's code (cited next to each), or read from
Bridge's installed source with ``ast`` (no plugin code): never computed by the code under test.
"""

from __future__ import annotations

import ast
import functools
import json
from pathlib import Path

import megatron  # a namespace package: where Bridge's installed source is (nothing imported)
import pytest
import yaml

import bridge_freeze_plugin as bfp
from bridge_freeze_plugin import FreezeSelection, InvalidFreezeConfigError
from bridge_freeze_plugin.cli import main
from bridge_freeze_plugin.config._validation import load_run

CONFIGS = Path(__file__).parents[2] / "fixtures" / "configs"
SFT_FILE = CONFIGS / "sft" / "sft_defaults.yaml"
RL_FILE = CONFIGS / "rl_dataclass" / "rl_defaults.yaml"
BRIDGE_FILE = CONFIGS / "bridge" / "run_config.yaml"
POLICY = "trainer.policy.megatron_config"
VISION = FreezeSelection(freeze_vision_model=True)
BRIDGE_SOURCE = Path(next(iter(megatron.__path__))) / "bridge"


def check(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["check-config", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def check_json(capsys, *args: str) -> dict:
    code, out, err = check(capsys, "--json", *args)
    doc = json.loads(out)
    assert (code == 0) == doc["valid"], (code, err)
    return doc


@functools.cache
def _provider_classes() -> tuple[ast.ClassDef, ...]:
    """The classes of Bridge's installed ``*_provider.py`` sources (ast), parsed once per session, not per call."""
    return tuple(node for path in (BRIDGE_SOURCE / "models").rglob("*_provider.py")
                 for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef))


def declared_freeze_fields() -> dict[str, set[str]]:
    """``freeze_*`` field name -> the classes of Bridge's installed source that declare it (read with ast)."""
    found: dict[str, set[str]] = {}
    for node in _provider_classes():
        for statement in node.body:
            if (isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
                    and statement.target.id.startswith("freeze_")):
                found.setdefault(statement.target.id, set()).add(node.name)
    return found


def provider_lineage(name: str) -> set[str]:
    """``name`` and the classes it derives from, as Bridge's installed ``*_provider.py`` sources write them (ast;
    0.7.0 declares Nemotron Omni's sound fields on ``_NemotronOmniModelProviderBase``, a base of the provider)."""
    bases: dict[str, set[str]] = {}
    for node in _provider_classes():
        bases.setdefault(node.name, set()).update(b.id for b in node.bases if isinstance(b, ast.Name))
    lineage, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in lineage:
            lineage.add(current)
            todo.extend(bases.get(current, ()))
    return lineage


# ---- issue 28 item 3: Bridge's own freeze fields, and the trainers' router freeze -----------------------------

#: Bridge 0.6.2's own provider fields that freeze modules outside every part (MTP, MIMO's modality parts).
BRIDGE_OWN = ("freeze_mtp_model", "freeze_modality_encoders", "freeze_modality_projections")
#: Bridge's provider fields that ARE the flags: the vision-language three and the audio two, and Bridge's other
#: names of the audio ones (Nemotron Omni's sound encoder / projection), written here from Bridge's source.
FLAG_FIELDS = ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection", "freeze_audio_model",
               "freeze_audio_projection")
ALIAS_FIELDS = {"freeze_sound_encoder": "freeze_audio_model", "freeze_sound_projection": "freeze_audio_projection"}


def test_bridges_own_fields_are_fields_of_its_providers_and_the_flags_are_too():
    """The names the Bridge layout accepts are real provider fields (Bridge's source, not the plugin's table)."""
    declared = declared_freeze_fields()
    assert set(BRIDGE_OWN) | set(FLAG_FIELDS) | set(ALIAS_FIELDS) == set(declared)
    assert "Qwen2AudioModelProvider" in declared["freeze_audio_projection"]
    # declared on NemotronOmniModelProvider (0.6.x) or on a base it derives from (0.7.0:
    # _NemotronOmniModelProviderBase, which the legacy LLaVA provider shares)
    for alias in ALIAS_FIELDS:
        assert len(declared[alias]) == 1 and declared[alias] <= provider_lineage("NemotronOmniModelProvider"), alias


@pytest.mark.parametrize("field", BRIDGE_OWN)
def test_bridges_own_freeze_field_is_accepted_and_said_never_a_misspelling(capsys, field):
    """Before: model.freeze_audio_model=True was refused as a misspelling of freeze_vision_model."""
    doc = check_json(capsys, BRIDGE_FILE, f"model.{field}=True", "model.freeze_vision_model=True")
    assert doc["valid"], doc["error"]
    assert doc["selection"] == {"freeze_language_model": False, "freeze_vision_model": True,
                                "freeze_vision_projection": False}
    assert [(own["key"], own["value"], own["applied_by"], own["outside_parts"]) for own in doc["own_freeze"]] == [
        (f"model.{field}", True, "Bridge", True)]
    code, out, _ = check(capsys, BRIDGE_FILE, f"model.{field}=True")
    assert code == 0 and "did you mean" not in out
    assert f"Bridge's own: model.{field}=true" in out and "applied by Bridge, not by the plugin" in out


@pytest.mark.parametrize(("alias", "flag"), sorted(ALIAS_FIELDS.items()))
def test_bridges_name_of_an_audio_flag_is_read_as_that_flag(alias, flag):
    """freeze_sound_encoder is Nemotron Omni's field for the audio encoder: the plugin's freeze_audio_model."""
    selection = load_run(BRIDGE_FILE, [f"model.{alias}=true"], family="nemotron_omni").validate()
    assert selection == FreezeSelection(**{flag: True})
    assert load_run(BRIDGE_FILE, [f"model.{alias}=true", f"model.{flag}=true"],
                    family="nemotron_omni").validate() == FreezeSelection(**{flag: True})
    # Written by hand in a trainer's section, the two disagreeing are refused (write one of them); in Bridge's
    # run_config.yaml (every field saved) they are read as the build reads the provider (issue 37 item 7).
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(SFT_FILE, [f"+megatron_config.{alias}=true", f"megatron_config.{flag}=false"],
                 family="nemotron_omni").validate()
    assert f"megatron_config.{alias}=true and megatron_config.{flag}=false disagree" in str(err.value)


@pytest.mark.parametrize("value", ["1", "0", "null", "'yes'"])
@pytest.mark.parametrize(("path", "section"), [(BRIDGE_FILE, "model"), (SFT_FILE, "megatron_config"),
                                               (RL_FILE, POLICY)])
@pytest.mark.parametrize("alias", sorted(ALIAS_FIELDS))
def test_bridges_name_of_an_audio_flag_that_is_not_a_boolean_is_refused(alias, path, section, value):
    """Issue 37 item 4, check-config's side: an alias is a flag, so a non-boolean is refused like the flags."""
    extra = ["trainer.strategy=megatron"] if path == RL_FILE else []
    with pytest.raises(bfp.FreezeFlagTypeError) as err:
        load_run(path, [f"{section}.{alias}={value}", *extra], family="nemotron_omni").validate()
    assert f"{section}.{alias} must be a boolean (true or false)" in str(err.value)


@pytest.mark.parametrize(("path", "section"), [(SFT_FILE, "megatron_config"), (RL_FILE, POLICY)])
def test_an_audio_flag_is_a_flag_in_every_trainers_section_and_refused_on_a_model_without_audio(path, section):
    """The audio flags live where the other flags live; a VLM without an audio side refuses one set true."""
    extra = ["trainer.strategy=megatron"] if path == RL_FILE else []
    with pytest.raises(bfp.PartNotInFamilyError) as err:
        load_run(path, [f"{section}.freeze_audio_model=true", *extra], family="qwen3_vl").validate()
    message = str(err.value)
    assert f"{section}.freeze_audio_model=true" in message and "qwen3_vl" in message and "no audio encoder" in message
    assert load_run(path, [f"{section}.freeze_audio_model=false", *extra],
                    family="qwen3_vl").validate() == FreezeSelection()


@pytest.mark.parametrize(("field", "instead"), [
    ("freeze_sound_model", "model.freeze_sound_encoder"),     # an argument of the Omni model's freeze(), no field
    ("freeze_moe_router", "train_utils.freeze_moe_router"),   # Bridge's router freeze is a function (a hook)
])
def test_a_name_that_is_no_bridge_field_is_refused_with_what_bridge_has(field, instead):
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(BRIDGE_FILE, [f"model.{field}=true"]).validate()
    message = str(err.value)
    assert f"model.{field} is no field of Bridge's providers" in message and instead in message
    assert "did you mean" not in message


@pytest.mark.parametrize(("path", "section"), [(SFT_FILE, "megatron_config"), (RL_FILE, POLICY)])
def test_a_bridge_field_in_a_trainers_section_is_refused_as_what_it_is(path, section):
    """Not "did you mean freeze_vision_model" (that advice freezes the wrong part)."""
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(path, [f"{section}.freeze_mtp_model=true"]).validate()
    message = str(err.value)
    assert f"{section}.freeze_mtp_model is Bridge's own provider field (the multi-token-prediction layers" in message
    assert "model.freeze_mtp_model" in message and "did you mean" not in message


@pytest.mark.parametrize(("path", "section", "extra"), [
    (SFT_FILE, "megatron_config", []),
    (RL_FILE, POLICY, ["trainer.strategy=megatron"]),
])
def test_the_router_freeze_with_flags_is_valid_and_said_inside_the_language_model(capsys, path, section, extra):
    """Issue 28 item 2 on the config side: the build accepts the trainer's router hook next to the flags (it
    freezes mlp.router.weight inside the trained LM and is reported per part), so check-config agrees."""
    overrides = [*extra, f"{section}.freeze_moe_router=true", f"{section}.freeze_vision_model=true"]
    doc = check_json(capsys, path, *overrides)
    assert doc["valid"], doc["error"]
    assert doc["trained_parts"] == ["language_model", "vision_projection"]
    assert [(own["key"], own["narrows"], own["applied_by"]) for own in doc["own_freeze"]] == [
        (f"{section}.freeze_moe_router", "language_model", "the trainer")]
    _, out, _ = check(capsys, path, *overrides)
    assert f"narrowed: {section}.freeze_moe_router=true freezes the MoE routers" in out
    assert "inside the language_model, which trains" in out
    # the LM frozen by its flag: nothing is narrowed (the routers are frozen with it)
    _, out, _ = check(capsys, path, *overrides, f"{section}.freeze_language_model=true")
    assert "narrowed:" not in out and "inside the language_model, which does not train at full rank" in out


# ---- issue 28 item 4: Bridge's PEFT run_config.yaml, as Bridge writes it -------------------------------------

PEFT_FILE = CONFIGS / "bridge" / "run_config_peft.yaml"
WRITER = CONFIGS / "bridge" / "write_peft_run_config.py"


def test_bridges_peft_run_config_is_read_with_its_set_of_saved_names(capsys):
    """Before: "'set' is not a supported primitive type" on every Bridge PEFT run_config.yaml. The fixture is
    Bridge's own writer's output (write_peft_run_config.py): LoRA on the LM's linear_qkv, the LM flag set."""
    text = PEFT_FILE.read_text(encoding="utf-8")
    assert "params_to_save: !!set" in text
    # Bridge reads it back with yaml.safe_load (checkpoint_utils.read_run_config): a set of parameter names
    written = yaml.safe_load(text)["peft"]["params_to_save"]
    assert isinstance(written, set) and written
    adapters = {name for name in written if ".adapter." in name}
    assert adapters == {f"language_model.decoder.layers.{i}.self_attention.linear_qkv.adapter.linear_{io}.weight"
                        for i in (0, 1) for io in ("in", "out")}
    assert all(name.startswith("vision_model.") for name in written - adapters)  # the full-rank parts

    run = load_run(PEFT_FILE)
    assert run.layout.name == "bridge" and run.validate() == FreezeSelection(freeze_language_model=True)
    assert run.settings.lora.rank == 4 and run.settings.lora.target_modules == ("language_model.*linear_qkv",)
    assert list(run.loaded.cfg.peft.params_to_save) == sorted(written)  # the set, as its sorted list
    doc = check_json(capsys, PEFT_FILE)
    assert doc["valid"] and doc["family"] == "qwen3_vl", doc["error"]


def test_a_python_tag_is_never_constructed(tmp_path, capsys):
    """The loader is YAML's safe one (OmegaConf's): a !!python tag is a config error, and nothing runs."""
    marker = tmp_path / "ran"
    path = tmp_path / "run_config.yaml"
    path.write_text(f"model:\n  _target_: x.Y\n  hook: !!python/object/apply:os.system ['touch {marker}']\n")
    code, _, err = check(capsys, path)
    assert code == 2 and "is not valid YAML" in err and not marker.exists()


def _leaves(doc: object, prefix: str = "") -> dict[str, object]:
    """A YAML document's leaves by dotted key path."""
    if not isinstance(doc, dict):
        return {prefix: doc}
    return {key: value for name, child in doc.items()
            for key, value in _leaves(child, f"{prefix}.{name}" if prefix else str(name)).items()}


def test_the_fixture_is_what_bridge_writes_today(cpu_bridge, tmp_path, capsys):
    """Bridge's writer run now (tiny Qwen3-VL built on the CPU, Bridge's PEFT step, ConfigContainer.to_yaml)
    gives the committed fixture byte for byte where its config classes have the fixture's fields, every value the
    same where they have others (the lane's Bridge), and check-config reads it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("write_peft_run_config", WRITER)
    writer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(writer)
    path = tmp_path / "run_config.yaml"
    names = writer.write(path)
    written, committed = path.read_text(encoding="utf-8"), PEFT_FILE.read_text(encoding="utf-8")
    ours, theirs = _leaves(yaml.safe_load(written)), _leaves(yaml.safe_load(committed))
    if ours.keys() == theirs.keys():  # the config classes the fixture was written with (Bridge 0.6.2's)
        assert written == committed
    else:  # another Bridge / megatron-core adds or drops config fields (0.7.0: 5 more, 2 gone); the rest is equal
        shared = ours.keys() & theirs.keys()
        assert {k: ours[k] for k in shared} == {k: theirs[k] for k in shared}
        assert "peft.params_to_save" in shared and "model._target_" in shared
    assert list(load_run(path).loaded.cfg.peft.params_to_save) == sorted(names)
    code, out, _ = check(capsys, path)
    assert code == 0 and "OK: valid" in out


# ---- issue 28 item 5: a forced layout never silently reads a foreign config ---------------------------------

#: A NeMo-RL policy section without its algorithm section (only a hint of the NeMo-RL layout).
NEMO_RL_POLICY = {"policy": {"model_name": "Qwen/Qwen2.5-VL-3B-Instruct",
                             "megatron_cfg": {"enabled": True, "freeze_moe_router": True,
                                              "freeze_vision_model": True}}}


def write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


TITLES = {"rl": "RL", "sft": "SFT", "bridge": "Megatron-Bridge ConfigContainer"}


@pytest.mark.parametrize("forced", ["rl", "sft", "bridge"])
def test_a_foreign_config_forced_to_a_layout_is_refused_naming_every_freeze_key(tmp_path, capsys, forced):
    """Before: forced to --layout rl, a NeMo-RL file read as "OK: valid, frozen: nothing"."""
    path = write(tmp_path / "policy.yaml", NEMO_RL_POLICY)
    code, out, err = check(capsys, path, "--layout", forced)
    assert code == 2 and "OK: valid" not in out
    assert "never reads a foreign config silently" in err and "policy.megatron_cfg.freeze_moe_router=true" in err
    # without it, the plugin's own flag there is refused where it stands, naming its home in that layout
    code, _, err = check(capsys, path, "--layout", forced, "~policy.megatron_cfg.freeze_moe_router")
    assert code == 2 and f"policy.megatron_cfg.freeze_vision_model is not read in the {TITLES[forced]} layout" in err


def test_a_whole_nemo_rl_file_forced_to_the_rl_layout_is_refused_by_its_deciding_keys(tmp_path, capsys):
    path = write(tmp_path / "grpo.yaml", {**NEMO_RL_POLICY, "grpo": {"num_prompts_per_step": 8}})
    code, _, err = check(capsys, path, "--layout", "rl")
    assert code == 2 and "written in the NeMo-RL layout" in err and "not the RL layout asked for" in err


def test_a_forced_layout_that_reads_every_freeze_key_is_accepted(capsys):
    doc = check_json(capsys, SFT_FILE, "--layout", "sft", "megatron_config.freeze_moe_router=true",
                     "megatron_config.freeze_vision_model=true")
    assert doc["valid"] and doc["unread_freeze_keys"] == [] and doc["layout_reason"].startswith("forced")


def test_a_detected_layout_reports_each_freeze_key_it_does_not_read(capsys):
    stray = ["+data.freeze_vision_tower=true", "+trainer.critic.freeze_moe_router=false"]
    doc = check_json(capsys, RL_FILE, *stray)
    assert doc["valid"], doc["error"]
    assert doc["unread_freeze_keys"] == ["data.freeze_vision_tower=true", "trainer.critic.freeze_moe_router=false"]
    _, out, _ = check(capsys, RL_FILE, *stray)
    assert "not read: data.freeze_vision_tower=true (no setting of the RL layout" in out
    # forced, the same keys are an error
    code, _, err = check(capsys, RL_FILE, "--rl", *stray)
    assert code == 2 and "data.freeze_vision_tower=true, trainer.critic.freeze_moe_router=false" in err


# ---- issue 28 item 6: the summary reflects LoRA; VLMLoRA's own switches read or refused -----------------------

QWEN3 = "megatron.bridge.models.qwen_vl.qwen3_vl_provider.Qwen3VLModelProvider"
NEMOTRON_VL = "megatron.bridge.models.nemotron_vl.nemotron_vl_provider.NemotronVLModelProvider"
VLM_LORA = ["+peft._target_=megatron.bridge.peft.lora.VLMLoRA", "+peft.dim=4"]
PARTS = ["language_model", "vision_model", "vision_projection"]


def test_plain_lora_trains_adapters_only_and_says_so(capsys):
    """Before: "trains: language_model, vision_model, vision_projection; frozen: nothing" with model.lora.rank=16."""
    doc = check_json(capsys, SFT_FILE, "model.lora.rank=16")
    assert doc["valid"], doc["error"]
    assert doc["trained_parts"] == [] and doc["frozen_parts"] == PARTS
    assert doc["lora"]["rank"] == 16 and doc["lora"]["decided_by"].startswith("LoRA alone (no flag)")
    _, out, _ = check(capsys, SFT_FILE, "model.lora.rank=16")
    assert "trains: LoRA adapters only (where target_modules reach); frozen: language_model, vision_model, " \
           "vision_projection (base weights)" in out


def test_lora_with_flags_says_adapters_per_part_and_the_full_rank_parts(capsys):
    overrides = ["model.lora.rank=8", "model.lora.target_modules=[language_model.*linear_qkv]",
                 "megatron_config.freeze_language_model=true", "--family", "qwen3_vl"]
    doc = check_json(capsys, SFT_FILE, *overrides)
    assert doc["valid"], doc["error"]
    assert doc["trained_parts"] == ["vision_model", "vision_projection"] and doc["frozen_parts"] == ["language_model"]
    assert doc["lora"]["adapters"] == {"language_model": "yes", "vision_model": "no", "vision_projection": "no"}
    _, out, _ = check(capsys, SFT_FILE, *overrides)
    assert "trains: vision_model, vision_projection at full rank, and LoRA adapters" in out
    assert "adapters in language_model: yes; vision_model: no; vision_projection: no" in out


def test_bridges_peft_file_summary_agrees_with_what_bridge_saved(capsys):
    """The Bridge-written PEFT file: adapters in the LM only, the vision parts at full rank (what params_to_save
    holds: test_bridges_peft_run_config_is_read_with_its_set_of_saved_names)."""
    doc = check_json(capsys, PEFT_FILE)
    assert doc["trained_parts"] == ["vision_model", "vision_projection"] and doc["frozen_parts"] == ["language_model"]
    assert doc["lora"]["adapters"] == {"language_model": "yes", "vision_model": "no", "vision_projection": "no"}


def test_empty_lora_targets_next_to_a_full_rank_part_are_refused():
    """Bridge's LoRA with target_modules=[] wraps every linear module: the full-rank LM would get adapters."""
    with pytest.raises(InvalidFreezeConfigError, match=r"peft\.target_modules=\[\] .*language_model"):
        load_run(BRIDGE_FILE, ["+peft._target_=megatron.bridge.peft.lora.LoRA", "+peft.dim=4",
                               "+peft.target_modules=[]", "model.freeze_vision_model=True"]).validate()


def test_a_freeze_switch_on_plain_lora_is_refused_naming_the_flag():
    """Bridge's LoRA has no such field (only VLMLoRA does): the run would drop it."""
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(BRIDGE_FILE, ["+peft._target_=megatron.bridge.peft.lora.LoRA", "+peft.dim=4",
                               "+peft.freeze_vision_model=true"]).validate()
    assert "peft.freeze_vision_model is not read" in str(err.value) and "model.freeze_vision_model" in str(err.value)


@pytest.mark.parametrize(("target", "switches", "trained", "frozen"), [
    # Nemotron-VL: the LLaVA layout (llava_model.vision_model / vision_projection / language_model): one switch
    # per part (VLMLoRA.freeze_model unwraps llava_model)
    (NEMOTRON_VL, {"freeze_vision_model": False}, ["vision_model"], ["language_model", "vision_projection"]),
    (NEMOTRON_VL, {}, [], PARTS),
    # Qwen3-VL: no vision_projection attribute; vision_model holds the projection (its merger) too
    (QWEN3, {"freeze_vision_projection": False, "freeze_vision_model": False}, ["vision_model", "vision_projection"],
     ["language_model"]),
    (QWEN3, {"freeze_vision_projection": False}, [], PARTS),
])
def test_vlm_loras_switches_are_read_without_flags(capsys, target, switches, trained, frozen):
    overrides = [f"model._target_={target}", *VLM_LORA, *(f"+peft.{k}={str(v).lower()}" for k, v in switches.items())]
    doc = check_json(capsys, BRIDGE_FILE, *overrides)
    assert doc["valid"], doc["error"]
    assert doc["trained_parts"] == trained and doc["frozen_parts"] == frozen
    assert doc["lora"]["switches"] == {"freeze_language_model": True, "freeze_vision_model": True,
                                       "freeze_vision_projection": True, **switches}


def test_vlm_lora_on_a_model_without_its_module_is_refused_as_bridge_would_fail():
    with pytest.raises(InvalidFreezeConfigError, match=r"peft\.freeze_vision_projection=true: VLMLoRA freezes "
                                                       r"model\.vision_projection, which the qwen3_vl model"):
        load_run(BRIDGE_FILE, VLM_LORA).validate()


def test_vlm_lora_switches_that_the_flags_would_overrule_are_refused():
    overrides = [*VLM_LORA, "+peft.freeze_vision_projection=false", "model.freeze_vision_model=True",
                 "model.freeze_language_model=True"]
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(BRIDGE_FILE, overrides).validate()
    assert "would be overruled where they differ (vision_projection: model.freeze_vision_projection=false, " \
           "VLMLoRA freezes it)" in str(err.value)
    # agreeing: accepted
    agreeing = [*VLM_LORA, "+peft.freeze_vision_projection=false", "+peft.freeze_vision_model=false",
                "model.freeze_language_model=True"]
    assert load_run(BRIDGE_FILE, agreeing).validate() == FreezeSelection(freeze_language_model=True)


def test_what_check_config_says_of_vlm_lora_is_what_bridge_builds(cpu_bridge, capsys):
    """Real builds (tiny Qwen3-VL, Bridge's VLMLoRA applied by Bridge's PEFT step): the parts whose base weights
    train are the ones check-config names, and the refused default fails as it says."""
    import functools

    from megatron.bridge.peft.lora import VLMLoRA
    from megatron.bridge.training.setup import _apply_peft_transformation

    from bridge_freeze_harness.tiny import build_tiny_chunks, make_provider
    from bridge_freeze_plugin import make_freezable

    def trained_bases(selection, **switches):
        provider = make_freezable(make_provider("qwen3_vl"), selection)
        peft = VLMLoRA(target_modules=["language_model.*linear_qkv"], dim=4, alpha=8, **switches)
        provider.register_pre_wrap_hook(functools.partial(_apply_peft_transformation, peft))
        chunks = build_tiny_chunks("qwen3_vl", provider)
        names = {n for chunk in chunks for n, p in chunk.named_parameters() if p.requires_grad and ".adapter." not in n}
        return {"vision_projection" if ".merger" in n else n.split(".")[0] for n in names}

    with pytest.raises(AttributeError, match="vision_projection"):
        trained_bases(FreezeSelection())
    for selection, switches, flags in [
        (FreezeSelection(), {"freeze_vision_projection": False}, []),
        (FreezeSelection(), {"freeze_vision_projection": False, "freeze_vision_model": False}, []),
        (FreezeSelection(freeze_language_model=True), {"freeze_vision_projection": False,
                                                       "freeze_vision_model": False},
         ["model.freeze_language_model=True"]),
    ]:
        capsys.readouterr()  # what the last build printed
        doc = check_json(capsys, BRIDGE_FILE, *VLM_LORA, *(f"+peft.{k}=false" for k in switches), *flags)
        assert doc["valid"], doc["error"]
        assert trained_bases(selection, **switches) == set(doc["trained_parts"]), switches


# ---- issue 27: NeMo-RL's configs (its published examples, composed by its own loader for comparison) ----------

NEMO_RL_DIR = CONFIGS / "nemo_rl"
BY_NEMO_RL = json.loads((NEMO_RL_DIR / "composed_by_nemo_rl.json").read_text(encoding="utf-8"))
GRPO_MEGATRON = "examples/configs/vlm_grpo_3B_megatron.yaml"
SFT_VLM = "examples/configs/sft_vlm_3B.yaml"
OMNI = "examples/configs/recipes/vlm/vlm_grpo-nemotron-omni-30ba3b-16n8g-megatron-tp4ep4-async-gym-video.v1.yaml"
QWEN35 = "examples/configs/recipes/vlm/vlm_grpo-qwen3.5-35ba3b-geo3k-2n8g-megatron-ep16.yaml"
CLEVR = "examples/configs/recipes/vlm/vlm_grpo-qwen2.5-vl-3b-instruct-clevr-1n4g-megatrontp1.v1.yaml"
MCFG = "policy.megatron_cfg"
MO = "policy.megatron_cfg.model_overrides"
ALL_TRAIN = {"freeze_language_model": False, "freeze_vision_model": False, "freeze_vision_projection": False}

#: What each example says, read by hand from the files (and their defaults chains): backend, model family (a guess
#: from policy.model_name: no local checkpoint), the flags, what trains, the router freeze (NeMo-RL's hook).
EXAMPLES = {
    GRPO_MEGATRON: ("megatron", "qwen25_vl", ALL_TRAIN, PARTS, True),
    "examples/configs/vlm_grpo_3B.yaml": ("dtensor", "qwen25_vl", ALL_TRAIN, PARTS, True),
    SFT_VLM: ("dtensor", "qwen25_vl", ALL_TRAIN, PARTS, False),
    CLEVR: ("megatron", "qwen25_vl", ALL_TRAIN, PARTS, True),
    QWEN35: ("megatron", "qwen35_vl", ALL_TRAIN, PARTS, True),
    # Nemotron Omni also has a sound encoder and projection: the example freezes neither, so both train.
    OMNI: ("megatron", "nemotron_omni", {**ALL_TRAIN, "freeze_vision_model": True, "freeze_vision_projection": True,
                                          "freeze_audio_model": False, "freeze_audio_projection": False},
           ["language_model", "audio_model", "audio_projection"], True),
}


def nemo_rl(name: str) -> Path:
    return NEMO_RL_DIR / name


@pytest.mark.parametrize("name", sorted(BY_NEMO_RL["composed"]))
def test_each_config_composes_as_nemo_rls_own_loader_composes_it(name):
    """composed_by_nemo_rl.json: NeMo-RL's load_config (its commit in SOURCE), resolved as its run scripts resolve
    it. Includes inheritance/child.yaml: a nested chain, two parents, _override_ (top level only) and ???."""
    from omegaconf import OmegaConf

    from bridge_freeze_plugin.config import load
    from bridge_freeze_plugin.config._layout_nemorl import NEMO_RL
    from bridge_freeze_plugin.config._reading import resolvers

    loaded = load(nemo_rl(name))
    with resolvers(NEMO_RL):
        assert OmegaConf.to_container(loaded.cfg, resolve=True, throw_on_missing=False) == \
            BY_NEMO_RL["composed"][name]


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_reads_right_without_overrides(capsys, name):
    backend, family, selection, trained, router = EXAMPLES[name]
    doc = check_json(capsys, nemo_rl(name))
    assert doc["valid"], doc["error"]
    assert doc["layout"] == "nemo_rl" and doc["family"] == family
    assert doc["settings"][f"policy.{backend}_cfg.enabled"]["value"] is True
    assert doc["selection"] == selection and doc["trained_parts"] == trained
    assert [own["key"] for own in doc["own_freeze"] if own["value"] is True] == (
        [f"{MCFG}.freeze_moe_router"] if router else [])
    _, out, _ = check(capsys, nemo_rl(name))
    assert f"family: {family} (from policy.model_name=" in out and "a guess from the name" in out
    assert ("backend: dtensor" in out) == (backend == "dtensor")


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_each_example_reads_right_with_flag_overrides(capsys, name):
    backend = EXAMPLES[name][0]
    flags = [f"++{MCFG}.freeze_vision_model=true", f"++{MCFG}.freeze_vision_projection=false",
             f"+{MO}.freeze_language_model=true"]
    code, _, err = check(capsys, nemo_rl(name), *flags)
    if backend == "dtensor":
        assert code == 2 and "NeMo-RL's DTensor backend builds the policy with Hugging Face" in err
        assert "Set policy.megatron_cfg.enabled=true and policy.dtensor_cfg.enabled=false" in err
        flags += [f"{MCFG}.enabled=true", "policy.dtensor_cfg.enabled=false"]
    doc = check_json(capsys, nemo_rl(name), *flags)
    assert doc["valid"], doc["error"]
    assert doc["selection"]["freeze_language_model"] and doc["selection"]["freeze_vision_model"]
    assert doc["settings"][f"{MO}.freeze_language_model"]["source"].startswith("override")
    audio = ["audio_model", "audio_projection"] if EXAMPLES[name][1] == "nemotron_omni" else []  # no audio flag given
    assert doc["trained_parts"] == ["vision_projection", *audio]


@pytest.mark.parametrize("entry", BY_NEMO_RL["overrides"], ids=lambda e: " ".join(e["overrides"]))
def test_overrides_are_taken_and_refused_as_nemo_rl_takes_them(entry):
    """NeMo-RL applies the command line in Hydra's struct mode: key=value needs the key, +key=value a new one."""
    from bridge_freeze_plugin.errors import ConfigLoadError

    path, overrides = nemo_rl(entry["config"]), entry["overrides"]
    if "error" in entry:
        with pytest.raises(ConfigLoadError):
            load_run(path, overrides)
        return
    run = load_run(path, overrides)
    result = entry["result"]
    expected = {"freeze_language_model": bool((result.get("model_overrides") or {}).get("freeze_language_model")),
                "freeze_vision_model": bool(result.get("freeze_vision_model")),
                "freeze_vision_projection": bool(result.get("freeze_vision_projection")),
                "freeze_audio_model": False, "freeze_audio_projection": False}
    assert run.settings.selection.as_dict() == expected
    assert run.settings.lora.rank == (result["peft"]["dim"] if result["peft"]["enabled"] else 0)
    assert [own.value for own in run.settings.sources.own_freeze if own.name == "freeze_moe_router"] == [
        result["freeze_moe_router"]]


def test_grpo_syncs_weights_so_lora_with_a_full_rank_part_is_refused_and_sft_accepts_it(capsys):
    lora = [f"{MCFG}.peft.enabled=true", f"{MCFG}.peft.dim=8",
            f"{MCFG}.peft.target_modules=[language_model.*linear_qkv]", f"+{MO}.freeze_language_model=true"]
    code, _, err = check(capsys, nemo_rl(GRPO_MEGATRON), *lora)
    assert code == 2 and "in an RL run: LoRA with full-rank parts" in err
    assert "NeMo-RL's Megatron refit exports the whole merged model" in err
    sft = [f"{MCFG}.enabled=true", "policy.dtensor_cfg.enabled=false", *lora]
    doc = check_json(capsys, nemo_rl(SFT_VLM), *sft)
    assert doc["valid"], doc["error"]
    assert doc["trained_parts"] == ["vision_model", "vision_projection"] and doc["frozen_parts"] == ["language_model"]
    assert doc["lora"]["adapters"]["language_model"] == "yes"


@pytest.mark.parametrize(("override", "words"), [
    (f"+{MCFG}.freeze_language_model=true", "NeMo-RL copies from policy.megatron_cfg to the model provider only"),
    (f"+{MO}.freeze_vision_model=true", "duplicates a first-class policy.megatron_cfg setting"),
    (f"+{MCFG}.train_patterns=[x]", f"Write {MO}.train_patterns"),
    (f"+{MCFG}.lr_vision_model=0.001", "no optimizer_config_override_provider"),
    (f"+{MCFG}.optimizer.lr_vision_projection=0.001", "no per-part learning rate is applied in a NeMo-RL run"),
    ("+teacher.megatron_cfg.freeze_vision_model=true", "the distillation teacher never trains"),
    ("+policy.tokenizer.extra=${oc.env:BRIDGE_FREEZE_UNSET_VARIABLE}", "NeMo-RL resolves the whole config"),
])
def test_what_a_nemo_rl_run_would_not_apply_is_refused_with_the_reason(override, words):
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(nemo_rl(GRPO_MEGATRON), [override]).validate()
    assert words in str(err.value)


def test_a_teacher_flag_set_false_is_accepted():
    """A YAML merge of the policy into the teacher copies its keys; false there asks nothing."""
    assert load_run(nemo_rl(GRPO_MEGATRON), ["+teacher.megatron_cfg.freeze_vision_model=false"]).validate() == \
        FreezeSelection()


def test_nemo_rls_own_freeze_config_hook_is_read_and_checked_against_the_flags(capsys):
    """policy.megatron_cfg.freeze_config: NeMo-RL's pre-wrap hook passes it to the model's freeze()."""
    hook = f"+{MCFG}.freeze_config.freeze_vision_model=true"
    doc = check_json(capsys, nemo_rl(GRPO_MEGATRON), hook)
    assert doc["valid"] and doc["frozen_parts"] == ["vision_model"], doc["error"]
    with pytest.raises(InvalidFreezeConfigError, match="the build refuses a pre-wrap hook that freezes a part"):
        load_run(nemo_rl(GRPO_MEGATRON), [hook, f"+{MO}.freeze_language_model=true"]).validate()
    agreeing = [hook, f"++{MCFG}.freeze_vision_model=true"]
    assert load_run(nemo_rl(GRPO_MEGATRON), agreeing).validate() == VISION


@pytest.fixture(autouse=True)
def _no_conversion_cache(monkeypatch, tmp_path):
    """NeMo-RL's conversion cache of this machine never leaks in: every test has its own (empty) one."""
    monkeypatch.setenv("NRL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "nemo_rl_cache"))


def test_the_family_comes_from_a_local_checkpoint_and_unwritten_flags_are_the_plugins_build(tmp_path, capsys):
    """Issue 35 item 2: with the plugin, a fresh conversion builds Qwen3VLMoEModelProvider with every flag false
    (the plugin's default replaces Bridge's true, qwen3_vl_provider.py), saves that, and the run reuses it: every
    part trains unless written. (Before: "NeMo-RL leaves the provider's default", projection only.)"""
    checkpoint = tmp_path / "Qwen3-VL-30B-A3B"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "qwen3_vl_moe"}))
    doc = check_json(capsys, nemo_rl(GRPO_MEGATRON), f"policy.model_name={checkpoint}")
    assert doc["valid"] and doc["family"] == "qwen3_vl_moe", doc["error"]
    assert doc["trained_parts"] == PARTS and doc["frozen_parts"] == []
    cache = tmp_path / "nemo_rl_cache" / f"model_{str(checkpoint).replace('/', '_')}"  # NeMo-RL: a local path
    assert doc["saved_provider"].startswith(f"none yet at {cache} ($NRL_MEGATRON_CHECKPOINT_DIR)")
    assert "a fresh conversion" in doc["settings"][f"{MCFG}.freeze_vision_model"]["source"]
    flagged = check_json(capsys, nemo_rl(GRPO_MEGATRON), f"policy.model_name={checkpoint}",
                         f"+{MCFG}.freeze_vision_model=true")
    assert flagged["trained_parts"] == ["language_model", "vision_projection"]
    _, out, _ = check(capsys, nemo_rl(GRPO_MEGATRON), f"policy.model_name={checkpoint}")
    assert "family: qwen3_vl_moe (from policy.model_name's config.json (model_type))" in out


def _cache(tmp_path: Path, model: str, **flags: bool) -> Path:
    """A conversion cache as NeMo-RL leaves it: <dir>/<model>/iter_0000000/run_config.yaml (Bridge's model section)."""
    run_config = tmp_path / "nemo_rl_cache" / model / "iter_0000000" / "run_config.yaml"
    run_config.parent.mkdir(parents=True)
    model_section = {"_target_": "megatron.bridge.models.qwen_vl.qwen3_vl_provider.Qwen3VLMoEModelProvider", **flags}
    run_config.write_text(yaml.safe_dump({"model": model_section}))
    return run_config


QWEN3_MOE = "Qwen/Qwen3-VL-30B-A3B-Instruct"


@pytest.mark.parametrize(("cached", "trained"), [
    # written by a conversion without the plugin: Bridge's defaults (LM and vision encoder true) stay in force
    ({"freeze_language_model": True, "freeze_vision_model": True}, ["vision_projection"]),
    # written with the plugin, the vision flag then set: removed from the config since, it stays in force
    ({"freeze_language_model": False, "freeze_vision_model": True}, ["language_model", "vision_projection"]),
    ({"freeze_language_model": False, "freeze_vision_model": False}, PARTS),
])
def test_check_config_predicts_with_the_conversion_cache_the_config_points_to(tmp_path, capsys, cached, trained):
    """Issue 35 item 1: the flags a NeMo-RL config does not write keep the cache's values (setup_model_config loads
    its run_config.yaml); check-config finds it as NeMo-RL does and says so, with a WARNING for a saved true."""
    run_config = _cache(tmp_path, QWEN3_MOE, **cached)
    doc = check_json(capsys, nemo_rl(GRPO_MEGATRON), f"policy.model_name={QWEN3_MOE}", "--family", "qwen3_vl_moe")
    assert doc["valid"], doc["error"]
    assert doc["trained_parts"] == trained
    assert doc["saved_provider"].startswith(f"{run_config} (found via $NRL_MEGATRON_CHECKPOINT_DIR)")
    source = doc["settings"][f"{MO}.freeze_language_model"]["source"]
    assert f"reuses its conversion cache {run_config}" in source
    assert ("WARNING: Bridge's own default" in source) == cached["freeze_language_model"]
    # a flag the config writes wins over the cache (model_overrides / the five keys are applied after loading it)
    written = check_json(capsys, nemo_rl(GRPO_MEGATRON), f"policy.model_name={QWEN3_MOE}", "--family",
                         "qwen3_vl_moe", f"+{MO}.freeze_language_model=false", f"+{MCFG}.freeze_vision_model=false")
    assert written["trained_parts"] == PARTS
    reconvert = check_json(capsys, nemo_rl(GRPO_MEGATRON), f"policy.model_name={QWEN3_MOE}", "--family",
                           "qwen3_vl_moe", f"{MCFG}.force_reconvert_from_hf=true")
    assert reconvert["trained_parts"] == PARTS and "force_reconvert_from_hf=true" in reconvert["saved_provider"] + \
        reconvert["settings"][f"{MCFG}.freeze_vision_model"]["source"]


def test_the_cache_folder_is_found_as_nemo_rl_finds_it(monkeypatch, tmp_path):
    """get_megatron_checkpoint_dir's order, and the __hfovr_ suffix of hf_config_overrides (sha256 of the sorted
    compact JSON, 12 hex digits: _get_hf_config_overrides_hash)."""
    import hashlib

    from bridge_freeze_plugin.config._conversion_cache import find_cache

    policy = {"model_name": QWEN3_MOE, "megatron_cfg": {}}
    assert find_cache(policy, {"NRL_MEGATRON_CHECKPOINT_DIR": "/a", "HF_HOME": "/b"}).folder == Path("/a", QWEN3_MOE)
    assert find_cache(policy, {"NRL_MEGATRON_CHECKPOINT_DIR": " ", "HF_HOME": "/b"}).folder == \
        Path("/b/nemo_rl", QWEN3_MOE)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert find_cache(policy, {}).folder == tmp_path / ".cache/huggingface/nemo_rl" / QWEN3_MOE
    overrides = {"text_config": {"num_hidden_layers": 2}, "a": 1}
    digest = hashlib.sha256(b'{"a":1,"text_config":{"num_hidden_layers":2}}').hexdigest()[:12]
    found = find_cache({**policy, "hf_config_overrides": overrides}, {"NRL_MEGATRON_CHECKPOINT_DIR": "/a"})
    assert found.folder == Path("/a", f"{QWEN3_MOE}__hfovr_{digest}")
    assert find_cache({**policy, "pretrained_checkpoint": {"format": "megatron_lm", "path": "/x"}}, {}) is None


def test_a_fifth_layout_is_data_only(monkeypatch, tmp_path, capsys):
    """NeMo-RL's DPO as one more table: detected from policy: + dpo:, no weight sync (the RL rule is a trait)."""
    from dataclasses import replace

    from bridge_freeze_plugin.config._layout_detect import LAYOUTS
    from bridge_freeze_plugin.config._layout_nemorl import NEMO_RL
    from bridge_freeze_plugin.config._layouts import Marker

    dpo = replace(NEMO_RL, name="nemo_rl_dpo", title="NeMo-RL DPO",
                  decides=(Marker(("policy", "dpo")),), hints=(), run=replace(NEMO_RL.run, syncs_weights_with=()))
    monkeypatch.setitem(LAYOUTS, dpo.name, dpo)
    path = write(tmp_path / "dpo.yaml", {"dpo": {"seed": 1}, "policy": {
        "model_name": "Qwen/Qwen2.5-VL-3B-Instruct", "dtensor_cfg": {"enabled": False},
        "megatron_cfg": {"enabled": True, "peft": {"enabled": True, "dim": 8, "target_modules": ["linear_qkv"]},
                         "model_overrides": {"freeze_language_model": True}}}})
    doc = check_json(capsys, path)
    assert doc["valid"] and doc["layout"] == "nemo_rl_dpo", doc["error"]
    assert doc["trained_parts"] == ["vision_model", "vision_projection"]


# ---- issue 37 item 1: where NeMo-RL applies each audio setting, and the model_overrides keys it refuses ----------

@pytest.mark.parametrize(("override", "words"), [
    # megatron_cfg: NeMo-RL copies only five keys to the provider (iter_vlm_config_overrides); the audio flags drop
    (f"++{MCFG}.freeze_audio_model=true", f"Write {MO}.freeze_audio_model instead"),
    (f"++{MCFG}.freeze_audio_projection=true", f"Write {MO}.freeze_audio_projection instead"),
    # model_overrides: a key annotated on NeMo-RL's MegatronConfig is refused (_validate_model_override_conflicts)
    (f"+{MO}.freeze_sound_encoder=true", f"Write {MCFG}.freeze_sound_encoder"),
    (f"+{MO}.freeze_sound_projection=true", f"Write {MCFG}.freeze_sound_projection"),
    (f"+{MO}.radio_force_cpe_eval_mode=true", f"Write {MCFG}.radio_force_cpe_eval_mode"),
    (f"+{MO}.recompute_granularity=full", f"Write {MCFG}.recompute_granularity"),
])
def test_an_audio_setting_nemo_rl_drops_or_refuses_is_refused_with_where_to_write_it(override, words):
    with pytest.raises(InvalidFreezeConfigError) as err:
        load_run(nemo_rl(OMNI), [override]).validate()
    assert words in str(err.value)


@pytest.mark.parametrize(("override", "key", "flag"), [
    (f"+{MO}.freeze_audio_model=true", f"{MO}.freeze_audio_model", "freeze_audio_model"),
    (f"+{MO}.freeze_audio_projection=true", f"{MO}.freeze_audio_projection", "freeze_audio_projection"),
    (f"++{MCFG}.freeze_sound_encoder=true", f"{MCFG}.freeze_sound_encoder", "freeze_audio_model"),
    (f"++{MCFG}.freeze_sound_projection=true", f"{MCFG}.freeze_sound_projection", "freeze_audio_projection"),
])
def test_an_audio_flag_where_nemo_rl_applies_it_is_read_and_said_where_written(capsys, override, key, flag):
    """OMNI freezes the vision encoder and projection itself; the audio part asked is frozen too."""
    doc = check_json(capsys, nemo_rl(OMNI), override)
    assert doc["valid"], doc["error"]
    assert doc["selection"][flag] is True
    assert doc["settings"][key]["value"] is True and doc["settings"][key]["source"].startswith("override")
    trained = ["language_model", "audio_model", "audio_projection"]
    assert doc["trained_parts"] == [p for p in trained if f"freeze_{p}" != flag]


AUDIO_FAMILIES = ("nemotron_omni", "qwen2_audio", "qwen25_omni", "qwen3_asr", "qwen3_omni")


@pytest.mark.parametrize("alias", sorted(ALIAS_FIELDS))
@pytest.mark.parametrize("family", AUDIO_FAMILIES)
def test_bridges_name_of_an_audio_flag_is_refused_for_a_family_whose_provider_lacks_it(family, alias):
    """Sibling of issue 37 item 1: NeMo-RL setattr's megatron_cfg.freeze_sound_* only after hasattr (a ValueError
    otherwise), and Bridge's instantiate drops a run_config field its class lacks: the part would train. Which
    provider declares the alias is read from Bridge's source with ast (declared_freeze_fields), not from the plugin."""
    from bridge_freeze_plugin.registry import REGISTRY

    classes = {path.rsplit(":", 1)[1] for path in REGISTRY.get(family).providers}
    declares = any(provider_lineage(name) & declared_freeze_fields()[alias] for name in classes)
    cases = [(BRIDGE_FILE, f"+model.{alias}=true")]
    if alias == "freeze_sound_encoder":  # (NeMo-RL's composition is slow to read: one alias there)
        cases.append((nemo_rl(GRPO_MEGATRON), f"++{MCFG}.{alias}=true"))
    for path, override in cases:
        if declares:
            selection = load_run(path, [override], family=family).validate()
            assert selection == FreezeSelection(**{ALIAS_FIELDS[alias]: True})
            continue
        with pytest.raises(InvalidFreezeConfigError) as err:
            load_run(path, [override], family=family).validate()
        assert f"the {family} model's provider has no field {alias}" in str(err.value)


@pytest.mark.parametrize("value", ["true", "1"])
def test_an_audio_flag_under_model_overrides_keeps_every_rule(value):
    """Accepted under model_overrides, the audio flag is still a boolean, and still refused for a model without
    an audio side (the GRPO example is Qwen2.5-VL)."""
    with pytest.raises((bfp.PartNotInFamilyError, bfp.FreezeFlagTypeError)) as err:
        load_run(nemo_rl(GRPO_MEGATRON), [f"+{MO}.freeze_audio_model={value}"]).validate()
    words = "no audio encoder" if value == "true" else "must be a boolean"
    assert f"{MO}.freeze_audio_model" in str(err.value) and words in str(err.value)
