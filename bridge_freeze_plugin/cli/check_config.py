"""``bridge-freeze check-config``: a training config as the run would see it, checked before any model is built.

The config is the file (optional: the trainer's normal form is a command line over its defaults), its
Hydra defaults list, the layout's defaults and the overrides (``key=v``, ``+key=v``, ``++key=v``,
``~key``); the layout is detected from it (``--layout`` / ``--rl`` force one, and must agree). Every
applied override is echoed, and every setting the rules read is listed with where it came from.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.cli._common import EXIT_OK, add_subcommand, finish_subcommand, flags_line, one_line, out
from bridge_freeze_plugin.config.layouts import LAYOUTS
from bridge_freeze_plugin.errors import CommandError, InvalidFreezeConfigError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.selection import FLAGS, SELECTABLE_PARTS, FreezeSelection

_OPERATIONS = {"set": "sets", "add": "adds", "force": "adds or sets", "delete": "deletes"}


def _file_and_overrides(file: str | None, overrides: list[str]) -> tuple[str | None, list[str]]:
    """FILE is optional: a first argument written as an override (``key=value``, ``+key...``, ``~key``) is one."""
    if file is None or Path(file).exists() or not ("=" in file or file.startswith(("+", "~"))):
        return file, list(overrides)
    return None, [file, *overrides]


def _layout_option(args: argparse.Namespace) -> str | None:
    if args.rl and args.layout not in (None, "rl"):
        raise CommandError(f"--rl and --layout {args.layout} disagree: give one of them")
    return "rl" if args.rl else args.layout


def _settings(checked: Any) -> list[tuple[str, Any, str]]:
    """(key, value, source) of every setting the rules read, the flags first."""
    s, loaded = checked.settings, checked.loaded
    rows = [(f"{s.flags_key}.{flag}", getattr(s.selection, flag), loaded.source(f"{s.flags_key}.{flag}"))
            for flag in FLAGS]
    others = [s.strategy, s.language_model_only, s.lora_rank, *s.recompute, s.provider_target,
              *(peer for _, peer in s.peers)]
    rows += [(o.key, o.value, o.source) for o in others if o is not None and o.key is not None]
    return rows


def _family_line(checked: Any) -> str:
    s = checked.settings
    if s.family is not None:
        return f"{s.family.name} (from {s.family_source})"
    return "unknown (pass --family NAME, or a local model path, to see the full-recompute adjustment now)"


def _doc(args: argparse.Namespace, checked: Any, file: str | None, overrides: list[str]) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "config": file,
        "layout": checked.layout.name,
        "layout_reason": checked.loaded.layout_reason,
        "overrides": overrides,
        "composed": list(checked.loaded.composed),
        "layout_defaults": list(checked.loaded.defaulted),
        "family": checked.settings.family.name if checked.settings.family else None,
        "settings": {key: {"value": value, "source": source} for key, value, source in _settings(checked)},
    }


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
    out("settings read:")
    for key, value, source in _settings(checked):
        out(f"  {key} = {json.dumps(value) if not isinstance(value, str) else value}  ({source})")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    check = add_subcommand(
        subparsers, "check-config",
        help="validate a training config's freeze flags and print the effective selection",
        description="Validate a training config as the run would see it: the YAML file (optional), its Hydra "
                    "defaults list, the layout's defaults and the overrides (key=v, +key=v, ++key=v, ~key). "
                    "The layout (SFT, RL, or Megatron-Bridge's ConfigContainer) is detected from the config. "
                    "Exit 0 and the effective selection when valid; exit 2 and the error when not.",
        epilog="examples:\n"
               "  bridge-freeze check-config sft.yaml\n"
               "  bridge-freeze check-config sft.yaml megatron_config.freeze_vision_model=true\n"
               "  bridge-freeze check-config megatron_config.freeze_vision_model=true      (no file: SFT defaults)\n"
               "  bridge-freeze check-config ppo_base.yaml +trainer.policy.megatron_config.freeze_vision_model=true\n"
               "  bridge-freeze check-config ckpt/run_config.yaml model.freeze_vision_model=True\n"
               "  bridge-freeze check-config sft.yaml --family qwen3_vl --json\n\n"
               "The config layouts and rules are in docs/configuration.md.",
    )
    check.add_argument("file", metavar="FILE",
                       help="the training config (YAML); may be left out: then the first argument is an override")
    # default=[]: without a default, argparse (< 3.13) lists a nargs="*" positional as required in errors.
    check.add_argument("overrides", metavar="KEY=VALUE", nargs="*", default=[],
                       help="overrides applied over FILE: key=value, +key=value (add), ++key=value, ~key (delete)")
    check.add_argument("--layout", choices=sorted(LAYOUTS), help="the config layout, if it is not detected")
    check.add_argument("--rl", action="store_true", help="the RL layout (as --layout rl)")
    check.add_argument("--family", help="the model family (name or provider class), if the config does not tell")
    check.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    finish_subcommand(check, run)
    return check


def run(args: argparse.Namespace) -> int:
    from bridge_freeze_plugin import validation

    file, overrides = _file_and_overrides(args.file, list(args.overrides))
    checked = validation.load_run(file, overrides, layout=_layout_option(args), family=args.family)
    doc = _doc(args, checked, file, overrides)
    if not args.json:
        _print_header(checked, file, overrides)
    try:
        selection = checked.validate()
    except (InvalidFreezeConfigError, UnsupportedFreezeFlagError) as exc:
        if args.json:
            out(json.dumps({**doc, "valid": False, "error": one_line(str(exc)), "selection": None,
                             "trained_parts": None, "frozen_parts": None, "adjustments": None},
                            indent=2, sort_keys=True, default=str))
        raise
    return _print_valid(args, doc, checked, selection)


def _print_valid(args: argparse.Namespace, doc: dict[str, Any], checked: Any, selection: FreezeSelection) -> int:
    trained = [p.value for p in SELECTABLE_PARTS if p in selection.trained_parts()]
    frozen = [p.value for p in SELECTABLE_PARTS if p in selection.frozen_parts()]
    adjusted = checked.adjustments()
    if args.json:
        out(json.dumps({**doc, "valid": True, "error": None, "selection": selection.as_dict(),
                         "trained_parts": trained, "frozen_parts": frozen, "adjustments": adjusted},
                        indent=2, sort_keys=True, default=str))
        return EXIT_OK
    out(f"selection ({checked.settings.flags_key}): {flags_line(selection)}")
    out(f"trains: {', '.join(trained) or 'nothing but LoRA adapters'}; frozen: {', '.join(frozen) or 'nothing'}")
    for note in adjusted:
        out(f"adjusted when the model is built: {note}")
    out("OK: valid")
    return EXIT_OK
