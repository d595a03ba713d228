"""`tally job …` and `tally queue list` against a real API server (the service on the fake
executor, in a background thread): output formats and exit codes."""

from __future__ import annotations

import asyncio
import csv
import io
import re
import threading
from collections.abc import Iterator

import click
import orjson
import pytest
from aiohttp import web
from click.testing import CliRunner

from ledger.topology import TopologyNeed
from scheduler.api import Tokens, build_app
from scheduler.executors.fake import RUNS_FOREVER
from tally.broker import free_port
from tally.cli import cli
from tally.cli.job import model_policy_text, parse_duration
from tests.unit.test_scheduler_service_support import Rig

VISION = "vision-cli-token-0123456789"
ADMIN = "admin-cli-token-0123456789"


class Served:
    """The API of a `Rig` on a free port, served from its own thread and event loop."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = build_app(self.rig.service, Tokens(ADMIN, {"vision": VISION}), 64 * 1024)
        self.runner = web.AppRunner(app)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", self.port)
        self.loop.run_until_complete(site.start())
        self._ready.set()
        self.loop.run_forever()

    def tick(self) -> None:
        asyncio.run_coroutine_threadsafe(self.rig.service.tick(), self.loop).result(10)
        self.rig.clock.advance(1_000_000)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture
def served(tmp_path) -> Iterator[Served]:
    rig = Rig(tmp_path)
    rig.executor.default = RUNS_FOREVER
    instance = Served(rig)
    try:
        yield instance
    finally:
        instance.close()


def tally(served: Served, *args: str, token: str | None = VISION) -> click.testing.Result:
    argv = [args[0], args[1], "--api", served.url, *args[2:]]
    env = {"TALLY_TOKEN": token} if token else {"TALLY_TOKEN": ""}
    return CliRunner().invoke(cli, argv, env=env)


def test_submit_list_explain_cancel_and_queues(served):
    submitted = tally(
        served, "job", "submit", "-q", "dev", "-p", "detection", "--gpus", "2",
        "--estimate", "30m", "--env", "SEED=7", "--", "python", "train.py", "--lr", "0.1",
    )  # fmt: skip
    assert submitted.exit_code == 0, submitted.output
    job = submitted.output.strip()
    record = served.rig.dispatcher.records[job]
    assert (record.spec.gpus, record.spec.estimated_runtime_us) == (2, 1_800_000_000)
    assert served.rig.dispatcher.works.get(job).command == ("python", "train.py", "--lr", "0.1")
    served.tick()

    listed = tally(served, "job", "list", "-o", "csv")
    assert listed.exit_code == 0, listed.output
    (row,) = list(csv.DictReader(io.StringIO(listed.output)))
    assert (row["job_id"], row["state"], row["gpus"]) == (job, "running", "2")

    as_json = tally(served, "job", "list", "--state", "running", "-o", "json")
    assert [j["job_id"] for j in orjson.loads(as_json.output)] == [job]

    explained = tally(served, "job", "explain", job)
    assert explained.exit_code == 0 and "now: running" in explained.output
    (row,) = list(
        csv.DictReader(io.StringIO(tally(served, "job", "explain", job, "-o", "csv").output))
    )
    assert row["job_id"] == job and "now: running" in row["explanation"]
    as_json = orjson.loads(tally(served, "job", "explain", job, "-o", "json").output)
    assert as_json["job_id"] == job and "now: running" in as_json["explanation"]
    assert as_json["as_of_us"] > 0 and as_json["events"][0]["type"] == "tally.job.submitted"
    zh = CliRunner().invoke(
        cli,
        ["job", "explain", "--api", served.url, job],
        env={"TALLY_TOKEN": VISION, "TALLY_LANG": "zh-CN"},
    )  # written here from the events, in the CLI's language (#15 item 9)
    assert zh.exit_code == 0 and job in zh.output and "now: running" not in zh.output
    assert re.search("[\u4e00-\u9fff]", zh.output.splitlines()[0]), zh.output

    queues = tally(served, "queue", "list")
    assert queues.exit_code == 0
    assert queues.output.splitlines()[0].split()[:3] == ["NAME", "CLASS", "PRIORITY"]
    assert "reclaim after 10 min" in queues.output

    cancelled = tally(served, "job", "cancel", job, "-o", "json")
    assert cancelled.exit_code == 0 and orjson.loads(cancelled.output)[0]["state"] == "cancelled"
    again = tally(served, "job", "cancel", job)
    assert again.exit_code == 1 and "has already ended" in again.output


@pytest.mark.parametrize(
    ("args", "token", "code", "text"),
    [
        (("job", "list"), None, 2, "a token is needed"),
        (("job", "list"), "wrong-token-0123456789", 2, "not valid"),
        (("job", "explain", "job-nope"), VISION, 1, "no job job-nope"),
        (("job", "submit", "-q", "nope", "-p", "detection", "--", "true"), VISION, 2,
         "unknown queue"),
        (("job", "submit", "-q", "dev", "-p", "detection"), VISION, 2, "give a command"),
        (("job", "submit", "-q", "dev", "-p", "detection", "--team", "language", "--", "true"),
         VISION, 1, "no team language"),
        (("job", "submit", "-q", "dev", "-p", "detection", "--estimate", "soon", "--", "true"),
         VISION, 2, "not a duration"),
    ],
    ids=["no-token", "wrong-token", "unknown-job", "unknown-queue", "no-command",
         "other-team", "bad-duration"],
)  # fmt: skip
def test_refusals_have_their_exit_codes(served, args, token, code, text):
    result = tally(served, *args, token=token)
    assert result.exit_code == code, result.output
    assert text in result.output


def test_an_unreachable_scheduler_exits_3():
    argv = ["job", "list", "--api", f"http://127.0.0.1:{free_port()}", "--token", VISION]
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 3 and "could not be reached" in result.output


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400),
     ("0.5h", 1800)],
)  # fmt: skip
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


class LosesFirstAnswer:
    """A front for `served` that passes every request on but answers the first submission's
    caller 502 — the job was made, the answer lost — as a broken proxy or network would."""

    def __init__(self, served: Served) -> None:
        self.served = served
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.keys: list[str | None] = []
        future = asyncio.run_coroutine_threadsafe(self._start(), served.loop)
        self.runner = future.result(10)

    async def _forward(self, request: web.Request) -> web.Response:
        import aiohttp

        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                request.method, self.served.url + request.path_qs, data=body, headers=headers
            ) as answer,
        ):
            data = await answer.read()
            status = answer.status
        if request.method == "POST" and request.path == "/v1/jobs":
            self.keys.append(request.headers.get("Idempotency-Key"))
            if len(self.keys) == 1:
                return web.Response(status=502, text="bad gateway")
        return web.Response(body=data, status=status, content_type="application/json")

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        return runner

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.served.loop).result(10)


def test_submit_retries_with_its_key_and_makes_one_job(served):
    front = LosesFirstAnswer(served)
    try:
        argv = ["job", "submit", "--api", front.url, "-q", "dev", "-p", "detection", "--", "true"]
        result = CliRunner().invoke(cli, argv, env={"TALLY_TOKEN": VISION})
    finally:
        front.close()
    assert result.exit_code == 0, result.output
    (job,) = served.rig.dispatcher.records  # one job, though it was sent twice
    assert result.output.strip() == job
    assert len(front.keys) == 2 and front.keys[0] == front.keys[1] and front.keys[0]


def test_an_explicit_key_makes_resubmitting_safe(served):
    args = ("job", "submit", "-q", "dev", "-p", "detection", "--idempotency-key", "run-42",
            "--", "true")  # fmt: skip
    first, again = tally(served, *args), tally(served, *args)
    assert first.exit_code == again.exit_code == 0, (first.output, again.output)
    assert first.output == again.output and list(served.rig.dispatcher.records) == [
        first.output.strip()
    ]
    changed = tally(served, *args[:-1], "false")
    assert changed.exit_code == 2 and "used for a different submission" in changed.output


def test_list_follows_the_cursors_and_takes_filters(served, monkeypatch):
    monkeypatch.setattr("tally.cli.job.PAGE", 2)
    jobs = []
    for user in ("ada", "bob", "ada", "bob", "ada"):
        result = tally(served, "job", "submit", "-q", "dev", "-p", "detection", "--user", user,
                       "--", "true")  # fmt: skip
        jobs.append(result.output.strip())
        served.rig.clock.advance(1_000_000)
    listed = tally(served, "job", "list", "-o", "json")
    assert [j["job_id"] for j in orjson.loads(listed.output)] == jobs
    three = tally(served, "job", "list", "--limit", "3", "-o", "json")
    assert [j["job_id"] for j in orjson.loads(three.output)] == jobs[:3]
    ada = tally(served, "job", "list", "--user", "ada", "--queue", "dev", "-o", "json")
    assert [j["job_id"] for j in orjson.loads(ada.output)] == jobs[::2]
    since = tally(served, "job", "list", "--since", "2026-11-01T00:00:02Z", "-o", "json")
    assert [j["job_id"] for j in orjson.loads(since.output)] == jobs[2:]


@pytest.mark.parametrize(
    ("models", "code", "text"),
    [
        pytest.param("A100|V100", 2, "no GPUs of model 'V100'", id="each-model-reaches-the-api"),
        pytest.param("A100|", 2, "expected MODEL or MODEL|MODEL", id="empty-name-is-a-usage-error"),
    ],
)
def test_gpu_model_takes_several_models(served, models, code, text):
    got = tally(served, "job", "submit", "-q", "dev", "-p", "detection", "--gpu-model", models,
                "--", "true")  # fmt: skip
    assert got.exit_code == code and text in got.output, got.output
    assert not served.rig.events()


def test_gpu_model_with_one_model_submits_it_as_before(served):
    got = tally(served, "job", "submit", "-q", "dev", "-p", "detection", "--gpu-model", "A100",
                "--", "true")  # fmt: skip
    assert got.exit_code == 0, got.output
    record = served.rig.dispatcher.records[got.output.strip()]
    assert (record.spec.model, record.spec.models) == ("A100", None)


@pytest.mark.parametrize(
    ("option", "need", "span"),
    [
        pytest.param(("--topology", "nvlink"), TopologyNeed.NVLINK, True, id="nvlink"),
        pytest.param(("--topology", "node"), TopologyNeed.NODE, False, id="node-is-one-node"),
        pytest.param((), None, True, id="none-by-default"),
    ],
)
def test_topology_reaches_the_job_spec(served, option, need, span):
    got = tally(served, "job", "submit", "-q", "dev", "-p", "detection", "--gpus", "2", *option,
                "-o", "json", "--", "true")  # fmt: skip
    assert got.exit_code == 0, got.output
    (job,) = orjson.loads(got.output)
    job_id = job["job_id"]
    spec = served.rig.dispatcher.records[job_id].spec
    assert (spec.topology, spec.span_nodes) == (need, span)
    assert job["topology"] == (need and need.value)
    shown = tally(served, "job", "show", job_id)
    assert orjson.loads(shown.output)["topology"] == job["topology"], shown.output


@pytest.mark.parametrize(
    ("option", "gpus", "profile", "share"),
    [
        pytest.param(("--mig", "1g.10gb:2"), 2, "1g.10gb", None, id="mig-instances"),
        pytest.param(("--gpu-share", "0.25"), 1, None, 250, id="a-quarter-gpu"),
    ],
)
def test_fractional_requests_reach_the_job_spec(served, option, gpus, profile, share):
    got = tally(served, "job", "submit", "-q", "dev", "-p", "detection", *option, "-o", "json",
                "--", "true")  # fmt: skip
    assert got.exit_code == 0, got.output
    spec = served.rig.dispatcher.records[orjson.loads(got.output)[0]["job_id"]].spec
    assert (spec.gpus, spec.mig_profile, spec.gpu_share) == (gpus, profile, share)


@pytest.mark.parametrize(
    "option",
    [
        pytest.param(("--mig", "1g"), id="unreadable-profile"),
        pytest.param(("--gpu-share", "1.5"), id="share-past-one-gpu"),
        pytest.param(("--mig", "1g.10gb", "--gpu-share", "0.5"), id="both"),
        pytest.param(("--mig", "1g.10gb:2", "--gpus", "2"), id="mig-with-gpus"),
    ],
)
def test_a_bad_fractional_request_is_a_usage_error(served, option):
    got = tally(served, "job", "submit", "-q", "dev", "-p", "detection", *option, "--", "true")
    assert got.exit_code == 2, got.output
    assert not served.rig.events()


def test_an_unknown_topology_is_a_usage_error(served):
    got = tally(served, "job", "submit", "-q", "dev", "-p", "detection", "--topology", "rack",
                "--", "true")  # fmt: skip
    assert got.exit_code == 2 and "rack" in got.output
    assert not served.rig.events()


@pytest.mark.parametrize(
    ("allowed", "forbidden", "shown"),
    [
        pytest.param(None, [], "any", id="no-policy"),
        pytest.param(["A100", "L40S"], [], "A100|L40S", id="allowed-list"),
        pytest.param(None, ["H100"], "any, not H100", id="forbidden-list"),
    ],
)
def test_queue_list_shows_the_model_policy(allowed, forbidden, shown):
    assert model_policy_text(allowed, forbidden) == shown
