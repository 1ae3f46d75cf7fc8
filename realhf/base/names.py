"""Name-resolve keys, one helper per key of docs/architecture.md §3.

Every key lives under `{experiment}/{trial}/` so that concurrent trials never see each other.
"""


def _check(part: str, what: str) -> str:
    if not part or "/" in part or part != part.strip():
        raise ValueError(f"{what} {part!r} must be non-empty, without '/' or surrounding spaces")
    return part


def trial_root(experiment: str, trial: str) -> str:
    return f"{_check(experiment, 'experiment_name')}/{_check(trial, 'trial_name')}"


def trial_lease(experiment: str, trial: str) -> str:
    """JSON `{host, pid, started, cmdline}` of the launch that runs the trial (realhf.base.trial_lease;
    TTL, renewed while it lives). The one key the launcher keeps when it clears the trial's keys."""
    return f"{trial_root(experiment, trial)}/lease"


def worker_root(experiment: str, trial: str) -> str:
    return f"{trial_root(experiment, trial)}/worker"


def worker(experiment: str, trial: str, worker_type: str, index: int) -> str:
    """Heartbeat of one worker (keep-alive key; value `host:pid`)."""
    return f"{worker_root(experiment, trial)}/{_check(worker_type, 'worker type')}/{int(index)}"


def loop_blocked_root(experiment: str, trial: str) -> str:
    return f"{trial_root(experiment, trial)}/loop_blocked"


def loop_blocked(experiment: str, trial: str, worker_type: str, index: int) -> str:
    """JSON `{blocked_for_s, where}` while an async worker's event loop is blocked (keep-alive; deleted
    when it runs again): `where` is "file:line in function" of the code that holds it."""
    return f"{loop_blocked_root(experiment, trial)}/{_check(worker_type, 'worker type')}/{int(index)}"


def user_errors_root(experiment: str, trial: str) -> str:
    return f"{trial_root(experiment, trial)}/user_errors"


def user_errors(experiment: str, trial: str, worker_type: str, index: int) -> str:
    """Parent of one worker's reports of errors in user code (realhf.system.user_errors): a JSON
    record per place an error came from, and one when such an error ends the run."""
    return f"{user_errors_root(experiment, trial)}/{_check(worker_type, 'worker type')}/{int(index)}"


def experiment_status(experiment: str, trial: str) -> str:
    """RUNNING / COMPLETE / ABORTED, written by the launcher and the master."""
    return f"{trial_root(experiment, trial)}/experiment_status"


def stop_request(experiment: str, trial: str) -> str:
    """Written by the launcher on SIGTERM/SIGINT (the signal's name): the master finishes its step,
    writes a recovery checkpoint and ends the run (cluster.stop_grace)."""
    return f"{trial_root(experiment, trial)}/stop_request"


def stopped_resumable(experiment: str, trial: str) -> str:
    """JSON `{step, version, checkpointed}`, written by the master when it ended the run on a stop
    request: the launcher then exits with the resumable code."""
    return f"{trial_root(experiment, trial)}/stopped_resumable"


def model_version(experiment: str, trial: str, role: str) -> str:
    """Completed train steps of a model role, published by its rank-0 model worker."""
    return f"{trial_root(experiment, trial)}/model_version/{_check(role, 'model role')}"


def training_samples(experiment: str, trial: str) -> str:
    """Prompt groups consumed by training so far."""
    return f"{trial_root(experiment, trial)}/training_samples"


def stale_dropped(experiment: str, trial: str) -> str:
    """Groups the trainer dropped for exceeding the staleness bound."""
    return f"{trial_root(experiment, trial)}/stale_dropped"


def stream_puller(experiment: str, trial: str, dp_rank: int) -> str:
    """`host:port` of the trajectory PULL socket of one DP head."""
    return f"{trial_root(experiment, trial)}/stream/puller{int(dp_rank)}"


def stream_pullers(experiment: str, trial: str) -> str:
    """Subtree with one entry per registered puller (value: its DP rank)."""
    return f"{trial_root(experiment, trial)}/stream/pullers"


def request_reply_master(experiment: str, trial: str) -> str:
    """`host:port` of the master's ROUTER socket."""
    return f"{trial_root(experiment, trial)}/rr/master"


def gen_servers(experiment: str, trial: str) -> str:
    """Subtree with one entry per generation server (value: its base URL)."""
    return f"{trial_root(experiment, trial)}/gen_servers"


def gserver_manager(experiment: str, trial: str) -> str:
    """Base URL of the GserverManager."""
    return f"{trial_root(experiment, trial)}/gserver_manager"


def distributed_master(experiment: str, trial: str) -> str:
    """`host:port` for the torch.distributed rendezvous of the model workers."""
    return f"{trial_root(experiment, trial)}/distributed/master"


def rollout_record(experiment: str, trial: str, index: int) -> str:
    """JSON of rollout worker `index`'s prompt accounting, written whole in one add (so a reader
    never sees a prompt drawn in neither or both of two parts): `{seq, sampler, refused, todo,
    inflight, pushed, consumed}` (docs/architecture.md §12.3). Read by the master when it
    checkpoints and by a restarted incarnation of the same worker; kept on exit."""
    return f"{trial_root(experiment, trial)}/rollout_record/{int(index)}"


def rollout_record_ack(experiment: str, trial: str, index: int) -> str:
    """The `seq` of rollout worker `index`'s record the master last read (after every step; it
    keeps the pending prompts from then on): the worker forgets older pushed/consumed entries."""
    return f"{trial_root(experiment, trial)}/rollout_record_ack/{int(index)}"


def admission_ledger(experiment: str, trial: str) -> str:
    """A record (Redis hash) of the manager's admissions: each running rollout and its DP rank,
    accepted groups per rank, rollouts ended without a group by reason, abandoned ones, and how
    many times a manager started. Written before every admission answer, so that a restarted
    manager continues exactly and the master can account for every group (realhf.system.manager.admission_ledger)."""
    return f"{trial_root(experiment, trial)}/admission_ledger"
