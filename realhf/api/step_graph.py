"""A train step as a dataflow graph: nodes that read and write named tensors of the step's batch.

    StepNode(name, op, model, inputs, outputs, args)
        name     unique in the graph, as logged (actor_inf, ref_inf, advantages, actor_train, ...)
        op       what runs: a built-in op (realhf.system.trainer.step_ops.OPS) or your own
                 function, 'module.path:function' or 'path/to/file.py:function'
        model    the engine it runs on ("actor", "ref", "critic"), or "" for none
        inputs   the tensors it reads: the rollout's (ROLLOUT_TENSORS) or an earlier node's outputs
        outputs  the tensors it writes; each tensor has exactly one writer
        args     the op's own arguments (JSON values)

A node runs once every input exists; nodes with no path between them may run at the same time
where they run on different processes. Tensors named `rewards/<source>` are reward terms: the
advantages read the rollout's `rewards` plus every term (realhf.system.trainer.ppo_step).

`StepGraph.check` refuses a graph that cannot run — a duplicate name, an input nobody writes, a
tensor written twice, a cycle, an unknown op or model — naming the node and what is wrong, before
any process starts. Your own op is called as `fn(ctx, batch, node) -> dict` on every trainer
rank: `ctx` holds the engines (realhf.system.trainer.step_ops.StepContext), `batch` the step's
TrainBatch whose outputs it sets (`batch.set(name, tensor)`), and the dict (numbers) is logged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

# What the rollout fills in before any node runs (realhf.api.train_batch.TrainBatch).
ROLLOUT_TENSORS = (
    "input_ids",
    "attention_mask",
    "loss_mask",
    "behav_logprobs",
    "behav_versions",
    "rewards",
    "group_ids",
    "prompt_lens",
)
REWARD_TERM_PREFIX = "rewards/"


class GraphError(ValueError):
    """A step graph that cannot run; the message names the node and the fix."""


@dataclass(frozen=True)
class StepNode:
    name: str
    op: str
    model: str = ""
    inputs: Tuple[str, ...] = ()
    outputs: Tuple[str, ...] = ()
    args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        # Config lists arrive as lists; a frozen node holds tuples.
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "args", dict(self.args))

    def describe(self) -> str:
        on = f" on {self.model}" if self.model else ""
        return f"{self.name} ({self.op}{on}: {', '.join(self.inputs) or '-'} -> {', '.join(self.outputs) or '-'})"


def is_reward_term(tensor: str) -> bool:
    return tensor.startswith(REWARD_TERM_PREFIX) and len(tensor) > len(REWARD_TERM_PREFIX)


@dataclass(frozen=True)
class StepGraph:
    nodes: Tuple[StepNode, ...]

    def __post_init__(self):
        object.__setattr__(self, "nodes", tuple(self.nodes))

    def node(self, name: str) -> StepNode:
        for n in self.nodes:
            if n.name == name:
                return n
        raise GraphError(f"step graph: no node {name!r}; nodes: {self.names()}")

    def names(self) -> List[str]:
        return [n.name for n in self.nodes]

    def models(self) -> List[str]:
        """The engines the nodes run on, in order of first use."""
        return list(dict.fromkeys(n.model for n in self.nodes if n.model))

    def writer(self, tensor: str) -> Optional[StepNode]:
        return next((n for n in self.nodes if tensor in n.outputs), None)

    def reward_terms(self) -> List[str]:
        return [t for n in self.nodes for t in n.outputs if is_reward_term(t)]

    def check(
        self,
        is_op: Callable[[str], Optional[str]],
        models: Sequence[str],
        provided: Iterable[str] = ROLLOUT_TENSORS,
        where: str = "ppo.graph",
    ) -> "StepGraph":
        """Refuse a graph that cannot run. `is_op(op)` returns None for a known op, else why not;
        `models`: the engines a trainer can hold. Returns self."""
        seen: Dict[str, StepNode] = {}
        written: Dict[str, str] = {t: "the rollout" for t in provided}
        for n in self.nodes:
            if not n.name:
                raise GraphError(f"{where}: a node without a name ({n.describe()})")
            if n.name in seen:
                raise GraphError(f"{where}: two nodes are named {n.name!r}; names must be unique")
            seen[n.name] = n
            if not n.op:
                raise GraphError(f"{where}: node {n.name!r} names no op")
            why = is_op(n.op)
            if why is not None:
                raise GraphError(f"{where}: node {n.name!r}: {why}")
            if n.model and n.model not in models:
                raise GraphError(f"{where}: node {n.name!r} runs on model {n.model!r}; known models: {list(models)}")
            for t in n.outputs:
                if t in written:
                    raise GraphError(
                        f"{where}: tensor {t!r} is written by node {n.name!r} and by {written[t]}; "
                        "each tensor has one writer (name the new one differently)"
                    )
                written[t] = f"node {n.name!r}"
        for n in self.nodes:
            for t in n.inputs:
                if t not in written:
                    raise GraphError(
                        f"{where}: node {n.name!r} reads {t!r}, which no node writes and the rollout does not "
                        f"provide; the rollout provides {list(provided)}"
                    )
        self.order()  # a cycle
        return self

    def order(self) -> List[List[StepNode]]:
        """The nodes in waves: every node of a wave has all its inputs from earlier waves, so the
        nodes of one wave may run at the same time. Within a wave, declaration order."""
        producer = {t: n.name for n in self.nodes for t in n.outputs}
        needs = {n.name: {producer[t] for t in n.inputs if t in producer} - {n.name} for n in self.nodes}
        for n in self.nodes:
            if any(producer.get(t) == n.name for t in n.inputs):
                raise GraphError(f"step graph: node {n.name!r} reads a tensor it writes itself")
        done: set = set()
        waves: List[List[StepNode]] = []
        while len(done) < len(self.nodes):
            wave = [n for n in self.nodes if n.name not in done and needs[n.name] <= done]
            if not wave:
                stuck = [n.name for n in self.nodes if n.name not in done]
                raise GraphError(f"step graph: the nodes {stuck} wait for each other (a cycle)")
            waves.append(wave)
            done |= {n.name for n in wave}
        return waves

    def describe(self) -> str:
        return " | ".join(", ".join(n.name for n in wave) for wave in self.order())


def node_from_dict(d: Mapping[str, Any], where: str) -> StepNode:
    """A node from config (a dict or a StepNodeConfig's fields); unknown keys are refused."""
    known = {"name", "op", "model", "inputs", "outputs", "args"}
    extra = set(d) - known
    if extra:
        raise GraphError(f"{where}: unknown key(s) {sorted(extra)}; a node has {sorted(known)}")
    for key in ("inputs", "outputs"):
        value = d.get(key, ())
        if isinstance(value, str) or not all(isinstance(v, str) for v in value):
            raise GraphError(f"{where}.{key}: a list of tensor names, got {value!r}")
    return StepNode(
        name=str(d.get("name", "")),
        op=str(d.get("op", "")),
        model=str(d.get("model", "") or ""),
        inputs=tuple(d.get("inputs", ())),
        outputs=tuple(d.get("outputs", ())),
        args=dict(d.get("args", {}) or {}),
    )
