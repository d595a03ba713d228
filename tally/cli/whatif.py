"""`tally whatif`: replay a window of the ledger's archived jobs topic under the recorded
configuration and under another (`--config-b`, and/or `--add-gpus MODEL=N`), and print the two
side by side (`scheduler.whatif`; the files are read by `tally.whatif`).

The table and the checks under it are for people, in the CLI's language: the report said again
in words (`WhatIfReport.said` through `tally.language.reader`: metric and scope names, waits,
causes with the wait reason in words) and the CLI's own sentences (`_`). `-o json` and `-o csv`
are the report's own text, English with codes, in every language."""

from __future__ import annotations

import re
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import click
import orjson

from ledger.errors import LedgerError
from scheduler.errors import ConfigError as SchedulerConfigError
from scheduler.whatif import COLUMNS, Said, WhatIfReport, what_if
from tally.cli.admin import parse_effective
from tally.cli.help import Command
from tally.cli.options import (
    Exit,
    config_option,
    data_dir_option,
    fail,
    load_or_exit,
    output_option,
    resolve_ledger_dir,
)
from tally.config import ConfigError
from tally.language import _, reader
from tally.output import OutputFormat, render

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAME = re.compile(r"[A-Za-z0-9._-]{1,100}")
SAVED_DIR = "whatif"  # under the data directory: the dashboard's What-if page reads it


def _save(
    data_dir: Path,
    name: str,
    config_path: str,
    config_b: str | None,
    added: dict[str, int],
    doc: dict[str, Any],
) -> None:
    """Write the report atomically as `SAVED_DIR/name.json` with what it compared."""
    folder = data_dir / SAVED_DIR
    described = {
        "name": name,
        "baseline_config": config_path,
        "alternative_config": config_b or config_path,
        "added_gpus": added,
        **doc,
    }
    try:
        folder.mkdir(exist_ok=True)
        part = folder / f".{name}.json.part"
        part.write_bytes(orjson.dumps(described, option=orjson.OPT_INDENT_2))
        part.replace(folder / f"{name}.json")
    except OSError as exc:
        fail(
            _("--save: cannot write {path}.json: {exc}").format(path=folder / name, exc=exc),
            Exit.LEDGER,
        )


def _time(name: str, text: str) -> int:
    """`now`, µs since the epoch, or an ISO-8601 time (UTC if no zone)."""
    if text == "now" or text.isdigit():
        return parse_effective(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        fail(
            _("{name}: {text!r} is not `now`, microseconds or an ISO-8601 time").format(
                name=name, text=text
            ),
            Exit.USAGE,
        )
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(microseconds=1)


def _added(values: tuple[str, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for value in values:
        model, sep, count = value.rpartition("=")
        if not sep or not model or not count.isdigit() or int(count) < 1:
            fail(
                _("--add-gpus: expected MODEL=N with N ≥ 1, not {value!r}").format(value=value),
                Exit.USAGE,
            )
        out[model] = out.get(model, 0) + int(count)
    return out


def _teams(report: WhatIfReport) -> list[dict[str, Any]]:
    """Per team, the numbers behind the rows (integers: GPU-ms, micro-units, µs)."""
    a, b = report.baseline, report.alternative
    out = []
    for team in sorted(set(a.gpu_ms) | set(b.gpu_ms)):
        row: dict[str, Any] = {"team": team}
        for side, m in (("baseline", a), ("alternative", b)):
            delay = m.delay_by_team.get(team)
            row[f"{side}_gpu_ms"] = m.gpu_ms.get(team, 0)
            row[f"{side}_cost_micros"] = m.cost_micros.get(team, 0)
            row[f"{side}_wait_p50_us"] = None if delay is None else delay.p50_us
            row[f"{side}_wait_p95_us"] = None if delay is None else delay.p95_us
        out.append(row)
    return out


def _json(report: WhatIfReport) -> dict[str, Any]:
    return {
        "since_us": report.since_us,
        "until_us": report.until_us,
        "jobs": report.jobs,
        "skipped": list(report.skipped),
        "undecodable": report.undecodable,
        "rows": [dict(zip(COLUMNS, row, strict=True)) for row in report.rows],
        "teams": _teams(report),
        "wait_p95_us": [report.baseline.delay_all.p95_us, report.alternative.delay_all.p95_us],
        "utilisation_bp": [report.baseline.utilisation_bp, report.alternative.utilisation_bp],
        "divergences": [
            {"job_id": d.job_id, "recorded": d.recorded, "replayed": d.replayed, "cause": d.cause}
            for d in report.divergences
        ],
        "decisions_unchanged": report.decisions_unchanged,
        "flags": list(report.flags),
        "capacity": report.capacity,
        "simulated_days_per_second": round(report.simulated_days_per_second, 1),
    }


def _checks(report: WhatIfReport, said: Said) -> list[str]:
    """The lines under the table: what was replayed, the divergences from the record, whether
    the alternative decided alike, the flags and the capacity sentence (`said`'s words)."""
    lines = [
        _("{jobs} jobs replayed ({skipped} never ran: left out)").format(
            jobs=report.jobs, skipped=len(report.skipped)
        )
    ]
    if report.undecodable:
        lines.append(
            _(
                "WARNING: {count} archived job messages could not be read: the replay does not "
                "know them, and may diverge for it"
            ).format(count=report.undecodable)
        )
    if said.divergences:
        lines.append(
            _("{count} recorded admissions diverge from the baseline:").format(
                count=len(said.divergences)
            )
        )
        lines += [
            "  "
            + _("{job}: recorded {recorded}, replayed {replayed}: {cause}").format(
                job=job, recorded=recorded, replayed=replayed, cause=cause
            )
            for job, recorded, replayed, cause in said.divergences
        ]
    else:
        lines.append(_("the baseline replay reproduces every recorded admission"))
    if report.decisions_unchanged:
        lines.append(_("the alternative made the same decisions"))
    else:
        lines.append(_("the alternative made different decisions"))
    lines += [_("FLAG: {flag}").format(flag=flag) for flag in said.flags]
    if said.capacity:
        lines.append(said.capacity)
    return lines


@click.command(cls=Command)
@config_option
@data_dir_option
@click.option("--since", required=True, help="Jobs submitted from this time (ISO-8601 or µs).")
@click.option("--until", required=True, help="… up to this time, exclusive (ISO-8601 or µs).")
@click.option(
    "--config-b",
    "--with",
    "config_b",
    default=None,
    type=click.Path(dir_okay=False),
    help="The alternative configuration (default: the recorded one).",
)
@click.option(
    "--add-gpus",
    multiple=True,
    metavar="MODEL=N",
    help="Give the alternative N more GPUs of MODEL (repeatable).",
)
@click.option(
    "--save",
    default=None,
    metavar="NAME",
    help="Also keep the JSON report as whatif/NAME.json in the ledger's data directory, for "
    "the dashboard's What-if page.",
)
@output_option
def whatif(
    config_path: str,
    data_dir: str | None,
    since: str,
    until: str,
    config_b: str | None,
    add_gpus: tuple[str, ...],
    save: str | None,
    output: str,
) -> None:
    """Replay the jobs submitted in [--since, --until) from the ledger's archived jobs topic
    through the real scheduling cycle, under the recorded configuration and an alternative;
    print cost, GPU-hours, waits, utilisation, preemptions, fairness and budget overruns side
    by side, with every recorded admission the baseline does not reproduce. Exit 1 when
    adding GPUs raised some team's p95 wait."""
    from tally.whatif import history_of, scenario_of, tolerance_us

    since_us, until_us = _time("--since", since), _time("--until", until)
    if until_us <= since_us:
        fail(_("--until must be after --since"), Exit.USAGE)
    added = _added(add_gpus)
    if save is not None and not _NAME.fullmatch(save):
        fail(
            _("--save: {save!r}: letters, digits, '.', '_' and '-' only").format(save=save),
            Exit.USAGE,
        )
    config = load_or_exit(config_path)
    other = load_or_exit(config_b) if config_b else config
    directory = resolve_ledger_dir(config_path, data_dir)
    try:
        baseline = scenario_of("baseline", config, since_us)
        alternative = scenario_of("alternative", other, since_us, added)
    except (ConfigError, SchedulerConfigError) as exc:
        fail(str(exc), Exit.USAGE)
    try:
        history = history_of(directory, config, since_us, until_us)
    except LedgerError as exc:
        fail(_("cannot read the jobs archive: {exc}").format(exc=exc), Exit.LEDGER)
    bar: Any = None

    def progress(done: int, total: int) -> None:
        nonlocal bar
        if bar is None and sys.stderr.isatty() and total > 20:
            bar = click.progressbar(length=total, label=_("replaying"), file=sys.stderr)
            bar.__enter__()
        if bar is not None:
            bar.update(done - bar.pos)

    report, _replayed, _baseline = what_if(
        history,
        baseline,
        alternative,
        tolerance_us=tolerance_us(config),
        added_gpus=added,
        progress=progress,
    )
    if bar is not None:
        bar.__exit__(None, None, None)
    doc = _json(report)
    if save is not None:
        _save(directory, save, config_path, config_b, added, doc)
    fmt = OutputFormat(output)
    if fmt is OutputFormat.JSON:
        click.echo(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    elif fmt is OutputFormat.CSV:
        click.echo(render(COLUMNS, report.rows, fmt))
    else:
        said = report.said(reader())
        click.echo(render(COLUMNS, said.rows, fmt))
        click.echo()
        click.echo("\n".join(_checks(report, said)))
    if report.flags:
        sys.exit(int(Exit.CHECK_FAILED))
