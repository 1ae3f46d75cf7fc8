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

import json
import sys

import hydra
import transformers
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

from realhf.api.cli_args import SFTConfig
from realhf.experiments.config_keys import check_overrides
from realhf.experiments.sft import SFTRankError, train_sft

ConfigStore.instance().store(name="sft_schema", node=SFTConfig)
# The primary config: the schema plus Hydra settings that keep the app from creating outputs/
# directories and from replacing the logging configuration.
ConfigStore.instance().store(
    name="sft",
    node={
        "defaults": [
            "sft_schema",
            "_self_",
            {"override hydra/job_logging": "disabled"},
            {"override hydra/hydra_logging": "disabled"},
        ],
        "hydra": {"run": {"dir": "."}, "output_subdir": None},
    },
)


@hydra.main(version_base=None, config_name="sft")
def main(cfg) -> None:
    sft_cfg: SFTConfig = OmegaConf.to_object(cfg)
    transformers.utils.logging.disable_progress_bar()  # one bar per checkpoint load is noise
    try:
        report = train_sft(sft_cfg, log=lambda msg: print(msg, flush=True))
    except SFTRankError as e:
        print(e.traceback, file=sys.stderr, end="", flush=True)  # where the first failing rank failed
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        print("interrupted: every rank stopped", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    summary = {k: v for k, v in report.items() if k != "losses"}
    summary["final_loss"] = report["losses"][-1]
    print("SFT result: " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    # Hydra's answer to a misspelt key is to prepend '+' (which fails too): name the key meant.
    unknown = check_overrides(sys.argv[1:], SFTConfig)
    if unknown is not None:
        print(f"config error: {unknown}", file=sys.stderr)
        sys.exit(2)
    sys.exit(main())
