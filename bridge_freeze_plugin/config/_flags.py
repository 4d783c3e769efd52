"""The reading's selection stage: the flags, their aliases and the pattern keys of each home section, each key
checked (a flag that is not a boolean, a key that looks like a misspelt flag), then read as a
:class:`~bridge_freeze_plugin.request.FreezeSelection` with where it was read (:func:`read_plugin_keys`).
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from bridge_freeze_plugin.config._layout_detect import PLUGIN_KEYS
from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.config._run_settings import SelectionSources
from bridge_freeze_plugin.config._values import Sections, as_yaml, join_problems, plain
from bridge_freeze_plugin.config._yaml_overrides import brief
from bridge_freeze_plugin.errors import FreezeFlagTypeError, InvalidFreezeConfigError, InvalidPatternError
from bridge_freeze_plugin.optim import LR_KEYS, looks_like_lr_key
from bridge_freeze_plugin.request import ALIASES, FLAGS, PATTERN_KEYS, FreezeSelection

#: How close (difflib ratio, lower-cased) a key must be to a flag to be reported as a misspelling.
MISSPELLING_CUTOFF = 0.8


def _flag_problem(where: str, key: str, value: Any, known: frozenset[str] | None,
                  refused: Mapping[str, str] | None = None, any_own: bool = False) -> tuple[str, bool] | None:
    """(message, is-a-type-problem) for one key of a flags' section, or ``None`` when it is fine.

    ``known``: the section's ``freeze_*`` settings that are not the plugin's (``None``: not checked: only
    misspellings of the flags are refused); they are checked before misspellings, so Bridge's
    ``freeze_audio_model`` is never "a misspelling of freeze_vision_model". ``any_own``: every ``freeze_*`` key
    of the section is such a setting. ``refused``: names that are no setting there, with why.
    """
    if refused and key in refused:  # first: an alias may be no setting in a section (NeMo-RL's model_overrides)
        return (f"{where}.{key} {refused[key].format(section=where, key=key)}", False)
    if key in FLAGS or key in ALIASES:
        if isinstance(value, bool):
            return None
        return (
            f"{where}.{key} must be a boolean (true or false), got {as_yaml(value)!r} "
            f"({type(value).__name__}); write {where}.{key}=true or {where}.{key}=false", True,
        )
    if key in LR_KEYS or looks_like_lr_key(key):
        return None  # per-part learning rates: read and checked by optim.settings.read_part_learning_rates
    if key in PATTERN_KEYS:
        items = [value] if isinstance(value, str) else value
        if isinstance(items, (list, tuple)) and all(isinstance(i, str) for i in items):
            return None
        return (f"{where}.{key} must be a list of patterns (strings), got {as_yaml(value)!r}", False)
    if (any_own and key.startswith("freeze_")) or (known is not None and key in known):
        return None  # Bridge's or the trainer's own setting (read and said, never the plugin's)
    close = difflib.get_close_matches(key.lower(), FLAGS, n=1, cutoff=MISSPELLING_CUTOFF)
    if close:
        return (f"{where}.{key} is not a freeze flag; did you mean {where}.{close[0]}? "
                f"(the flags are {', '.join(FLAGS)})", False)
    if known is not None and key.startswith("freeze_"):
        guess = difflib.get_close_matches(key.lower(), FLAGS, n=1, cutoff=0.5)
        hint = f"did you mean {where}.{guess[0]}? " if guess else ""
        others = f"; other freeze settings here: {', '.join(sorted(known))}" if known else ""
        return (f"{where}.{key} is neither a freeze flag nor a known setting of this section; {hint}"
                f"(the flags are {', '.join(FLAGS)}{others})", False)
    return None


def read_selection(
    section: Mapping[str, Any] | None, *, where: str = "megatron_config", known: frozenset[str] | None = None
) -> FreezeSelection:
    """The selection in a ``megatron_config``-like mapping, checking every value and key.

    Values must be real booleans (YAML ``true``/``false``); ``1``, ``"yes please"`` or ``null`` are
    rejected naming the key. A key that looks like a misspelt flag (``freeze_vison_model``) is
    rejected with the closest flag. With ``known`` (a layout's other ``freeze_*`` settings), any other
    ``freeze_*`` key is rejected too. Other keys are ignored. A missing flag means ``false``.
    """
    return _selection_of(None if section is None else plain(section, where), where, known)


def read_plugin_keys(sections: Sections, layout: Layout) -> tuple[FreezeSelection, SelectionSources,
                                                                  Mapping[str, Any]]:
    """The policy's selection from the plugin keys' home sections (each checked), where it was read (the plugin
    keys, Bridge's names of a flag, the reference model's flags, read and checked too), and the flags' section."""
    homes = {key: layout.homes.home(key) for key in PLUGIN_KEYS}
    checked = {}
    for home in layout.homes.plugin_homes:
        known = layout.homes.own_keys(home)
        checked[home] = _checked_section(sections[home], home, known or frozenset(), layout.homes.refused_here(home),
                                         any_own=known is None)
    selection = _selection_from_sections(checked, {**homes, **{a: layout.homes.alias_home(a) for a in ALIASES}},
                                        saved=layout.homes.saves_every_field)
    ref = layout.homes.reference_flags
    reference = None if ref is None else _selection_of(sections[ref], ref, layout.homes.own_keys(ref) or frozenset())
    sources = SelectionSources(
        flags_key=layout.homes.flags,
        flag_keys={key: f"{home}.{key}" for key, home in homes.items() if home != layout.homes.flags},
        alias_keys={flag: tuple(f"{layout.homes.alias_home(a)}.{a}" for a, f in ALIASES.items() if f == flag)
                    for flag in FLAGS},
        aliases_written=tuple(f"{layout.homes.alias_home(a)}.{a}" for a in ALIASES
                              if a in checked.get(layout.homes.alias_home(a), {})),
        foreign_alias=layout.homes.foreign_alias,
        reference=reference,
        reference_key=ref,
    )
    return selection, sources, checked[layout.homes.flags]


def _selection_of(section: Mapping[str, Any] | None, where: str, known: frozenset[str] | None) -> FreezeSelection:
    values = _checked_section(section, where, known)
    return _selection_from_sections({where: values}, {key: where for key in PLUGIN_KEYS})


def _checked_section(section: Mapping[str, Any] | None, where: str, known: frozenset[str] | None,
                     refused: Mapping[str, str] | None = None, any_own: bool = False) -> Mapping[str, Any]:
    """``section`` (plain Python), every key checked (:func:`_flag_problem`); raises for the first problems."""
    section = {} if section is None else section
    if not isinstance(section, Mapping):
        raise InvalidFreezeConfigError(f"{where} must be a mapping of settings, got {section!r}")
    problems = [p for k, v in section.items()
                if (p := _flag_problem(where, str(k), v, known, refused, any_own)) is not None]
    if problems:
        type_only = all(is_type for _, is_type in problems)
        raise (FreezeFlagTypeError if type_only else InvalidFreezeConfigError)(join_problems([m for m, _ in problems]))
    return section


def _selection_from_sections(sections: Mapping[str, Mapping[str, Any]], homes: Mapping[str, str],
               saved: bool = False) -> FreezeSelection:
    """The selection from checked sections: each plugin key read from its home section (``homes``; an alias of a
    flag from its own home when ``homes`` names one, else its flag's).

    ``saved``: the sections are a provider as Bridge saved it (``run_config.yaml``: every field written), so a flag
    and its alias that disagree are read as the build reads such a provider: the part is frozen if either is true
    (a build before the plugin wrote the merged value back saved the alias true and the flag false)."""
    flags = {key: sections[homes[key]][key] for key in FLAGS if key in sections.get(homes[key], {})}
    for alias, flag in ALIASES.items():  # Bridge's own name of a flag (freeze_sound_encoder): read as the flag
        where = homes.get(alias, homes[flag])
        home = sections.get(where, {})
        if alias not in home:
            continue
        if flag in flags and flags[flag] != home[alias]:
            if saved:  # every field saved (Bridge's run_config.yaml): the build froze the part if either is true
                flags[flag] = True
                continue
            raise InvalidFreezeConfigError(
                f"{where}.{alias}={as_yaml(home[alias])} and {homes[flag]}.{flag}={as_yaml(flags[flag])} "
                f"disagree: {alias} is Bridge's name of {flag} (the same part). Write one of them.")
        flags[flag] = home[alias]
    patterns = {key: [value] if isinstance(value, str) else list(value) for key in PATTERN_KEYS
                if (value := sections.get(homes[key], {}).get(key)) is not None}
    where = ", ".join(dict.fromkeys(homes[key] for key in PATTERN_KEYS if patterns.get(key))) or homes[FLAGS[0]]
    try:  # an invalid pattern fails here, naming the key, before any build
        return FreezeSelection(**flags, **patterns)
    except InvalidFreezeConfigError as exc:
        raise type(exc)(f"{where}: {exc}") from None
    except (OverflowError, RecursionError) as exc:
        # Python's regex compiler raises these, not re.error, for a repetition count above 4294967295 or
        # groups nested a few hundred deep: still the user's pattern, so still a config error naming it.
        raise InvalidPatternError(
            f"{where}: a pattern in {', '.join(k for k in PATTERN_KEYS if patterns.get(k))} cannot be compiled "
            f"({type(exc).__name__}: {brief(exc)}): a repetition count above 4294967295 or groups nested hundreds "
            "deep; simplify it"
        ) from None
