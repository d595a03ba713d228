"""The API's request and response bodies as pydantic models: what a client may send (strict:
unknown fields, wrong types and out-of-range values are refused) and what it gets back. The
OpenAPI document (`scheduler.api.openapi`) is generated from these models; `problem` turns a
validation error into the one-line message of a 400 answer, naming the fields.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ledger.field_decoding import MAX_TEXT
from ledger.job_events import MAX_GPUS_PER_JOB
from ledger.topology import TopologyNeed
from scheduler.records import JobState

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
MAX_SECONDS = 366 * 24 * 3600
MAX_ARGS = 1024
MAX_ARG_LEN = 8192
MAX_SCRIPT = 256 * 1024
MAX_ENV = 256
MAX_PATH = 4096
MAX_PRIORITY = 1_000_000
MAX_PAGE = 1000
MAX_MODELS = 64
DEFAULT_PAGE = 100

Name = Annotated[str, Field(min_length=1, max_length=64, pattern=NAME_PATTERN)]
Text = Annotated[str, Field(min_length=1, max_length=MAX_TEXT)]
Argument = Annotated[str, Field(min_length=1, max_length=MAX_ARG_LEN)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]

NAME_HINT = "use letters, digits, '.', '_' and '-' (at most 64, not starting with a symbol)"


class Request(BaseModel):
    """A request body: strict types, no unknown fields."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class Response(BaseModel):
    """A response body: every field always present (null when there is no value)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------- requests


class SubmitBody(Request):
    """A job submission. `team` is required with the admin's token; a team's token acts for its
    own team only. Exactly one of `command` (an argv) or `script` (starting with `#!`)."""

    team: Name | None = None
    project: Name
    user: Name
    queue: Name
    gpus: int = Field(ge=1, le=MAX_GPUS_PER_JOB)
    command: list[Argument] | None = Field(None, min_length=1, max_length=MAX_ARGS)
    script: str | None = Field(None, max_length=MAX_SCRIPT)
    env: dict[str, Annotated[str, Field(max_length=MAX_ARG_LEN)]] | None = Field(
        None, max_length=MAX_ENV
    )
    cwd: str | None = Field(None, min_length=1, max_length=MAX_PATH)
    estimated_runtime_s: Seconds | None = None
    max_runtime_s: Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)] | None = None
    model: Text | list[Text] | None = Field(
        None,
        description="the GPU model, or a list of acceptable models (placed on the cheapest "
        "that admits the job); null: any model",
    )
    pool: Name | None = None
    span_nodes: bool = True
    priority: int | None = Field(None, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    topology: TopologyNeed | None = Field(
        None,
        strict=False,  # the value as text: "node", "nvlink" or "rail"
        description="what the gang requires of where its GPUs sit: `node` (one node), `nvlink` "
        "(one NVLink domain) or `rail` (one IB rail); null: preferred, not required",
    )

    mig_profile: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        description="MIG instances instead of whole GPUs: `gpus` instances of this GPU-instance "
        "profile, e.g. 1g.10gb",
    )
    gpu_share: str | None = Field(
        None,
        min_length=1,
        max_length=16,
        description='a time-sliced share of one GPU as an exact decimal, e.g. "0.25" or '
        '"25%" (steps of 0.001; dev and inference queues only); `gpus` must be 1',
    )

    @model_validator(mode="after")
    def _models_listed(self) -> SubmitBody:
        if isinstance(self.model, list) and not 1 <= len(self.model) <= MAX_MODELS:
            raise ValueError(f"model: a list of 1 to {MAX_MODELS} models")
        return self

    @property
    def models(self) -> tuple[str, ...]:
        """The acceptable models (empty: any)."""
        if self.model is None:
            return ()
        return (self.model,) if isinstance(self.model, str) else tuple(self.model)

    @model_validator(mode="after")
    def _one_kind_of_work(self) -> SubmitBody:
        if (self.command is None) == (self.script is None):
            raise ValueError("give exactly one of command (a list of arguments) or script")
        if any("\0" in a for a in self.command or ()) or (self.script and "\0" in self.script):
            raise ValueError("command: NUL bytes are not allowed")
        return self


class JobsQuery(BaseModel):
    """`GET /v1/jobs` query: a page of the jobs the caller may see, oldest submission first."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit: int = Field(DEFAULT_PAGE, ge=1, le=MAX_PAGE)
    cursor: str | None = Field(None, min_length=1, max_length=512)
    state: JobState | None = None
    queue: Name | None = None
    user: Name | None = None
    team: Name | None = None
    since: str | None = Field(
        None,
        max_length=64,
        description="jobs submitted at or after this time: RFC 3339, or integer µs since epoch",
    )


class TeamQuery(BaseModel):
    """`?team=`: a team's token may name only its own team; the admin's, any."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    team: Name | None = None


class InventoryQuery(BaseModel):
    """`?pool=`: only the GPUs of one pool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pool: Name | None = None


class NoQuery(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ---------------------------------------------------------------------------- responses


class Assigned(Response):
    """Where the job runs; `placement`: why that GPU model, when it accepted several."""

    pool: str | None
    model: str | None
    gpu_uuids: list[str]
    nodes: list[str]
    placement: str


class Hold(Response):
    gpu_ms: int
    money_micros: int


class JobView(Response):
    """A job. Times are given twice: µs since the epoch (`*_us`) and RFC 3339 in UTC (`*_at`)."""

    job_id: str
    team: str
    project: str
    user: str
    queue: str
    gpus: int
    model: str | None = Field(description="the one GPU model it accepts (null: several or any)")
    models: list[str] = Field(description="every GPU model it accepts (empty: any)")
    pool: str | None
    span_nodes: bool
    topology: TopologyNeed | None
    mig_profile: str | None = Field(description="the MIG profile of its instances (null: whole)")
    gpu_share: str | None = Field(description="its share of one GPU, e.g. 0.25 (null: whole)")
    priority: int | None
    estimated_runtime_s: float
    max_runtime_s: float | None
    state: JobState
    attempt: int
    reason: str
    detail: str
    submitted_us: int
    submitted_at: str
    admitted_us: int | None
    admitted_at: str | None
    started_us: int | None
    started_at: str | None
    ended_us: int | None
    ended_at: str | None
    assigned: Assigned
    exit_code: int | None
    preemptions: int
    hold: Hold
    over_budget: bool


class JobAnswer(Response):
    """One job; `warning` is set when the broker has not taken the job's events yet (202)."""

    job: JobView
    warning: str | None = None


class JobsPage(Response):
    """A page of jobs; `next_cursor` fetches the next (null: this is the last page)."""

    jobs: list[JobView]
    next_cursor: str | None


class Explanation(Response):
    """Why a job waits, runs or ended: `explanation` in the scheduler's English words, and what
    it is read from, for a client that writes it in another language (`tally job explain` in
    Chinese: `ledger.read.job_history.explain_job`): the job's events as the jobs topic carries
    them (`events`, envelopes) and the scheduler's time (`as_of_us`)."""

    job_id: str
    explanation: str
    as_of_us: int = 0
    events: list[dict[str, Any]] = Field(default_factory=list)


class PriorityRange(Response):
    min: int
    max: int


class QueueView(Response):
    name: str
    class_: str = Field(alias="class")
    priority: int
    priority_bounds: PriorityRange | None
    preemptible: bool
    idle_reclaim: str
    idle_after_min: float | None
    max_runtime_s: float | None
    retry_limit: int
    over_budget: str
    allowed_models: list[str] | None = Field(description="GPU models its jobs may use (null: any)")
    forbidden_models: list[str] = Field(description="GPU models its jobs may never use")
    pending: int
    running: int

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class Queues(Response):
    queues: list[QueueView]


class BudgetUnit(Response):
    unit: str
    granted: int
    consumed: int
    ledger_open_holds: int
    remaining: int
    holds_not_yet_in_ledger: int
    available_to_admit: int


class QuotaView(Response):
    """A quota in whole GPUs; what the team holds against it: `in_use` whole GPUs rounded up,
    `in_use_gpus` exactly (a GPU share counts as its share: `"2.25"`)."""

    pool: str
    model: str
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    in_use: int
    in_use_gpus: str


class Overdraft(Response):
    gpu_ms: int
    money_micros: int


class BalanceView(Response):
    team: str
    budgeted: bool
    period: str | None
    units: list[BudgetUnit]
    overdraft: Overdraft | None
    quotas: list[QuotaView]


class Balances(Response):
    balances: list[BalanceView]


class MigSliceView(Response):
    gpu_instance_id: int
    compute_instance_id: int
    profile: str
    slices: int
    total_slices: int


class InventoryGpuView(Response):
    """A GPU as the collectors report it. `status`: `live`, or `stale` when no report named it
    for more than the configured number of sampling intervals; `health`: `healthy`, `degraded`
    or `unhealthy` (with why, since when and the faults counted); `cordoned`: an operator keeps
    new jobs off it (by whom, why); `placeable`: whether new jobs may be placed on it now (not
    unhealthy, not cordoned, live); `in_use`: whether a job holds it; `topology`: its NVLink
    domain, NUMA node, IB rail and rack where known (`ledger.topology`)."""

    uuid: str
    node: str
    index: int
    pool: str
    model: str
    memory_total_bytes: int
    mig_mode: bool
    mig: list[MigSliceView]
    labels: dict[str, str]
    driver_version: str | None
    cuda_version: str | None
    topology: dict[str, str | int]
    source: str
    health: str
    health_reason: str | None
    health_since_us: int | None
    faults: int
    cordoned: bool
    cordoned_by: str | None
    cordon_reason: str | None
    status: str
    placeable: bool
    in_use: bool
    interval_us: int
    first_seen_us: int
    first_seen_at: str
    last_seen_us: int
    last_seen_at: str


class InventoryNodeView(Response):
    """A node as its GPUs' records say: its pool(s), labels and versions as its newest report
    gave them, how many of its GPUs are live and stale, and when it was last seen."""

    node: str
    pools: list[str]
    labels: dict[str, str]
    driver_version: str | None
    cuda_version: str | None
    gpus: int
    live: int
    stale: int
    last_seen_us: int
    last_seen_at: str


class InventoryAnswer(Response):
    nodes: list[InventoryNodeView]
    gpus: list[InventoryGpuView]


class Health(Response):
    status: str
    pending: int
    running: int


class ErrorDetail(Response):
    status: int
    code: str
    message: str


class ErrorBody(Response):
    error: ErrorDetail


# ---------------------------------------------------------------------------- messages

PHRASES = {
    "missing": "required",
    "int_type": "expected an integer",
    "bool_type": "expected true or false",
    "string_type": "expected a string",
    "float_type": "expected a number",
    "finite_number": "expected a finite number",
    "list_type": "expected a list",
    "dict_type": "expected an object",
    "string_pattern_mismatch": NAME_HINT,
}


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc)[:128] or "body"


def problem(exc: ValidationError, limit: int = 4) -> str:
    """A validation error as one message: unknown fields together, then up to `limit` problems
    as `field: what is wrong`."""
    errors = exc.errors(include_url=False, include_input=False)
    unknown = sorted(_where(e["loc"]) for e in errors if e["type"] == "extra_forbidden")
    parts: list[str] = []
    if unknown:
        parts.append(f"unknown fields: {', '.join(unknown)}"[:512])
    for error in errors:
        if error["type"] == "extra_forbidden":
            continue
        message = PHRASES.get(error["type"])
        if message is None:
            message = str(error["msg"]).removeprefix("Value error, ")
            message = message[:1].lower() + message[1:]
        loc = error["loc"]
        if error["type"] == "value_error" and not loc:  # a model validator names its own field
            parts.append(message)
        else:
            parts.append(f"{_where(loc)}: {message}")
    shown = parts[:limit]
    if len(parts) > limit:
        shown.append(f"and {len(parts) - limit} more")
    return "; ".join(shown)


def dumped(model: BaseModel) -> dict[str, Any]:
    """A response model as JSON-ready data (aliases as on the wire)."""
    return model.model_dump(mode="json", by_alias=True)
