"""Generation servers the run does not launch (`gen_server.urls`): checked before anything starts."""

from __future__ import annotations

import json
import urllib.request
from typing import List

from realhf.experiments.validation import ConfigError
from realhf.impl.inference.request import parse_weight_version

START_HINT = "start it first, e.g. `python -m realhf.launch_server --model-path <actor.path> --port <port>`"


def check_external_servers_answer(urls: List[str], start_version: int, timeout: float = 10.0) -> None:
    """Each server answers GET /get_model_info, and none serves a weight version ahead of the run's
    start: a built-in server never goes back a version, so one left at version 50 by an earlier run
    would refuse this run's versions 1..50."""
    for i, url in enumerate(urls):
        try:
            with urllib.request.urlopen(f"{url.rstrip('/')}/get_model_info", timeout=timeout) as r:
                info = json.loads(r.read())
        except (OSError, ValueError) as e:
            raise ConfigError(f"gen_server.urls[{i}]={url}: GET /get_model_info failed ({e}); {START_HINT}") from None
        version = parse_weight_version(info.get("weight_version")) if isinstance(info, dict) else None
        if version is not None and version > start_version:
            raise ConfigError(
                f"gen_server.urls[{i}]={url} serves weight_version {version}, ahead of this run's {start_version} "
                "(left by an earlier run?): a built-in server never goes back a version, so it would refuse this "
                "run's weights; restart it"
            )
