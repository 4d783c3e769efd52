"""Built-in family tables: one :class:`~bridge_freeze_plugin.registry.FamilySpec` per VLM family.

Each module here holds data only (``FAMILIES``: a list of specs). Importing this package
registers them all in :data:`bridge_freeze_plugin.registry.REGISTRY`, once.

Prefixes name modules as a pre-wrap hook sees them on a bare model chunk (no ``module.``).
Each table covers its whole model: a parameter the table does not cover makes a freeze fail
loudly (``UnclassifiedParameterError``) rather than train or freeze by accident.
"""

from __future__ import annotations

from bridge_freeze_plugin.families import ernie, exaone, gemma, glm, kimi, minimax, mistral, nemotron, qwen, stepfun
from bridge_freeze_plugin.registry import REGISTRY, FamilySpec

BUILTIN_FAMILIES: tuple[FamilySpec, ...] = (
    *qwen.FAMILIES,
    *glm.FAMILIES,
    *kimi.FAMILIES,
    *gemma.FAMILIES,
    *nemotron.FAMILIES,
    *ernie.FAMILIES,
    *mistral.FAMILIES,
    *minimax.FAMILIES,
    *stepfun.FAMILIES,
    *exaone.FAMILIES,
)

for _spec in BUILTIN_FAMILIES:
    if _spec.name not in REGISTRY:
        REGISTRY.register(_spec)
