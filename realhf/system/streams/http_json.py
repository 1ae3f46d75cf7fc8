"""The rollout side's one kind of HTTP call, POST JSON → JSON object, and the errors it raises.

Used to talk to the GserverManager (`manager_client`), to generation servers (`generation_client`)
and to pause/update/continue servers (`weight_update`). Every error names the URL, and says
whether the peer was unreachable or overloaded (`ServerUnavailableError`: worth resubmitting
elsewhere) or answered wrongly (`GenerationError`: the caller's problem).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Dict, Optional

import aiohttp


class GenerationError(RuntimeError):
    pass


class ServerUnavailableError(GenerationError):
    """The peer could not be reached (`status` None) or said it cannot serve now (HTTP 502/503)."""

    def __init__(self, message: str, status: Optional[int] = None):
        super().__init__(message)
        self.status = status


async def post_json(
    session: aiohttp.ClientSession, url: str, body: Dict[str, Any], timeout: float, allow_list: bool = False
) -> Any:
    """POST JSON, return the JSON answer (an object; or a list, with `allow_list`: SGLang answers
    a batch or n > 1 samples with one); errors name the URL (and the server's message)."""
    return await request_json(session, "POST", url, timeout, body, allow_list)


async def request_json(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    timeout: float,
    body: Optional[Dict[str, Any]] = None,
    allow_list: bool = False,
) -> Any:
    """`method` (GET, or POST with a JSON `body`), return the JSON answer; errors as `post_json`'s."""
    try:
        async with session.request(method, url, json=body, timeout=aiohttp.ClientTimeout(total=timeout)) as r:
            text = await r.text()
            if r.status in (502, 503):
                raise ServerUnavailableError(f"{method} {url} returned HTTP {r.status}: {text[:300]}", r.status)
            if r.status != 200:
                raise GenerationError(f"{method} {url} returned HTTP {r.status}: {text[:300]}")
    except asyncio.TimeoutError:
        raise TimeoutError(f"{method} {url}: no answer within {timeout:.1f}s") from None
    except aiohttp.ClientConnectionError as e:  # refused, reset, dropped mid-answer
        raise ServerUnavailableError(f"{method} {url} failed: {type(e).__name__}: {e}") from None
    except aiohttp.ClientError as e:
        raise GenerationError(f"{method} {url} failed: {type(e).__name__}: {e}") from None
    try:
        answer = json.loads(text)
    except ValueError:
        raise GenerationError(f"{method} {url} answered with non-JSON: {text[:200]!r}") from None
    if not isinstance(answer, dict) and not (allow_list and isinstance(answer, list)):
        raise GenerationError(f"{method} {url} answered with {type(answer).__name__}, expected a JSON object")
    return answer
