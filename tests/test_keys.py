"""``vidcache.keys``: key formats and namespaces.  Every key from outside is checked before any store call; a key
is (content digest, options digest) and nothing else; store keys round-trip to what they name."""
import pytest

from vidcache import VideoOptions, cache_key, keys
from vidcache.digest import Digest
from vidcache.errors import InvalidKeyError
from vidcache.store.fsspec import FsspecStore

GOOD = "0123456789abcdef0123456789abcdef.1234.fedcba9876543210fedcba9876543210"
BAD_KEYS = ["../../etc/passwd", "0" * 32 + ".1.nope", "", None, 42, b"0" * 32, GOOD.upper(), GOOD + "\n",
            GOOD + "/x", " " + GOOD, GOOD.replace(".1234.", ".-1."), GOOD.replace(".1234.", "." + "9" * 21 + "."),
            "0" * 31 + ".1." + "0" * 32]


def test_keys_from_outside_are_checked_before_any_store_call(cache):
    for bad in ("../../etc/passwd", "0" * 32 + ".1.nope", "", None):
        with pytest.raises(InvalidKeyError):
            cache.manifest(bad)
        with pytest.raises(InvalidKeyError):
            cache.verify(bad)


def test_key_ignores_everything_that_changes_no_bytes(tmp_path):
    # The key is a function of (content digest, options) only: no path, URL, worker count or cache dir.
    import inspect
    assert list(inspect.signature(cache_key).parameters) == ["source_digest", "options"]
    a = cache_key(Digest.of(b"x" * 10), VideoOptions())
    b = cache_key(Digest.of(b"x" * 10), VideoOptions())
    assert a == b
    assert cache_key(Digest.of(b"x" * 11), VideoOptions()) != a


def test_cache_key_round_trips_to_its_source_digest():
    src = Digest.of(b"video bytes" * 1000)
    o = VideoOptions(family="qwen3_vl", fps=1.0)
    k = cache_key(src, o)
    assert keys.check_key(k) == k == f"{src.hash}.{src.size_bytes}.{o.digest}"
    assert keys.source_digest_of(k) == src
    assert keys.entry_key(keys.ac(k)) == k and keys.ac(k) == "ac/" + k


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_malformed_keys_are_refused_everywhere(bad):
    with pytest.raises(InvalidKeyError, match="not a vidcache key"):
        keys.check_key(bad)
    for make in (keys.ac, keys.source_digest_of, lambda k: keys.frozen(k, ".nut"),
                 lambda k: keys.frozen_digest(k, ".nut")):
        with pytest.raises(InvalidKeyError):
            make(bad)


def test_an_error_never_echoes_a_long_key():
    with pytest.raises(InvalidKeyError) as e:
        keys.check_key("x" * 10_000)
    assert len(str(e.value)) < 200


def test_blob_digests_round_trip_and_others_are_refused():
    d = Digest.of(b"frames")
    assert keys.check_blob(str(d)) == str(d) and Digest.parse(keys.check_blob(str(d))) == d
    assert keys.cas(str(d)) == "cas/" + str(d)
    for bad in (d.hash, GOOD, "md5:" + d.hash + ":6", str(d) + ":1", str(d).replace(":6", ":x"), None, ""):
        with pytest.raises(InvalidKeyError, match="not a blob digest"):
            keys.cas(bad)


def test_entry_key_takes_manifest_keys_only():
    for bad in ("cas/" + GOOD, GOOD, "ac/", "ac/../" + GOOD, "frozen/" + GOOD + ".nut"):
        with pytest.raises(InvalidKeyError):
            keys.entry_key(bad)


def test_frozen_keys_name_the_entry_and_the_format():
    assert keys.frozen(GOOD, ".nut") == "frozen/" + GOOD + ".nut"
    assert keys.frozen_digest(GOOD, ".mkv") == "frozen-digest/" + GOOD + ".mkv"
    assert keys.frozen(GOOD, ".nut") != keys.frozen(GOOD, ".mkv")
    assert keys.frozen_digest(GOOD, ".nut").startswith(keys.FROZEN_DIGEST)
    assert not keys.frozen_digest(GOOD, ".nut").startswith(keys.FROZEN)     # listing frozen/ never sees records


def test_quarantined_names_are_flat_distinct_and_reversible(tmp_path):
    blob = str(Digest.of(b"x"))
    store_keys = [keys.ac(GOOD), keys.cas(blob), keys.frozen(GOOD, ".nut"), keys.frozen_digest(GOOD, ".nut"),
                  keys.src("s3://bucket/a/b.mp4")]
    names = [keys.quarantined(k) for k in store_keys]
    assert len(set(names)) == len(names)
    for k, q in zip(store_keys, names):
        assert q.startswith(keys.QUARANTINE) and q.count("/") == 1          # one level under the namespace
        assert q[len(keys.QUARANTINE):].replace("~", "/", 1) == k           # and it says what was moved aside
    store = FsspecStore(str(tmp_path / "tier"))    # a store that refuses nested names takes every one
    store.set_many({q: b"bad" for q in names})
    assert sorted(store.keys(keys.QUARANTINE)) == sorted(names)


def test_source_records_are_one_flat_name_per_source():
    a, b = keys.src("s3://bucket/a.mp4"), keys.src("/data/a.mp4")
    assert a != b and a == keys.src("s3://bucket/a.mp4")
    assert a.startswith(keys.SRC) and a.count("/") == 1 and len(a) == len(keys.SRC) + 32
    assert keys.src("/data/\udcff-not-utf8.mp4").startswith(keys.SRC)     # surrogate-escaped names hash too



def test_a_key_prefix_is_the_start_of_a_key():
    """``is_key_prefix`` (what the CLI completes over a cache's entries, ``vidcache ls`` printing 16 hex digits)
    accepts a key and every start of one from 4 characters on, and nothing else that a key could not start with."""
    assert all(keys.is_key_prefix(GOOD[:n]) for n in range(4, len(GOOD) + 1))
    for bad in [GOOD[:n] for n in range(4)] + ["../../etc/passwd", "0" * 32 + ".1.nope", GOOD.upper()[8:20],
                                                 GOOD + "\n", GOOD + "0", " " + GOOD[:8], "0" * 33, None, 42]:
        assert not keys.is_key_prefix(bad), bad
