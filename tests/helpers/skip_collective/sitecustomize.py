"""A planted bug for tests/system/faults/test_collective_timeout.py: with this directory on
PYTHONPATH, Python imports this module at the start of every process of a run; in the process of
model worker 1 (DP rank 1) it makes the actor's third forward (the proximal log-probs of step 3)
return zeros without running the model — the rank skips that forward's collectives, as a buggy
engine would, and rank 0 waits in them alone. Every other process is left alone."""

import sys

if any("model_worker-1.yaml" in arg for arg in sys.argv):
    import torch

    from realhf.impl.engine.fsdp_engine import FSDPEngine

    _forward = FSDPEngine.forward
    _calls = {"actor": 0}

    def _skipping_forward(self, batch, output_fn):
        if self.config.name == "actor":
            _calls["actor"] += 1
            if _calls["actor"] == 3:
                print("planted bug: DP rank 1 skips the actor's forward of step 3", flush=True)
                return torch.zeros((batch.n_seqs, batch.input_ids.shape[1] - 1))
        return _forward(self, batch, output_fn)

    FSDPEngine.forward = _skipping_forward
