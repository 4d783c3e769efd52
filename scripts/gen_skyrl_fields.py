#!/usr/bin/env python
"""Write the listing of SkyRL's config classes that check-config reads when ``skyrl`` is not importable.

One command, with the SkyRL release to list importable (e.g. ``pip install --no-deps skyrl==0.4.0 skyrl-gym==0.4.0
loguru cloudpathlib``, as requirements/skyrl-tests.txt installs it)::

    python scripts/gen_skyrl_fields.py            # -> bridge_freeze_plugin/config/skyrl_fields.json
    python scripts/gen_skyrl_fields.py --out F    # the SkyRL you run (a fork): BRIDGE_FREEZE_SKYRL_FIELDS=F

The listing holds the release's version, the root classes (``SkyRLTrainConfig`` for RL, ``SFTConfig`` for SFT) and,
for every section class below them, its fields (a field's section class, or null for a value or a free mapping).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bridge_freeze_plugin.config._skyrl_fields import COMMITTED, from_installed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=COMMITTED, help=f"where to write it (default: {COMMITTED})")
    args = parser.parse_args()
    listing, why = from_installed()
    if listing is None:
        sys.stderr.write(f"gen_skyrl_fields: skyrl is not importable: {why}\n")
        return 1
    data = {"generated_by": "scripts/gen_skyrl_fields.py", **listing.as_json()}
    args.out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    sys.stdout.write(f"gen_skyrl_fields: skyrl {listing.version}: {len(listing.classes)} classes -> {args.out}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
