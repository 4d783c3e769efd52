"""``bridge-freeze check-config``: a training config as the run would see it, checked before any model is built.

The config is the file (optional: the trainer's normal form is a command line over its defaults), its
Hydra defaults list, the layout's defaults and the overrides (``key=v``, ``+key=v``, ``++key=v``,
``~key``); the layout is detected from it (``--layout`` / ``--rl`` force one, and must agree). Every
applied override is echoed, and every setting the rules read is listed with where it came from: the flags,
the patterns, the per-part learning rates, LoRA's targets. The summary says what trains as the flags and
patterns together decide it. ``--json`` prints its document whatever happens, a file that fails while
being read included (then ``valid`` is false and what could not be read is null).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.cli._check_config_summary import lora_line, model_parts, stage_of, summarize, trains_line
from bridge_freeze_plugin.cli._common import EXIT_OK, add_subcommand, finish_subcommand, flags_line, one_line, out
from bridge_freeze_plugin.cli._recipe import RecipeLoader, add_recipe_option, recipe_overrides
from bridge_freeze_plugin.config import LAYOUTS, select
from bridge_freeze_plugin.errors import BridgeFreezeError, CommandError
from bridge_freeze_plugin.optim import LR_KEYS
from bridge_freeze_plugin.request import INFO, PATTERN_KEYS, FreezeSelection

_OPERATIONS = {"set": "sets", "add": "adds", "force": "adds or sets", "delete": "deletes"}


def _exists(file: str) -> bool:
    try:
        return Path(file).exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte: not a file
        return False


def _file_and_overrides(file: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """FILE is optional: a first argument written as an override (``key=value``, ``+key...``, ``~key``) is one."""
    if file is None or not ("=" in file or file.startswith(("+", "~"))) or _exists(file):
        return file, list(overrides)
    return None, [file, *overrides]


def _layout_option(args: argparse.Namespace) -> str | None:
    if args.rl and args.layout not in (None, "rl"):
        raise CommandError(f"--rl and --layout {args.layout} disagree: give one of them")
    return "rl" if args.rl else args.layout


def _settings(checked: Any) -> list[tuple[str, Any, str]]:
    """(key, value, source) of every setting the rules read: the flags, the patterns, the per-part learning
    rates (those set), then the other settings."""
    s, loaded = checked.settings, checked.loaded
    flags = [INFO[part].flag for part in model_parts(s.selection, s.family)]
    keys = {flag: next((k for k in s.keys_of(flag) if select(loaded.cfg, k) is not None), s.key_of(flag))
            for flag in flags}  # where each flag was written: its own key, or Bridge's name of it
    rows = [(keys[flag], getattr(s.selection, flag), s.sources.provider_defaults.get(flag) or loaded.source(keys[flag]))
            for flag in flags]
    rows += [(s.key_of(key), list(getattr(s.selection, key)), loaded.source(s.key_of(key))) for key in PATTERN_KEYS]
    rates = s.rates.values.as_dict() if s.rates.values else {}
    rows += [(f"{s.rates.key}.{key}", rates[key], loaded.source(f"{s.rates.key}.{key}"))
             for key in LR_KEYS if key in rates]
    switches = checked.layout.strategy.switches
    strategy = [] if switches else [s.run.strategy]  # a backend chosen by switches: the switches themselves
    rows += [(key, _switch(loaded.cfg, key), loaded.source(key)) for key, _ in switches]
    others = [*strategy, s.run.language_model_only, s.lora_read.rank, *s.run.recompute, *s.run.recompute_policy,
              s.provider_target,
              *(peer for _, peer in s.run.peers)]
    rows += [(o.key, o.value, o.source) for o in others if o is not None and o.key is not None]
    if s.lora.enabled:
        key = f"{checked.layout.lora.section}.target_modules"
        targets = s.lora.target_modules
        rows.append((key, list(targets) if isinstance(targets, tuple) else targets, loaded.source(key)))
    rows += [(setting.key, setting.value, setting.source) for setting in (s.lora_read.vlm_lora or {}).values()]
    rows += [(own.key, own.value, own.source) for own in s.sources.own_freeze]
    return rows


def _switch(cfg: Any, key: str) -> Any:
    from bridge_freeze_plugin.config import select

    return select(cfg, key)


def _family_line(checked: Any) -> str:
    s = checked.settings
    if s.family is not None:
        return f"{s.family.name} (from {s.family_source})"
    return "unknown (pass --family NAME, or a local model path, to see the full-recompute adjustment now)"


def _doc(args: argparse.Namespace, checked: Any, file: str | None, overrides: list[str]) -> dict[str, Any]:
    s = checked.settings
    return {
        **_empty_doc(file, overrides),
        "layout": checked.layout.name,
        "layout_reason": checked.loaded.layout_reason,
        "composed": list(checked.loaded.composed),
        "layout_defaults": list(checked.loaded.defaulted),
        "family": s.family.name if s.family else None,
        "settings": {key: {"value": value, "source": source} for key, value, source in _settings(checked)},
        "patterns": s.selection.patterns_dict(),
        "learning_rates": {p.part: {"lr": p.lr, "min_lr": p.min_lr}
                           for p in (s.rates.values.parts if s.rates.values else ())},
        "own_freeze": [_own_doc(own) for own in s.sources.own_freeze],
        "unread_freeze_keys": list(s.sources.unread_freeze_keys),
        "saved_provider": s.sources.saved_provider,
    }


def _own_doc(own: Any) -> dict[str, Any]:
    return {"key": own.key, "value": own.value, "freezes": own.setting.what, "applied_by": own.setting.by,
            "narrows": None if own.setting.narrows is None else own.setting.narrows.value,
            "outside_parts": own.setting.outside}


def _own_lines(s: Any, trained: list[str]) -> list[str]:
    """One line per own ``freeze_*`` setting (Bridge's or the trainer's) that freezes something."""
    lines = []
    for own in s.sources.own_freeze:
        if own.value is False or own.value is None or own.setting.freezes_parts:
            continue
        setting = own.setting
        if setting.narrows is not None:
            where = setting.narrows.value
            if where in trained:
                lines.append(f"narrowed: {own.key}={_shown(own.value)} freezes {setting.what} inside the {where}, "
                             f"which trains: applied by {setting.by}; the build accepts it next to the flags and "
                             "reports it per part, with the hook")
            else:
                lines.append(f"{own.key}={_shown(own.value)} ({setting.what}): inside the {where}, which does not "
                             "train at full rank here")
        else:
            lines.append(f"{setting.by.split(' (')[0]}'s own: {own.key}={_shown(own.value)} freezes {setting.what}; "
                         f"applied by {setting.by}, not by the plugin")
    if any(own.setting.outside and own.value not in (False, None) for own in s.sources.own_freeze):
        lines.append("(the plugin's audio / sound parts are a later issue: it neither selects nor reports them)")
    return lines


def _shown(value: Any) -> str:
    return json.dumps(_jsonable(value), default=str) if not isinstance(value, str) else value


def _empty_doc(file: str | None, overrides: list[str]) -> dict[str, Any]:
    """The document's keys, each null (or empty) until known: what a config that fails while read prints."""
    return {
        "schema_version": 1, "config": file, "overrides": overrides, "layout": None, "layout_reason": None,
        "composed": [], "layout_defaults": [], "family": None, "settings": None, "patterns": None,
        "learning_rates": None, "own_freeze": None, "unread_freeze_keys": None, "valid": False, "error": None,
        "saved_provider": None,
        "error_type": None, "selection": None,
        "trained_parts": None, "frozen_parts": None, "pattern_parts": None, "lora": None, "adjustments": None,
        "stage": None, "recipe": None,
    }


def _jsonable(value: Any) -> Any:
    """``value`` with every mapping key a string (a config may mix ``1:`` and ``a:`` keys; JSON sorts keys)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value


def _print_json(doc: dict[str, Any]) -> None:
    out(json.dumps(_jsonable(doc), indent=2, sort_keys=True, default=str))


def _print_header(checked: Any, file: str | None, overrides: list[str]) -> None:
    loaded = checked.loaded
    extra = f" + {len(overrides)} override(s)" if overrides else ""
    where = file if file is not None else "no file (the layout's defaults stand in for it)"
    out(f"config: {where} ({checked.layout.title} layout, {loaded.layout_reason}{extra})")
    if loaded.composed:
        out(f"defaults list: {', '.join(loaded.composed)}")
    for override in loaded.overrides:
        out(f"override: {override.text} ({_OPERATIONS[override.operation]} {override.key})")
    out(f"family: {_family_line(checked)}")
    if checked.settings.sources.saved_provider is not None:
        out(f"saved provider: {checked.settings.sources.saved_provider}")
    out("settings read:")
    for key, value, source in _settings(checked):
        shown = value if isinstance(value, str) else json.dumps(_jsonable(value), default=str)
        out(f"  {key} = {shown}  ({source})")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    check = add_subcommand(
        subparsers, "check-config",
        help="validate a training config's freeze flags and print the effective selection",
        description="Validate a training config as the run would see it: the YAML file (optional), its Hydra "
                    "defaults list, the layout's defaults and the overrides (key=v, +key=v, ++key=v, ~key). "
                    "The layout (SFT, RL, Megatron-Bridge's ConfigContainer, or NeMo-RL) is detected from the config. "
                    "Exit 0 and the effective selection when valid; exit 2 and the error when not.",
        epilog="examples:\n"
               "  bridge-freeze check-config sft.yaml\n"
               "  bridge-freeze check-config sft.yaml megatron_config.freeze_vision_model=true\n"
               "  bridge-freeze check-config megatron_config.freeze_vision_model=true      (no file: SFT defaults)\n"
               "  bridge-freeze check-config ppo_base.yaml +trainer.policy.megatron_config.freeze_vision_model=true\n"
               "  bridge-freeze check-config ckpt/run_config.yaml model.freeze_vision_model=True\n"
               "  bridge-freeze check-config sft.yaml --family qwen3_vl --json\n"
               "  bridge-freeze check-config vlm_grpo_3B_megatron.yaml +policy.megatron_cfg.freeze_vision_model=true"
               "   (NeMo-RL)\n"
               "  bridge-freeze check-config --recipe qwen3_vl_8b_pretrain_mock_config "
               "model.freeze_language_model=False   (Bridge's recipe)\n\n"
               "The config layouts and rules are in docs/configuration.md.",
    )
    check.add_argument("file", metavar="FILE", nargs="?", default=None,
                       help="the training config (YAML); may be left out: then the first argument is an override")
    # default=[]: without a default, argparse (< 3.13) lists a nargs="*" positional as required in errors.
    check.add_argument("overrides", metavar="KEY=VALUE", nargs="*", default=[],
                       help="overrides applied over FILE: key=value, +key=value (add), ++key=value, ~key (delete)")
    check.add_argument("--layout", choices=sorted(LAYOUTS), help="the config layout, if it is not detected")
    check.add_argument("--rl", action="store_true", help="the RL layout (as --layout rl)")
    check.add_argument("--family", help="the model family (name or provider class), if the config does not tell")
    add_recipe_option(check)
    check.add_argument("--hf-config", metavar="PATH", default=None,
                       help="with --recipe: the model's config.json (or a folder holding one), served offline under "
                            "the recipe's hub id (default: the HF cache, HF_HOME; nothing is downloaded)")
    check.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    finish_subcommand(check, run)
    return check


def run(args: argparse.Namespace) -> int:
    from bridge_freeze_plugin.config import load_run

    if args.recipe is not None:  # Bridge's recipe, run as run_recipe.py runs it (cli/_recipe.py)
        overrides = recipe_overrides(args.file, list(args.overrides), what="FILE")
        if args.layout not in (None, "bridge") or args.rl:
            raise CommandError("a recipe's config is a Megatron-Bridge ConfigContainer: drop --layout / --rl")
        with RecipeLoader(args, overrides) as loader:
            return _run(args, loader.shown, overrides, loader, loader.document)
    if args.hf_config is not None:
        raise CommandError("--hf-config serves the model's config.json to a recipe: give it with --recipe NAME")
    file, overrides = _file_and_overrides(args.file, list(args.overrides))
    if file is None and not overrides:
        args.parser.error("the following arguments are required: FILE")
    return _run(args, file, overrides,
                lambda: load_run(file, overrides, layout=_layout_option(args), family=args.family), dict)


def _run(args: argparse.Namespace, file: str | None, overrides: list[str], load: Callable[[], Any],
         extra: Callable[[], dict[str, Any]]) -> int:
    """Load (``load``: the file and overrides, or a recipe), print and check; ``extra``: more of the document."""
    doc = {**_empty_doc(file, overrides), **extra()}
    try:
        checked = load()
        doc = {**_doc(args, checked, file, overrides), **extra()}
        if not args.json:
            _print_header(checked, file, overrides)
        selection = checked.validate()
        stage = stage_of(checked, selection)  # a config that loads a checkpoint: its selection against this one
        doc["stage"] = None if stage is None else stage.as_dict()
        if stage is not None and stage.error is not None:
            raise stage.error
        return _print_valid(args, doc, checked, selection, stage)
    except Exception as exc:
        if args.json:  # the document, whatever failed (reading the file included); the error on stderr too
            kind = "" if isinstance(exc, BridgeFreezeError) else "unexpected error: "
            _print_json({**doc, **extra(), "valid": False, "error": kind + one_line(str(exc)),
                         "error_type": type(exc).__name__})
        raise


def _print_valid(args: argparse.Namespace, doc: dict[str, Any], checked: Any, selection: FreezeSelection,
                 stage: Any = None) -> int:
    summary = summarize(checked, selection)
    trained = summary.trained
    adjusted = checked.adjustments()
    if args.json:
        parts = model_parts(selection, checked.settings.family)
        flags = {INFO[p].flag: getattr(selection, INFO[p].flag) for p in parts}
        _print_json({**doc, "valid": True, "selection": flags, "trained_parts": trained,
                     "frozen_parts": summary.frozen, "pattern_parts": summary.per_tensor, "lora": summary.lora,
                     "adjustments": adjusted})
        return EXIT_OK
    s = checked.settings
    out(f"selection ({s.sources.flags_key}): {flags_line(selection, model_parts(selection, s.family))}")
    if selection.patterns:
        out(f"patterns ({s.key_of(PATTERN_KEYS[0]).rpartition('.')[0]}): " + " ".join(
            f"{key}={json.dumps(values)}" for key, values in selection.patterns_dict().items() if values))
    if s.run.strategy_note:  # a backend the flags never reach (NeMo-RL's DTensor): what trains is the trainer's affair
        out(f"backend: {s.run.strategy.value} ({s.run.strategy.key}=true): {s.run.strategy_note}; the summary "
            "below is what the flags would mean on Megatron")
    out(trains_line(summary))
    if summary.lora is not None:
        out(lora_line(summary.lora))
    for line in [*summary.lines, *_own_lines(s, trained)]:
        out(line)
    for key in s.sources.unread_freeze_keys:
        out(f"not read: {key} (no setting of the {checked.layout.title} layout: a run of it ignores this key)")
    if checked.layout.rates.refused is None:  # a layout that refuses per-part rates (SkyRL's) has none
        rates = s.rates.values.describe() if s.rates.values else "every part on the global schedule"
        out(f"learning rates ({s.rates.key}): {rates}")
    for note in adjusted:
        out(f"adjusted when the model is built: {note}")
    if stage is not None:
        out(stage.line)
    out("OK: valid")
    return EXIT_OK
