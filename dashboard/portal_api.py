"""The self-service portal's calls to the scheduler's API, made as the signed-in person: their
access token from the dashboard's login (`st.user.tokens["access"]`, exposed by
`expose_tokens` in the `[auth]` secrets `tally` writes) is forwarded as the bearer token, so
the API's own role checks decide what they may see, submit and cancel. The API's URL is
`$TALLY_API_URL` (`scheduler.host`/`port`, set by `tally` with a dashboard login). The
Requests page (`dashboard.page_requests`) files, reads and decides quota and budget requests
(`/v1/requests`) through the same client.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from typing import Any

import requests

API_URL_ENV = "TALLY_API_URL"
TIMEOUT_S = 10


class PortalError(Exception):
    """The API refused or could not be reached; the message says why, for the person."""


def api_url() -> str | None:
    return os.environ.get(API_URL_ENV) or None


@dataclass(frozen=True, slots=True)
class PortalClient:
    url: str
    token: str

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.token}", **kw.pop("headers", {})}
        try:
            response = requests.request(
                method, self.url + path, headers=headers, timeout=TIMEOUT_S, **kw
            )
        except requests.RequestException as exc:
            reason = f"the scheduler's API at {self.url} cannot be reached: {exc}"
            raise PortalError(reason) from None
        try:
            body = response.json()
        except ValueError:
            body = {}
        if response.status_code >= 400:
            error = body.get("error") if isinstance(body, dict) else None
            detail = error.get("message") if isinstance(error, dict) else None
            raise PortalError(f"the scheduler refused ({response.status_code}): {detail or ''}")
        return body

    def jobs(self, user: str | None = None) -> list[dict[str, Any]]:
        """Every job the caller may see (its team's; `user`: only theirs), all pages."""
        found: list[dict[str, Any]] = []
        params: dict[str, str] = {"limit": "200"} | ({"user": user} if user else {})
        while True:
            page = self._call("GET", "/v1/jobs", params=params)
            found.extend(page["jobs"])
            if not page.get("next_cursor"):
                return found
            params["cursor"] = page["next_cursor"]

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        key = {"Idempotency-Key": uuid.uuid4().hex}
        return dict(self._call("POST", "/v1/jobs", json=body, headers=key)["job"])

    def cancel(self, job_id: str) -> dict[str, Any]:
        key = {"Idempotency-Key": uuid.uuid4().hex}
        return dict(self._call("POST", f"/v1/jobs/{job_id}/cancel", headers=key)["job"])

    def balances(self) -> list[dict[str, Any]]:
        return list(self._call("GET", "/v1/balances")["balances"])

    def requests(self, status: str | None = None) -> list[dict[str, Any]]:
        """The quota and budget requests the caller may see (a team role: its team's)."""
        params = {"status": status} if status else {}
        return list(self._call("GET", "/v1/requests", params=params)["requests"])

    def open_request(self, body: dict[str, Any]) -> dict[str, Any]:
        return dict(self._call("POST", "/v1/requests", json=body)["request"])

    def decide(self, request_id: str, approve: bool, comment: str) -> dict[str, Any]:
        """Approve or reject `request_id` with `comment` (the API's policy decides who may)."""
        verb = "approve" if approve else "reject"
        path = f"/v1/requests/{request_id}/{verb}"
        return dict(self._call("POST", path, json={"comment": comment})["request"])
