"""A torch process group between processes that share no torch world: the trainer and the
generation servers, for broadcasting new weights (SGLang's `/init_weights_update_group` protocol).

Rank 0 (the trainer) hosts a TCPStore; every server connects to it as rank `rank_offset`, all
under one `group_name` prefix, and the group is a plain `ProcessGroupGloo` (CPU tensors) or
`ProcessGroupNCCL` (GPU tensors, one GPU per member: NCCL refuses two ranks on one device, so a
trainer and a server sharing a GPU use gloo) built on that store: it never joins or disturbs the
trainer's own default group. Every wait has the group's timeout; a peer that dies makes the next broadcast
raise (gloo: "Connection closed by peer") instead of hanging, and `close()` aborts what is left,
so a failed group can be dropped and a new one built for the survivors.
"""

from __future__ import annotations

import datetime
import socket
import threading
from typing import Iterable, Optional

import torch
import torch.distributed as dist

BACKENDS = ("gloo", "nccl")


class WeightGroupError(RuntimeError):
    pass


def _local_address_towards(host: str) -> str:
    """This host's address on the route to `host` (no packet is sent: a UDP connect only picks
    the route); 127.0.0.1 for a loopback `host`."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


class HostedStore:
    """The store rank 0 hosts on a free port of `bind_host` (`.port`); the socket is bound here
    and handed over, so the store listens on `bind_host` only (loopback by default)."""

    def __init__(self, bind_host: str, timeout_s: float):
        self._socket = socket.create_server((bind_host, 0))
        self.port = self._socket.getsockname()[1]
        self.store = dist.TCPStore(
            bind_host,
            self.port,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=timeout_s),
            master_listen_fd=self._socket.fileno(),
        )
        self._socket.detach()  # the store owns the listening socket now and closes it when dropped

    def close(self) -> None:
        self.store = None


class WeightGroup:
    """One process group: `rank` of `world_size`, rank 0 the sender."""

    def __init__(
        self,
        master_address: str,
        master_port: int,
        rank: int,
        world_size: int,
        group_name: str,
        backend: str,
        timeout_s: float,
        store: Optional[dist.Store] = None,
    ):
        if backend not in BACKENDS:
            raise WeightGroupError(f"backend {backend!r}: this side speaks {BACKENDS}")
        if not 0 <= rank < world_size:
            raise WeightGroupError(f"rank {rank} outside a group of {world_size}")
        self.rank, self.world_size, self.group_name, self.backend = rank, world_size, group_name, backend
        self.timeout_s = timeout_s
        timeout = datetime.timedelta(seconds=timeout_s)
        if store is None:
            store = dist.TCPStore(master_address, master_port, is_master=False, timeout=timeout)
        self._store = store  # kept alive: the group's connections were made through it
        prefixed = dist.PrefixStore(f"realhf-weights/{group_name}", store)
        if backend == "gloo":
            # gloo's pair sockets listen on the address the hostname resolves to unless told
            # otherwise: on a host without DNS that lookup alone can take seconds, and the
            # address may not be the one the peers reach. Listen where the sender is reached from.
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname=_local_address_towards(master_address))]
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, opts)
        else:
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
        self.closed = False

    def broadcast(self, tensors: Iterable[torch.Tensor]) -> None:
        """Rank 0's tensors into every other rank's (same shapes and dtypes, same order), one
        broadcast each; raises WeightGroupError when a peer fails or the timeout passes."""
        if self.closed:
            raise WeightGroupError(f"weight group {self.group_name!r} is closed")
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        opts.timeout = datetime.timedelta(seconds=self.timeout_s)
        # No local reference to the process group: a failed broadcast's traceback (kept by
        # whoever reports it) must not keep its sockets open, or the peers wait out their timeout.
        for t in tensors:
            if self.closed:
                raise WeightGroupError(f"weight group {self.group_name!r} was closed during a broadcast")
            try:
                self.pg.broadcast([t], opts).wait()
            except RuntimeError as e:
                raise WeightGroupError(
                    f"broadcast in weight group {self.group_name!r} (rank {self.rank} of {self.world_size}) "
                    f"failed: {str(e).splitlines()[0][:300]}"
                ) from None

    def close(self, abort: bool = True) -> None:
        """Abort and drop the group (safe after a failure and twice). `abort=False` while a
        broadcast is still waiting in it on another thread: gloo's abort would wait for that
        broadcast, so the group is only dropped, and the waiting thread runs out its timeout."""
        if self.closed:
            return
        self.closed = True
        if not abort:
            # Dropping the last reference runs the group's destructor, which waits for that
            # broadcast: let a thread of its own do it.
            holder = [self.pg]
            self.pg = None
            threading.Thread(target=holder.clear, name=f"{self.group_name}-drop", daemon=True).start()
            return
        try:
            abort = getattr(self.pg, "abort", None)
            if abort is not None:
                abort()
        except RuntimeError:
            pass
        self.pg = None
