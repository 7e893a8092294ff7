"""The backtest's data cache: keys that change with what the data follows from, whole entries, a cap.

A backtest reading the cache through a real Prometheus, and a damaged entry being rebuilt, are
in tests/test_backtest.py.
"""

import os
import time

import pytest

from runwatch.backtest.data import cache_key
from runwatch.backtest.datacache import MANIFEST, MARKER, MARKER_TEXT, DataCache, key_of
from tests.conftest import need


def blocks(tmp_path, name: str, size: int):
    """A folder shaped like a TSDB's: one block directory, and a lock file that is not one."""
    folder = tmp_path / name
    (folder / "01BLOCK" / "chunks").mkdir(parents=True)
    (folder / "01BLOCK" / "meta.json").write_text("{}")
    (folder / "01BLOCK" / "chunks" / "000001").write_bytes(os.urandom(size))
    (folder / "lock").write_text("")
    return folder


def test_an_entry_comes_back_whole_and_without_what_is_not_a_block(tmp_path):
    cache = DataCache(tmp_path / "cache", max_bytes=1 << 20)
    source = blocks(tmp_path, "data", 1000)
    cache.put("k", source, {"runs": [1]})
    assert cache.get("nothing", tmp_path / "miss") is None and not (tmp_path / "miss").exists()
    assert cache.get("k", tmp_path / "out") == {"runs": [1]}
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["000001", "01BLOCK", "chunks", "meta.json"]
    assert (tmp_path / "out" / "01BLOCK" / "chunks" / "000001").read_bytes() == (
        source / "01BLOCK" / "chunks" / "000001"
    ).read_bytes()


def test_a_file_that_no_longer_matches_its_manifest_deletes_the_entry(tmp_path):
    cache = DataCache(tmp_path / "cache", max_bytes=1 << 20)
    cache.put("k", blocks(tmp_path, "data", 1000), {})
    (tmp_path / "cache" / "k" / "blocks" / "01BLOCK" / "meta.json").write_text("{} ")
    assert cache.get("k", tmp_path / "out") is None
    assert not (tmp_path / "cache" / "k").exists() and not (tmp_path / "out").exists()


def test_the_least_recently_used_entries_go_over_the_cap(tmp_path):
    cache = DataCache(tmp_path / "cache", max_bytes=250_000)
    for i, key in enumerate(("old", "used", "new")):
        cache.put(key, blocks(tmp_path, key, 100_000), {})
        os.utime(tmp_path / "cache" / key / MANIFEST, (1000 + i, 1000 + i))
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["new", "used"]  # "old" went at the third put
    cache.get("used", tmp_path / "out")  # now the most recently used
    cache.put("newest", blocks(tmp_path, "newest", 100_000), {})
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["newest", "used"]
    # an entry larger than the cap is kept while it is the newest
    DataCache(tmp_path / "cache", max_bytes=1).put("big", blocks(tmp_path, "big", 10_000), {})
    assert [p.name for p in (tmp_path / "cache").iterdir()] == ["big"]


def test_a_put_a_crash_left_behind_is_cleared_after_an_hour(tmp_path):
    cache = DataCache(tmp_path / "cache", max_bytes=1 << 20)
    for name in (".k.abandoned", ".k.running"):  # as a put leaves them: its marker written first
        (tmp_path / "cache" / name).mkdir(parents=True)
        (tmp_path / "cache" / name / MARKER).write_text(MARKER_TEXT)
    os.utime(tmp_path / "cache" / ".k.abandoned", (time.time() - 7200, time.time() - 7200))
    cache.put("k", blocks(tmp_path, "data", 10), {})
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [".k.running", "k"]


@pytest.mark.integration  # asks the Prometheus binary its version
def test_the_key_follows_what_the_data_follows_from(tmp_path):
    source = tmp_path / "run.py"
    source.write_text("lr = 0.1\n")
    key = key_of({"seeds": [1]}, [source])
    assert key == key_of({"seeds": [1]}, [source])
    assert key != key_of({"seeds": [2]}, [source])
    source.write_text("lr = 0.2\n")  # the trainer's code or config changed: a stale entry is not found
    assert key != key_of({"seeds": [1]}, [source])
    prometheus = need("prometheus")
    base = cache_key([1, 2], ("none",), "fp64", {"up"}, prometheus)
    assert base != cache_key([1, 2], ("none",), "fp16", {"up"}, prometheus)
    assert base != cache_key([1, 2], ("none", "lr_spike"), "fp64", {"up"}, prometheus)
    assert base != cache_key([1, 2], ("none",), "fp64", {"up", "runwatch_train_loss"}, prometheus)
    assert len(base) == 32


def test_a_kept_result_comes_back_only_for_its_own_spec_and_intact(tmp_path):
    cache = DataCache(tmp_path / "cache", max_bytes=1 << 20)
    spec, found = {"query": "up == 0", "start": 1.0}, [{"metric": {"run_id": "a"}, "at": 5.0}]
    cache.keep("k", spec, found)  # no entry "k" yet: nothing is kept
    assert not (tmp_path / "cache").exists()
    cache.put("k", blocks(tmp_path, "data", 10), {})
    cache.keep("k", spec, found)
    assert cache.result("k", spec) == found
    assert cache.result("k", {**spec, "query": "up == 1"}) is None and cache.result("other", spec) is None
    # an entry's results are not among its blocks: they leave the blocks' manifest whole
    assert cache.get("k", tmp_path / "out") == {} and not (tmp_path / "out" / "results").exists()
    [kept] = (tmp_path / "cache" / "k" / "results").iterdir()
    kept.write_text(kept.read_text().replace('"at": 5.0', '"at": 6.0'))  # damaged: its SHA-256 no longer matches
    assert cache.result("k", spec) is None and not kept.exists()
    kept.write_text("{not json")
    assert cache.result("k", spec) is None and not kept.exists()


# --- issue 28: a cache that is not all its own, and damaged entries ---


def test_eviction_deletes_only_the_caches_own_entries(tmp_path):
    """Item 10: a `my-notes/` folder beside the cache's entries went at the next eviction."""
    root = tmp_path / "cache"
    (root / "my-notes").mkdir(parents=True)
    (root / "my-notes" / "notes.md").write_bytes(os.urandom(300_000))  # older and bigger than any entry
    os.utime(root / "my-notes", (1000, 1000))
    (root / "a-file").write_bytes(os.urandom(1000))
    cache = DataCache(root, max_bytes=150_000)
    for key in ("old", "new"):
        cache.put(key, blocks(tmp_path, key, 100_000), {})
    assert sorted(p.name for p in root.iterdir()) == ["a-file", "my-notes", "new"]  # "old" went, nothing else
    assert len((root / "my-notes" / "notes.md").read_bytes()) == 300_000


@pytest.mark.parametrize("damage", ["a directory for a result", "a nested manifest", "a file for an entry"])
def test_a_damaged_entry_is_set_aside_and_the_cache_works_on(tmp_path, damage):
    """Item 8: a nested or directory entry in the cache failed every backtest until deleted."""
    root = tmp_path / "cache"
    cache = DataCache(root, max_bytes=1 << 20)
    spec = {"query": "up"}
    cache.put("k", blocks(tmp_path, "data", 10), {})
    if damage == "a directory for a result":
        cache.keep("k", spec, [1])
        (result,) = (root / "k" / "results").iterdir()
        result.unlink()
        (result / "x").mkdir(parents=True)
        assert cache.result("k", spec) is None and not result.exists()
        cache.keep("k", spec, [2])
        assert cache.result("k", spec) == [2]
    else:
        import shutil

        shutil.rmtree(root / "k")
        if damage == "a nested manifest":
            (root / "k").mkdir()
            (root / "k" / MANIFEST).write_text("[" * 100_000)
        else:
            (root / "k").write_text("not an entry")
        assert cache.get("k", tmp_path / "out") is None and not (root / "k").exists()
        cache.put("k", blocks(tmp_path, "again", 10), {"runs": 1})
        assert cache.get("k", tmp_path / "out") == {"runs": 1}


def test_eviction_deletes_only_folders_holding_the_caches_own_marker(tmp_path):
    """Issue 40, B13: `--cache-max-mb 1` deleted a `my-pwa/` holding a manifest.json, and a
    two-day-old `.notes.old/` (a put's temporary name, to the eye), from the cache root."""
    root = tmp_path / "cache"
    (root / "my-pwa").mkdir(parents=True)
    (root / "my-pwa" / MANIFEST).write_text('{"name": "my app"}')
    (root / "my-pwa" / "icon.png").write_bytes(os.urandom(300_000))  # older and bigger than any entry
    os.utime(root / "my-pwa" / MANIFEST, (1000, 1000))
    (root / ".notes.old").mkdir()
    (root / ".notes.old" / "todo.md").write_text("mine")
    two_days_ago = time.time() - 2 * 86400
    os.utime(root / ".notes.old", (two_days_ago, two_days_ago))
    cache = DataCache(root, max_bytes=150_000)
    for key in ("old", "new"):
        cache.put(key, blocks(tmp_path, key, 100_000), {})
    assert sorted(p.name for p in root.iterdir()) == [".notes.old", "my-pwa", "new"]  # "old" went, nothing else
    assert (root / ".notes.old" / "todo.md").read_text() == "mine"
    assert len((root / "my-pwa" / "icon.png").read_bytes()) == 300_000
