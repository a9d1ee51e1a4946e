"""A damaged LMDB file gives a clear StoreError naming the file and the rebuild, never a raw lmdb traceback
(review D9): from every verb of LMDBStore, and from `vidcache stats` / `vidcache verify` run as users run them."""
import os
import struct

import lmdb
import pytest

from vidcache import VideoCache, VideoOptions
from vidcache.errors import StoreError
from vidcache.store.lmdb import LMDBStore
from vidcache.testing.videos import make_video

from support.cli import run_cli
from support.damage import flip_file

PAGE = 4096
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04


def structural_pages(raw: bytes) -> list[int]:
    """Branch and leaf pages of a data.mdb (the B-tree's structure; not the two meta pages, not the
    overflow pages holding frames).  A page header is pgno (8 bytes), pad (2), flags (2), lower (2), upper (2)."""
    out = []
    for k in range(2, len(raw) // PAGE):
        pgno, _, flags = struct.unpack_from("<QHH", raw, k * PAGE)
        if pgno == k and flags & (P_BRANCH | P_LEAF) and not flags & P_OVERFLOW:
            out.append(k)
    return out


# Header bytes whose flips LMDB itself notices: the flags' low byte, and the high bytes of lower and upper
# (the free-space bounds).  Flips of node offsets can instead make LMDB read past the end of the file,
# which kills the process with SIGBUS inside LMDB's C code: nothing Python can catch (see the report).
FLIP_OFFSETS = (10, 13, 15)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A node directory holding three small entries, closed (as after a prewarm)."""
    d = tmp_path_factory.mktemp("damage")
    c = VideoCache(d / "node")
    for i in range(3):
        v = make_video(str(d / f"v{i}.mkv"), codec="ffv1", width=64, height=48, fps=10, n_frames=20, seed=i)
        c.ensure(v, VideoOptions())
    c.close()
    return d / "node"


def test_structural_page_flips_give_a_clean_error_never_a_traceback(node):
    data = node / "lmdb" / "data.mdb"
    pristine = data.read_bytes()
    pages = structural_pages(pristine)
    assert len(pages) >= 4, pages              # several leaves and a branch: the tree has structure to damage
    problems, damaged = [], 0
    try:
        for k in pages:
            for off in FLIP_OFFSETS:
                data.write_bytes(pristine)
                flip_file(data, k * PAGE + off)
                for cmd in ("stats", "verify"):
                    r = run_cli([cmd], node, timeout=120)
                    where = f"page {k} +{off}, {cmd}: rc {r.returncode}"
                    if r.returncode not in (0, 1) or "Traceback" in r.stderr:
                        problems.append(f"{where}: {r.stderr.strip()[-300:]}")
                    elif r.returncode == 1 and not r.stderr.startswith("vidcache: error: ["):
                        # verify's own verdict (BAD lines and a summary on stdout) is the other clean exit 1
                        if not (cmd == "verify" and "verify:" in r.stdout and not r.stderr):
                            problems.append(f"{where}: {r.stderr.strip()[-300:]!r}")
                    if r.stderr.startswith("vidcache: error: [store]") and "damaged" in r.stderr:
                        damaged += 1
                        assert str(node / "lmdb") in r.stderr and "vidcache prewarm" in r.stderr, r.stderr
    finally:
        data.write_bytes(pristine)
    assert not problems, "\n".join(problems)
    assert damaged >= 1              # the flips did reach LMDB's checks, and each was reported with the fix


def test_a_flip_that_kills_lmdb_with_sigbus_is_one_store_line(node):
    """The flips the test above avoids: a node offset's high byte sends LMDB's C code past the end of its map,
    and the process dies of SIGBUS.  Run as users run them, the walking commands report it as the damaged
    file it is (they walk in a forked child), with the rebuild; never "Bus error", never a negative exit."""
    data = node / "lmdb" / "data.mdb"
    pristine = data.read_bytes()
    leaves = [k for k in structural_pages(pristine)
              if struct.unpack_from("<H", pristine, k * PAGE + 10)[0] & P_LEAF]
    lower = {k: struct.unpack_from("<H", pristine, k * PAGE + 12)[0] for k in leaves}
    seen, crashed = [], None
    try:
        for k in reversed(leaves):                        # the newest leaves hold the entries' keys
            for off in range(17, min(lower[k], 41), 2):   # the high byte of each node offset
                data.write_bytes(pristine)
                flip_file(data, k * PAGE + off)
                r = run_cli(["verify"], node, timeout=120)
                seen.append((k, off, r.returncode))
                assert r.returncode in (0, 1) and "Traceback" not in r.stderr, (k, off, r.stderr[-300:])
                if "crashed with SIGBUS" in r.stderr:
                    crashed = (k, off)
                    break
            if crashed:
                break
        assert crashed, f"no flip made LMDB fault; tried {seen}"
        for cmd in ("verify", "stats", "ls"):
            r = run_cli([cmd], node, timeout=120)
            assert r.returncode == 1, (cmd, r.returncode, r.stderr)
            assert r.stderr.startswith("vidcache: error: [store] the LMDB file at"), (cmd, r.stderr)
            assert str(node / "lmdb") in r.stderr and "vidcache prewarm" in r.stderr and "SIGBUS" in r.stderr
    finally:
        data.write_bytes(pristine)
    assert run_cli(["verify"], node, timeout=120).returncode == 0  # the pristine file: the child path is clean too


def _damage_every_structural_page(path) -> None:
    data = os.path.join(path, "data.mdb")
    with open(data, "rb") as f:
        pages = structural_pages(f.read())
    for k in pages:
        flip_file(data, k * PAGE + 10)      # the page's flags: every walk through it finds the wrong page type


@pytest.mark.parametrize("verb", ["get", "read", "exists_many", "size", "keys", "set_many", "delete", "gc"])
def test_every_verb_turns_a_damaged_page_into_a_store_error(tmp_path, verb):
    s = LMDBStore(tmp_path / "db")
    s.set_many({f"ac/{i:04d}": os.urandom(900) for i in range(40)})   # several leaves under a branch
    s.set_many({"cas/big": os.urandom(64 << 10)})
    assert s.get("ac/0001") is not None       # the environment is open: the damage meets the verbs, not open()
    _damage_every_structural_page(s.path)     # written under the open map: LMDB sees it at once
    calls = {"get": lambda: s.get("ac/0001"), "read": lambda: s.read("ac/0001").__enter__(),
             "exists_many": lambda: s.exists_many(["ac/0001"]), "size": lambda: s.size("ac/0001"),
             "keys": lambda: list(s.keys("ac/")), "set_many": lambda: s.set_many({"ac/new": b"x"}),
             "delete": lambda: s.delete("ac/0002"), "gc": lambda: s.gc(1)}
    with pytest.raises(StoreError, match="damaged.*Rebuild: move .* aside and re-run `vidcache prewarm`") as e:
        calls[verb]()
    assert s.path in str(e.value) and isinstance(e.value.__cause__, lmdb.Error)
