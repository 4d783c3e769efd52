"""``bridge-freeze families``: the registered families, their provider classes and part prefixes."""

from __future__ import annotations

import argparse
import json
from typing import Any

from bridge_freeze_plugin.cli._common import EXIT_OK, add_subcommand, finish_subcommand, out
from bridge_freeze_plugin.registry import list_families
from bridge_freeze_plugin.request import SELECTABLE_PARTS, Part


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = add_subcommand(
        subparsers, "families", help="list the registered VLM families",
        epilog="examples:\n  bridge-freeze families\n  bridge-freeze families --json | jq '.families[].name'",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    finish_subcommand(parser, run)
    return parser


def run(args: argparse.Namespace) -> int:
    families = list_families()
    if args.json:
        out(json.dumps({"families": [f.as_dict() for f in families]}, indent=2, sort_keys=True))
        return EXIT_OK
    for spec in families:
        out(f"{spec.name}  [{spec.source}]  {spec.description}")
        for path in spec.providers:
            out(f"    provider           {path}")
        for part in (*SELECTABLE_PARTS, Part.OTHER):
            prefixes = spec.prefixes(part)
            if prefixes:
                out(f"    {part.value:<18} {', '.join(prefixes)}")
    return EXIT_OK
