"""Hostile configuration files: every one is a `ConfigError` naming the file (and the field,
where there is one) or a valid configuration; never a traceback, a hang or a memory blow-up.

- Hypothesis changes one place of a valid configuration (`CONFIG_EXAMPLES` files): a value of
  the wrong type, out of range (negative intervals, 2⁷⁰, 10³⁰), NaN or infinite, a 1 MiB
  string, deep nesting, an unknown key;
- fixed texts that attack the YAML reader itself: alias bombs ("billion laughs", flat and
  through the schema), recursive aliases, nesting thousands of levels deep, a 5,000-digit
  integer, bytes that are not UTF-8, Python tags;
- `tally config check` turns each into exit 2 and the message, and the scheduler's tokens file
  is read the same way.
"""

from __future__ import annotations

import copy
import math
import resource
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tally.cli import cli
from tally.config import ConfigError, TallyConfig, load_config, parse_config
from tally.config_yaml import MAX_EXPANDED_NODES, read_yaml
from tally.scheduling import load_tokens
from tests.builders import a_config_dict

CONFIG_EXAMPLES = 150
MIB = 1 << 20
BIG = 64 * 1024  # a long value in the random files (1 MiB ones: HUGE_VALUE_FIELDS)

HOSTILE_VALUES: tuple[Any, ...] = (
    None,
    True,
    -1,
    0,
    2**70,
    -(2**70),
    10**30,
    1.5,
    -0.5,
    math.nan,
    math.inf,
    "",
    "-1",
    "1e999",
    "NaN",
    "\x00\x1b[31m",
    [],
    {},
    [[[[[[1]]]]]],
    {"a": {"b": {"c": 1}}},
)


def _leaf_paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a configuration: mapping keys and list indexes, down to the leaves."""
    out = [path] if path else []
    if isinstance(value, dict):
        for key, inner in value.items():
            out += _leaf_paths(inner, (*path, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            out += _leaf_paths(inner, (*path, index))
    return out


SECTIONS = {
    "ledger": {"seal_interval_s": 5.0, "dedupe_window_days": 7},
    "sampling": {"interval_s": 10},
    "budgets": [{"team": "vision", "period": "2026-11", "money": "100", "gpu_hours": 5}],
    "quotas": [{"team": "vision", "pool": "h100", "model": "NVIDIA H100 80GB HBM3", "nominal": 2}],
    "worker": {"batch_max_messages": 100, "batch_within_s": 0.1},
}
BASE = a_config_dict(**SECTIONS)
PATHS = _leaf_paths(BASE)


def _set(data: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target: Any = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


def _location(path: tuple[Any, ...]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@st.composite
def hostile_config(draw: st.DrawFn) -> tuple[dict[str, Any], tuple[Any, ...] | None]:
    """A valid configuration with one place made hostile; the path changed (None: a new key)."""
    data = copy.deepcopy(BASE)
    if draw(st.integers(0, 5)) == 0:
        section = draw(st.sampled_from([None, *sorted(SECTIONS), "fleet"]))
        target = data if section is None else data[section]
        if isinstance(target, list):
            target = target[0]
        target[draw(st.sampled_from(("unknown", "x" * 300, "Prices", "1")))] = 1
        return data, None
    path = draw(st.sampled_from(PATHS))
    value = draw(
        st.one_of(
            st.sampled_from(HOSTILE_VALUES),
            st.just(BIG).map(lambda size: "n" * size),
            st.integers(min_value=-(2**80), max_value=2**80),
            st.text(max_size=20),
        )
    )
    _set(data, path, value)
    return data, path


@settings(
    max_examples=CONFIG_EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=hostile_config())
def test_a_hostile_value_is_a_config_error_naming_the_field(case, tmp_path):
    data, path = case
    file = tmp_path / "tally.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    try:
        config = load_config(file)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"{file}: ")
        assert len(message) < BIG // 2  # a long value is never repeated whole
        if path is not None and len(path) > 1:  # the field, or a rule between fields
            assert str(path[0]) in message or "(top level)" in message, message
        return
    assert isinstance(config, TallyConfig)  # the change was harmless: still a valid config
    assert config.price_book() is not None


HUGE_VALUE_FIELDS = [
    ("prices", 0, "per_gpu_hour"),
    ("prices", 0, "model"),
    ("budgets", 0, "period"),
    ("budgets", 0, "gpu_hours"),
    ("organisation", "cost_centres", 0, "name"),
]


@pytest.mark.parametrize("path", HUGE_VALUE_FIELDS, ids=_location)
def test_a_1_mib_value_is_named_not_repeated(path, tmp_path):
    """Regression: an amount, a period or a name of 1 MiB came back whole in the message."""
    data = copy.deepcopy(BASE)
    _set(data, path, "9" * MIB)
    with pytest.raises(ConfigError) as caught:
        parse_config(data, "t.yaml")
    assert f"t.yaml: {_location(path)}: " in str(caught.value)
    assert len(str(caught.value)) < 4096


def _laughs(levels: int, width: int = 10) -> str:
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]")
    return "\n".join(lines) + "\n"


def _through_the_schema(n: int) -> str:
    """n cost centres × n teams × n projects, each level one alias: n³ values to validate."""
    projects = ", ".join(f"p{i}" for i in range(n))
    teams = ", ".join(f"{{name: t{i}, projects: *p}}" for i in range(n))
    centres = ", ".join(f"{{name: c{i}, teams: *t}}" for i in range(n))
    return (
        f"x-projects: &p [{projects}]\nx-teams: &t [{teams}]\n"
        f"organisation: {{cost_centres: [{centres}]}}\n"
        "fleet: {pools: [{name: a, model: A, nodes: 1}]}\n"
        "prices: [{model: A, per_gpu_hour: '1'}]\n"
    )


HOSTILE_TEXTS = [
    pytest.param(_laughs(9).encode(), "expands to more than", id="billion-laughs"),
    pytest.param(_through_the_schema(400).encode(), "expands to more than", id="alias-bomb-schema"),
    pytest.param(b"organisation: &o\n  cost_centres: [*o]\n", "contains it", id="recursive-alias"),
    pytest.param(b"&a {fleet: *a}", "contains it", id="recursive-top"),
    pytest.param(b"a: " + b"[" * 5000 + b"]" * 5000, "nested", id="deep-flow"),
    pytest.param(b"a: " + b"{b: " * 3000 + b"1" + b"}" * 3000, "nested", id="deep-mapping"),
    pytest.param(
        "".join("  " * i + f"k{i}:\n" for i in range(3000)).encode(), "nested", id="deep-block"
    ),
    pytest.param(b"fleet: {seed: " + b"9" * 5000 + b"}", "digits", id="5000-digit-int"),
    pytest.param(b"fleet: \xff\xfe\n", "cannot read", id="not-utf8"),
    pytest.param(b"!!python/object/apply:os.system [echo]", "not valid YAML", id="python-tag"),
    pytest.param(b"fleet: [1, 2\n", "not valid YAML", id="unclosed"),
    pytest.param(b"- 1\n- 2\n", "mapping of sections", id="a-list"),
    pytest.param(b"\x00", "not valid YAML", id="nul"),
]


@pytest.mark.parametrize(("text", "reason"), HOSTILE_TEXTS)
def test_hostile_yaml_is_refused_quickly_and_in_little_memory(text, reason, tmp_path):
    file = tmp_path / "tally.yaml"
    file.write_bytes(text)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    with pytest.raises(ConfigError) as caught:
        load_config(file)
    assert time.monotonic() - started < 10  # an unbounded expansion takes hours
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 512 * 1024  # KiB
    assert str(caught.value).startswith(f"{file}: ")
    assert reason in str(caught.value)


def test_config_check_exits_2_with_the_reason_never_a_traceback(tmp_path):
    for name, text in (("bomb", _laughs(9)), ("field", "fleet: {seed: [1]}\n")):
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        result = CliRunner().invoke(cli, ["config", "check", str(path)])
        assert result.exit_code == 2, result.output
        assert f"{path}: " in result.output and "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


def test_anchors_and_aliases_within_the_bounds_still_work():
    text = yaml.safe_dump(a_config_dict()) + (
        "x-quota: &q {pool: h100, model: NVIDIA H100 80GB HBM3, nominal: 2}\n"
        "quotas: [{team: vision, <<: *q}, {team: language, <<: *q}]\n"
    )
    data = read_yaml(text)
    data.pop("x-quota")
    config = parse_config(data)
    assert [q.team for q in config.quotas] == ["vision", "language"]
    assert read_yaml(_laughs(4)) is not None  # 10,000 values: far below the bound
    assert MAX_EXPANDED_NODES > 10**4


@pytest.mark.parametrize(
    ("change", "field"),
    [
        pytest.param(
            {"prices": [{"model": "m", "per_gpu_hour": "9" * 30}]},
            "prices[0].per_gpu_hour: at most",
            id="price-beyond-the-ledger",
        ),
        pytest.param(
            {"budgets": [{"team": "vision", "period": "2026-11", "gpu_hours": 10**20}]},
            "budgets[0].gpu_hours: at most",
            id="budget-beyond-the-ledger",
        ),
        pytest.param(
            {"prices": [{"model": "m", "per_gpu_hour": "1", "effective_from": 10**12}]},
            "prices[0].effective_from",
            id="price-from-year-33658",
        ),
    ],
)
def test_amounts_and_times_the_ledger_cannot_book_are_config_errors(change, field):
    """Regression: these passed the check, and every event they became was a dead letter."""
    with pytest.raises(ConfigError) as caught:
        parse_config(a_config_dict(**change), "t.yaml")
    assert f"t.yaml: {field}" in str(caught.value)


def test_a_hostile_tokens_file_is_a_config_error(tmp_path: Path):
    tokens = tmp_path / "tokens.yaml"
    tokens.write_text(_laughs(9))
    data = a_config_dict(scheduler={"tokens": {"file": str(tokens)}})
    with pytest.raises(ConfigError, match="expands to more than"):
        load_tokens(parse_config(data), environ={})
