"""What the races against TRL share: the same algorithm on both sides, read off realhf's composed
config, and a race's progress kept across invocations (scripts/bench/vs_trl_smollm2.py,
scripts/bench/vs_trl_long.py).

TRL's side is derived from realhf's config (`trl_driver_args`), never written twice, and a realhf
setting the TRL driver cannot reproduce is named (`algorithm_mismatches`). A race's state lives in
`<work dir>/race_state.json` (`open_state`, `save_state`): the base's scores, the sweep, every
scored run with the host it ran on; a race under another protocol file is refused, never mixed in.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

from scripts.bench.common import REPO, cpu_flags, cpu_model, git_commit, log, utc_now


def algorithm_mismatches(cfg) -> List[str]:
    """realhf settings the TRL driver does not reproduce (it runs PPO-clip 0.2 on group-normalised
    advantages, token-mean loss, k3 KL, AdamW 0.9/0.999/1e-8 without decay at a constant lr,
    clipping 1.0, pure sampling); empty when the two sides run the same algorithm."""
    want = {
        "ppo.eps_clip": (cfg.ppo.eps_clip, 0.2),
        "ppo.eps_clip_high": (cfg.ppo.eps_clip_high in (None, 0.2), True),
        "ppo.c_clip": (cfg.ppo.c_clip, None),
        "ppo.policy_loss": (cfg.ppo.policy_loss, "ppo"),
        "ppo.loss_agg_mode": (cfg.ppo.loss_agg_mode, "token-mean"),
        "ppo.adv_estimator": (cfg.ppo.adv_estimator, "grpo"),
        "ppo.entropy_coef": (cfg.ppo.entropy_coef, 0.0),
        "ppo.kl_estimator": (cfg.ppo.kl_estimator if cfg.ppo.kl_ctl > 0 else "k3", "k3"),
        "ppo.gen.top_p": (cfg.ppo.gen.top_p, 1.0),
        "ppo.gen.top_k": (cfg.ppo.gen.top_k <= 0, True),
        "actor.optimizer.weight_decay": (cfg.actor.optimizer.weight_decay, 0.0),
        "actor.optimizer.beta1": (cfg.actor.optimizer.beta1, 0.9),
        "actor.optimizer.beta2": (cfg.actor.optimizer.beta2, 0.999),
        "actor.optimizer.eps": (cfg.actor.optimizer.eps, 1e-8),
        "actor.optimizer.lr_scheduler_type": (cfg.actor.optimizer.lr_scheduler_type, "constant"),
        "actor.optimizer.warmup_steps_proportion": (cfg.actor.optimizer.warmup_steps_proportion, 0.0),
        "actor.optimizer.gradient_clipping": (cfg.actor.optimizer.gradient_clipping, 1.0),
        "actor.param_dtype": (cfg.actor.param_dtype in ("", "float32"), True),
    }
    return [f"{k}: realhf {got!r}, the TRL driver {exp!r}" for k, (got, exp) in want.items() if got != exp]


def samples_per_optimizer_step(cfg) -> int:
    return cfg.groups_per_step * cfg.group_size // cfg.ppo.ppo_n_minibatches


def trl_driver_args(cfg) -> List[str]:
    """TRL's side of the race, read off realhf's composed config (groups and minibatches come
    from the sweep setting)."""
    lora = cfg.actor.lora
    args = [
        "--model", os.path.join(REPO, cfg.actor.path),
        "--train-data", os.path.join(REPO, cfg.dataset.path),
        "--group-size", str(cfg.group_size),
        "--max-new-tokens", str(cfg.ppo.gen.max_new_tokens),
        "--lr", repr(cfg.actor.optimizer.lr),
        "--beta", repr(cfg.ppo.kl_ctl),
        "--temperature", repr(cfg.ppo.gen.temperature),
        "--reward", "check-work" if cfg.rollout.env.check_work else "answer",
    ]  # fmt: skip
    if cfg.dataset.chat_template == "on":
        args.append("--chat")
    if lora.r > 0:
        args += [
            "--lora-r",
            str(lora.r),
            "--lora-alpha",
            repr(lora.alpha),
            "--lora-targets",
            ",".join(lora.target_modules),
        ]
    return args


STATE = "race_state.json"


def protocol_sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def open_state(work: str, sha: str, mode: str) -> Dict:
    """The race's progress in `<work>/race_state.json`: the base's scores, the sweep, and every
    scored run, each with the host it ran on. A race under another protocol file (or mode) is
    refused, never mixed in."""
    path = Path(work, STATE)
    if not path.is_file():
        return {"protocol_sha256": sha, "mode": mode, "runs": []}
    s = json.loads(path.read_text())
    if (s["protocol_sha256"], s["mode"]) != (sha, mode):
        raise SystemExit(
            f"{path}: a {s['mode']} race under protocol sha256 {s['protocol_sha256'][:12]}, not this {mode} one "
            f"({sha[:12]}): pass another --work-dir"
        )
    log(f"resuming the race in {work}: {len(s['runs'])} runs already scored")
    return s


def save_state(work: str, s: Dict) -> None:
    tmp = Path(work, STATE + ".tmp")
    tmp.write_text(json.dumps(s, indent=1) + "\n")
    os.replace(tmp, Path(work, STATE))


def this_host() -> Dict:
    return {"cpu_model": cpu_model(), "cpu_flags": cpu_flags(), "commit": git_commit(), "date": utc_now()}


def same_machine(a: Dict, b: Dict) -> bool:
    return (a["cpu_model"], a["cpu_flags"]) == (b["cpu_model"], b["cpu_flags"])


def pair_seed_on_this_host(state: Dict, seed: int, host: Dict) -> None:
    """A seed's two runs race on one machine: half a pair left by an invocation on another host
    (hosts with and without AVX-512 differ 2x in speed) is dropped, to be run again here."""
    have = [r for r in state["runs"] if r["seed"] == seed]
    if len(have) == 1 and not same_machine(have[0]["host"], host):
        log(
            f"seed {seed}: dropping its {have[0]['system']} run from {have[0]['host']['cpu_flags']}: a pair races on one host"
        )
        state["runs"] = [r for r in state["runs"] if r["seed"] != seed]


def task_evaluator(
    config_name: str,
    overrides: Sequence[str],
    eval_path: str,
    max_new_tokens: int,
    context_length: int,
    threads: int,
    work: str,
) -> Callable[..., Dict]:
    """score(path, temperature, n_prompts, k=1) -> realhf's task evaluator on the first n_prompts
    rows of `eval_path`, k answers each (the rollout's agent and environment of the race's config,
    the native engine with `context_length` tokens per slot, `max_new_tokens` per answer)."""
    from realhf.experiments.async_ppo import evaluator_config, trial_files_of
    from realhf.experiments.config_loading import compose_config
    from realhf.system.evaluator.task_eval import evaluate_weights

    cfg = compose_config(
        [
            *overrides,
            f"dataset.test_path={eval_path}",
            f"evaluation.max_new_tokens={max_new_tokens}",
            f"cluster.fileroot={work}",
            f"gen_server.native.context_length={context_length}",
        ],
        config_name=config_name,
    )
    ev = dataclasses.replace(evaluator_config(cfg, trial_files_of(cfg), 0), n_threads=threads, nice=0)

    def score(path: str, temperature: float, n_prompts: int, k: int = 1) -> Dict:
        t0 = time.perf_counter()
        (r,) = evaluate_weights(ev, path, [(temperature, k)], n_prompts)
        log(
            f"T={temperature} x{k}: {r['accuracy']:.3f} ({r['truncated']:.2f} cut off) in "
            f"{time.perf_counter() - t0:.0f} s: {path}"
        )
        return r

    return score
