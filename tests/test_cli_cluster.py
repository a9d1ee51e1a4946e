"""The CLI cluster path, as users run it: subprocesses, fresh node directories, and nothing in the
environment but VIDCACHE_DIR + VIDCACHE_SHARED (issue 13 item 2; issue 18 D18, D19)."""
import json
import os
import subprocess
import sys
import time

import pytest

from vidcache import VideoCache, VideoOptions
from vidcache import keys as K

from support.cli import run_cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ok(r):
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    return r


def failed(r, kind):
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert f"vidcache: error: [{kind}]" in r.stderr and "Traceback" not in r.stderr, r.stderr[-3000:]
    return r


def tier_id_of(tier):
    """The identity record of a directory tier (read as bytes: no vidcache code involved)."""
    records = list(tier.glob("meta/*/tier"))
    assert len(records) == 1, records
    return json.loads(records[0].read_bytes())["tier_id"]


def tier_files(tier):
    return sorted(os.path.relpath(os.path.join(d, f), tier) for d, _, fs in os.walk(tier) for f in fs)


@pytest.fixture
def dataset(tmp_path, videos):
    p = tmp_path / "data" / "train.jsonl"
    p.parent.mkdir()
    rows = [{"prompt": "<video> what happens?", "videos": [videos["ffv1_10_small"]]},
            {"prompt": "<video> and here?", "videos": [videos["mjpeg_24"]]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_cli_cluster_path_on_a_new_directory_tier(tmp_path, dataset):
    tier, node_a, node_b = tmp_path / "tier", tmp_path / "nodeA", tmp_path / "nodeB"
    r = ok(run_cli(["prewarm", str(dataset), "--workers", "2"], node_a, tier))
    assert "2 new" in r.stdout
    ident = tier_id_of(tier)      # made by the CLI alone
    assert ident in r.stderr
    assert not list(tmp_path.glob("*.failures.jsonl")) and not (dataset.parent / "train.failures.jsonl").exists()
    before = tier_files(tier)

    st = json.loads(ok(run_cli(["stats", "--json"], node_b, tier)).stdout)
    assert st["identity"] == ident and st["shared"]["entries"] == 2 and st["shared"]["bytes"] > 0
    assert st["local"]["entries"] == 0
    listing = json.loads(ok(run_cli(["ls", "--json"], node_b, tier)).stdout)
    assert sorted(r["sources"][0] for r in listing) == sorted(json.loads(ln)["videos"][0]
                                                              for ln in dataset.read_text().splitlines())
    assert all(r["tiers"] == ["shared"] and r["family"] == "qwen2_5_vl" and r["tokens"] > 0 for r in listing)
    table = ok(run_cli(["ls"], node_b, tier)).stdout
    assert "2 entries" in table and "shared" in table
    for mode in ("stock", "plugin"):
        cfg = json.loads(ok(run_cli(["sglang-config", "--family", "qwen2_5_vl", "--mode", mode], node_b, tier)).stdout)
        assert cfg["mode"] == mode and cfg["cache"] == {"shared": str(tier), "identity": ident}
    assert "verify: 0 ok, 0 bad" in ok(run_cli(["verify"], node_b, tier)).stdout
    assert "verify: 2 ok, 0 bad" in ok(run_cli(["verify", "--shared"], node_b, tier)).stdout
    doc = ok(run_cli(["doctor"], node_b, tier)).stdout
    assert f"identity {ident}" in doc and "doctor: all checks passed" in doc
    key = listing[0]["key"]
    src = ok(run_cli(["inspect", listing[0]["sources"][0], "--json"], node_b, tier))
    assert json.loads(src.stdout)["key"] == key
    assert not node_b.exists()                   # the read-only commands created nothing on node B

    r = ok(run_cli(["evict", key], node_b, tier))     # local by default: the cluster keeps it
    assert tier_files(tier) == before and not node_b.exists()
    r = ok(run_cli(["evict", key], node_a, tier))
    assert r.stdout.startswith("evicted") and tier_files(tier) == before
    assert json.loads(ok(run_cli(["stats", "--json"], node_a, tier)).stdout)["local"]["entries"] == 1


def test_evict_from_the_shared_tier_needs_the_flag_and_confirmation(tmp_path, dataset):
    tier, node = tmp_path / "tier", tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset)], node, tier))
    key = json.loads(ok(run_cli(["ls", "--json"], node, tier)).stdout)[0]["key"]
    before = tier_files(tier)
    r = failed(run_cli(["evict", key, "--shared"], node, tier), "config")     # no TTY to ask on: refused
    assert "--yes" in r.stderr and tier_files(tier) == before
    ok(run_cli(["evict", key, "--shared", "--yes"], node, tier))
    after = tier_files(tier)
    has = lambda files: any(f.startswith("ac/") and f.endswith("/" + key) for f in files)   # noqa: E731
    # its manifest, its compact object and that object's digest record
    assert has(before) and not has(after) and len(after) == len(before) - 3
    assert [e["key"] for e in json.loads(ok(run_cli(["ls", "--json"], tmp_path / "other", tier)).stdout)] != [key]


def test_evict_keeps_a_blob_other_entries_share_and_drops_frozen_files(tmp_path, videos):
    """D18: qwen2_vl and qwen2_5_vl build the same frames (one blob) under two keys."""
    from vidcache.sglang.frozen import local_frozen_path, published_frozen_key
    c = VideoCache(tmp_path / "node", shared=str(tmp_path / "tier"))
    a = c.ensure(videos["ffv1_10_small"], VideoOptions(family="qwen2_vl")).key
    b = c.ensure(videos["ffv1_10_small"], VideoOptions(family="qwen2_5_vl")).key
    assert a != b and c.manifest(a).frames.blob == c.manifest(b).frames.blob
    published_frozen_key(c, a)
    local_frozen_path(c, a)
    assert list(c.shared.keys(K.FROZEN + a)) and os.listdir(tmp_path / "node" / "frozen")
    assert c.evict(a, shared=True)
    assert c.manifest(a) is None and not list(c.shared.keys(K.FROZEN + a))
    assert not [n for n in os.listdir(tmp_path / "node" / "frozen") if n.startswith(a)]
    assert c.verify(b) == [] and c.frames(b).shape[0] > 0       # the other entry still reads, on every tier
    fresh = VideoCache(tmp_path / "node2", shared=str(tmp_path / "tier"))
    assert fresh.verify(b) == []
    assert c.evict(b, shared=True)                              # the last reference: now the blob goes
    assert not list(c.shared.keys(K.CAS)) and not list(c.local.keys(K.CAS))


def test_gc_takes_human_sizes_and_a_fresh_node_has_nothing_to_collect(tmp_path, dataset):
    tier, node = tmp_path / "tier", tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset)], node, tier))
    out = json.loads(ok(run_cli(["gc", "--max-local-bytes", "1kB", "--json"], node, tier)).stdout)
    assert out["evicted"] > 0 and out["used_bytes"] < out["freed_bytes"]
    out = json.loads(ok(run_cli(["gc", "--max-local-bytes", "20GB", "--json"], tmp_path / "fresh", tier)).stdout)
    assert out["evicted"] == 0 and not (tmp_path / "fresh").exists()
    failed_parse = run_cli(["gc", "--max-local-bytes", "20 parsecs"], node, tier)
    assert failed_parse.returncode == 2 and "not a size" in failed_parse.stderr
    from vidcache.cli import parse_size
    assert (parse_size("20GB"), parse_size("1.5GiB"), parse_size("512")) == (20 * 10**9, 3 * 2**29, 512)


def test_inspect_normalises_paths_and_names_the_options_a_source_is_cached_under(tmp_path, dataset, videos):
    tier, node = tmp_path / "tier", tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset), "--family", "qwen3_vl"], node, tier))
    clip = videos["ffv1_10_small"]
    rel = os.path.relpath(clip, ROOT)
    for form in (clip, rel, "./" + rel, "file://" + clip):
        r = ok(run_cli(["inspect", form, "--family", "qwen3_vl", "--json"], node, tier))
        assert json.loads(r.stdout)["options"]["family"] == "qwen3_vl"
    r = run_cli(["inspect", rel, "--family", "qwen2_vl"], node, tier)
    assert r.returncode == 1 and "cached under: --family qwen3_vl" in r.stderr


def _race(tmp_path, n, env):
    """``n`` processes run ``vidcache tier-id --init`` on one new tier at the same moment."""
    sync = tmp_path / "sync"
    sync.mkdir()
    code = ("import os, sys, time\nfrom vidcache.cli import main\n"
            "open(os.path.join(sys.argv[1], 'ready-' + sys.argv[2]), 'w').close()\n"
            "while not os.path.exists(os.path.join(sys.argv[1], 'go')): time.sleep(0.002)\n"
            "sys.exit(main(['tier-id', '--init']))")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(sync), str(i)], cwd=ROOT, text=True,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **env,
                                   "VIDCACHE_DIR": str(tmp_path / f"node{i}")},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for i in range(n)]
    deadline = time.monotonic() + 240
    while len(list(sync.glob("ready-*"))) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    (sync / "go").touch()
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    return {o.strip() for o, _ in outs}


def test_eight_nodes_initialising_one_directory_tier_agree(tmp_path):
    tier = tmp_path / "tier"
    ids = _race(tmp_path, 8, {"VIDCACHE_SHARED": str(tier)})
    assert len(ids) == 1 and ids == {tier_id_of(tier)}


def test_eight_nodes_initialising_one_s3_tier_agree(tmp_path, s3):
    env = {"VIDCACHE_SHARED": "s3://cache/tier", "AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": "test",
           "AWS_SECRET_ACCESS_KEY": "test", "AWS_DEFAULT_REGION": "us-east-1"}
    for trial in range(2):
        env["VIDCACHE_SHARED"] = f"s3://cache/tier{trial}"
        (tmp_path / f"t{trial}").mkdir()
        ids = _race(tmp_path / f"t{trial}", 8, env)
        listed = s3.client.list_objects_v2(Bucket="cache", Prefix=f"tier{trial}/meta/")["Contents"]
        assert len(listed) == 1                                  # one record, written once
        stored = json.loads(s3.client.get_object(Bucket="cache", Key=listed[0]["Key"])["Body"].read())
        assert len(ids) == 1 and ids == {stored["tier_id"]}


def test_a_tier_that_lost_its_identity_is_refused_with_the_repair(tmp_path, dataset):
    tier, node = tmp_path / "tier", tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset)], node, tier))
    ident = tier_id_of(tier)
    next(tier.glob("meta/*/tier")).unlink()
    for args in (["prewarm", str(dataset)], ["stats"], ["tier-id", "--init"]):
        r = failed(run_cli(args, tmp_path / "nodeB", tier), "store")
        assert "tier-id --shared" in r.stderr and "--restore" in r.stderr
        assert "the `cache:` line of an old `vidcache stats`" in r.stderr      # the label stats prints (below)
        assert not list(tier.glob("meta/*/tier"))           # never a new identity on its own
    doc = run_cli(["doctor", "--fast"], tmp_path / "nodeB", tier)          # doctor names it and exits non-zero
    assert doc.returncode == 1 and "FAIL VIDCACHE_SHARED" in doc.stdout and "--restore" in doc.stdout
    assert "doctor: some checks failed" in doc.stdout
    assert ok(run_cli(["tier-id", "--restore", ident], node, tier)).stdout.strip() == ident
    assert json.loads(ok(run_cli(["stats", "--json"], tmp_path / "nodeB", tier)).stdout)["identity"] == ident
    assert ok(run_cli(["stats"], tmp_path / "nodeB", tier)).stdout.startswith(f"cache:  {ident}\n")
    failed(run_cli(["tier-id", "--restore", "tier-" + "0" * 32], node, tier), "config")   # never replaced


def test_local_hits_are_published_to_a_newly_configured_tier(tmp_path, dataset):
    """D17: a node that cached entries under tier S1 (or none) and is then pointed at S2 publishes them to S2
    (prewarm counts them `published`), so a fresh node on S2 reads them.  S2 is a new tier, started on purpose
    (`tier-id --init`): a node that belongs to S1 never makes one silently (issue 33)."""
    node, s1, s2, fresh = tmp_path / "nodeA", tmp_path / "s1", tmp_path / "s2", tmp_path / "nodeB"
    assert "2 new, 0 hit" in ok(run_cli(["prewarm", str(dataset)], node, s1)).stdout
    r = run_cli(["prewarm", str(dataset)], node, s2)
    assert r.returncode != 0 and "refusing to start a new tier silently" in r.stdout + r.stderr
    assert ok(run_cli(["tier-id", "--init"], node, s2)).stdout.startswith("tier-")
    assert "0 new, 0 hit, 2 published" in ok(run_cli(["prewarm", str(dataset)], node, s2)).stdout
    assert "0 new, 2 hit, 0 failed" in ok(run_cli(["prewarm", str(dataset)], node, s2)).stdout   # now a plain hit
    assert "verify: 2 ok, 0 bad" in ok(run_cli(["verify", "--shared"], fresh, s2)).stdout
    entries = json.loads(ok(run_cli(["ls", "--json"], fresh, s2)).stdout)
    assert len(entries) == 2 and all(e["tiers"] == ["shared"] for e in entries)
    c = VideoCache(fresh, shared=str(s2))
    for e in entries:                                  # the frames themselves, on the fresh node
        assert c.frames(e["key"]).shape[0] == e["frames"]


def test_a_fresh_node_reads_an_s3_tier_through_the_cli_alone(tmp_path, dataset, s3):
    """Node A prewarms into S3 (CLI); on a fresh node B, `inspect --contact-sheet` reads each entry's
    compact object as it streams in, and draws exactly what node A, which built the frames, draws."""
    env = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    tier, node_a, node_b = "s3://cache/cli", tmp_path / "nodeA", tmp_path / "nodeB"
    assert "2 new" in ok(run_cli(["prewarm", str(dataset)], node_a, tier, env=env)).stdout
    listing = json.loads(ok(run_cli(["ls", "--json"], node_b, tier, env=env)).stdout)
    assert len(listing) == 2 and all(r["tiers"] == ["shared"] for r in listing)
    names = [o["Key"] for o in s3.client.list_objects_v2(Bucket="cache", Prefix="cli/")["Contents"]]
    assert not [n for n in names if n.startswith("cli/cas/")]           # node B can only read compact objects
    for r in listing:
        a_png, b_png = tmp_path / f"a-{r['key']}.png", tmp_path / f"b-{r['key']}.png"
        ok(run_cli(["inspect", r["key"], "--contact-sheet", str(b_png)], node_b, tier, env=env))
        ok(run_cli(["inspect", r["key"], "--contact-sheet", str(a_png)], node_a, tier, env=env))
        assert b_png.read_bytes() == a_png.read_bytes()
    assert "verify: 2 ok, 0 bad" in ok(run_cli(["verify", "--shared"], node_b, tier, env=env)).stdout


def test_a_node_whose_first_command_was_a_prewarm_serves_its_entries_while_the_tier_is_down(tmp_path, dataset,
                                                                                            s3):
    """A fresh node's first command (a CLI prewarm) records the tier's identity in the node directory, so
    that with the S3 endpoint gone the node still reads its own entries (one warning naming the identity),
    and `verify` and `ls` check and list its own copies; a read of the node opened without any tier says
    which tier it belongs to.  It used to record nothing (the directory did not exist yet when the identity
    was read), and every read failed; `verify` called every sound entry BAD, and `ls` listed nothing."""
    from support.net import free_port

    from vidcache.errors import ConfigError
    env = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
           "AWS_DEFAULT_REGION": "us-east-1"}
    tier, node = "s3://cache/down", tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset)], node, tier, env=env))
    listing = json.loads(ok(run_cli(["ls", "--json"], node, tier, env=env)).stdout)
    ident = json.loads(ok(run_cli(["stats", "--json"], node, tier, env=env)).stdout)["identity"]
    down = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", "VIDCACHE_SHARED_TIMEOUT_S": "5"}
    for e in listing:
        up_png, down_png = tmp_path / f"up-{e['key']}.png", tmp_path / f"down-{e['key']}.png"
        ok(run_cli(["inspect", e["key"], "--contact-sheet", str(up_png)], node, tier, env=env))
        r = ok(run_cli(["inspect", e["key"], "--contact-sheet", str(down_png)], node, tier, env=down))
        assert ident in r.stderr and "unreachable" in r.stderr
        assert down_png.read_bytes() == up_png.read_bytes()
    # verify and ls check and list the node's own copies, saying that the tier was not reached ...
    r = ok(run_cli(["verify"], node, tier, env=down))
    assert "verify: 2 ok, 0 bad" in r.stdout and "checking this node's own copies only" in r.stderr
    assert r.stderr.count("vidcache: warning:") == 1                   # one wait on the tier, not one per entry
    r = ok(run_cli(["ls", "--json"], node, tier, env=down))
    assert sorted(e["key"] for e in json.loads(r.stdout)) == sorted(e["key"] for e in listing)
    assert "listing this node's own copies only" in r.stderr
    failed(run_cli(["verify", "--shared"], node, tier, env=down), "shared_unavailable")      # ... the tier's, never
    failed(run_cli(["ls"], tmp_path / "fresh", tier, env=down), "shared_unavailable")         # a fresh node has none
    with pytest.raises(ConfigError, match=f"last used with the shared tier {tier}.*VIDCACHE_SHARED={tier}"):
        VideoCache(node, shared="", read_only=True).identity


def test_a_directory_tier_that_is_not_mounted_is_an_outage_to_a_node_that_knows_it(tmp_path, dataset):
    """A node that read its directory tier's identity, then finds the directory empty (an NFS export not
    mounted: the mount point is left): its read-only commands say the tier is not mounted or reachable, not
    "nothing was prewarmed yet", and `verify` checks the node's own copies meanwhile."""
    tier, node = tmp_path / "tier", tmp_path / "node"
    ok(run_cli(["prewarm", str(dataset)], node, tier))
    ident = tier_id_of(tier)
    os.rename(tier, tmp_path / "exported")
    tier.mkdir()                                                   # the bare mount point
    r = ok(run_cli(["verify"], node, tier))
    assert "verify: 2 ok, 0 bad" in r.stdout and "not mounted or not reachable" in r.stderr and ident in r.stderr
    failed(run_cli(["verify", "--shared"], node, tier), "shared_unavailable")
    assert not os.listdir(tier)                                    # nothing written into the mount point


def test_a_node_of_a_tier_pointed_at_an_empty_directory_refuses_to_write(tmp_path, dataset):
    """Issue 33, CLI only: node A belongs to tier S; S's export is not mounted (its mount point is an empty
    directory).  prewarm refuses, naming the known tier and the path and how to start a new tier on purpose;
    nothing is written there and the node's recorded tier is unchanged.  doctor calls a missing path missing."""
    node, s = tmp_path / "nodeA", tmp_path / "mnt"
    assert "2 new" in ok(run_cli(["prewarm", str(dataset)], node, s)).stdout
    ident = ok(run_cli(["tier-id"], node, s)).stdout.strip()
    recorded = (node / "config.json").read_text()
    s.rename(tmp_path / "export-elsewhere")
    s.mkdir()                                             # the bare mount point
    r = run_cli(["prewarm", str(dataset)], node, s)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "Traceback" not in out, out
    assert ident in out and str(s) in out and "tier-id --shared URL --init" in out, out
    assert list(s.iterdir()) == [] and (node / "config.json").read_text() == recorded
    r = run_cli(["doctor", "--fast"], node, tmp_path / "not-there")
    line = next(ln for ln in r.stdout.splitlines() if "VIDCACHE_SHARED" in ln)
    assert "missing" in line and "reachable" not in line, r.stdout


def test_ls_key_prefixes_work_in_inspect_and_evict(tmp_path, dataset):
    """Issue 33, CLI only: the 16-digit prefix `ls` prints (with its `..`) names the entry in `inspect` and
    `evict`, as git completes object names; a prefix of no entry, or of several, is refused by name; `ls` shows
    each entry's sampled fps."""
    node, s = tmp_path / "node", tmp_path / "s"
    assert "2 new" in ok(run_cli(["prewarm", str(dataset)], node, s)).stdout
    lines = ok(run_cli(["ls"], node, s)).stdout.splitlines()
    assert lines[0].split()[:6] == ["KEY", "FAMILY", "T", "x", "H", "x"] and "FPS" in lines[0]
    listing = json.loads(ok(run_cli(["ls", "--json"], node, s)).stdout)
    shown = [ln.split()[0] for ln in lines[1:-1]]
    assert all(p.endswith("..") and len(p) == 18 for p in shown) and len(shown) == 2
    for p, e in zip(shown, listing):
        assert f"{e['fps']:.3g}" in next(ln for ln in lines if ln.startswith(p)).split()
        got = json.loads(ok(run_cli(["inspect", p, "--json"], node, s)).stdout)
        assert got["key"] == e["key"]
    r = run_cli(["inspect", "ffff0000"], node, s)
    assert r.returncode != 0 and "no cached entry's key starts with 'ffff0000'" in r.stderr and "Traceback" not in r.stderr
    common = os.path.commonprefix([e["key"] for e in listing])
    if len(common) >= 4:                                    # two keys of one source digest: ambiguous
        r = run_cli(["inspect", common], node, s)
        assert r.returncode != 0 and "ambiguous" in r.stderr
    assert f"evicted {listing[0]['key']}" in ok(run_cli(["evict", shown[0]], node, s)).stdout
