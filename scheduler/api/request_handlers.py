"""The handlers of the requests routes, mixed into `scheduler.api.handlers.Api`:

    POST /v1/requests                       open a quota or budget request           201
    GET  /v1/requests[?team=&status=]       the requests the caller may see          200
    GET  /v1/requests/{request_id}          one request                              200
    POST /v1/requests/{request_id}/approve  approve (finance / admin / operator as   200
    POST /v1/requests/{request_id}/reject   the request's approvers say)             200

Each step is an admin event the service's `RequestDesk` (`scheduler.requests`) publishes and
the ledger applies. Permissions are the table's (`requests.open`, `.read`, `.decide`: 403 for a
role that may not, 404 for another team's request or team); who may decide a given request is
the request's (403 naming what it needs, never the requester); a request that is not open is a
409; 503 when the service follows no admin topic or the broker does not take the event.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import ValidationError

from ledger.admin.request_events import (
    RequestApproved,
    RequestKind,
    RequestRejected,
    RequestStatus,
)
from ledger.admin.requests import (
    REFUSED,
    RequestState,
    Verdict,
    change_text,
    new_request,
    verdict,
)
from ledger.roles import Action, Role, Scope, scope_of
from ledger.units import MS_PER_HOUR, Unit, parse_micros
from scheduler.api.auth import Principal, Tokens, authenticate, authorize
from scheduler.api.models import NoQuery, dumped, problem
from scheduler.api.oidc import OidcVerifier
from scheduler.api.request_models import (
    DecisionBody,
    RequestAnswer,
    RequestBody,
    RequestsList,
    RequestsQuery,
    RequestView,
)
from scheduler.api.responses import ApiError, json_response
from scheduler.errors import BrokerUnavailable
from scheduler.requests import RequestDesk
from scheduler.service import SchedulerService


def request_view(state: RequestState, now_us: int) -> RequestView:
    o = state.opened
    return RequestView(
        request_id=o.request_id,
        team=o.team,
        kind=o.kind.value,
        status=state.shown_at(now_us),
        change=change_text(o),
        requested_by=o.actor,
        requested_role=(o.role or Role.ADMIN).value,
        reason=o.reason,
        approvers=list(o.approvers),
        opened_us=o.effective_us,
        expires_us=o.expires_us,
        decided_by=state.decided_by,
        decided_role=state.decided_role,
        decided_us=state.decided_us,
        comment=state.comment,
        effect=state.effect,
        refused_reason=state.refused if state.shown_at(now_us) == REFUSED else None,
    )


def _change(body: RequestBody) -> dict[str, Any]:
    """The request's fields from the body; ApiError 400 for a body that mixes kinds."""
    if body.kind == "budget":
        if body.period is None or (body.money is None) == (body.gpu_hours is None):
            raise ApiError(400, "a budget request needs period and one of money, gpu_hours")
        if any(v is not None for v in (body.pool, body.model, body.gpus)):
            raise ApiError(400, "pool, model, gpus: not part of a budget request")
        if body.money is not None:
            unit, amount = Unit.MONEY, parse_micros(body.money)
        else:
            unit, amount = Unit.GPU_MS, (body.gpu_hours or 0) * MS_PER_HOUR
        if amount == 0:
            raise ApiError(400, "a change of zero changes nothing")
        return {"period": body.period, "unit": unit, "amount": amount}
    if body.pool is None or body.model is None or body.gpus is None:
        raise ApiError(400, "a quota request needs pool, model and gpus")
    if any(v is not None for v in (body.period, body.money, body.gpu_hours)):
        raise ApiError(400, "period, money, gpu_hours: not part of a quota request")
    return {
        "pool": body.pool,
        "model": body.model,
        "nominal_gpus": body.gpus,
        "borrowing_limit": body.borrowing_limit,
        "lending_limit": body.lending_limit,
    }


def _opened_order(state: RequestState) -> tuple[int, str]:
    return state.opened.effective_us, state.request_id


class RequestRoutes:
    """The requests handlers; `Api` provides the service, tokens, OIDC verifier and body
    limits."""

    service: SchedulerService
    tokens: Tokens
    oidc: OidcVerifier | None
    max_body_bytes: int
    body_timeout_s: float

    def _desk(self) -> RequestDesk:
        if self.service.requests is None:
            raise ApiError(
                503, "requests need the admin topic, which this scheduler does not follow"
            )
        return self.service.requests

    def _now(self) -> int:
        return self.service.dispatcher.clock.now_us()

    async def _body(self, request: web.Request, model: Any) -> Any:
        from scheduler.api.handlers import read_json, read_query

        read_query(request, NoQuery)
        data = await read_json(request, self.max_body_bytes, self.body_timeout_s)
        if type(data) is not dict:
            raise ApiError(400, "the body must be a JSON object")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise ApiError(400, problem(exc)) from None

    async def _send(self, desk: RequestDesk, event: Any) -> None:
        problem_ = desk.refusal(event)
        if problem_ is not None:
            raise ApiError(409, problem_[:512], "conflict")
        try:
            await desk.send(event)
        except BrokerUnavailable as exc:
            raise ApiError(503, f"the broker did not take the request: {exc}"[:512]) from None

    def _state(self, request: web.Request, principal: Principal, action: Action) -> RequestState:
        """The request of the path: 404 if it does not exist or is another team's."""
        desk = self._desk()
        request_id = request.match_info["request_id"]
        missing = f"no request {request_id[:128]}"
        state = desk.states.get(request_id)
        if state is None:
            raise ApiError(404, missing)
        authorize(principal, Action.REQUEST_READ, state.opened.team, missing=missing)
        authorize(principal, action, state.opened.team, missing=missing)
        return state

    async def create_request(self, request: web.Request) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        authorize(principal, Action.REQUEST_OPEN)
        desk = self._desk()
        body: RequestBody = await self._body(request, RequestBody)
        team = body.team if body.team is not None else principal.team
        if team is None:
            raise ApiError(400, "team: required (with an organisation-wide token)")
        authorize(principal, Action.REQUEST_OPEN, team, missing=f"no team {team}")
        if team not in self.service.dispatcher.state.quotas.teams:
            raise ApiError(422, f"unknown team {team!r}")
        kind = RequestKind(body.kind)
        change = _change(body)
        current = None
        if kind is RequestKind.QUOTA:
            current = desk.quotas.get((team, change["pool"], change["model"]))
        event = new_request(
            desk.policy,
            team,
            kind,
            principal.name,
            body.reason,
            self._now(),
            principal.role,
            current,
            **change,
        )
        await self._send(desk, event)
        view = request_view(desk.states[event.request_id], self._now())
        return json_response(dumped(RequestAnswer(request=view)), 201)

    async def list_requests(self, request: web.Request) -> web.Response:
        from scheduler.api.handlers import read_query

        principal = await authenticate(request, self.tokens, self.oidc)
        authorize(principal, Action.REQUEST_READ)
        query = read_query(request, RequestsQuery)
        desk = self._desk()
        team = query.team
        if scope_of(principal.role, Action.REQUEST_READ) is not Scope.ANY:
            if team is not None and team != principal.team:
                raise ApiError(404, f"no team {team[:128]}")
            team = principal.team
        now = self._now()
        views = [
            request_view(s, now)
            for s in sorted(
                desk.states.values(), key=lambda s: (s.opened.effective_us, s.request_id)
            )
            if (team is None or s.opened.team == team)
            and (query.status is None or s.shown_at(now) == query.status)
        ]
        return json_response(dumped(RequestsList(requests=views)))

    async def get_request(self, request: web.Request) -> web.Response:
        from scheduler.api.handlers import read_query

        principal = await authenticate(request, self.tokens, self.oidc)
        authorize(principal, Action.REQUEST_READ)
        read_query(request, NoQuery)
        state = self._state(request, principal, Action.REQUEST_READ)
        return json_response(dumped(RequestAnswer(request=request_view(state, self._now()))))

    async def approve_request(self, request: web.Request) -> web.Response:
        return await self._decide(request, approve=True)

    async def reject_request(self, request: web.Request) -> web.Response:
        return await self._decide(request, approve=False)

    async def _decide(self, request: web.Request, approve: bool) -> web.Response:
        principal = await authenticate(request, self.tokens, self.oidc)
        authorize(principal, Action.REQUEST_DECIDE)
        body: DecisionBody = await self._body(request, DecisionBody)
        state = self._state(request, principal, Action.REQUEST_DECIDE)
        now = self._now()
        status = state.status_at(now)
        if status is not RequestStatus.OPEN:
            raise ApiError(409, f"request {state.request_id} is {status}, not open", "conflict")
        answer = verdict(state.opened, principal.name, principal.role)
        if answer is not Verdict.ALLOWED:
            raise ApiError(
                403,
                f"{principal.name} may not decide request {state.request_id}: {answer.value} "
                f"(approvers: {', '.join(state.opened.approvers)}; never the requester)",
            )
        kind = RequestApproved if approve else RequestRejected
        desk = self._desk()
        await self._send(
            desk, kind(state.request_id, principal.name, body.comment, now, principal.role)
        )
        view = request_view(desk.states[state.request_id], now)
        return json_response(dumped(RequestAnswer(request=view)))
