"""`check-server` against a live HTTP server running SGLang's real Qwen-VL processor (tests/sglang_peer.PeerServer),
with vidcache's plugin inside it: an honest server passes; a drifted processor, another mm_process_config and an
unverified version are refused with the cause named."""
import importlib

import pytest

import sglang_peer as sp

if not sp.peer_installed():
    pytest.skip("SGLang peer not installed: run scripts/setup_peer_env.sh", allow_module_level=True)
sp.require_peer()

from toy_processors import build_processor  # noqa: E402

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
