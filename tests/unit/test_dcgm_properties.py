"""Properties of parse_metrics: no text makes it raise, and what it returns is always valid."""

from __future__ import annotations

import os
import re
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collectors.dcgm_exposition import ProblemKind
from collectors.dcgm_fields import FAMILIES
from collectors.dcgm_parse import ParseResult, parse_metrics
from ledger.events import sample_to_dict
from ledger.sample_decode import sample_from_dict

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "dcgm"
FIXTURE_NAMES = tuple(sorted(path.name for path in FIXTURES.glob("*.txt")))
LINES = {name: (FIXTURES / name).read_text().splitlines() for name in FIXTURE_NAMES}
T_US = 1_793_491_200_000_000

# ~4 s at the default; DCGM_PROPERTY_EXAMPLES=6000 for a deeper local run (~45 s).
PROPERTY = settings(
    max_examples=int(os.environ.get("DCGM_PROPERTY_EXAMPLES", "400")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def parse(text: str) -> ParseResult:
    return parse_metrics(
        text, host_default="host", pool="pool", time_us=T_US, interval_us=10_000_000
    )


def assert_valid(result: ParseResult) -> None:
    for sample in result.samples:
        assert sample_from_dict(sample_to_dict(sample)) == sample
    subjects = [s.subject for s in result.samples]
    assert len(subjects) == len(set(subjects))
    for problem in result.problems:
        assert problem.count >= len(problem.lines) >= 1


METRIC = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)(?=[\s{]|$)")


def has_known_family(text: str) -> bool:
    for line in text.split("\n"):
        match = METRIC.match(line)
        if match is not None and match.group(1) in FAMILIES:
            return True
    return False


values = st.one_of(
    st.sampled_from(
        ["NaN", "+Inf", "-Inf", "-1", "1e999", "9" * 5000, "ERROR - FAILED TO CONVERT TO STRING"]
    ),
    st.integers(min_value=-(10**40), max_value=10**40).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=12),
)

mutations = st.lists(
    st.one_of(
        st.tuples(st.just("drop"), st.integers(min_value=0)),
        st.tuples(st.just("value"), st.integers(min_value=0), values),
        st.tuples(st.just("insert"), st.integers(min_value=0), st.text(min_size=1, max_size=8)),
        st.tuples(st.just("duplicate"), st.integers(min_value=0)),
        st.tuples(st.just("truncate"), st.integers(min_value=0), st.integers(min_value=0)),
    ),
    max_size=12,
)


def mutate(lines: list[str], ops: list[tuple[object, ...]]) -> list[str]:
    lines = list(lines)
    for op in ops:
        if not lines:
            break
        index = int(op[1]) % len(lines)  # type: ignore[call-overload]
        line = lines[index]
        if op[0] == "drop":
            del lines[index]
        elif op[0] == "value":
            lines[index] = line.rsplit(" ", 1)[0] + " " + str(op[2])
        elif op[0] == "insert":
            at = int(op[1]) % (len(line) + 1)  # type: ignore[call-overload]
            lines[index] = line[:at] + str(op[2]) + line[at:]
        elif op[0] == "duplicate":
            lines.insert(index, line)
        else:
            lines[index] = line[: int(op[2]) % (len(line) + 1)]  # type: ignore[call-overload]
    return lines


@PROPERTY
@given(st.text())
def test_arbitrary_text_never_raises(text: str) -> None:
    assert_valid(parse(text))


@PROPERTY
@given(st.lists(st.sampled_from(LINES["v3_hostname.txt"]) | st.text(max_size=40), max_size=30))
def test_shuffled_lines_and_noise_never_raise(lines: list[str]) -> None:
    assert_valid(parse("\n".join(lines)))


@PROPERTY
@given(st.sampled_from(FIXTURE_NAMES), mutations)
def test_mutated_payloads_yield_samples_or_problems(
    name: str, ops: list[tuple[object, ...]]
) -> None:
    text = "\n".join(mutate(LINES[name], ops))

    result = parse(text)

    assert_valid(result)
    assert all(sample.gpu_uuid in text for sample in result.samples)
    if has_known_family(text):  # every row of a known family is either used or reported
        assert result.samples or result.problems


@PROPERTY
@given(st.sampled_from(FIXTURE_NAMES), st.data())
def test_a_garbage_value_in_a_known_family_is_reported(name: str, data: st.DataObject) -> None:
    rows = [i for i, line in enumerate(LINES[name]) if line.split("{", 1)[0] in FAMILIES]
    index = data.draw(st.sampled_from(rows))
    garbage = data.draw(st.sampled_from(["ERROR", "N/A", "", "0x1F", "1,5", "12%"]))
    lines = list(LINES[name])
    lines[index] = lines[index].rsplit(" ", 1)[0] + " " + garbage

    result = parse("\n".join(lines))

    assert_valid(result)
    reported = [p for p in result.problems if p.kind is ProblemKind.NOT_A_NUMBER]
    assert any(lines[index].strip() in p.lines for p in reported)


LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')
hostile_label_values = st.one_of(
    st.sampled_from(["", " ", "G" * 300, "GPU-\\n\\t", '\\"', "\\\\", "ü" * 200, "N/A", "-1"]),
    st.just(64 * 1024).map(lambda size: "x" * size),
    st.text(alphabet=st.characters(blacklist_characters='"\\\n'), max_size=40),
)


@PROPERTY
@given(st.sampled_from(FIXTURE_NAMES), st.data())
def test_hostile_label_values_yield_samples_or_problems(name: str, data: st.DataObject) -> None:
    """Any label (UUID, gpu, modelName, Hostname, pod, namespace, GPU_I_ID, …) of any rows set
    to a hostile value: empty, 300 characters, 64 KiB, escapes, control characters, not a
    number where one is expected. Every sample is still one the ledger accepts, and a UUID, host
    or model name with control characters (escaped in the text) is refused, never carried."""
    lines = list(LINES[name])
    rows = [i for i, line in enumerate(lines) if LABEL.search(line)]
    label = data.draw(
        st.sampled_from(sorted({m.group(1) for i in rows for m in LABEL.finditer(lines[i])}))
    )
    value = data.draw(hostile_label_values)
    for index in data.draw(st.lists(st.sampled_from(rows), min_size=1, max_size=6)):
        lines[index] = LABEL.sub(
            lambda m: f'{label}="{value}"' if m.group(1) == label else m.group(0), lines[index]
        )
    text = "\n".join(lines)

    result = parse(text)

    assert_valid(result)
    assert all(sample.gpu_uuid in text for sample in result.samples)
    for sample in result.samples:
        assert sample.gpu_uuid.isprintable() and sample.node.isprintable()
        assert sample.model.isprintable()
