"""The commands that read side files alone — `tally admin apply`, `tally inventory list`,
`tally inventory cordon`, `tally audit` — over a sealed ledger on object storage read the
published head(s), every union member's identity and the files they need, never a manifest or a
segment (`ledger.store.side_pull`, `tally.cli.side_state`), against the real S3 API server
(`tests.s3_server`), and say what they say over a full pull.

Two ledgers are built once: `global` (three of the seven admin events the configuration asks
for, node-01 in its inventory and cordoned, and postings segments of samples) and `decoy` (all
seven, node-02 not cordoned). They are published in the layouts of `LAYOUTS` under prefixes of
one bucket; in every layout the side files that count are `global`'s (the global shard's, else
the root ledger's, as the union of the shards has them) but in one, where they are the root
ledger's, the decoy's: a read from the wrong ledger — or the wrong shard — differs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from zoneinfo import ZoneInfo

import orjson
import pytest
from click.testing import CliRunner

from ledger.admin import AdminView, GpuCordoned
from ledger.inventory import encode_report
from ledger.store.head import version_key
from ledger.store.hot import DuckDBStore
from ledger.store.identity import IDENTITY_NAME, claim_zone
from ledger.store.objects import (
    LocalObjectStore,
    ObjectInfo,
    ObjectStore,
    PrefixedStore,
    S3ObjectStore,
)
from ledger.store.replica import Publisher, published_head, pull
from ledger.store.side_files import ADMIN_LOG_PATH, AUDIT_PATH, INVENTORY_PATH
from ledger.store.side_pull import pull_side
from tally.cli import cli
from tally.cli.admin_state import read_admin_state
from tests.builders import a_config_dict
from tests.conftest import write_config
from tests.inventory_builders import a_gpu, a_report
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server
from tests.unit.test_admin_apply import NOW, SECTIONS, plan
from tests.unit.test_admin_apply import config as admin_config
from tests.unit.test_ledger_on_s3 import FaultyStore
from tests.unit.test_rebuild import Feed, usage

ZONE = "Asia/Shanghai"
INVENTORY_REPORTS = "tally.inventory-reports"
SEALS = 2  # postings segments: the admin events' and one per seal of samples
# what `global` has not applied yet: the plan any reader of its admin log makes
PLANNED = ["quota_set", "budget_granted", "budget_granted", "budget_granted"]


class CountingStore(FaultyStore):
    """The CLI's store, recording every object it reads and every listing it makes."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner, lambda key: False, 0)
        self.read: list[str] = []
        self.listed: list[str] = []

    def get(self, key: str) -> bytes:
        self.read.append(key)
        return self.inner.get(key)

    def get_tagged(self, key: str) -> tuple[bytes, str]:
        self.read.append(key)
        return self.inner.get_tagged(key)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        self.listed.append(prefix)
        return self.inner.list(prefix)


# each ledger's inventory (one node) and whether that node is cordoned
NODES = {"global": ("node-01", True), "decoy": ("node-02", False)}


@pytest.fixture(scope="module")
def ledgers(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("ledgers")
    events = plan(admin_config(), AdminView()).events
    built = {}
    for name, applied, seals in (("global", events[:3], SEALS), ("decoy", events, 0)):
        claim_zone(base / name, ZoneInfo(ZONE))  # as the worker records it
        node, cordoned = NODES[name]
        cordons = [GpuCordoned(node, "alice", "repair", NOW)] if cordoned else []
        with DuckDBStore(base / name) as store:
            feed = Feed(store)
            report = encode_report(a_report(node, a_gpu(f"GPU-{node}")))
            feed.apply(feed.message(INVENTORY_REPORTS, report))  # a cordon needs the GPUs
            feed.apply(feed.admin(*applied, *cordons))
            store.seal()
            for minute in range(1, seals + 1):
                feed.apply(feed.samples(usage(minute), usage(minute, gpu="GPU-2")))
                store.seal()
        built[name] = base / name
    return built


# two stores, each ledger published under a prefix of it ("": its root)
STORES = {
    "a": {"": "decoy", "shards/samples-2": "global"},
    "b": {"": "decoy", "shards/global": "global", "shards/samples-2": "decoy"},
}
# layout: the store a reader reads (a prefix of the bucket), the heads it must read, the
# prefixes of the union's members (each member's identity is read, to check they keep one time
# zone; none of one ledger), the prefix of the ledger whose side files count, and which ledger
# that is
LAYOUTS = {
    "one-ledger": ("b/shards/global", ["head.json"], [], "", "global"),  # global's alone
    "sharded-beside-a-root-ledger": (
        "b",
        ["shards/global/head.json", "shards/samples-2/head.json", "head.json"],
        ["shards/global/", "", "shards/samples-2/"],
        "shards/global/",
        "global",
    ),
    "sharded-without-a-global-shard": (
        "a",
        ["shards/samples-2/head.json", "head.json"],
        ["", "shards/samples-2/"],
        "",
        "decoy",  # the root ledger's: it has applied the whole configuration
    ),
}
# command: its words up to the configuration file, its options after it, the files it reads
COMMANDS = {
    "admin-apply": (
        ["admin", "apply"],  # the file to apply
        ["--dry-run", "-o", "json", "--effective", str(NOW)],
        [ADMIN_LOG_PATH, IDENTITY_NAME],
    ),
    "inventory-list": (["inventory", "list", "-c"], [], [INVENTORY_PATH, IDENTITY_NAME]),
    "inventory-cordon": (
        ["inventory", "cordon", "node-01", "-c"],
        ["--reason", "repair", "--dry-run"],
        [INVENTORY_PATH, ADMIN_LOG_PATH],
    ),
    "audit": (["audit", "-c"], [], [AUDIT_PATH, IDENTITY_NAME]),
}


@pytest.fixture(scope="module")
def published(s3_server: S3Server, ledgers: dict[str, Path]) -> str:
    """One bucket holding the stores of `STORES`; its name."""
    bucket = "tally-admin-side-pull"
    s3_server.create_bucket(bucket)
    for name, where in STORES.items():
        store = S3ObjectStore(bucket, name, s3_server.settings())
        for prefix, ledger in where.items():
            Publisher(ledgers[ledger], PrefixedStore(store, prefix) if prefix else store).push()
    return bucket


def cli_config(
    tmp_path: Path, monkeypatch, s3_server: S3Server, bucket: str, prefix: str
) -> list[str]:
    """`-c` of a config whose sealed ledger is `s3://<bucket>/<prefix>` on the test server."""
    monkeypatch.setenv("TEST_S3_KEY", ACCESS_KEY)
    monkeypatch.setenv("TEST_S3_SECRET", SECRET_KEY)
    ledger = {
        "data_dir": str(tmp_path / "reader"),
        "segments_url": f"s3://{bucket}/{prefix}",
        "object_store": {
            "endpoint_url": s3_server.endpoint_url,
            "access_key_id_env": "TEST_S3_KEY",
            "secret_access_key_env": "TEST_S3_SECRET",
        },
    }
    return [str(write_config(tmp_path / "tally.yaml", a_config_dict(**SECTIONS, ledger=ledger)))]


def apply(config: Sequence[str], *extra: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(
        cli, ["admin", "apply", *config, "--dry-run", "-o", "json", "--effective", str(NOW), *extra]
    )
    return result.exit_code, result.stdout, result.stderr


def counting(monkeypatch) -> list[CountingStore]:
    """Every store the CLI opens from its configuration, wrapped to count what it reads."""
    from tally import segments_config

    opened: list[CountingStore] = []
    real = segments_config.segments_store

    def wrapped(url, settings):
        store = real(url, settings)
        if store is None:
            return None
        opened.append(CountingStore(store))
        return opened[-1]

    monkeypatch.setattr(segments_config, "segments_store", wrapped)
    return opened


def invoke(command: str, config: Sequence[str]) -> tuple[int, str, str]:
    words, options, _paths = COMMANDS[command]
    result = CliRunner().invoke(cli, [*words, *config, *options])
    return result.exit_code, result.stdout, result.stderr


def expected_reads(
    store: ObjectStore, heads: list[str], members: list[str], source: str, paths: list[str]
) -> list[str]:
    """What a narrow read of `paths` fetches: the heads, each member's identity (of a union),
    and the version of each file the side files' ledger (`source`) names — sorted."""

    def version(prefix: str, path: str) -> str | None:
        head = published_head(PrefixedStore(store, prefix.rstrip("/")) if prefix else store)
        assert head is not None
        sha256 = head.file_map().get(path)
        return None if sha256 is None else f"{prefix}{version_key(path, sha256)}"

    reads = [*heads, *(version(m, IDENTITY_NAME) for m in members)]
    reads += [version(source, p) for p in paths if p != IDENTITY_NAME or not members]
    return sorted(r for r in reads if r is not None)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_side_readers_read_only_the_heads_and_their_files_and_say_what_a_full_pull_says(
    tmp_path, monkeypatch, s3_server, published, layout
):
    where, heads, members, source, ledger = LAYOUTS[layout]
    store = S3ObjectStore(published, where, s3_server.settings())
    segments = [o.key for o in store.list() if o.key.endswith(".parquet")]
    assert len(segments) >= 7 * (SEALS + 1)  # what a full pull fetches: segments and rollups
    config = cli_config(tmp_path, monkeypatch, s3_server, published, where)
    opened = counting(monkeypatch)

    narrow = {}
    for command, (_words, _options, paths) in COMMANDS.items():
        narrow[command] = invoke(command, config)
        reader = opened[-1]
        wanted = expected_reads(store, heads, members, source, paths)
        assert sorted(reader.read) == wanted, command  # no manifest, no segment, each once
        assert reader.listed == [], command
    assert len(opened) == len(COMMANDS)
    assert not (tmp_path / "reader").exists()  # nothing cached

    node, cordoned = NODES[ledger]  # what the side files' ledger holds
    code, planned, stderr = narrow["admin-apply"]
    assert code == 0, stderr
    assert [row["event"] for row in orjson.loads(planned)] == (
        PLANNED if ledger == "global" else []  # the decoy has applied the whole configuration
    )
    assert narrow["inventory-list"][0] == 0 and f"GPU-{node}" in narrow["inventory-list"][1]
    if cordoned:
        assert narrow["inventory-cordon"][:2] == (0, "node-01 is already cordoned\n")
    else:
        code, _, said = narrow["inventory-cordon"]  # no node-01 in the decoy's inventory
        assert code == 2 and "no GPU or node 'node-01'" in said
    assert narrow["audit"][0] == 0 and ("gpu_cordoned" in narrow["audit"][1]) is cordoned

    state = read_admin_state(config[0], None)
    assert str(state.zone) == ZONE and state.where == store.describe()

    full = pull(store, tmp_path / "full")  # what every reader read before: the whole ledger
    for command in COMMANDS:
        assert invoke(command, [config[0], "--data-dir", str(full)]) == narrow[command], command


def _delete(store: ObjectStore, key: str) -> None:
    store.delete(key)


def _tear(store: ObjectStore, key: str) -> None:
    store.put(key, store.get(key)[:-7])  # cut short: not the bytes the head names


# (where the decoy is published, the damage, what a reader of the admin state must say)
DAMAGED = {
    "admin-log-missing": ("", _delete, "the published head names it, but the store does not"),
    "admin-log-torn": ("", _tear, "checksum does not match the head"),
    "global-shard-admin-log-missing": (
        "shards/global",
        _delete,
        "the published head names it, but the store does not",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_a_damaged_admin_log_under_a_head_is_exit_4_naming_the_object(
    tmp_path, monkeypatch, s3_server, s3_bucket, ledgers, case
):
    prefix, damage, message = DAMAGED[case]
    store = S3ObjectStore(s3_bucket, "ledger", s3_server.settings())
    ledger = PrefixedStore(store, prefix) if prefix else store
    Publisher(ledgers["decoy"], ledger).push()
    head = published_head(ledger)
    assert head is not None
    key = version_key(ADMIN_LOG_PATH, head.file_map()[ADMIN_LOG_PATH])
    damage(ledger, key)
    config = cli_config(tmp_path, monkeypatch, s3_server, s3_bucket, "ledger")
    code, stdout, stderr = apply(config)
    assert code == 4, stdout
    assert f"the sealed ledger at s3://{s3_bucket}/ledger cannot be read" in stderr
    assert f"{ledger.describe()}/{key}" in stderr and message in stderr
    assert stdout == ""  # nothing planned from a partial state


@pytest.mark.parametrize(
    ("args", "code", "said"),
    [
        pytest.param([], 4, "error: no ledger at s3://{bucket}/ledger", id="exit-4"),
        pytest.param(
            ["--initial"],
            0,
            "note: no ledger at s3://{bucket}/ledger yet: planning against an empty one",
            id="initial-plans-against-an-empty-ledger",
        ),
    ],
)
def test_a_store_without_a_published_ledger(
    tmp_path, monkeypatch, s3_server, s3_bucket, args, code, said
):
    config = cli_config(tmp_path, monkeypatch, s3_server, s3_bucket, "ledger")
    result, stdout, stderr = apply(config, *args)
    assert result == code, stderr
    assert said.format(bucket=s3_bucket) in stderr
    if code == 0:
        assert len(orjson.loads(stdout)) == len(plan(admin_config(), AdminView()).events)


@pytest.mark.parametrize(
    ("objects", "found"),
    [
        pytest.param(
            {"segments/manifest.json": b"{}", ADMIN_LOG_PATH: b"log"},
            {ADMIN_LOG_PATH: b"log"},
            id="before-heads-read-by-path",
        ),
        pytest.param({"segments/manifest.json": b"{}"}, {}, id="before-heads-no-admin-log"),
        pytest.param({ADMIN_LOG_PATH: b"log"}, None, id="before-heads-no-postings-manifest"),
        pytest.param({}, None, id="empty"),
    ],
)
def test_a_store_published_before_heads_is_read_by_path(tmp_path, objects, found):
    store = LocalObjectStore(tmp_path / "store")
    for key, data in objects.items():
        store.put(key, data)
    side = pull_side(store, [ADMIN_LOG_PATH, IDENTITY_NAME])
    assert (None if side is None else dict(side.files)) == found
