import pytest

from ledger.errors import PricingError, TransactionError
from ledger.postings import Posting, Transaction, TransactionKind, check, validate
from ledger.pricing import (
    EnergyPrice,
    Price,
    PriceBook,
    cost_of,
    decode_price_book,
    encode_price_book,
)
from ledger.units import Unit

H100 = "H100"
BOOK = PriceBook(
    (
        Price(H100, 3_000_000, effective_us=0),
        Price(H100, 2_000_000, effective_us=1_000),
        Price(H100, 5_000_000, effective_us=0, pool="premium"),
        Price("*", 1_000_000),
    )
)


@pytest.mark.parametrize(
    ("model", "pool", "time_us", "rate"),
    [
        pytest.param(H100, "std", 999, 3_000_000, id="before-price-change"),
        pytest.param(H100, "std", 1_000, 2_000_000, id="from-effective-time"),
        pytest.param(H100, "premium", 5_000, 5_000_000, id="pool-specific-beats-model"),
        pytest.param("A10", "std", 5_000, 1_000_000, id="wildcard-fallback"),
    ],
)
def test_rate_at(model, pool, time_us, rate):
    assert BOOK.rate_at(model, pool, time_us) == rate


def test_no_price_before_the_first_effective_time():
    book = PriceBook((Price(H100, 1, effective_us=100),))
    with pytest.raises(PricingError):
        book.rate_at(H100, "p", 99)


def test_cost_of_an_hour_is_the_rate():
    assert cost_of(3_600_000, 2_500_000) == 2_500_000


def _txn(*postings, cause=("e1",), start=0, end=10):
    return Transaction(
        "t1", TransactionKind.USAGE, start, end, "GPU-1", H100, "p", "n", tuple(postings), cause
    )


@pytest.mark.parametrize(
    ("txn", "problem"),
    [
        pytest.param(
            _txn(Posting("consumer:a/b", Unit.GPU_MS, 5), Posting("capacity:p/m", Unit.GPU_MS, -4)),
            "sum to 1",
            id="unbalanced",
        ),
        pytest.param(
            _txn(Posting("consumer:a/b", Unit.GPU_MS, 5), Posting("capacity:p/m", Unit.MONEY, -5)),
            "sum to 5",
            id="mixed-units-do-not-balance",
        ),
        pytest.param(
            _txn(
                Posting("consumer:a/b", Unit.GPU_MS, 5.0),  # type: ignore[arg-type]
                Posting("capacity:p/m", Unit.GPU_MS, -5),
            ),
            "must be an int",
            id="float-amount",
        ),
        pytest.param(
            _txn(
                Posting("consumer:a/b", "hours", 5),  # type: ignore[arg-type]
                Posting("capacity:p/m", "hours", -5),
            ),  # type: ignore[arg-type]
            "unknown unit",
            id="unknown-unit",
        ),
        pytest.param(
            _txn(Posting("wallet:x", Unit.GPU_MS, 5), Posting("capacity:p/m", Unit.GPU_MS, -5)),
            "unknown account",
            id="unknown-account",
        ),
        pytest.param(
            _txn(
                Posting("consumer:a/b", Unit.GPU_MS, 5),
                Posting("capacity:p/m", Unit.GPU_MS, -5),
                cause=(),
            ),
            "name the events",
            id="no-cause",
        ),
        pytest.param(_txn(start=10, end=10), "needs postings", id="empty"),
        pytest.param(
            _txn(
                Posting("consumer:a/b", Unit.GPU_MS, True),  # type: ignore[arg-type]
                Posting("capacity:p/m", Unit.GPU_MS, -1),
            ),
            "must be an int",
            id="bool-amount",
        ),
    ],
)
def test_validate_rejects(txn, problem):
    problems = validate(txn)
    assert any(problem in p for p in problems), problems
    with pytest.raises(TransactionError):
        check(txn)


def test_balanced_transaction_passes():
    txn = _txn(
        Posting("consumer:a/b", Unit.GPU_MS, 5),
        Posting("capacity:p/m", Unit.GPU_MS, -5),
        Posting("consumer:a/b", Unit.MONEY, 7),
        Posting("capacity:p/m", Unit.MONEY, -7),
    )
    assert validate(txn) == ()
    assert check(txn) is txn


@pytest.mark.parametrize(
    ("start", "end", "pieces"),
    [
        pytest.param(0, 999, [(0, 999, 3_000_000)], id="before-the-change"),
        pytest.param(
            500,
            1_500,
            [(500, 1_000, 3_000_000), (1_000, 1_500, 2_000_000)],
            id="straddles-the-change",
        ),
        pytest.param(1_000, 2_000, [(1_000, 2_000, 2_000_000)], id="from-the-change"),
    ],
)
def test_rates_between(start, end, pieces):
    assert BOOK.rates_between(H100, "std", start, end) == pieces


def test_rates_between_asked_after_the_last_change_first():
    """The steady rate a book remembers after its last change does not leak backwards."""
    book = PriceBook(BOOK.prices)
    asked = [(1_000, 2_000), (500, 1_500), (0, 999), (5_000, 6_000)]
    assert [book.rates_between(H100, "std", a, b) for a, b in asked] == [
        [(1_000, 2_000, 2_000_000)],
        [(500, 1_000, 3_000_000), (1_000, 1_500, 2_000_000)],
        [(0, 999, 3_000_000)],
        [(5_000, 6_000, 2_000_000)],
    ]


def test_a_price_book_survives_its_json_encoding():
    book = PriceBook(
        (Price("*", 1_000_000), Price("H100", 3_200_000, 5, "h100")),
        (EnergyPrice(150_000), EnergyPrice(90_000, 7, "a100")),
    )
    assert decode_price_book(encode_price_book(book)) == book


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param('{"prices": []}', id="no-energy-key"),
        pytest.param('{"prices": [["H100", 1.5, 0, null]], "energy": []}', id="float-rate"),
        pytest.param('{"prices": [["H100", 1]], "energy": []}', id="short-entry"),
    ],
)
def test_anything_else_is_not_a_price_book(text):
    with pytest.raises(ValueError):
        decode_price_book(text)
