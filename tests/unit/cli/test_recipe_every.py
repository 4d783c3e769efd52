"""Every VLM and audio recipe of the installed Megatron-Bridge, as its users run it (issue 48 item 3).

The recipes are found by walking ``megatron.bridge.recipes`` (the plugin's :func:`recipes.recipe_functions`, no list
kept here). Each is called (Bridge's own function) with the committed published ``config.json`` fixtures served
through an offline HF cache this module writes (``tests/fixtures/hf_configs/*``, under the hub id its SOURCE names);
a recipe whose provider has a family in the plugin's registry is a VLM or audio recipe. For each:

- its trained parts, as ``check-config --recipe NAME --json`` predicts them, are the recipe's own flags (read from
  the provider the recipe made; with PEFT and no flag set: the adapters alone, as Bridge's PEFT trains);
- ``plan --recipe NAME --json`` runs, and its real meta-device build of the model with the plugin trains exactly
  the parameters of the predicted parts, each parameter's part taken here from the family's prefixes (longest
  match). A PEFT recipe's prediction (adapters alone) is checked, not built: LoRA's transform over a full-size
  model on the meta device takes minutes (LoRA builds are tested on tiny models elsewhere). The plans run on one GPU
  (``model.*_parallel_size=1`` overrides: the whole model is one build); one recipe is planned under its own
  layout too (its per-rank builds);
- an override of a flag is applied by Bridge's code and said as the flag's source.

Recipes whose hub id has no committed ``config.json`` are named in a skip. Bridge's MoE recipes read GPU 0's
properties while they configure no dispatcher backend (``apply_flex_dispatcher_backend``): answered by a stand-in
here, as the command answers it (``cli/_recipe.py``). One process, meta device, the recipe walk and Bridge imported
once.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "hf_configs"
#: One GPU for the per-recipe plans: the whole model in one build (the recipe's own layout: ONE_LAYOUT_RECIPE).
ONE_GPU = ["model.tensor_model_parallel_size=1", "model.pipeline_model_parallel_size=1",
           "model.expert_model_parallel_size=1", "model.context_parallel_size=1",
           "model.virtual_pipeline_model_parallel_size=null", "model.expert_tensor_parallel_size=null",
           "model.num_layers_in_first_pipeline_stage=null", "model.num_layers_in_last_pipeline_stage=null"]


def _hub_id(folder: Path) -> str:
    """The hub id a fixture's SOURCE file names first (``Qwen/Qwen3-VL-8B-Instruct config.json, ...``)."""
    return re.search(r"[\w.-]+/[\w.-]+", (folder / "SOURCE").read_text(encoding="utf-8")).group(0)


def _write_cache(cache: Path) -> dict[str, str]:
    served = {}
    for folder in sorted(p for p in FIXTURES.iterdir() if (p / "config.json").is_file()):
        hub_id = _hub_id(folder)
        revision = hashlib.sha1(hub_id.encode()).hexdigest()
        repo = cache / ("models--" + hub_id.replace("/", "--"))
        (repo / "snapshots" / revision).mkdir(parents=True)
        shutil.copyfile(folder / "config.json", repo / "snapshots" / revision / "config.json")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(revision, encoding="utf-8")
        served[hub_id] = folder.name
    return served


class _Gpu:
    name, major, minor = "stand-in GPU (no GPU here)", 9, 0


@pytest.fixture(scope="module")
def offline(cpu_bridge, tmp_path_factory):
    import torch
    from huggingface_hub import constants

    cache = tmp_path_factory.mktemp("hf") / "hub"
    served = _write_cache(cache)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(cache))
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        if not torch.cuda.is_available():
            patch.setattr(torch.cuda, "get_device_properties", lambda device=None: _Gpu())
        yield served


class _NotServed(Exception):
    pass


def _asked_hub_id(function: Any, served: dict[str, str]) -> tuple[Any, str | None]:
    """Call the recipe; (its container or the exception, the hub id it gave from_hf_pretrained). A hub id not
    served stops it at once (Bridge's config loader would retry it for seconds)."""
    from megatron.bridge import AutoBridge

    original, asked = AutoBridge.__dict__["from_hf_pretrained"], []

    def record(cls: Any, path: Any, *args: Any, **kwargs: Any) -> Any:
        asked.append(str(path))
        if str(path) not in served:
            raise _NotServed(path)
        return original.__func__(cls, path, *args, **kwargs)

    AutoBridge.from_hf_pretrained = classmethod(record)
    try:
        return function(), (asked[0] if asked else None)
    except Exception as exc:  # noqa: BLE001 - a recipe this machine cannot run offline: reported by name
        return exc, (asked[0] if asked else None)
    finally:
        AutoBridge.from_hf_pretrained = original


@pytest.fixture(scope="module")
def walked(offline):
    """name -> (container, family) of every VLM / audio recipe served; name -> hub id of those not served."""
    from bridge_freeze_plugin import recipes
    from bridge_freeze_plugin.registry import family_for_provider

    kept: dict[str, tuple[Any, Any]] = {}
    not_served: dict[str, str | None] = {}
    failed: dict[str, str] = {}
    for function in dict.fromkeys(recipes.recipe_functions().values()):
        result, hub_id = _asked_hub_id(function, offline)
        if isinstance(result, _NotServed):
            not_served[function.__name__] = hub_id
        elif isinstance(result, Exception) and hub_id in offline:  # served, failing offline (e.g. remote code)
            failed[function.__name__] = f"{type(result).__name__}: {' '.join(str(result).split())[:200]}"
        if isinstance(result, Exception):
            continue
        family = family_for_provider(result.model)
        if family is not None:
            kept[function.__name__] = (result, family)
    return kept, not_served, failed


def _command(*argv: str) -> dict[str, Any]:
    from bridge_freeze_plugin.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        code = main(list(argv))
    document = json.loads(buffer.getvalue())
    assert code == 0, document.get("error")
    return document


def _expected_parts(container: Any, family: Any, **changed: bool) -> set[str]:
    """The parts the recipe's flags (``changed``: some flags set otherwise) train, as Bridge's PEFT and the
    plugin's flags decide it: PEFT with no flag set trains the adapters alone."""
    from bridge_freeze_plugin.request import INFO

    flags = {part: changed.get(INFO[part].flag, bool(getattr(container.model, INFO[part].flag, False)))
             for part in family.part_names()}
    if container.peft is not None and not any(flags.values()):
        return set()
    return {part.value for part, frozen in flags.items() if not frozen}


def _part_of(name: str, family: Any) -> str | None:
    best = (0, None)
    for part in family.part_names():
        for prefix in family.prefixes(part):
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best[0]:
                best = (len(prefix), part.value)
    return best[1]


def test_every_vlm_and_audio_recipe_is_found_and_served(walked):
    kept, _, _ = walked
    families = {family.name for _, family in kept.values()}
    # the fixtures serve (at least) these recipe families' models under their recipes' own hub ids
    assert {"qwen3_vl", "qwen3_vl_moe", "qwen25_vl", "qwen35_vl", "glm45v", "gemma3_vl", "exaone45_vl"} <= families


@pytest.mark.slow  # full-size meta builds, one per family and selection
def test_the_prediction_is_the_recipes_flags_and_the_meta_build(walked):
    kept, _, _ = walked
    wrong: list[str] = []
    built: dict[tuple[Any, ...], dict[str, Any]] = {}
    for name, (container, family) in kept.items():
        doc = _command("check-config", "--recipe", name, "--json")
        expected = _expected_parts(container, family)
        if set(doc["trained_parts"]) != expected:
            wrong.append(f"{name}: predicted {doc['trained_parts']}, the recipe's flags train {sorted(expected)}")
            continue
        if container.peft is not None:  # adapters only, as predicted; LoRA's transform over a full-size meta
            assert doc["lora"] is not None, name  # model takes minutes: its builds are the tiny LoRA tests'
            continue
        # one meta build per family and selection (the suite's time: one per model took 378 s of CI, 2026-12-07);
        # every recipe's prediction is still checked against its flags above
        key = (family.name, tuple(sorted(expected)))
        if key not in built:
            built[key] = _command("plan", "--recipe", name, *ONE_GPU, "--json")
        params = built[key]["parameters"]
        want = {p["name"] for p in params if _part_of(p["name"], family) in expected}
        got = {p["name"] for p in params if p["trainable"]}
        if got != want:
            wrong.append(f"{name}: the build trains {len(got)} tensors, {len(want)} expected "
                         f"(first differing: {sorted(got ^ want)[:3]})")
    assert not wrong, "\n".join(wrong)


def test_an_override_of_a_flag_is_bridges_and_said(walked):
    from bridge_freeze_plugin.request import INFO

    kept, _, _ = walked
    by_family = {}
    for name, (container, family) in kept.items():
        if container.peft is None:  # with PEFT a full-rank part next to adapters is refused where targets reach it
            by_family.setdefault(family.name, (name, container, family))
    for name, container, family in by_family.values():
        frozen = [p for p in family.part_names() if getattr(container.model, INFO[p].flag)]
        part = frozen[0] if frozen else family.part_names()[-1]  # unfreeze a part, else freeze one: some part trains
        flag = INFO[part].flag
        flipped = not bool(getattr(container.model, flag))
        text = f"model.{flag}={flipped}"
        doc = _command("check-config", "--recipe", name, text, "--json")
        entry = doc["recipe"]["flags"][f"model.{flag}"]
        assert entry == {"value": flipped, "recipe_value": not flipped, "source": "your override", "override": text}
        assert doc["settings"][f"model.{flag}"]["source"] == f"override '{text}'"
        assert set(doc["trained_parts"]) == _expected_parts(container, family, **{flag: flipped}), name


def test_a_recipe_plans_under_its_own_layout(walked):
    kept, _, _ = walked
    name = "qwen3_vl_8b_sft_2gpu_h100_bf16_config"  # TP 2: two rank positions, an 8B model (quick)
    container = kept[name][0]
    assert container.model.tensor_model_parallel_size > 1
    doc = _command("plan", "--recipe", name, "--json")
    assert doc["layout"]["tensor_model_parallel_size"] == container.model.tensor_model_parallel_size
    assert doc["layout"]["pipeline_model_parallel_size"] == container.model.pipeline_model_parallel_size
    assert doc["activation"]["micro_batch_size"] == container.train.micro_batch_size
    assert doc["recipe"]["layout_sources"]["tp"] == "the recipe"
    assert {r["tp"] for r in doc["per_rank"]} == set(range(container.model.tensor_model_parallel_size))


def test_recipes_whose_model_has_no_committed_config_or_that_fail_offline(walked):
    _, not_served, failed = walked
    if not not_served and not failed:
        return
    by_hub: dict[str, list[str]] = {}
    for name, hub_id in not_served.items():
        by_hub.setdefault(str(hub_id), []).append(name)
    pytest.skip(f"{len(failed)} recipes served fail offline: "
                + "; ".join(f"{name}: {why}" for name, why in sorted(failed.items()))
                + f" || {len(not_served)} recipes ask for a model with no committed config.json "
                "(tests/fixtures/hf_configs): " + "; ".join(f"{hub}: {', '.join(names)}"
                                                            for hub, names in sorted(by_hub.items())))
