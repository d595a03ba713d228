"""One POST of a JSON payload to a webhook, and what came of it (`Attempt`).

The one place that handles `requests`' exceptions for alert delivery: timeouts and connection
errors become a retryable `Attempt`, as do 408, 425, 429 and 5xx answers; other 4xx answers are
final (resending the same payload cannot succeed).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import requests

RETRIED_STATUS = frozenset({408, 425, 429})


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one POST: `ok`, or whether trying again could help, and why."""

    ok: bool
    retry: bool
    detail: str
    status: int | None = None
    seconds: float = 0.0


def post_json(
    session: requests.Session, url: str, body: Any, timeout_s: float, headers: Mapping[str, str]
) -> Attempt:
    started = time.monotonic()
    try:
        response = session.post(
            url,
            data=orjson.dumps(body),
            headers={"Content-Type": "application/json", **headers},
            timeout=timeout_s,
        )
    except requests.Timeout:
        return Attempt(False, True, f"no answer within {timeout_s:g}s", None, timeout_s)
    except requests.RequestException as exc:
        return Attempt(False, True, f"{type(exc).__name__}: {exc}", None)
    seconds = time.monotonic() - started
    status = response.status_code
    if 200 <= status < 300:
        return Attempt(True, False, f"HTTP {status}", status, seconds)
    retry = status >= 500 or status in RETRIED_STATUS
    body_text = response.text[:200].strip()
    return Attempt(False, retry, f"HTTP {status}: {body_text}", status, seconds)
