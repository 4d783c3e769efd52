"""Catastrophic-backtracking shapes of a regular expression, found before it is ever matched against a name.

A backtracking engine (Python's ``re``, the ``regex`` module) tries, before it gives up on a name, every way the
pattern could match it. Two shapes make the number of ways explode with the length of the name:

- **exponential**: a repeated part that can match the same text in two different ways. Nested quantifiers
  (``(a+)+``, ``(a*)*``, ``(.*)*x``, ``(\\w+\\s?)*``, ``([a-z_0-9]+\\.?)*router``, ``(a{1,5})+``) and
  alternatives that overlap under a repeat (``(a|aa)+``, ``(a|a)*``, ``(\\w|_)+``): 2^n ways on an n-character
  name, so a 60-character name that does not match never finishes;
- **polynomial of high degree**: three or more unbounded repeats in a row that can match the same characters
  (``.*.*.*x``, ``\\w*\\w*\\w*``, ``(.*)(.*)(.*)x``): n^3 ways and more.

:func:`backtracking_risk` finds them on the pattern alone. It builds the pattern's position automaton (one state
per character-matching atom; an edge from one atom to the next it may be followed by, counted once per distinct way
the pattern's structure allows that step, capped at 2), then:

- exponential: in the product of the automaton with itself (two runs over the same text), a cycle through a
  diagonal state ``(p, p)`` that is not the diagonal path itself means a loop that can be run in two different ways
  on the same text, each run of the loop doubling the ways (the classic criterion for exponential ambiguity);
- polynomial: a chain of three or more self-repeating atoms, each followed directly by the next, whose characters
  overlap.

Character sets are compared over ASCII exactly (parameter names are ASCII); any non-ASCII character counts as one
symbol that every set containing some non-ASCII character matches, so the check errs towards refusing. Counted
repeats up to :data:`EXPANDED_REPEAT` copies are written out; larger ones are treated as unbounded (``(a{1,9}){1,9}``
has a bounded, but astronomically large, number of ways). Lookaround bodies are checked too (they backtrack the same
way); a back-reference counts as an unbounded run of any character.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parse  # type: ignore[attr-defined]

from bridge_freeze_plugin.request._components import strong_components
from bridge_freeze_plugin.request._regex_charsets import ALL, atom_mask

#: Counted repeats with at most this many copies are written out; above, the repeat counts as unbounded.
EXPANDED_REPEAT = 4
#: Three or more overlapping unbounded repeats in a row are refused (n^3 ways on an n-character name).
MAX_ADJACENT_REPEATS = 2
#: Above this many states of the pair automaton the exponential check gives up (and reports nothing).
MAX_PAIR_STATES = 400_000

_MANY = 2
#: The characters of parameter names; a single atom matching at least :data:`_BROAD` of them is "broad": it can be
#: crossed almost anywhere in a name, like a repeat.
_NAME_CHARS = sum(1 << ord(c) for c in "abcdefghijklmnopqrstuvwxyz0123456789_.")
_BROAD = 19

EXPONENTIAL = "exponential"
POLYNOMIAL = "polynomial"


def _add(into: dict[int, int], more: dict[int, int], times: int = 1) -> dict[int, int]:
    if times:
        for pos, count in more.items():
            into[pos] = min(_MANY, into.get(pos, 0) + count * times)
    return into


@dataclass
class _Fragment:
    """A sub-expression: in how many ways it matches the empty text, its first and last atoms (with multiplicity)."""

    empty: int = 1
    first: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)


class _Automaton:
    """The position automaton of one parsed pattern, edges counted by the distinct ways of taking them."""

    def __init__(self) -> None:
        self.masks: list[int] = []
        self.follow: list[dict[int, int]] = []

    # -- construction ------------------------------------------------------------------------------------------
    def atom(self, mask: int) -> _Fragment:
        self.masks.append(mask)
        self.follow.append({})
        pos = len(self.masks) - 1
        return _Fragment(0, {pos: 1}, {pos: 1})

    def link(self, last: dict[int, int], first: dict[int, int]) -> None:
        for p, m in last.items():
            row = self.follow[p]
            for q, n in first.items():
                row[q] = min(_MANY, row.get(q, 0) + m * n)

    def concat(self, a: _Fragment, b: _Fragment) -> _Fragment:
        self.link(a.last, b.first)
        return _Fragment(
            min(_MANY, a.empty * b.empty),
            _add(dict(a.first), b.first, a.empty),
            _add(dict(b.last), a.last, b.empty),
        )

    @staticmethod
    def alt(parts: list[_Fragment]) -> _Fragment:
        out = _Fragment(0)
        for f in parts:
            out.empty = min(_MANY, out.empty + f.empty)
            _add(out.first, f.first)
            _add(out.last, f.last)
        return out

    def loop(self, body: _Fragment, at_least_once: bool) -> _Fragment:
        # Another iteration may follow the last atom of one; an iteration that matched nothing ends the loop.
        self.link(body.last, body.first)
        return _Fragment(body.empty if at_least_once else 1, dict(body.first), dict(body.last))

    def sequence(self, items: list[tuple[object, object]], flags: int) -> _Fragment:
        frag = _Fragment()
        for op, av in items:
            frag = self.concat(frag, self.item(op, av, flags))
        return frag

    def item(self, op: object, av: object, flags: int) -> _Fragment:
        if op in (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN):
            return self.atom(atom_mask(op, av, flags))
        if op is sre.SUBPATTERN:
            _group, add, remove, sub = av  # type: ignore[misc]
            return self.sequence(sub, (flags | add) & ~remove)
        if op is sre.BRANCH:
            return self.alt([self.sequence(sub, flags) for sub in av[1]])  # type: ignore[index]
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            lo, hi, sub = av  # type: ignore[misc]
            return self.repeat(lo, hi, sub, flags)
        if op is sre.ATOMIC_GROUP:
            return self.sequence(av, flags)  # type: ignore[arg-type]
        if op in (sre.ASSERT, sre.ASSERT_NOT):
            self.sequence(av[1], flags)  # type: ignore[index]  # its own atoms: checked, not connected
            return _Fragment()
        if op is sre.GROUPREF:
            return self.loop(self.atom(ALL), at_least_once=False)
        if op is sre.GROUPREF_EXISTS:
            _group, yes, no = av  # type: ignore[misc]
            return self.alt([self.sequence(yes, flags), self.sequence(no, flags) if no else _Fragment()])
        if op is sre.AT:
            return _Fragment()
        return self.loop(self.atom(ALL), at_least_once=False)  # unknown: as '.*' (errs towards refusing)

    def repeat(self, lo: int, hi: int, sub: list[tuple[object, object]], flags: int) -> _Fragment:
        if hi == 0:
            return _Fragment()
        if hi > EXPANDED_REPEAT:  # (MAXREPEAT, the bound of '*' and '+', is above it)
            return self.loop(self.sequence(sub, flags), at_least_once=lo > 0)
        frag = _Fragment()
        for _ in range(lo):
            frag = self.concat(frag, self.sequence(sub, flags))
        optional = _Fragment()
        for _ in range(hi - lo):  # x{0,3} = (x(x(x)?)?)?
            optional = self.alt([self.concat(self.sequence(sub, flags), optional), _Fragment()])
        return self.concat(frag, optional)

    # -- checks ------------------------------------------------------------------------------------------------
    def exponential(self) -> bool:
        """A loop that two runs over the same text can take in two different ways (see the module docstring)."""
        edges = [[(q, m, self.masks[q]) for q, m in row.items()] for row in self.follow]
        # Pair states reachable from the diagonal, and their edges (an edge is "diverging" if it leaves the diagonal
        # or takes two distinct parallel ways along it).
        index: dict[tuple[int, int], int] = {}
        succ: list[list[int]] = []
        diagonal: list[bool] = []
        diverge: list[tuple[int, int]] = []
        stack = []
        for p in range(len(self.masks)):
            if self.follow[p]:
                index[(p, p)] = len(succ)
                succ.append([])
                diagonal.append(True)
                stack.append((p, p))
        while stack:
            p1, p2 = stack.pop()
            here = index[(p1, p2)]
            for q1, m1, k1 in edges[p1]:
                for q2, m2, k2 in edges[p2]:
                    if not k1 & k2:
                        continue
                    node = (q1, q2)
                    there = index.get(node)
                    if there is None:
                        if len(index) >= MAX_PAIR_STATES:
                            return False
                        there = index[node] = len(succ)
                        succ.append([])
                        diagonal.append(q1 == q2)
                        stack.append(node)
                    succ[here].append(there)
                    if q1 != q2 or (p1 == p2 and m1 >= _MANY and m2 >= _MANY):
                        diverge.append((here, there))
        component = strong_components(succ)
        has_diagonal = {component[i] for i, d in enumerate(diagonal) if d}
        return any(component[a] == component[b] and component[a] in has_diagonal for a, b in diverge)

    def adjacent_repeats(self) -> int:
        """The longest chain of self-repeating atoms with overlapping sets, each followed by the next directly or
        through single atoms that match most characters of a name (``.*.*``, ``(.*).(.*)``, ``\\w*[a-z]\\w*``):
        every such step multiplies the ways by the name's length. A literal in between (``.*attn.*qkv``) does not
        count: it can only be crossed where it occurs."""
        looping = [p for p, row in enumerate(self.follow) if p in row]
        component = strong_components([list(self.follow[p]) for p in range(len(self.masks))])
        nxt = {p: [q for q in self._reach(p) if component[q] != component[p]] for p in looping}
        memo: dict[int, int] = {}

        def longest(p: int, depth: int = 0) -> int:
            if p in memo:
                return memo[p]
            if depth > len(self.masks):
                return 1
            best = 1 + max((longest(q, depth + 1) for q in nxt[p]), default=0)
            memo[p] = best
            return best

        return max((longest(p) for p in looping), default=0)

    def _reach(self, start: int) -> set[int]:
        """Self-repeating atoms after ``start`` whose set overlaps its own, directly or through broad single atoms."""
        out: set[int] = set()
        seen = {start}
        frontier = [start]
        while frontier:
            nxt = []
            for p in frontier:
                for q in self.follow[p]:
                    if q in seen or not self.masks[q] & self.masks[start]:
                        continue
                    seen.add(q)
                    if q in self.follow[q]:
                        out.add(q)
                    elif bin(self.masks[q] & _NAME_CHARS).count("1") >= _BROAD:
                        nxt.append(q)
            frontier = nxt
        return out




@dataclass(frozen=True)
class BacktrackingRisk:
    """Why a pattern is refused: ``kind`` is :data:`EXPONENTIAL` or :data:`POLYNOMIAL`; ``detail`` says which shape."""

    kind: str
    detail: str


def backtracking_risk(text: str, flags: int = 0) -> BacktrackingRisk | None:
    """The catastrophic-backtracking shape of ``text`` (a valid Python regex), or ``None`` when it has none."""
    parsed = sre_parse.parse(text, flags)
    automaton = _Automaton()
    automaton.sequence(list(parsed), parsed.state.flags)
    if automaton.exponential():
        return BacktrackingRisk(
            EXPONENTIAL,
            "a repeated part can match the same text in more than one way (nested quantifiers such as '(a+)+', "
            "'(a*)*', '(.*)*x', '(\\w+\\s?)*', or overlapping alternatives under a repeat such as '(a|aa)+'), so "
            "the ways to try double with every character of a name that does not match",
        )
    chain = automaton.adjacent_repeats()
    if chain > MAX_ADJACENT_REPEATS:
        return BacktrackingRisk(
            POLYNOMIAL,
            f"{chain} unbounded repeats in a row can match the same characters (such as '.*.*.*'), so the ways to "
            f"try grow as the name's length to the power {chain}",
        )
    return None
