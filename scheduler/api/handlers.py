"""The API's handlers (`Api`), bound to a service and its tokens: each authenticates, reads its
query and body through the models of `scheduler.api.models`, calls the service or reads the
dispatcher, and answers with a response model. Which handler serves which route is the route
table's business (`scheduler.api.routes`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from ledger.errors import EventError
from ledger.fractional import parse_share
from ledger.job_events import encode_job_event
from ledger.roles import Action, Role, Scope, scope_of
from ledger.units import US_PER_SECOND
from scheduler.api.auth import Principal, Tokens, authenticate, authorize
from scheduler.api.models import (
    Balances,
    Explanation,
    Health,
    InventoryAnswer,
    InventoryQuery,
    JobAnswer,
    JobsPage,
    JobsQuery,
    NoQuery,
    Queues,
    SubmitBody,
    TeamQuery,
    dumped,
    problem,
)
from scheduler.api.oidc import OidcVerifier
from scheduler.api.pagination import Cursors, JobFilter, page, parse_since
from scheduler.api.request_handlers import RequestRoutes
from scheduler.api.responses import ApiError, json_response, model_response
from scheduler.api.views import (
    balance_view,
    inventory_views,
    job_view,
    node_views,
    queue_views,
)
from scheduler.dispatcher import Dispatcher
from scheduler.executors.errors import InvalidWork
from scheduler.jobs_topic import SOURCE
from scheduler.ports import Work
from scheduler.records import JobRecord, SubmitRequest
from scheduler.service import Accepted, SchedulerService

IDEMPOTENCY_HEADER = "Idempotency-Key"
KEY = re.compile(r"[\x21-\x7e]{1,128}")  # visible ASCII: a UUID, a hash, a counter
REPLAYED_HEADER = "Idempotent-Replayed"
BROKER_NOTE = (
    "not published yet (the broker, or the scheduler's disk, did not take it in time): this is "
    "carried out once the job's events are published"
)
DEFAULT_BODY_TIMEOUT_S = 10.0

Q = TypeVar("Q", bound=BaseModel)


def read_query(request: web.Request, model: type[Q]) -> Q:
    """The query string as `model`; a parameter given twice, unknown or invalid is a 400."""
    query = request.query
    repeated = sorted({k for k in query if len(query.getall(k)) > 1})
    if repeated:
        raise ApiError(400, f"given more than once: {', '.join(repeated)}"[:512])
    try:
        return model.model_validate(dict(query))
    except ValidationError as exc:
        raise ApiError(400, problem(exc)) from None


def idempotency_key(request: web.Request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not KEY.fullmatch(key):
        raise ApiError(400, f"{IDEMPOTENCY_HEADER}: 1 to 128 visible ASCII characters")
    return key


def client_of(request: web.Request) -> str:
    """The caller's address, as the audit trail records it (`unknown` when the transport
    does not say)."""
    return request.remote or "unknown"


def to_request(
    body: SubmitBody, principal: Principal, key: str | None, client: str | None = None
) -> SubmitRequest:
    """A validated body → `SubmitRequest` for `principal`; raises ApiError (400; 403 a member
    submitting as another user; 404 another team)."""
    team = body.team if body.team is not None else principal.team
    if team is None:
        raise ApiError(400, "team: required (with an organisation-wide token)")
    authorize(principal, Action.JOB_SUBMIT, team, body.user, missing=f"no team {team}"[:256])
    try:
        work = Work(
            command=tuple(body.command or ()),
            script=body.script,
            env=tuple(sorted((body.env or {}).items())),
            cwd=body.cwd,
        )
    except InvalidWork as exc:
        raise ApiError(400, str(exc)) from None
    try:
        share = None if body.gpu_share is None else parse_share(body.gpu_share)
    except EventError as exc:
        raise ApiError(400, str(exc).replace("--gpu-share", "gpu_share")) from None
    return SubmitRequest(
        team=team,
        project=body.project,
        user=body.user,
        queue=body.queue,
        gpus=body.gpus,
        work=work,
        estimated_runtime_us=_us(body.estimated_runtime_s),
        max_runtime_us=_us(body.max_runtime_s),
        models=body.models,
        pool=body.pool,
        span_nodes=body.span_nodes,
        priority=body.priority,
        topology=body.topology,
        mig_profile=body.mig_profile,
        gpu_share=share,
        admin=principal.role is Role.ADMIN,
        idempotency_key=key,
        client=client,
        caller=principal.name,
    )


def _us(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * US_PER_SECOND)


async def read_json(request: web.Request, max_bytes: int, timeout_s: float) -> Any:
    """The body as JSON: 413 over `max_bytes`, 415 not JSON, 408 not all sent in `timeout_s`,
    400 empty or malformed."""
    body = await read_body(request, max_bytes, timeout_s)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"the body is not valid JSON: {exc}") from None


def read_model(body: bytes, model: type[Q]) -> Q:
    """A JSON object body as `model`, parsed and validated in one pass by pydantic
    (`model_validate_json`: no Python objects in between): 400 malformed, not an object, or
    invalid (`problem`)."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        if first["type"] == "json_invalid":
            raise ApiError(400, f"the body is not valid JSON: {first['msg']}"[:512]) from None
        if first["type"] == "model_type" and not first["loc"]:
            raise ApiError(400, "the body must be a JSON object") from None
        raise ApiError(400, problem(exc)) from None


async def read_body(request: web.Request, max_bytes: int, timeout_s: float) -> bytes:
    """The body's bytes: 413 over `max_bytes`, 415 not JSON, 408 not all sent in `timeout_s`,
    400 empty."""
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, f"the body is larger than {max_bytes} bytes")
    ctype = request.headers.get("Content-Type")
    if ctype is not None and request.content_type not in ("application/json", ""):
        raise ApiError(415, "send JSON with Content-Type: application/json")
    try:
        if request.content.is_eof():  # all of it arrived with the head: nothing to time
            body = await request.read()
        else:
            async with asyncio.timeout(timeout_s):
                body = await request.read()
    except TimeoutError:
        raise ApiError(408, f"the body was not sent within {timeout_s:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, f"the body is larger than {max_bytes} bytes") from None
    if len(body) > max_bytes:
        raise ApiError(413, f"the body is larger than {max_bytes} bytes")
    if not body:
        raise ApiError(400, "the body is empty; expected a JSON object")
    return body


def _answer(accepted: Accepted, status: int) -> web.Response:
    headers = {REPLAYED_HEADER: "true"} if accepted.replayed else None
    if accepted.replayed:
        status = 200
    if not accepted.published:
        answer = JobAnswer(job=job_view(accepted.record), warning=BROKER_NOTE)
        return model_response(answer, 202, headers)
    return model_response(JobAnswer(job=job_view(accepted.record)), status, headers)


class Api(RequestRoutes):
    """The handlers, bound to a service, its tokens and (for people) its OIDC verifier (the
    requests routes': `scheduler.api.request_handlers`)."""

    def __init__(
        self,
        service: SchedulerService,
        tokens: Tokens,
        max_body_bytes: int,
        body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
        document: Mapping[str, Any] | None = None,
        oidc: OidcVerifier | None = None,
    ) -> None:
        self.service = service
        self.tokens = tokens
        self.oidc = oidc
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.cursors = Cursors()
        self.document = orjson.dumps(document or {})

    @property
    def dispatcher(self) -> Dispatcher:
        return self.service.dispatcher

    def _team_filter(self, wanted: str | None, principal: Principal, action: Action) -> str | None:
        """The one team `action` reaches for `principal` (None: every team): `wanted` if the
        caller sees every team, else its own (another team is a 404, as if it did not exist)."""
        authorize(principal, action)
        if scope_of(principal.role, action) is Scope.ANY:
            if wanted is not None and wanted not in self.dispatcher.state.quotas.teams:
                raise ApiError(422, f"unknown team {wanted!r}")
            return wanted
        if wanted is not None and wanted != principal.team:
            raise ApiError(404, f"no team {wanted[:128]}")
        return principal.team

    def _job(self, request: web.Request, principal: Principal, action: Action) -> JobRecord:
        """The job of the path, if `principal` may do `action` to it: 403 if its role may
        not, 404 for a job that does not exist or is another team's."""
        authorize(principal, action)
        read_query(request, NoQuery)
        job_id = request.match_info["job_id"]
        missing = f"no job {job_id[:128]}"
        record = self.dispatcher.visible(job_id, None)
        if record is None:
            raise ApiError(404, missing)
        authorize(principal, action, record.team, record.spec.user, missing)
        return record

    async def openapi(self, request: web.Request) -> web.Response:
        return web.Response(body=self.document, content_type="application/json")

    async def health(self, request: web.Request) -> web.Response:
        state = self.dispatcher.state
        health = Health(status="ok", pending=state.pending_count, running=state.running_count)
        return json_response(dumped(health))

    async def submit(self, request: web.Request) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        authorize(principal, Action.JOB_SUBMIT)
        read_query(request, NoQuery)
        key = idempotency_key(request)
        raw = await read_body(request, self.max_body_bytes, self.body_timeout_s)
        body = read_model(raw, SubmitBody)
        accepted = await self.service.submit(to_request(body, principal, key, client_of(request)))
        return _answer(accepted, 201)

    async def list_jobs(self, request: web.Request) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        query = read_query(request, JobsQuery)
        where = JobFilter(
            team=self._team_filter(query.team, principal, Action.JOB_READ),
            state=query.state,
            queue=query.queue,
            user=query.user,
            since_us=None if query.since is None else parse_since(query.since),
        )
        after = None
        if query.cursor is not None:
            after = self.cursors.read(query.cursor, principal.name, where)
        records, last = page(self.dispatcher.jobs(where.team), where, after, query.limit)
        cursor = None if last is None else self.cursors.make(last, principal.name, where)
        answer = JobsPage(jobs=[job_view(r) for r in records], next_cursor=cursor)
        return json_response(dumped(answer))

    async def get_job(self, request: web.Request) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        record = self._job(request, principal, Action.JOB_READ)
        return model_response(JobAnswer(job=job_view(record)))

    async def cancel(self, request: web.Request) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        key = idempotency_key(request)
        record = self._job(request, principal, Action.JOB_CANCEL)
        accepted = await self.service.cancel(
            record.job_id, principal.team, key, client_of(request), principal.name
        )
        return _answer(accepted, 200)

    async def explain(self, request: web.Request) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        record = self._job(request, principal, Action.JOB_READ)
        history = self.dispatcher.history.get(record.job_id, ())
        answer = Explanation(
            job_id=record.job_id,
            explanation=self.dispatcher.explain(record.job_id),
            as_of_us=self.dispatcher.clock.now_us(),
            events=[orjson.loads(encode_job_event(e, SOURCE)) for e in history],
        )
        return json_response(dumped(answer))

    async def queues(self, request: web.Request) -> web.Response:
        authorize(await authenticate(request, self.tokens, self.oidc), Action.QUEUES_READ)
        read_query(request, NoQuery)
        return json_response(dumped(Queues(queues=queue_views(self.dispatcher))))

    async def balances(self, request: web.Request) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        query = read_query(request, TeamQuery)
        team = self._team_filter(query.team, principal, Action.BALANCES_READ)
        teams = [team] if team is not None else sorted(self.dispatcher.state.quotas.teams)
        views = [balance_view(self.dispatcher, t) for t in teams]
        return json_response(dumped(Balances(balances=views)))

    async def inventory(self, request: web.Request) -> web.Response:
        """Every role may read the inventory: it names GPUs and nodes, no team's jobs."""
        authorize(await authenticate(request, self.tokens, self.oidc), Action.INVENTORY_READ)
        query = read_query(request, InventoryQuery)
        gpus = inventory_views(
            self.service.inventory,
            self.dispatcher.state,
            self.dispatcher.clock.now_us(),
            query.pool,
        )
        return json_response(dumped(InventoryAnswer(nodes=node_views(gpus), gpus=gpus)))
