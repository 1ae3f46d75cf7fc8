"""The trainer-side dataflow graph (docs/architecture.md §7): model function calls and their dependencies.

    Pipeline("ppo").add_node("actor_inf", ModelCall("inference", {"model": "actor"}))
                   .add_node("actor_train", ModelCall("train_step"), deps=["actor_inf"])

`order()` is a topological order (Kahn's algorithm, ties kept in insertion order); an unknown
dependency, a duplicate name or a cycle is an error naming the node. The master runs the nodes
in that order, each as one request to every model worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence


class PipelineError(ValueError):
    pass


@dataclass(frozen=True)
class ModelCall:
    """A request to every model worker: handler name and its data."""

    handler: str
    data: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Node:
    name: str
    call: ModelCall
    deps: List[str]


class Pipeline:
    def __init__(self, name: str):
        self.name = name
        self._nodes: Dict[str, Node] = {}

    def add_node(self, name: str, call: ModelCall, deps: Sequence[str] = ()) -> "Pipeline":
        if not name:
            raise PipelineError(f"pipeline {self.name!r}: a node needs a non-empty name")
        if name in self._nodes:
            raise PipelineError(f"pipeline {self.name!r}: node {name!r} is declared twice")
        if isinstance(deps, str):
            raise PipelineError(f"pipeline {self.name!r}: deps of node {name!r} must be a list of names, got a string")
        self._nodes[name] = Node(name, call, list(deps))
        return self

    @property
    def nodes(self) -> List[Node]:
        return list(self._nodes.values())

    def order(self) -> List[Node]:
        for node in self._nodes.values():
            for dep in node.deps:
                if dep not in self._nodes:
                    raise PipelineError(f"pipeline {self.name!r}: node {node.name!r} depends on unknown node {dep!r}")
        indegree = {n: len(set(node.deps)) for n, node in self._nodes.items()}
        done: List[Node] = []
        ready = [n for n, d in indegree.items() if d == 0]
        while ready:
            current = ready.pop(0)
            done.append(self._nodes[current])
            for node in self._nodes.values():
                if current in node.deps:
                    indegree[node.name] -= 1
                    if indegree[node.name] == 0:
                        ready.append(node.name)
        if len(done) < len(self._nodes):
            raise PipelineError(f"pipeline {self.name!r}: dependency cycle through {self._find_cycle()}")
        return done

    def _find_cycle(self) -> str:
        """One cycle as `a -> b -> a` (only called when one exists)."""
        state: Dict[str, int] = {}  # 1: on the current path, 2: finished

        def visit(name: str, path: List[str]) -> Optional[List[str]]:
            state[name] = 1
            for dep in self._nodes[name].deps:
                if state.get(dep) == 1:
                    return path[path.index(dep):] + [dep] if dep in path else [name, dep]
                if state.get(dep) is None:
                    found = visit(dep, path + [dep])
                    if found:
                        return found
            state[name] = 2
            return None

        for name in self._nodes:
            if state.get(name) is None:
                found = visit(name, [name])
                if found:
                    # Found by walking dependencies: print it in execution direction.
                    return " -> ".join(reversed(found))
        return "?"


def ppo_pipeline(recompute_logprob: bool, use_ref: bool) -> Pipeline:
    """The built-in PPO/GRPO graph: [actor_inf] → [ref_inf] → actor_train.

    `actor_inf` recomputes the proximal log-probs (needed by the decoupled loss or by
    `recompute_logprob`); `ref_inf` runs only when a reference model is loaded (kl_ctl > 0).
    """
    p = Pipeline("ppo")
    train_deps = []
    if recompute_logprob:
        p.add_node("actor_inf", ModelCall("inference", {"model": "actor"}))
        train_deps.append("actor_inf")
    if use_ref:
        p.add_node("ref_inf", ModelCall("inference", {"model": "ref"}), deps=list(train_deps))
        train_deps.append("ref_inf")
    p.add_node("actor_train", ModelCall("train_step"), deps=train_deps)
    return p
