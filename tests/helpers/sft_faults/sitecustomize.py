"""Planted faults for tests/unit/experiments/test_sft_ranks.py: with this directory on PYTHONPATH,
Python imports this module at the start of every process; in the process of SFT rank 1
(`python -m realhf.apps.sft_rank sft CONFIG 1 ...`) the environment variable SFT_FAULT makes its
second train step
    raise  fail with a RuntimeError (rank 0 is left in the step's collectives);
    hang   sleep without entering the step's collectives (rank 0 waits in them alone).
Every other process is left alone."""

import os
import sys

_fault = os.environ.get("SFT_FAULT", "")
_args = list(getattr(sys, "orig_argv", sys.argv))  # sys.argv lacks the -m module here
if _fault and "realhf.apps.sft_rank" in _args and _args[_args.index("realhf.apps.sft_rank") + 3] == "1":
    import time

    from realhf.impl.engine.fsdp_engine import FSDPEngine

    _train_batch = FSDPEngine.train_batch
    _calls = [0]

    def _faulty_train_batch(self, batch, loss_fn, loss_weight_fn):
        _calls[0] += 1
        if _calls[0] == 2:
            print(f"planted fault: SFT rank 1 {_fault}s at its second step", flush=True)
            if _fault == "raise":
                raise RuntimeError("planted fault: rank 1 fails at its second step")
            time.sleep(3600)
        return _train_batch(self, batch, loss_fn, loss_weight_fn)

    FSDPEngine.train_batch = _faulty_train_batch
