"""SmolLM2-135M-Instruct with LoRA: realhf against TRL + PEFT under a protocol declared before the runs.

    python -m scripts.bench.vs_trl_smollm2 [--short] [--seeds 1,2] [--protocol P] [--work-dir D]

The tiny-task race (scripts/bench/vs_trl.py) on the row users believe: the real pretrained model
of `bash examples/run_async_ppo_smollm2.sh`, LoRA adapters on both sides, and an evaluation a
reader accepts: stories asking facts the race never trains on, and an answer budget the base
model fits in. Everything that decides a number is in the protocol file; TRL's algorithm is
derived from realhf's composed config (`trl_driver_args`), and a realhf setting the TRL driver
cannot match is refused (`algorithm_mismatches`).

1. Set-up (off the clock): the model (scripts/convert_gguf.py), the example's training rows
   (scripts/make_math_dataset.py --chat --steps 1), and from them the race's rows
   (`write_race_data`): training without the held-out facts, stories asking only those (the
   target's eval set), and two-digit stories (scored on each run's last checkpoint).
2. The base model is scored (refusing an answer budget that cuts off 10% or more of its greedy
   answers); TRL's sweep; then for each seed realhf and TRL one after another for `budget_s` on
   the process clock (the one going first alternating by seed), each saving every `save_every_s`.
3. After each run, off the clock, one evaluator (realhf's task evaluator: the rollout's agent and
   environment on the native engine) scores its checkpoints greedily, its last one also sampled
   and on the two-digit stories.

Reported per seed and as medians with ranges, in `results.vs_trl_smollm2`. Full mode takes about
three hours on a 2-core host without AVX-512 (per seed: two 12-minute runs and about half an hour
of scoring; the base and the sweep once, about 15 minutes), less with it. It keeps its progress in
`--work-dir` (by default `.bench/vs_trl_smollm2-<protocol sha>`), each run scored as soon as it
ends and its checkpoints then deleted, so `--seeds 1` now and the same command later finish the
race across sittings; a seed's two runs always race on one host, and the report names the hosts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Tuple

from scripts.bench import vs_trl
from scripts.bench.common import PYTHON, REPO, emit, log, print_tables
from scripts.bench.race import (  # noqa: F401 - the race's shared machinery, also used here by name
    STATE,
    algorithm_mismatches,
    open_state,
    pair_seed_on_this_host,
    protocol_sha,
    same_machine,
    samples_per_optimizer_step,
    save_state,
    task_evaluator,
    this_host,
    trl_driver_args,
)

PROTOCOL = Path(__file__).with_name("protocol_smollm2_vs_trl.yaml")
INSTRUCTION = "Give only the final number as your answer."  # make_math_dataset's --chat default
EVAL_PROMPT_TOKENS = 128  # an eval prompt with SmolLM2's chat template and system turn is ≈ 60 tokens
MAX_BASE_TRUNCATED = 0.10  # the eval budget must let the base model finish at least 90% of its answers


@dataclass(frozen=True)
class Protocol:
    """The declared protocol (protocol_smollm2_vs_trl.yaml says what each field means)."""

    declared: str
    realhf: Dict
    held_out: Dict
    ood_set: Dict[str, int]
    evaluation: Dict
    target: float
    seeds: List[int]
    budget_s: float
    save_every_s: float
    numerics: str
    trl: Dict

    @property
    def bf16(self) -> bool:
        return self.numerics == "bf16"


def load_protocol(path: Path = PROTOCOL) -> Protocol:
    """The protocol file, checked: an unknown or missing key, or a bad value, names the file and key."""
    p = vs_trl.read_protocol(path, Protocol)
    if p.numerics != "fp32":
        raise ValueError(
            f"{path}: numerics must be fp32 (realhf's trainer has no bf16 mode measured to help), got {p.numerics!r}"
        )
    if set(p.realhf) != {"config", "overrides"} or not isinstance(p.realhf["overrides"], list):
        raise ValueError(f"{path}: realhf needs exactly config (a training/configs name) and overrides (a list)")
    if set(p.held_out) != {"fraction", "n_prompts", "seed"} or not 0 < p.held_out["fraction"] < 1:
        raise ValueError(f"{path}: held_out needs fraction (in (0, 1): of the training facts), n_prompts, seed")
    if set(p.ood_set) != {"digits", "steps", "n_prompts", "seed"} or p.ood_set["digits"] < 2:
        raise ValueError(
            f"{path}: ood_set needs digits (>= 2: operands outside training's 1..9), steps, n_prompts, seed"
        )
    if set(p.evaluation) != {"max_new_tokens", "sampled_temperature", "threads"}:
        raise ValueError(f"{path}: evaluation needs exactly max_new_tokens, sampled_temperature, threads")
    if not 0 <= p.trl.get("sweep_margin", -1) < 1 or not p.trl.get("sweep"):
        raise ValueError(f"{path}: trl needs sweep_margin in [0, 1) and a non-empty sweep")
    for s in p.trl["sweep"]:
        if set(s) != {"threads", "groups", "minibatches"}:
            raise ValueError(f"{path}: trl.sweep entry {s}: needs exactly threads, groups, minibatches")
    return p


def realhf_config(p: Protocol):
    from realhf.experiments.config_loading import compose_config

    return compose_config(p.realhf["overrides"], config_name=p.realhf["config"])


# -- set-up: model, training rows, the eval set ---------------------------------------------------


FACT = re.compile(r"^\s*(\d+)([+-])(\d+)=")


def fact_of(row: Dict) -> Tuple[int, str, int]:
    """The (start, op, operand) a one-step story asks, read off its worked solution."""
    m = FACT.match(row["solutions"][0])
    if m is None or row["solutions"][0].count("=") != 1:
        raise ValueError(f"row {row.get('query_id')!r}: not a one-step story ({row['solutions'][0]!r})")
    return int(m.group(1)), m.group(2), int(m.group(3))


def _unordered(fact: Tuple[int, str, int]) -> Tuple[int, str, int]:
    a, op, b = fact
    return (min(a, b), op, max(a, b)) if op == "+" else fact


def _numbers(text: str) -> List[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def write_race_data(p: Protocol, train_path: str, out: Path, n_held_out: int, n_ood: int) -> Dict:
    """The race's rows under `out`: train.jsonl (the example's training stories without the held-out
    facts; a sum is held out in both orders), held_out.jsonl (new stories asking only those facts: the target's eval set) and
    ood.jsonl (stories with ood_set.digits-digit operands, none of which occurs in any training
    story). Each is a pure function of the protocol and the example's rows, checked; returns what
    was checked."""
    import random

    from realhf.plugins.tasks.math_synthetic import (
        GeneratorConfig,
        generate_problem,
        generate_splits,
        to_rows,
        write_jsonl,
    )

    rows = [json.loads(line) for line in Path(train_path).read_text().splitlines() if line.strip()]
    facts = sorted({fact_of(r) for r in rows})
    # a+b and b+a are one fact to hold out: knowing one order gives the other away.
    keys = sorted({_unordered(f) for f in facts})
    h = p.held_out
    held_keys = set(random.Random(h["seed"]).sample(keys, round(h["fraction"] * len(keys))))
    held = {f for f in facts if _unordered(f) in held_keys}
    train = [r for r in rows if fact_of(r) not in held]
    seen = {r["messages"][-1]["content"] for r in rows}
    rng, asked = random.Random(h["seed"]), []
    for _ in range(200 * n_held_out):  # held-out stories are a `fraction` of all draws: ample tries
        pr = generate_problem(rng, GeneratorConfig(digits=1, steps=1))
        row = to_rows([pr], "held-out", INSTRUCTION)[0]
        if (pr.start, *pr.ops[0]) in held and row["messages"][-1]["content"] not in seen:
            seen.add(row["messages"][-1]["content"])
            asked.append(pr)
        if len(asked) == n_held_out:
            break
    if len(asked) < n_held_out:
        raise ValueError(f"only {len(asked)} distinct stories ask the {len(held)} held-out facts, not {n_held_out}")
    o = p.ood_set
    _, ood = generate_splits(0, n_ood, o["seed"], GeneratorConfig(digits=o["digits"], steps=o["steps"]))
    train_max = max(n for r in rows for n in _numbers(r["messages"][-1]["content"]))
    ood_min = min(min([pr.start, *(v for _, v in pr.ops)]) for pr in ood)
    if ood_min <= train_max:
        raise ValueError(f"ood operands reach down to {ood_min}, training stories go up to {train_max}")
    paths = {name: out / f"{name}.jsonl" for name in ("train", "held_out", "ood")}
    write_jsonl(paths["train"], train)
    write_jsonl(paths["held_out"], to_rows(asked, "held-out", INSTRUCTION))
    write_jsonl(paths["ood"], to_rows(ood, "ood", INSTRUCTION))
    return {
        "paths": {k: str(v) for k, v in paths.items()},
        "facts": len(facts),
        "held_out_facts": sorted(f"{a}{op}{b}" for a, op, b in held),
        "train_rows": len(train),
        "train_rows_dropped": len(rows) - len(train),
        "held_out_prompts": len(asked),
        "ood_prompts": len(ood),
        "ood_min_operand": ood_min,
        "train_max_number": train_max,
    }


def prepare_assets(cfg) -> None:
    """The example's model and training rows, made as `examples/run_async_ppo_smollm2.sh` makes them."""
    model = os.path.join(REPO, cfg.actor.path)
    subprocess.run([PYTHON, "scripts/convert_gguf.py", "--out", model], cwd=REPO, check=True, timeout=1800)
    train = Path(REPO, cfg.dataset.path)
    if not train.is_file():
        cmd = [PYTHON, "scripts/make_math_dataset.py", "--out", str(train.parent), "--chat", "--steps", "1"]
        subprocess.run(cmd, cwd=REPO, check=True, timeout=600)


# -- the runs -------------------------------------------------------------------------------------


def sweep(p: Protocol, cfg, work: str, budget_s: float) -> List[Dict]:
    for s in p.trl["sweep"]:
        if s["groups"] * cfg.group_size // s["minibatches"] != samples_per_optimizer_step(cfg):
            raise ValueError(
                f"trl.sweep entry {s}: not realhf's {samples_per_optimizer_step(cfg)} samples per optimizer step"
            )
    return vs_trl.sweep(p, work, budget_s, trl_driver_args(cfg))


# -- evaluation -----------------------------------------------------------------------------------


def merged_dir(c: Dict, work: str, merge: bool = True) -> str:
    """An HF directory for a checkpoint: realhf's saves are merged already; a TRL + PEFT save (an
    adapter, `adapter_of` its base) is merged into its base here (`merge=False`: only its path)."""
    if "adapter_of" not in c:
        return c["path"]
    out = os.path.join(work, "merged", os.path.relpath(c["path"], work).replace(os.sep, "_"))
    if merge and not os.path.isfile(os.path.join(out, "model.safetensors")):
        import torch
        from peft import PeftModel
        from transformers import AutoModelForCausalLM, AutoTokenizer

        base = AutoModelForCausalLM.from_pretrained(c["adapter_of"], dtype=torch.float32)
        PeftModel.from_pretrained(base, c["path"]).merge_and_unload().save_pretrained(out, safe_serialization=True)
        AutoTokenizer.from_pretrained(c["adapter_of"]).save_pretrained(out)
    return out


def evaluator(p: Protocol, eval_path: str, n_prompts: int, work: str):
    """score(path, temperature) -> the task evaluator's result on the eval set (race.task_evaluator),
    with room in the KV cache for the longest eval prompt and the eval budget (training's is sized
    for its own 24-token answers)."""
    score = task_evaluator(
        p.realhf["config"],
        p.realhf["overrides"],
        eval_path,
        p.evaluation["max_new_tokens"],
        EVAL_PROMPT_TOKENS + p.evaluation["max_new_tokens"],
        p.evaluation["threads"],
        work,
    )
    return lambda path, temperature: score(path, temperature, n_prompts)


def score_base(score, p: Protocol, base: str, strict: bool) -> Dict:
    """The base model on the eval set, before any training: greedy and sampled, with the fraction
    of answers the budget cuts off. `strict`: refuse a budget that cuts off MAX_BASE_TRUNCATED or
    more of its greedy answers, the metric of the race (it would measure the budget, not the
    model); the sampled fraction is recorded beside the sampled score."""
    g0, s0 = score(base, 0.0), score(base, p.evaluation["sampled_temperature"])
    cut = g0["truncated"]
    if cut >= MAX_BASE_TRUNCATED:
        why = (
            f"evaluation.max_new_tokens={p.evaluation['max_new_tokens']} cuts off {g0['truncated']:.2f} of the "
            f"base model's greedy answers (at most {MAX_BASE_TRUNCATED}; sampled: {s0['truncated']:.2f})"
        )
        if strict:
            raise SystemExit(f"the protocol's {why}: raise it")
        log(f"warning: {why}")
    return {
        "start_accuracy": round(g0["accuracy"], 4),
        "start_greedy_accuracy": round(g0["accuracy"], 4),
        "start_sampled_accuracy": round(s0["accuracy"], 4),
        "base_truncated_greedy": round(g0["truncated"], 4),
        "base_truncated_sampled": round(s0["truncated"], 4),
        "base_mean_new_tokens_greedy": round(g0["mean_new_tokens"], 2),
        "eval_budget_ok": cut < MAX_BASE_TRUNCATED,
        "base_path": base,
    }


def score_run(r: Dict, score, score_ood, p: Protocol, budget_s: float, start: Dict, work: str) -> None:
    """One run's greedy curve inside the budget (from the base's start), its time to target, its
    last checkpoint sampled once per prompt (as in vs_trl: `final_accuracy` is sampled, here at the
    rollouts' temperature; the curve and the target are greedy) and greedy on the two-digit
    stories. Its checkpoints are deleted once scored: a race keeps its numbers, not 40 copies of
    the model."""
    saved = r.pop("checkpoints")
    inside = [c for c in saved if c["clock_s"] <= budget_s]
    r["curve"] = [{"clock_s": 0.0, "accuracy": start["start_greedy_accuracy"]}]
    if not inside:  # too slow to save inside the budget: it ends where it began, not reached
        log(f"{r['system']} seed {r['seed']} saved nothing within {budget_s} s: scored as the base model")
        r.update(final_greedy_accuracy=r["curve"][0]["accuracy"], final_accuracy=start["start_sampled_accuracy"])
        r.update(final_clock_s=0.0, reached=False, time_to_target_s=budget_s)
        r["final_ood_greedy_accuracy"] = start["ood_start_greedy_accuracy"]
    else:
        for c in inside:
            g = score(merged_dir(c, work), 0.0)
            r["curve"].append(
                {"clock_s": c["clock_s"], "accuracy": round(g["accuracy"], 4), "truncated": g["truncated"]}
            )
        last = merged_dir(inside[-1], work)
        r["final_greedy_accuracy"] = r["curve"][-1]["accuracy"]
        r["final_accuracy"] = round(score(last, p.evaluation["sampled_temperature"])["accuracy"], 4)
        r["final_ood_greedy_accuracy"] = round(score_ood(last, 0.0)["accuracy"], 4)
        r["final_clock_s"] = inside[-1]["clock_s"]
        t = next((c["clock_s"] for c in r["curve"] if c["accuracy"] >= p.target), None)
        r["reached"] = t is not None
        r["time_to_target_s"] = t if t is not None else budget_s
    r["checkpoints_saved"] = len(saved)
    for c in saved:
        for path in {c["path"], merged_dir(c, work, merge=False)}:
            shutil.rmtree(path, ignore_errors=True)


def tables(r: Dict):
    sw, per_seed, systems, curves = vs_trl.tables(r)
    title = (
        f"SmolLM2-135M-Instruct + LoRA vs TRL + PEFT, protocol declared {r['declared']}: target {r['target']} greedy "
        f"accuracy on {r['eval_prompts']} stories asking the {len(r['data']['held_out_facts'])} held-out facts (none in "
        f"the race's training rows; base greedy {r['start_greedy_accuracy']}, sampled {r['start_sampled_accuracy']}; "
        f"{r['base_truncated_greedy']} of its greedy answers cut off at {r['eval_max_new_tokens']} tokens), "
        f"{r['budget_s']} s from process start, checkpoints every {r['save_every_s']} s, fp32 both, TRL "
        f"{r['trl_setting']}; final sampled at T={r['eval_sampled_temperature']}, one answer per prompt; "
        f"seeds {r['seeds']}"
        + ("" if r["complete"] else f" (not yet run: {r['seeds_missing']})")
        + f" on {', '.join(r['hosts'])}"
    )
    ood = [[x["system"], x["seed"], r["ood_start_greedy_accuracy"], x["final_ood_greedy_accuracy"]] for x in r["runs"]]
    ood_title = (
        f"two-digit stories ({r['data']['ood_prompts']} prompts, operands >= {r['data']['ood_min_operand']}; "
        f"training's <= {r['data']['train_max_number']}), greedy, each run's last checkpoint"
    )
    curves = ("greedy accuracy curves, held-out facts (process-clock s: accuracy)", *curves[1:])
    return [sw, (title, *per_seed[1:]), systems, curves, (ood_title, ["system", "seed", "base", "final"], ood)]


def run_and_score(p: Protocol, cfg, system: str, seed: int, setting: Dict, work: str, budget: float, score_all) -> Dict:
    """One run of the race from a clean directory (an interrupted attempt leaves its saves behind),
    scored at once."""
    if system == "realhf":
        from realhf.base.trial_files import TrialFiles

        trial = f"smollm2-realhf-{seed}"
        files = TrialFiles(work, "async-ppo", trial)
        for d in (files.run_dir, files.log_dir):
            shutil.rmtree(d, ignore_errors=True)
        r = vs_trl.run_realhf(p, seed, work, budget, budget + 900, trial, p.realhf["config"])
    else:
        shutil.rmtree(os.path.join(work, vs_trl.trl_run_dir_name(seed, setting)), ignore_errors=True)
        r = vs_trl.run_trl(p, seed, setting, work, budget, budget + 900, trl_driver_args(cfg))
    log(f"scoring {len(r['checkpoints'])} checkpoints of {system} seed {seed}")
    score_all(r)
    return r


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.bench.vs_trl_smollm2", description=__doc__.split("\n")[0])
    ap.add_argument("--protocol", default=str(PROTOCOL))
    ap.add_argument(
        "--short", action="store_true", help="smoke mode: 150 s budgets, 30 s sweep runs, 20 eval prompts, seed 1"
    )
    ap.add_argument(
        "--seeds",
        default=None,
        help="run only these of the protocol's seeds now (comma-separated); the same command later runs the rest",
    )
    ap.add_argument(
        "--work-dir",
        default=None,
        help="the race's progress and runs (default: .bench/vs_trl_smollm2-<protocol sha> in full mode, "
        "kept so that the same command goes on where it stopped; a deleted temp dir with --short)",
    )
    args = ap.parse_args(argv)
    p = load_protocol(Path(args.protocol))
    cfg = realhf_config(p)
    bad = algorithm_mismatches(cfg)
    if bad:
        raise SystemExit(f"{args.protocol}: realhf's config runs what the TRL driver cannot: {'; '.join(bad)}")
    sha, mode = protocol_sha(args.protocol), "short" if args.short else "full"
    if args.short:  # three saves inside the short budget
        p = dataclasses.replace(p, save_every_s=30.0)
    budget = 150.0 if args.short else float(p.budget_s)
    sweep_budget = 30.0 if args.short else float(p.trl["sweep_budget_s"])
    n_held, n_ood = (20, 20) if args.short else (p.held_out["n_prompts"], p.ood_set["n_prompts"])
    seeds = p.seeds[:1] if args.short else list(p.seeds)
    now = seeds if args.seeds is None else [int(x) for x in args.seeds.split(",")]
    if not set(now) <= set(seeds):
        raise SystemExit(f"--seeds {args.seeds}: the protocol's seeds are {seeds}")
    sweep_list = p.trl["sweep"][:1] if args.short else p.trl["sweep"]
    temporary = args.work_dir is None and args.short
    work = args.work_dir or (
        tempfile.mkdtemp(prefix="bench_smollm2_")
        if args.short
        else os.path.join(REPO, ".bench", f"vs_trl_smollm2-{sha[:12]}")
    )
    os.makedirs(work, exist_ok=True)
    state, host = open_state(work, sha, mode), this_host()
    started = time.time()
    try:
        prepare_assets(cfg)
        data = write_race_data(p, os.path.join(REPO, cfg.dataset.path), Path(work, "data"), n_held, n_ood)
        # Both sides train on the rows without the held-out facts (TRL's arguments come from this config).
        p = dataclasses.replace(
            p, realhf={**p.realhf, "overrides": [*p.realhf["overrides"], f"dataset.path={data['paths']['train']}"]}
        )
        cfg = realhf_config(p)
        score = evaluator(p, data["paths"]["held_out"], n_held, work)
        score_ood = evaluator(p, data["paths"]["ood"], n_ood, work)
        if "base" not in state:
            base = os.path.join(REPO, cfg.actor.path)
            starts = score_base(score, p, base, strict=not args.short)
            ood0 = score_ood(base, 0.0)
            starts.update(ood_start_greedy_accuracy=round(ood0["accuracy"], 4))
            starts.update(ood_base_truncated_greedy=round(ood0["truncated"], 4))
            state["base"] = {**starts, "host": host}
            save_state(work, state)
        starts = state["base"]
        if "sweep" not in state:
            swept = sweep(dataclasses.replace(p, trl={**p.trl, "sweep": sweep_list}), cfg, work, sweep_budget)
            best = vs_trl.pick_setting(swept, float(p.trl["sweep_margin"]))
            state["sweep"] = {"runs": swept, "setting": {k: best[k] for k in ("threads", "groups", "minibatches")}}
            state["sweep"]["host"] = host
            save_state(work, state)
        setting = state["sweep"]["setting"]
        log(f"TRL races with {setting}")

        def score_all(r: Dict) -> None:
            score_run(r, score, score_ood, p, budget, starts, work)

        for seed, system in vs_trl.race_order(seeds):
            if seed not in now:
                continue
            pair_seed_on_this_host(state, seed, host)
            if any(r["seed"] == seed and r["system"] == system for r in state["runs"]):
                continue
            log(f"seed {seed}: {system} for {budget:.0f} s")
            r = run_and_score(p, cfg, system, seed, setting, work, budget, score_all)
            state["runs"].append({**r, "host": host})
            save_state(work, state)
    finally:
        if temporary:
            shutil.rmtree(work, ignore_errors=True)
    done = [s for s in seeds if {r["system"] for r in state["runs"] if r["seed"] == s} == {"realhf", "trl"}]
    if not done:
        raise SystemExit(f"{work}: no seed has both runs scored yet")
    runs = [r for r in state["runs"] if r["seed"] in done]
    res = {
        "bench": "vs_trl_smollm2",
        "protocol": os.path.relpath(args.protocol, REPO),
        "protocol_sha256": sha,
        "declared": p.declared,
        "target": p.target,
        "metric": "greedy",
        "seeds": done,
        "complete": done == seeds,
        "seeds_missing": [s for s in seeds if s not in done],
        "hosts": sorted({f"{r['host']['cpu_model']} ({r['host']['cpu_flags']})" for r in runs}),
        "budget_s": budget,
        "save_every_s": p.save_every_s,
        "numerics": p.numerics,
        "trl_numerics": "bf16" if p.bf16 else "fp32",
        "trl_bf16": all(r["bf16"] for r in runs if r["system"] == "trl"),
        "realhf_bf16": False,
        "held_out": p.held_out,
        "ood_set": p.ood_set,
        "data": {k: v for k, v in data.items() if k != "paths"},
        "eval_prompts": n_held,
        "eval_max_new_tokens": p.evaluation["max_new_tokens"],
        "eval_sampled_temperature": p.evaluation["sampled_temperature"],
        "trl_driver_args": trl_driver_args(cfg),
        "trl_sweep_budget_s": sweep_budget,
        "trl_sweep": state["sweep"]["runs"],
        "trl_setting": setting,
        **{k: v for k, v in starts.items() if k not in ("base_path", "host")},
        "runs": runs,
        "wall_minutes_this_invocation": round((time.time() - started) / 60, 1),
    }
    res.update(vs_trl.summarize(runs, done))
    for system, v in res["systems"].items():
        v["final_ood_greedy_accuracy"] = vs_trl._median_range(
            [r["final_ood_greedy_accuracy"] for r in runs if r["system"] == system]
        )
    print_tables(tables(res))
    emit(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
