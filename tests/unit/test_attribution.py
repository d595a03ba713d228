"""Table-driven attribution: each case asserts the exact integer postings of one sample."""

import pytest

from ledger.attribution import attribute_sample, largest_remainder, owner_shares, physical_gpu_ms
from ledger.errors import PricingError
from ledger.events import envelope_for
from ledger.postings import validate
from ledger.pricing import EnergyPrice, Price, PriceBook
from tests.builders import INTERVAL_US, a_mig, a_process, a_sample, an_owner

H100 = "NVIDIA H100 80GB HBM3"
PRICES = PriceBook((Price(H100, 3_600_000),))  # 3.60 per GPU-hour = 1 micro per GPU-ms
CENTRES = {"vision": "research", "search": "product"}
VISION = an_owner("vision", "detection", "ada", "job-1")
SEARCH = an_owner("search", "ranking", "edsger", "job-2")


def _by_account(sample, prices=PRICES):
    txn = attribute_sample(envelope_for(sample, "sim://n"), prices, CENTRES)
    assert validate(txn) == ()
    out: dict[tuple[str, str], int] = {}
    for p in txn.postings:
        out[(p.account, p.unit.value)] = out.get((p.account, p.unit.value), 0) + p.amount
    return out


CASES = [
    pytest.param(
        a_sample(processes=(a_process(owner=VISION),)),
        {
            ("consumer:vision/detection", "gpu_ms"): 10_000,
            ("consumer:vision/detection", "money_micros"): 10_000,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="whole-gpu-one-owner",
    ),
    pytest.param(
        a_sample(processes=()),
        {
            ("unallocated:h100/" + H100, "gpu_ms"): 10_000,
            ("unallocated:h100/" + H100, "money_micros"): 10_000,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="unowned-gpu-is-unallocated",
    ),
    pytest.param(
        a_sample(processes=(a_process(owner=None),)),
        {
            ("unallocated:h100/" + H100, "gpu_ms"): 10_000,
            ("unallocated:h100/" + H100, "money_micros"): 10_000,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="process-without-owner-is-unallocated",
    ),
    pytest.param(
        a_sample(processes=(a_process(sm=60, owner=VISION), a_process(pid=2, sm=30, owner=SEARCH))),
        {
            ("consumer:vision/detection", "gpu_ms"): 6_667,
            ("consumer:vision/detection", "money_micros"): 6_667,
            ("consumer:search/ranking", "gpu_ms"): 3_333,
            ("consumer:search/ranking", "money_micros"): 3_333,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="shared-gpu-split-by-sm-utilisation",
    ),
    pytest.param(
        a_sample(
            processes=(
                a_process(sm=0, memory_gib=30, owner=VISION),
                a_process(pid=2, sm=0, memory_gib=10, owner=SEARCH),
            )
        ),
        {
            ("consumer:vision/detection", "gpu_ms"): 7_500,
            ("consumer:vision/detection", "money_micros"): 7_500,
            ("consumer:search/ranking", "gpu_ms"): 2_500,
            ("consumer:search/ranking", "money_micros"): 2_500,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="shared-gpu-no-sm-split-by-memory",
    ),
    pytest.param(
        a_sample(
            processes=(
                a_process(sm=None, memory_gib=0, owner=VISION),
                a_process(pid=2, sm=None, memory_gib=0, owner=SEARCH),
                a_process(pid=3, sm=None, memory_gib=0, owner=an_owner("language")),
            )
        ),
        {
            ("consumer:vision/detection", "gpu_ms"): 3_334,
            ("consumer:vision/detection", "money_micros"): 3_334,
            ("consumer:search/ranking", "gpu_ms"): 3_333,
            ("consumer:search/ranking", "money_micros"): 3_333,
            ("consumer:language/detection", "gpu_ms"): 3_333,
            ("consumer:language/detection", "money_micros"): 3_333,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="shared-gpu-nothing-known-split-equally-largest-remainder",
    ),
    pytest.param(
        a_sample(processes=(a_process(sm=50, owner=VISION), a_process(pid=2, sm=50, owner=None))),
        {
            ("consumer:vision/detection", "gpu_ms"): 5_000,
            ("consumer:vision/detection", "money_micros"): 5_000,
            ("unallocated:h100/" + H100, "gpu_ms"): 5_000,
            ("unallocated:h100/" + H100, "money_micros"): 5_000,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="shared-with-unknown-process",
    ),
    pytest.param(
        a_sample(mig=a_mig("3g.40gb", 3), processes=(a_process(owner=VISION),)),
        {
            ("consumer:vision/detection", "gpu_ms"): 4_286,
            ("consumer:vision/detection", "money_micros"): 4_286,
            ("capacity:h100/" + H100, "gpu_ms"): -4_286,
            ("capacity:h100/" + H100, "money_micros"): -4_286,
        },
        id="mig-slice-by-profile-share",
    ),
    pytest.param(
        a_sample(owner=SEARCH, processes=(a_process(owner=VISION),)),
        {
            ("consumer:search/ranking", "gpu_ms"): 10_000,
            ("consumer:search/ranking", "money_micros"): 10_000,
            ("capacity:h100/" + H100, "gpu_ms"): -10_000,
            ("capacity:h100/" + H100, "money_micros"): -10_000,
        },
        id="sample-owner-beats-process-owner",
    ),
]


@pytest.mark.parametrize(("sample", "expected"), CASES)
def test_attribution(sample, expected):
    assert _by_account(sample) == expected


def test_dimensions_ride_on_consumer_postings():
    txn = attribute_sample(envelope_for(a_sample(), "sim://n"), PRICES, CENTRES)
    consumer = [p for p in txn.postings if p.account.startswith("consumer:")]
    assert {(p.team, p.project, p.user, p.job_id, p.cost_centre) for p in consumer} == {
        ("vision", "detection", "ada", "job-1", "research")
    }
    assert txn.cause == (txn.txn_id,)
    assert (txn.start_us, txn.end_us) == (
        a_sample().sample_time_us - INTERVAL_US,
        a_sample().sample_time_us,
    )


def test_money_is_rounded_once_per_sample():
    prices = PriceBook((Price(H100, 2_500_000),))  # 2.50/h: 10 s = 6944.44… micros
    out = _by_account(a_sample(), prices)
    assert out[("consumer:vision/detection", "money_micros")] == 6_944


def test_unpriced_model_is_an_error():
    with pytest.raises(PricingError):
        attribute_sample(envelope_for(a_sample(model="Mystery GPU"), "s"), PRICES, CENTRES)


@pytest.mark.parametrize(
    ("total", "weights", "parts"),
    [
        pytest.param(10, [1, 1, 1], [4, 3, 3], id="ties-go-first"),
        pytest.param(100, [1, 2, 3], [17, 33, 50], id="proportional"),
        pytest.param(7, [0, 0], [4, 3], id="zero-weights-equal"),
        pytest.param(0, [5, 5], [0, 0], id="nothing-to-split"),
        pytest.param(-10, [1, 2], [-3, -7], id="negative-total"),
    ],
)
def test_largest_remainder(total, weights, parts):
    assert largest_remainder(total, weights) == parts
    assert sum(largest_remainder(total, weights)) == total


def test_physical_time_of_a_mig_slice():
    assert physical_gpu_ms(a_sample(mig=a_mig("1g.10gb", 1))) == 1_429
    assert physical_gpu_ms(a_sample()) == 10_000


def test_owner_shares_put_unallocated_last():
    shares = owner_shares(
        a_sample(processes=(a_process(owner=None, sm=10), a_process(owner=VISION, sm=10)))
    )
    assert shares == [(VISION, 10), (None, 10)]


@pytest.mark.parametrize(
    ("effective_after_start_us", "expected_cost"),
    [
        pytest.param(10_000_000, 10_000, id="change-after-the-interval-ends"),
        pytest.param(0, 20_000, id="change-at-the-interval-start"),
        pytest.param(4_000_000, 4_000 + 12_000, id="change-forty-percent-in"),
        pytest.param(-5_000_000, 20_000, id="change-before-the-interval"),
    ],
)
def test_price_change_mid_interval_applies_from_its_effective_time(
    effective_after_start_us, expected_cost
):
    sample = a_sample()
    prices = PriceBook(
        (
            Price(H100, 3_600_000),  # 1 micro per GPU-ms
            Price(H100, 7_200_000, effective_us=sample.start_us + effective_after_start_us),
        )
    )
    out = _by_account(sample, prices)
    assert out[("consumer:vision/detection", "money_micros")] == expected_cost
    assert out[("capacity:h100/" + H100, "money_micros")] == -expected_cost
    assert out[("consumer:vision/detection", "gpu_ms")] == 10_000


@pytest.mark.parametrize(
    ("energy_prices", "money"),
    [
        pytest.param((), 10_000, id="energy-unpriced"),
        pytest.param((EnergyPrice(180_000),), 10_000 + 250, id="energy-at-0.18-per-kwh"),
    ],
)
def test_energy_is_posted_and_priced_when_the_sample_reports_it(energy_prices, money):
    # 5,000,000 mJ = 1/720 kWh; at 0.18 per kWh that is 250 micro-units
    prices = PriceBook(PRICES.prices, energy_prices)
    out = _by_account(a_sample(energy_delta_mj=5_000_000), prices)
    assert out[("consumer:vision/detection", "energy_mj")] == 5_000_000
    assert out[("capacity:h100/" + H100, "energy_mj")] == -5_000_000
    assert out[("consumer:vision/detection", "money_micros")] == money


def test_energy_of_a_shared_gpu_is_split_like_its_time():
    sample = a_sample(
        energy_delta_mj=1_000,
        processes=(a_process(sm=60, owner=VISION), a_process(pid=2, sm=30, owner=SEARCH)),
    )
    out = _by_account(sample)
    assert out[("consumer:vision/detection", "energy_mj")] == 667
    assert out[("consumer:search/ranking", "energy_mj")] == 333
