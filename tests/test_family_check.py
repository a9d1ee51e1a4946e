"""Entries of one family given to another family's processor are refused, naming both (issue 13 item 5)."""
import pytest
from support.toy_processors import build_processor

import vidcache
from vidcache import VideoOptions
from vidcache.errors import ConfigError
from vidcache.processing import VIDEO_PLACEHOLDER


def test_train_inputs_and_prepare_refuse_a_processor_of_another_family(tmp_path, videos):
    cache = vidcache.VideoCache(tmp_path / "c")
    h = vidcache.get(videos["ffv1_10_small"], VideoOptions(family="qwen2_5_vl"), cache)
    qwen3 = build_processor("qwen3_vl")
    for call in (lambda: vidcache.train_inputs(qwen3, [h], mode="plugin"),
                 lambda: vidcache.prepare(qwen3, VIDEO_PLACEHOLDER, [h], mode="plugin")):
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert "patch size is 16 (qwen3_vl)" in msg and "qwen2_5_vl (patch 14)" in msg and h.key in msg
    # the right processor passes
    assert vidcache.train_inputs(build_processor("qwen2_5_vl"), [h], mode="plugin")["video_grid_thw"].shape == (1, 3)
