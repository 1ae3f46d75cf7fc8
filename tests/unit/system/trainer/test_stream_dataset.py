"""StreamDataset over a real ZMQ puller: parsing, timeouts that lose nothing, errors of the pull
thread, and closing."""

import time

import pytest

from realhf.system.streams.push_pull_stream import ZMQPuller, ZMQPusher
from realhf.system.trainer.stream_dataset import StreamDataset, StreamDatasetError, StreamTimeoutError


def test_stream_dataset_hands_out_parsed_items_and_drops_what_the_parser_rejects():
    def parse(item):
        if "n" not in item:
            raise ValueError("missing n")
        return item["n"] * 10

    puller = ZMQPuller()
    dataset = StreamDataset(puller, parse=parse)
    pusher = ZMQPusher(puller.address)
    try:
        for obj in ({"n": 1}, {"m": 0}, {"n": 2}):
            pusher.push(obj)
        assert dataset.get(2, timeout=10) == [10, 20]
        assert dataset.n_invalid == 1
    finally:
        pusher.close()
        dataset.close()


def test_stream_dataset_get_times_out_saying_how_many_it_had_and_loses_nothing():
    puller = ZMQPuller()
    dataset = StreamDataset(puller)
    pusher = ZMQPusher(puller.address)
    try:
        for n in range(3):
            pusher.push({"n": n})
        with pytest.raises(StreamTimeoutError, match="got 3 of 5") as e:
            dataset.get(5, timeout=1.0)
        assert e.value.n_have == 3
        pusher.push({"n": 3})
        assert [it["n"] for it in dataset.get(4, timeout=10)] == [0, 1, 2, 3]  # same order, none lost
    finally:
        pusher.close()
        dataset.close()


class _DyingPuller:
    def __init__(self):
        self.closed = False

    def pull(self, timeout):
        raise OSError("socket exploded")

    def close(self):
        self.closed = True


def test_stream_dataset_raises_the_pull_thread_error_to_the_caller():
    dataset = StreamDataset(_DyingPuller())
    time.sleep(0.2)
    with pytest.raises(StreamDatasetError, match="socket exploded"):
        dataset.get(1, timeout=1)
    dataset.close()


def test_stream_dataset_close_stops_its_thread_and_refuses_later_gets():
    puller = ZMQPuller()
    dataset = StreamDataset(puller)
    dataset.close()
    assert not dataset._thread.is_alive()
    with pytest.raises(StreamDatasetError, match="closed"):
        dataset.get(1, timeout=0.5)
