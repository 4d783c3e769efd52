"""The request: what a user asks to train or freeze, before any model or family is involved.

- :mod:`._audit_settings`: what the run-time audit is asked (steps, strict), from the provider and the environment;
- :mod:`._parts`: the vocabulary of parts (one table; flags, learning-rate keys, labels and aliases derive from it);
- :mod:`._selection`: :class:`FreezeSelection`, one boolean per part plus optional patterns;
- :mod:`._patterns`: train / freeze patterns (regular expressions over model-wide names) and their checks;
- :mod:`._pattern_summary`: what the patterns matched and changed in a model; the error for one that matched nothing;
- :mod:`._regex_safety`: the catastrophic-backtracking check every pattern passes before it is used, with
  :mod:`._regex_charsets` (the characters an atom matches) and :mod:`._components` (strongly connected components).

Imports nothing from the package but ``errors``: every other folder may import it.
"""

from bridge_freeze_plugin.request._audit_settings import (
    DEFAULT_STEPS,
    ENV_STEPS,
    ENV_STRICT,
    AuditSettings,
    audit_settings,
)
from bridge_freeze_plugin.request._parts import (
    ALIASES,
    BY_NAME,
    FLAG_PARTS,
    FLAGS,
    INFO,
    OTHER,
    REQUIRED_PARTS,
    SELECTABLE_PARTS,
    VOCABULARY,
    Part,
    PartInfo,
    in_order,
    label,
    spoken,
)
from bridge_freeze_plugin.request._pattern_summary import PatternSummary, PatternTally, check_matched, summary_lines
from bridge_freeze_plugin.request._patterns import RULE, Pattern, PatternSet, check_lora_targets, compile_pattern
from bridge_freeze_plugin.request._regex_safety import backtracking_risk
from bridge_freeze_plugin.request._selection import (
    PATTERN_KEYS,
    FreezeSelection,
    asked_text,
    pattern_tuple,
    type_name,
    use_family_source,
)

__all__ = [
    "ALIASES",
    "BY_NAME",
    "DEFAULT_STEPS",
    "ENV_STEPS",
    "ENV_STRICT",
    "FLAGS",
    "FLAG_PARTS",
    "INFO",
    "OTHER",
    "PATTERN_KEYS",
    "REQUIRED_PARTS",
    "RULE",
    "SELECTABLE_PARTS",
    "VOCABULARY",
    "AuditSettings",
    "FreezeSelection",
    "Part",
    "PartInfo",
    "Pattern",
    "PatternSet",
    "PatternSummary",
    "PatternTally",
    "asked_text",
    "audit_settings",
    "backtracking_risk",
    "check_lora_targets",
    "check_matched",
    "compile_pattern",
    "in_order",
    "label",
    "pattern_tuple",
    "spoken",
    "summary_lines",
    "type_name",
    "use_family_source",
]
