"""Price-aware placement: a job that accepts several GPU models goes to the cheapest one whose
quota, budget and free GPUs admit it; a queue's model policy drops the models it forbids; the
admission says why that model (`JobAdmitted.placement`, shown by `explain`)."""

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from ledger.job_events import (
    MAX_DETAIL,
    JobAdmitted,
    JobSpec,
    JobWaiting,
    WaitReason,
    decode_job_event,
    encode_job_event,
)
from ledger.pricing import Price, PriceBook
from scheduler.explain import explain
from scheduler.model import Balance, Flavor, Node, Policy, Queue, Quota, Team
from scheduler.model_choice import cheapest_first, format_rate, placement_note, split_by_queue
from tests.scheduler_builders import A100, H100, T0_US, a_cluster, a_queue, a_spec, nodes

A100_RATE = 1_800_000
H100_RATE = 3_200_000
PRICES = PriceBook((Price("A100", A100_RATE), Price("H100", H100_RATE)))
FLEET = nodes(A100, count=1, gpus=8) + nodes(H100, count=1, gpus=8)
EITHER = {"model": None, "models": ("A100", "H100")}


def _team(name: str, a100: int = 8, h100: int = 8, cohort: str | None = None) -> Team:
    # H100 first: quota order alone would put every job on the expensive model
    return Team(name, (Quota(H100, h100), Quota(A100, a100)), cohort=cohort)


def _job(job_id: str, gpus: int = 1, team: str = "vision", **kw: object) -> JobSpec:
    return a_spec(job_id, team, gpus=gpus, **{**EITHER, **kw})


@dataclass(frozen=True)
class Case:
    """Run `before` (each admitted), submit `job`, run one cycle: it lands on `expect` (a
    flavor) or waits with it (a reason); the placement note or wait detail holds `says`."""

    job: JobSpec
    expect: Flavor | WaitReason
    says: str = ""
    teams: Sequence[Team] = (_team("vision"), _team("audio"))
    fleet: Sequence[Node] = FLEET
    before: Sequence[JobSpec] = ()
    queues: Sequence[Queue] = (a_queue(),)
    balances: Sequence[Balance] = ()
    prices: PriceBook = PRICES
    policy: Policy = field(default_factory=Policy)


CASES = [
    pytest.param(
        Case(_job("j"), A100, "placed on A100: cheapest acceptable at 1.80/GPU-h; H100 3.20"),
        id="cheapest-acceptable-model-wins-over-quota-order",
    ),
    pytest.param(
        Case(_job("j"), H100, "placed on H100", policy=Policy(price_aware=False)),
        id="without-price-awareness-quota-order-decides",
    ),
    pytest.param(
        Case(
            _job("j", 4),
            H100,
            "A100 full, H100 chosen at 3.20/GPU-h",
            before=[a_spec("a", "audio", gpus=6, model="A100")],
        ),
        id="cheapest-model-full-next-cheapest-chosen",
    ),
    pytest.param(
        Case(
            _job("j", 4),
            H100,
            "A100 over quota, H100 chosen",
            teams=(_team("vision", a100=4),),
            before=[a_spec("v", "vision", gpus=2, model="A100")],
        ),
        id="cheapest-model-over-quota-next-chosen",
    ),
    pytest.param(
        Case(
            _job("j"),
            H100,
            "A100 no price",
            balances=[Balance("vision", money_micros=100_000_000)],
            prices=PriceBook((Price("H100", H100_RATE),)),
        ),
        id="unpriced-model-under-a-money-budget-skipped",
    ),
    pytest.param(
        Case(
            _job("j", 8),
            WaitReason.BUDGET_EXHAUSTED,
            "then main/H100: budget_exhausted",
            balances=[Balance("vision", money_micros=10_000_000)],
        ),
        id="budget-checked-per-model-both-too-dear",
    ),
    pytest.param(
        Case(
            _job("j", 2),
            A100,
            "placed on A100",
            balances=[Balance("vision", money_micros=4_000_000)],  # 2 GPU-h: A100 3.60, H100 6.40
        ),
        id="budget-affords-only-the-cheaper-model",
    ),
    pytest.param(
        Case(
            _job("j", 4, queue="urgent"),
            A100,
            "H100 over quota, A100 chosen after preemption at 1.80/GPU-h",
            before=[
                a_spec("a", "vision", gpus=8, model="A100"),
                a_spec("h", "vision", gpus=8, model="H100"),
            ],
            queues=(a_queue(), a_queue("urgent", priority=10)),
        ),
        id="preemption-makes-room-in-the-cheapest-model-first",
    ),
    pytest.param(
        Case(
            _job("j", 4, queue="dev"),
            WaitReason.NO_CAPACITY,
            "queue dev does not allow model(s) H100",
            before=[a_spec("a", "audio", gpus=6, model="A100")],
            queues=(a_queue(), a_queue("dev", forbidden_models=("H100",))),
        ),
        id="forbidden-premium-model-dropped-job-waits-for-a100",
    ),
    pytest.param(
        Case(
            _job("j", queue="dev"),
            A100,
            "queue dev does not allow model(s) H100",
            queues=(a_queue(), a_queue("dev", allowed_models=("A100",))),
        ),
        id="allowed-list-drops-the-rest-and-says-so",
    ),
    pytest.param(
        Case(
            a_spec("j", "vision", queue="dev", model="H100"),
            WaitReason.NO_MATCHING_GPUS,
            "queue dev does not allow model(s) H100",
            queues=(a_queue(), a_queue("dev", forbidden_models=("H100",))),
        ),
        id="only-forbidden-models-never-matches",
    ),
    pytest.param(
        Case(
            a_spec("j", "vision"),
            A100,
            "",  # one flavor left: no choice to explain
            queues=(a_queue(forbidden_models=("H100",)),),
        ),
        id="any-model-job-keeps-to-its-queue-policy",
    ),
    pytest.param(
        Case(
            _job("j"),
            Flavor("spot", "H100"),
            "placed on spot/H100",
            teams=(
                Team(
                    "vision",
                    (Quota(H100, 8), Quota(A100, 8), Quota(Flavor("spot", "H100"), 8)),
                ),
            ),
            fleet=FLEET + nodes(Flavor("spot", "H100"), count=1, gpus=8, prefix="spot"),
            prices=PriceBook(
                (
                    Price("A100", A100_RATE),
                    Price("H100", H100_RATE),
                    Price("H100", 900_000, 0, "spot"),
                )
            ),
        ),
        id="pool-price-beats-a-cheaper-model-elsewhere",
    ),
]


def _cluster(case: Case):  # type: ignore[no-untyped-def]
    return a_cluster(
        teams=case.teams,
        queues=case.queues,
        fleet=case.fleet,
        policy=case.policy,
        balances=case.balances,
        price_book=case.prices,
    )


@pytest.mark.parametrize("case", CASES)
def test_price_aware_placement(case: Case) -> None:
    cluster = _cluster(case)
    if case.before:
        cluster.run(*case.before)
    cluster.submit(case.job)
    cluster.cycle()
    if isinstance(case.expect, Flavor):
        running = cluster.running(case.job.job_id)
        assert running.flavor == case.expect, cluster.waiting_reasons()
        admitted = [e for e in cluster.log if isinstance(e, JobAdmitted)][-1]
        assert admitted.job_id == case.job.job_id and (admitted.pool, admitted.model) == case.expect
        assert case.says in admitted.placement
    else:
        assert cluster.reason(case.job.job_id) is case.expect
        job = cluster.state.pending_job(case.job.job_id)
        assert job is not None
        waits = [e for e in cluster.log if getattr(e, "reason", None) is case.expect]
        assert case.says in waits[-1].detail  # type: ignore[union-attr]


def test_the_price_at_the_cycle_time_decides() -> None:
    later = T0_US + 3_600_000_000
    book = PriceBook(
        (Price("A100", A100_RATE), Price("H100", H100_RATE), Price("H100", 1_000_000, later))
    )
    assert cheapest_first((H100, A100), book, T0_US) == (A100, H100)
    assert cheapest_first((A100, H100), book, later) == (H100, A100)


@pytest.mark.parametrize(
    ("flavors", "book", "order"),
    [
        pytest.param((H100, A100), PRICES, (A100, H100), id="cheaper-first"),
        pytest.param(
            (H100, A100), PriceBook((Price("*", 1),)), (A100, H100), id="equal-price-by-model-name"
        ),
        pytest.param(
            (A100, H100), PriceBook((Price("H100", 5),)), (H100, A100), id="unpriced-last"
        ),
        pytest.param((H100, A100), None, (A100, H100), id="no-price-book-by-name"),
    ],
)
def test_cheapest_first(
    flavors: tuple[Flavor, ...], book: PriceBook | None, order: tuple[Flavor, ...]
) -> None:
    assert cheapest_first(flavors, book, T0_US) == order


@pytest.mark.parametrize(
    ("micros", "text"),
    [
        pytest.param(1_800_000, "1.80/GPU-h", id="two-decimals"),
        pytest.param(2_000_000, "2.00/GPU-h", id="whole"),
        pytest.param(1_234_567, "1.234567/GPU-h", id="every-micro-shown"),
        pytest.param(None, "no price", id="unpriced"),
    ],
)
def test_format_rate(micros: int | None, text: str) -> None:
    assert format_rate(micros) == text


@pytest.mark.parametrize(
    ("queue", "kept", "dropped"),
    [
        pytest.param(a_queue(), ("A100", "H100"), (), id="no-policy-keeps-all"),
        pytest.param(a_queue(forbidden_models=("H100",)), ("A100",), ("H100",), id="forbidden"),
        pytest.param(a_queue(allowed_models=("H100",)), ("H100",), ("A100",), id="allowed"),
    ],
)
def test_split_by_queue(queue: Queue, kept: tuple[str, ...], dropped: tuple[str, ...]) -> None:
    assert split_by_queue(("A100", "H100"), queue) == (kept, dropped)


def test_no_note_for_a_job_without_a_choice() -> None:
    assert placement_note(A100, (A100,), (), PRICES, T0_US) == ""


def test_explain_says_why_the_model_was_chosen() -> None:
    cluster = _cluster(Case(_job("j"), A100))
    cluster.submit(_job("j"))
    cluster.cycle()
    text = explain("j", cluster.log)
    assert "1 GPU(s) of A100|H100" in text
    assert "now: running on main/A100 — placed on A100: cheapest acceptable at 1.80/GPU-h" in text
    assert "H100 3.20/GPU-h not needed" in text


def test_a_wait_detail_over_many_flavors_still_fits_an_event() -> None:
    pools = [Flavor(f"pool-{i:03d}", "A100") for i in range(200)]
    fleet = [n for f in pools for n in nodes(f, count=1, gpus=1, prefix=f.pool)]
    team = Team("vision", tuple(Quota(f, 1) for f in pools))
    cluster = a_cluster(teams=(team,), fleet=fleet, price_book=PRICES)
    cluster.run(*(a_spec(f"b{i}", "vision", pool=f.pool) for i, f in enumerate(pools)))
    cluster.submit(a_spec("j", "vision"))
    cluster.cycle()
    (wait,) = [e for e in cluster.log if isinstance(e, JobWaiting)]
    assert wait.reason is WaitReason.QUOTA_EXHAUSTED and len(wait.detail) == MAX_DETAIL
    assert decode_job_event(encode_job_event(wait, "test")).data == wait
