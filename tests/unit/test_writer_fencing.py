"""Writers of one published ledger are fenced (`ledger.store.head`): the newest claim holds the
ledger; a writer that lost it (paused, cut off, a second process on the same store) fails its
next publish with `WriterFenced`, and nothing it stored after losing it is ever read. Run on a
local directory store and on the S3 API server of the tests (`tests.s3_server`)."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest

from ledger.store.head import HEAD_KEY, WriterFenced, decode_head, segment_key
from ledger.store.hot import DuckDBStore
from ledger.store.objects import LocalObjectStore, ObjectStore
from ledger.store.replica import Publisher, pull, read_published
from ledger.store.segments import parse_manifest
from tests.unit.test_ledger_on_s3 import FaultyStore, totals
from tests.unit.test_store import ingest, message


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> ObjectStore:
    if request.param == "local":
        return LocalObjectStore(tmp_path / "objects")
    return request.getfixturevalue("s3_store")


def sealed(data_dir: Path, *messages) -> Path:
    """`data_dir` with `messages` ingested and sealed (no store: what a writer publishes)."""
    with DuckDBStore(data_dir) as writer:
        ingest(writer, *messages)
        writer.seal()
    return data_dir


def named(store: ObjectStore) -> set[str]:
    """Every object key the store's head names, directly or through its manifests."""
    head = decode_head(store.get(HEAD_KEY), "head")
    keys = {HEAD_KEY, *head.version_keys()}
    for root in ("segments", "archive"):
        raw = read_published(store, f"{root}/manifest.json")
        if raw is not None:
            for seg in parse_manifest(raw, root):
                files = [(seg.path, seg.sha256), *((r.path, r.sha256) for r in seg.rollups())]
                keys |= {segment_key(root, path, sha256) for path, sha256 in files}
    return keys


def head_writer(store: ObjectStore):
    return decode_head(store.get(HEAD_KEY), "head").writer


def test_the_newest_claim_holds_the_ledger_and_the_old_writer_is_fenced(tmp_path, store):
    old_dir = sealed(tmp_path / "old", message(0, 1, 2))
    old = Publisher(old_dir, store, attempts=1, grace_s=0.0)
    old.push()
    assert head_writer(store).epoch == 1
    published = totals(pull(store, tmp_path / "r1"))

    # the old writer pauses; a new one, from a copy of its disk, takes the ledger over
    new_dir = tmp_path / "new"
    shutil.copytree(old_dir, new_dir)
    new = Publisher(new_dir, store, attempts=1, grace_s=0.0)
    assert new.claim().epoch == 2
    assert totals(pull(store, tmp_path / "r2")) == published  # a claim changes no content

    # the old writer wakes and seals more: its publish fails, and nothing of it is read
    sealed(old_dir, message(1, 3, 4))
    with pytest.raises(WriterFenced, match=r"epoch 1 .* was fenced: .* held by epoch 2") as fenced:
        old.push()
    assert fenced.value.current == new.writer
    assert head_writer(store) == new.writer
    assert totals(pull(store, tmp_path / "r3")) == published
    stored_by_fenced = {o.key for o in store.list()} - named(store)
    assert stored_by_fenced  # it stored its new segment before its head put failed

    # the new writer goes on; what the fenced one stored is named by no head: deleted
    sealed(new_dir, message(1, 5))
    new.push()
    reader = pull(store, tmp_path / "r4")
    assert totals(reader) == totals(new_dir) != published
    assert (
        read_published(store, "segments/manifest.json")
        == (new_dir / "segments/manifest.json").read_bytes()
    )
    assert {o.key for o in store.list()} == named(store)  # with no grace: the strays went


def test_a_head_put_whose_answer_was_lost_is_recognised_as_the_writers_own(tmp_path, store):
    data_dir = sealed(tmp_path / "writer", message(0, 1, 2))

    class LostAnswer(FaultyStore):
        """The head's PUT lands, then the answer is lost (a timeout): an I/O error."""

        def put_if(self, key: str, data: bytes, tag: str | None) -> str:
            tag = self.inner.put_if(key, data, tag)
            if key == HEAD_KEY and self.times > 0:
                self.times -= 1
                raise OSError(errno.ETIMEDOUT, "the answer was lost", key)
            return tag

    lossy = LostAnswer(store, lambda key: False, times=0)
    publisher = Publisher(data_dir, lossy, attempts=3, sleep=lambda s: None)
    publisher.push()
    sealed(data_dir, message(1, 3))
    lossy.times = 1
    publisher.push()  # retried: the head holding its own epoch is its own, not a rival's
    assert lossy.times == 0
    assert head_writer(store) == publisher.writer
    assert totals(pull(store, tmp_path / "reader")) == totals(data_dir)


def test_a_store_published_before_heads_is_read_and_then_claimed_unchanged(tmp_path):
    data_dir = sealed(tmp_path / "writer", message(0, 1, 2), message(1, 3))
    objects = tmp_path / "objects"  # the old layout: the data directory's files as they are
    shutil.copytree(data_dir / "segments", objects / "segments")
    shutil.copytree(data_dir / "archive", objects / "archive")
    store = LocalObjectStore(objects)
    before = totals(pull(store, tmp_path / "r1"))
    assert before == totals(data_dir)

    writer = Publisher(data_dir, store)  # this build's writer takes the ledger over
    writer.claim()
    assert totals(pull(store, tmp_path / "r2")) == before
    sealed(data_dir, message(2, 4))
    writer.push()
    assert totals(pull(store, tmp_path / "r3")) == totals(data_dir) != before
    assert (
        read_published(store, "segments/manifest.json")
        == (data_dir / "segments/manifest.json").read_bytes()
    )


def test_a_head_of_a_newer_format_is_refused_by_name(tmp_path, store):
    store.put(HEAD_KEY, b'{"format": 2, "writer": {"epoch": 1, "owner": "x"}}')
    with pytest.raises(Exception, match="head format 2, this build reads 1"):
        pull(store, tmp_path / "reader")
