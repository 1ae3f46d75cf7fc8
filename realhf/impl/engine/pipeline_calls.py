"""FSDPEngine's calls through the pipeline stages (`pp_size > 1`): a forward, a forward and
backward, and the full weights gathered onto rank 0. The stages themselves (the split model and
the schedule per call) are realhf.impl.engine.pipeline_parallel; the engine delegates here.

Every function takes the engine (an FSDPEngine with its pipeline built) as its first argument.
"""

from __future__ import annotations

from typing import Any, Iterator, List, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor

from realhf.api.engine_api import LossFn, OutputFn
from realhf.api.train_batch import TrainBatch
from realhf.base import collectives, serialization
from realhf.impl.engine import pipeline_parallel


def micro_batches(engine: Any, batch: TrainBatch, plan) -> Tuple[torch.Tensor, list, int, int]:
    """The plan's micro-batches padded to one shape [R, T] (the largest, agreed over all ranks;
    the schedule's static shape): token ids `[n_micro * R, T]` on the device (micro-batch i is
    rows i*R .. i*R+R-1, zeros beyond its own rows and width) and each micro-batch's (rows, batch
    on the device), (None, None) for a padding one."""
    mbs = [(rows, None if rows is None else engine._on_device(batch.select(rows))) for rows, _ in plan]
    shapes = [mb.input_ids.shape for _, mb in mbs if mb is not None] or [(1, 2)]
    R, T = collectives.agree_max([max(n for n, _ in shapes), max(t for _, t in shapes)], engine.device)
    ids = torch.zeros((len(mbs) * R, T), dtype=torch.long, device=engine.device)  # [n_micro * R, T]
    for i, (_, mb) in enumerate(mbs):
        if mb is not None:
            n, t = mb.input_ids.shape
            ids[i * R : i * R + n, :t] = mb.input_ids
    return ids, mbs, R, T


def _schedule(engine: Any, n_micro: int, R: int, T: int, out_meta: torch.Tensor, loss_fn, train: bool):
    """This stage's schedule for one call: input `[R, T]` ids (stage 0) or `[R, T, H]` hidden
    states, output `out_meta` on the last stage and `[R, T, H]` on the others."""
    first, last = engine.pp_rank == 0, engine.pp_rank == engine.pp_size - 1
    hidden = torch.empty(
        (R, T, engine.hf_config.hidden_size), dtype=engine.compute_dtype, device="meta", requires_grad=train
    )  # [R, T, H]
    in_meta = torch.empty((R, T), dtype=torch.long, device="meta") if first else hidden
    return pipeline_parallel.build_schedule(
        engine.model,
        engine.pp_rank,
        engine.pp_size,
        engine.pp_group,
        engine.device,
        n_micro,
        in_meta,
        out_meta if last else hidden,
        loss_fn,
    )


def forward(engine: Any, batch: TrainBatch, output_fn: OutputFn) -> torch.Tensor:
    """`forward` through the pipeline: the last stage applies `output_fn` to each micro-batch as
    it leaves the head (only `[R, T-1]` per micro-batch is kept, not the logits), then broadcasts
    the `[N, T-1]` result to the other stages."""
    ids, mbs, R, T = micro_batches(engine, batch, engine._plan(batch))
    first, last = engine.pp_rank == 0, engine.pp_rank == engine.pp_size - 1
    order = iter(mbs)  # the last stage sees the micro-batches in order

    def head(logits: torch.Tensor) -> torch.Tensor:  # [R, T, V] -> [R, T-1]
        y = torch.zeros((R, T - 1), dtype=torch.float32, device=logits.device)
        _, mb = next(order)
        if mb is not None:
            n, t = mb.input_ids.shape
            out = output_fn(logits[:n, :t], mb)  # [n, t-1]
            y[:n, : out.shape[1]] = out.float()
        return y

    out_meta = torch.empty((R, T - 1), dtype=torch.float32, device="meta")
    schedule = _schedule(engine, len(mbs), R, T, out_meta, None, train=False)
    engine.model.forward.head = head if last else None
    try:
        result = schedule.step(ids) if first else schedule.step()  # last stage: [n_micro * R, T-1]
    finally:
        engine.model.forward.head = None
    out = torch.zeros((batch.n_seqs, batch.input_ids.shape[1] - 1), dtype=torch.float32, device=engine.device)
    if last:
        for i, (rows, mb) in enumerate(mbs):
            if mb is not None:
                w = min(T - 1, out.shape[1])
                out[rows, :w] = result[i * R : i * R + len(rows), :w]
    dist.broadcast(out, group=engine.pp_group, group_src=engine.pp_size - 1)
    return out.cpu()  # [N, T-1]


def backward(engine: Any, batch: TrainBatch, plan, loss_fn: LossFn, denominator: float) -> float:
    """Forward and backward of every micro-batch through the pipeline (gradients accumulate as in
    the engine's micro-batch loop); the last stage's Σ loss_fn (0 on the other stages)."""
    ids, mbs, R, T = micro_batches(engine, batch, plan)
    sums: List[float] = []

    def pipe_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # output [R, T, V] (a critic: [R, T, 1]); target [1]: the micro-batch's index
        rows, mb = mbs[int(target[0])]
        if mb is None:
            return output.float().sum() * 0.0  # a padding micro-batch: nothing to train
        n, t = mb.input_ids.shape
        loss = loss_fn(output[:n, :t], mb, rows)  # scalar: Σ over mb's tokens
        sums.append(float(loss.detach()))
        return loss / denominator

    width = 1 if engine.config.value_head else engine.hf_config.vocab_size
    out_meta = torch.empty((R, T, width), dtype=engine.compute_dtype, device="meta", requires_grad=True)
    schedule = _schedule(engine, len(mbs), R, T, out_meta, pipe_loss, train=True)
    target = torch.arange(len(mbs), device=engine.device)  # [n_micro]
    if engine.pp_rank == 0:
        schedule.step(ids, target=target, return_outputs=False)
    else:
        schedule.step(target=target, return_outputs=False)
    return sum(sums)


def _send_bytes(blob: bytes, dst: int) -> None:
    dist.send(torch.tensor([len(blob)], dtype=torch.int64), dst=dst)
    dist.send(torch.from_numpy(np.frombuffer(blob, dtype=np.uint8).copy()), dst=dst)


def _recv_bytes(src: int) -> bytes:
    size = torch.empty(1, dtype=torch.int64)
    dist.recv(size, src=src)
    data = torch.empty(int(size), dtype=torch.uint8)
    dist.recv(data, src=src)
    return data.numpy().tobytes()


def full_tensors(engine: Any, skip_tied: bool) -> Iterator[Tuple[str, torch.Tensor]]:
    """Collective: every stage's full tensors under their original names, stage by stage, yielded
    on rank 0. The ranks of stage s gather each tensor from its shards (FSDP, TP); the stage's
    first rank sends it to rank 0 (point to point: pipelining moves activations, not weights),
    after the list of names, shapes and dtypes as msgpack bytes (never pickled). `skip_tied`:
    leave out the last stage's copy of a tied embedding."""
    last = engine.pp_size - 1
    for stage in range(engine.pp_size):
        leader = stage * engine.dp_size * engine.tp_size
        if engine.pp_rank == stage:
            state = get_model_state_dict(engine.model)
            items = [
                (n, t)
                for n, t in state.items()
                if not (skip_tied and engine.tied and stage == last and n == pipeline_parallel.TIED_HEAD)
            ]
            if engine.rank == leader and stage > 0:
                metas = [[n, list(t.shape), str(t.dtype).removeprefix("torch.")] for n, t in items]
                _send_bytes(serialization.dumps(metas), dst=0)
            for name, t in items:
                full = t.full_tensor() if isinstance(t, DTensor) else t
                if engine.rank == 0:
                    yield name, full.detach()
                elif engine.rank == leader:
                    dist.send(full.detach().contiguous(), dst=0)
                del full
        elif engine.rank == 0:
            for name, shape, dtype in serialization.loads(_recv_bytes(leader)):
                buf = torch.empty(shape, dtype=getattr(torch, dtype), device=engine.device)
                dist.recv(buf, src=leader)
                yield name, buf
