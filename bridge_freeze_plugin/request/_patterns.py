"""Train / freeze patterns: regular expressions over model-wide names, applied on top of the flags.

Syntax: a Python regular expression, matched against the WHOLE name (anchored at both ends) of a parameter or
of a module it belongs to. ``vision_model.merger`` matches ``vision_model.merger.linear_fc1.weight`` (a module
name covers its parameters), ``language_model\\.decoder\\.layers\\.(2|3)`` matches every parameter of layers 2
and 3, and an exact parameter name matches that parameter. Names are the model-wide canonical names that
``bridge-freeze plan MODEL --json`` lists (global layer and expert numbers under pipeline and expert parallelism,
see :mod:`bridge_freeze_plugin.prewrap._model_names`). Every pattern is compiled when the selection is made; an
invalid one raises :class:`InvalidPatternError` naming it.

The rule, in one sentence: a parameter of a part trains if a train pattern matches it, else is frozen
if a freeze pattern matches it, else its part's flag decides. Parameters of ``other`` (and unclassified ones)
are never touched by a pattern. A pattern that matches no parameter of any part in the whole model
raises :class:`UnmatchedPatternError` listing the nearest real names (checked model-wide: under pipeline
parallelism a pattern may match on another stage only).
"""

from __future__ import annotations

import re
import time
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, field
from re import _parser as sre_parse  # type: ignore[attr-defined]
from typing import Any

import regex as regex_engine

from bridge_freeze_plugin.errors import InvalidPatternError
from bridge_freeze_plugin.request._regex_safety import backtracking_risk

TRAIN, FREEZE = "train", "freeze"
#: The rule, as the report and the docs state it.
RULE = "a train pattern trains, else a freeze pattern freezes, else the part's flag decides"
#: Wall-clock seconds one pattern may spend matching names, in all: :data:`MATCH_BUDGET_S` plus
#: :data:`MATCH_BUDGET_PER_NAME_S` per name matched (each name is matched once, its verdict kept). Past it, matching
#: stops with :class:`InvalidPatternError`. A pattern the compile-time check accepts needs microseconds per name;
#: the bound catches what that check cannot see (back-references, very long names...).
MATCH_BUDGET_S = 5.0
MATCH_BUDGET_PER_NAME_S = 0.001
#: How many names' verdicts a pattern keeps (a model has tens of thousands of parameters at most).
_VERDICTS_KEPT = 1_000_000
_REWRITE = ("Rewrite it with one repeat over a character set where it has several nested or in a row, e.g. "
            "'.*router' or '[a-z_0-9.]*router' for '([a-z_0-9]+\\.?)*router', '.*x' for '.*.*.*x', '(a|b)+' with "
            "alternatives that cannot match the same text")


class _MatchClock:
    """What one pattern has matched so far: the verdict per name, and the wall time spent matching.

    Shared by the copies of a pattern (the verdicts depend on the pattern's text alone); a pickle starts afresh.
    """

    def __init__(self) -> None:
        self.spent = 0.0
        self.verdicts: dict[str, bool] = {}

    def __copy__(self) -> _MatchClock:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _MatchClock:
        return self

    def __getstate__(self) -> dict[str, Any]:
        return {"spent": 0.0, "verdicts": {}}


@dataclass(frozen=True)
class Pattern:
    """One compiled pattern: ``kind`` is ``"train"`` or ``"freeze"``; ``text`` as the user wrote it.

    ``regex`` is the anchored pattern as Python's ``re`` compiles it; ``bounded`` the same, compiled by the
    ``regex`` module, which can stop a match after a time limit and means the same as ``re`` on ASCII text for every
    pattern :func:`compile_pattern` accepts. Names (ASCII, as every Megatron parameter name is) are matched with
    ``bounded``; a non-ASCII name with ``regex`` (the two modules define some Unicode classes differently).
    """

    kind: str
    text: str
    regex: re.Pattern[str] = field(repr=False, compare=False)
    bounded: Any = field(repr=False, compare=False)
    _clock: _MatchClock = field(default_factory=_MatchClock, repr=False, compare=False)

    def matches(self, name: str) -> bool:
        """Whether it matches ``name`` (or a module ``name`` belongs to); time-bounded: :data:`MATCH_BUDGET_S`."""
        clock = self._clock
        verdict = clock.verdicts.get(name)
        if verdict is not None:
            return verdict
        left = self._allowed() - clock.spent
        if left <= 0:
            raise self._too_slow(name)
        start = time.perf_counter()
        try:
            if name.isascii():
                verdict = self.bounded.fullmatch(name, timeout=left) is not None
            else:
                verdict = self.regex.fullmatch(name) is not None
        except TimeoutError:
            raise self._too_slow(name) from None
        finally:
            clock.spent += time.perf_counter() - start
        if len(clock.verdicts) < _VERDICTS_KEPT:
            clock.verdicts[name] = verdict
        return verdict

    def may_match_under(self, prefix: str) -> bool:
        """Whether a name under module ``prefix`` (or the module itself) could match: the pattern can train or freeze
        something there. Decided on the pattern alone (partial matching), so it errs towards "could"."""
        try:
            return self.bounded.fullmatch(prefix + ".", partial=True, timeout=MATCH_BUDGET_S) is not None
        except TimeoutError:
            raise self._too_slow(prefix) from None

    def _allowed(self) -> float:
        return MATCH_BUDGET_S + MATCH_BUDGET_PER_NAME_S * (len(self._clock.verdicts) + 1)

    def _too_slow(self, name: str) -> InvalidPatternError:
        shown = name if len(name) <= 120 else f"{name[:100]}... ({len(name)} characters)"
        return InvalidPatternError(
            f"{self.kind}_patterns entry '{self.text}' took more than {self._allowed():.3g} s matching "
            f"{len(self._clock.verdicts) + 1} parameter name(s) (stopped at '{shown}'): the ways it tries grow too "
            f"fast with a name's length (catastrophic backtracking). Matching is time-bounded: a pattern gets "
            f"{MATCH_BUDGET_S:g} s plus {MATCH_BUDGET_PER_NAME_S * 1000:g} ms per name in all, then this error. "
            f"{_REWRITE}"
        )

    def __str__(self) -> str:
        return f"{self.kind} '{self.text}'"


#: Global inline flags at the start of a pattern (``(?i)``, ``(?sx)``...).
_GLOBAL_FLAGS = re.compile(r"\(\?([aiLmsux]+)\)")
#: What verbose mode ignores between them: whitespace, and comments up to the end of a line.
_VERBOSE_SPACE = re.compile(r"(?:[ \t\n\r\v\f]+|#[^\n]*\n?)*")


def _split_global_flags(text: str) -> tuple[str, str, bool]:
    """``(flags, rest, verbose)``: the leading global flag groups of ``text`` (and what verbose mode ignores
    around them), the pattern after them, and whether the verbose flag is among them."""
    pos, verbose = 0, False
    while True:
        if verbose:
            pos = _VERBOSE_SPACE.match(text, pos).end()  # type: ignore[union-attr]
        found = _GLOBAL_FLAGS.match(text, pos)
        if found is None:
            return text[:pos], text[pos:], verbose
        verbose = verbose or "x" in found.group(1)
        pos = found.end()


def anchored(text: str) -> str:
    """``text`` matched against a whole name or a module name and what follows it (``(?:text)(?:\\..+)?``).

    Global inline flags (``(?i)``, ``(?s)``, ``(?x)``...) stay at the very start, where Python requires them; under
    ``(?x)`` a newline ends a trailing comment before the group closes.
    """
    flags, rest, verbose = _split_global_flags(text)
    end = "\n" if verbose else ""
    return f"{flags}{end}(?:{rest}{end})(?:\\..+)?"


def shown(text: str, limit: int = 120) -> str:
    """A pattern as a message quotes it: whole, or its start and length when it is very long."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _invalid(key: str, text: str, why: str) -> InvalidPatternError:
    return InvalidPatternError(
        f"{key} entry '{shown(text)}' is not a valid regular expression ({why}). Patterns are Python regular "
        f"expressions matched against whole parameter or module names: write '.*' for any text (not '*'), "
        f"e.g. 'language_model\\.decoder\\.layers\\.(2|3)' or '.*\\.router'"
    )


def compile_pattern(text: Any, kind: str) -> Pattern:
    """Compile one ``train`` / ``freeze`` pattern (anchored; a module name covers its parameters).

    Refused with :class:`InvalidPatternError`: a non-string or empty one, an invalid regex, one that matches only
    the empty name, a character set Python reads as a nested set or set operation (``[[:alpha:]]``), and one
    with a catastrophic-backtracking shape (:func:`~bridge_freeze_plugin.request._regex_safety.backtracking_risk`).
    """
    key = f"{kind}_patterns"
    if not isinstance(text, str) or not text.strip():
        raise InvalidPatternError(
            f"{key} entry {text!r} must be a non-empty string (a regular expression over parameter or module "
            f"names, e.g. 'language_model\\.decoder\\.final_layernorm'); fix or remove it"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            parsed = sre_parse.parse(text)
            re.compile(text)
    except re.error as exc:
        raise _invalid(key, text, str(exc)) from None
    except (OverflowError, RecursionError) as exc:  # a repeat count past 2**32, groups nested thousands deep
        raise _invalid(key, text, f"{type(exc).__name__}: {exc}") from None
    except FutureWarning as warning:
        raise InvalidPatternError(
            f"{key} entry '{text}' is ambiguous: {warning}. Python reads '[[', '--', '&&', '~~' and '||' inside "
            f"a character set as literal characters today and as nested sets or set operations in the future; "
            f"escape them ('\\[', '\\-', '\\&'...)"
        ) from None
    if not len(parsed):
        raise InvalidPatternError(
            f"{key} entry '{text}' has nothing to match but flags or comments, so it matches no name; "
            f"write the names to match after the flags, e.g. '(?i)language_model\\.decoder\\.final_layernorm'"
        )
    risk = backtracking_risk(text)
    if risk is not None:
        raise InvalidPatternError(
            f"{key} entry '{text}' is refused: {risk.detail}. Every pattern is checked for such shapes when it is "
            f"compiled, before any model is built (a name it does not match could keep the build busy for hours). "
            f"{_REWRITE}"
        )
    full = anchored(text)
    try:
        exact = re.compile(full)
        bounded = regex_engine.compile(full, regex_engine.VERSION0)
    except (re.error, regex_engine.error) as exc:  # not expected once re accepts the text alone; never guess
        raise _invalid(key, text, f"it cannot be matched as a whole name: {exc}") from None
    return Pattern(kind, text, exact, bounded)


def bridge_target_regex(target: str) -> str:
    """The regular expression Bridge's LoRA matches a ``target_modules`` / ``exclude_modules`` entry as: ``'^' +
    target.replace('*', '(.*)') + '$'`` (``megatron.bridge.peft.utils.wildcard_match``), nothing escaped."""
    return "^" + target.replace("*", "(.*)") + "$"


def check_lora_targets(targets: Iterable[Any], where: str = "target_modules") -> None:
    """Refuse a LoRA target Bridge's matcher would crash on or hang on, before LoRA is applied.

    Bridge matches every target against every module name as :func:`bridge_target_regex` (a regex, not only a
    wildcard), with no time bound: a target with a catastrophic-backtracking shape (``(a+)+``, ``*.*.*x``...)
    hangs the build as a pattern would. Raises :class:`InvalidPatternError` naming the entry.
    """
    for target in targets:
        if not isinstance(target, str):
            continue  # the type is the config reader's business
        text = bridge_target_regex(target)
        try:
            re.compile(text)
        except re.error as exc:
            raise InvalidPatternError(
                f"LoRA {where} entry '{target}' is not a valid target: Bridge matches it against module names as "
                f"the regular expression '{text}' ('*' becomes '(.*)'), which is invalid ({exc}); use module names "
                f"('linear_qkv') or wildcards ('vision_model.*linear_qkv')"
            ) from None
        risk = backtracking_risk(text)
        if risk is not None:
            raise InvalidPatternError(
                f"LoRA {where} entry '{target}' is refused: Bridge matches it against every module name as the "
                f"regular expression '{text}' ('*' becomes '(.*)'), with no time bound, and {risk.detail}; use "
                f"module names ('linear_qkv') or one '*' between names ('vision_model.*linear_qkv')"
            )


@dataclass(frozen=True)
class PatternSet:
    """The compiled train and freeze patterns of a selection; falsy when there are none."""

    train: tuple[Pattern, ...] = ()
    freeze: tuple[Pattern, ...] = ()

    @classmethod
    def of(cls, train: Iterable[str], freeze: Iterable[str]) -> PatternSet:
        train, freeze = tuple(train), tuple(freeze)
        both = sorted(set(train) & set(freeze))
        if both:
            raise InvalidPatternError(
                f"pattern(s) {', '.join(map(repr, both))} are in both train_patterns and freeze_patterns; a train "
                f"pattern wins ({RULE}), so the freeze entry would do nothing: remove one of them"
            )
        return cls(tuple(compile_pattern(t, TRAIN) for t in train), tuple(compile_pattern(f, FREEZE) for f in freeze))

    def __bool__(self) -> bool:
        return bool(self.train or self.freeze)

    @property
    def all(self) -> tuple[Pattern, ...]:
        """Freeze patterns, then train patterns: the order they apply in (and the order counts are kept in)."""
        return (*self.freeze, *self.train)

    def hits(self, name: str) -> tuple[int, ...]:
        """Indices (in :attr:`all`) of the patterns that match ``name``."""
        return tuple(i for i, pattern in enumerate(self.all) if pattern.matches(name))

    def decide_hits(self, hits: tuple[int, ...], flag_trains: bool) -> bool:
        """Whether a parameter trains, given which patterns match it and what its part's flag says."""
        if any(i >= len(self.freeze) for i in hits):
            return True
        return False if hits else flag_trains

    def decide(self, name: str, flag_trains: bool) -> bool:
        """THE rule: a train pattern trains, else a freeze pattern freezes, else the flag decides."""
        return self.decide_hits(self.hits(name), flag_trains)
