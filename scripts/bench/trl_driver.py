"""The TRL peer: `GRPOTrainer` with realhf's default algorithm, for a fixed training-time budget.

Runs ONLY under the benchmark's own virtual environment (`.bench/venvs/trl`, made by
`scripts/bench/peer_trl.py`): it imports torch, transformers, trl and datasets, plus the grader of
this repo (`realhf.plugins.environments.math_grader`, found through PYTHONPATH), which needs only the
standard library and math-verify — never realhf's own dependencies.

    <venv>/bin/python scripts/bench/trl_driver.py --out-dir D --budget-s 372 --threads 2

The same algorithm as training/configs/async-ppo.yaml: 16 prompts x 8 completions per generation,
2 optimizer steps per generation (`steps_per_generation=2`, 64 completions each, PPO clip 0.2
against the generation's log-probs), group-normalised advantages, token-mean loss ("dapo": over
the active tokens of the batch), k3 KL to the SFT model with beta 0.1 added to the loss (plain,
not importance-weighted, as realhf: `use_bias_correction_kl=False`), AdamW lr 1e-4 constant,
gradient clipping 1.0, T=1 without top-k/top-p, 32 new tokens. The reward is realhf's math
environment with check_work: 1 when the final answer is right and every worked equation holds,
else 0 (group normalisation makes this the same advantages as +1/-1).

The SmolLM2 race (scripts/bench/vs_trl_smollm2.py) changes what its config changes:
`--model`/`--train-data` of the chat task (rows of chat `messages`, which go through the
tokenizer's template; `--chat` does the same for text rows), `--reward answer` (final answer only, as `rollout.env.check_work=false`),
`--temperature 0.7`, `--beta 0` and `--lora-r 16 --lora-alpha 32` (peft adapters on every
projection, no dropout: realhf's `actor.lora`).

Numerics: fp32 unless `--bf16` (GRPOConfig turns bf16 autocast ON by default; realhf's trainer
computes in fp32, so a fair comparison passes bf16=False explicitly, and the summary says what ran).

Every `--save-steps` generations and/or every `--save-secs` seconds (and at the end) the policy is
saved as an HF directory `<out-dir>/checkpoints/version<g>` with `saved_at.json` = {train_s,
clock_s, step, version}: train_s counts from the trainer's `on_train_begin`, clock_s from
`--clock-start` (a Unix time: the moment the harness started this process; default the driver's
own start), so that model loading and imports are on the clock as realhf's start-up is. Training
stops after the first whole generation at which the `--budget-clock` (train or process) reaches
`--budget-s`. The last stdout line is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def load_prompts(path: str, chat: bool = False):
    """realhf's prompt rows as TRL's dataset: a row's chat `messages` as a conversational prompt
    (TRL applies the tokenizer's chat template with the generation prompt, as realhf does), else
    its `prompt` text, wrapped as one user message with `chat` (`dataset.chat_template=on`)."""
    from datasets import Dataset

    def prompt(r):
        if r.get("messages") is not None:
            return r["messages"]
        return [{"role": "user", "content": r["prompt"]}] if chat else r["prompt"]

    rows = [json.loads(line) for line in open(path) if line.strip()]
    return Dataset.from_list(
        [{"prompt": prompt(r), "solutions": r["solutions"], "query_id": r.get("query_id", "")} for r in rows]
    )


def _text(completion) -> str:
    return completion if isinstance(completion, str) else completion[-1]["content"]  # conversational: messages


def make_reward(check_work: bool = True, sample_log: str = ""):
    """realhf's math reward: 1 for the right final answer (and, with check_work, every worked
    equation holding), else 0. With `sample_log`, each call appends one JSON line of the rows it
    scored (`query_id`, `reward`, Unix time `t`): which prompts TRL trained, in order, to read
    beside realhf's `trained_qids.jsonl`."""
    from realhf.plugins.environments.math_answer import work_lines_correct
    from realhf.plugins.environments.math_grader import MathGrader

    grader = MathGrader(n_workers=1)  # its pool starts only for non-numeric answers

    out = open(sample_log, "a", buffering=1) if sample_log else None

    def math_reward(prompts, completions, solutions, query_id=None, **kwargs):
        texts = [_text(c) for c in completions]
        rewards = [
            1.0 if grader.grade(t, s) and (not check_work or work_lines_correct(t)) else 0.0
            for t, s in zip(texts, solutions)
        ]
        if out is not None:
            out.write(json.dumps({"t": time.time(), "query_id": query_id, "reward": rewards}) + "\n")
        return rewards

    return math_reward, grader


def log_phases(trainer, path: str) -> None:
    """Record when the trainer samples (`_generate`), scores (rewards, old and reference log-probs:
    the rest of `_generate_and_score_completions`) and takes optimizer steps, as JSON lines: one
    when a phase begins (no "end": a reader stopping the run mid-phase still knows it) and one
    when it ends."""
    from transformers import TrainerCallback

    out = open(path, "a", buffering=1)

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.time()
            out.write(json.dumps({"phase": name, "start": t0}) + "\n")
            try:
                return fn(*a, **kw)
            finally:
                out.write(json.dumps({"phase": name, "start": t0, "end": time.time()}) + "\n")

        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._generate_and_score_completions = timed("score", trainer._generate_and_score_completions)

    class Steps(TrainerCallback):
        def on_step_begin(self, args_, st, control, **kw):
            self.t0 = time.time()
            out.write(json.dumps({"phase": "step", "start": self.t0}) + "\n")

        def on_step_end(self, args_, st, control, **kw):
            out.write(json.dumps({"phase": "step", "start": self.t0, "end": time.time()}) + "\n")

    trainer.add_callback(Steps())


def main(argv=None) -> int:
    started = time.time()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out-dir", required=True)
    p.add_argument("--model", default="assets/tiny-math/sft")
    p.add_argument("--train-data", default="assets/tiny-math/data/train.jsonl")
    p.add_argument("--budget-s", type=float, default=372.0)
    p.add_argument("--save-steps", type=int, default=10, help="save every N generations (each 16x8 samples); 0: off")
    p.add_argument(
        "--save-secs", type=float, default=0.0, help="save when N seconds passed since the last save; 0: off"
    )
    p.add_argument("--clock-start", type=float, default=None, help="Unix time the process clock starts at")
    p.add_argument("--budget-clock", choices=("train", "process"), default="train")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (TRL's default); off: fp32 as realhf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta", type=float, default=0.1)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--chat", action="store_true", help="prompts as one user chat message (the tokenizer's template)")
    p.add_argument("--reward", choices=("check-work", "answer"), default="check-work")
    p.add_argument("--lora-r", type=int, default=0, help="PEFT LoRA rank (0: full fine-tuning); saves hold the adapter")
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--lora-targets", default="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")
    p.add_argument("--max-generations", type=int, default=100000, help="safety bound beside the time budget")
    p.add_argument(
        "--phase-log",
        default="",
        help="append one JSON line per phase (generate, score, step) with its start and end Unix times (scripts/bench/timeline.py)",
    )
    p.add_argument(
        "--continuous-batching",
        action="store_true",
        help="generate with transformers' continuous-batching engine (GRPOConfig.use_transformers_continuous_batching)",
    )
    p.add_argument(
        "--sample-log",
        default="",
        help="append one JSON line per reward call: the scored rows' query ids and rewards (which prompts TRL trained)",
    )
    args = p.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    import transformers
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    transformers.utils.logging.set_verbosity_error()
    ckpt_root = os.path.join(args.out_dir, "checkpoints")
    os.makedirs(ckpt_root, exist_ok=True)
    n_per_gen = args.groups * args.group_size
    cfg = GRPOConfig(
        output_dir=os.path.join(args.out_dir, "trainer"),
        report_to="none",
        save_strategy="no",
        logging_steps=1,  # every step's reward goes to the summary (train_success)
        disable_tqdm=True,
        use_cpu=True,
        seed=args.seed,
        dataloader_num_workers=0,
        gradient_checkpointing=False,  # TRL turns it on by default; recomputing only costs time at this size
        per_device_train_batch_size=n_per_gen // args.minibatches,
        gradient_accumulation_steps=1,
        steps_per_generation=args.minibatches,
        num_generations=args.group_size,
        num_iterations=1,
        max_steps=args.max_generations * args.minibatches,
        max_completion_length=args.max_new_tokens,
        temperature=args.temperature,
        top_p=1.0,
        top_k=0,
        beta=args.beta,
        use_bias_correction_kl=False,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=1.0,
        bf16=args.bf16,
        fp16=False,
        use_transformers_continuous_batching=args.continuous_batching,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    reward, grader = make_reward(check_work=args.reward == "check-work", sample_log=args.sample_log)
    peft_config = None
    if args.lora_r > 0:
        from peft import LoraConfig  # realhf's actor.lora: the same targets, no dropout, no bias

        peft_config = LoraConfig(
            r=args.lora_r,
            lora_alpha=args.lora_alpha,
            lora_dropout=0.0,
            target_modules=args.lora_targets.split(","),
            bias="none",
            task_type="CAUSAL_LM",
        )
    clock_start = started if args.clock_start is None else args.clock_start
    state = {"t0": None, "generations": 0, "train_s": 0.0, "saves": [], "last_save": time.time()}

    def save(train_s: float, g: int) -> None:
        # With LoRA the trainer's model is peft's: its save holds the adapter only (what a TRL +
        # PEFT user saves); the evaluator merges it into --model after all training.
        d = os.path.join(ckpt_root, f"version{g}")
        trainer.model.save_pretrained(d, safe_serialization=True)
        tokenizer.save_pretrained(d)
        with open(os.path.join(d, "saved_at.json"), "w") as f:
            clock_s = round(time.time() - clock_start, 2)
            at = {"train_s": round(train_s, 2), "clock_s": clock_s, "step": g, "version": g}
            if peft_config is not None:
                at["adapter_of"] = os.path.abspath(args.model)
            json.dump(at, f)
        state["saves"].append(g)
        state["last_save"] = time.time()

    class BudgetAndSaves(TrainerCallback):
        def on_train_begin(self, args_, st, control, **kw):
            state["t0"] = time.monotonic()
            state["t_begin"] = state["last_save"] = time.time()

        def on_step_end(self, args_, st, control, **kw):
            if st.global_step % args.minibatches:
                return  # mid-generation: the budget is checked at whole realhf-sized steps
            g = st.global_step // args.minibatches
            train_s = time.monotonic() - state["t0"]
            state["generations"], state["train_s"] = g, train_s
            clock = train_s if args.budget_clock == "train" else time.time() - clock_start
            over = clock >= args.budget_s or g >= args.max_generations
            by_steps = args.save_steps > 0 and g % args.save_steps == 0
            by_secs = args.save_secs > 0 and time.time() - state["last_save"] >= args.save_secs
            if by_steps or by_secs or over:
                save(train_s, g)
            if over:
                control.should_training_stop = True

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=load_prompts(args.train_data, chat=args.chat),
        processing_class=tokenizer,
        callbacks=[BudgetAndSaves()],
        peft_config=peft_config,
    )
    if args.phase_log:
        log_phases(trainer, args.phase_log)
    load_before = [round(x, 2) for x in os.getloadavg()]
    try:
        trainer.train()
    finally:
        grader.close()
    g, train_s = state["generations"], state["train_s"]
    summary = {
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "threads": args.threads,
        "bf16": bool(trainer.args.bf16),
        "groups": args.groups,
        "minibatches": args.minibatches,
        "continuous_batching": args.continuous_batching,
        "lora_r": args.lora_r,
        "budget_s": args.budget_s,
        "budget_clock": args.budget_clock,
        "start_s": round(state["t_begin"] - clock_start, 2),
        "steps": g,
        "train_s": round(train_s, 2),
        "n_samples": g * n_per_gen,
        "samples_per_s": round(g * n_per_gen / train_s, 2) if train_s else 0.0,
        "saves": state["saves"],
        # TRL's reward per logged optimizer step: with realhf's 0/1 task reward, the training
        # success rate, read beside realhf's `success_rate` (same rows, same reward).
        "train_success": [round(h["reward"], 4) for h in trainer.state.log_history if "reward" in h],
        "train_clipped": [
            round(h["completions/clipped_ratio"], 4)
            for h in trainer.state.log_history
            if "completions/clipped_ratio" in h
        ],
        "load_before": load_before,
        "load_after": [round(x, 2) for x in os.getloadavg()],
    }
    with open(os.path.join(args.out_dir, "summary.json"), "w") as f:
        json.dump(summary, f)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
