"""The narrow read of a sharded store (`ledger.store.side_pull`) keeps the union's rules as a
full pull (`ledger.store.union`) keeps them — every shard keeps its books in one time zone —
and a published head that names no postings yet (a global shard before its first admin event)
is a ledger with nothing sealed, for the narrow read, the full pull and the commands reading a
shard's directory of the read cache (`ledger verify`, `ledger rebuild`). Tiny ledgers, a local
object store (`file://`), in-process CLI."""

from __future__ import annotations

from pathlib import Path
from zoneinfo import ZoneInfo

import orjson
import pytest
from click.testing import CliRunner

from ledger.errors import SegmentError
from ledger.store.hot import DuckDBStore
from ledger.store.identity import IDENTITY_NAME, claim_zone, zone_of_record
from ledger.store.layout import has_ledger
from ledger.store.objects import LocalObjectStore, ObjectStore, PrefixedStore
from ledger.store.replica import Publisher, published_head, pull
from ledger.store.segments import MANIFEST_NAME
from ledger.store.side_files import INVENTORY_PATH
from ledger.store.side_pull import pull_side
from tally.cli import cli
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.unit.test_rebuild import Feed, usage

SHANGHAI, PARIS = "Asia/Shanghai", "Europe/Paris"


def publish(tmp_path: Path, store: ObjectStore, prefix: str, zone: str | None) -> None:
    """A ledger with nothing sealed (its identity only, when it has a `zone`) published at
    `prefix` of `store` ("": its root)."""
    data = tmp_path / "ledgers" / (prefix or "root")
    data.mkdir(parents=True)
    if zone is not None:
        claim_zone(data, ZoneInfo(zone))
    Publisher(data, PrefixedStore(store, prefix) if prefix else store).push()


def config(tmp_path: Path, store: Path) -> str:
    ledger = {"data_dir": str(tmp_path / "reader"), "segments_url": f"file://{store}"}
    return str(write_config(tmp_path / "tally.yaml", a_config_dict(ledger=ledger)))


# where each ledger is published, the zone its identity names (None: none, kept in UTC), and
# the error both reads raise (None: they agree)
ZONES = {
    "shards-agree": ({"shards/global": SHANGHAI, "shards/samples-2": SHANGHAI}, None),
    "a-shard-in-another-zone": (
        {"shards/global": SHANGHAI, "shards/samples-2": PARIS},
        f"shard global in {SHANGHAI}, shard samples-2 in {PARIS}",
    ),
    "a-shard-without-an-identity-keeps-utc": (
        {"shards/global": SHANGHAI, "shards/samples-2": None},
        f"shard global in {SHANGHAI}, shard samples-2 in UTC",
    ),
    "the-root-ledger-in-another-zone": (
        {"": PARIS, "shards/global": SHANGHAI},
        f"shard global in {SHANGHAI}, shard _root in {PARIS}",
    ),
}


@pytest.mark.parametrize("case", list(ZONES))
def test_the_narrow_read_checks_the_shards_keep_one_zone_as_a_full_pull(tmp_path, case):
    ledgers, differ = ZONES[case]
    store = LocalObjectStore(tmp_path / "store")
    for prefix, zone in ledgers.items():
        publish(tmp_path, store, prefix, zone)
    if differ is None:
        side = pull_side(store, [IDENTITY_NAME])
        assert side is not None
        zone = zone_of_record(side.get(IDENTITY_NAME), side.describe(IDENTITY_NAME))
        assert str(zone) == SHANGHAI
        assert has_ledger(pull(store, tmp_path / "cache"))
        return
    with pytest.raises(SegmentError) as full:
        pull(store, tmp_path / "cache")
    with pytest.raises(SegmentError) as narrow:
        pull_side(store, [INVENTORY_PATH])  # checked whatever is asked for
    assert differ in str(narrow.value) and str(narrow.value) == str(full.value)

    cfg = config(tmp_path, tmp_path / "store")
    by_pull = CliRunner().invoke(cli, ["report", "refused", "-c", cfg])  # reads the cache
    for command in (["inventory", "list"], ["audit"]):
        by_side = CliRunner().invoke(cli, [*command, "-c", cfg])
        assert (by_side.exit_code, by_side.stderr) == (4, by_pull.stderr), command
    assert differ in by_pull.stderr


@pytest.fixture(scope="module")
def no_postings_yet(tmp_path_factory) -> Path:
    """A store whose global shard has published a head naming no postings (no admin event
    applied yet: its inventory and audit trail only) beside a samples shard that has: its read
    cache."""
    tmp_path = tmp_path_factory.mktemp("no-postings-yet")
    base = tmp_path / "shards"
    claim_zone(base / "global", ZoneInfo(SHANGHAI))
    with DuckDBStore(base / "global") as writer:
        writer.seal()
    claim_zone(base / "samples-2", ZoneInfo(SHANGHAI))
    with DuckDBStore(base / "samples-2") as writer:
        feed = Feed(writer)
        feed.apply(feed.samples(usage(1), partition=2))
        writer.seal()
    store = LocalObjectStore(tmp_path / "store")
    for name in ("global", "samples-2"):
        Publisher(base / name, PrefixedStore(store, f"shards/{name}")).push()
    head = published_head(PrefixedStore(store, "shards/global"))
    assert head is not None and f"segments/{MANIFEST_NAME}" not in head.file_map()
    return pull(store, tmp_path / "cache")


@pytest.mark.parametrize(
    ("command", "shard"),
    [
        pytest.param("verify", "shards/global", id="verify-the-lone-global-shard"),
        pytest.param("rebuild", "shards/global", id="rebuild-the-lone-global-shard"),
        pytest.param("rebuild", "", id="rebuild-the-union"),
    ],
)
def test_a_global_shard_with_no_postings_yet_is_a_ledger_with_nothing_sealed(
    tmp_path, no_postings_yet, command, shard
):
    data_dir = no_postings_yet / shard if shard else no_postings_yet
    cfg = str(write_config(tmp_path / "tally.yaml", a_config_dict()))
    args = ["ledger", command, "-c", cfg, "--data-dir", str(data_dir), "-o", "json"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, (result.output, result.exception)
    report = orjson.loads(result.stdout)
    assert report.get("ok", report.get("identical")) is True


@pytest.mark.parametrize("prefix", ["", "shards/global"], ids=["one-ledger", "a-union"])
def test_a_head_naming_no_postings_is_a_ledger_to_the_narrow_and_the_full_read(tmp_path, prefix):
    store = LocalObjectStore(tmp_path / "store")
    publish(tmp_path, store, prefix, SHANGHAI)
    side = pull_side(store, [IDENTITY_NAME])
    assert side is not None and IDENTITY_NAME in side.files
    assert has_ledger(pull(store, tmp_path / "cache"))
    assert pull_side(LocalObjectStore(tmp_path / "empty"), [IDENTITY_NAME]) is None
