"""One POST of a JSON payload to a webhook, and what came of it (`Attempt`).

The one place that handles `requests`' exceptions for alert delivery: timeouts and connection
errors become a retryable `Attempt`, as do 408, 425, 429 and 5xx answers; other 4xx answers are
final (resending the same payload cannot succeed). A chat robot (DingTalk, Feishu, WeCom)
answers a failure with HTTP 200 and an error code in its body (`streams.alerts.chat`): that is
a failed `Attempt` too, retried only for the vendor's rate-limit codes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import requests

from streams.alerts.chat import retried, vendor_error
from streams.alerts.settings import CHAT_KINDS, SinkKind

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
    session: requests.Session,
    url: str,
    body: Any,
    timeout_s: float,
    headers: Mapping[str, str],
    kind: SinkKind | None = None,
) -> Attempt:
    """POST `body` as JSON; `kind` says how to read a 2xx answer (a chat robot's error code)."""
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
        error = vendor_error(kind, response.text) if kind in CHAT_KINDS else None
        if error is not None:
            code, message = error
            retry = retried(kind, code) if kind is not None else False
            return Attempt(False, retry, f"HTTP {status}, error {code}: {message}", status, seconds)
        return Attempt(True, False, f"HTTP {status}", status, seconds)
    retry = status >= 500 or status in RETRIED_STATUS
    body_text = response.text[:200].strip()
    return Attempt(False, retry, f"HTTP {status}: {body_text}", status, seconds)
