"""Supervised fine-tuning (the warm start before RL) on the RL trainer's machinery.

    python training/main_sft.py model_path=assets/tiny-math/base output_path=assets/tiny-math/sft \\
        train_path=assets/tiny-math/data/train.jsonl test_path=assets/tiny-math/data/test.jsonl

    ... dp=2                      two data-parallel ranks (processes this command starts: gloo on
                                  CPUs, NCCL on GPUs, one GPU each); the same steps as dp=1
    ... lora.r=8 lora.alpha=16    LoRA adapters on a frozen base (lora.target_modules: which linear
                                  modules; the same keys as the RL run's actor.lora)

Every field of `realhf.api.cli_args.SFTConfig` can be overridden as `key=value`. train_path and
test_path take what the RL run's dataset.path takes (JSONL, parquet, a `datasets` directory;
`dataset.columns.*` names the columns). A row trains on its `sft_trace`, else on the assistant
turns of its chat `messages`, else on its prompt followed by `solutions[0]`; the loss is the token
mean of the cross-entropy over those tokens (and the EOS that ends each), never over the prompt.
The run stops at a fixed step count with fixed seeds, so the same command always produces the
same checkpoint, then reports greedy and sampled (T=1) accuracy on the test split.

output_path is a plain HF directory — with LoRA, the adapters merged into the base — so RL starts
from it as it is: `python training/main_async_ppo.py actor.path=<output_path>`. The logic is
realhf.experiments.sft.
"""

from __future__ import annotations

from realhf.api.cli_args import SFTConfig
from realhf.apps.engine_command import run
from realhf.base.process_exit import run_then_exit
from realhf.experiments.sft import train_sft


def _summary(report):
    out = {k: v for k, v in report.items() if k != "losses"}
    out["final_loss"] = report["losses"][-1]
    return out


if __name__ == "__main__":
    run_then_exit(lambda: run("sft", SFTConfig, train_sft, _summary))  # not sys.exit: realhf.base.process_exit says why
