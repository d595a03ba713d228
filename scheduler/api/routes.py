"""The route table: the one list of the API's routes that both wires the aiohttp application
(`scheduler.api.app`) and writes the OpenAPI document (`scheduler.api.openapi`), so the two
cannot differ.

    GET    /v1/openapi.json            no token; this API as OpenAPI 3.1                  200
    GET    /v1/health                  no token; liveness and counts                      200
    POST   /v1/jobs                    submit (Idempotency-Key)                 201, 200, 202
    GET    /v1/jobs                    a page of jobs (a team: its own)                   200
                                       ?limit=&cursor=&state=&queue=&user=&since=&team=
    GET    /v1/jobs/{job_id}           one job                                            200
    POST   /v1/jobs/{job_id}/cancel    cancel (Idempotency-Key)                      200, 202
    DELETE /v1/jobs/{job_id}           the same                                      200, 202
    GET    /v1/jobs/{job_id}/explain   why it waits, runs or ended                        200
    GET    /v1/queues                  the queues, their bounds and load                  200
    GET    /v1/balances[?team=]        budget and quota of a team (admin: all teams)      200
    GET    /v1/inventory[?pool=]       the GPUs collectors report (any token)             200
    POST   /v1/requests                open a quota or budget request                     201
    GET    /v1/requests                the requests the caller may see  ?team=&status=    200
    GET    /v1/requests/{request_id}   one request                                        200
    POST   /v1/requests/{request_id}/approve | /reject   decide, with a comment           200

Who may call which route is the permission table's business (`ledger.roles`): 403 for a role
that may not, 404 for another team's job or team.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from scheduler.api.models import (
    Balances,
    Explanation,
    Health,
    InventoryAnswer,
    InventoryQuery,
    JobAnswer,
    JobsPage,
    JobsQuery,
    Queues,
    SubmitBody,
    TeamQuery,
)
from scheduler.api.request_models import (
    DecisionBody,
    RequestAnswer,
    RequestBody,
    RequestsList,
    RequestsQuery,
)

# 403: the role may not (`ledger.roles`); 503: a person's JWT while the issuer's keys cannot be had
AUTH_ERRORS = (400, 401, 403, 404, 405, 503)
BODY_ERRORS = (408, 413, 415)


@dataclass(frozen=True, slots=True)
class Route:
    """One route: what it answers, with which models, and which errors it may give."""

    method: str
    path: str
    handler: str  # the name of the `Api` method that serves it
    summary: str
    ok: tuple[int, ...] = (200,)
    response: type[BaseModel] | None = None  # None: any JSON object (the document itself)
    body: type[BaseModel] | None = None
    query: type[BaseModel] | None = None
    errors: tuple[int, ...] = AUTH_ERRORS
    token: bool = True
    idempotent: bool = False  # takes an Idempotency-Key header

    @property
    def operation_id(self) -> str:
        return f"{self.handler}_{self.method.lower()}"


JOB = "/v1/jobs/{job_id}"
REQUEST = "/v1/requests/{request_id}"
DECIDE_ERRORS = (*AUTH_ERRORS, *BODY_ERRORS, 409, 503)

ROUTES: tuple[Route, ...] = (
    Route("GET", "/v1/openapi.json", "openapi", "This API as an OpenAPI 3.1 document",
          token=False, errors=(404, 405)),
    Route("GET", "/v1/health", "health", "Liveness, and how many jobs wait and run",
          response=Health, token=False, errors=(404, 405)),
    Route("POST", "/v1/jobs", "submit",
          "Submit a job (201; 200 repeating an Idempotency-Key; 202 broker unavailable)",
          ok=(201, 200, 202), response=JobAnswer, body=SubmitBody,
          errors=(*AUTH_ERRORS, *BODY_ERRORS, 422), idempotent=True),
    Route("GET", "/v1/jobs", "list_jobs",
          "A page of the jobs the caller may see, oldest submission first",
          response=JobsPage, query=JobsQuery, errors=(*AUTH_ERRORS, 422)),
    Route("GET", JOB, "get_job", "One job", response=JobAnswer),
    Route("POST", f"{JOB}/cancel", "cancel", "Cancel a pending or running job",
          ok=(200, 202), response=JobAnswer, errors=(*AUTH_ERRORS, 409, 422), idempotent=True),
    Route("DELETE", JOB, "cancel", "Cancel a pending or running job",
          ok=(200, 202), response=JobAnswer, errors=(*AUTH_ERRORS, 409, 422), idempotent=True),
    Route("GET", f"{JOB}/explain", "explain", "Why a job waits, runs, was preempted or ended",
          response=Explanation),
    Route("GET", "/v1/queues", "queues", "The queues, their policies and load",
          response=Queues),
    Route("GET", "/v1/balances", "balances",
          "Budget and quota of the caller's team (the admin: every team, or ?team=)",
          response=Balances, query=TeamQuery, errors=(*AUTH_ERRORS, 422)),
    Route("GET", "/v1/inventory", "inventory",
          "The GPUs the collectors report: live or stale, placeable, in use (any token)",
          response=InventoryAnswer, query=InventoryQuery),
    Route("POST", "/v1/requests", "create_request",
          "Ask for a quota or budget change (an admin event; approved as the policy says)",
          ok=(201,), response=RequestAnswer, body=RequestBody,
          errors=(*DECIDE_ERRORS, 422)),
    Route("GET", "/v1/requests", "list_requests",
          "The quota and budget requests the caller may see, oldest first",
          response=RequestsList, query=RequestsQuery, errors=(*AUTH_ERRORS, 503)),
    Route("GET", REQUEST, "get_request", "One request", response=RequestAnswer,
          errors=(*AUTH_ERRORS, 503)),
    Route("POST", f"{REQUEST}/approve", "approve_request",
          "Approve a request: the ledger then applies its grant or quota, or refuses it "
          "(the request then shows refused, with the ledger's reason)",
          response=RequestAnswer, body=DecisionBody, errors=DECIDE_ERRORS),
    Route("POST", f"{REQUEST}/reject", "reject_request", "Reject a request",
          response=RequestAnswer, body=DecisionBody, errors=DECIDE_ERRORS),
)  # fmt: skip
