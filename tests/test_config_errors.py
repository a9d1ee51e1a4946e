"""Issue 51 item 5: a user's setting never reaches a library raw.  A bad ``VIDCACHE_SHARED``, ``--shared``,
``VIDCACHE_DIR`` or ``--cache`` is a ``[config]`` error naming the setting, exit 1, no traceback, nothing made."""
import pytest

from support.cli import run_cli
from vidcache import VideoCache
from vidcache.errors import ConfigError


def refused(r, *words):
    assert r.returncode == 1, (r.returncode, r.stderr[-2000:])
    assert r.stderr.startswith("vidcache: error: [config] "), r.stderr[-2000:]
    assert "Traceback" not in r.stderr and all(w in r.stderr for w in words), r.stderr[-2000:]


PLACEHOLDER_SHARED = "<the cluster's shared tier: NFS path or s3://bucket/prefix>"


@pytest.mark.parametrize("cmd", [["ls"], ["stats"], ["prewarm", "d.jsonl"], ["tier-id"]])
def test_a_shared_tier_typo_names_the_variable(tmp_path, cmd):
    (tmp_path / "d.jsonl").write_text('{"prompt": "<video>", "videos": ["a.mp4"]}\n')
    r = run_cli(cmd, tmp_path / "node", "htp://typo/x", cwd=tmp_path, pythonpath=[])   # this checkout
    refused(r, "VIDCACHE_SHARED", "'htp'", "unknown protocol")
    assert not (tmp_path / "node").exists()                  # nothing made, nothing recorded


def test_shared_flag_placeholder_and_missing_package_are_config_errors(tmp_path):
    refused(run_cli(["ls", "--shared", "htp://typo/x"], tmp_path / "node"), "--shared", "'htp'")
    refused(run_cli(["ls"], tmp_path / "node", PLACEHOLDER_SHARED), "VIDCACHE_SHARED", "placeholder")
    refused(run_cli(["ls", "--shared", "nosuchproto99://b/x"], tmp_path / "node"), "--shared", "nosuchproto99")


def test_a_bad_node_directory_names_the_setting(tmp_path):
    (tmp_path / "file").write_text("not a directory")
    refused(run_cli(["ls"], "<a node-local directory on each SGLang node (never NFS)>", cwd=tmp_path, pythonpath=[]),
            "VIDCACHE_DIR", "placeholder")
    refused(run_cli(["stats", "--cache", str(tmp_path / "file")], tmp_path / "node"), "--cache", "not a directory")
    (tmp_path / "d.jsonl").write_text('{"prompt": "<video>", "videos": ["a.mp4"]}\n')
    refused(run_cli(["prewarm", "d.jsonl", "--cache", "/proc/vidcache-test"], cwd=tmp_path, pythonpath=[]),
            "/proc/vidcache-test", "--cache, VIDCACHE_DIR")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.jsonl", "file"]


def test_python_api_refuses_the_same_values(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="shared="):
        VideoCache(tmp_path / "c", shared="htp://typo/x")
    monkeypatch.setenv("VIDCACHE_SHARED", "htp://typo/x")
    with pytest.raises(ConfigError, match="VIDCACHE_SHARED"):
        VideoCache(tmp_path / "c")
    assert not (tmp_path / "c").exists()
