"""The OpenAPI 3.1 document of the API, generated from the route table
(`scheduler.api.routes`) and the JSON schemas of the request and response models
(`scheduler.api.models`); served at `/v1/openapi.json`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from scheduler.api.handlers import IDEMPOTENCY_HEADER, REPLAYED_HEADER
from scheduler.api.models import ErrorBody
from scheduler.api.responses import CODE_OF_STATUS
from scheduler.api.routes import ROUTES, Route

REF = "#/components/schemas/{model}"
DESCRIPTIONS = {
    200: "OK",
    201: "Created",
    202: "Accepted: the broker has not taken the events yet; carried out once it does",
    400: "Bad request: malformed JSON, unknown fields or parameters, wrong types, out of range",
    401: "No token, or one that is not known (a JWT: not valid for the configured issuer)",
    403: "The caller's role may not do this (a person whose claims give no role), a team's token "
    "acting for another team, a priority beyond the queue's bounds, or an approver the request "
    "does not name",
    404: "No such route, or no such job, team or request for this caller",
    405: "Method not allowed",
    408: "The body was not sent in time",
    409: "The job has already ended, or the request is no longer open",
    413: "The body is too large",
    415: "The body is not JSON",
    422: "A queue, team, project, model or pool that is not configured; or an Idempotency-Key "
    "already used for a different request",
    500: "An unexpected error (a bug)",
    503: "The broker did not take the request's event, no admin topic is followed, or (a "
    "person's JWT) the OIDC issuer's keys cannot be fetched",
}


def _models(routes: Iterable[Route]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    wanted: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {
        (ErrorBody, "serialization"): None
    }
    for route in routes:
        if route.body is not None:
            wanted[(route.body, "validation")] = None
        if route.query is not None:
            wanted[(route.query, "validation")] = None
        if route.response is not None:
            wanted[(route.response, "serialization")] = None
    return list(wanted)


def _parameters(route: Route, schemas: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if "{job_id}" in route.path:
        out.append({"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}})
    if route.query is not None:
        model = schemas[route.query.__name__]
        required = set(model.get("required", ()))
        for name, schema in model["properties"].items():
            out.append(
                {"name": name, "in": "query", "required": name in required, "schema": schema}
            )
    if route.idempotent:
        out.append(
            {
                "name": IDEMPOTENCY_HEADER,
                "in": "header",
                "required": False,
                "description": "the same key (per caller) repeats the first answer, once",
                "schema": {"type": "string", "pattern": "^[\\x21-\\x7e]{1,128}$"},
            }
        )
    return out


def _content(schema: dict[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": schema}}


def _operation(
    route: Route, refs: dict[type[BaseModel], dict[str, Any]], schemas: dict[str, Any]
) -> dict[str, Any]:
    body = {"type": "object"} if route.response is None else refs[route.response]
    responses: dict[str, Any] = {}
    for status in route.ok:
        answer: dict[str, Any] = {"description": DESCRIPTIONS[status], "content": _content(body)}
        if route.idempotent and status == 200:
            answer["headers"] = {
                REPLAYED_HEADER: {
                    "description": "`true` when this repeats an earlier request's answer",
                    "schema": {"type": "string"},
                }
            }
        responses[str(status)] = answer
    for status in (*route.errors, 500):
        responses[str(status)] = {
            "description": f"{DESCRIPTIONS[status]} (`{CODE_OF_STATUS[status]}`)",
            "content": _content(refs[ErrorBody]),
        }
    operation: dict[str, Any] = {
        "operationId": route.operation_id,
        "summary": route.summary,
        "parameters": _parameters(route, schemas),
        "responses": responses,
        "security": [{"bearer": []}] if route.token else [],
    }
    if route.body is not None:
        operation["requestBody"] = {"required": True, "content": _content(refs[route.body])}
    return operation


def document(routes: Iterable[Route] = ROUTES) -> dict[str, Any]:
    """The OpenAPI 3.1 document of `routes`."""
    chosen = tuple(routes)
    keyed, defs = models_json_schema(_models(chosen), ref_template=REF)
    refs: dict[type[BaseModel], dict[str, Any]] = {}
    for (model, _), schema in keyed.items():
        if isinstance(model, type) and issubclass(model, BaseModel):
            refs[model] = schema
    schemas: dict[str, Any] = defs.get("$defs", {})
    paths: dict[str, dict[str, Any]] = {}
    for route in chosen:
        paths.setdefault(route.path, {})[route.method.lower()] = _operation(route, refs, schemas)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Tally scheduler API",
            "version": "1",
            "description": "Submit, list, cancel and explain jobs; queues and balances. Errors "
            'are `{"error": {"status", "code", "message"}}`.',
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }
