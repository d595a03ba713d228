"""The chat robots: DingTalk custom robots, Feishu/Lark custom bots and WeCom group robots, as
their vendors document them — message bodies, request signing, size limits, and how each
answers a failure.

Pure functions; nothing here sends anything (`streams.alerts.webhook` does).

- **Bodies.** DingTalk: `{"msgtype": "markdown", "markdown": {"title", "text"}}`. Feishu:
  `{"msg_type": "text", "content": {"text"}}` (plain text: a custom bot's `post` and card
  formats need nothing a summary does not give). WeCom: `{"msgtype": "markdown", "markdown":
  {"content"}}`.
- **Signing** (when the robot's security setting is "signature" and a secret is configured).
  DingTalk: `timestamp` (ms) and `sign` query parameters, sign =
  urlencode(base64(HMAC-SHA256(key=secret, msg=f"{timestamp}\\n{secret}"))). Feishu:
  `timestamp` (s, as a string) and `sign` in the JSON body, sign =
  base64(HMAC-SHA256(key=f"{timestamp}\\n{secret}", msg=b"")). Both vendors refuse a timestamp
  more than an hour from their clock, so a request is signed at each try, never once for all.
  WeCom has no signing: the robot's key is in its URL.
- **Limits.** DingTalk and Feishu take at most 20,000 bytes of message text (Feishu: 20 KB for the
  whole body), WeCom at most 4,096 bytes of markdown content, all UTF-8. Text over the limit is
  cut to a bounded excerpt (`ledger.excerpts`) that fits in bytes.
- **Answers.** All three answer HTTP 200 with an error code in the body on failure: DingTalk and
  WeCom `{"errcode": n, "errmsg": …}`, Feishu `{"code": n, "msg": …}` (older deployments
  `{"StatusCode": n, "StatusMessage": …}`); 0 is success. Rate-limit codes are retried like a
  429 (DingTalk 130101 and 410100 "send too fast", Feishu 11232 "frequency limited", WeCom 45009
  "api freq out of limit" and -1 "system busy"); every other code is final (a bad signature,
  a missing keyword, an address not on the allow-list: resending cannot succeed).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from typing import Any
from urllib.parse import quote_plus

import orjson

from ledger.excerpts import MIN_LIMIT, bounded, digest_of
from streams.alerts.settings import SinkKind

DINGTALK_TEXT_BYTES = 20_000
FEISHU_TEXT_BYTES = 18_000  # of a 20 KB body: room for the envelope, the timestamp and sign
WECOM_CONTENT_BYTES = 4_096
TITLE_CHARS = 64

RETRIED_CODES: dict[SinkKind, frozenset[int]] = {
    SinkKind.DINGTALK: frozenset({130101, 410100}),
    SinkKind.FEISHU: frozenset({11232}),
    SinkKind.WECOM: frozenset({45009, -1}),
}


def _utf8(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def fit_bytes(text: str, max_bytes: int) -> str:
    """`text` when its UTF-8 encoding fits in `max_bytes`, else its longest head that fits
    with the excerpt marker of `ledger.excerpts` after it (the original's length in characters
    and its SHA-256 prefix)."""
    if max_bytes < MIN_LIMIT:
        raise ValueError(f"a byte limit must be at least {MIN_LIMIT}")
    if _utf8(text) <= max_bytes:
        return text
    mark = f"…[cut: {len(text)} chars, sha256 {digest_of(text)}]"
    room = max_bytes - _utf8(mark)
    used = 0
    end = 0
    for char in text:
        used += _utf8(char)
        if used > room:
            break
        end += 1
    return text[:end] + mark


def dingtalk_sign(secret: str, timestamp_ms: int) -> str:
    """DingTalk's `sign`: base64 of HMAC-SHA256 keyed by the secret over "timestamp\\nsecret",
    before URL encoding."""
    message = f"{timestamp_ms}\n{secret}".encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def feishu_sign(secret: str, timestamp_s: int) -> str:
    """Feishu's `sign`: base64 of HMAC-SHA256 keyed by "timestamp\\nsecret" over nothing."""
    key = f"{timestamp_s}\n{secret}".encode()
    return base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()


def chat_body(kind: SinkKind, title: str, markdown: str, plain: str) -> dict[str, Any]:
    """The unsigned body for a chat robot: `markdown` for DingTalk and WeCom, `plain` for
    Feishu, each cut to its vendor's limit."""
    if kind is SinkKind.DINGTALK:
        return {
            "msgtype": "markdown",
            "markdown": {
                "title": bounded(title, TITLE_CHARS),
                "text": fit_bytes(markdown, DINGTALK_TEXT_BYTES),
            },
        }
    if kind is SinkKind.FEISHU:
        return {"msg_type": "text", "content": {"text": fit_bytes(plain, FEISHU_TEXT_BYTES)}}
    if kind is SinkKind.WECOM:
        content = fit_bytes(markdown, WECOM_CONTENT_BYTES)
        return {"msgtype": "markdown", "markdown": {"content": content}}
    raise ValueError(f"{kind.value} is not a chat robot")


def signed(
    kind: SinkKind, url: str, body: dict[str, Any], secret: str | None, now_us: int
) -> tuple[str, dict[str, Any]]:
    """Where to post `body` and what to post, signed at `now_us` when `secret` is set."""
    if not secret:
        return url, body
    if kind is SinkKind.DINGTALK:
        timestamp_ms = now_us // 1_000
        sign = quote_plus(dingtalk_sign(secret, timestamp_ms))
        joiner = "&" if "?" in url else "?"
        return f"{url}{joiner}timestamp={timestamp_ms}&sign={sign}", body
    if kind is SinkKind.FEISHU:
        timestamp_s = now_us // 1_000_000
        return url, {
            "timestamp": str(timestamp_s),
            "sign": feishu_sign(secret, timestamp_s),
            **body,
        }
    return url, body  # WeCom: nothing to sign


def vendor_error(kind: SinkKind, text: str) -> tuple[int, str] | None:
    """The (code, message) of a failure a chat robot answered with HTTP 200; None for success.
    An answer that is not the vendor's JSON counts as success only if it is empty (a proxy
    in front of the robot answering 200 with nothing)."""
    if not text.strip():
        return None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError:
        return (-2, f"not the vendor's JSON answer: {bounded(text, 200)}")
    if type(doc) is not dict:
        return (-2, f"not the vendor's JSON answer: {bounded(text, 200)}")
    if kind is SinkKind.FEISHU:
        code = doc.get("code", doc.get("StatusCode", 0))
        message = doc.get("msg", doc.get("StatusMessage", ""))
    else:
        code = doc.get("errcode", 0)
        message = doc.get("errmsg", "")
    if type(code) is not int:
        return (-2, f"not the vendor's JSON answer: {bounded(text, 200)}")
    if code == 0:
        return None
    return code, bounded(str(message), 200)


def retried(kind: SinkKind, code: int) -> bool:
    """Whether a chat robot's error code is worth another try (its rate limits)."""
    return code in RETRIED_CODES.get(kind, frozenset())
