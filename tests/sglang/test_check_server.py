"""`check-server` against a live HTTP server running SGLang's real Qwen-VL processor
(tests/support/sglang_peer.PeerServer), with vidcache's plugin inside it: an honest server passes; a drifted
processor, another mm_process_config and an unverified version are refused with the cause named."""
import importlib

import pytest

from support import sglang_peer as sp

if not sp.peer_installed():
    pytest.skip("SGLang peer not installed: run scripts/setup_peer_env.sh", allow_module_level=True)
sp.require_peer()

from support.toy_processors import build_processor  # noqa: E402

from vidcache.sglang.check import check_server  # noqa: E402
from vidcache.sglang.config import mm_process_config  # noqa: E402

pytestmark = pytest.mark.peer
FAMILY = "qwen2_5_vl"


@pytest.fixture
def server(tmp_path, monkeypatch):
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    plugin = importlib.import_module("vidcache.sglang.plugin.qwen_vl").VidcacheQwenVLProcessor
    peer = sp.build_peer(FAMILY, build_processor(FAMILY), video_config=mm_process_config()["video"],
                         processor_cls=plugin)
    with sp.PeerServer(peer, mm_process_config=mm_process_config()) as srv:
        yield srv


def test_honest_plugin_server_passes_and_drift_is_refused(server):
    proc = build_processor(FAMILY)
    res = check_server(server.url, mode="plugin", processor=proc)
    assert res.ok, res.lines()
    assert any("wrong attestation is refused" in p for p in res.passed)
    vp = server.peer._processor.video_processor          # another checkpoint revision: mean off in the 4th decimal
    vp.image_mean = [m + 1e-4 for m in vp.image_mean]
    res = check_server(server.url, mode="plugin", processor=proc)
    assert [c.kind for c in res.causes] == ["attestation"]
    assert "pixel_values_videos differs" in res.causes[0].message and "max difference" in res.causes[0].message


def test_config_and_version_are_named(server):
    server.server_info["mm_process_config"] = {"video": {"fps": 1.0}}
    server.server_info["version"] = "0.4.0"
    res = check_server(server.url, mode="plugin", processor=build_processor(FAMILY))
    kinds = {c.kind for c in res.causes}
    assert {"config", "version"} <= kinds
    assert "0.4.0" in next(c.message for c in res.causes if c.kind == "version")
    assert check_server(server.url, mode="plugin", processor=build_processor(FAMILY),
                        allow_unverified="0.4.0").causes[0].kind == "config"


def _stock_server(tmp_path, monkeypatch, **kw):
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    peer = sp.build_peer(FAMILY, build_processor(FAMILY), video_config=mm_process_config()["video"])
    return sp.PeerServer(peer, mm_process_config=mm_process_config(), **kw)


def test_stock_server_passes_in_stock_mode_and_names_the_missing_plugin(tmp_path, monkeypatch):
    with _stock_server(tmp_path, monkeypatch) as srv:
        res = check_server(srv.url, mode="stock", processor=build_processor(FAMILY))
        assert res.ok, res.lines()
        assert any(p.startswith("canary ids match") for p in res.passed)
        assert "the pixels are NOT checked" in res.lines()[0]           # D38: the verdict (first) says what it covers
        res = check_server(srv.url, mode="plugin", processor=build_processor(FAMILY))
        assert [c.kind for c in res.causes] == ["plugin"], res.lines()
        assert "not loaded" in res.causes[0].message


def test_stock_mode_on_a_gpu_server_names_torchcodec(tmp_path, monkeypatch):
    from vidcache.sglang_facts import STOCK_GPU_TORCHCODEC
    with _stock_server(tmp_path, monkeypatch, device="cuda") as srv:
        res = check_server(srv.url, mode="stock", processor=build_processor(FAMILY))
        assert [c.kind for c in res.causes] == ["torchcodec"], res.lines()
        assert STOCK_GPU_TORCHCODEC in res.causes[0].message
        assert check_server(srv.url, mode="stock", processor=build_processor(FAMILY),
                            server_torchcodec=STOCK_GPU_TORCHCODEC).ok


def _cli(url, tmp_path, *args, **settings):
    """`vidcache check-server` as a user runs it: the node's two settings (``settings`` may replace them or add
    others), nothing else."""
    from support.cli import SHELL, run_cli
    return run_cli(["check-server", url, *args], tmp_path / "node", tmp_path / "shared", inherit=SHELL,
                   env=settings, timeout=600)


def test_cli_check_server_on_a_fresh_node(tmp_path, monkeypatch):
    """The canary is cached by the CLI through the node's configuration (a fresh node, a shared tier) and
    resolved by the plugin inside the server through the same configuration; the processor comes from the
    server's tokenizer_path."""
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("VIDCACHE_SHARED", str(tmp_path / "shared"))
    ckpt = tmp_path / "ckpt"
    build_processor(FAMILY).save_pretrained(ckpt)
    plugin = importlib.import_module("vidcache.sglang.plugin.qwen_vl").VidcacheQwenVLProcessor
    peer = sp.build_peer(FAMILY, build_processor(FAMILY), video_config=mm_process_config()["video"],
                         processor_cls=plugin)
    with sp.PeerServer(peer, tokenizer_path=str(ckpt), mm_process_config=mm_process_config()) as srv:
        r = _cli(srv.url, tmp_path, "--mode", "plugin")
        assert r.returncode == 0, r.stdout + r.stderr
        ok = [ln for ln in r.stdout.splitlines() if ln.startswith("OK ")]
        assert len(ok) == 1 and "parity established" in ok[0], r.stdout
        # The trainer's transformers (this venv's) puts text after a long video elsewhere than SGLang: a warning
        # naming the class and the fix, never a failure (issue 37).
        assert any(ln.startswith("WARN [positions]") and "Qwen2_5_VLModel.get_rope_index" in ln
                   and "vidcache.rope_positions" in ln for ln in r.stdout.splitlines()) == (FAMILY == "qwen2_5_vl")
        srv.server_info.update(version="0.9.99", mm_process_config=mm_process_config("0.9.99", FAMILY))
        r = _cli(srv.url, tmp_path, "--mode", "plugin")
        assert r.returncode == 1 and "Traceback" not in r.stderr
        fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
        assert fails == [fails[0]] and fails[0].startswith("FAIL [version]") and "0.9.99" in fails[0], r.stdout
        r = _cli(srv.url, tmp_path, "--mode", "plugin", "--allow-unverified-sglang", "0.9.99")
        assert r.returncode == 0, r.stdout + r.stderr


def _generate(url: str, input_ids: list[int], video_data: list[str]) -> tuple[int, dict]:
    """(status, JSON body) of one SGLang ``/generate`` call with the prompt's ids returned: 400s included."""
    import json
    import urllib.error
    import urllib.request
    body = json.dumps({"input_ids": input_ids, "video_data": video_data,
                       "sampling_params": {"max_new_tokens": 0}, "return_prompt_token_ids": True}).encode()
    req = urllib.request.Request(url + "/generate", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_drift_is_rejected_on_every_request_and_unattested_ones_are_counted(server, videos):
    """The plugin inside SGLang's real processor code checks every request, not only the canary: with the
    server's image_mean off in the 4th decimal, each attested request is a 400 naming its key and the field;
    honest requests pass; a reference without attestation is served and counted."""
    import vidcache
    from vidcache import VideoOptions
    from vidcache.processing import VIDEO_PLACEHOLDER
    from vidcache.sglang.plugin.qwen_vl import Counters
    from vidcache.sglang.request import ATTESTATION_MARK, prepare

    proc = build_processor(FAMILY)
    prompt = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}What is it?<|im_end|>\n"
    handles = [vidcache.get(videos[n], VideoOptions(family=FAMILY, fps=2.0)) for n in ("ffv1_10_small", "mjpeg_24")]

    def post(prep):
        return _generate(server.url, prep.compact_ids, prep.video_data)

    for h in handles:                                              # honest: served, ids match
        prep = prepare(proc, prompt, [h], mode="plugin")
        status, body = post(prep)
        assert status == 200 and body["prompt_token_ids"] == prep.expanded_ids
    vp = server.peer._processor.video_processor
    vp.image_mean = [m + 1e-4 for m in vp.image_mean]
    rejected = Counters.rejected
    for h in handles * 2:
        status, body = post(prepare(proc, prompt, [h], mode="plugin"))
        msg = body["error"]["message"]
        assert status == 400 and ATTESTATION_MARK in msg, msg
        assert h.resolve() in msg and "pixel_values_videos differs" in msg and "video_grid_thw" not in msg
    assert Counters.rejected == rejected + 4
    unattested = Counters.unattested
    status, _ = post(prepare(proc, prompt, [handles[0]], mode="plugin", attest=False))
    assert status == 200 and Counters.unattested == unattested + 1


def test_cli_check_server_in_stock_mode_sends_the_sglang_nodes_mount(tmp_path, monkeypatch):
    """D26, CLI only on a fresh node: the shared tier is mounted at ``mntA`` here and at ``mntB`` where SGLang
    runs (two links to one export).  The canary's URL follows $VIDCACHE_SHARED_SERVER_PATH: pointed at a
    path the server cannot read, the check fails at startup, naming no traceback; pointed at its mount, it
    passes."""
    export = tmp_path / "export"
    export.mkdir()
    for name in ("mntA", "mntB"):
        (tmp_path / name).symlink_to(export)
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    ckpt = tmp_path / "ckpt"
    build_processor(FAMILY).save_pretrained(ckpt)
    peer = sp.build_peer(FAMILY, build_processor(FAMILY), video_config=mm_process_config()["video"])
    with sp.PeerServer(peer, tokenizer_path=str(ckpt), mm_process_config=mm_process_config()) as srv:
        def check(server_path):
            return _cli(srv.url, tmp_path, "--mode", "stock", VIDCACHE_SHARED=str(tmp_path / "mntA"),
                        VIDCACHE_SHARED_SERVER_PATH=str(server_path))
        r = check(tmp_path / "not-mounted-here")
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stdout + r.stderr
        fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL [server]")]
        assert fails and "not-mounted-here/frozen/" in fails[0] and "VIDCACHE_SHARED_SERVER_PATH" in fails[0], r.stdout
        r = check(tmp_path / "mntB")
        assert r.returncode == 0 and "parity established" in r.stdout, r.stdout + r.stderr


def test_the_canary_is_one_entry_however_often_it_runs(tmp_path):
    """D40: the canary is the same file every run (NUT: Matroska wrote a random segment UID), so repeated checks
    (Miles runs one per worker per process) add no entries and no source records to the tier."""
    from vidcache import VideoCache
    from vidcache import keys as K
    from vidcache.sglang.check import canary_handle
    c = VideoCache(tmp_path / "node", shared=str(tmp_path / "tier"))
    for mode in ("plugin", "stock"):
        first = canary_handle("qwen2_5_vl", mode, c).resolve()
        assert all(canary_handle("qwen2_5_vl", mode, c).resolve() == first for _ in range(3))
    assert len(c.entries()) == 2
    assert len(list(c.shared.keys(K.SRC))) == 1                  # one source (the fixed canary path), two options


def test_references_reordered_or_partly_attested_are_refused(server, tmp_path):
    """D41: an attestation bound the pixels to the key, not to the position, so two same-shaped attested videos
    sent swapped were served (200) at each other's placeholders; and one attested video made a request count as
    attested.  Now each record names its position, and a request is attested whole or not at all."""
    import vidcache
    from vidcache import VideoOptions
    from vidcache.processing import VIDEO_PLACEHOLDER
    from vidcache.rollout.ref import parse_ref, ref_uri
    from vidcache.sglang.request import ATTESTATION_MARK, prepare
    from vidcache.testing.videos import make_video

    proc = build_processor(FAMILY)
    clips = [make_video(str(tmp_path / f"{n}.mp4"), codec="h264", width=160, height=120, fps=10, n_frames=20,
                        seed=s) for n, s in (("a", 1), ("b", 2))]
    handles = [vidcache.get(c, VideoOptions(family=FAMILY, fps=2.0)) for c in clips]
    prompt = f"<|im_start|>user\n{VIDEO_PLACEHOLDER}{VIDEO_PLACEHOLDER}Same?<|im_end|>\n"
    prep = prepare(proc, prompt, handles, mode="plugin")
    recs = [parse_ref(u) for u in prep.video_data]
    assert recs[0]["attest"]["video_grid_thw"] == recs[1]["attest"]["video_grid_thw"]       # same shape

    def post(video_data):
        return _generate(server.url, prep.compact_ids, video_data)

    status, body = post(prep.video_data)
    assert status == 200 and body["prompt_token_ids"] == prep.expanded_ids
    status, body = post(prep.video_data[::-1])
    msg = body["error"]["message"]
    assert status == 400 and ATTESTATION_MARK in msg and "sent as video 1 of 2, attested as video 2 of 2" in msg, msg
    bare = ref_uri(recs[1]["tier"], recs[1]["key"], None, recs[1].get("layout"))
    status, body = post([prep.video_data[0], bare])
    msg = body["error"]["message"]
    assert status == 400 and "1 of 2 vidcache references of this request carry no attestation" in msg, msg


@pytest.mark.parametrize("release,warned", [("5.99.0", True), (None, False)])
def test_an_unverified_trainer_transformers_draws_one_warning(tmp_path, monkeypatch, release, warned):
    """check-server, like prewarm, names a transformers release the layout tests did not run for a family whose
    layout moved (Qwen3-VL), with the verified releases, and says nothing for a verified one."""
    import vidcache.sglang.check as chk
    from vidcache.token_layout import VERIFIED_TRANSFORMERS
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    if release is not None:
        monkeypatch.setattr(chk, "_transformers_here", lambda: release)
    assert chk._transformers_here() in VERIFIED_TRANSFORMERS or release is not None
    plugin = importlib.import_module("vidcache.sglang.plugin.qwen_vl").VidcacheQwenVLProcessor
    proc = build_processor("qwen3_vl")
    peer = sp.build_peer("qwen3_vl", proc, video_config=mm_process_config()["video"], processor_cls=plugin)
    with sp.PeerServer(peer, mm_process_config=mm_process_config()) as srv:
        res = check_server(srv.url, mode="plugin", processor=build_processor("qwen3_vl"))
    lines = [w for w in res.warnings if "unverified" in w]
    assert len(lines) == int(warned), res.lines()
    if warned:
        assert f"transformers {release}" in lines[0] and ", ".join(VERIFIED_TRANSFORMERS) in lines[0]
        assert any(ln.startswith("WARN ") and "unverified" in ln for ln in res.lines())


def test_a_server_that_streams_an_endless_reply_is_cut_off(tmp_path):
    """D53: ``check-server`` read ``/server_info`` with no bound (3.1 GB of RSS after 5 s against a stand-in that
    streams an endless JSON string).  The check reads at most ``MAX_REPLY_BYTES`` and names the cause; counted
    in bytes the stand-in got to write before the checker hung up, not in seconds or RSS."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from vidcache.rollout.check import MAX_REPLY_BYTES      # the bound every engine's check reads under
    sent = []
    piece = b"a" * (1 << 20)

    class Endless(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            n = 0
            try:
                self.wfile.write(b'{"version": "')
                while n < 4 * MAX_REPLY_BYTES:         # a bound of its own, so the unfixed check ends too
                    self.wfile.write(piece)
                    n += len(piece)
                self.wfile.write(b'"}')
            except OSError:                           # the checker hung up
                pass
            sent.append(n)

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Endless)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        res = check_server(f"http://127.0.0.1:{srv.server_address[1]}", family="qwen2_5_vl", mode="stock")
    finally:
        srv.shutdown()
    assert not res.ok and "more than" in res.causes[0].message, res.lines()
    assert sent and sent[0] < 4 * MAX_REPLY_BYTES, sent


# --- Qwen3.5 / 3.6 / 3.8: the family derived from the checkpoint (vidcache.families) ----------------
def test_cli_check_server_derives_a_qwen3_5_family_from_the_checkpoint_and_names_a_mismatch(tmp_path, monkeypatch):
    """No --family: `--processor DIR` (a Qwen3.5 checkpoint: Qwen3-VL's processor, the real ids) and the server's
    /model_info decide.  A checkpoint whose processing is not Qwen3.5's, one of another model type, and an
    unknown model type each get a [model] cause naming why; the unknown one runs once --family names it."""
    from support.toy_processors import save_checkpoint
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "node"))
    monkeypatch.setenv("VIDCACHE_SHARED", str(tmp_path / "shared"))
    ckpt = tmp_path / "qwen3_5"
    proc = save_checkpoint("qwen3_5", ckpt)
    plugin = importlib.import_module("vidcache.sglang.plugin.qwen_vl").plugin_classes()
    peer = sp.build_peer("qwen3_5", proc, video_config=mm_process_config(family="qwen3_vl")["video"],
                         processor_cls=plugin["VidcacheQwenVLProcessor"])
    # The server's own path to the checkpoint is not one on this node: --processor names the local copy.
    with sp.PeerServer(peer, tokenizer_path="/models/Qwen3.5-4B", mm_process_config=mm_process_config(family="qwen3_vl")) as srv:
        assert srv.model_info["architectures"] == ["Qwen3_5ForConditionalGeneration"]
        r = _cli(srv.url, tmp_path, "--mode", "plugin", "--processor", str(ckpt))
        assert r.returncode == 0, r.stdout + r.stderr
        assert r.stdout.startswith("OK ") and ", qwen3_vl, plugin mode: parity established" in r.stdout
        assert "WARN" not in r.stdout

        drifted = tmp_path / "drifted"            # a "Qwen3.5" whose vision tower has Qwen2.5-VL's patch
        save_checkpoint("qwen3_5", drifted, config={"vision_config": {"patch_size": 14, "spatial_merge_size": 2,
                                                                      "temporal_patch_size": 2}})
        r = _cli(srv.url, tmp_path, "--mode", "plugin", "--processor", str(drifted))
        fails = [ln for ln in r.stdout.splitlines() if ln.startswith("FAIL")]
        assert r.returncode == 1 and len(fails) == 1 and fails[0].startswith("FAIL [model]"), r.stdout + r.stderr
        assert "vision_config patch/merge/temporal 14/2/2 (expected 16/2/2)" in fails[0]

        other = tmp_path / "qwen3_vl"
        save_checkpoint("qwen3_vl", other)
        r = _cli(srv.url, tmp_path, "--mode", "plugin", "--processor", str(other))
        assert r.returncode == 1 and "FAIL [model] the server runs model_type 'qwen3_5'" in r.stdout, r.stdout
        assert "is 'qwen3_vl'" in r.stdout

        unknown = tmp_path / "qwen9"              # a model type nobody verified, with Qwen3-VL's processing
        save_checkpoint("qwen3_5", unknown, config={"model_type": "qwen9_vl"})
        srv.model_info["model_type"] = "qwen9_vl"
        r = _cli(srv.url, tmp_path, "--mode", "plugin", "--processor", str(unknown))
        assert r.returncode == 1 and "FAIL [model]" in r.stdout and "UNVERIFIED" in r.stdout, r.stdout
        assert "--family qwen3_vl" in r.stdout
        r = _cli(srv.url, tmp_path, "--mode", "plugin", "--processor", str(unknown), "--family", "qwen3_vl")
        assert r.returncode == 0 and "parity established" in r.stdout, r.stdout + r.stderr
        assert "WARN model_type 'qwen9_vl' is not in vidcache's table" in r.stdout
        r = _cli(srv.url, tmp_path, "--mode", "plugin")          # no checkpoint: nothing to derive from
        assert r.returncode == 1 and "FAIL [model] the server's model_type 'qwen9_vl' is not one vidcache serves" \
            in r.stdout and "--processor DIR" in r.stdout, r.stdout
