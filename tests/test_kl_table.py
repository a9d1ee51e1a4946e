"""The KL table's claims, reduced (benchmarks/kl_table.py has the full table; tests/support/kl_paths.py builds both
sides for both): vidcache's stock and plugin paths give the trainer's logits bit for bit (``torch.equal``) on a
tiny random-weight Qwen2.5-VL / Qwen3-VL (``vidcache.testing.kl``: transformers' own classes); the naive path
(SGLang decoding the source itself) does not, on a clip whose frames are first shown to differ; and one pixel
value changed on the trainer's side is caught by the same comparison, so the equality tests can fail.
"""
import os

import pytest
import torch

from support import sglang_peer as sp  # (tests/ is on sys.path via conftest)

if not sp.peer_installed():
    pytest.skip("SGLang peer not installed (the rollout side is SGLang's own processor): run "
                "scripts/setup_peer_env.sh", allow_module_level=True)
sp.require_peer()     # installed: a broken peer is an error here, never a skip

from support import kl_paths as kp  # noqa: E402
from support.toy_processors import build_processor  # noqa: E402

from support.caches import node_cache_in  # noqa: E402
from vidcache.processing import process  # noqa: E402
from vidcache.testing import kl  # noqa: E402

pytestmark = pytest.mark.peer

FAMILIES = ("qwen2_5_vl", "qwen3_vl")
# mjpeg_24: SGLang's naive decode keeps Qwen2.5-VL's shape and ids here and changes only pixel values (its own
# sampler and bilinear resize), the hardest case for a check that looks at shapes; h264_ntsc (29.97 fps) for
# Qwen3-VL, whose naive frames land on another size.
CLIP = {"qwen2_5_vl": "mjpeg_24", "qwen3_vl": "h264_ntsc"}


@pytest.fixture(scope="module")
def kcache(tmp_path_factory):
    """The node's cache (VIDCACHE_DIR): the one the plugin resolves references through, as on a server."""
    with node_cache_in(tmp_path_factory.mktemp("kl") / "cache") as c:
        yield c


@pytest.fixture(scope="module")
def peers():
    return kp.Peers()


@pytest.fixture(scope="module")
def models():
    made = {}

    def get(family):
        if family not in made:
            proc = build_processor(family)
            made[family] = (proc, kl.tiny_model(family, proc, seed=0))
        return made[family]
    return get


def logits(models, family, side):
    proc, model = models(family)
    return kl.response_logits(model, proc, side.ids, kp.response_ids(proc), side.tensors)


@pytest.mark.parametrize("mode", ["stock", "plugin"])
@pytest.mark.parametrize("family", FAMILIES)
def test_vidcache_paths_give_the_trainers_logits_bit_for_bit(family, mode, videos, kcache, peers, models):
    proc, _ = models(family)
    h = kp.get(videos[CLIP[family]], family, mode, kcache)
    rollout, trainer = kp.sglang_vidcache(peers, proc, h, mode), kp.trainer(proc, h, mode)
    assert rollout.ids == trainer.ids
    for k, v in trainer.tensors.items():
        assert torch.equal(torch.as_tensor(rollout.tensors[k]), v), k
    a, b = logits(models, family, rollout), logits(models, family, trainer)
    assert torch.equal(a, b)
    s = kl.kl_stats(a, b)
    assert s["mean_kl"] == s["max_kl"] == s["argmax_diff"] == 0.0 and s["equal"]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_naive_path_does_not(family, videos, kcache, peers, models):
    proc, _ = models(family)
    source = videos[CLIP[family]]
    h = kp.get(source, family, "plugin", kcache)
    rollout, trainer = kp.sglang_naive(peers, family, source), kp.native_trainer(proc, h)
    differ = kp.frames_differ(rollout.frames, trainer.frames)
    assert differ, "SGLang's own decode gave the cached frames: this clip cannot show the naive path's cost"
    a, b = logits(models, family, rollout), logits(models, family, trainer)
    assert not torch.equal(a, b), differ
    assert kl.kl_stats(a, b)["mean_kl"] > 0.0


@pytest.mark.parametrize("family", FAMILIES)
def test_one_pixel_value_on_the_trainer_side_is_caught(family, videos, kcache, peers, models):
    """The comparison the tests above rely on fails for the smallest change there is: one uint8 value of one
    frame, +1 (or -1 at 255), through the trainer's own processor call."""
    proc, _ = models(family)
    h = kp.get(videos[CLIP[family]], family, "plugin", kcache)
    rollout, trainer = kp.sglang_vidcache(peers, proc, h, "plugin"), kp.trainer(proc, h, "plugin")
    frames = trainer.frames.clone()
    c, y, x = 1, frames.shape[2] // 2, frames.shape[3] // 3
    frames[0, c, y, x] += 1 if frames[0, c, y, x] < 255 else -1
    (tensors,) = process(proc, [frames], [h.manifest], "plugin")
    diff = (tensors["pixel_values_videos"] != trainer.tensors["pixel_values_videos"]).sum()
    assert diff == 1                     # exactly one value of the trainer tensor moved
    bumped = kp.Side(trainer.ids, tensors, frames)
    a, b = logits(models, family, rollout), logits(models, family, bumped)
    assert torch.equal(a, logits(models, family, trainer))     # unperturbed: equal, as above
    assert not torch.equal(a, b)
    assert kl.kl_stats(a, b)["mean_kl"] > 0.0


def test_the_benchmark_prints_both_rows_as_zero(tmp_path, monkeypatch, capsys):
    """benchmarks/kl_table.py itself (in this process: SGLang is imported once) on one clip and one family: its
    table's first two rows read 0, and the naive row does not."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("kl_table", os.path.join(root, "benchmarks", "kl_table.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    # main() points $VIDCACHE_DIR at its own cache (the plugin resolves through it): restored after the test.
    monkeypatch.setenv("VIDCACHE_DIR", str(tmp_path / "unused"))
    monkeypatch.delenv("VIDCACHE_SHARED", raising=False)
    bench.main(["--clips", "ffv1_10_small", "--families", "qwen2_5_vl", "--work", str(tmp_path)])
    out = capsys.readouterr().out
    cells = {ln.split("|")[1].strip(): ln.split("|")[2].strip() for ln in out.splitlines()
             if ln.startswith("| ") and ln.count("|") > 3}
    assert float(cells["vidcache stock"]) == 0.0 and float(cells["vidcache plugin"]) == 0.0
    assert float(cells["naive: SGLang decodes the source"]) > 0.0
    assert "logits torch.equal on 1/1 clips (stock) and 1/1 (plugin)" in out


# --- positions (issue 37): equal inputs, and the engine's M-RoPE positions on both sides ------------------------
@pytest.mark.parametrize("mode", ["stock", "plugin"])
@pytest.mark.parametrize("family", FAMILIES)
def test_rope_positions_are_sglangs_own(family, mode, videos, kcache, peers, models):
    """``vidcache.rope_positions(engine="sglang")`` over the prompt equals the ``mrope_positions`` SGLang 0.5.23's own
    processor (stock class, or vidcache's plugin) computed for the request, and over prompt + response it is that
    continued as SGLang decodes (each later token one further, from ``mrope_position_delta``)."""
    import vidcache
    proc, _ = models(family)
    h = kp.get(videos["h264_long"], family, mode, kcache)
    rollout = kp.sglang_vidcache(peers, proc, h, mode)
    theirs = torch.as_tensor(rollout.extra["mrope_positions"]).reshape(3, -1)
    ours = vidcache.rope_positions(proc, rollout.ids, [h], engine="sglang", mode=mode)
    assert torch.equal(ours, theirs)
    resp = kp.response_ids(proc)
    whole = vidcache.rope_positions(proc, rollout.ids + resp, [h], engine="sglang", mode=mode)
    n = len(rollout.ids)
    delta = int(theirs.max()) + 1 - n
    decoded = (torch.arange(n, n + len(resp)) + delta).expand(3, -1)
    assert torch.equal(whole, torch.cat([theirs, decoded], dim=1))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_trainers_own_positions_cost_kl_on_a_long_clip_and_the_engines_cost_none(family, videos, kcache,
                                                                                      peers, models):
    """Identical inputs (ids and tensors ``torch.equal``), 160 s clip: the rollout scored at SGLang's positions, the
    trainer at transformers' own.  Qwen2.5-VL: the logits differ (its text resumes elsewhere after the video);
    given ``vidcache.rope_positions``, the trainer's logits equal the rollout's bit for bit.  Qwen3-VL: equal
    either way (one item per frame group)."""
    import vidcache
    from vidcache import mrope
    proc, model = models(family)
    h = kp.get(videos["h264_long"], family, "plugin", kcache)
    rollout, trainer = kp.sglang_vidcache(peers, proc, h, "plugin"), kp.trainer(proc, h, "plugin")
    assert rollout.ids == trainer.ids
    for k, v in trainer.tensors.items():
        assert torch.equal(torch.as_tensor(rollout.tensors[k]), v), k
    resp = kp.response_ids(proc)
    engine_pos = torch.cat([torch.as_tensor(rollout.extra["mrope_positions"]).reshape(3, -1),
                            vidcache.rope_positions(proc, rollout.ids + resp, [h], mode="plugin")[:, len(rollout.ids):]], dim=1)
    a = kl.response_logits(model, proc, rollout.ids, resp, rollout.tensors, engine_pos)
    own = kl.response_logits(model, proc, trainer.ids, resp, trainer.tensors)
    given = kl.response_logits(model, proc, trainer.ids, resp, trainer.tensors,
                               vidcache.rope_positions(proc, trainer.ids + resp, [h], engine="sglang", mode="plugin"))
    assert torch.equal(a, given)
    grid = h.manifest.tokens.video_grid_thw
    if family == "qwen2_5_vl":
        assert mrope.rules_differ(grid, family=family, second_per_grid=float(trainer.tensors["second_per_grid_ts"]))
        s = kl.kl_stats(a, own)
        assert not torch.equal(a, own) and s["mean_kl"] > 1e-4, s
    else:
        assert torch.equal(a, own)
