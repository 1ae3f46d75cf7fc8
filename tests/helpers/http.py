"""One HTTP call as the tests make it: JSON in, (status, parsed JSON or text) out."""

import json
import urllib.error
import urllib.request


def http(method, url, body=None, timeout=60.0, headers=None):
    """(status, parsed JSON or text; None for an empty body) — never raises on 4xx/5xx.

    `body` is sent as JSON, or as is when it is bytes (fuzz and refusal tests send raw bytes);
    `headers` are added (e.g. `realhf.base.secret.auth_headers(secret)` for a launched run)."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(
        url, data=data, method=method, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    text = raw.decode()
    try:
        return status, json.loads(text) if text else None
    except json.JSONDecodeError:
        return status, text
