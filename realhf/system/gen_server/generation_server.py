"""GenerationServer worker: one inference server behind the SGLang protocol (docs/architecture.md §2, §5).

    configure: pick the weights: the latest version published under `weights_root` (named by
               `model_version/<role>`), so a restarted server rejoins with the current weights,
               else `model_path` at `weight_version`
               start the backend on `host` and a free port
               native: the built-in engine thread + uvicorn (realhf.impl.inference) in this process,
                       on `pick_device(device, base_gpu_id)`: weights, cache and steps all there,
                       held to `gpu_memory_fraction` of a GPU it shares with a trainer rank
               sglang: `python -m sglang.launch_server` as a child process, wait for /health
               vllm:   realhf's server around vLLM (realhf.launch_vllm_server) as a
                       child process from vLLM's own environment, wait for /health
               then register `http://host:port` under gen_servers/ (keep-alive key)
    loop:      check every `health_check_interval` s that the backend is alive and answers: a
               dead backend fails the worker at once; a hung one (the engine thread stuck in a
               step, the HTTP server not answering /health) fails it after `max_health_failures`
               checks in a row that got no answer within `health_timeout` s. Either way the
               worker exits non-zero and the launcher restarts it (a whole process that is
               SIGSTOPped cannot check itself: its keep-alive expires instead). Log load and
               throughput.
    exit:      deregister first (no new traffic), then stop the server and the engine / process tree

All the work is in the backend modules; this file only wires them to the worker lifecycle.
"""

from __future__ import annotations

import dataclasses
import os
import time
import urllib.error
import urllib.request
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Tuple

from realhf.api.worker_configs import GenerationServerConfig
from realhf.base import name_resolve, names
from realhf.base.network import find_free_port, host_for_peers
from realhf.base.secret import auth_headers, write_private
from realhf.base.trial_files import latest_published
from realhf.system.worker_base import Worker

_STATUS_LOG_INTERVAL = 30.0


class GenerationServer(Worker):
    config_cls = GenerationServerConfig
    warm_modules = (
        "realhf.base.device",
        "realhf.impl.inference.factory",
        "realhf.impl.inference.engine",
        "realhf.system.gen_server.server_app",
        "realhf.system.gen_server.sglang_generate",
        "realhf.system.streams.http_thread",
        # Loading any HF causal LM: most of its import time is these, shared by every model type.
        "transformers.modeling_utils",
        "transformers.masking_utils",
        "transformers.modeling_layers",
    )

    def _configure(self) -> None:
        self._engine = self._server = self._child = None
        self._key = None
        self._unanswered = 0  # liveness checks in a row without an answer (a hung backend)
        cfg: GenerationServerConfig = self.config
        seed = cfg.seed + self.ctx.worker_index
        if cfg.backend == "native":
            port = self._start_native_current(cfg, seed)
        else:
            model_path, version = self._current_weights(cfg)
            cfg = self.config = dataclasses.replace(cfg, model_path=model_path, weight_version=version)
            port = self._start_sglang(cfg, seed) if cfg.backend == "sglang" else self._start_vllm(cfg, seed)
        self.url = f"http://{host_for_peers(cfg.host)}:{port}"
        self._key = name_resolve.add_subentry(
            names.gen_servers(self.ctx.experiment_name, self.ctx.trial_name), self.url, keepalive_ttl=cfg.keepalive_ttl
        )
        self.logger.info(
            f"serving {self.config.model_path} (backend {cfg.backend}, weight version "
            f"{self.config.weight_version}) "
            f"at {self.url}; registered as {self._key}"
        )
        self._last_check = self._last_log = time.monotonic()

    def _current_weights(self, cfg: GenerationServerConfig) -> Tuple[str, int]:
        """(path, version) to serve: the trainer's latest published version if there is one."""
        if not cfg.weights_root:
            return cfg.model_path, cfg.weight_version
        try:
            version = int(
                name_resolve.get(names.model_version(self.ctx.experiment_name, self.ctx.trial_name, cfg.model_role))
            )
        except name_resolve.NameEntryNotFoundError:
            return cfg.model_path, cfg.weight_version
        path, found = latest_published(cfg.weights_root, at_most=version)
        if path is None:
            self.logger.warning(
                f"model_version/{cfg.model_role}={version} but nothing is published under "
                f"{cfg.weights_root}; serving {cfg.model_path} (the manager will update it)"
            )
            return cfg.model_path, cfg.weight_version
        self.logger.info(f"trainer is at version {version}: loading published version {found} from {path}")
        return path, found

    def _start_native_current(self, cfg: GenerationServerConfig, seed: int, attempts: int = 5) -> int:
        """`_start_native` on the current weights. The trainer prunes old versions while we load
        (keep_last_versions), so a version that vanished mid-load is retried with the newest."""
        for attempt in range(1, attempts + 1):
            model_path, version = self._current_weights(cfg)
            self.config = dataclasses.replace(cfg, model_path=model_path, weight_version=version)
            try:
                return self._start_native(self.config, seed)
            except Exception as e:  # noqa: BLE001 - re-raised unless the directory was pruned under us
                if model_path == cfg.model_path or os.path.isdir(model_path) or attempt == attempts:
                    raise
                self.logger.warning(
                    f"published version {version} vanished while loading ({e}); trying the newest again"
                )
                if self._engine is not None:
                    self._engine.stop()
                    self._engine = None
        raise AssertionError("unreachable")

    def _start_native(self, cfg: GenerationServerConfig, seed: int) -> int:
        from realhf.base.device import bind_device, cap_memory, pick_device, why_device
        from realhf.impl.inference.factory import create_engine_from_config
        from realhf.system.gen_server.server_app import create_app
        from realhf.system.gen_server.sglang_generate import load_tokenizer
        from realhf.system.streams.http_thread import HttpServerThread

        device = pick_device(cfg.device, 0 if self.ctx.gpus_assigned else cfg.base_gpu_id)
        bind_device(device)
        cap_memory(device, cfg.gpu_memory_fraction)  # a GPU shared with a trainer rank: our part of it
        share = (
            f", {cfg.gpu_memory_fraction:g} of its memory"
            if device.type != "cpu" and cfg.gpu_memory_fraction < 1
            else ""
        )
        self.logger.info(f"native engine on {device}{share} ({why_device(cfg.device, device)})")
        self._engine = create_engine_from_config(
            cfg.model_path, cfg.native, weight_version=cfg.weight_version, seed=seed, name=self.name, device=device
        ).start()
        app = create_app(
            self._engine,
            max_request_bytes=cfg.max_request_bytes,
            secret=self.ctx.secret,
            weights_root=cfg.weights_root,
            # Rollouts send input_ids; the tokenizer serves text to anyone else asking (SGLang's /generate).
            tokenizer=load_tokenizer(cfg.model_path),
            tokenizer_path=cfg.model_path,
        )
        self._server = HttpServerThread(app, cfg.host, cfg.port, name="generation server").start(
            timeout=cfg.startup_timeout
        )
        return self._server.port

    def _start_sglang(self, cfg: GenerationServerConfig, seed: int) -> int:
        from realhf.impl.inference.sglang_launcher import build_sglang_command, sglang_available

        if not sglang_available():
            raise RuntimeError(
                "backend=sglang needs the sglang package in this environment "
                "(pip install 'sglang[all]'); use backend=native on CPU machines"
            )
        port = cfg.port or find_free_port(cfg.host)
        # The key goes to SGLang through an owner-only file, not its command line.
        key_file = self._key_file("sglang")
        cmd = build_sglang_command(
            cfg.model_path,
            cfg.host,
            port,
            cfg.sglang,
            tp_size=cfg.tp_size,
            base_gpu_id=0 if self.ctx.gpus_assigned else cfg.base_gpu_id,
            gpu_share=cfg.gpu_memory_fraction,
            seed=seed,
            api_key_file=key_file,
        )
        self._start_child("sglang", cmd, port, cfg.sglang.startup_timeout)
        return port

    def _start_vllm(self, cfg: GenerationServerConfig, seed: int) -> int:
        from realhf.impl.inference.vllm_launcher import build_vllm_command, per_server_cores, server_env, vllm_python

        port = cfg.port or find_free_port(cfg.host)
        vllm = cfg.vllm
        if vllm.cpu_threads_bind == "per_server":  # two unbound engines on one machine fight for its cores
            cores = sorted(os.sched_getaffinity(0))
            bind = per_server_cores(cores, self.ctx.worker_index, max(self.ctx.worker_count, 1))
            vllm = dataclasses.replace(vllm, cpu_threads_bind=bind)
            self.logger.info(f"vLLM server {self.ctx.worker_index} of {self.ctx.worker_count}: cores {bind}")
        cmd = build_vllm_command(
            vllm_python(vllm),
            cfg.model_path,
            cfg.host,
            port,
            vllm,
            seed=seed,
            weight_version=cfg.weight_version,
            gpu_share=cfg.gpu_memory_fraction,
            secret_file=self._key_file("vllm"),
            weights_root=cfg.weights_root,
            max_request_bytes=cfg.max_request_bytes,
        )
        env = {}
        if cfg.device != "cpu" and not self.ctx.gpus_assigned:  # vLLM uses the first GPU it sees
            env["CUDA_VISIBLE_DEVICES"] = str(cfg.base_gpu_id)
        self._start_child("vllm", cmd, port, cfg.vllm.startup_timeout, server_env(env))
        return port

    def _key_file(self, backend: str) -> str:
        """The run's secret in an owner-only file for the child server ("" without a secret)."""
        if not self.ctx.secret:
            return ""
        key_file = os.path.join(self.ctx.log_dir or ".", "configs", f"{backend}-key-{self.ctx.worker_index}")
        os.makedirs(os.path.dirname(key_file), mode=0o700, exist_ok=True)
        write_private(key_file, self.ctx.secret)
        return key_file

    def _start_child(self, backend: str, cmd, port: int, startup_timeout: float, env=None) -> None:
        from realhf.impl.inference.server_process import ServerProcess

        log_path = os.path.join(self.ctx.log_dir or ".", f"{backend}-{self.ctx.worker_index}.log")
        self._child = ServerProcess(
            cmd,
            f"http://{host_for_peers(self.config.host)}:{port}",
            log_path,
            startup_timeout=startup_timeout,
            health_timeout=self.config.health_timeout,
            headers=auth_headers(self.ctx.secret),
            env=env,
        ).start()

    def _poll(self) -> bool:
        now = time.monotonic()
        if now - self._last_check >= self.config.health_check_interval:
            self._last_check = now
            self._check_backend()
        if self._engine is not None and now - self._last_log >= _STATUS_LOG_INTERVAL:
            self._last_log = now
            s = self._engine.stats()
            self.logger.info(
                f"running={s.running} queued={s.queued} paused={s.paused} version={s.weight_version} "
                f"gen={s.gen_throughput:.0f} tok/s tokens={s.generation_tokens_total} "
                f"requests={s.requests_total} aborted={s.aborted_total}"
            )
        time.sleep(0.05)
        return True

    def _check_backend(self) -> None:
        if self._engine is not None and not self._engine.is_alive():
            raise RuntimeError(f"engine of {self.url} is no longer running")
        if self._server is not None and not self._server.is_alive():
            raise RuntimeError(f"HTTP server {self.url} stopped")
        if self._child is not None:
            code = self._child.exit_code()
            if code is not None:
                raise RuntimeError(
                    f"{self.config.backend} server {self.url} exited with code {code}; last lines of "
                    f"{self._child.log_path}:\n{self._child.log_tail()}"
                )
        self._check_answers()

    def _check_answers(self) -> None:
        """Alive but hung is dead too: the manager would keep routing to a server whose /health
        answers while its engine is stuck. Exit after `max_health_failures` checks in a row
        without an answer, so the launcher restarts this worker."""
        cfg = self.config
        problem = self._unanswered_part(cfg.health_timeout)
        if not problem:
            if self._unanswered:
                self.logger.info(f"{self.url} answers again after {self._unanswered} unanswered liveness checks")
            self._unanswered = 0
            return
        self._unanswered += 1
        self.logger.warning(
            f"{self.url}: {problem} (liveness check {self._unanswered} of "
            f"max_health_failures={cfg.max_health_failures} in a row)"
        )
        if self._unanswered >= cfg.max_health_failures:
            raise RuntimeError(
                f"generation server {self.url} is hung: {problem}, {self._unanswered} liveness "
                f"checks in a row (health_timeout={cfg.health_timeout:g}s); exiting so that it is restarted"
            )

    def _unanswered_part(self, timeout: float) -> str:
        """What did not answer within `timeout` s ("" when everything did): the engine thread
        (a no-op command through its queue, which it applies between two steps), then the HTTP
        server's /health."""
        if self._engine is not None:
            try:
                self._engine.flush_cache().result(timeout=timeout)  # no cache to flush: a no-op
            except FutureTimeout:
                return f"the engine thread did not apply a no-op command within {timeout:g}s (stuck in a step?)"
        try:
            request = urllib.request.Request(f"{self.url}/health", headers=auth_headers(self.ctx.secret))
            with urllib.request.urlopen(request, timeout=timeout) as resp:
                resp.read()
        except urllib.error.HTTPError as e:
            return f"GET /health answered HTTP {e.code}"
        except (urllib.error.URLError, OSError) as e:  # a timeout is an OSError
            return f"GET /health got no answer within {timeout:g}s ({type(e).__name__}: {e})"
        return ""

    def _exit_hook(self) -> None:
        if getattr(self, "_key", None):
            try:
                name_resolve.delete(self._key)
            except Exception as e:  # expired or Redis gone: nothing left to withdraw
                self.logger.warning(f"could not delete {self._key}: {e}")
        if getattr(self, "_engine", None) is not None:
            # Queued and running requests return with abort. A hung engine thread will not
            # stop: do not wait the usual 10 s for it before answering them.
            hung = getattr(self, "_unanswered", 0) >= self.config.max_health_failures
            self._engine.stop(timeout=1.0 if hung else 10.0)
        if getattr(self, "_server", None) is not None:
            self._server.stop()
        if getattr(self, "_child", None) is not None:
            self._child.stop()
        self.logger.info("generation server stopped")
