"""Strongly connected components of a directed graph, for the backtracking check's automata
(:mod:`bridge_freeze_plugin.request._regex_safety`)."""

from __future__ import annotations

from collections.abc import Iterator


def strong_components(succ: list[list[int]]) -> list[int]:
    """Strongly connected components (iterative Tarjan): the component number of every node."""
    n = len(succ)
    order = [-1] * n
    low = [0] * n
    comp = [-1] * n
    on_stack = [False] * n
    stack: list[int] = []
    counter = 0
    ncomp = 0
    for root in range(n):
        if order[root] != -1:
            continue
        work: list[tuple[int, Iterator[int]]] = [(root, iter(succ[root]))]
        order[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack[root] = True
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if order[nxt] == -1:
                    order[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack[nxt] = True
                    work.append((nxt, iter(succ[nxt])))
                    advanced = True
                    break
                if on_stack[nxt]:
                    low[node] = min(low[node], order[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == order[node]:
                while True:
                    member = stack.pop()
                    on_stack[member] = False
                    comp[member] = ncomp
                    if member == node:
                        break
                ncomp += 1
    return comp
