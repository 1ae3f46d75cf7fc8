"""`--help` text: every field of a composed config with the value the run will use and its help,
and the names the open keys (agent, environment, reward, loss, advantages) may take."""

import dataclasses
import sys
from typing import Any, Callable, Dict, List, Optional

from realhf.base.importing import IMPORT_PATH_FORMS, import_object


def describe_fields(cfg: Any, prefix: str = "") -> List[str]:
    lines = []
    for f in dataclasses.fields(cfg):
        key, value = f"{prefix}{f.name}", getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            lines.extend(describe_fields(value, key + "."))
        else:
            lines.append(f"  {key} = {value!r}\n      {f.metadata.get('help', '')}")
    return lines


def help_text(cfg: Any, app: str, usage: str) -> str:
    """`cfg` is a config instance (defaults, YAML and overrides already merged)."""
    body = "\n".join(describe_fields(cfg))
    return f"{app}\n\n{usage}\n\nFields (override any with key=value; the values this run would use):\n{body}\n"


def _origin(path: str) -> str:
    """Where the object of 'module:Name' was defined: its file for the user's code, '' for realhf's."""
    module = path.rpartition(":")[0]
    if module.startswith("realhf."):
        return ""
    return getattr(sys.modules.get(module), "__file__", None) or module


def _names(found: Dict[str, str]) -> str:
    """`name` for a built-in, `name (path/to/file.py)` for one the user's code registered."""
    return ", ".join(f"{n} ({_origin(p)})" if _origin(p) else n for n, p in found.items())


def _load(key: str, value: str, lookup: Callable[[str], Any]) -> Optional[str]:
    """Import the user's code a key names (its registrations then show); the error if it fails."""
    if ":" not in value:
        return None
    try:
        lookup(value)
    except (ValueError, TypeError) as e:
        return f"      cannot be loaded: {e}"
    return None


def plugins_text(cfg: Any) -> str:
    """The open keys of an AsyncPPOConfig: the value this run would use and the names each
    accepts. The user's code named on the command line is imported first, so the names it
    registers (`@register_agent`, ...) are listed with the file they come from."""
    from realhf.api import algorithms
    from realhf.api.agent import agent_class, agent_names
    from realhf.api.env import NO_ENV, env_class, env_names
    from realhf.api.tools import BUILTIN_TOOLS

    agent, env, ppo = cfg.rollout.agent, cfg.rollout.env, cfg.ppo
    keys = [
        ("rollout.agent.type", agent.type, agent_class, "agents", lambda: _names(agent_names())),
        ("rollout.env.type", env.type, env_class, "environments", lambda: _names(env_names()) + f", {NO_ENV}"),
        (
            "rollout.agent.reward_fn",
            agent.reward_fn,
            lambda v: import_object(v, "rollout.agent.reward_fn"),
            "rewards",
            lambda: (
                "the environment's (math: the answer against the row's solutions), or your function "
                "reward_fn(prompt, completion, **row) with rollout.env.type=none"
            ),
        ),
        ("ppo.policy_loss", ppo.policy_loss, algorithms.policy_loss, "policy losses", None),
        ("ppo.adv_estimator", ppo.adv_estimator, algorithms.adv_estimator, "advantage estimators", None),
    ]
    errors = {key: _load(key, value, lookup) for key, value, lookup, _, _ in keys}
    menus = {"ppo.policy_loss": algorithms.POLICY_LOSSES, "ppo.adv_estimator": algorithms.ADV_ESTIMATORS}
    lines = [
        f"Plug-ins (a name below, or your own code as {IMPORT_PATH_FORMS}: a module found from the launch "
        "directory or user_paths, or a file relative to the launch directory):"
    ]
    for key, value, _, what, listed in keys:
        names = listed() if listed is not None else _names(menus[key].registered())
        lines.append(f"  {key} = {value!r}\n      {what}: {names}")
        if errors[key]:
            lines.append(errors[key])
    lines.append(f"  rollout.agent.args.tools (tool-agent)\n      tools: {', '.join(BUILTIN_TOOLS)}")
    return "\n".join(lines) + "\n"
