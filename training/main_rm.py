"""Reward-model training on the RL trainer's machinery: Bradley–Terry on preference pairs.

    python training/main_rm.py model_path=assets/tiny-math/sft output_path=/tmp/rm \\
        train_path=assets/tiny-math/prefs/train.jsonl test_path=assets/tiny-math/prefs/test.jsonl

    ... dp=2                      two data-parallel ranks (processes this command starts)
    ... lora.r=8 lora.alpha=16    LoRA adapters on a frozen base (the value head trains in full)

Every field of `realhf.api.cli_args.RMConfig` can be overridden as `key=value`. A row is a prompt
(or chat messages) with a 'chosen' and a 'rejected' answer (`python -m scripts.make_preference_pairs`
builds them for the embedded task from the SFT model's own right and wrong answers). The model is
a value head on `model_path`'s architecture, scoring a prompt and answer at the answer's EOS;
each step minimises −log σ(r_chosen − r_rejected) over `batch_size` pairs. output_path is an HF
directory (AutoModelForTokenClassification, one label) that an RL run scores rollouts with: its
`reward.path`, and a `reward_model` node in the step (docs/trainer.md). The logic is
realhf.experiments.rm.
"""

from __future__ import annotations

from realhf.api.cli_args import RMConfig
from realhf.apps.engine_command import run
from realhf.base.process_exit import run_then_exit
from realhf.experiments.rm import train_rm


def _summary(report):
    out = {k: v for k, v in report.items() if k != "history"}
    out["final"] = report["history"][-1]
    return out


if __name__ == "__main__":
    run_then_exit(lambda: run("rm", RMConfig, train_rm, _summary))  # not sys.exit: realhf.base.process_exit says why
