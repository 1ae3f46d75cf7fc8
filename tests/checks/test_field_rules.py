"""Rules declared with their fields (realhf.api.cli_args.Rule): the one generic pass refuses what
each rule forbids with the message the hand-written checks give, and no rule a field declares is
written again by hand in realhf/experiments/*validation.py (issue 48: each rule once)."""

import ast
import dataclasses
import inspect
import typing
from pathlib import Path

import pytest

from realhf.api import cli_args, worker_configs
from realhf.api.cli_args import AsyncPPOConfig, Rule
from realhf.experiments import validation
from realhf.experiments.validation import ConfigError, check_fields

CONFIGS = [c for _, c in inspect.getmembers(cli_args, inspect.isclass) if dataclasses.is_dataclass(c) and c is not Rule]
RULED = [(cls, f) for cls in CONFIGS for f in dataclasses.fields(cls) if "rule" in f.metadata]


def _broken(rule: Rule, default):
    """(a value the rule refuses, the message's tail)."""
    if rule.choices and rule.empty:
        return "no-such-choice", f"='no-such-choice': empty ({rule.empty}) or one of {list(rule.choices)}"
    if rule.choices:
        return "no-such-choice", f"='no-such-choice': choose one of {list(rule.choices)}"
    if rule.timeout:
        return -1.0, (">= 0" if rule.timeout == "zero_off" else "> 0")
    if rule.gt is not None:
        return type(rule.gt)(rule.gt), f"must be > {rule.gt}"
    if rule.ge is not None:
        return rule.ge - 1, f"must be >= {rule.ge}"
    lo, hi = rule.within
    return hi + 1, f"must lie in [{lo}, {hi}]"


def test_some_fields_declare_their_rules():
    assert len(RULED) >= 80, [f"{c.__name__}.{f.name}" for c, f in RULED]


def test_a_subclass_redeclaring_a_field_keeps_its_rule():
    from realhf.api.cli_args import EngineRunConfig, RMConfig, SFTConfig

    base = {f.name: f.metadata.get("rule") for f in dataclasses.fields(EngineRunConfig)}
    for cls in (SFTConfig, RMConfig):
        for f in dataclasses.fields(cls):
            if f.name in base:
                assert f.metadata.get("rule") == base[f.name], f"{cls.__name__}.{f.name}"


@pytest.mark.parametrize("cls, fld", RULED, ids=[f"{c.__name__}.{f.name}" for c, f in RULED])
def test_the_generic_pass_refuses_what_a_declared_rule_forbids_naming_the_field(cls, fld):
    obj = cls()
    value, tail = _broken(fld.metadata["rule"], getattr(obj, fld.name))
    if isinstance(getattr(obj, fld.name), int) and isinstance(value, float) and value.is_integer():
        value = int(value)
    setattr(obj, fld.name, value)
    with pytest.raises(ConfigError) as e:
        check_fields(obj, "sec")
    assert f"sec.{fld.name}" in str(e.value) and tail in str(e.value), str(e.value)
    setattr(obj, fld.name, getattr(cls(), fld.name))
    check_fields(obj, "sec")  # the default satisfies its own rule


def _field(cls: type, dotted: str):
    """The dataclass field `dotted` names from `cls` (None when it is no field)."""
    hints = typing.get_type_hints(cls)
    *path, last = dotted.split(".")
    for part in path:
        cls = hints.get(part)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return None
        hints = typing.get_type_hints(cls)
    return next((f for f in dataclasses.fields(cls) if f.name == last), None)


HAND_CHECKS = {"at_least", "at_most", "within", "choice", "timeout", "temperature"}


def _hand_written(path: Path):
    """(function, class, field, call) of every unconditional `f.<check>("field", ...)` on a
    `_Fields` over a parameter annotated with a config class, in the module at `path`."""
    tree = ast.parse(path.read_text())
    for fn in (n for n in tree.body if isinstance(n, ast.FunctionDef)):
        annotated = {
            a.arg: getattr(module, a.annotation.id)
            for a in fn.args.args
            for module in (cli_args, worker_configs)
            if isinstance(a.annotation, ast.Name) and a.annotation.id in dir(module)
        }
        fields_over = {}  # the _Fields variable -> the class it checks
        for node in ast.walk(fn):
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", "") == "_Fields"
                and node.value.args
                and isinstance(node.value.args[0], ast.Name)
                and node.value.args[0].id in annotated
            ):
                fields_over[node.targets[0].id] = annotated[node.value.args[0].id]
        # A check under an `if` holds only under another setting: a cross-field rule, not a restatement.
        conditional = {id(n) for branch in ast.walk(fn) if isinstance(branch, ast.If) for n in ast.walk(branch)}
        # `for name in ("a", "b"): f.at_least(name, 1)` checks each name of the loop.
        loop_names = {
            id(call): [e.value for e in loop.iter.elts if isinstance(e, ast.Constant)]
            for loop in ast.walk(fn)
            if isinstance(loop, ast.For)
            and isinstance(loop.target, ast.Name)
            and isinstance(loop.iter, (ast.Tuple, ast.List))
            for call in ast.walk(loop)
            if isinstance(call, ast.Call) and call.args and getattr(call.args[0], "id", None) == loop.target.id
        }
        for node in ast.walk(fn):
            if (
                id(node) not in conditional
                and isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in HAND_CHECKS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in fields_over
                and node.args
            ):
                if isinstance(node.args[0], ast.Constant):
                    yield fn.name, fields_over[node.func.value.id], node.args[0].value, node
                for name in loop_names.get(id(node), ()):
                    yield fn.name, fields_over[node.func.value.id], name, node


def _implied(rule: Rule, call: ast.Call) -> bool:
    """Whether the field's declared rule already holds what the hand-written `call` checks: a
    stricter bound by hand (an evaluator's eval_freq_steps >= 1 where the root allows 0) is a
    rule of its own."""
    if call.func.attr != "at_least" or len(call.args) < 2 or not isinstance(call.args[1], ast.Constant):
        return True
    bound = call.args[1].value
    strict = any(k.arg == "strict" and getattr(k.value, "value", False) for k in call.keywords)
    if rule.gt is not None:
        return rule.gt >= bound
    if rule.ge is not None:
        return rule.ge > bound if strict else rule.ge >= bound
    return False


def test_no_declared_rule_is_written_again_by_hand():
    twice = []
    for module in ("validation.py", "worker_validation.py", "file_validation.py"):
        path = Path(validation.__file__).with_name(module)
        for fn, cls, name, call in _hand_written(path):
            fld = _field(cls, name)
            if fld is not None and "rule" in fld.metadata and _implied(fld.metadata["rule"], call):
                twice.append(
                    f"{module}:{call.lineno} {fn} checks {cls.__name__}.{name}, whose field declares {fld.metadata['rule']}"
                )
    assert not twice, "\n".join(twice)


def test_the_scan_sees_the_hand_written_checks():
    # the scan must find what it looks for, or the test above passes on nothing
    found = list(_hand_written(Path(validation.__file__)))
    assert any(cls is cli_args.EvaluationConfig and name == "during_nice" for _, cls, name, _ in found), found[:5]
    assert any(cls is AsyncPPOConfig and name == "cluster.gpu_placement" for _, cls, name, _ in found), found[:5]
    # ... and the checks in a loop over field names
    assert any(cls is cli_args.EvaluationConfig and name == "during_n_prompts" for _, cls, name, _ in found), found[:5]
    workers = list(_hand_written(Path(validation.__file__).with_name("worker_validation.py")))
    assert any(cls is worker_configs.ModelWorkerConfig and name == "tp_size" for _, cls, name, _ in workers), workers


@pytest.mark.parametrize(
    "cls, field, value, message",
    [
        ("RolloutWorkerConfig", "max_message_bytes", 10, "rollout_worker.max_message_bytes must be >= 1024, got 10"),
        ("ModelWorkerConfig", "max_head_offpolicyness", -1, "max_head_offpolicyness must be >= 0, got -1"),
        ("GserverManagerConfig", "weight_sync", "ftp", "gserver_manager.weight_sync='ftp': choose one of"),
        ("MasterWorkerConfig", "stall_timeout", 0.0, "master_worker.stall_timeout must be > 0"),
    ],
)
def test_a_worker_config_written_by_hand_is_held_to_its_root_fields_rules(cls, field, value, message):
    from realhf.experiments.worker_validation import validate_worker_config

    cfg = getattr(worker_configs, cls)()
    setattr(cfg, field, value)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        validate_worker_config(cfg)
