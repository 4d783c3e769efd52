"""The characters an atom of a parsed regular expression matches, as a bit mask over ASCII plus one "other" bit.

Parameter names are ASCII, so ASCII is compared exactly; any non-ASCII character counts as one symbol that every
set containing some non-ASCII character matches, so the backtracking check
(:mod:`bridge_freeze_plugin.request._regex_safety`) errs towards refusing.
"""

from __future__ import annotations

import re
from re import _constants as sre  # type: ignore[attr-defined]

_ASCII = 128
#: The bit that stands for "some non-ASCII character".
_OTHER = 1 << _ASCII
#: Every character: what an atom matches when it may match anything.
ALL = (1 << (_ASCII + 1)) - 1


def _table(pattern: str) -> int:
    rx = re.compile(pattern)
    return sum(1 << c for c in range(_ASCII) if rx.fullmatch(chr(c)))


_CATEGORIES = {
    sre.CATEGORY_DIGIT: _table(r"\d"),
    sre.CATEGORY_NOT_DIGIT: _table(r"\D"),
    sre.CATEGORY_SPACE: _table(r"\s"),
    sre.CATEGORY_NOT_SPACE: _table(r"\S"),
    sre.CATEGORY_WORD: _table(r"\w"),
    sre.CATEGORY_NOT_WORD: _table(r"\W"),
}
_LETTERS = _table(r"[A-Za-z]")


def _fold(mask: int) -> int:
    """Add the other case of every ASCII letter in ``mask`` (IGNORECASE); a non-ASCII bit may fold to any letter."""
    out = mask
    for c in range(ord("A"), ord("Z") + 1):
        if mask & (1 << c) or mask & (1 << (c + 32)):
            out |= (1 << c) | (1 << (c + 32))
    if mask & _OTHER:
        out |= _LETTERS  # e.g. the Kelvin sign matches 'k' under IGNORECASE
    return out


def _char(code: int) -> int:
    return 1 << code if code < _ASCII else _OTHER


def _set_mask(items: list[tuple[object, object]], ignorecase: bool) -> int:
    mask, negate = 0, False
    for op, av in items:
        if op is sre.NEGATE:
            negate = True
        elif op is sre.LITERAL:
            mask |= _char(av)  # type: ignore[arg-type]
        elif op is sre.RANGE:
            lo, hi = av  # type: ignore[misc]
            mask |= sum(1 << c for c in range(lo, min(hi, _ASCII - 1) + 1)) if lo < _ASCII else 0
            if hi >= _ASCII:
                mask |= _OTHER
        elif op is sre.CATEGORY:
            mask |= _CATEGORIES.get(av, ALL) | _OTHER
        else:  # an opcode this table does not know: assume it matches anything (errs towards refusing)
            mask |= ALL
    if ignorecase:
        mask = _fold(mask)
    if negate:
        mask = (~mask & (ALL ^ _OTHER)) | _OTHER
    return mask


def atom_mask(op: object, av: object, flags: int) -> int:
    ignorecase = bool(flags & sre.SRE_FLAG_IGNORECASE)
    if op is sre.LITERAL:
        mask = _char(av)  # type: ignore[arg-type]
        return _fold(mask) if ignorecase else mask
    if op is sre.NOT_LITERAL:
        return ALL  # everything but one character: overlaps with any set that matters
    if op is sre.ANY:
        return ALL
    if op is sre.IN:
        return _set_mask(av, ignorecase)  # type: ignore[arg-type]
    return ALL
