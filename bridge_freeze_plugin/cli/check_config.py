"""``bridge-freeze check-config``: validate a training config's freeze flags and print the effective selection."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bridge_freeze_plugin.cli._common import (
    EXIT_OK,
    add_subcommand,
    finish_subcommand,
    flags_line,
    one_line,
    out,
)
from bridge_freeze_plugin.errors import CommandError, InvalidFreezeConfigError, UnsupportedFreezeFlagError
from bridge_freeze_plugin.registry import REGISTRY
from bridge_freeze_plugin.selection import SELECTABLE_PARTS


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    check = add_subcommand(
        subparsers, "check-config",
        help="validate a training config's freeze flags and print the effective selection",
        description="Validate a training config (YAML + dotted overrides) with bridge_freeze_plugin.validation. "
                    "Exit 0 and the effective selection when valid; exit 2 and the error when not.",
        epilog="examples:\n"
               "  bridge-freeze check-config sft.yaml\n"
               "  bridge-freeze check-config sft.yaml megatron_config.freeze_vision_model=true\n"
               "  bridge-freeze check-config rl.yaml --rl trainer.policy.megatron_config.freeze_language_model=true\n"
               "  bridge-freeze check-config sft.yaml --family qwen3_vl --json\n\n"
               "The config layouts and rules are in docs/configuration.md.",
    )
    check.add_argument("file", metavar="FILE", help="the training config (YAML)")
    # default=[]: without a default, argparse (< 3.13) lists a nargs="*" positional as required in errors.
    check.add_argument("overrides", metavar="KEY=VALUE", nargs="*", default=[],
                       help="dotted overrides merged over FILE")
    check.add_argument("--rl", action="store_true", help="RL layout (trainer.strategy, trainer.policy.*)")
    check.add_argument("--family", help="the model family (name or provider class), if model.path does not tell")
    check.add_argument("--json", action="store_true", help="machine-readable output (schema: docs/cli.md)")
    finish_subcommand(check, run)
    return check


def run(args: argparse.Namespace) -> int:
    try:
        import yaml
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        from bridge_freeze_plugin import validation
    except ImportError as exc:
        raise CommandError(f"check-config needs omegaconf ({exc})") from exc

    path = Path(args.file)
    if not path.is_file():
        raise CommandError(f"no such config file: {args.file}")
    for item in args.overrides:
        key, sep, _ = item.partition("=")
        if not sep or not key.strip():
            raise CommandError(f"override {item!r} is not of the form dotted.key=value")
    try:
        cfg = validation.load_config(path, args.overrides)
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as exc:
        raise CommandError(f"cannot load {args.file}: {one_line(str(exc))}") from exc

    layout = "rl" if args.rl else "sft"
    family = None
    if args.family:
        family = REGISTRY.find(args.family)
    else:
        model_path = OmegaConf.select(cfg, "trainer.policy.model.path" if args.rl else "model.path", default=None)
        if isinstance(model_path, str):
            family = validation.family_from_model_path(model_path)
    doc: dict[str, Any] = {
        "schema_version": 1,
        "config": str(args.file),
        "layout": layout,
        "overrides": list(args.overrides),
        "family": family.name if family else None,
    }
    try:
        selection = validation.validate_config(cfg, args.rl, family=family)
    except (InvalidFreezeConfigError, UnsupportedFreezeFlagError) as exc:
        if args.json:
            out(json.dumps({**doc, "valid": False, "error": one_line(str(exc)), "selection": None,
                            "trained_parts": None, "frozen_parts": None}, indent=2, sort_keys=True))
        raise
    trained = [p.value for p in SELECTABLE_PARTS if p in selection.trained_parts()]
    frozen = [p.value for p in SELECTABLE_PARTS if p in selection.frozen_parts()]
    if args.json:
        out(json.dumps({**doc, "valid": True, "error": None, "selection": selection.as_dict(),
                        "trained_parts": trained, "frozen_parts": frozen}, indent=2, sort_keys=True))
        return EXIT_OK
    where = "trainer.policy.megatron_config" if args.rl else "megatron_config"
    extra = f" + {len(args.overrides)} override(s)" if args.overrides else ""
    out(f"config: {args.file} ({layout.upper()} layout{extra})")
    out(f"family: {family.name if family else 'unknown (pass --family NAME, or a local model path, to check rule 7)'}")
    out(f"selection ({where}): {flags_line(selection)}")
    out(f"trains: {', '.join(trained) or 'nothing but LoRA adapters'}; frozen: {', '.join(frozen) or 'nothing'}")
    out("OK: valid")
    return EXIT_OK
