"""Loopback stand-ins for the chat robots Tally posts alerts to — a DingTalk custom robot, a
Feishu/Lark custom bot, a WeCom group robot — on 127.0.0.1, each checking a request the way its
vendor documents and answering the way the vendor does: HTTP 200 with `errcode` / `code` 0, or
the vendor's error code and message.

- DingTalk: the `access_token` query parameter must be the robot's; with a secret, `timestamp`
  (ms, within an hour of now) and `sign` = base64(HMAC-SHA256(key=secret,
  msg="timestamp\\nsecret")) must be query parameters (URL-encoded); else errcode 310000. The
  body is `msgtype` `markdown` (`title`, `text`) or `text` (`content`), at most 20,000 bytes.
- Feishu: `timestamp` (s, a string, within an hour) and `sign` = base64(HMAC-SHA256(
  key="timestamp\\nsecret", msg="")) in the JSON body; else code 19021. `msg_type` `text`
  with `content.text`; a body over 20 KB is refused (code 9499).
- WeCom: the `key` query parameter must be the robot's (else errcode 93000); `msgtype`
  `markdown` with `markdown.content` of at most 4,096 bytes (else errcode 40058).

The signatures are recomputed here independently of `streams.alerts.chat`, from the vendors'
recipes. `script` holds (errcode, errmsg) answers to give first (rate limits, outages).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

HOUR_MS = 3_600_000
FEISHU_SIGN_FAILED = "sign match fail or timestamp is not within one hour from current time"


@dataclass
class Robot:
    """One robot: what it accepted (`messages`), what it refused (`refused`)."""

    vendor: str  # dingtalk | feishu | wecom
    token: str
    secret: str | None
    server: ThreadingHTTPServer | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    requests: int = 0
    script: list[tuple[int, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self.server is not None
        base = f"http://127.0.0.1:{self.server.server_port}"
        if self.vendor == "dingtalk":
            return f"{base}/robot/send?access_token={self.token}"
        if self.vendor == "feishu":
            return f"{base}/open-apis/bot/v2/hook/{self.token}"
        return f"{base}/cgi-bin/webhook/send?key={self.token}"

    def wait_for(self, count: int, timeout_s: float = 10.0) -> int:
        """Wait until `count` requests arrived (accepted or not); how many did."""
        deadline = time.monotonic() + timeout_s
        while self.requests < count and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.requests

    # ---------------------------------------------------------------- the vendors' checks

    def answer(self, path: str, raw: bytes) -> dict[str, Any]:
        with self.lock:
            self.requests += 1
            if self.script:
                code, message = self.script.pop(0)
                return self._error(code, message)
        url = urlsplit(path)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(*self._bad_body())
        check = {"dingtalk": self._dingtalk, "feishu": self._feishu, "wecom": self._wecom}
        problem = check[self.vendor](url.path, query, raw, body)
        if problem is not None:
            with self.lock:
                self.refused.append(problem)
            return self._error(*problem)
        with self.lock:
            self.messages.append(body)
        if self.vendor == "feishu":
            return {"StatusCode": 0, "StatusMessage": "success", "code": 0, "data": {}, "msg": "ok"}
        return {"errcode": 0, "errmsg": "ok"}

    def _error(self, code: int, message: str) -> dict[str, Any]:
        if self.vendor == "feishu":
            return {"code": code, "data": {}, "msg": message}
        return {"errcode": code, "errmsg": message}

    def _bad_body(self) -> tuple[int, str]:
        return (9499, "Bad Request") if self.vendor == "feishu" else (40035, "invalid json")

    def _dingtalk(
        self, path: str, query: dict[str, str], raw: bytes, body: Any
    ) -> tuple[int, str] | None:
        if path != "/robot/send" or query.get("access_token") != self.token:
            return 300001, "token is not exist"
        if self.secret is not None:
            timestamp, sign = query.get("timestamp"), query.get("sign")
            if timestamp is None or sign is None or not timestamp.isdigit():
                return 310000, "sign not match, more: [missing timestamp or sign]"
            if abs(time.time_ns() // 1_000_000 - int(timestamp)) > HOUR_MS:
                return 310000, "invalid timestamp"
            message = f"{timestamp}\n{self.secret}".encode()
            expected = base64.b64encode(
                hmac.new(self.secret.encode(), message, hashlib.sha256).digest()
            ).decode()
            if not hmac.compare_digest(sign, expected):
                return 310000, "sign not match"
        kind = body.get("msgtype") if isinstance(body, dict) else None
        if kind == "markdown":
            markdown = body.get("markdown") or {}
            text, title = markdown.get("text"), markdown.get("title")
            if not isinstance(text, str) or not isinstance(title, str) or not title:
                return 40035, "缺少参数 markdown.title or markdown.text"
        elif kind == "text":
            text = (body.get("text") or {}).get("content")
            if not isinstance(text, str):
                return 40035, "缺少参数 text.content"
        else:
            return 40035, "缺少参数 msgtype"
        if len(text.encode()) > 20_000:
            return 460101, "message too long, exceed 20000 bytes"
        return None

    def _feishu(
        self, path: str, query: dict[str, str], raw: bytes, body: Any
    ) -> tuple[int, str] | None:
        if path != f"/open-apis/bot/v2/hook/{self.token}":
            return 19001, "param invalid: incoming webhook access token invalid"
        if len(raw) > 20 * 1024:
            return 9499, "Bad Request: request body over 20 KB"
        if not isinstance(body, dict):
            return 9499, "Bad Request"
        if self.secret is not None:
            timestamp, sign = body.get("timestamp"), body.get("sign")
            stale = (
                not isinstance(timestamp, str)
                or not timestamp.isdigit()
                or abs(time.time() - int(timestamp)) > 3600
            )
            if stale or not isinstance(sign, str):
                return 19021, FEISHU_SIGN_FAILED
            key = f"{timestamp}\n{self.secret}".encode()
            expected = base64.b64encode(hmac.new(key, b"", hashlib.sha256).digest()).decode()
            if not hmac.compare_digest(sign, expected):
                return 19021, FEISHU_SIGN_FAILED
        if body.get("msg_type") != "text" or not isinstance(
            (body.get("content") or {}).get("text"), str
        ):
            return 9499, "Bad Request"
        return None

    def _wecom(
        self, path: str, query: dict[str, str], raw: bytes, body: Any
    ) -> tuple[int, str] | None:
        if path != "/cgi-bin/webhook/send" or query.get("key") != self.token:
            return 93000, "invalid webhook url, hint: [key]"
        if not isinstance(body, dict) or body.get("msgtype") != "markdown":
            return 40008, "invalid message type"
        content = (body.get("markdown") or {}).get("content")
        if not isinstance(content, str):
            return 41009, "missing markdown.content"
        if len(content.encode()) > 4096:
            return 40058, "markdown.content exceed max length 4096"
        return None


def start_robot(vendor: str, token: str = "tok-123", secret: str | None = None) -> Robot:
    robot = Robot(vendor, token, secret)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers["Content-Length"]))
            answer = json.dumps(robot.answer(self.path, raw)).encode()
            self.send_response(200)  # the vendors answer 200, errors included
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    robot.server = server
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return robot


def stop_robot(robot: Robot) -> None:
    if robot.server is not None:
        robot.server.shutdown()
        robot.server.server_close()
