"""Every dashboard page in headless Chromium against `streamlit run` over a seeded ledger:
charts and tables render, no Streamlit exception box, the Team page explains a waiting job from
the archived job events, and the FOCUS CSV downloaded from the Finance page is byte for byte the
ledger's export and sums to the ledger's cost."""

from __future__ import annotations

import csv
import io
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from ledger.read import rollups
from ledger.read.focus import ExportFormat, FocusContext
from ledger.read.reports import ReportQueries, cost_report, ledger_money_total

pytestmark = pytest.mark.browser

RENDER_TIMEOUT_MS = 60_000
PAGES = {
    "": ("Finance: GPU cost", 5, 2),  # path: (title, tables at least, charts at least)
    "platform": ("Platform: the GPU fleet", 4, 3),
    "capacity": ("Capacity planning", 3, 2),
    "team": ("Team: jobs, budget and quota", 7, 0),
    "audit": ("Audit: who changed what", 1, 0),
    "whatif": ("What-if: policy replays", 2, 3),
}


def _open(chromium: Any, url: str) -> Any:
    page = chromium.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    page.set_default_timeout(RENDER_TIMEOUT_MS)
    page.goto(url, wait_until="networkidle")
    return page


def _settle(page: Any, title: str, tables: int, charts: int) -> None:
    page.get_by_role("heading", name=title).wait_for()
    page.wait_for_function(
        "([t, c]) => document.querySelectorAll('[data-testid=\"stDataFrame\"]').length >= t"
        ' && document.querySelectorAll(\'[data-testid="stVegaLiteChart"] canvas,'
        ' [data-testid="stVegaLiteChart"] svg\').length >= c',
        arg=[tables, charts],
    )
    # the script has finished: Streamlit's status widget no longer says "Running"
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')"
        " || !document.querySelector('[data-testid=\"stStatusWidget\"]').innerText"
        ".includes('Running')"
    )


ZH_CN = {  # path: (its navigation link, its title) in Simplified Chinese (`dashboard.i18n`)
    "": ("财务", "财务：GPU 成本"),
    "platform": ("平台", "平台：GPU 集群"),
    "capacity": ("容量规划", "容量规划"),
    "team": ("团队", "团队：作业、预算与配额"),
    "audit": ("审计", "审计：谁变更了什么"),
    "whatif": ("假设分析", "假设分析：策略回放"),
}


@pytest.mark.parametrize(
    "path", list(PAGES), ids=["finance", "platform", "capacity", "team", "audit", "whatif"]
)
def test_page_renders_without_an_exception(chromium, dashboard_url, path):
    title, tables, charts = PAGES[path]
    page = _open(chromium, f"{dashboard_url}/{path}")
    try:
        _settle(page, title, tables, charts)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert page.locator('[data-testid="stMetric"]').count() >= 1
    finally:
        page.close()


def test_every_page_renders_in_chinese(chromium, dashboard_url):
    """The zh-CN variant of the test above, in one session (one page load, then the sidebar's
    navigation): every page's title, sidebar and navigation in Chinese, no exception."""
    page = _open(chromium, f"{dashboard_url}/?lang=zh-CN")
    try:
        for path, (title, tables, charts) in PAGES.items():
            link, zh_title = ZH_CN[path]
            if path:
                page.locator('[data-testid="stSidebarNav"]').get_by_text(link, exact=True).click()
            _settle(page, zh_title, tables, charts)
            assert page.get_by_role("heading", name=title).count() == 0  # not the English one
            assert page.locator('[data-testid="stException"]').count() == 0, path
            assert page.locator('[data-testid="stMetric"]').count() >= 1, path
            sidebar = page.locator('[data-testid="stSidebar"]').inner_text()
            assert "筛选" in sidebar and "会计账期" in sidebar, path
            # nor a sentence a read model wrote in English (explanations, notes, durations)
            main = page.locator('[data-testid="stMain"]').inner_text()
            assert not ENGLISH_SENTENCES.findall(main), (path, ENGLISH_SENTENCES.findall(main))
    finally:
        page.close()


# what the read models' English sentences say (`ledger.read.texts`), never seen in zh-CN
ENGLISH_SENTENCES = re.compile(
    r"has been waiting|because|[0-9] h [0-9]+ min|Linear trend|Month-end forecast|"
    r"Erlang-C \(M/M/c\) model:|would (?:cut|raise|leave) p95|Statement for team"
)


def test_finance_figures_in_the_browser_equal_the_ledger(chromium, dashboard_url, seeded_ledger):
    page = _open(chromium, dashboard_url)
    try:
        _settle(page, *PAGES[""])
        metric = page.locator('[data-testid="stMetric"]').filter(has_text="GPU cost")
        shown = metric.locator('[data-testid="stMetricValue"]').inner_text()
    finally:
        page.close()
    queries = ReportQueries(seeded_ledger)
    report = cost_report(queries, ("team",), "2026-11")
    queries.close()
    expected = Decimal(report.consumer_micros) / 1_000_000
    assert shown == f"{expected:,.2f} USD"


def test_sidebar_filter_changes_the_page(chromium, dashboard_url, seeded_ledger):
    page = _open(chromium, dashboard_url)
    try:
        _settle(page, *PAGES[""])
        page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').first.click()
        page.get_by_role("option", name="2026-10 · closed").click()
        page.get_by_text("2026-10 is closed").wait_for()
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def test_team_page_explains_why_a_job_waits(chromium, dashboard_url):
    page = _open(chromium, f"{dashboard_url}/team")
    try:
        _settle(page, *PAGES["team"])
        page.locator('[data-testid="stSidebar"] [data-testid="stSelectbox"]').nth(1).click()
        page.get_by_role("option", name="vision").click()
        page.get_by_text("job-v-big has been waiting for 3 h 00 min").wait_for()
        page.get_by_text(
            "your team is already using all the GPUs its quota allows"
        ).first.wait_for()
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()


def test_focus_csv_download_is_the_ledger_export(chromium, dashboard_url, seeded_ledger, tmp_path):
    page = _open(chromium, dashboard_url)
    try:
        _settle(page, *PAGES[""])
        button = page.get_by_role("button", name="Download FOCUS export (CSV)")
        button.scroll_into_view_if_needed()
        with page.expect_download(timeout=RENDER_TIMEOUT_MS) as info:
            button.click()
        download = info.value
        target = Path(tmp_path) / "focus.csv"
        download.save_as(target)
        assert download.suggested_filename == "tally-focus-2026-11.csv"
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        page.close()
    got = target.read_bytes()
    queries = ReportQueries(seeded_ledger)
    try:
        expected, rows = rollups.focus_bytes(
            queries, "2026-11", ExportFormat.CSV, FocusContext(currency="USD")
        )
        total = ledger_money_total(queries, "2026-11")
    finally:
        queries.close()
    assert got == expected
    records = list(csv.DictReader(io.StringIO(got.decode())))
    assert len(records) == rows > 0
    billed = sum(Decimal(r["BilledCost"]) for r in records)
    assert billed == Decimal(total) / 1_000_000
