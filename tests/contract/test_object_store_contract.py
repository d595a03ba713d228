"""One contract for the object-store port (`ledger.store.objects`), run against the local
directory adapter, the S3 adapter talking to a real S3 API server on loopback
(`tests.s3_server`), and `PrefixedStore` over each (a shard's view of the store, with other
objects beside and above its prefix that it must never show)."""

from __future__ import annotations

import pytest

from ledger.store.objects import (
    LocalObjectStore,
    ObjectStore,
    PrefixedStore,
    WriteConflict,
    open_object_store,
)

# objects of the whole store outside the prefixed one's: a sibling whose name starts alike, and
# the root's head
_NEIGHBOURS = ("shards/ab/head.json", "head.json")


@pytest.fixture(params=["local", "s3", "local-prefixed", "s3-prefixed"])
def store(request, tmp_path) -> ObjectStore:
    kind, _, prefixed = request.param.partition("-")
    inner: ObjectStore = (
        LocalObjectStore(tmp_path / "objects")
        if kind == "local"
        else request.getfixturevalue("s3_store")
    )
    if not prefixed:
        return inner
    for key in _NEIGHBOURS:
        inner.put(key, b"not the shard's")
    return PrefixedStore(inner, "shards/a")


def test_a_prefixed_store_is_its_prefix_of_the_whole_store(tmp_path):
    whole = LocalObjectStore(tmp_path / "objects")
    for key in _NEIGHBOURS:
        whole.put(key, b"n")
    shard = PrefixedStore(whole, "/shards/a/")
    tag = shard.put_if("head.json", b"h", None)
    shard.put("segments/x.parquet", b"xyz")
    assert whole.get("shards/a/head.json") == b"h"
    assert whole.get_tagged("shards/a/head.json") == (b"h", tag)
    assert [(o.key, o.size) for o in shard.list()] == [("head.json", 1), ("segments/x.parquet", 3)]
    assert [o.key for o in whole.list("shards/a/")] == [
        "shards/a/head.json",
        "shards/a/segments/x.parquet",
    ]
    assert shard.describe() == f"{whole.describe()}/shards/a"
    with pytest.raises(WriteConflict, match=r"/shards/a/head\.json"):
        shard.put_if("head.json", b"stale", None)
    with pytest.raises(FileNotFoundError):
        shard.get("shards/ab/head.json")  # keys are relative to the prefix: none escapes it
    with pytest.raises(ValueError, match="invalid object key"):
        PrefixedStore(whole, "a/../b")


def test_an_object_comes_back_whole_and_a_put_replaces_it(store):
    store.put("segments/manifest.json", b"first")
    assert store.get("segments/manifest.json") == b"first"
    big = bytes(range(256)) * 4096  # 1 MiB, not text
    store.put("segments/manifest.json", big)
    assert store.get("segments/manifest.json") == big


def test_a_missing_object_is_file_not_found(store):
    with pytest.raises(FileNotFoundError):
        store.get("segments/none.parquet")
    store.delete("segments/none.parquet")  # deleting what is not there: nothing happens


def test_list_names_the_objects_under_a_prefix_by_key_with_their_sizes(store):
    for key, size in (("segments/b/2.parquet", 3), ("segments/a.json", 1), ("archive/x", 2)):
        store.put(key, b"x" * size)
    listed = store.list("segments/")
    assert [(o.key, o.size) for o in listed] == [
        ("segments/a.json", 1),
        ("segments/b/2.parquet", 3),
    ]
    assert all(o.mtime_s > 0 for o in listed)
    assert [o.key for o in store.list()] == [
        "archive/x",
        "segments/a.json",
        "segments/b/2.parquet",
    ]
    store.delete("segments/b/2.parquet")
    assert [o.key for o in store.list("segments/")] == ["segments/a.json"]


def test_folders_names_the_folders_directly_under_one_that_hold_objects(store):
    for key in ("shards/a/head.json", "shards/b/segments/x.parquet", "shards/c.json", "other/d"):
        store.put(key, b"x")
    assert store.folders("shards") == store.folders("shards/") == ["a", "b"]  # not c.json
    assert store.folders() == ["other", "shards"]  # a prefixed store's own, none beside it
    assert store.folders("none") == []
    store.delete("shards/a/head.json")
    assert store.folders("shards") == ["b"]  # no objects left under it: no folder


@pytest.mark.parametrize(
    "key",
    ["", "/abs", "a//b", "a/../b", "./a"],
    ids=["empty", "absolute", "empty-part", "parent", "dot"],
)
def test_a_key_that_could_escape_the_root_is_refused(store, key):
    with pytest.raises(ValueError, match="invalid object key"):
        store.put(key, b"x")


def test_describe_names_the_place_without_credentials(store):
    where = store.describe()
    assert where.startswith(("file://", "s3://"))
    assert "secret" not in where


@pytest.mark.parametrize(
    ("url", "described"),
    [
        pytest.param("s3://bucket/some/prefix", "s3://bucket/some/prefix", id="s3-prefix"),
        pytest.param("s3://bucket", "s3://bucket", id="s3-bucket"),
        pytest.param("file:///srv/tally/segments", "file:///srv/tally/segments", id="file"),
    ],
)
def test_a_segments_url_opens_its_store(url, described):
    assert open_object_store(url).describe() == described


@pytest.mark.parametrize(
    "url",
    ["http://bucket/x", "s3:///nobucket", "file://host/path", "/plain/path"],
    ids=["http", "no-bucket", "file-with-host", "no-scheme"],
)
def test_a_segments_url_of_another_kind_is_refused(url):
    with pytest.raises(ValueError, match="expected s3://bucket"):
        open_object_store(url)


def test_a_conditional_put_replaces_only_the_object_the_writer_last_saw(store):
    first = store.put_if("head.json", b"one", None)  # only if absent: it is
    data, tag = store.get_tagged("head.json")
    assert (data, tag) == (b"one", first)
    second = store.put_if("head.json", b"two", tag)
    assert second != first
    with pytest.raises(WriteConflict, match=r"head\.json"):
        store.put_if("head.json", b"stale", first)  # a writer holding the old tag
    with pytest.raises(WriteConflict):
        store.put_if("head.json", b"again", None)  # "only if absent" when there is one
    assert store.get_tagged("head.json") == (b"two", second)


def test_a_conditional_put_of_an_object_removed_meanwhile_conflicts(store):
    tag = store.put_if("head.json", b"one", None)
    store.delete("head.json")
    with pytest.raises(WriteConflict):
        store.put_if("head.json", b"two", tag)
    with pytest.raises(FileNotFoundError):
        store.get_tagged("head.json")


def test_of_two_writers_holding_one_tag_exactly_one_wins(store):
    tag = store.put_if("head.json", b"zero", None)
    outcomes = []
    for body in (b"a", b"b"):
        try:
            store.put_if("head.json", body, tag)
            outcomes.append(body)
        except WriteConflict:
            outcomes.append(None)
    assert outcomes == [b"a", None]
    assert store.get_tagged("head.json")[0] == b"a"
    assert [o.key for o in store.list()] == ["head.json"]  # no lock or temporary file listed
