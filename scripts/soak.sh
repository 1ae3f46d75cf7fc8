#!/usr/bin/env bash
# Soak run (not in CI): the embedded default trains a fixed number of steps while this script
# keeps hurting it — SIGKILLs of random generation servers and rollout workers, SIGSTOP/SIGCONT of
# a generation server for longer than its heartbeat TTL, and bursts of hostile HTTP requests
# (no secret, a wrong secret, and with the run's secret but extreme or malformed bodies) at the
# manager and the servers. The run must still end by itself with exit 0 and exactly its steps,
# train no prompt group twice (trained_qids.jsonl), and leave no process behind.
#
#   scripts/soak.sh [STEPS=900] [extra key=value overrides for training/main_async_ppo.py ...]
#
# Environment: KILL_EVERY (mean seconds between faults, default 40), SOAK_ROOT (fileroot,
# default a fresh temporary directory), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS="${1:-900}"
shift || true
PYTHON="${PYTHON:-.venv/bin/python}"
SOAK_ROOT="${SOAK_ROOT:-$(mktemp -d /tmp/realhf-soak.XXXXXX)}"
export STEPS SOAK_ROOT KILL_EVERY="${KILL_EVERY:-40}"

exec "$PYTHON" - "$@" <<'PY'
import collections, json, os, random, re, signal, subprocess, sys, time
import urllib.error, urllib.request
import psutil
import yaml

steps_target, root, fault_every = int(os.environ["STEPS"]), os.environ["SOAK_ROOT"], float(os.environ["KILL_EVERY"])
trial = "soak"
log_dir = os.path.join(root, "logs", "async-ppo", trial)
cmd = [sys.executable, "training/main_async_ppo.py", f"trial_name={trial}", f"cluster.fileroot={root}",
       f"exp_ctrl.benchmark_steps={steps_target}", "evaluation.n_prompts=0",
       # Faults come every ~KILL_EVERY s: allow that many restarts per window.
       "cluster.restart_policy.max_restarts=1000", *sys.argv[1:]]
os.makedirs(root, exist_ok=True)
out = open(os.path.join(root, "soak.out"), "w")
print(f"soak: {steps_target} steps, a fault every ~{fault_every:g}s; output in {out.name}; logs in {log_dir}", flush=True)
t_start = time.monotonic()
proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
seen = {}  # pid -> (cmdline, create_time) of every descendant ever seen


def track():
    try:
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                seen.setdefault(p.pid, (" ".join(p.cmdline()), p.create_time()))
            except psutil.Error:
                pass
    except psutil.NoSuchProcess:
        pass


def live(kinds):
    found = []
    for pid, (c, created) in seen.items():
        m = re.search(r"configs/((%s)-\d+)\.yaml" % "|".join(kinds), c)
        try:
            p = psutil.Process(pid)
            if m and p.create_time() == created and p.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_STOPPED):
                found.append((m.group(1), pid))
        except psutil.NoSuchProcess:
            pass
    return found


def metric_steps():
    try:
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            return [json.loads(line)["step"] for line in f if line.strip()]
    except FileNotFoundError:
        return []


def secret():
    """The run's secret, read as its owner can: from a worker's 0600 config file."""
    with open(os.path.join(log_dir, "configs", "gserver_manager-0.yaml")) as f:
        return yaml.safe_load(f)["context"]["secret"]


def manager_url():
    with open(os.path.join(log_dir, "gserver_manager-0.log")) as f:
        return re.search(r"serving on (http://\S+):", f.read()).group(1)


def http(url, body=None, headers=None):
    """(status, body bytes) of a GET (body None) or POST; HTTP errors are answers too."""
    req = urllib.request.Request(url, data=body, headers=headers or {}, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def manager_status(headers):
    try:
        code, body = http(f"{manager_url()}/status", headers=headers)
        return json.loads(body) if code == 200 else None
    except Exception:
        return None


HOSTILE = [
    ("/allocate_rollout", b'{"qid": "soak-x", "rank": 100000000000000000000000}'),
    ("/allocate_rollout", b'{"qid": "' + b"q" * 5000 + b'", "rank": 0}'),
    ("/schedule_request", b'{"qid": "never-allocated", "prompt_len": 10, "new_token_budget": 1e400}'),
    ("/finish_rollout", b'{"qid": "never-allocated", "accepted": true, "n_tokens": 99999999999999999999}'),
    ("/abandon_rollouts", b'{"qids": [1, 2, null]}'),
    ("/generate", b'{"input_ids": [1, 2], "sampling_params": {"temperature": 1e308, "top_k": 100000000000000000000}}'),
    ("/generate", b'{"input_ids": [-7], "sampling_params": {"max_new_tokens": -1}}'),
    ("/update_weights_from_disk", b'{"model_path": "/etc", "weight_version": 999999}'),
    ("/update_weights_from_disk", b'{"model_path": "/tmp", "weight_version": 0}'),
    ("/generate", b"\xff\xfe not json"),
]


def hostile_burst(urls, good):
    """Every request below must be refused with a 4xx: counts (refused, 5xx, errors)."""
    counts = collections.Counter()
    for url in urls:
        for headers in ({}, {"Authorization": "Bearer wrong"}, good):
            for path, body in HOSTILE:
                try:
                    code, _ = http(url + path, body, {**headers, "Content-Type": "application/json"})
                    counts["4xx" if 400 <= code < 500 else f"HTTP {code}"] += 1
                except OSError:  # a server that is down (killed, restarting) answers nothing
                    counts["unreachable"] += 1
    return counts


def fault(kind, status, headers):
    if kind == "kill":
        victims = live(["generation_server", "rollout_worker"])
        if victims:
            name, pid = random.choice(victims)
            os.kill(pid, signal.SIGKILL)
            return f"SIGKILL {name} (pid {pid})"
    elif kind == "stop":
        victims = live(["generation_server"])
        if victims:
            name, pid = random.choice(victims)
            os.kill(pid, signal.SIGSTOP)
            time.sleep(25)  # longer than the 10 s heartbeat TTL: the launcher must act
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            return f"SIGSTOP {name} (pid {pid}) for 25 s"
    elif kind == "hostile":
        urls = [manager_url()] + [s["url"] for s in (status or {}).get("servers", [])]
        counts = hostile_burst(urls, headers)
        bad = {k: v for k, v in counts.items() if k not in ("4xx", "unreachable")}
        return f"hostile burst at {len(urls)} endpoints: {counts['4xx']} refused with 4xx" + (f", NOT refused: {bad}" if bad else "")
    return None


faults, not_refused, last_status, headers = [], 0, None, {}
next_fault = time.monotonic() + 60 + random.expovariate(1 / fault_every)  # let it start first
while proc.poll() is None:
    track()
    if not headers:
        try:
            headers = {"Authorization": f"Bearer {secret()}"}
        except (OSError, KeyError, TypeError):
            pass
    if headers and time.monotonic() >= next_fault:
        kind = random.choice(["kill", "kill", "stop", "hostile"])
        try:
            what = fault(kind, last_status, headers)
        except Exception as e:  # noqa: BLE001 - e.g. the manager's log not there yet
            what = f"{kind} failed: {type(e).__name__}: {e}"
        if what:
            faults.append(kind)
            not_refused += "NOT refused" in what
            print(f"  {time.strftime('%H:%M:%S')} step {len(metric_steps())}: {what}", flush=True)
        next_fault = time.monotonic() + random.expovariate(1 / fault_every)
    last_status = manager_status(headers) or last_status
    time.sleep(1.0)
code = proc.wait()
out.close()
minutes = (time.monotonic() - t_start) / 60

time.sleep(2)
alive = []
for pid, (c, created) in seen.items():
    try:
        p = psutil.Process(pid)
        if p.create_time() == created and p.status() != psutil.STATUS_ZOMBIE:
            alive.append(f"{pid}: {c[:120]}")
    except psutil.NoSuchProcess:
        pass
restarts, failed_episodes = {}, 0
for fname in sorted(os.listdir(log_dir)) if os.path.isdir(log_dir) else []:
    if fname.endswith(".log"):
        text = open(os.path.join(log_dir, fname), errors="replace").read()
        n = len(re.findall(r"realhf launcher: restart \d+ of", text))
        if n:
            restarts[fname[:-4]] = n
        failed_episodes += len(re.findall(r"episode \S+ failed", text))
trained = collections.Counter()
qid_file = os.path.join(log_dir, "trained_qids.jsonl")
if os.path.isfile(qid_file):
    with open(qid_file) as f:
        for line in f:
            if line.strip():
                trained.update(json.loads(line)["qids"])
duplicated = sorted(q for q, n in trained.items() if n > 1)
steps = metric_steps()
steps_ok = steps == list(range(1, steps_target + 1))
tail = open(os.path.join(root, "soak.out"), errors="replace").read().strip().splitlines()[-1:]
s = last_status or {}
print(f"\nsoak finished after {minutes:.1f} min: exit code {code} ({tail[0] if tail else 'no output'})")
print(f"  steps completed:        {len(steps)} of {steps_target} ({'exactly 1..N' if steps_ok else 'NOT 1..N'})")
c = collections.Counter(faults)
print(f"  faults:                 {len(faults)} ({c['kill']} SIGKILLs, {c['stop']} SIGSTOPs, {c['hostile']} hostile bursts; "
      f"{not_refused} bursts had a request not refused)")
print(f"  restarts:               {sum(restarts.values())} {restarts}")
print(f"  groups trained:         {sum(trained.values())} ({len(duplicated)} trained twice{': ' + str(duplicated[:5]) if duplicated else ''})")
print(f"  episodes failed (slot freed, prompt re-run or dropped): {failed_episodes}; in-flight groups re-admitted after "
      f"a worker death: {s.get('abandoned', '?')}; servers dropped from routing: {s.get('servers_dropped', '?')}")
print(f"  processes left:         {len(alive)}" + "".join(f"\n    {a}" for a in alive))
ok = code == 0 and steps_ok and not duplicated and not alive and not not_refused and trained
sys.exit(0 if ok else 1)
PY
