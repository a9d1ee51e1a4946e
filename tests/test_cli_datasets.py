"""Issues 40 (items 3-5) and 41 (D44-D46, D49, D54): datasets, `pull`, `ls` and `stats` as a user drives them,
through the CLI on fresh node directories (VIDCACHE_DIR / VIDCACHE_SHARED)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from vidcache.cli import main as cli
from vidcache.testing.videos import make_video

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--min-pixels", "3136", "--no-progress"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    d = tmp_path_factory.mktemp("clips")
    out = {}
    for i, name in enumerate(("a", "b", "c")):
        out[name] = make_video(str(d / f"{name}.mkv"), codec="ffv1", width=64, height=48, fps=10, n_frames=10,
                               seed=10 + i)
    return out


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A fresh node: VIDCACHE_DIR and VIDCACHE_SHARED set, nothing created yet."""
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "nodeA"))
    monkeypatch.setenv("VIDCACHE_SHARED", str(tmp_path / "tier"))
    return tmp_path


def _jsonl(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


# --- issue 40 item 3, D49 (a): `pull` says why, counts true, resolves without the sources -----------------------
def test_pull_on_a_node_without_the_sources_says_why_and_counts_true(node, clips, capsys, monkeypatch):
    data = node / "data"
    data.mkdir()
    for n in ("a", "b"):
        shutil.copy(clips[n], data / f"{n}.mkv")
    rows = [{"prompt": "<video> 1", "videos": ["a.mkv"]},
            {"prompt": "<video> 2", "videos": ["b.mkv"]},
            "{not json",                                                    # line 3: malformed (D49 a)
            {"prompt": "<video> 4", "videos": ["never_made.mkv"]},          # no source, no record anywhere
            {"prompt": "<video> 5", "videos": ["a.mkv"]}]
    ds = _jsonl(data / "train.jsonl", rows)
    assert cli(["prewarm", str(ds), *SMALL, "--allow-failures"]) == 0       # node A builds a and b
    capsys.readouterr()
    os.rename(data / "a.mkv", node / "a.moved")                             # node B: the sources are gone
    os.rename(data / "b.mkv", node / "b.moved")
    monkeypatch.setenv("VIDCACHE_DIR", str(node / "nodeB"))
    assert cli(["pull", str(ds), "--min-pixels", "3136"]) == 1
    out = capsys.readouterr().out
    # Both entries pulled through the tier's source record (before: "0 pulled ..., N failed", no reason)
    assert "pull: 2 pulled, 0 already here (2 found by the shared tier's source record" in out, out
    assert "0 not cached" in out and "2 failed" in out, out
    assert "row 2 (line 3): [bad_row] line is not JSON" in out, out                 # the line is named ...
    assert "row 3 (line 4): [not_found]" in out and "no tier records what this source holds" in out, out
    # ... and the rows after it were still pulled (before: read-ahead ended at the first bad row)
    assert cli(["pull", str(ds), "--min-pixels", "3136"]) == 1
    out = capsys.readouterr().out
    assert "pull: 0 pulled, 2 already here" in out, out                      # the count is true once local
    # a source that is here but was never built: "not cached yet", with its reason, not a failure
    shutil.copy(clips["c"], data / "c.mkv")
    ds2 = _jsonl(data / "more.jsonl", [{"prompt": "<video>", "videos": ["c.mkv"]}])
    assert cli(["pull", str(ds2), "--min-pixels", "3136"]) == 0
    out = capsys.readouterr().out
    assert "0 pulled, 0 already here, 1 not cached" in out and "[not_cached] not cached yet" in out, out


@pytest.mark.parametrize("flag", [["--depth", "0"], ["--depth", "-5"], ["--max-bytes", "0"]])
def test_pull_refuses_nonpositive_bounds_without_a_traceback(node, clips, capsys, flag):
    """D54: `pull --depth 0` was a ValueError traceback."""
    ds = _jsonl(node / "d.jsonl", [{"prompt": "<video>", "videos": [clips["a"]]}])
    with pytest.raises(SystemExit) as e:
        cli(["pull", str(ds), *flag])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag[0] in err and ("at least 1" in err or "positive" in err) and "Traceback" not in err, err


# --- issue 40 item 4: datasets ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["jsonl", "parquet", "hf"])
def test_no_media_under_the_keys_fails_alike_in_every_format(node, fmt, capsys):
    """A JSONL with no media under the keys gave a warning and rc 0, parquet rc 1: now rc 1 and [no_media] for
    each, naming the keys and what the rows carry."""
    rows = [{"prompt": "what happens?", "clip": "x.mkv"}, {"prompt": "and then?", "clip": "y.mkv"}]
    if fmt == "jsonl":
        ds = _jsonl(node / "d.jsonl", rows)
    else:
        rows = [{**r, "videos": []} for r in rows]          # the column is there, and empty
        if fmt == "parquet":
            ds = node / "d.parquet"
            pq.write_table(pa.Table.from_pylist(rows), ds)
        else:
            import datasets
            ds = node / "hf"
            datasets.Dataset.from_list(rows).save_to_disk(str(ds))
    assert cli(["prewarm", str(ds), *SMALL]) == 1
    err = capsys.readouterr().err
    assert "[no_media] none of the 2 rows has a video or an image under 'videos'" in err, err
    assert "clip" in err and "--multimodal-keys" in err, err


@pytest.mark.parametrize("what", ["mp4", "json_array", "csv"])
def test_a_file_that_is_not_a_dataset_is_one_error_and_writes_nothing(node, clips, what, capsys):
    if what == "mp4":
        ds = node / "clip.mp4"
        shutil.copy(clips["a"], ds)                 # Matroska, named .mp4 as users do
    elif what == "json_array":
        ds = node / "rows.jsonl"
        ds.write_text(json.dumps([{"prompt": "<video>", "videos": ["a.mkv"]}] * 3, indent=2))
    else:
        ds = node / "rows.csv"
        ds.write_text("prompt,videos\n<video> q,a.mkv\n<video> r,b.mkv\n")
    before = sorted(os.listdir(node))
    for verb in ("prewarm", "pull"):
        assert cli([verb, str(ds), *SMALL[:2]]) == 1
        err = capsys.readouterr().err
        assert err.count("[dataset_format]") == 1 and "bad_row" not in err, err
        assert {"mp4": "video", "json_array": "JSON array", "csv": "CSV"}[what] in err, err
    assert sorted(os.listdir(node)) == before           # no failures file beside it, no node directory


def test_default_keys_take_miles_image_and_video_rows(node, clips, capsys):
    """The default --multimodal-keys covers Miles' row fields for both kinds (`images`, `videos`): a row with an
    <image> and a <video> builds its video and checks its image (before: [bad_row] "... but 0 None entries", the
    row's video skipped)."""
    from PIL import Image
    Image.new("RGB", (40, 30), (200, 10, 10)).save(node / "i.png")
    ds = _jsonl(node / "d.jsonl", [{"prompt": "<image> and <video>?", "images": ["i.png"], "videos": [clips["a"]]}])
    assert cli(["prewarm", str(ds), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "1 new" in out and "1 images checked" in out and "0 failed" in out, out
    # With only a video key given, the mismatch names the missing key and the fix
    assert cli(["prewarm", str(ds), *SMALL, "--multimodal-keys", '{"video": "videos"}']) == 1
    out = capsys.readouterr().out
    assert "no image key is configured" in out and '"image": "<field>"' in out and "None" not in out, out


def test_more_failures_than_shown_say_how_many_more(node, capsys):
    ds = _jsonl(node / "d.jsonl", [{"prompt": "<video>", "videos": [7]}] * 8)
    assert cli(["prewarm", str(ds), *SMALL]) == 1
    out = capsys.readouterr().out
    assert out.count("[bad_row]") == 5 and "... and 3 more (every one in" in out, out


# --- issue 40 item 5: ls / inspect / evict / stats ------------------------------------------------------------------
def test_ls_prints_unique_prefixes_that_inspect_and_evict_take(node, clips, capsys):
    ds = _jsonl(node / "d.jsonl", [{"prompt": "<video>", "videos": [clips["a"]]}])
    assert cli(["prewarm", str(ds), *SMALL]) == 0
    assert cli(["prewarm", str(ds), *SMALL, "--fps", "1"]) == 0       # the same clip under a second option set
    capsys.readouterr()
    assert cli(["ls"]) == 0
    lines = capsys.readouterr().out.splitlines()[1:-1]
    shown = [ln.split()[0].removesuffix("..") for ln in lines]
    assert len(shown) == 2 and shown[0] != shown[1] and len(shown[0]) >= 16, lines
    assert not shown[0].startswith(shown[1]) and not shown[1].startswith(shown[0])   # neither is ambiguous
    for prefix in shown:
        assert cli(["inspect", prefix + "..", "--json"]) == 0, capsys.readouterr().err
        key = json.loads(capsys.readouterr().out)["key"]
        assert key.startswith(prefix)
    assert cli(["evict", shown[0]]) == 0
    assert capsys.readouterr().out.startswith("evicted ")


def test_stats_is_a_table_and_json_on_request(node, clips, capsys):
    ds = _jsonl(node / "d.jsonl", [{"prompt": "<video>", "videos": [clips["b"]]}])
    assert cli(["prewarm", str(ds), *SMALL]) == 0
    capsys.readouterr()
    assert cli(["stats"]) == 0
    out = capsys.readouterr().out
    header = next(ln for ln in out.splitlines() if ln.startswith("TIER"))
    assert header.split()[:3] == ["TIER", "ENTRIES", "BLOBS"], out
    local = next(ln for ln in out.splitlines() if ln.startswith("local "))
    shared = next(ln for ln in out.splitlines() if ln.startswith("shared "))
    assert local.split()[1] == "1" and shared.split()[1] == "1", out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    assert cli(["stats", "--json"]) == 0
    st = json.loads(capsys.readouterr().out)
    assert st["local"]["entries"] == 1 and st["shared"]["entries"] == 1


# --- D54: a misspelt family in $VIDCACHE_TOKEN_LAYOUT ---------------------------------------------------------------
@pytest.mark.parametrize("value", ["qwen3-vl:wrapped", "Qwen3_VL:wrapped", "qwen3_vl:wrapped,qwen3_vl:collapsed"])
def test_a_misspelt_or_contradictory_token_layout_pin_is_refused(monkeypatch, capsys, value):
    monkeypatch.setenv("VIDCACHE_TOKEN_LAYOUT", value)
    assert cli(["sglang-config", "--family", "qwen3_vl", "--mode", "plugin"]) == 1
    err = capsys.readouterr().err
    assert "[token_layout]" in err and "VIDCACHE_TOKEN_LAYOUT" in err, err
    monkeypatch.setenv("VIDCACHE_TOKEN_LAYOUT", " qwen3_vl : wrapped ")      # spaces are not a misspelling
    assert cli(["sglang-config", "--family", "qwen3_vl", "--mode", "plugin"]) == 0


# --- D49 (b): a corrupt parquet row group, an HF directory missing a shard --------------------------------------------
def _corrupt_second_group(path):
    md = pq.ParquetFile(path).metadata
    col = md.row_group(1).column(0)
    start = col.data_page_offset
    raw = bytearray(path.read_bytes())
    for i in range(start + 8, start + 48):
        raw[i] ^= 0xFF
    path.write_bytes(bytes(raw))


def test_a_corrupt_row_group_or_a_missing_shard_costs_its_rows_only(node, clips, capsys):
    rows = [{"prompt": "<video>", "videos": [clips[n]]} for n in ("a", "b", "c", "a")]
    ds = node / "rg.parquet"
    pq.write_table(pa.Table.from_pylist(rows), ds, row_group_size=2)
    _corrupt_second_group(ds)
    assert cli(["prewarm", str(ds), *SMALL, "--allow-failures"]) == 0
    out = capsys.readouterr().out
    assert "2 new" in out and "1 failed" in out and "row group 1 of" in out and "rows 2-3" in out, out
    import datasets
    hf = node / "hf"
    datasets.Dataset.from_list(rows[:2] + [{"prompt": "<video>", "videos": [clips["c"]]}] * 2).save_to_disk(
        str(hf), num_shards=2)
    gone = sorted(f for f in os.listdir(hf) if f.endswith(".arrow"))[1]
    os.unlink(hf / gone)
    assert cli(["prewarm", str(hf), *SMALL, "--allow-failures"]) == 0
    out = capsys.readouterr().out
    assert "0 new, 2 hit" in out and "1 failed" in out and f"dataset: [bad_row] shard {gone}" in out, out
    assert cli(["pull", str(hf), "--min-pixels", "3136"]) == 1             # pull: the same rows, the same error
    out = capsys.readouterr().out
    assert "2 already here" in out and f"shard {gone}" in out, out


# --- D46: an HF dataset with an Image feature is read as stored, nothing written beside it ----------------------------
def test_an_hf_image_dataset_is_never_rewritten(node, clips, capsys):
    import datasets
    from PIL import Image
    Image.new("RGB", (40, 30), (1, 2, 3)).save(node / "i.png")
    feats = datasets.Features({"prompt": datasets.Value("string"), "videos": datasets.Sequence(datasets.Value("string")),
                               "images": datasets.Sequence(datasets.Image())})
    hf = node / "hf_img"
    datasets.Dataset.from_dict({"prompt": ["<image> <video>"] * 3, "videos": [[clips["a"]]] * 3,
                                "images": [[str(node / "i.png")]] * 3}, features=feats).save_to_disk(str(hf))

    def listing():
        return sorted((f, os.path.getsize(hf / f)) for f in os.listdir(hf))
    before = listing()
    assert cli(["prewarm", str(hf), *SMALL]) == 0
    out = capsys.readouterr().out
    assert "1 new" in out and "1 images checked" in out and "0 failed" in out, out
    from vidcache import VideoOptions
    from vidcache.dataset import LazyVideoDataset
    row = LazyVideoDataset(str(hf), "local-" + "0" * 32, VideoOptions(), image_key="images")[1]
    assert row.images[0].startswith("data:image;base64,")          # as stored: bytes, not a decoded PIL image
    assert listing() == before, "the dataset directory changed (a cast writes a cache-*.arrow copy beside it)"


# --- D45: bytes in a dataset: the plan holds digests, a row read holds one row ----------------------------------------
ONE_ROW = r"""
import sys, pyarrow as pa
from vidcache.dataset import LazyVideoDataset
from vidcache import VideoOptions
ds = LazyVideoDataset(sys.argv[1], "local-" + "0" * 32, VideoOptions())
pool = pa.default_memory_pool()
row = ds[int(sys.argv[2])]
print(pool.max_memory(), len(next(iter(row.inline.values())).data))
"""


def test_bytes_in_a_parquet_are_planned_by_digest_and_read_one_row_at_a_time(tmp_path):
    import tracemalloc

    from vidcache import VideoOptions
    from vidcache.planning import InlineRef, plan
    n, size = 48, 4 << 20
    rows = [{"prompt": "<video>", "videos": [os.urandom(size)]} for _ in range(n)]
    ds = tmp_path / "bytes.parquet"
    # one row group; one row a page (write_batch_size=1), as docs/storage.md advises for videos held as bytes
    pq.write_table(pa.Table.from_pylist(rows), ds, write_batch_size=1)
    del rows
    tracemalloc.start()
    tasks, bad = plan(str(ds), VideoOptions())
    held, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(tasks) == n and not bad and all(isinstance(t.source, InlineRef) for t in tasks)
    assert held < size, f"the plan holds {held} bytes for {n * size} bytes of videos"   # before: all of them
    got = tasks[5].source.load()
    assert got.digest == tasks[5].source.digest and len(got.data) == size
    r = subprocess.run([sys.executable, "-c", ONE_ROW, str(ds), "40"], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    assert r.returncode == 0, r.stderr
    peak, got_size = map(int, r.stdout.split())
    assert got_size == size
    # about 5 rows' worth, whatever the group's size (12 or 48 rows: 21 MiB); a whole-group read: 101 MiB here
    assert peak < 8 * size, f"reading one {size}-byte row took {peak} bytes of Arrow memory (the group: {n * size})"


# --- D44: prewarm's workers die with their driver, and time their rows out themselves ---------------------------------
def _start_hung_prewarm(tmp_path, hung_endpoint, timeout_s):
    import psutil
    ds = _jsonl(tmp_path / "d.jsonl", [{"prompt": "<video>", "videos": [f"{hung_endpoint}/clip.mp4"]}])
    env = {**os.environ, "PYTHONPATH": ROOT, "VIDCACHE_DIR": str(tmp_path / "node")}
    env.pop("VIDCACHE_SHARED", None)
    proc = subprocess.Popen([sys.executable, "-m", "vidcache.cli", "prewarm", str(ds), "--no-progress",
                             "--timeout", str(timeout_s), "--fetch-timeout", "300"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            # SIGHUP at its default, as a terminal's shell starts a command (a runner under
                            # `nohup` would hand the driver SIG_IGN, and it would rightly outlive a hang-up)
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL))
    driver = psutil.Process(proc.pid)
    deadline = time.monotonic() + 120
    while not driver.children() and time.monotonic() < deadline:
        time.sleep(0.1)
    workers = driver.children()
    assert workers, "no worker started"
    time.sleep(2.0)                                       # the worker is at its row (waiting on the hung server)
    assert all(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    return proc, workers


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL", "SIGHUP"])
def test_stopping_prewarm_stops_its_workers(tmp_path, hung_endpoint, how):
    import psutil
    proc, workers = _start_hung_prewarm(tmp_path, hung_endpoint, timeout_s=300)
    proc.send_signal(getattr(signal, how))
    proc.wait(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=15)
    for w in alive:
        w.kill()
    assert not alive, f"{len(alive)} worker(s) outlived the driver's {how}"


def test_a_worker_times_its_row_out_when_the_driver_cannot(tmp_path, hung_endpoint):
    """The driver stopped (SIGSTOP: alive, but enforcing nothing): the worker ends its own row past --timeout."""
    import psutil
    proc, workers = _start_hung_prewarm(tmp_path, hung_endpoint, timeout_s=3)
    proc.send_signal(signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and any(
                w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers):
            time.sleep(0.2)
        running = [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    finally:
        proc.send_signal(signal.SIGCONT)
    out, _ = proc.communicate(timeout=120)
    for w in running:
        w.kill()
    assert not running, "the worker went on past its deadline while the driver was stopped"
    assert proc.returncode == 1 and "1 failed" in out, out
