"""vidcache.manifest: a manifest is bound to its blob, options and timing (issue 18, D2), and source records
carry no credentials (D28)."""
import json

import pytest
import torch

import vidcache
from vidcache import VideoCache, VideoOptions
from vidcache.errors import CorruptManifestError, NotCachedError
from vidcache.manifest import Manifest, SourceRecord, _seal, redact_source
from vidcache.testing.videos import make_video


@pytest.fixture
def twins(tmp_path):
    """Two different videos of the same geometry: entries whose blobs have the same shape."""
    c = VideoCache(tmp_path / "cache")
    paths = [make_video(str(tmp_path / f"twin{i}.mp4"), codec="h264", width=160, height=120, fps=25,
                        n_frames=25, seed=i) for i in range(2)]
    ks = [c.ensure(p, VideoOptions()).key for p in paths]
    ms = [c.manifest(k) for k in ks]
    assert ms[0].frames.shape == ms[1].frames.shape and ms[0].frames.blob != ms[1].frames.blob
    return c, ks, ms


def _raw(cache, key) -> dict:
    return json.loads(cache.local.get("ac/" + key))


def _resealed(d: dict) -> bytes:
    """What a buggy writer would store: a mutated manifest with a correct seal."""
    d = {k: v for k, v in d.items() if k != "seal"}
    return json.dumps({**d, "seal": _seal(d)}).encode()


def test_round_trip_is_sealed_and_lossless(twins):
    c, ks, ms = twins
    d = _raw(c, ks[0])
    assert d["schema"] == 3 and len(d["seal"]) == 32
    assert Manifest.from_json(ms[0].to_json(), ks[0]) == ms[0]


def test_every_single_bit_flip_is_refused(twins):
    """Each bit flip at every byte of a stored manifest: refused, or (never, here) parsed to the same record."""
    c, ks, ms = twins
    raw = c.local.get("ac/" + ks[0])
    refused = same = 0
    for i in range(len(raw)):
        bad = bytearray(raw)
        bad[i] ^= 1 << (i % 8)
        try:
            got = Manifest.from_json(bytes(bad), ks[0])
        except CorruptManifestError:
            refused += 1
        else:
            assert got == ms[0] and got.provenance == ms[0].provenance, f"flip at {i} changed the record"
            same += 1
    assert refused == len(raw) and same == 0


def test_a_manifest_pointing_at_another_entrys_same_shape_blob_is_refused(twins, capsys):
    c, ks, ms = twins
    d = _raw(c, ks[0])
    d["frames"]["blob"] = ms[1].frames.blob                       # the other video, same shape: a valid blob
    c.local.set_many({"ac/" + ks[0]: json.dumps(d).encode()})
    fresh = VideoCache(c.path)
    with pytest.raises(NotCachedError):                            # quarantined on read, never served
        fresh.frames(ks[0])
    assert fresh.local.get("quarantine/ac~" + ks[0]) is not None
    from vidcache.cli import main as cli
    assert cli(["verify", "--cache", str(c.path), ks[1]]) == 0       # the other entry is untouched


@pytest.mark.parametrize("mutation", ["sample_fps x2", "source fps 25->60", "total_num_frames 9999",
                                      "frame indices descending", "frame index past the stream",
                                      "aspect distortion NaN-like 0"])
def test_timing_fields_must_follow_from_each_other_even_when_resealed(twins, mutation):
    """Timing feeds second_per_grid_ts and Qwen3's timestamps: a consistent seal does not make them true."""
    c, ks, ms = twins
    d = _raw(c, ks[0])
    s, src = d["sampling"], d["source"]
    {"sample_fps x2": lambda: s.update(sample_fps=s["sample_fps"] * 2),
     "source fps 25->60": lambda: src.update(average_fps_from_decoder=60.0),
     "total_num_frames 9999": lambda: s.update(total_num_frames=9999),
     "frame indices descending": lambda: s.update(frame_indices=s["frame_indices"][::-1]),
     "frame index past the stream": lambda: s.update(
         frame_indices=s["frame_indices"][:-1] + [src["num_frames_from_decoder"]]),
     "aspect distortion NaN-like 0": lambda: d.update(aspect_distortion=0.0)}[mutation]()
    with pytest.raises(CorruptManifestError, match=ks[0]):
        Manifest.from_json(_resealed(d), ks[0])


def test_schema_2_manifests_are_still_read_and_a_flipped_schema_number_is_not(twins):
    """An upgrade must not quarantine a tier of unsealed schema-2 entries (their sources may be gone)."""
    c, ks, ms = twins
    d = _raw(c, ks[0])
    old = {k: v for k, v in d.items() if k != "seal"}
    old["schema"] = 2
    m = Manifest.from_json(json.dumps(old).encode(), ks[0])
    assert m.frames == ms[0].frames and m.schema == 2
    c.local.set_many({"ac/" + ks[0]: json.dumps(old).encode()})
    assert torch.equal(VideoCache(c.path).frames(ks[0]), c.frames(ks[0]))
    with pytest.raises(CorruptManifestError, match="carries a seal"):
        Manifest.from_json(json.dumps({**d, "schema": 2}).encode(), ks[0])


def test_source_records_carry_no_credentials(tmp_path):
    url = "http://user:hunter2@example.invalid/v.mp4?X-Amz-Signature=SECRETSIG&token=SECRETTOKEN&id=5"
    shown = redact_source(url)
    assert "hunter2" not in shown and "SECRET" not in shown and "id=5" in shown and "user" not in shown
    assert redact_source("s3://bucket/a.mp4") == "s3://bucket/a.mp4" and redact_source("/a/b.mp4") == "/a/b.mp4"
    from vidcache.digest import Digest
    rec = SourceRecord.of(url, {"size": 3, "etag": "x"}, Digest.of(b"abc"))
    raw = rec.to_json()
    assert b"hunter2" not in raw and b"SECRET" not in raw
    back = SourceRecord.from_json(raw)
    assert back == rec and back.matches(url, {"size": 3, "etag": "x"})
    assert not back.matches(url, {"size": 4, "etag": "x"})              # validators changed: a miss
    assert SourceRecord.from_json(b"{damaged") is None


def test_prewarmed_http_source_with_credentials_leaves_none_in_the_tier(tmp_path, videos):
    """The recorded source of a fetched URL with userinfo and a signature holds neither (D28)."""
    import functools
    import http.server
    import os
    import threading
    class WithETag(http.server.SimpleHTTPRequestHandler):       # an ETag makes the source record-worthy
        def end_headers(self):
            self.send_header("ETag", '"v1"')
            super().end_headers()

        def log_message(self, *a):
            pass

    handler = functools.partial(WithETag, directory=os.path.dirname(videos["h264_30"]))
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        url = (f"http://user:hunter2@127.0.0.1:{srv.server_address[1]}/{os.path.basename(videos['h264_30'])}"
               "?X-Amz-Signature=SECRETSIG")
        c = VideoCache(tmp_path / "node", shared=str(tmp_path / "shared"))
        h = vidcache.get(url, VideoOptions(), c)
        assert h.frames().shape[0] > 0
    finally:
        srv.shutdown()
    blobs = b"".join(p.read_bytes() for p in (tmp_path / "shared").rglob("*") if p.is_file() and "src" in p.parts)
    assert b"127.0.0.1" in blobs and b"hunter2" not in blobs and b"SECRETSIG" not in blobs


def test_the_container_frame_count_is_recorded_beside_the_decoders(twins):
    """torchcodec's provenance names: ``num_frames_from_header`` (what the MP4 declares) is kept, beside the
    ``num_frames_from_decoder`` that sampling used."""
    c, ks, ms = twins
    src = ms[0].source
    assert (src.num_frames_from_header, src.num_frames_from_decoder) == (25, 25)
    assert _raw(c, ks[0])["source"]["num_frames_from_header"] == 25
