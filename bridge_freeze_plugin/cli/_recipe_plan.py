"""``bridge-freeze plan --recipe NAME [overrides] [--freeze-...]``: the plan under the recipe's own layout.

The recipe is run as ``check-config --recipe`` runs it (:mod:`._recipe`); the plan then builds the model from the
``config.json`` the recipe read (Bridge's own conversion, as ``plan --hf-config``), with the selection the recipe's
config makes (its flags and patterns after the overrides, checked by the same rules as ``check-config``) plus any
``--freeze-...`` / ``--train`` / ``--freeze`` given here, the recipe's PEFT, and the recipe's tensor / pipeline /
expert / context parallel sizes, sequence length, micro-batch, recompute and distributed optimizer. Each of those
is said with its source (the recipe, or your override).
"""

from __future__ import annotations

import argparse
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bridge_freeze_plugin.cli._common import selection_from
from bridge_freeze_plugin.cli._recipe import recipe_overrides, recipe_run
from bridge_freeze_plugin.cli._training_options import with_patterns
from bridge_freeze_plugin.errors import CommandError
from bridge_freeze_plugin.request import FLAGS, FreezeSelection

#: plan's options the recipe sets (argparse dest -> the option and its default): given with --recipe, refused.
_FROM_RECIPE = {"tp": ("--tp", 1), "pp": ("--pp", 1), "vp": ("--vp", None), "ep": ("--ep", 1), "etp": ("--etp", None),
                "first_stage_layers": ("--decoder-first-pipeline-num-layers", None),
                "last_stage_layers": ("--decoder-last-pipeline-num-layers", None),
                "seq_length": ("--seq-length", 4096), "micro_batch_size": ("--micro-batch-size", 1),
                "recompute_granularity": ("--recompute-granularity", None),
                "use_distributed_optimizer": ("--use-distributed-optimizer", False),
                "lora_rank": ("--lora-rank", 0), "lora_target_modules": ("--lora-target-modules", None)}


@dataclass
class RecipePlan:
    """What ``plan``'s run takes from the recipe (see :func:`bridge_freeze_plugin.cli._plan._run`)."""

    selection: FreezeSelection
    lora: Callable[[Any], Any] | None
    document: dict[str, Any]
    lines: list[str] = field(default_factory=list)


def _refuse_options(args: argparse.Namespace) -> None:
    given = [option for dest, (option, default) in _FROM_RECIPE.items() if getattr(args, dest) != default]
    if given:
        raise CommandError(f"with --recipe the layout, sequence, recompute and PEFT are the recipe's; "
                           f"{', '.join(given)} would not be what the run uses: write them as the recipe's overrides "
                           f"instead (e.g. model.tensor_model_parallel_size=4, dataset.seq_length=8192, "
                           f"train.micro_batch_size=2)")


def _selection(recipe_selection: FreezeSelection, args: argparse.Namespace) -> FreezeSelection:
    """The recipe's selection with this command's --freeze-... flags and patterns added."""
    asked = with_patterns(selection_from(args), args)
    flags = {flag: getattr(recipe_selection, flag) or getattr(asked, flag) for flag in FLAGS}
    return FreezeSelection(**flags, train_patterns=(*recipe_selection.train_patterns, *asked.train_patterns),
                           freeze_patterns=(*recipe_selection.freeze_patterns, *asked.freeze_patterns))


def _apply_layout(args: argparse.Namespace, values: dict[str, Any]) -> list[str]:
    """Set plan's options to the recipe's values; the notes on what plan models of them."""
    notes = []
    for dest in ("tp", "pp", "vp", "ep", "etp", "first_stage_layers", "last_stage_layers", "micro_batch_size"):
        if values.get(dest) is not None:
            setattr(args, dest, int(values[dest]))
    args.vp = args.vp if args.pp > 1 else None  # megatron-core ignores a virtual size without a pipeline
    args.use_distributed_optimizer = bool(values.get("use_distributed_optimizer"))
    args.recompute_granularity = values.get("recompute_granularity") or "none"
    seq, cp = values.get("seq_length"), int(values.get("cp") or 1)
    if seq is not None:
        if cp > 1 and seq % cp:
            raise CommandError(f"the recipe's sequence {seq} does not split over its context parallel size {cp}")
        args.seq_length = int(seq) // cp
    if cp > 1:
        notes.append(f"context parallel {cp}: each rank's activations are for sequence {seq} / {cp}; plan has no "
                     f"context-parallel ranks of its own (the weights are those of one context-parallel rank, and "
                     f"the distributed optimizer's sharding over the context-parallel ranks is not counted)")
    return notes


def plan_recipe(args: argparse.Namespace, run_plan: Callable[[argparse.Namespace, Any], int]) -> int:
    """Run the recipe, then ``run_plan`` (plan's own run) with its layout, selection and PEFT."""
    from bridge_freeze_plugin import planning, recipes

    overrides = recipe_overrides(args.model, list(args.overrides), what="MODEL")
    if args.tiny:
        raise CommandError("--tiny builds the project's tiny config; a recipe builds its own model: drop --tiny")
    _refuse_options(args)
    with recipe_run(args.recipe, overrides, args.hf_config) as run:
        check = recipes.check_recipe(run, family=None)
        recipe_selection = check.checked.validate()
        if run.config_file is None:
            raise CommandError(f"recipe {run.name} reads no config.json ({type(run.container.model).__name__} is "
                               f"built in the recipe itself): plan builds from a config.json, so it cannot plan it")
        converted, _ = planning.hf_config_provider(run.config_file, max_layer_blocks=args.max_layer_blocks)
        recipes.shape_differences(run, converted)
        settings = recipes.plan_settings(run)
        notes = _apply_layout(args, settings.values)
        args.model, args.hf_config = None, str(run.config_file)
        peft = run.container.peft
        plan = RecipePlan(
            selection=_selection(recipe_selection, args),
            lora=None if peft is None else (lambda _provider: copy.deepcopy(peft)),
            document={**check.as_dict(), "layout": settings.values, "layout_sources": settings.sources,
                      "notes": notes},
        )
        plan.lines = [f"recipe: {run.name} ({run.function}), model config {run.config_file} ({run.served_from})",
                      f"layout from the recipe: {settings.describe()}",
                      *(f"  {flag.describe()}" for flag in check.flags),
                      *(f"note: {note}" for note in notes),
                      *([f"PEFT from the recipe: {type(peft).__name__}"] if peft is not None else []), ""]
        return run_plan(args, plan)
