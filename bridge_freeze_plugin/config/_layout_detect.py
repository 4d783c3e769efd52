"""The layouts by name, and recognising the layout a config file is written in (:func:`detect`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from bridge_freeze_plugin.config._layout_bridge import BRIDGE
from bridge_freeze_plugin.config._layout_nemorl import NEMO_RL
from bridge_freeze_plugin.config._layout_sft_rl import RL, SFT
from bridge_freeze_plugin.config._layouts import Layout
from bridge_freeze_plugin.errors import ConfigLoadError
from bridge_freeze_plugin.request import FLAGS, PATTERN_KEYS

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (SFT, RL, BRIDGE, NEMO_RL)}


def get(name: str) -> Layout:
    try:
        return LAYOUTS[name]
    except KeyError:
        raise ConfigLoadError(f"unknown layout {name!r}; the layouts are {', '.join(LAYOUTS)}") from None


#: How strongly a key points at a layout: it DECIDES (no other layout has it) or is a HINT (others may).
DECIDES, HINT = 2, 1


@dataclass(frozen=True)
class Evidence:
    """What one config shows of one layout: the keys that decide it, and the hints."""

    layout: Layout
    decides: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()

    @property
    def strength(self) -> int:
        return DECIDES if self.decides else HINT if self.hints else 0

    def why(self) -> str:
        return "; ".join([*self.decides, *(f"{hint} (a hint)" if self.decides else hint for hint in self.hints)])


def _said(keys: list[str]) -> str:
    return " + ".join(f"top-level {k}" if "." not in k else k for k in keys)


def evidence(top: Mapping[str, Any]) -> dict[str, Evidence]:
    """Layout name -> what the config's keys show of it (every layout with any evidence)."""
    found: dict[str, Evidence] = {}
    for layout in LAYOUTS.values():
        deciding = [hit for m in layout.decides if (hit := m.found(top)) is not None]
        covered = {key for hit in deciding for key in hit}
        decides = [_said(hit) for hit in deciding]
        hints = [_said(hit) for m in layout.hints if (hit := m.found(top)) is not None and not set(hit) <= covered]
        if decides or hints:
            found[layout.name] = Evidence(layout, tuple(decides), tuple(hints))
    return found


def _what_decides(layout: Layout) -> str:
    keys = " or ".join(" + ".join(f"{k}:" for k in m.keys) for m in layout.decides)
    return f"{layout.title}: {keys}" if keys else layout.title


def detect(top: Mapping[str, Any], what: str) -> tuple[Layout, str]:
    """The layout ``top`` (a config's top-level mapping) is written in, and why; an error when it cannot tell.

    The strongest evidence wins: keys that decide a layout over hints. Two layouts with deciding keys (or, with
    none deciding, two with hints) are an error naming both. Evidence for another layout that lost is said in
    the reason, never silently ignored; a flag or learning rate written where the chosen layout does not read
    it is refused when the settings are read (:func:`bridge_freeze_plugin.config._reading.read_settings`).
    """
    found = evidence(top)
    names = ", ".join(LAYOUTS)
    if not found:
        raise ConfigLoadError(
            f"{what} matches no config layout (top-level keys: {', '.join(map(str, top)) or 'none'}); each layout's "
            f"deciding keys: {'; '.join(_what_decides(layout) for layout in LAYOUTS.values())}. Name it with "
            f"--layout ({names})"
        )
    best = max(e.strength for e in found.values())
    top_layouts = [e for e in found.values() if e.strength == best]
    if len(top_layouts) > 1:
        reasons = "; ".join(f"{e.layout.title}: {e.why()}" for e in top_layouts)
        raise ConfigLoadError(
            f"{what} matches several config layouts, and its evidence conflicts ({reasons}); name one with "
            f"--layout ({names}), and move or remove the keys of the other"
        )
    (chosen,) = top_layouts
    return chosen.layout, _reason(chosen, found)


def _reason(chosen: Evidence, found: Mapping[str, Evidence]) -> str:
    others = [e for e in found.values() if e.layout is not chosen.layout]
    if not others:
        return chosen.why()
    conflict = "; ".join(f"{e.why()} suggests the {e.layout.title} layout" for e in others)
    return f"{chosen.why()}; conflicting evidence, outweighed: {conflict}"


def plugin_sections() -> tuple[str, ...]:
    """Every section any layout reads the plugin's keys from (flags, patterns, learning rates, the reference's)."""
    out: list[str] = []
    for layout in LAYOUTS.values():
        for key in (*layout.homes.plugin_homes, layout.lr_section, layout.homes.reference_flags):
            if key is not None and key not in out:
                out.append(key)
    return tuple(out)


#: The plugin's own keys in a flags' section (flags and pattern keys).
PLUGIN_KEYS: tuple[str, ...] = (*FLAGS, *PATTERN_KEYS)
