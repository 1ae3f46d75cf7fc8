"""A stand-in `sglang` package for tests: `python -m sglang.launch_server` that parses SGLang's
flags strictly, requires `Authorization: Bearer <--api-key>` when given one, and answers /health
after a delay. Knobs (environment): FAKE_SGLANG_DELAY (s),
FAKE_SGLANG_EXIT (exit with this code at once, after a log line), FAKE_SGLANG_CHILD=1 (spawn a
grandchild process, to check that the whole tree is killed)."""

LAUNCH_SERVER = r"""
import argparse, os, subprocess, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
for flag in ("--model-path", "--tp-size", "--base-gpu-id", "--random-seed", "--host", "--port",
             "--mem-fraction-static", "--dtype", "--kv-cache-dtype", "--log-level", "--context-length",
             "--max-running-requests", "--chunked-prefill-size", "--attention-backend", "--api-key"):
    p.add_argument(flag)
for flag in ("--skip-tokenizer-init", "--enable-metrics", "--disable-radix-cache"):
    p.add_argument(flag, action="store_true")
args = p.parse_args()
print("fake sglang starting", [a if a != args.api_key else "<key>" for a in sys.argv[1:]], flush=True)
if os.environ.get("FAKE_SGLANG_EXIT"):
    print("RuntimeError: CUDA error: fake failure", flush=True)
    sys.exit(int(os.environ["FAKE_SGLANG_EXIT"]))
if os.environ.get("FAKE_SGLANG_CHILD"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    print(f"child pid {child.pid}", flush=True)
ready_at = time.monotonic() + float(os.environ.get("FAKE_SGLANG_DELAY", "0"))

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        if args.api_key and self.headers.get("Authorization") != "Bearer " + args.api_key:
            self.send_response(401)  # like SGLang's --api-key middleware
            self.end_headers()
            return
        ok = self.path == "/health" and time.monotonic() >= ready_at
        self.send_response(200 if ok else 503)
        self.end_headers()
    def log_message(self, *a):
        pass

ThreadingHTTPServer((args.host, int(args.port)), H).serve_forever()
"""


def install(root) -> str:
    """Write the package under `root`; returns the directory to put on PYTHONPATH."""
    pkg = root / "sglang"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "launch_server.py").write_text(LAUNCH_SERVER)
    return str(root)
