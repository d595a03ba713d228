"""`scheduler.whatif` and `tally whatif`: a history recorded by the real scheduler simulation,
archived in a real DuckDB ledger, read back and replayed through the real cycle.

The checks the command promises: the recorded configuration reproduces every recorded
admission (or each divergence is reported with its cause); changing only prices changes no
decision and scales every cost exactly; adding GPUs raises no team's p95 wait (or it is
flagged); the capacity sentence."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from fractions import Fraction
from pathlib import Path

import pytest
from click.testing import CliRunner
from streamlit.testing.v1 import AppTest

from ledger.ingest import ConsumedMessage, Ingestor
from ledger.job_events import (
    FailReason,
    JobAdmitted,
    JobEvent,
    JobFailed,
    JobFinished,
    JobPreempted,
    JobReclaimed,
    JobSpec,
    JobSubmitted,
    PreemptReason,
    WaitReason,
    encode_job_event,
)
from ledger.pricing import PriceBook
from ledger.read.job_history import duration_text, read_job_event_log
from ledger.read.reports import ReportQueries, cost_report
from ledger.read.whatif_words import METRICS
from ledger.store.hot import DuckDBStore
from scheduler.executors.fake import RUNS_FOREVER, FakeExecutor, ManualClock
from scheduler.model import IdleAction, IdlePolicy
from scheduler.whatif import (
    Delay,
    History,
    Metrics,
    divergences,
    jain_permille,
    metrics,
    read_history,
    replay,
    same_decisions,
    what_if,
)
from scheduler.whatif.compare import capacity_sentence, gpu_hours, wait_flags
from scheduler.whatif.replay import idle_runtimes
from tally import language
from tally.cli import cli
from tally.config import TallyConfig
from tally.scheduling import build_dispatcher
from tally.whatif import add_gpus, history_of, scenario_of
from tests.builders import T0_US
from tests.conftest import REPO, write_config
from tests.scheduler_builders import a_queue
from tests.unit.test_cli import small_ledger
from tests.whatif_builders import (
    DAY_US,
    H100,
    HOUR_US,
    JOBS_TOPIC,
    MINUTE_US,
    PROJECTS,
    archive,
    record,
    whatif_config,
    workload,
)

SINCE, UNTIL = T0_US, T0_US + 2 * DAY_US
JOBS = 60


def config(**kw: object) -> TallyConfig:
    return TallyConfig.model_validate(whatif_config(**kw))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two days of jobs run under `whatif_config()` and archived."""
    events = record(scenario_of("live", config(), SINCE), workload(JOBS, 2 * DAY_US))
    return archive(tmp_path_factory.mktemp("whatif") / "ledger", events)


@pytest.fixture(scope="module")
def history(ledger_dir: Path) -> History:
    return read_history(read_job_event_log(ledger_dir).events, SINCE, UNTIL)


# ---------------------------------------------------------------------------- the checks


def test_the_recorded_config_reproduces_every_recorded_admission(history):
    assert len(history.jobs) == JOBS and len(history.recorded) >= JOBS // 2
    outcome = replay(history, scenario_of("a", config(), SINCE))
    assert divergences(history.recorded, history.recorded_waits, outcome, 0) == ()
    assert outcome.admissions == history.recorded


def test_a_smaller_fleet_diverges_and_every_divergence_names_its_cause(history):
    outcome = replay(history, scenario_of("b", config(nodes=1), SINCE))
    found = divergences(history.recorded, history.recorded_waits, outcome, 0)
    assert found
    assert all("kept it waiting" in d.cause or "never admitted" in d.cause for d in found)
    assert any("no_capacity" in d.cause or "quota" in d.cause for d in found), found


def test_changing_only_prices_changes_no_decision_and_scales_costs_exactly(history):
    a = replay(history, scenario_of("a", config(price="3.60"), SINCE))
    b = replay(history, scenario_of("b", config(price="7.20"), SINCE))
    assert same_decisions(a, b)
    ma, mb = metrics(a), metrics(b)
    assert ma.gpu_ms == mb.gpu_ms and sum(ma.gpu_ms.values()) > 0
    assert {t: 2 * c for t, c in ma.cost_micros.items()} == mb.cost_micros
    assert ma.cost_micros == ma.gpu_ms  # 3.60 per GPU-hour is one micro-unit per GPU-ms


@pytest.mark.parametrize("added", [4, 8], ids=["one-node", "two-nodes"])
def test_adding_gpus_raises_no_teams_p95_wait(history, added):
    report, _, _ = what_if(
        history,
        scenario_of("a", config(), SINCE),
        scenario_of("b", config(), SINCE, {H100: added}),
        tolerance_us=0,
        added_gpus={H100: added},
    )
    assert report.flags == ()
    assert report.alternative.delay_all.p95_us < report.baseline.delay_all.p95_us
    assert report.capacity == capacity_sentence({H100: added}, report.baseline, report.alternative)
    assert report.capacity.startswith(f"adding {added} GPUs of model {H100} would cut p95 wait")
    assert report.divergences == () and not report.decisions_unchanged


def _p95s(**p95_us: int) -> Metrics:
    by_team = {team: Delay(3, 0, us) for team, us in p95_us.items()}
    return Metrics({}, {}, by_team, {}, Delay(0, 0, 0), 0, 0, 0, 1000, ())


@pytest.mark.parametrize(
    ("lang", "flag"),
    [
        (language.EN, "team vision: p95 wait rose from 1 h 00 min to 2 h 00 min"),
        (language.ZH_CN, "团队 vision：p95 等待从 1 小时 00 分 升至 2 小时 00 分"),
    ],
    ids=["en", "zh-CN"],
)
def test_a_rising_p95_is_flagged(lang, flag):
    a = _p95s(vision=HOUR_US, language=HOUR_US)
    b = _p95s(vision=2 * HOUR_US, language=MINUTE_US)
    assert wait_flags(a, b, language.reader(lang)) == (flag,)
    assert wait_flags(b, b, language.reader(lang)) == ()


# ---------------------------------------------------------------------------- reading history


def _spec(job: str, at: int, runtime: int = HOUR_US) -> JobSpec:
    return JobSpec(job, "vision", "detection", "ada", "train", 2, at, runtime)


def _admitted(job: str, at: int, attempt: int = 1) -> JobAdmitted:
    return JobAdmitted(job, "vision", "train", "h100", H100, ("G0", "G1"), ("n", "n"), 0, 0,
                       True, 0, 0, attempt, at)  # fmt: skip


def test_history_reads_runtimes_retries_skips_and_prior_usage():
    t = SINCE
    events = [
        JobSubmitted(_spec("before", t - 2 * HOUR_US), t - 2 * HOUR_US),
        _admitted("before", t - HOUR_US),
        JobFinished("before", t + HOUR_US),
        JobSubmitted(_spec("preempted", t), t),
        _admitted("preempted", t),
        JobPreempted("preempted", "x", PreemptReason.HIGHER_PRIORITY, t + 10 * MINUTE_US),
        _admitted("preempted", t + HOUR_US, 1),
        JobFinished("preempted", t + 3 * HOUR_US),
        JobSubmitted(_spec("retried", t + 1), t + 1),
        _admitted("retried", t + 1),
        JobFailed("retried", FailReason.EXIT_NONZERO, 1, True, t + 1 + MINUTE_US),
        _admitted("retried", t + 2 * MINUTE_US, 2),
        JobFinished("retried", t + 32 * MINUTE_US),
        JobSubmitted(_spec("cancelled", t + 2), t + 2),
        JobFailed("cancelled", FailReason.CANCELLED, 1, False, t + 3),
        JobSubmitted(_spec("running", t + 3), t + 3),
        _admitted("running", UNTIL - HOUR_US),
        JobSubmitted(_spec("waiting", t + 4, 5 * HOUR_US), t + 4),
        JobSubmitted(_spec("later", UNTIL), UNTIL),
    ]
    h = read_history(events, SINCE, UNTIL)
    got = {j.spec.job_id: (j.runtime_us, j.failing_attempts) for j in h.jobs}
    assert got == {
        "preempted": (2 * HOUR_US, 0),  # its last run, from the start
        "retried": (30 * MINUTE_US, 1),
        "running": (UNTIL - t - 3, 0),  # still running at the window's end: past it
        "waiting": (5 * HOUR_US, 0),  # never admitted: its estimate
    }
    assert h.skipped == ("cancelled",)
    assert h.prior_gpu_ms == (("vision", 2 * HOUR_US // 1000, SINCE),)  # 2 GPUs × 1 h
    assert [a.job_id for a in h.recorded] == ["preempted", "retried", "running"]


# ---------------------------------------------------------------------------- figures


@pytest.mark.parametrize(
    ("shares", "expected"),
    [
        pytest.param([], 1000, id="nobody"),
        pytest.param([Fraction(5), Fraction(5)], 1000, id="even"),
        pytest.param([Fraction(1), Fraction(0)], 500, id="one-of-two"),
        pytest.param([Fraction(3), Fraction(1)], 800, id="three-to-one"),
    ],
)
def test_jain_fairness(shares, expected):
    assert jain_permille(shares) == expected


@pytest.mark.parametrize(
    ("gpu_ms", "text"),
    [(0, "0.000"), (3_600_000, "1.000"), (5_400_000, "1.500"), (3_599, "0.000")],
    ids=["zero", "one-hour", "ninety-minutes", "under-a-thousandth"],
)
def test_gpu_hours_are_exact_text(gpu_ms, text):
    assert gpu_hours(gpu_ms) == text


def test_a_budget_overrun_is_counted(history):
    cfg = config(budgets=[{"team": "vision", "period": "2026-11", "money": "300.00"}])
    outcome = replay(history, scenario_of("a", cfg, SINCE))
    (over,) = metrics(outcome).overruns
    assert (
        over.team == "vision"
        and over.money_micros == metrics(outcome).cost_micros["vision"] - 300_000_000 > 0
    )


def test_added_gpus_go_in_new_nodes_of_the_models_pool():
    nodes = scenario_of("a", config(), SINCE).nodes
    grown = add_gpus(nodes, {H100: 6})
    new = grown[len(nodes) :]
    assert [(n.pool, n.model, len(n.gpu_uuids)) for n in new] == [
        ("h100", H100, 4),
        ("h100", H100, 2),
    ]


# ---------------------------------------------------------------------------- the command


def _run(tmp_path: Path, ledger_dir: Path, *args: str) -> object:
    path = write_config(tmp_path / "tally.yaml", whatif_config())
    argv = ["whatif", "-c", str(path), "--data-dir", str(ledger_dir),
            "--since", "2026-11-01", "--until", "2026-11-03", *args]  # fmt: skip
    return CliRunner().invoke(cli, argv)


def test_the_command_prints_both_side_by_side_and_the_capacity_sentence(tmp_path, ledger_dir):
    result = _run(tmp_path, ledger_dir, "--add-gpus", f"{H100}=4", "-o", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["jobs"] == JOBS and doc["divergences"] == [] and doc["flags"] == []
    assert doc["capacity"].startswith(f"adding 4 GPUs of model {H100} would cut p95 wait from")
    metrics_seen = {r["metric"] for r in doc["rows"]}
    assert {"gpu_hours", "cost", "wait_p50", "wait_p95", "utilisation", "preemptions",
            "gpu_hours_lost", "jain_fairness"} <= metrics_seen  # fmt: skip
    table = _run(tmp_path, ledger_dir, "--with", str(tmp_path / "tally.yaml"))
    assert table.exit_code == 0, table.output
    assert "the baseline replay reproduces every recorded admission" in table.stdout
    assert "the alternative made the same decisions" in table.stdout


def test_the_command_speaks_chinese_and_its_json_stays_english(tmp_path, ledger_dir):
    """zh-CN, against a smaller fleet than the record's (divergences) with GPUs added: the
    table's headings, metric and scope names and waits, the checks, each divergence's places
    and cause (its wait reason in words) and the capacity sentence in Chinese; names (teams,
    queues, pools, GPU models, job ids) and numbers as they are. `-o json` keeps English and
    codes."""
    path = write_config(tmp_path / "smaller.yaml", whatif_config(nodes=1))
    argv = ["whatif", "-c", str(path), "--data-dir", str(ledger_dir), "--since", str(SINCE),
            "--until", str(UNTIL), "--add-gpus", f"{H100}=4"]  # fmt: skip
    zh = CliRunner().invoke(cli, argv, env={"TALLY_LANG": "zh-CN"})
    assert zh.exit_code in (0, 1), zh.output
    out = zh.stdout
    assert out.startswith("指标") and "基线" in out.split("\n")[0]
    assert "与基线回放不一致" in out and "GPU 繁忙" in out and "增加 4 块" in out
    left = re.sub(r"job-\d{4}", "", out)
    for name in (H100, "h100", "vision", "language", "train", "prod", "GPU", "p50", "p95", "Jain"):
        left = left.replace(name, "")
    assert re.findall(r"[A-Za-z]{2,}", left) == []
    machine = CliRunner().invoke(cli, [*argv, "-o", "json"], env={"TALLY_LANG": "zh-CN"})
    doc = json.loads(machine.stdout)
    assert doc["capacity"].startswith("adding 4 GPUs") and doc["divergences"]
    assert {r["metric"] for r in doc["rows"]} <= set(METRICS)  # the codes
    assert any("(no_capacity)" in d["cause"] for d in doc["divergences"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["--add-gpus", "A100=4"], "no GPU of model 'A100'", id="unknown-model"),
        pytest.param(["--add-gpus", "A100"], "expected MODEL=N", id="no-count"),
        pytest.param(["--until", "2026-10-01"], "--until must be after --since", id="backwards"),
        pytest.param(["--until", "soon"], "is not `now`", id="bad-time"),
        pytest.param(["--save", "../x"], "--save: '../x'", id="bad-save-name"),
    ],
)
def test_bad_usage_exits_2(tmp_path, ledger_dir, args, message):
    result = _run(tmp_path, ledger_dir, *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


# ---------------------------------------------------------------------------- idle reclaim


@pytest.mark.parametrize(
    ("idle", "max_runtime_us", "runtime_us"),
    [
        pytest.param(IdlePolicy(IdleAction.RECLAIM, 30 * MINUTE_US), None, 90 * MINUTE_US,
                     id="reclaim-after-30-min"),
        pytest.param(IdlePolicy(IdleAction.RECLAIM, 0), None, HOUR_US, id="reclaim-at-once"),
        pytest.param(IdlePolicy(IdleAction.ALERT), None, UNTIL - SINCE, id="alert-to-window-end"),
        pytest.param(IdlePolicy(IdleAction.NEVER), 5 * HOUR_US, 5 * HOUR_US,
                     id="never-to-max-runtime"),
    ],
)  # fmt: skip
def test_a_reclaimed_job_idles_as_the_scenarios_policy_says(idle, max_runtime_us, runtime_us):
    t = SINCE
    events = [
        JobSubmitted(_spec("idler", t), t),
        _admitted("idler", t),
        JobReclaimed("idler", ("G0", "G1"), t + HOUR_US, t + 2 * HOUR_US),
    ]
    h = read_history(events, SINCE, UNTIL)
    assert h.reclaimed == (("idler", HOUR_US),)
    queue = a_queue("train", idle=idle, max_runtime_us=max_runtime_us)
    scenario = scenario_of("a", config(), SINCE)
    (job,) = idle_runtimes(h, replace(scenario, queues=(queue,)))
    assert job.runtime_us == runtime_us


# ---------------------------------------------------------------------------- the dashboard page


PAGE = str(REPO / "dashboard" / "page_whatif.py")


@pytest.fixture(scope="module")
def saved(ledger_dir: Path) -> dict:
    """`tally whatif --save` on the module's ledger (4 H100s added): the saved document."""
    path = write_config(ledger_dir.parent / "saved.yaml", whatif_config())
    argv = ["whatif", "-c", str(path), "--data-dir", str(ledger_dir), "--since", str(SINCE),
            "--until", str(UNTIL), "--add-gpus", f"{H100}=4", "--save", "more-h100"]  # fmt: skip
    result = CliRunner().invoke(cli, argv)
    assert result.exit_code == 0, result.output
    return json.loads((ledger_dir / "whatif" / "more-h100.json").read_text())


def test_the_whatif_page_shows_a_saved_report(ledger_dir, saved, monkeypatch):
    monkeypatch.setenv("TALLY_DATA_DIR", str(ledger_dir))
    monkeypatch.setenv("TALLY_CURRENCY", "USD")
    app = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not app.exception, [e.value for e in app.exception]
    assert app.title[0].value == "What-if: policy replays"
    assert saved["name"] == "more-h100" and saved["added_gpus"] == {H100: 4}
    assert [s.value for s in app.success] == [saved["capacity"]]
    assert app.dataframe[0].value.values.tolist() == [list(r.values()) for r in saved["rows"]]
    assert app.metric[0].value == duration_text(saved["wait_p95_us"][1])
    assert app.metric[3].value == "0"  # divergences from the record


def test_the_whatif_page_without_reports_says_how_to_make_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TALLY_DATA_DIR", str(tmp_path))
    app = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not app.exception
    assert "--save" in app.info[0].value


def test_fair_share_before_the_window_is_the_ledgers_metered_usage(tmp_path):
    data_dir = small_ledger(tmp_path / "ledger")  # samples only: no jobs archived
    history = history_of(data_dir, config(), SINCE + DAY_US, UNTIL)
    q = ReportQueries(data_dir)
    try:
        by_team = {line.keys[0]: line.gpu_ms for line in cost_report(q, ("team",)).lines}
    finally:
        q.close()
    summed: dict[str, int] = {}
    for team, gpu_ms, at_us in history.prior_gpu_ms:
        summed[team] = summed.get(team, 0) + gpu_ms
        assert at_us <= SINCE + DAY_US
    assert summed == by_team and sum(summed.values()) > 0
    assert history_of(data_dir, config(), SINCE, UNTIL).prior_gpu_ms == ()  # none before


def test_an_unreadable_archived_job_message_is_warned_about(tmp_path):
    events = record(scenario_of("live", config(), SINCE), workload(4, HOUR_US))
    messages = [
        ConsumedMessage(JOBS_TOPIC, 0, i, encode_job_event(e, "tally://scheduler"))
        for i, e in enumerate(events)
    ]
    messages.append(ConsumedMessage(JOBS_TOPIC, 0, len(events), b'{"type": "tally.job.x"}'))
    with DuckDBStore(tmp_path / "ledger") as store:
        Ingestor(store, "c", PriceBook(()), {}).apply(messages)
        store.seal()
    result = _run(tmp_path, tmp_path / "ledger")
    assert result.exit_code == 0, result.output
    assert "WARNING: 1 archived job messages could not be read" in result.stdout
    assert "WARNING" not in _run(tmp_path, tmp_path / "ledger", "-o", "csv").stdout


# ---------------------------------------------------------------------------- the tick's cap

BURST = (("a-v1", "vision"), ("a-v2", "vision"), ("a-v3", "vision"))
BURST += (("b-l1", "language"), ("b-l2", "language"))


def _capped_config(tmp_path: Path, cap: int | None) -> TallyConfig:
    """One node of 4 H100s, nominal 2 each; `cap` admissions per tick (None: the default)."""
    data = whatif_config(nodes=1, nominal=2)
    data["scheduler"]["work_dir"] = str(tmp_path / "scheduler")
    if cap is not None:
        data["scheduler"]["admissions_per_tick"] = cap
    return TallyConfig.model_validate(data)


def _live_record(tmp_path: Path) -> list[JobEvent]:
    """What the live dispatcher (cap 2) publishes for a burst of five one-GPU `train` jobs
    submitted at one instant, ticking once a second: the first tick admits a-v1 and a-v2; the
    second, seeing vision at its nominal quota, orders language (not borrowing) before a-v3
    (borrowing), so a-v3 — which an uncapped cycle admits at once, borrowing — never runs."""
    clock = ManualClock(T0_US)
    executor = FakeExecutor(clock=clock, default=RUNS_FOREVER)
    dispatcher = build_dispatcher(_capped_config(tmp_path, 2), executor, clock)
    events: list[JobEvent] = []
    for job_id, team in BURST:
        spec = JobSpec(job_id, team, PROJECTS[team], "u", "train", 1, T0_US, HOUR_US)
        events.extend(dispatcher.apply((JobSubmitted(spec, T0_US),)))
    for _ in range(3):
        events.extend(dispatcher.decide())
        clock.advance(1_000_000)
    return events


@pytest.mark.parametrize(
    ("cap", "diverging"),
    [(2, {}), (None, {"a-v3": "tick_limit, then cohort_exhausted"})],
    ids=["same-cap-reproduces-the-record", "default-cap-diverges-naming-tick_limit"],
)
def test_the_replay_runs_the_configs_admission_cap_per_tick(tmp_path, cap, diverging):
    recorded = _live_record(tmp_path)
    limited = {e.job_id for e in recorded if getattr(e, "reason", None) is WaitReason.TICK_LIMIT}
    assert limited == {"a-v3", "b-l1", "b-l2"}  # the burst exceeded the live cap
    history = read_history(recorded, T0_US, T0_US + HOUR_US)
    outcome = replay(history, scenario_of("b", _capped_config(tmp_path, cap), T0_US))
    found = divergences(history.recorded, history.recorded_waits, outcome, 4_000_000)
    assert {d.job_id: d.cause.split("(")[1].rstrip(")") for d in found} == diverging
    if cap is not None:
        assert [a.job_id for a in outcome.admissions] == ["a-v1", "a-v2", "b-l1", "b-l2"]
        replay_limited = {j for j, r, _ in outcome.wait_reasons if r is WaitReason.TICK_LIMIT}
        assert replay_limited == limited  # the replay's ticks left out what the live ones did
