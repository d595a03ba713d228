"""The scheduler's HTTP API: JSON over aiohttp, served in the service's own event loop (so
handlers and scheduling ticks never run at the same time on the state: each decision is one
synchronous step; a submit then waits only for its publication, `scheduler.pipeline`).

Modules: `routes` (the route table: one source for the application and the OpenAPI document),
`models` (pydantic request and response bodies), `auth` (tokens and principals), `oidc`
(people's bearer JWTs), `handlers`,
`views` (records → response models), `pagination` (filters and cursors of `GET /v1/jobs`),
`openapi` (the document at `/v1/openapi.json`), `responses` (JSON and error answers), `app`
(middleware, access log, the server).

Authentication: `Authorization: Bearer <token>`: a static token (machines) or, with
`auth.oidc`, a person's JWT from the OIDC issuer (`oidc`); each names a role (`ledger.roles`,
whose permission table decides every route). A team role sees and acts on that team's jobs
only; organisation-wide roles see all. A team's token may give a job only a priority within its
queue's bounds (`queues[].priority_bounds`, default 0–100); the admin's may give any.

Errors are JSON, `{"error": {"status", "code", "message"}}`:
    400 bad_request       malformed JSON, a body that is not an object, unknown fields or query
                          parameters, wrong types, values out of range, a bad cursor or key
    401 unauthorized      no token, or a token that is not known (with WWW-Authenticate)
    403 forbidden         an action the caller's role may not do (a member: on a teammate's
                          job), or a priority beyond its queue's bounds
    404 not_found         no such route, or no such job or team *for this caller*: another
                          team's job (or ?team=, or a submission for it) is "not found", never
                          "forbidden", so its existence does not leak
    405 method_not_allowed
    408 request_timeout   the body was not all sent within the read timeout (connection closed)
    409 conflict          cancelling a job that has ended (without an Idempotency-Key)
    413 too_large         a body over `max_body_bytes` (connection closed)
    415 unsupported_media a body whose Content-Type is not JSON
    422 unprocessable     a queue, team, project, GPU model or pool that is not configured;
        idempotency_key_reused: an Idempotency-Key already used for a different request
    503 unavailable       a person's JWT while the OIDC issuer's keys cannot be fetched
202 instead of 201/200: the broker did not take the job's events in time; the scheduler holds
them and publishes (then carries out) them when it does. Send an `Idempotency-Key` to make a
retry safe: the same key (per caller) with the same body answers 200 with the job the first
made (`Idempotent-Replayed: true`), also after the scheduler restarts.
Nothing a client sends raises out of a handler: an unexpected error is logged and answered 500.
"""

from scheduler.api.app import api_server, build_app
from scheduler.api.auth import Principal, Tokens
from scheduler.api.responses import ApiError

__all__ = ["ApiError", "Principal", "Tokens", "api_server", "build_app"]
