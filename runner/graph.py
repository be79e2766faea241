"""The DAG: file order, `needs`, template references and earlier env steps.

Two kinds of edge:
- data edges (``deps``): `needs`, `steps.X` references in templates, and every earlier env step (for a step
  with `needs: []`, only the env steps exporting an `env.X` it reads: load.py adds them to its needs). Their
  output digests go into the fingerprint, so a changed upstream re-runs its dependents.
- order edges (``after``): a step without `needs` comes after the steps before it in the file, as in a
  script. These only order; they do not re-run anything.

An env step takes no order edges: it waits only for what its values reference and its `needs` (and earlier
env steps). Every later step depends on it, so an env step that waited on the steps before it in the file
would queue the whole rest of the pipeline behind them (the flagship's E2B settings behind the AgentENV
container's first start).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from runner.util.datatype import datatype, field


@datatype(frozen=True)
class Node:
    """What the graph needs of a step (runner/load.py makes one per step): it imports no other module."""

    name: str
    kind: str
    needs: tuple[str, ...]
    refs: frozenset[str]
    declares_needs: bool
    exports_env: bool
    independent: bool = False  # `needs: []`: no file-order edges and no earlier env steps (only its needs)


class CycleError(ValueError):
    def __init__(self, cycle: list[str]) -> None:
        super().__init__(" -> ".join([*cycle, cycle[0]]))
        self.cycle = cycle


@datatype
class Graph:
    names: list[str]
    deps: dict[str, list[str]]  # data edges
    after: dict[str, list[str]]  # data edges plus order edges: what must finish before a step starts
    dependents: dict[str, list[str]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)
    # the env steps whose exports a step sees, in file order: every earlier one, or for a `needs: []` step
    # only those it depends on (transitively)
    env_view: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def order(self) -> list[str]:
        """A topological order that keeps file order wherever the edges allow."""
        index = {n: i for i, n in enumerate(self.names)}
        remaining = {n: len(self.after[n]) for n in self.names}
        ready = [index[n] for n in self.names if remaining[n] == 0]
        heapq.heapify(ready)
        out: list[str] = []
        while ready:
            name = self.names[heapq.heappop(ready)]
            out.append(name)
            for child in self.dependents[name]:
                remaining[child] -= 1
                if remaining[child] == 0:
                    heapq.heappush(ready, index[child])
        return out

    def upstream(self, names: set[str]) -> set[str]:
        """names and everything they need (data edges), transitively."""
        seen = set(names)
        stack = list(names)
        while stack:
            for dep in self.deps[stack.pop()]:
                if dep not in seen:
                    seen.add(dep)
                    stack.append(dep)
        return seen

    def downstream(self, name: str) -> set[str]:
        """Everything that waits on name, transitively (order and data edges)."""
        seen: set[str] = set()
        stack = [name]
        while stack:
            for child in self.dependents[stack.pop()]:
                if child not in seen:
                    seen.add(child)
                    stack.append(child)
        return seen


def build_graph(steps: Sequence[Node]) -> Graph:
    """The edges of the module docstring; a dependency cycle raises CycleError."""
    names = [s.name for s in steps]
    deps: dict[str, list[str]] = {}
    after: dict[str, list[str]] = {}
    env_steps: list[str] = []
    env_view: dict[str, tuple[str, ...]] = {}
    every_env: tuple[str, ...] = ()  # one shared tuple per stretch between env steps: no copy per step
    position = {s.name: i for i, s in enumerate(steps)}
    is_env = {s.name for s in steps if s.exports_env}
    frontier: list[str] = []  # earlier steps nothing later has waited on yet
    for step in steps:
        own = [*step.needs, *sorted(step.refs)]
        if step.independent:
            data = list(dict.fromkeys(own))
            seen = {e for d in data if d in env_view for e in (*env_view[d], *([d] if d in is_env else []))}
            env_view[step.name] = tuple(sorted(seen, key=position.__getitem__))
        else:
            data = list(dict.fromkeys([*own, *env_steps]))
            env_view[step.name] = every_env
        deps[step.name] = data
        if step.declares_needs or step.exports_env:
            order = data
        else:
            order = list(dict.fromkeys([*data, *frontier]))
        after[step.name] = order
        waited = set(order)
        frontier = [n for n in frontier if n not in waited] + [step.name]
        if step.exports_env:
            env_steps.append(step.name)
            every_env = tuple(env_steps)
    dependents: dict[str, list[str]] = {n: [] for n in names}
    for name in names:
        for dep in after[name]:
            dependents[dep].append(name)
    graph = Graph(names, deps, after, dependents, {s.name: s.kind for s in steps}, env_view)
    cycle = find_cycle(graph)
    if cycle:
        raise CycleError(cycle)
    return graph


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle as a list of names, or None. Iterative DFS (deep pipelines must not recurse)."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = dict.fromkeys(graph.names, WHITE)
    for root in graph.names:
        if color[root] != WHITE:
            continue
        stack: list[tuple[str, int]] = [(root, 0)]
        path: list[str] = [root]
        color[root] = GREY
        while stack:
            node, i = stack[-1]
            edges = graph.after[node]
            if i < len(edges):
                stack[-1] = (node, i + 1)
                nxt = edges[i]
                if color[nxt] == GREY:
                    start = path.index(nxt)
                    return list(reversed(path[start:]))
                if color[nxt] == WHITE:
                    color[nxt] = GREY
                    stack.append((nxt, 0))
                    path.append(nxt)
            else:
                color[node] = BLACK
                stack.pop()
                path.pop()
    return None


def to_text(graph: Graph) -> str:
    lines = []
    kinds = graph.kinds
    for name in graph.order():
        deps = graph.deps[name]
        order_only = [d for d in graph.after[name] if d not in deps]
        parts = []
        if deps:
            parts.append("needs " + ", ".join(deps))
        if order_only:
            parts.append("after " + ", ".join(order_only))
        lines.append(f"{name} [{kinds[name]}]" + (f"  <- {'; '.join(parts)}" if parts else ""))
    return "\n".join(lines)


def to_dot(graph: Graph) -> str:
    lines = ["digraph pipeline {", "  rankdir=LR;"]
    for name in graph.names:
        lines.append(f'  "{name}";')
    for name in graph.names:
        for dep in graph.after[name]:
            style = "" if dep in graph.deps[name] else " [style=dashed]"
            lines.append(f'  "{dep}" -> "{name}"{style};')
    lines.append("}")
    return "\n".join(lines)


def to_mermaid(graph: Graph) -> str:
    lines = ["flowchart LR"]
    ids = {n: f"s{i}" for i, n in enumerate(graph.names)}
    for name in graph.names:
        lines.append(f'  {ids[name]}["{name}"]')
    for name in graph.names:
        for dep in graph.after[name]:
            arrow = "-->" if dep in graph.deps[name] else "-.->"
            lines.append(f"  {ids[dep]} {arrow} {ids[name]}")
    return "\n".join(lines)
