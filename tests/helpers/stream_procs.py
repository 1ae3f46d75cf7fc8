"""Stand-alone pusher and puller processes for the trajectory-stream tests.

    python -m helpers.stream_procs pusher REDIS_URL EXP TRIAL INDEX N_PUSHERS N_PULLERS N_MSGS
    python -m helpers.stream_procs puller REDIS_URL EXP TRIAL INDEX N_EXPECTED OUT_JSON

A puller registers itself through name resolve, receives `N_EXPECTED` messages through a
StreamDataset and writes `[[pusher, seq], ...]` in arrival order, plus its garbage counter, to
OUT_JSON.
"""

import json
import sys

import numpy as np

from realhf.api.cli_args import NameResolveConfig
from realhf.base import name_resolve
from realhf.system.streams.push_pull_stream import NameResolvingZmqPuller, NameResolvingZmqPusher
from realhf.system.trainer.stream_dataset import StreamDataset


def run_pusher(url, exp, trial, index, n_pushers, n_pullers, n_msgs):
    name_resolve.reconfigure(NameResolveConfig(type="redis", redis_url=url))
    pusher = NameResolvingZmqPusher(exp, trial, index, n_pushers, n_pullers, discovery_timeout=30)
    for seq in range(n_msgs):
        pusher.push({"pusher": index, "seq": seq, "ids": np.arange(seq % 7, dtype=np.int32)})
    pusher.close()


def run_puller(url, exp, trial, index, n_expected, out_path):
    name_resolve.reconfigure(NameResolveConfig(type="redis", redis_url=url))
    puller = NameResolvingZmqPuller(exp, trial, index)
    dataset = StreamDataset(puller)
    items = dataset.get(n_expected, timeout=60)
    for it in items:
        assert (it["ids"] == np.arange(it["seq"] % 7)).all()
    with open(out_path, "w") as f:
        json.dump(
            {
                "order": [[it["pusher"], it["seq"]] for it in items],
                "extra": len(dataset.get_available()),
                "malformed": puller.n_malformed,
            },
            f,
        )
    dataset.close()


if __name__ == "__main__":
    role, url, exp, trial, *rest = sys.argv[1:]
    if role == "pusher":
        run_pusher(url, exp, trial, *map(int, rest))
    else:
        run_puller(url, exp, trial, int(rest[0]), int(rest[1]), rest[2])
