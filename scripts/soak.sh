#!/usr/bin/env bash
# Soak test (not in CI): run the embedded default for N minutes while SIGKILLing random
# generation servers and rollout workers, then Ctrl-C it and report steps completed, groups
# lost, restarts and processes left.
#
#   scripts/soak.sh [MINUTES=30] [extra key=value overrides for training/main_async_ppo.py ...]
#
# Environment: KILL_EVERY (mean seconds between kills, default 45), SOAK_ROOT (fileroot,
# default a fresh temporary directory), PYTHON (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES="${1:-30}"
shift || true
PYTHON="${PYTHON:-.venv/bin/python}"
SOAK_ROOT="${SOAK_ROOT:-$(mktemp -d /tmp/realhf-soak.XXXXXX)}"
export MINUTES SOAK_ROOT KILL_EVERY="${KILL_EVERY:-45}"

exec "$PYTHON" - "$@" <<'PY'
import json, os, random, re, signal, subprocess, sys, time, urllib.request
import psutil

minutes, root, kill_every = float(os.environ["MINUTES"]), os.environ["SOAK_ROOT"], float(os.environ["KILL_EVERY"])
trial = "soak"
log_dir = os.path.join(root, "logs", "async-ppo-math", trial)
cmd = [sys.executable, "training/main_async_ppo.py", f"trial_name={trial}", f"cluster.fileroot={root}",
       "exp_ctrl.benchmark_steps=100000000", "evaluation.n_prompts=0",
       "cluster.restart_policy.max_restarts=100000", *sys.argv[1:]]
out = open(os.path.join(root, "soak.out"), "w")
print(f"soak: {minutes:g} min, a kill every ~{kill_every:g}s; output in {out.name}; logs in {log_dir}", flush=True)
proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
seen = {}  # pid -> (cmdline, create_time) of every descendant

def track():
    try:
        for p in psutil.Process(proc.pid).children(recursive=True):
            try:
                seen.setdefault(p.pid, (" ".join(p.cmdline()), p.create_time()))
            except psutil.Error:
                pass
    except psutil.NoSuchProcess:
        pass

def victims():
    found = []
    for pid, (c, created) in seen.items():
        m = re.search(r"configs/((generation_server|rollout_worker)-\d+)\.yaml", c)
        try:
            if m and psutil.Process(pid).create_time() == created and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                found.append((m.group(1), pid))
        except psutil.NoSuchProcess:
            pass
    return found

def steps():
    try:
        with open(os.path.join(log_dir, "metrics.jsonl")) as f:
            return sum(1 for line in f if line.strip())
    except FileNotFoundError:
        return 0

def manager_status():
    try:
        with open(os.path.join(log_dir, "gserver_manager-0.log")) as f:
            url = re.search(r"serving on (http://\S+):", f.read()).group(1)
        with urllib.request.urlopen(f"{url}/status", timeout=10) as r:
            return json.loads(r.read())
    except Exception:
        return None

t_end = time.monotonic() + minutes * 60
next_kill = time.monotonic() + 60 + random.expovariate(1 / kill_every)  # let it start first
kills, last_status = [], None
while time.monotonic() < t_end and proc.poll() is None:
    track()
    if time.monotonic() >= next_kill:
        live = victims()
        if live:
            name, pid = random.choice(live)
            os.kill(pid, signal.SIGKILL)
            kills.append(name)
            print(f"  {time.strftime('%H:%M:%S')} SIGKILL {name} (pid {pid}) at step {steps()}", flush=True)
        next_kill = time.monotonic() + random.expovariate(1 / kill_every)
    last_status = manager_status() or last_status
    time.sleep(1.0)

ended_early = proc.poll() is not None
if not ended_early:
    proc.send_signal(signal.SIGINT)
try:
    code = proc.wait(timeout=120)
except subprocess.TimeoutExpired:
    proc.kill()
    code = proc.wait()
out.close()

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
tail = open(os.path.join(root, "soak.out"), errors="replace").read().strip().splitlines()[-1:]
s = last_status or {}
print(f"\nsoak finished after {minutes:g} min{' (the run ENDED EARLY)' if ended_early else ''}: exit code {code}"
      f" ({tail[0] if tail else 'no output'})")
print(f"  steps completed:        {steps()}")
print(f"  kills:                  {len(kills)} ({sum(k.startswith('generation_server') for k in kills)} generation servers, "
      f"{sum(k.startswith('rollout_worker') for k in kills)} rollout workers)")
print(f"  restarts:               {sum(restarts.values())} {restarts}")
print(f"  groups lost (episodes failed): {failed_episodes}; in-flight groups re-admitted after a worker death: "
      f"{s.get('abandoned', '?')}; servers dropped from routing: {s.get('servers_dropped', '?')}")
print(f"  manager at the last look: version {s.get('version')} running {s.get('running')} accepted {s.get('accepted')}")
print(f"  processes left:         {len(alive)}" + "".join(f"\n    {a}" for a in alive))
sys.exit(0 if not alive and not ended_early and code == 130 else 1)
PY
