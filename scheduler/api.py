"""The scheduler's HTTP API: JSON over aiohttp, served in the service's own event loop (so
handlers and scheduling ticks never run at the same time on the state; the service's lock
orders submits, cancels and ticks).

Authentication: `Authorization: Bearer <token>`. A team's token sees and acts on that team's
jobs only; the admin token sees all. Tokens are compared in constant time.

    GET  /v1/health                   no token; liveness and counts
    POST /v1/jobs                     submit                               201 (202)
    GET  /v1/jobs[?state=&team=]      list (a team: its own)               200
    GET  /v1/jobs/{id}                one job                              200
    POST /v1/jobs/{id}/cancel         cancel (DELETE /v1/jobs/{id} too)    200 (202)
    GET  /v1/jobs/{id}/explain        why it waits, runs or ended          200
    GET  /v1/queues                   the queues and their load            200
    GET  /v1/balances[?team=]         budget and quota of a team (admin: all teams)

Errors are JSON, `{"error": {"status", "code", "message"}}`:
    400 bad_request       malformed JSON, a body that is not an object, unknown fields, wrong
                          types, values out of range (a negative GPU count, …)
    401 unauthorized      no token, or a token that is not known (with WWW-Authenticate)
    403 forbidden         a team token acting for another team (submit, ?team=)
    404 not_found         no such route, or no such job *for this caller*: another team's job
                          is "not found", never "forbidden", so its existence does not leak
    405 method_not_allowed
    409 conflict          cancelling a job that has ended
    413 too_large         a body over `max_body_bytes`
    415 unsupported_media a body whose Content-Type is not JSON
    422 unprocessable     a queue, team, project, GPU model or pool that is not configured
202 instead of 201/200: the broker did not take the job's events in time; the scheduler holds
them and publishes (then carries out) them when it does — resubmitting would make a second job.
Nothing a client sends raises out of a handler: an unexpected error is logged and answered 500.
"""

from __future__ import annotations

import hmac
import logging
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from ledger.job_events import MAX_GPUS_PER_JOB, MAX_TEXT
from ledger.units import US_PER_SECOND, Unit
from scheduler.dispatcher import Dispatcher
from scheduler.errors import Rejected, RejectKind, SchedulerError
from scheduler.executors.errors import InvalidWork
from scheduler.model import IdleAction
from scheduler.ports import Work
from scheduler.records import JobRecord, JobState, SubmitRequest
from scheduler.service import Accepted, SchedulerService

log = logging.getLogger("tally.scheduler.api")

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
MAX_SECONDS = 366 * 24 * 3600
MAX_ARGS = 1024
MAX_ARG_LEN = 8192
MAX_SCRIPT = 256 * 1024
MAX_ENV = 256
MAX_PRIORITY = 1_000_000
SUBMIT_FIELDS = frozenset(
    (
        "team",
        "project",
        "user",
        "queue",
        "gpus",
        "command",
        "script",
        "env",
        "cwd",
        "estimated_runtime_s",
        "max_runtime_s",
        "model",
        "pool",
        "span_nodes",
        "priority",
    )
)
STATUS_OF: Mapping[RejectKind, tuple[int, str]] = {
    RejectKind.INVALID: (400, "bad_request"),
    RejectKind.UNKNOWN: (422, "unprocessable"),
    RejectKind.NOT_FOUND: (404, "not_found"),
    RejectKind.CONFLICT: (409, "conflict"),
}
CODE_OF_STATUS: Mapping[int, str] = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    415: "unsupported_media",
    422: "unprocessable",
}


class ApiError(SchedulerError):
    """An HTTP error answer: status, code and message."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or CODE_OF_STATUS.get(status, "error")
        self.message = message


# ---------------------------------------------------------------------------- tokens


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: a team, or the admin (team None)."""

    team: str | None

    @property
    def is_admin(self) -> bool:
        return self.team is None


@dataclass(frozen=True, slots=True)
class Tokens:
    """The bearer tokens: the admin's and one per team (either may be missing)."""

    admin: str | None = None
    teams: Mapping[str, str] = field(default_factory=dict)

    def principal(self, token: str) -> Principal | None:
        """Who `token` belongs to; every known token is compared, in constant time."""
        given = token.encode("utf-8", "surrogateescape")
        found: Principal | None = None
        if self.admin and hmac.compare_digest(given, self.admin.encode()):
            found = Principal(None)
        for team, secret in sorted(self.teams.items()):
            if hmac.compare_digest(given, secret.encode()):
                found = Principal(team)
        return found


def authenticate(request: web.Request, tokens: Tokens) -> Principal:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if not header:
        raise ApiError(401, "a bearer token is required (Authorization: Bearer <token>)")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "the Authorization header must be `Bearer <token>`")
    principal = tokens.principal(token.strip())
    if principal is None:
        raise ApiError(401, "the token is not valid")
    return principal


# ---------------------------------------------------------------------------- views


def job_view(record: JobRecord) -> dict[str, Any]:
    spec = record.spec
    return {
        "job_id": spec.job_id,
        "team": spec.team,
        "project": spec.project,
        "user": spec.user,
        "queue": spec.queue,
        "gpus": spec.gpus,
        "model": spec.model,
        "pool": spec.pool,
        "span_nodes": spec.span_nodes,
        "priority": spec.priority,
        "estimated_runtime_s": spec.estimated_runtime_us / US_PER_SECOND,
        "max_runtime_s": None
        if spec.max_runtime_us is None
        else spec.max_runtime_us / US_PER_SECOND,
        "state": record.state.value,
        "attempt": record.attempt,
        "reason": record.reason,
        "detail": record.detail,
        "submitted_us": spec.submit_us,
        "admitted_us": record.admitted_us,
        "started_us": record.started_us,
        "ended_us": record.ended_us,
        "assigned": {
            "pool": record.pool,
            "model": record.model,
            "gpu_uuids": list(record.gpu_uuids),
            "nodes": list(record.nodes),
        },
        "exit_code": record.exit_code,
        "preemptions": record.preemptions,
        "hold": {"gpu_ms": record.hold_gpu_ms, "money_micros": record.hold_micros},
        "over_budget": record.over_budget,
    }


def _json(data: Any, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(data),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _accepted(accepted: Accepted, status: int) -> web.Response:
    if accepted.published:
        return _json({"job": job_view(accepted.record)}, status)
    note = "the broker is unavailable: this is carried out once it takes the job's events"
    return _json({"job": job_view(accepted.record), "warning": note}, 202)


def error_response(status: int, message: str, code: str | None = None) -> web.Response:
    headers = {"WWW-Authenticate": 'Bearer realm="tally"'} if status == 401 else None
    body = {
        "error": {
            "status": status,
            "code": code or CODE_OF_STATUS.get(status, "error"),
            "message": message,
        }
    }
    return _json(body, status, headers)


# ---------------------------------------------------------------------------- parsing


def _text(data: Mapping[str, Any], name: str, *, required: bool, pattern: bool = True) -> Any:
    value = data.get(name)
    if value is None:
        if required:
            raise ApiError(400, f"{name}: required")
        return None
    if type(value) is not str or not value:
        raise ApiError(400, f"{name}: expected a non-empty string")
    if len(value) > MAX_TEXT:
        raise ApiError(400, f"{name}: longer than {MAX_TEXT} characters")
    if pattern and not NAME.match(value):
        raise ApiError(
            400,
            f"{name}: use letters, digits, '.', '_' and '-' (at most 64, not starting with"
            " a symbol)",
        )
    return value


def _int(data: Mapping[str, Any], name: str, lo: int, hi: int) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if type(value) is not int:
        raise ApiError(400, f"{name}: expected an integer")
    if not lo <= value <= hi:
        raise ApiError(400, f"{name}: {value} is out of range [{lo}, {hi}]")
    return value


def _seconds(data: Mapping[str, Any], name: str, *, positive: bool) -> int | None:
    value = data.get(name)
    if value is None:
        return None
    if type(value) not in (int, float) or not math.isfinite(value):
        raise ApiError(400, f"{name}: expected a number of seconds")
    if value < 0 or (positive and value == 0) or value > MAX_SECONDS:
        bound = "positive" if positive else "non-negative"
        raise ApiError(400, f"{name}: must be {bound} and at most {MAX_SECONDS} s")
    seconds: float = value
    return round(seconds * US_PER_SECOND)


def _work(data: Mapping[str, Any]) -> Work:
    command, script = data.get("command"), data.get("script")
    if command is not None:
        if type(command) is not list or not command or len(command) > MAX_ARGS:
            raise ApiError(400, f"command: expected a list of 1 to {MAX_ARGS} strings")
        if not all(type(a) is str and 0 < len(a) <= MAX_ARG_LEN for a in command):
            raise ApiError(
                400,
                f"command: every argument is a non-empty string of at most "
                f"{MAX_ARG_LEN} characters",
            )
    if script is not None and (type(script) is not str or len(script) > MAX_SCRIPT):
        raise ApiError(400, f"script: expected a string of at most {MAX_SCRIPT} characters")
    env = data.get("env") or {}
    if type(env) is not dict or len(env) > MAX_ENV:
        raise ApiError(400, f"env: expected an object of at most {MAX_ENV} variables")
    if not all(type(v) is str and len(v) <= MAX_ARG_LEN for v in env.values()):
        raise ApiError(400, "env: every value is a string")
    cwd = data.get("cwd")
    if cwd is not None and (type(cwd) is not str or not cwd or len(cwd) > 4096):
        raise ApiError(400, "cwd: expected a path")
    if any("\0" in a for a in (command or ())) or (script and "\0" in script):
        raise ApiError(400, "command: NUL bytes are not allowed")
    try:
        return Work(
            command=tuple(command or ()),
            script=script,
            env=tuple(sorted(env.items())),
            cwd=cwd,
        )
    except InvalidWork as exc:
        raise ApiError(400, str(exc)) from None


def parse_submit(data: Any, principal: Principal) -> SubmitRequest:
    """A submission body → `SubmitRequest`; raises ApiError (400, or 403 for another team)."""
    if type(data) is not dict:
        raise ApiError(400, "the body must be a JSON object")
    unknown = sorted(set(data) - SUBMIT_FIELDS)
    if unknown:
        raise ApiError(400, f"unknown fields: {', '.join(unknown)[:512]}")
    team = _text(data, "team", required=principal.is_admin)
    if principal.team is not None:
        if team is not None and team != principal.team:
            raise ApiError(403, f"this token acts for team {principal.team} only")
        team = principal.team
    gpus = _int(data, "gpus", -(2**63), 2**63)
    if gpus is None:
        raise ApiError(400, "gpus: required")
    if not 1 <= gpus <= MAX_GPUS_PER_JOB:
        raise ApiError(400, f"gpus: must be between 1 and {MAX_GPUS_PER_JOB}, not {gpus}")
    span = data.get("span_nodes", True)
    if type(span) is not bool:
        raise ApiError(400, "span_nodes: expected true or false")
    if (data.get("command") is None) == (data.get("script") is None):
        raise ApiError(400, "give exactly one of command (a list of arguments) or script")
    return SubmitRequest(
        team=team,
        project=_text(data, "project", required=True),
        user=_text(data, "user", required=True),
        queue=_text(data, "queue", required=True),
        gpus=gpus,
        work=_work(data),
        estimated_runtime_us=_seconds(data, "estimated_runtime_s", positive=False),
        max_runtime_us=_seconds(data, "max_runtime_s", positive=True),
        model=_text(data, "model", required=False, pattern=False),
        pool=_text(data, "pool", required=False),
        span_nodes=span,
        priority=_int(data, "priority", -MAX_PRIORITY, MAX_PRIORITY),
    )


async def read_json(request: web.Request, max_bytes: int) -> Any:
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, f"the body is larger than {max_bytes} bytes")
    ctype = request.headers.get("Content-Type")
    if ctype is not None and request.content_type not in ("application/json", ""):
        raise ApiError(415, "send JSON with Content-Type: application/json")
    body = await request.read()  # aiohttp refuses more than client_max_size: 413
    if len(body) > max_bytes:
        raise ApiError(413, f"the body is larger than {max_bytes} bytes")
    if not body:
        raise ApiError(400, "the body is empty; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None


# ---------------------------------------------------------------------------- handlers


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Api:
    """The handlers, bound to a service and its tokens."""

    def __init__(self, service: SchedulerService, tokens: Tokens, max_body_bytes: int) -> None:
        self.service = service
        self.tokens = tokens
        self.max_body_bytes = max_body_bytes

    @property
    def dispatcher(self) -> Dispatcher:
        return self.service.dispatcher

    def _team_filter(self, request: web.Request, principal: Principal) -> str | None:
        wanted = request.query.get("team")
        if principal.team is None:
            if wanted is not None and wanted not in self.dispatcher.state.quotas.teams:
                raise ApiError(422, f"unknown team {wanted!r}")
            return wanted
        if wanted is not None and wanted != principal.team:
            raise ApiError(403, f"this token sees team {principal.team} only")
        return principal.team

    def _job(self, request: web.Request, principal: Principal) -> JobRecord:
        job_id = request.match_info["job_id"]
        record = self.dispatcher.visible(job_id, principal.team)
        if record is None:
            raise ApiError(404, f"no job {job_id[:128]}")
        return record

    async def health(self, request: web.Request) -> web.Response:
        state = self.dispatcher.state
        return _json(
            {"status": "ok", "pending": state.pending_count, "running": state.running_count}
        )

    async def submit(self, request: web.Request) -> web.Response:
        principal = authenticate(request, self.tokens)
        data = await read_json(request, self.max_body_bytes)
        accepted = await self.service.submit(parse_submit(data, principal))
        return _accepted(accepted, 201)

    async def list_jobs(self, request: web.Request) -> web.Response:
        principal = authenticate(request, self.tokens)
        team = self._team_filter(request, principal)
        state = request.query.get("state")
        if state is not None and state not in JobState._value2member_map_:
            raise ApiError(400, f"state: one of {', '.join(s.value for s in JobState)}")
        records = [r for r in self.dispatcher.jobs(team) if state is None or r.state.value == state]
        return _json({"jobs": [job_view(r) for r in records]})

    async def get_job(self, request: web.Request) -> web.Response:
        principal = authenticate(request, self.tokens)
        return _json({"job": job_view(self._job(request, principal))})

    async def cancel(self, request: web.Request) -> web.Response:
        principal = authenticate(request, self.tokens)
        record = self._job(request, principal)
        accepted = await self.service.cancel(record.job_id, principal.team)
        return _accepted(accepted, 200)

    async def explain(self, request: web.Request) -> web.Response:
        principal = authenticate(request, self.tokens)
        record = self._job(request, principal)
        return _json(
            {"job_id": record.job_id, "explanation": self.dispatcher.explain(record.job_id)}
        )

    async def queues(self, request: web.Request) -> web.Response:
        authenticate(request, self.tokens)
        state = self.dispatcher.state
        pending: dict[str, int] = {}
        running: dict[str, int] = {}
        for r in self.dispatcher.records.values():
            if r.state is JobState.PENDING:
                pending[r.spec.queue] = pending.get(r.spec.queue, 0) + 1
            elif r.state is JobState.RUNNING:
                running[r.spec.queue] = running.get(r.spec.queue, 0) + 1
        out = []
        for q in state.queues.values():
            idle = q.idle
            out.append(
                {
                    "name": q.name,
                    "class": q.queue_class.value,
                    "priority": q.priority,
                    "preemptible": q.preemptible,
                    "idle_reclaim": idle.action.value,
                    "idle_after_min": None
                    if idle.action is IdleAction.NEVER
                    else idle.after_us / 60_000_000,
                    "max_runtime_s": None
                    if q.max_runtime_us is None
                    else q.max_runtime_us / US_PER_SECOND,
                    "retry_limit": q.max_retries,
                    "over_budget": q.over_budget.value,
                    "pending": pending.get(q.name, 0),
                    "running": running.get(q.name, 0),
                }
            )
        return _json({"queues": out})

    async def balances(self, request: web.Request) -> web.Response:
        principal = authenticate(request, self.tokens)
        team = self._team_filter(request, principal)
        teams = [team] if team is not None else sorted(self.dispatcher.state.quotas.teams)
        return _json({"balances": [self._balance(t) for t in teams]})

    def _balance(self, team: str) -> dict[str, Any]:
        d = self.dispatcher
        status = d.budgets.get(team)
        balance = d.balance_of(team)
        own = d.hold_acks.unacknowledged(team)
        units = []
        if status is not None:
            for line in status.lines:
                unit = line.unit
                pending = own.gpu_ms if unit == Unit.GPU_MS else own.money_micros
                units.append(
                    {
                        "unit": unit,
                        "granted": line.granted,
                        "consumed": line.consumed,
                        "ledger_open_holds": line.open_holds,
                        "remaining": line.remaining,
                        "holds_not_yet_in_ledger": pending,
                        "available_to_admit": line.remaining - pending,
                    }
                )
        quotas = []
        for (name, flavor), quota in sorted(d.state.quotas.quota.items()):
            if name == team:
                quotas.append(
                    {
                        "pool": flavor.pool,
                        "model": flavor.model,
                        "nominal": quota.nominal,
                        "borrowing_limit": quota.borrowing_limit,
                        "lending_limit": quota.lending_limit,
                        "in_use": d.state.used(team, flavor),
                    }
                )
        return {
            "team": team,
            "budgeted": status is not None,
            "period": None if status is None else status.period,
            "units": units,
            "overdraft": None
            if balance is None
            else {"gpu_ms": balance.overdraft_gpu_ms, "money_micros": balance.overdraft_micros},
            "quotas": quotas,
        }


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes a JSON answer; nothing a client sends escapes as an exception."""
    try:
        return await handler(request)
    except ApiError as exc:
        return error_response(exc.status, exc.message, exc.code)
    except Rejected as exc:
        status, code = STATUS_OF[exc.kind]
        return error_response(status, str(exc), code)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(exc.status, exc.reason or "error")
        allow = exc.headers.get("Allow")
        if allow:
            response.headers["Allow"] = allow
        return response
    except Exception:
        log.exception("unexpected error answering %s %s", request.method, request.path)
        return error_response(500, "internal error", "internal")


def build_app(service: SchedulerService, tokens: Tokens, max_body_bytes: int) -> web.Application:
    api = Api(service, tokens, max_body_bytes)
    app = web.Application(middlewares=[json_errors], client_max_size=max_body_bytes)
    app.add_routes(
        [
            web.get("/v1/health", api.health),
            web.post("/v1/jobs", api.submit),
            web.get("/v1/jobs", api.list_jobs),
            web.get("/v1/jobs/{job_id}", api.get_job),
            web.delete("/v1/jobs/{job_id}", api.cancel),
            web.post("/v1/jobs/{job_id}/cancel", api.cancel),
            web.get("/v1/jobs/{job_id}/explain", api.explain),
            web.get("/v1/queues", api.queues),
            web.get("/v1/balances", api.balances),
        ]
    )
    return app


def api_server(
    tokens: Tokens, host: str, port: int, max_body_bytes: int
) -> Callable[[SchedulerService], Awaitable[Callable[[], Awaitable[None]]]]:
    """What `run_service` calls to start the API: returns the closer."""

    async def serve(service: SchedulerService) -> Callable[[], Awaitable[None]]:
        runner = web.AppRunner(build_app(service, tokens, max_body_bytes), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        log.info("scheduler API on http://%s:%d", host, port)
        return runner.cleanup

    return serve
