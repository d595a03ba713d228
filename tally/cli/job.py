"""`tally job submit|list|show|cancel|explain` and `tally queue list`: clients of the scheduler's
HTTP API (`scheduler.api`).

The API is `--api` / $TALLY_API, else the configured `scheduler.host:port`; the token is
`--token` / $TALLY_TOKEN (any role's: the API decides with the permission table,
`ledger.roles`). Exit codes: 0 ok; 1 the job or team is not there or is another team's (404)
or the job has ended (409, cancel); 2 the request was refused (bad input, unknown queue, missing
or wrong token, a role that may not: 403); 3 the scheduler could not be reached or failed (5xx).

`submit` and `cancel` send an `Idempotency-Key` (a fresh UUID, or `--idempotency-key`) and
retry with the same key when the scheduler cannot be reached or answers 5xx, so a retry never
makes a second job. `list` follows the API's cursors to the last page (or `--limit` jobs).
A job's `submitted` is on the ledger's clock in a table (the configuration's `ledger.timezone`,
UTC without one), in UTC in CSV; JSON is the API's record (`submitted_us`).
"""

from __future__ import annotations

import getpass
import os
import re
import time
import uuid
from datetime import UTC, tzinfo
from typing import Any, NoReturn

import click
import orjson
import requests

from ledger.errors import EventError
from ledger.fractional import parse_mig, parse_share
from tally.cli.help import Group
from tally.cli.options import Exit, config_option, fail, load_or_exit, output_option
from tally.config import ConfigError, load_config
from tally.language import EN, _, language, reader
from tally.output import OutputFormat, render, shown_time

TIMEOUT_S = 30.0
RETRIES = 3  # attempts of a request that carries an idempotency key
RETRY_DELAY_S = 0.5
PAGE = 1000
DURATION = re.compile(
    r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?"
    r"(?:(\d+(?:\.\d+)?)s?)?$"
)

api_option = click.option(
    "--api",
    "api",
    envvar="TALLY_API",
    default=None,
    metavar="URL",
    help="Scheduler API (default: $TALLY_API, else the config's scheduler.host:port).",
)
token_option = click.option(
    "--token",
    envvar="TALLY_TOKEN",
    default=None,
    help="Bearer token (default: $TALLY_TOKEN).",
)


def parse_duration(text: str) -> float:
    """`90`, `90s`, `30m`, `2h`, `1d`, `1h30m` → seconds."""
    match = DURATION.match(text.strip())
    if not text.strip() or match is None or not any(match.groups()):
        raise click.BadParameter(
            _("{text!r} is not a duration such as 90s, 30m, 2h or 1h30m").format(text=text)
        )
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return days * 86_400 + hours * 3_600 + minutes * 60 + seconds


class Client:
    def __init__(self, config_path: str, api: str | None, token: str | None) -> None:
        if api is None:
            from tally.scheduling import api_url

            api = api_url(load_or_exit(config_path))
        self.base = api.rstrip("/")
        self.token = token

    def _fail(self, response: requests.Response) -> NoReturn:
        try:
            error = response.json()["error"]
            message = f"{error['message']} ({response.status_code} {error['code']})"
        except (ValueError, KeyError, TypeError):
            message = f"{response.status_code} {response.reason}"
        if response.status_code in (404, 409):
            fail(message, Exit.CHECK_FAILED)
        if response.status_code < 500:
            fail(message, Exit.USAGE)
        fail(message, Exit.BROKER)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        idempotency_key: str | None = None,
        **params: str | int | None,
    ) -> Any:
        """One request; with an idempotency key it is retried (with that key) when the
        scheduler cannot be reached or answers 5xx."""
        if not self.token:
            fail(_("a token is needed: pass --token or set TALLY_TOKEN"), Exit.USAGE)
        headers = {"Authorization": f"Bearer {self.token}"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        data = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            data = orjson.dumps(body)
        attempts = RETRIES if idempotency_key is not None else 1
        for attempt in range(1, attempts + 1):
            try:
                response = requests.request(
                    method,
                    self.base + path,
                    headers=headers,
                    data=data,
                    params={k: v for k, v in params.items() if v is not None} or None,
                    timeout=TIMEOUT_S,
                )
            except requests.RequestException as exc:
                if attempt == attempts:
                    fail(
                        _("the scheduler at {base} could not be reached: {exc}").format(
                            base=self.base, exc=exc
                        ),
                        Exit.BROKER,
                    )
                time.sleep(RETRY_DELAY_S * attempt)
                continue
            if response.status_code >= 500 and attempt < attempts:
                time.sleep(RETRY_DELAY_S * attempt)
                continue
            if response.status_code >= 400:
                self._fail(response)
            return response.json()
        raise AssertionError("unreachable")  # the loop returns or fails


JOB_COLUMNS = ("job_id", "team", "queue", "gpus", "state", "reason", "attempt", "submitted")


def job_row(job: dict[str, Any], fmt: OutputFormat, zone: tzinfo = UTC) -> list[Any]:
    """A job of the API's as `-o table` and `-o csv` print it: `submitted` on the ledger's clock
    in a table (`tally.output.shown_time`), in UTC in CSV (JSON prints the API's record)."""
    submitted = job["submitted_us"]
    return [
        job["job_id"],
        job["team"],
        job["queue"],
        job["gpus"],
        job["state"],
        job["reason"] or None,
        job["attempt"],
        None if submitted is None else shown_time(submitted, fmt, zone),
    ]


def _echo_jobs(jobs: list[dict[str, Any]], fmt: OutputFormat, config_path: str) -> None:
    if fmt is OutputFormat.JSON:
        click.echo(orjson.dumps(jobs, option=orjson.OPT_INDENT_2).decode())
        return
    zone = _ledger_zone(config_path) if fmt is OutputFormat.TABLE else UTC
    click.echo(render(JOB_COLUMNS, [job_row(j, fmt, zone) for j in jobs], fmt))


@click.group(cls=Group)
def job() -> None:
    """Submit, list, cancel and explain jobs (through the scheduler's API)."""


def _models(text: str | None) -> str | list[str] | None:
    """`--gpu-model`: one model as a string (as always), several (`A100|H100`) as a list."""
    if text is None:
        return None
    models = [m.strip() for m in text.split("|")]
    if not all(models):
        fail(
            _("--gpu-model {text!r}: expected MODEL or MODEL|MODEL|...").format(text=text),
            Exit.USAGE,
        )
    return models[0] if len(models) == 1 else models


@job.command("submit", context_settings={"ignore_unknown_options": True})
@config_option
@api_option
@token_option
@click.option("--queue", "-q", required=True, help="Queue to submit to.")
@click.option("--gpus", "-g", type=int, default=1, show_default=True, help="GPUs (a gang).")
@click.option("--project", "-p", required=True, help="Project the usage is charged to.")
@click.option("--team", default=None, help="Team (only with the admin token).")
@click.option("--user", default=None, help="User (default: your login).")
@click.option(
    "--gpu-model",
    "--model",
    "model",
    default=None,
    help="GPU model, or acceptable models cheapest first, e.g. 'A100|H100' (default: any).",
)
@click.option("--pool", default=None, help="Pool (default: any).")
@click.option("--estimate", default=None, help="Expected runtime, e.g. 2h (sets the hold).")
@click.option("--max-runtime", default=None, help="Stop the job after this long, e.g. 1d.")
@click.option("--priority", type=int, default=None, help="Priority (default: the queue's).")
@click.option("--one-node", is_flag=True, help="All GPUs on one node.")
@click.option(
    "--topology",
    type=click.Choice(["node", "nvlink", "rail"]),
    default=None,
    help="Require the gang's GPUs on one node, in one NVLink domain or on one IB rail "
    "(default: preferred, not required).",
)
@click.option(
    "--mig",
    default=None,
    metavar="PROFILE[:COUNT]",
    help="MIG instances instead of whole GPUs, e.g. 1g.10gb:2 (replaces --gpus).",
)
@click.option(
    "--gpu-share",
    default=None,
    metavar="FRACTION",
    help="A time-sliced share of one GPU, e.g. 0.25 (dev and inference queues).",
)
@click.option("--env", "env", multiple=True, metavar="NAME=VALUE", help="Extra environment.")
@click.option("--cwd", default=None, help="Working directory of the job.")
@click.option("--script", type=click.File("r"), default=None, help="Run this #! script.")
@click.option(
    "--idempotency-key",
    default=None,
    help="Key that makes resubmitting safe (default: a fresh UUID, reused on retries).",
)
@output_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def submit(
    config_path: str,
    api: str | None,
    token: str | None,
    queue: str,
    gpus: int,
    project: str,
    team: str | None,
    user: str | None,
    model: str | None,
    pool: str | None,
    estimate: str | None,
    max_runtime: str | None,
    priority: int | None,
    one_node: bool,
    topology: str | None,
    mig: str | None,
    gpu_share: str | None,
    env: tuple[str, ...],
    cwd: str | None,
    script: Any,
    idempotency_key: str | None,
    output: str,
    command: tuple[str, ...],
) -> None:
    """Submit COMMAND (after `--`) or --script to a queue; prints the job's id."""
    if bool(command) == (script is not None):
        fail(_("give a command after `--`, or --script FILE (not both)"), Exit.USAGE)
    variables: dict[str, str] = {}
    for item in env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            fail(_("--env {item!r}: expected NAME=VALUE").format(item=item), Exit.USAGE)
        variables[name] = value
    mig_profile = None
    if mig is not None or gpu_share is not None:
        if mig is not None and gpu_share is not None:
            fail(_("give --mig or --gpu-share, not both"), Exit.USAGE)
        if gpus != 1:
            fail(_("--mig and --gpu-share replace --gpus"), Exit.USAGE)
        try:
            if mig is not None:
                mig_profile, gpus = parse_mig(mig)
            else:
                parse_share(gpu_share or "")
        except EventError as exc:
            fail(str(exc), Exit.USAGE)
    body: dict[str, Any] = {
        "queue": queue,
        "gpus": gpus,
        "project": project,
        "user": user or os.environ.get("USER") or getpass.getuser(),
        "span_nodes": not one_node,
    }
    if command:
        body["command"] = list(command)
    else:
        body["script"] = script.read()
    optional = {
        "team": team,
        "model": _models(model),
        "pool": pool,
        "priority": priority,
        "topology": topology,
        "mig_profile": mig_profile,
        "gpu_share": gpu_share,
        "cwd": cwd,
        "estimated_runtime_s": None if estimate is None else parse_duration(estimate),
        "max_runtime_s": None if max_runtime is None else parse_duration(max_runtime),
        "env": variables or None,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    key = idempotency_key or str(uuid.uuid4())
    answer = Client(config_path, api, token).call("POST", "/v1/jobs", body, key)
    if answer.get("warning"):
        click.secho(
            _("warning: {warning}").format(warning=answer["warning"]), fg="yellow", err=True
        )
    fmt = OutputFormat(output)
    if fmt is OutputFormat.TABLE:
        click.echo(answer["job"]["job_id"])
    else:
        _echo_jobs([answer["job"]], fmt, config_path)


@job.command("list")
@config_option
@api_option
@token_option
@click.option(
    "--state",
    type=click.Choice(["pending", "running", "finished", "failed", "cancelled", "reclaimed"]),
    default=None,
)
@click.option("--team", default=None, help="Only this team (admin token).")
@click.option("--queue", "-q", default=None, help="Only this queue.")
@click.option("--user", default=None, help="Only this user's jobs.")
@click.option("--since", default=None, help="Submitted at or after (RFC 3339, or µs).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most this many.")
@output_option
def list_jobs(
    config_path: str,
    api: str | None,
    token: str | None,
    state: str | None,
    team: str | None,
    queue: str | None,
    user: str | None,
    since: str | None,
    limit: int | None,
    output: str,
) -> None:
    """The jobs the token may see (a team's own; the admin's: all), oldest first."""
    client = Client(config_path, api, token)
    jobs: list[dict[str, Any]] = []
    cursor: str | None = None
    while limit is None or len(jobs) < limit:
        size = PAGE if limit is None else min(PAGE, limit - len(jobs))
        answer = client.call(
            "GET", "/v1/jobs", state=state, team=team, queue=queue, user=user, since=since,
            limit=size, cursor=cursor,
        )  # fmt: skip
        jobs.extend(answer["jobs"])
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    _echo_jobs(jobs, OutputFormat(output), config_path)


@job.command("show")
@config_option
@api_option
@token_option
@click.argument("job_id")
def show(config_path: str, api: str | None, token: str | None, job_id: str) -> None:
    """One job, as JSON."""
    answer = Client(config_path, api, token).call("GET", f"/v1/jobs/{_quote(job_id)}")
    click.echo(orjson.dumps(answer["job"], option=orjson.OPT_INDENT_2).decode())


@job.command("cancel")
@config_option
@api_option
@token_option
@click.argument("job_id")
@output_option
def cancel(config_path: str, api: str | None, token: str | None, job_id: str, output: str) -> None:
    """Cancel a pending or running job (its processes are stopped; it is not retried)."""
    path = f"/v1/jobs/{_quote(job_id)}/cancel"
    answer = Client(config_path, api, token).call("POST", path, None, str(uuid.uuid4()))
    if answer.get("warning"):
        click.secho(
            _("warning: {warning}").format(warning=answer["warning"]), fg="yellow", err=True
        )
    _echo_jobs([answer["job"]], OutputFormat(output), config_path)


@job.command("explain")
@config_option
@api_option
@token_option
@click.argument("job_id")
@output_option
def explain(config_path: str, api: str | None, token: str | None, job_id: str, output: str) -> None:
    """Why JOB_ID waits, runs, was preempted or ended."""
    answer = Client(config_path, api, token).call("GET", f"/v1/jobs/{_quote(job_id)}/explain")
    fmt = OutputFormat(output)
    if fmt is OutputFormat.JSON:
        click.echo(orjson.dumps(answer, option=orjson.OPT_INDENT_2).decode())
    elif fmt is OutputFormat.CSV:
        row = [answer["job_id"], answer["explanation"]]
        click.echo(render(["job_id", "explanation"], [row], fmt))
    elif language() == EN or not answer.get("events"):
        click.echo(answer["explanation"])
    else:
        from tally.cli.explain_text import explanation_text

        click.echo(explanation_text(answer, reader(), _ledger_zone(config_path)))


def _ledger_zone(config_path: str) -> tzinfo:
    """The configuration's `ledger.timezone`; UTC when there is no configuration to read (a
    client given only --api and a token)."""
    try:
        return load_config(config_path).ledger.zone()
    except ConfigError:
        return UTC


def _quote(job_id: str) -> str:
    from urllib.parse import quote

    return quote(job_id, safe="")


@click.group(cls=Group)
def queue() -> None:
    """The scheduler's queues."""


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g}h"


QUEUE_COLUMNS = (
    "name",
    "class",
    "priority",
    "preemptible",
    "idle_reclaim",
    "max_runtime",
    "retry_limit",
    "over_budget",
    "models",
    "pending",
    "running",
)


def model_policy_text(allowed: list[str] | None, forbidden: list[str]) -> str:
    """A queue's model policy: `any`, `A100|L40S`, `any, not H100`."""
    text = "|".join(allowed) if allowed is not None else "any"
    return f"{text}, not {'|'.join(forbidden)}" if forbidden else text


@queue.command("list")
@config_option
@api_option
@token_option
@output_option
def list_queues(config_path: str, api: str | None, token: str | None, output: str) -> None:
    """The queues, their policies and how many jobs wait and run in each."""
    answer = Client(config_path, api, token).call("GET", "/v1/queues")
    fmt = OutputFormat(output)
    if fmt is OutputFormat.JSON:
        click.echo(orjson.dumps(answer["queues"], option=orjson.OPT_INDENT_2).decode())
        return
    rows = []
    for q in answer["queues"]:
        idle = q["idle_reclaim"]
        if q["idle_after_min"] and idle != "never":
            idle = f"{idle} after {q['idle_after_min']:g} min"
        runtime = q["max_runtime_s"]
        rows.append(
            [
                q["name"],
                q["class"],
                q["priority"],
                "yes" if q["preemptible"] else "no",
                idle,
                runtime if fmt is not OutputFormat.TABLE or runtime is None else _hours(runtime),
                q["retry_limit"],
                q["over_budget"],
                model_policy_text(q["allowed_models"], q["forbidden_models"]),
                q["pending"],
                q["running"],
            ]
        )
    click.echo(render(QUEUE_COLUMNS, rows, fmt))
